//! What an operation can refuse, and why: a kind with a stable `type`
//! URN and, for a bad field, the field and its rule. The store's, the
//! actors' and the domain's errors become these here and nowhere else;
//! the control port writes them as `application/problem+json`
//! (`http::errors`), the console as its "refused" page.

use actix::MailboxError;
use herald_actors::delivery::account::ControlError;
use herald_actors::domain::ValidationError;
use herald_actors::ports::StoreError;
use herald_actors::scheduling::scheduler::FireNowError;
use std::fmt;

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

    /// The HTTP status this kind is answered with.
    pub fn code(self) -> u16 {
        match self {
            Kind::BadRequest | Kind::NonCanonicalPath => 400,
            Kind::Unauthorized => 401,
            Kind::Forbidden | Kind::NeedsRole => 403,
            Kind::NotFound => 404,
            Kind::MethodNotAllowed => 405,
            Kind::Conflict => 409,
            Kind::PreconditionFailed => 412,
            Kind::TooLarge => 413,
            Kind::UnsupportedMedia => 415,
            Kind::Validation => 422,
            Kind::TooManyRequests => 429,
            Kind::Internal => 500,
            Kind::Unavailable => 503,
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
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.kind.code(),
            self.kind.title(),
            self.detail
        )
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
