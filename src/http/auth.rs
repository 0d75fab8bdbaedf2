//! The bearer token guarding `/v1`. Probes, metrics and the OpenAPI
//! document stay open: they are read by machines that hold no token and
//! reveal nothing an attacker could use to send.

use super::errors::{ApiError, Kind};
use crate::settings::Secret;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use std::sync::Arc;

/// The token every `/v1` request must carry; `None` leaves `/v1` open
/// (only with `control.token = "none"`, which settings validation refuses
/// on a non-loopback address).
/// Read once at start-up: changing the token (or its file) takes a restart.
#[derive(Clone)]
pub struct Guard(Option<Arc<Secret>>);

impl Guard {
    pub fn new(token: Option<Secret>) -> Self {
        Self(token.map(Arc::new))
    }

    /// No token is configured (`control.token = "none"`).
    pub fn is_open(&self) -> bool {
        self.0.is_none()
    }

    /// Accepts `Authorization: Bearer <token>` only. The comparison takes
    /// the same time wherever the first difference is.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), ApiError> {
        let Some(expected) = &self.0 else {
            return Ok(());
        };
        let Some(value) = authorization else {
            return Err(ApiError::new(
                Kind::Unauthorized,
                "this route needs an Authorization: Bearer <token> header",
            ));
        };
        let given = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
            .unwrap_or(b"");
        if constant_time_eq::constant_time_eq(given, expected.expose().as_bytes()) {
            Ok(())
        } else {
            Err(ApiError::new(
                Kind::Unauthorized,
                "the bearer token is not the one this daemon was configured with",
            ))
        }
    }
}

pub async fn require_token(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let guard = req
        .app_data::<actix_web::web::Data<Guard>>()
        .map(|g| g.get_ref().clone())
        // Fail closed: a server built without a guard serves nothing.
        .unwrap_or_else(|| Guard::new(Some(Secret::new(crate::token::random_token()))));
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if auth.is_none() && reads_events_as_console(&req).await {
        return next.call(req).await;
    }
    guard.check(auth)?;
    next.call(req).await
}

/// The console's pages follow `/v1/events` with `EventSource`, which can
/// send no header, only the session cookie: a signed-in console session
/// may read that stream, and nothing else under `/v1` (every write still
/// needs the bearer token, so a stolen cookie cannot send).
async fn reads_events_as_console(req: &ServiceRequest) -> bool {
    req.method() == actix_web::http::Method::GET
        && req.path() == "/v1/events"
        && super::console::session::session_of(req.request())
            .await
            .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_a_token() {
        assert!(Guard::new(None).check(None).is_ok());
    }

    #[test]
    fn needs_the_exact_bearer_token() {
        let g = Guard::new(Some(Secret::new("s3cret")));
        assert!(g.check(Some(b"Bearer s3cret")).is_ok());
        for bad in [
            None,
            Some(&b"Bearer s3cre"[..]),
            Some(b"Bearer s3cret "),
            Some(b"s3cret"),
            Some(b"Basic s3cret"),
            Some(b"Bearer "),
        ] {
            let e = g.check(bad).unwrap_err();
            assert_eq!(e.kind, Kind::Unauthorized, "{bad:?}");
        }
    }
}
