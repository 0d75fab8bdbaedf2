//! `GET /v1/audit`: the audit log ([`super::trail`] writes it), newest
//! first, with filters and keyset paging.

use super::errors::{ApiError, Kind};
use super::spec::{Op, Param, Params, Rule, Str, Success};
use crate::service::audit::{self, Audit, AuditPage};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use herald_actors::domain::AuditFilter;

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 500;

pub static LIST: Op = Op::new(
    "listAudit",
    "The audit log",
    Success::json::<AuditPage>(200, "A page of entries, newest first"),
)
.describe(
    "Every write through the API or the console: who, when, what, from where, and the status \
     it answered. Reads are not recorded. For the next page pass `before_id` = \
     `next_before_id`; it is null on the last page.",
)
.query(&[
    Param::new("actor", Rule::Str(Str::len(1, 64)), "Only this user's"),
    Param::new(
        "operation",
        Rule::Str(Str::len(1, 64)),
        "Only this operation (`createReminder`, …)",
    ),
    Param::new(
        "resource",
        Rule::Str(Str::len(1, 200)),
        "Only writes to this id",
    ),
    Param::new(
        "since",
        Rule::Str(Str {
            format: Some("date-time"),
            ..Str::ANY
        }),
        "At or after this time (RFC 3339)",
    ),
    Param::new(
        "until",
        Rule::Str(Str {
            format: Some("date-time"),
            ..Str::ANY
        }),
        "Before this time (RFC 3339)",
    ),
    Param::new(
        "before_id",
        Rule::Int {
            min: 1,
            max: i64::MAX,
        },
        "Only entries with a smaller id",
    ),
    Param::new(
        "limit",
        Rule::Int {
            min: 1,
            max: MAX_LIMIT as i64,
        },
        "Page size",
    )
    .default(DEFAULT_LIMIT as i64),
])
.performs(&audit::LIST);

fn time(p: &Params, name: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
    p.text(name)
        .map(|t| {
            DateTime::parse_from_rfc3339(t)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| {
                    ApiError::field_error(
                        Kind::BadRequest,
                        name,
                        "must be an RFC 3339 time with an offset, such as 2027-01-01T00:00:00Z",
                    )
                })
        })
        .transpose()
}

pub async fn list(
    service: web::Data<Service>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &LIST)?;
    // The attempts this daemon counted and has not written yet.
    if let Some(attempts) = req.app_data::<web::Data<super::attempts::Attempts>>() {
        attempts.flush().await;
    }
    let filter = AuditFilter {
        actor: p.text("actor").map(str::to_owned),
        operation: p.text("operation").map(str::to_owned),
        resource: p.text("resource").map(str::to_owned),
        since: time(&p, "since")?,
        until: time(&p, "until")?,
    };
    let limit = p.int("limit").map_or(DEFAULT_LIMIT, |n| n as u32);
    let page = Audit::of(&service)
        .list(allowed, &filter, p.int("before_id"), limit)
        .await?;
    Ok(HttpResponse::Ok().json(page))
}
