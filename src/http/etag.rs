//! Optimistic concurrency for edits: a GET answers the record's `ETag`; a
//! PUT or PATCH that sends `If-Match` applies only while the record is
//! still that version, else 412. Without `If-Match` an edit applies as
//! before (the CLI and scripts that read-modify-write at once).

use super::errors::{ApiError, Kind};
use super::spec::{Param, Rule, Str};
use actix_web::http::header;
use actix_web::HttpRequest;

/// `If-Match` as the document states it: visible ASCII, spaces inside.
pub const IF_MATCH: Param = Param::new(
    "If-Match",
    Rule::Str(Str::pattern(
        "^[!-~]([ !-~]*[!-~])?$",
        "must be entity tags in visible ASCII",
    )),
    "The `ETag` of the version you read: the edit applies only while it is current (else \
     412). `*` matches any version.",
);

pub use crate::service::version::of;

/// Refuses the edit if `If-Match` is present and names neither `*` nor
/// `current`. A weak tag (`W/…`) never matches: RFC 9110 asks for strong
/// comparison here.
pub fn check(req: &HttpRequest, what: &str, current: &str) -> Result<(), ApiError> {
    let Some(value) = req.headers().get(header::IF_MATCH) else {
        return Ok(());
    };
    let value = value.to_str().unwrap_or("\u{0}");
    IF_MATCH
        .check_text(value)
        .map_err(|rule| ApiError::bad_param("If-Match", rule))?;
    let matches = value
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag == current);
    if matches {
        return Ok(());
    }
    let mut e = ApiError::new(
        Kind::PreconditionFailed,
        format!(
            "{what} changed since you read it (If-Match {value}, now {current}); \
             read it again and reapply your edit"
        ),
    );
    e.field = Some("If-Match".into());
    e.rule = Some("must name the current ETag".into());
    Err(e)
}
