//! The event stream: every event is stored (so `/v1/events` can replay from
//! an id after a reconnect) and broadcast to live subscribers.

use crate::domain::{AccountId, Event, NewEvent, RunId};
use crate::ports::{Clock, Store};
use std::sync::Arc;
use tokio::sync::broadcast;

#[derive(Clone)]
pub struct EventBus {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    live: broadcast::Sender<Event>,
}

impl EventBus {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        // Subscribers that fall this far behind get a lag notice and can
        // catch up from the store.
        let (live, _) = broadcast::channel(4096);
        Self { store, clock, live }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.live.subscribe()
    }

    /// Stores and broadcasts an event. A store failure is logged, not
    /// returned: losing an event must never stop a delivery.
    pub async fn emit(
        &self,
        kind: &'static str,
        account_id: Option<&AccountId>,
        run_id: Option<RunId>,
        data: serde_json::Value,
    ) {
        let new = NewEvent {
            at: self.clock.now(),
            kind,
            account_id: account_id.cloned(),
            run_id,
            data,
        };
        match self.store.append_event(&new).await {
            Ok(ev) => {
                let _ = self.live.send(ev);
            }
            Err(e) => tracing::warn!(error = %e, kind, "could not store event"),
        }
    }
}
