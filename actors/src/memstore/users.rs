//! API users and the audit log in memory: [`UserStore`], [`AuditStore`].

use super::MemoryStore;
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[async_trait]
impl UserStore for MemoryStore {
    async fn create_user(&self, user: &NewApiUser) -> StoreResult<ApiUser> {
        let mut g = self.lock()?;
        if g.users.values().any(|u| u.name == user.name) {
            return Err(StoreError::Conflict(format!(
                "a user named {} exists",
                user.name
            )));
        }
        g.last_user_id += 1;
        let stored = ApiUser {
            id: g.last_user_id,
            name: user.name.clone(),
            role: user.role,
            token_hash: user.token_hash.clone(),
            created_at: user.created_at,
            expires_at: user.expires_at,
            created_by: user.created_by.clone(),
        };
        g.users.insert(stored.id, stored.clone());
        Ok(stored)
    }

    async fn list_users(&self) -> StoreResult<Vec<ApiUser>> {
        Ok(self.lock()?.users.values().cloned().collect())
    }

    async fn get_user(&self, id: i64) -> StoreResult<ApiUser> {
        self.lock()?
            .users
            .get(&id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(format!("user {id}")))
    }

    async fn user_by_token(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ApiUser>> {
        Self::injected(&self.user_lookup_faults)?;
        Ok(self
            .lock()?
            .users
            .values()
            .find(|u| u.token_hash == token_hash && u.is_live(now))
            .cloned())
    }

    async fn delete_user(&self, id: i64) -> StoreResult<()> {
        let mut g = self.lock()?;
        if g.users.remove(&id).is_none() {
            return Err(StoreError::NotFound(format!("user {id}")));
        }
        g.console_sessions.retain(|_, s| s.user_id != Some(id));
        Ok(())
    }
}

#[async_trait]
impl AuditStore for MemoryStore {
    async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<i64> {
        let mut g = self.lock()?;
        g.last_audit_id += 1;
        let id = g.last_audit_id;
        g.audit.insert(
            id,
            AuditEntry {
                id,
                entry: entry.clone(),
            },
        );
        Ok(id)
    }

    async fn set_audit_count(&self, id: i64, count: u32) -> StoreResult<()> {
        let mut g = self.lock()?;
        match g.audit.get_mut(&id) {
            Some(e) => {
                e.entry.count = count;
                Ok(())
            }
            None => Err(StoreError::NotFound(format!("audit entry {id}"))),
        }
    }

    async fn list_audit(
        &self,
        filter: &AuditFilter,
        before_id: Option<i64>,
        limit: u32,
    ) -> StoreResult<Vec<AuditEntry>> {
        let g = self.lock()?;
        Ok(g.audit
            .range(..before_id.unwrap_or(i64::MAX))
            .rev()
            .map(|(_, e)| e)
            .filter(|e| filter.matches(&e.entry))
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn prune_audit(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        let mut g = self.lock()?;
        let old: Vec<i64> = g
            .audit
            .values()
            .filter(|e| e.entry.at < before)
            .map(|e| e.id)
            .take(limit as usize)
            .collect();
        for id in &old {
            g.audit.remove(id);
        }
        Ok(old.len() as u64)
    }
}
