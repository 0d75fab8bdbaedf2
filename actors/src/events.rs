//! The event stream: every event is stored (so `/v1/events` can replay from
//! an id after a reconnect) and broadcast to live subscribers.
//!
//! Emitting never waits for the database: events go, in order, to one
//! writer task that stores then broadcasts them. A burst of ten thousand
//! runs queued at one instant is not slowed by its own notifications.

use crate::domain::{AccountId, Event, NewEvent, RunId};
use crate::ports::{Clock, Store};
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, oneshot};

enum Item {
    Event(NewEvent),
    /// Answered once every event before it is stored.
    Flush(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct EventBus {
    clock: Arc<dyn Clock>,
    live: broadcast::Sender<Event>,
    tx: mpsc::UnboundedSender<Item>,
}

impl EventBus {
    /// Starts the writer task on the current runtime.
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        // Subscribers that fall this far behind get a lag notice and can
        // catch up from the store.
        let (live, _) = broadcast::channel(4096);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_events(store, rx, live.clone()));
        Self { clock, live, tx }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.live.subscribe()
    }

    /// Queues an event for storing and broadcasting; returns at once. A
    /// store failure is logged, not returned: losing an event must never
    /// stop a delivery.
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
        let _ = self.tx.send(Item::Event(new));
    }

    /// Resolves once every event emitted before it is stored and broadcast.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Item::Flush(done)).is_ok() {
            let _ = wait.await;
        }
    }
}

async fn write_events(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Item>,
    live: broadcast::Sender<Event>,
) {
    while let Some(item) = rx.recv().await {
        match item {
            Item::Event(new) => match store.append_event(&new).await {
                Ok(ev) => {
                    let _ = live.send(ev);
                }
                Err(e) => tracing::warn!(error = %e, kind = new.kind, "could not store event"),
            },
            Item::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}
