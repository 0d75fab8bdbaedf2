//! Signing in to the console with a token, and out again.

use super::layout;
use super::request::{self, check_post, see_other, Form, Signed};
use super::session::{self, session_of, Sessions};
use crate::http::attempts::{Attempt, Attempts, Origin};
use crate::http::browser::check_same_origin;
use crate::http::errors::{ApiError, Kind};
use crate::http::principal::{Guard, Principal};
use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use chrono::Utc;

pub async fn sign_in_page(req: HttpRequest, guard: web::Data<Guard>) -> HttpResponse {
    if session_of(&req).await.is_some() {
        return see_other("/");
    }
    if guard.is_open() {
        // control.token = "none": nothing to ask; a session still carries
        // the CSRF token every form needs.
        return match guard.principal_of_token("").await {
            Ok(p) => signed_in(&req, p).await,
            Err(e) => e.error_response(),
        };
    }
    layout::sign_in(None, StatusCode::OK)
}

pub async fn sign_in(
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
    let client = crate::http::peer::client_of(&req);
    let attempts = req.app_data::<web::Data<Attempts>>();
    // A network that failed too often waits, whatever it sends now: the
    // lockout bounds guessing, not only the rate limit.
    if let Some(wait) = attempts.and_then(|a| a.sign_in_locked(client, Utc::now())) {
        let mut page = layout::sign_in(
            Some(&format!(
                "Too many failed sign-ins from this network: try again in {} min.",
                wait.div_ceil(60)
            )),
            StatusCode::TOO_MANY_REQUESTS,
        );
        page.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(wait));
        return Ok(page);
    }
    let form = Form::parse(&body);
    let token = form.text("token");
    let answer = guard.principal_of_token(token).await;
    // Every sign-in, and every failed one, is on the trail, counted per
    // address and minute.
    if let Some(attempts) = attempts {
        let attempt = match &answer {
            Ok(user) => Some(Attempt::SignedIn(user.clone())),
            Err(e) if e.kind == Kind::Unauthorized => Some(Attempt::SignInFailed),
            Err(_) => None,
        };
        if let Some(attempt) = attempt {
            let from = Origin {
                client,
                via: "console",
                method: "POST",
                path: "/sign-in",
            };
            attempts.note(Utc::now(), from, attempt).await;
        }
    }
    match answer {
        Ok(user) => Ok(signed_in(&req, user).await),
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

/// Opens a session for `user` and sends the browser to the overview. A
/// user's sign-in ends no later than the user's token.
async fn signed_in(req: &HttpRequest, user: Principal) -> HttpResponse {
    let Some(sessions) = req.app_data::<web::Data<Sessions>>() else {
        return ApiError::new(Kind::Internal, "the console has no session store").error_response();
    };
    let opened = match sessions.token_end(&user).await {
        Ok(expires) => sessions.open(Utc::now(), user, expires).await,
        Err(e) => Err(e),
    };
    let s = match opened {
        Ok(s) => s,
        Err(e) => return ApiError::from(e).error_response(),
    };
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/"))
        .insert_header((
            header::SET_COOKIE,
            session::set_cookie(&s, crate::http::peer::https_of(req)),
        ))
        .finish()
}

pub async fn sign_out(
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
        .insert_header((
            header::SET_COOKIE,
            session::clear_cookie(crate::http::peer::https_of(&req)),
        ))
        .finish())
}
