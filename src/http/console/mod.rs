//! The web console: server-rendered pages at `/` on the control port, for
//! the operator who keeps Herald open in a browser all day.
//!
//! - Pages are maud templates over plain view values; the one script
//!   (`assets/console.js`) only follows `/v1/events` and refreshes the
//!   live parts. Every asset is compiled into the binary.
//! - Sign-in takes the daemon's token once and opens a server-side
//!   session (`session`); every page needs one, and every form carries
//!   the session's CSRF token, checked with the cross-site rules of `/v1`
//!   (`browser::check_same_origin`) on every POST.
//! - Writes go through the same functions the `/v1` handlers are: the
//!   console builds the API's request, runs the handler and reads its
//!   JSON answer or its problem, so no rule exists twice.

/// A console button that runs one `/v1` handler taken with the path's id:
/// the form is checked (session CSRF, same origin), then the handler runs;
/// on success the browser goes to `$to(id, answer)`, on a refusal it gets
/// the page that says why, with a link back to `$back/{id}`.
macro_rules! button_action {
    ($name:ident, $handler:path, $nav:expr, $noun:literal, $back:literal, $to:expr) => {
        async fn $name(
            state: actix_web::web::Data<crate::state::AppState>,
            req: actix_web::HttpRequest,
            crate::http::console::Signed(s): crate::http::console::Signed,
            path: actix_web::web::Path<String>,
            body: actix_web::web::Bytes,
        ) -> Result<actix_web::HttpResponse, crate::http::errors::ApiError> {
            crate::http::console::post_form(&req, &s, &body).await?;
            let id = path.into_inner();
            let to: fn(&str, &serde_json::Value) -> String = $to;
            let answer =
                crate::http::console::api($handler(state, actix_web::web::Path::from(id.clone())))
                    .await;
            Ok(match answer {
                Ok(v) => crate::http::console::see_other(&to(&id, &v)),
                Err(e) => crate::http::console::layout::refused(
                    &s,
                    $nav,
                    &format!(concat!($noun, " {}"), id),
                    &e,
                    &format!(concat!($back, "/{}"), id),
                ),
            })
        }
    };
}

mod accounts;
mod layout;
mod overview;
mod reminders;
mod runs;
pub mod session;

use super::auth::Guard;
use super::browser::check_same_origin;
use super::errors::{ApiError, Kind};
use actix_web::body::to_bytes;
use actix_web::dev::Payload;
use actix_web::http::{header, StatusCode};
use actix_web::{web, FromRequest, HttpRequest, HttpResponse, ResponseError};
use chrono::Utc;
use futures_util::future::{ready, Ready};
use serde_json::Value;
pub use session::{Session, Sessions};
use std::fmt;

/// Registers the console's routes (after `/v1` and the open routes).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/").route(web::get().to(overview::page)));
    cfg.service(
        web::resource("/sign-in")
            .route(web::get().to(sign_in_page))
            .route(web::post().to(sign_in)),
    );
    cfg.service(web::resource("/sign-out").route(web::post().to(sign_out)));
    cfg.service(web::resource("/assets/console.css").route(web::get().to(layout::css)));
    cfg.service(web::resource("/assets/console.js").route(web::get().to(layout::js)));
    accounts::configure(cfg);
    reminders::configure(cfg);
    runs::configure(cfg);
}

/// A request from a signed-in browser. Pages without one are redirected
/// to the sign-in page (`303`).
pub struct Signed(pub Session);

impl FromRequest for Signed {
    type Error = SignInFirst;
    type Future = Ready<Result<Self, SignInFirst>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(session_of(req).map(Signed).ok_or(SignInFirst))
    }
}

/// The live session a request's cookie names.
pub fn session_of(req: &HttpRequest) -> Option<Session> {
    let sessions = req.app_data::<web::Data<Sessions>>()?;
    let cookie = req
        .headers()
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok());
    sessions.get(session::cookie_value(cookie)?, Utc::now())
}

/// No session: off to the sign-in page.
#[derive(Debug)]
pub struct SignInFirst;

impl fmt::Display for SignInFirst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sign in first")
    }
}

impl ResponseError for SignInFirst {
    fn status_code(&self) -> StatusCode {
        StatusCode::SEE_OTHER
    }

    fn error_response(&self) -> HttpResponse {
        see_other("/sign-in")
    }
}

pub fn see_other(to: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, to))
        .finish()
}

pub const CSRF_RULE: &str =
    "must be the token of this session's form: reload the page and submit it again";

/// Every console POST: not from another site's page (the rules `/v1`
/// applies), and carrying this session's CSRF token.
pub fn check_post(
    req: &HttpRequest,
    session: &Session,
    csrf: Option<&str>,
) -> Result<(), ApiError> {
    check_same_origin(req.headers())?;
    let given = csrf.unwrap_or("").as_bytes();
    if constant_time_eq::constant_time_eq(given, session.csrf.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::field_error(Kind::Forbidden, "csrf", CSRF_RULE))
    }
}

/// A form body (`application/x-www-form-urlencoded`), keeping repeated
/// names (checkbox lists).
pub struct Form(Vec<(String, String)>);

impl Form {
    pub fn parse(body: &[u8]) -> Self {
        Self(form_urlencoded::parse(body).into_owned().collect())
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The trimmed value, `""` when absent.
    pub fn text(&self, name: &str) -> &str {
        self.get(name).map(str::trim).unwrap_or("")
    }

    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn checked(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

/// Runs a `/v1` handler and reads its JSON answer (`Null` for none).
pub async fn api(
    answer: impl std::future::Future<Output = Result<HttpResponse, ApiError>>,
) -> Result<Value, ApiError> {
    let res = answer.await?;
    let bytes = to_bytes(res.into_body())
        .await
        .map_err(|e| ApiError::internal("reading an API answer", e))?;
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| ApiError::internal("reading an API answer", e))
}

/// `application/x-www-form-urlencoded` bodies of console forms; pictures
/// go to `/media` as raw bytes instead.
const FORM_LIMIT: usize = 256 * 1024;

async fn sign_in_page(req: HttpRequest, guard: web::Data<Guard>) -> HttpResponse {
    if session_of(&req).is_some() {
        return see_other("/");
    }
    if guard.is_open() {
        // control.token = "none": nothing to ask; a session still carries
        // the CSRF token every form needs.
        return signed_in(&req);
    }
    layout::sign_in(None, StatusCode::OK)
}

async fn sign_in(
    req: HttpRequest,
    guard: web::Data<Guard>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    // No session yet, so no CSRF token: the cross-site rules alone keep
    // another site from signing this browser in.
    check_same_origin(req.headers())?;
    if body.len() > FORM_LIMIT {
        return Err(ApiError::new(Kind::TooLarge, "the form is too large"));
    }
    let form = Form::parse(&body);
    let token = form.text("token");
    match guard.check(Some(format!("Bearer {token}").as_bytes())) {
        Ok(()) => Ok(signed_in(&req)),
        Err(_) => Ok(layout::sign_in(
            Some("That is not this daemon's token. It is in control.token in the data directory."),
            StatusCode::UNAUTHORIZED,
        )),
    }
}

/// Opens a session and sends the browser to the overview.
fn signed_in(req: &HttpRequest) -> HttpResponse {
    let Some(sessions) = req.app_data::<web::Data<Sessions>>() else {
        return ApiError::new(Kind::Internal, "the console has no session store").error_response();
    };
    let s = sessions.open(Utc::now());
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/"))
        .insert_header((header::SET_COOKIE, session::set_cookie(&s)))
        .finish()
}

async fn sign_out(
    req: HttpRequest,
    Signed(s): Signed,
    sessions: web::Data<Sessions>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let form = Form::parse(&body);
    check_post(&req, &s, form.get("csrf"))?;
    sessions.close(&s.id);
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/sign-in"))
        .insert_header((header::SET_COOKIE, session::clear_cookie()))
        .finish())
}

/// A console form's body, size-checked, with its CSRF and cross-site
/// checks done.
pub async fn post_form(
    req: &HttpRequest,
    s: &Session,
    body: &web::Bytes,
) -> Result<Form, ApiError> {
    if body.len() > FORM_LIMIT {
        return Err(ApiError::new(Kind::TooLarge, "the form is too large"));
    }
    let form = Form::parse(body);
    check_post(req, s, form.get("csrf"))?;
    Ok(form)
}
