//! The activity log in memory: [`EventStore`].

use super::{take_limit, MemoryStore};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[async_trait]
impl EventStore for MemoryStore {
    // ------------------------------------------------------------ events

    async fn append_event(&self, e: &NewEvent) -> StoreResult<Event> {
        let mut g = self.lock()?;
        Ok(g.store_event(e))
    }

    async fn events_after(&self, after_id: i64, limit: u32) -> StoreResult<Vec<Event>> {
        let g = self.lock()?;
        Ok(g.events
            .range(after_id.saturating_add(1)..)
            .map(|(_, e)| e)
            .take(take_limit(limit))
            .cloned()
            .collect())
    }

    async fn prune_events(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        let mut g = self.lock()?;
        let gone: Vec<i64> = g
            .events
            .values()
            .filter(|e| e.at < before)
            .take(take_limit(limit))
            .map(|e| e.id)
            .collect();
        for id in &gone {
            g.events.remove(id);
        }
        if let Some(max) = gone.iter().max() {
            g.events_pruned_through = g.events_pruned_through.max(*max);
        }
        Ok(gone.len() as u64)
    }

    async fn events_pruned_through(&self) -> StoreResult<i64> {
        Ok(self.lock()?.events_pruned_through)
    }
}

impl super::Inner {
    /// Stores `e` under the caller's lock (with the state change it
    /// reports, when there is one), and its webhook deliveries.
    pub(super) fn store_event(&mut self, e: &NewEvent) -> Event {
        self.last_event_id += 1;
        let event = Event {
            id: self.last_event_id,
            at: e.at,
            kind: e.kind.to_owned(),
            account_id: e.account_id.as_ref().map(|a| a.as_str().to_owned()),
            run_id: e.run_id.map(|r| r.0),
            data: e.data.clone(),
        };
        self.events.insert(event.id, event.clone());
        // What the SQL store's trigger does, under the same lock.
        super::webhooks::fan_out(self, &event);
        event
    }
}
