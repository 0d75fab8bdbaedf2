//! Console sessions in memory: [`ConsoleSessionStore`].

use super::MemoryStore;
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[async_trait]
impl ConsoleSessionStore for MemoryStore {
    async fn put_console_session(
        &self,
        session: &ConsoleSession,
        now: DateTime<Utc>,
        max: u32,
    ) -> StoreResult<()> {
        let mut g = self.lock()?;
        let live = &mut g.console_sessions;
        live.retain(|_, s| s.expires_at > now);
        // Per identity: a user by id, a built-in principal by its name.
        let same_user = |s: &&ConsoleSession| match session.user_id {
            Some(id) => s.user_id == Some(id),
            None => s.user_id.is_none() && s.user_name == session.user_name,
        };
        while live.values().filter(same_user).count() >= max.max(1) as usize {
            let Some(soonest) = live
                .values()
                .filter(same_user)
                .min_by(|a, b| (a.expires_at, &a.id_hash).cmp(&(b.expires_at, &b.id_hash)))
                .map(|s| s.id_hash.clone())
            else {
                break;
            };
            live.remove(&soonest);
        }
        live.insert(session.id_hash.clone(), session.clone());
        Ok(())
    }

    async fn get_console_session(
        &self,
        id_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ConsoleSession>> {
        let g = self.lock()?;
        Ok(g.console_sessions
            .get(id_hash)
            .filter(|s| s.expires_at > now)
            .cloned())
    }

    async fn delete_console_session(&self, id_hash: &str) -> StoreResult<()> {
        self.lock()?.console_sessions.remove(id_hash);
        Ok(())
    }
}
