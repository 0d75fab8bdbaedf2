//! Accounts and media in memory: [`AccountStore`] and [`MediaStore`].

use super::{take_limit, MemoryStore};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashSet;

#[async_trait]
impl AccountStore for MemoryStore {
    // ------------------------------------------------------------ accounts

    async fn create_account(&self, a: &NewAccount, now: DateTime<Utc>) -> StoreResult<Account> {
        let mut g = self.lock()?;
        if g.accounts.contains_key(&a.id) {
            return Err(StoreError::Conflict(format!(
                "account {} already exists",
                a.id
            )));
        }
        let account = Account {
            id: a.id.clone(),
            name: a.name.clone(),
            kind: a.kind,
            state: a.state,
            state_reason: None,
            state_until: None,
            limits: a.limits.clone(),
            created_at: now,
            incident_at: None,
            standing: Standing::default(),
        };
        g.accounts.insert(a.id.clone(), account.clone());
        Ok(account)
    }

    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        Ok(self.lock()?.accounts.get(id).cloned())
    }

    async fn list_accounts(&self) -> StoreResult<Vec<Account>> {
        Ok(self.lock()?.accounts.values().cloned().collect())
    }

    async fn list_accounts_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<Account>> {
        let g = self.lock()?;
        Ok(g.accounts
            .values()
            .filter(|a| after.is_none_or(|after| a.id.as_str() > after))
            .take(take_limit(limit))
            .cloned()
            .collect())
    }

    async fn update_account_limits(
        &self,
        id: &AccountId,
        limits: &AccountLimits,
    ) -> StoreResult<Account> {
        let mut g = self.lock()?;
        let a = g.account_mut(id)?;
        a.limits = limits.clone();
        Ok(a.clone())
    }

    async fn set_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
    ) -> StoreResult<Account> {
        self.set_account_state_until(id, state, reason, None).await
    }

    async fn set_account_state_until(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
    ) -> StoreResult<Account> {
        let mut g = self.lock()?;
        let a = g.account_mut(id)?;
        a.state = state;
        a.state_reason = reason.map(str::to_owned);
        a.state_until = until;
        Ok(a.clone())
    }

    async fn change_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
        event: &NewEvent,
    ) -> StoreResult<(Account, Event)> {
        let mut g = self.lock()?;
        let a = g.account_mut(id)?;
        a.state = state;
        a.state_reason = reason.map(str::to_owned);
        a.state_until = until;
        let account = a.clone();
        Ok((account, g.store_event(event)))
    }

    async fn record_incident(&self, id: &AccountId, at: DateTime<Utc>) -> StoreResult<()> {
        let mut g = self.lock()?;
        g.account_mut(id)?.incident_at = Some(at);
        Ok(())
    }

    async fn set_account_standing(
        &self,
        id: &AccountId,
        was: Option<&Standing>,
        standing: &Standing,
        changed: Option<&NewEvent>,
    ) -> StoreResult<Option<Event>> {
        let mut g = self.lock()?;
        let a = g.account_mut(id)?;
        if was.is_some_and(|w| *w != a.standing) {
            return Err(StoreError::Conflict(format!(
                "account {id}: its standing changed meanwhile"
            )));
        }
        a.standing = standing.clone();
        Ok(changed.map(|e| g.store_event(e)))
    }

    async fn delete_account(&self, id: &AccountId) -> StoreResult<()> {
        let mut g = self.lock()?;
        if !g.accounts.contains_key(id) {
            return Err(StoreError::NotFound(format!("account {id}")));
        }
        let live = g
            .reminders
            .values()
            .filter(|r| &r.spec.account_id == id && r.state != ReminderState::Archived)
            .count();
        if live > 0 {
            return Err(StoreError::Conflict(format!(
                "account {id} has {live} reminder(s) that are not archived"
            )));
        }
        // A run or a recall the account's actor is carrying, on whichever
        // daemon: deleting would cut it off mid-send.
        if let Some(r) = g.runs.values().find(|r| {
            &r.run.account_id == id && crate::lifecycle::is_owned_by_account(r.run.status)
        }) {
            return Err(StoreError::Conflict(format!(
                "account {id} has a run {} (run {}); stop it first",
                r.run.status, r.run.id
            )));
        }
        if let Some(a) = g
            .amendments
            .values()
            .find(|a| &a.account == id && !a.a.is_finished())
        {
            return Err(StoreError::Conflict(format!(
                "account {id} is recalling or editing a run (amendment {}); let it finish first",
                a.a.id
            )));
        }
        // Archived reminders, their runs, the account's upload handles and
        // its lease go with it, as the SQL schema's cascading foreign keys do.
        g.leases.remove(id);
        let reminders: Vec<i64> = g
            .reminders
            .values()
            .filter(|r| &r.spec.account_id == id)
            .map(|r| r.id)
            .collect();
        let mut runs: Vec<i64> = reminders
            .iter()
            .flat_map(|r| g.run_ids_of_reminder(*r).collect::<Vec<_>>())
            .collect();
        runs.extend(
            g.runs
                .values()
                .filter(|r| &r.run.account_id == id)
                .map(|r| r.run.id.0),
        );
        for run in runs {
            g.remove_run(run);
        }
        for r in reminders {
            g.reminders.remove(&r);
        }
        g.handles.retain(|(a, _), _| a != id);
        g.groups.remove(id);
        g.group_syncs.remove(id);
        g.accounts.remove(id);
        Ok(())
    }
}

#[async_trait]
impl MediaStore for MemoryStore {
    // ------------------------------------------------------------ media

    async fn put_media(&self, m: &MediaInfo) -> StoreResult<MediaInfo> {
        let mut g = self.lock()?;
        Ok(g.media
            .entry(m.id.clone())
            .or_insert_with(|| m.clone())
            .clone())
    }

    async fn get_media(&self, id: &MediaId) -> StoreResult<Option<MediaInfo>> {
        Ok(self.lock()?.media.get(id).cloned())
    }

    async fn get_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
    ) -> StoreResult<Option<UploadHandle>> {
        Ok(self
            .lock()?
            .handles
            .get(&(account.clone(), media.clone()))
            .cloned())
    }

    async fn put_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
        h: &UploadHandle,
    ) -> StoreResult<()> {
        let mut g = self.lock()?;
        if !g.accounts.contains_key(account) {
            return Err(StoreError::NotFound(format!("account {account}")));
        }
        if !g.media.contains_key(media) {
            return Err(StoreError::NotFound(format!("media {media}")));
        }
        g.handles
            .insert((account.clone(), media.clone()), h.clone());
        Ok(())
    }

    async fn prune_media(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<MediaId>> {
        let mut g = self.lock()?;
        let used: HashSet<&MediaId> = g
            .reminders
            .values()
            .flat_map(|r| r.spec.parts.iter().filter_map(|p| p.media_id()))
            .collect();
        let mut gone: Vec<MediaId> = g
            .media
            .values()
            .filter(|m| m.created_at < before && !used.contains(&m.id))
            .map(|m| m.id.clone())
            .collect();
        gone.sort();
        gone.truncate(take_limit(limit));
        for id in &gone {
            g.media.remove(id);
        }
        g.handles.retain(|(_, m), _| !gone.contains(m));
        Ok(gone)
    }
}
