//! An account's group directory as operators see and shape it: list and
//! search it, sync it from WhatsApp, turn an import's names into JIDs,
//! label groups.

use super::error::{ApiError, Kind};
use super::Service;
use super::{Allowed, Operation};
use crate::groups::{GroupDirectory, SyncError};
use chrono::{DateTime, Utc};
use herald_actors::domain::{
    resolve_entries, AccountId, Group, GroupFilter, GroupJid, GroupSyncSummary, Label, Role,
};
use herald_actors::ports::{GatewayError, Store};
use schemars::JsonSchema;
use serde::Serialize;

pub static LIST: Operation = Operation::read("listGroups", Role::Viewer);
pub static SYNC: Operation = Operation::new("syncGroups", Role::Operator);
pub static RESOLVE: Operation = Operation::read("resolveGroups", Role::Viewer);
pub static SET_LABELS: Operation = Operation::new("setGroupLabels", Role::Operator);

/// An import's entries as JIDs.
#[derive(Serialize, JsonSchema)]
pub struct ResolvedGroups {
    pub targets: Vec<GroupJid>,
}

/// A page of an account's groups.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "GroupPage")]
pub struct GroupPageView {
    pub items: Vec<Group>,
    /// Groups matching the filters, over all pages.
    pub total: u64,
    /// Pass as `after` for the next page; null on the last.
    pub next_after: Option<GroupJid>,
}

/// What a sync changed, and when the directory was last synced.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "GroupSync")]
pub struct SyncView {
    #[serde(flatten)]
    pub summary: GroupSyncSummary,
    pub synced_at: Option<DateTime<Utc>>,
}

/// What the directory's operations need: the stored directory and the
/// syncer that asks WhatsApp.
pub struct Groups<'a> {
    store: &'a dyn Store,
    directory: &'a GroupDirectory,
}

impl<'a> Groups<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
            directory: &state.groups,
        }
    }

    /// A page of the groups `filter` selects; a full page may have more
    /// behind it.
    pub async fn list(
        &self,
        allowed: Allowed,
        filter: &GroupFilter,
    ) -> Result<GroupPageView, ApiError> {
        allowed.of(&LIST)?;
        let page = self.store.list_groups(filter).await?;
        let next_after = (page.items.len() as u32 == filter.limit)
            .then(|| page.items.last().map(|g| g.info.jid.clone()))
            .flatten();
        Ok(GroupPageView {
            items: page.items,
            total: page.total,
            next_after,
        })
    }

    /// One participating-groups request to WhatsApp, stored as the
    /// account's directory.
    pub async fn sync(&self, allowed: Allowed, account: &AccountId) -> Result<SyncView, ApiError> {
        allowed.of(&SYNC)?;
        let summary = self.directory.sync(account).await.map_err(sync_error)?;
        let synced_at = self.store.groups_synced_at(account).await?;
        Ok(SyncView { summary, synced_at })
    }

    /// Each entry, a JID or a group's exact name, as the JID it names;
    /// nothing is written.
    pub async fn resolve(
        &self,
        allowed: Allowed,
        account: AccountId,
        entries: &[String],
    ) -> Result<ResolvedGroups, ApiError> {
        allowed.of(&RESOLVE)?;
        if self.store.get_account(&account).await?.is_none() {
            return Err(ApiError::not_found(format!("account {account}")));
        }
        let directory = self
            .store
            .list_groups(&GroupFilter::all_of(account))
            .await?
            .items;
        let targets = resolve_entries(entries, &directory).map_err(ApiError::import_refused)?;
        Ok(ResolvedGroups { targets })
    }

    /// Replaces the group's labels.
    pub async fn set_labels(
        &self,
        allowed: Allowed,
        account: &AccountId,
        jid: &GroupJid,
        labels: &[Label],
    ) -> Result<Group, ApiError> {
        allowed.of(&SET_LABELS)?;
        Ok(self.store.set_group_labels(account, jid, labels).await?)
    }
}

fn sync_error(e: SyncError) -> ApiError {
    match e {
        SyncError::UnknownAccount(a) => ApiError::not_found(format!("account {a}")),
        SyncError::Throttled { retry_after, .. } => {
            let mut err = ApiError::new(Kind::TooManyRequests, e.to_string());
            err.retry_after = Some(retry_after.as_secs().max(1));
            err
        }
        SyncError::NotConnected(..) => ApiError::conflict(e.to_string()),
        SyncError::Gateway(_, GatewayError::LoggedOut | GatewayError::Banned { .. }) => {
            ApiError::conflict(e.to_string())
        }
        SyncError::Gateway(..) => ApiError::new(Kind::Unavailable, e.to_string()),
        SyncError::Store(s) => s.into(),
    }
}
