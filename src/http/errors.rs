//! Every rejection the control port makes, as `application/problem+json`
//! (RFC 9457): `{type, title, status, detail, field?, rule?}`. What is
//! refused, and why, is the service layer's ([`crate::service::error`]);
//! its status, headers and body are written here.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

pub const PROBLEM_JSON: &str = "application/problem+json";

pub use crate::service::error::{ApiError, Kind};

impl Kind {
    pub fn status(self) -> StatusCode {
        StatusCode::from_u16(self.code()).expect("every kind's code is a status")
    }
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
    pub fn status(&self) -> StatusCode {
        self.kind.status()
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
    use actix::MailboxError;
    use actix_web::body::MessageBody;
    use herald_actors::delivery::account::ControlError;
    use herald_actors::domain::ValidationError;
    use herald_actors::ports::StoreError;
    use herald_actors::scheduling::scheduler::FireNowError;

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
