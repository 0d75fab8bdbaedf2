//! The event stream: every event is stored (so `/v1/events` can replay from
//! an id after a reconnect) and broadcast to live subscribers.
//!
//! Emitting never waits for the database: events go, in order, to one
//! writer task that stores whatever has queued up in one transaction, then
//! broadcasts it. A burst of ten thousand runs queued at one instant is not
//! slowed by its own notifications.

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

/// Most events stored in one transaction; bounds one commit's latency.
const MAX_BATCH: usize = 4096;

/// Stores everything queued so far in one `append_events` call (a burst
/// of runs queued at one instant costs a few commits, not one each), then
/// broadcasts it in order and answers the flushes taken with it.
async fn write_events(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Item>,
    live: broadcast::Sender<Event>,
) {
    let mut batch = Vec::new();
    let mut flushes = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(item) = next {
            match item {
                Item::Event(new) => batch.push(new),
                Item::Flush(done) => flushes.push(done),
            }
            next = if batch.len() < MAX_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        for ev in store_batch(&*store, &batch).await {
            let _ = live.send(ev);
        }
        batch.clear();
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// The events stored, in order. If the batch fails each event is tried on
/// its own, so one failure loses only the events that fail themselves.
async fn store_batch(store: &dyn Store, batch: &[NewEvent]) -> Vec<Event> {
    match batch {
        [] => return Vec::new(),
        [_] => {}
        _ => match store.append_events(batch).await {
            Ok(stored) => return stored,
            Err(e) => {
                tracing::warn!(error = %e, events = batch.len(), "could not store events together; trying one by one")
            }
        },
    }
    let mut stored = Vec::with_capacity(batch.len());
    for new in batch {
        match store.append_event(new).await {
            Ok(ev) => stored.push(ev),
            Err(e) => tracing::warn!(error = %e, kind = new.kind, "could not store event"),
        }
    }
    stored
}
