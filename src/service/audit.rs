//! The audit log as admins read it: every write through the API or the
//! console, newest first, with filters and keyset paging
//! (`http::trail` writes it).

use super::error::ApiError;
use super::Service;
use super::{Allowed, Operation};
use chrono::{DateTime, Utc};
use herald_actors::domain::{AuditEntry, AuditFilter, Role};
use herald_actors::ports::Store;
use schemars::JsonSchema;
use serde::Serialize;

pub static LIST: Operation = Operation::read("listAudit", Role::Admin);

/// One entry of the audit log as the API shows it.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "AuditEntry")]
pub struct AuditView {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// The user's name; `control.token` for the daemon's own token.
    pub actor: String,
    pub actor_id: Option<i64>,
    /// null for an attempt that proved no identity (a wrong token, a
    /// failed sign-in).
    pub role: Option<Role>,
    /// Attempts this entry stands for: 1 for a write; failed
    /// authentications and sign-ins are counted per address and minute.
    #[schemars(range(min = 1))]
    pub count: u32,
    /// `api` or `console`.
    pub via: String,
    /// The operation id of this document.
    pub operation: String,
    pub method: String,
    pub path: String,
    pub resource: Option<String>,
    /// The request body, compact and cut short; secrets left out.
    pub summary: String,
    pub status: u16,
    /// The client's address (the one a trusted proxy names), or `unix`.
    pub remote: String,
    /// The daemon of the cluster that forwarded this write here, where it
    /// ran for `actor`; null for a write made on this daemon.
    pub forwarded_by: Option<String>,
}

impl From<AuditEntry> for AuditView {
    fn from(e: AuditEntry) -> Self {
        let x = e.entry;
        Self {
            id: e.id,
            at: x.at,
            actor: x.actor,
            actor_id: x.actor_id,
            role: x.role,
            count: x.count,
            via: x.via,
            operation: x.operation,
            method: x.method,
            path: x.path,
            resource: x.resource,
            summary: x.summary,
            status: x.status,
            remote: x.remote,
            forwarded_by: x.forwarded_by,
        }
    }
}

/// A page of the audit log, newest first.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AuditPage {
    pub items: Vec<AuditView>,
    pub next_before_id: Option<i64>,
}

pub struct Audit<'a> {
    store: &'a dyn Store,
}

impl<'a> Audit<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
        }
    }

    /// At most `limit` entries `filter` selects with ids below
    /// `before_id`; a full page may have more behind it.
    pub async fn list(
        &self,
        allowed: Allowed,
        filter: &AuditFilter,
        before_id: Option<i64>,
        limit: u32,
    ) -> Result<AuditPage, ApiError> {
        allowed.of(&LIST)?;
        let items = self.store.list_audit(filter, before_id, limit).await?;
        let next_before_id = (items.len() as u32 == limit)
            .then(|| items.last().map(|e| e.id))
            .flatten();
        Ok(AuditPage {
            items: items.into_iter().map(AuditView::from).collect(),
            next_before_id,
        })
    }
}
