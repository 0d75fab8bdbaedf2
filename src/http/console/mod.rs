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
mod actions;
mod guard;
mod hooks;
mod layout;
mod overview;
mod people;
mod reminders;
mod request;
mod runs;
pub mod session;

pub use guard::authorize;
pub use request::{api, check_post, post_form, see_other, with_location, Form, Signed};
pub use session::session_of;

use super::browser::check_same_origin;
use super::errors::{ApiError, Kind};
use super::principal::{Guard, Principal};
use crate::state::AppState;
use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use chrono::Utc;
pub use session::{Session, Sessions};

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
    people::configure(cfg);
    hooks::configure(cfg);
}

async fn sign_in_page(req: HttpRequest, guard: web::Data<Guard>) -> HttpResponse {
    if session_of(&req).await.is_some() {
        return see_other("/");
    }
    if guard.is_open() {
        // control.token = "none": nothing to ask; a session still carries
        // the CSRF token every form needs.
        return match guard.principal_of_token("").await {
            Ok(p) => signed_in(&req, p, None).await,
            Err(e) => e.error_response(),
        };
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
    if body.len() > request::FORM_LIMIT {
        return Err(ApiError::new(Kind::TooLarge, "the form is too large"));
    }
    let form = Form::parse(&body);
    let token = form.text("token");
    match guard.principal_of_token(token).await {
        Ok(user) => {
            // A user's sign-in ends no later than the user's token.
            let expires = match (user.user_id, req.app_data::<web::Data<AppState>>()) {
                (Some(id), Some(state)) => state.store.get_user(id).await?.expires_at,
                _ => None,
            };
            Ok(signed_in(&req, user, expires).await)
        }
        Err(e) if e.kind == Kind::Unauthorized => Ok(layout::sign_in(
            Some(
                "That is not this daemon's token (control.token in the data directory), nor a \
                 live user's token.",
            ),
            StatusCode::UNAUTHORIZED,
        )),
        Err(e) => Err(e),
    }
}

/// Opens a session for `user` and sends the browser to the overview.
async fn signed_in(
    req: &HttpRequest,
    user: Principal,
    expires: Option<chrono::DateTime<Utc>>,
) -> HttpResponse {
    let Some(sessions) = req.app_data::<web::Data<Sessions>>() else {
        return ApiError::new(Kind::Internal, "the console has no session store").error_response();
    };
    let s = match sessions.open(Utc::now(), user, expires).await {
        Ok(s) => s,
        Err(e) => return ApiError::from(e).error_response(),
    };
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
    sessions.close(&s.id).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/sign-in"))
        .insert_header((header::SET_COOKIE, session::clear_cookie()))
        .finish())
}
