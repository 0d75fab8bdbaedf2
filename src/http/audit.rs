//! `GET /v1/audit`: the audit log ([`super::trail`] writes it), newest
//! first, with filters and keyset paging.

use super::errors::{ApiError, Kind};
use super::spec::{Op, Param, Params, Rule, Str, Success};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use herald_actors::domain::Role;
use herald_actors::domain::{AuditEntry, AuditFilter};
use schemars::JsonSchema;
use serde::Serialize;

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
.needs(Role::Admin);

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

/// One entry of the audit log as the API shows it.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "AuditEntry")]
pub struct AuditView<'a> {
    id: i64,
    at: DateTime<Utc>,
    /// The user's name; `control.token` for the daemon's own token.
    actor: &'a str,
    actor_id: Option<i64>,
    /// null for an attempt that proved no identity (a wrong token, a
    /// failed sign-in).
    role: Option<Role>,
    /// Attempts this entry stands for: 1 for a write; failed
    /// authentications and sign-ins are counted per address and minute.
    #[schemars(range(min = 1))]
    count: u32,
    /// `api` or `console`.
    via: &'a str,
    /// The operation id of this document.
    operation: &'a str,
    method: &'a str,
    path: &'a str,
    resource: Option<&'a str>,
    /// The request body, compact and cut short; secrets left out.
    summary: &'a str,
    status: u16,
    /// The client's address (the one a trusted proxy names), or `unix`.
    remote: &'a str,
}

impl<'a> From<&'a AuditEntry> for AuditView<'a> {
    fn from(e: &'a AuditEntry) -> Self {
        let x = &e.entry;
        Self {
            id: e.id,
            at: x.at,
            actor: &x.actor,
            actor_id: x.actor_id,
            role: x.role,
            count: x.count,
            via: &x.via,
            operation: &x.operation,
            method: &x.method,
            path: &x.path,
            resource: x.resource.as_deref(),
            summary: &x.summary,
            status: x.status,
            remote: &x.remote,
        }
    }
}

/// A page of the audit log, newest first.
#[derive(Debug, Serialize, JsonSchema)]
struct AuditPage<'a> {
    items: Vec<AuditView<'a>>,
    next_before_id: Option<i64>,
}

/// One page of the log, for the API and the console.
pub async fn page(
    state: &AppState,
    filter: &AuditFilter,
    before_id: Option<i64>,
    limit: u32,
) -> Result<(Vec<AuditEntry>, Option<i64>), ApiError> {
    let items = state.store.list_audit(filter, before_id, limit).await?;
    let next = (items.len() as u32 == limit)
        .then(|| items.last().map(|e| e.id))
        .flatten();
    Ok((items, next))
}

pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &LIST)?;
    let filter = AuditFilter {
        actor: p.text("actor").map(str::to_owned),
        operation: p.text("operation").map(str::to_owned),
        resource: p.text("resource").map(str::to_owned),
        since: time(&p, "since")?,
        until: time(&p, "until")?,
    };
    let limit = p.int("limit").map_or(DEFAULT_LIMIT, |n| n as u32);
    let (items, next) = page(&state, &filter, p.int("before_id"), limit).await?;
    Ok(HttpResponse::Ok().json(AuditPage {
        items: items.iter().map(AuditView::from).collect(),
        next_before_id: next,
    }))
}
