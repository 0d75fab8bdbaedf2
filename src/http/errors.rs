//! Every rejection the control port makes, as `application/problem+json`
//! (RFC 9457): `{type, title, status, detail, field?, rule?}`. The store's,
//! the actors' and the domain's errors become HTTP statuses here and
//! nowhere else.

use actix::MailboxError;
use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use herald_actors::delivery::account::ControlError;
use herald_actors::domain::ValidationError;
use herald_actors::ports::StoreError;
use herald_actors::scheduling::scheduler::FireNowError;
use serde::Serialize;
use std::fmt;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// The kinds of problem, each with one status and a stable `type` URN that
/// clients can branch on (the `title` is for people and may change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 400: the body is not JSON, or a query parameter is malformed.
    BadRequest,
    /// 400: the request path is not in canonical form (`canonical`).
    NonCanonicalPath,
    /// 401: missing or wrong bearer token.
    Unauthorized,
    /// 403: a browser rule (Host, Origin, Sec-Fetch-Site) refused it.
    Forbidden,
    /// 403: the caller's role may not do this; names the role needed.
    NeedsRole,
    /// 404
    NotFound,
    /// 405
    MethodNotAllowed,
    /// 409: the request is valid but the current state forbids it.
    Conflict,
    /// 412: `If-Match` names a version that is no longer current.
    PreconditionFailed,
    /// 413
    TooLarge,
    /// 415
    UnsupportedMedia,
    /// 422: well-formed JSON that breaks a rule; names the field and rule.
    Validation,
    /// 429: over the port's request rate for this client.
    TooManyRequests,
    /// 500: the database or an invariant failed; details are in the log.
    Internal,
    /// 503: an actor the request needs is not running.
    Unavailable,
}

impl Kind {
    pub const ALL: &'static [Kind] = &[
        Kind::BadRequest,
        Kind::NonCanonicalPath,
        Kind::Unauthorized,
        Kind::Forbidden,
        Kind::NeedsRole,
        Kind::NotFound,
        Kind::MethodNotAllowed,
        Kind::Conflict,
        Kind::PreconditionFailed,
        Kind::TooLarge,
        Kind::UnsupportedMedia,
        Kind::Validation,
        Kind::TooManyRequests,
        Kind::Internal,
        Kind::Unavailable,
    ];

    pub fn status(self) -> StatusCode {
        match self {
            Kind::BadRequest | Kind::NonCanonicalPath => StatusCode::BAD_REQUEST,
            Kind::Unauthorized => StatusCode::UNAUTHORIZED,
            Kind::Forbidden | Kind::NeedsRole => StatusCode::FORBIDDEN,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Kind::Conflict => StatusCode::CONFLICT,
            Kind::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::UnsupportedMedia => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Kind::Validation => StatusCode::UNPROCESSABLE_ENTITY,
            Kind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn type_uri(self) -> &'static str {
        match self {
            Kind::BadRequest => "urn:herald:problem:bad-request",
            Kind::NonCanonicalPath => "urn:herald:problem:non-canonical-path",
            Kind::Unauthorized => "urn:herald:problem:unauthorized",
            Kind::Forbidden => "urn:herald:problem:forbidden",
            Kind::NeedsRole => "urn:herald:problem:needs-role",
            Kind::NotFound => "urn:herald:problem:not-found",
            Kind::MethodNotAllowed => "urn:herald:problem:method-not-allowed",
            Kind::Conflict => "urn:herald:problem:conflict",
            Kind::PreconditionFailed => "urn:herald:problem:precondition-failed",
            Kind::TooLarge => "urn:herald:problem:too-large",
            Kind::UnsupportedMedia => "urn:herald:problem:unsupported-media-type",
            Kind::Validation => "urn:herald:problem:validation",
            Kind::TooManyRequests => "urn:herald:problem:too-many-requests",
            Kind::Internal => "urn:herald:problem:internal",
            Kind::Unavailable => "urn:herald:problem:unavailable",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Kind::BadRequest => "Bad request",
            Kind::NonCanonicalPath => "Path not in canonical form",
            Kind::Unauthorized => "Missing or wrong bearer token",
            Kind::Forbidden => "Refused: not this port's own page or name",
            Kind::NeedsRole => "Refused: this needs a higher role",
            Kind::NotFound => "Not found",
            Kind::MethodNotAllowed => "Method not allowed",
            Kind::Conflict => "Conflict with the current state",
            Kind::PreconditionFailed => "Changed since you read it",
            Kind::TooLarge => "Request body too large",
            Kind::UnsupportedMedia => "Unsupported media type",
            Kind::Validation => "Invalid request",
            Kind::TooManyRequests => "Too many requests",
            Kind::Internal => "Internal error",
            Kind::Unavailable => "Service unavailable",
        }
    }
}

/// A problem answer. Build one with the constructors or `?` from the
/// errors below.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: Kind,
    pub detail: String,
    pub field: Option<String>,
    pub rule: Option<String>,
    /// `Allow` for 405.
    pub allow: Option<&'static str>,
    /// `Retry-After` seconds, for 429 and 503.
    pub retry_after: Option<u64>,
    /// An import's entries that name no group, or several (boxed: most
    /// problems have none, and every handler returns this type).
    pub offenders: Option<Box<herald_actors::domain::ImportRefused>>,
}

/// Every refusal, as `application/problem+json` (RFC 9457).
#[derive(Serialize, schemars::JsonSchema)]
#[schemars(example = problem_example())]
pub struct Problem<'a> {
    #[serde(rename = "type")]
    #[schemars(schema_with = "problem_types")]
    type_: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
    /// The refused field, as a path: `window.end_hour`, `targets[3]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    /// What the field must be, e.g. "must be 0–24".
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<&'a str>,
    /// An import's entries that name no group the account is in, or
    /// several (every one; `rule` lists the first 50).
    #[serde(skip_serializing_if = "Option::is_none")]
    offenders: Option<&'a [herald_actors::domain::Offender]>,
}

fn problem_types(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let types: Vec<&str> = Kind::ALL.iter().map(|k| k.type_uri()).collect();
    schemars::json_schema!({ "type": "string", "enum": types })
}

fn problem_example() -> serde_json::Value {
    serde_json::json!({
        "type": "urn:herald:problem:validation", "title": "Invalid request", "status": 422,
        "detail": "window.end_hour: must be 0–24", "field": "window.end_hour", "rule": "must be 0–24",
    })
}

impl ApiError {
    pub fn new(kind: Kind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            field: None,
            rule: None,
            allow: None,
            retry_after: None,
            offenders: None,
        }
    }

    pub fn not_found(what: impl fmt::Display) -> Self {
        Self::new(Kind::NotFound, format!("{what} not found"))
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(Kind::Conflict, detail)
    }

    /// A 422 naming the field and the rule it breaks.
    pub fn invalid(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Self::field_error(Kind::Validation, field, rule)
    }

    /// A 400 for a malformed query parameter.
    pub fn bad_param(name: impl Into<String>, rule: impl Into<String>) -> Self {
        Self::field_error(Kind::BadRequest, name, rule)
    }

    pub fn field_error(kind: Kind, field: impl Into<String>, rule: impl Into<String>) -> Self {
        let (field, rule) = (field.into(), rule.into());
        Self {
            kind,
            detail: format!("{field}: {rule}"),
            field: Some(field),
            rule: Some(rule),
            allow: None,
            retry_after: None,
            offenders: None,
        }
    }

    /// A 422 for an import some of whose entries name no group, or several:
    /// the rule lists the first of them, `offenders` every one.
    pub fn import_refused(refused: herald_actors::domain::ImportRefused) -> Self {
        let offenders = Box::new(refused.clone());
        let e = herald_actors::domain::ValidationError::from(refused);
        Self {
            offenders: Some(offenders),
            ..Self::invalid(e.field, e.rule)
        }
    }

    pub fn internal(context: &str, err: impl fmt::Display) -> Self {
        // The cause goes to the log, not to the client.
        tracing::error!(error = %err, "{context}");
        Self::new(
            Kind::Internal,
            format!("{context}; the daemon log has the cause"),
        )
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status().as_u16(),
            self.kind.title(),
            self.detail
        )
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status()
    }

    fn error_response(&self) -> HttpResponse {
        let body = Problem {
            type_: self.kind.type_uri(),
            title: self.kind.title(),
            status: self.status().as_u16(),
            detail: &self.detail,
            field: self.field.as_deref(),
            rule: self.rule.as_deref(),
            offenders: self.offenders.as_ref().map(|r| r.offenders.as_slice()),
        };
        let mut res = HttpResponse::build(self.status());
        res.content_type(PROBLEM_JSON);
        if self.kind == Kind::Unauthorized {
            res.insert_header((header::WWW_AUTHENTICATE, "Bearer realm=\"herald\""));
        }
        if let Some(allow) = self.allow {
            res.insert_header((header::ALLOW, allow));
        }
        if let Some(secs) = self.retry_after {
            res.insert_header((header::RETRY_AFTER, secs.to_string()));
        }
        res.body(serde_json::to_string(&body).expect("problem serialises"))
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        Self::invalid(e.field, e.rule)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => Self::not_found(what),
            StoreError::Conflict(detail) => Self::conflict(detail),
            StoreError::Fenced(detail) => Self::conflict(format!("account lease lost: {detail}")),
            StoreError::Invalid(v) => v.into(),
            StoreError::Backend(_) => Self::internal("the database failed", e),
        }
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match e {
            // The actor's messages already read "run 7 not found".
            ControlError::NotFound(detail) => Self::new(Kind::NotFound, detail),
            ControlError::Conflict(detail) => Self::conflict(detail),
            ControlError::Store(cause) => Self::internal("the database failed", cause),
            ControlError::Moved(detail) => Self::new(Kind::Unavailable, detail),
            // The request is well formed; the run it names cannot take it
            // (an edit of a caption when it sent no picture): a conflict
            // with the run, still naming the field and the rule.
            ControlError::Invalid(v) => Self::field_error(Kind::Conflict, v.field, v.rule),
        }
    }
}

impl From<FireNowError> for ApiError {
    fn from(e: FireNowError) -> Self {
        match e {
            FireNowError::NotFound(id) => Self::not_found(format!("reminder {id}")),
            FireNowError::NotActive { .. } => Self::conflict(e.to_string()),
            FireNowError::Store(s) => s.into(),
            FireNowError::Unavailable => Self::new(Kind::Unavailable, e.to_string()),
        }
    }
}

impl From<MailboxError> for ApiError {
    fn from(e: MailboxError) -> Self {
        // An actor that stopped (or a shutdown in progress): worth a retry.
        Self::new(
            Kind::Unavailable,
            format!("the delivery engine did not answer ({e}); retry shortly"),
        )
    }
}

/// Every error answer is problem+json, including those actix-web makes
/// itself before a handler runs (a path that does not percent-decode, a
/// body over the framework's own limits): those are rewritten here, their
/// text kept as the detail.
pub async fn problems_only(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<
    actix_web::dev::ServiceResponse<actix_web::body::EitherBody<impl actix_web::body::MessageBody>>,
    actix_web::Error,
> {
    use actix_web::body::MessageBody;
    let (http_req, res) = match next.call(req).await {
        Ok(res) => {
            // The console's pages answer their own errors in HTML (a
            // refused form shown again beside its fields).
            let is_problem = res
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v == PROBLEM_JSON || v.as_bytes().starts_with(b"text/html"));
            if res.status().as_u16() < 400 || is_problem {
                return Ok(res.map_into_left_body());
            }
            let (http_req, res) = res.into_parts();
            (http_req, res.map_into_boxed_body())
        }
        // An error returned by an inner middleware is already ours.
        Err(e) => return Err(e),
    };
    let status = res.status();
    let text = res
        .into_body()
        .try_into_bytes()
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let kind = Kind::ALL
        .iter()
        .copied()
        .find(|k| k.status() == status)
        .unwrap_or(if status.is_server_error() {
            Kind::Internal
        } else {
            Kind::BadRequest
        });
    let detail = if text.is_empty() {
        kind.title().to_owned()
    } else {
        text
    };
    let mut answer = ApiError::new(kind, detail).error_response();
    // A status actix chose that has no kind of ours keeps its number.
    *answer.status_mut() = status;
    Ok(actix_web::dev::ServiceResponse::new(http_req, answer).map_into_right_body())
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::MessageBody;

    fn body(e: &ApiError) -> serde_json::Value {
        let res = e.error_response();
        assert_eq!(
            res.headers().get(header::CONTENT_TYPE).unwrap(),
            PROBLEM_JSON
        );
        let bytes = res.into_body().try_into_bytes().unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn validation_names_field_and_rule() {
        let e: ApiError = ValidationError::new("window.end_hour", "must be 0–24").into();
        let b = body(&e);
        assert_eq!(b["status"], 422);
        assert_eq!(b["field"], "window.end_hour");
        assert_eq!(b["rule"], "must be 0–24");
        assert_eq!(b["type"], "urn:herald:problem:validation");
    }

    #[test]
    fn store_and_control_errors_map_to_statuses() {
        let cases: Vec<(ApiError, u16)> = vec![
            (StoreError::NotFound("reminder 3".into()).into(), 404),
            (StoreError::Conflict("busy".into()).into(), 409),
            (StoreError::Backend("disk".into()).into(), 500),
            (
                StoreError::Invalid(ValidationError::new("account_id", "x")).into(),
                422,
            ),
            (ControlError::NotFound("run 1 not found".into()).into(), 404),
            (ControlError::Conflict("paused".into()).into(), 409),
            (ControlError::Store("disk".into()).into(), 500),
            (ControlError::Moved("lease lost".into()).into(), 503),
            (
                ControlError::Invalid(ValidationError::new("caption", "no picture")).into(),
                409,
            ),
            (FireNowError::NotFound(1).into(), 404),
            (MailboxError::Closed.into(), 503),
        ];
        for (e, status) in cases {
            assert_eq!(e.status().as_u16(), status, "{e}");
            assert_eq!(body(&e)["status"], status);
        }
        // A request the run cannot take still names the field.
        let e: ApiError =
            ControlError::Invalid(ValidationError::new("caption", "no picture")).into();
        assert_eq!(body(&e)["field"], "caption");
    }

    #[test]
    fn backend_details_stay_out_of_the_answer() {
        let e: ApiError = StoreError::Backend("password=hunter2".into()).into();
        assert!(!e.detail.contains("hunter2"));
        assert!(body(&e).get("field").is_none());
    }
}
