//! What every console page shares: the signed-in request, the redirect,
//! the form body with its CSRF and cross-site checks.

use super::session::{session_of, Session};
use crate::http::browser::check_same_origin;
use crate::http::errors::{ApiError, Kind};
use actix_web::dev::Payload;
use actix_web::http::{header, StatusCode};
use actix_web::{web, FromRequest, HttpRequest, HttpResponse, ResponseError};
use std::fmt;
use subtle::ConstantTimeEq as _;

/// A request from a signed-in browser. Pages without one are redirected
/// to the sign-in page (`303`).
pub struct Signed(pub Session);

impl FromRequest for Signed {
    type Error = SignInFirst;
    type Future = futures_util::future::LocalBoxFuture<'static, Result<Self, SignInFirst>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move { session_of(&req).await.map(Signed).ok_or(SignInFirst) })
    }
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

/// `page` naming what a console form created in `Location` (`/users/3`):
/// the audit trail reads the new record's id from it.
pub fn with_location(mut page: HttpResponse, to: &str) -> HttpResponse {
    if let Ok(v) = header::HeaderValue::from_str(to) {
        page.headers_mut().insert(header::LOCATION, v);
    }
    page
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
    if bool::from(given.ct_eq(session.csrf.as_bytes())) {
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

/// `application/x-www-form-urlencoded` bodies of console forms; pictures
/// go to `/media` as raw bytes instead.
pub(super) const FORM_LIMIT: usize = 256 * 1024;

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
