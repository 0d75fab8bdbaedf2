//! The event stream: every event is stored (so `/v1/events` can replay from
//! an id after a reconnect) and broadcast to live subscribers.
//!
//! Two ways in. An event that reports a state change (a run queued,
//! started, parked, finished or missed, an account's state) is stored by
//! the store in the change's own transaction ([`EventBus::event`] builds
//! it, the store call carries it), so a crash or a failed write loses both
//! or neither; once committed it is only broadcast here
//! ([`EventBus::published`]). Informational events (progress, signals)
//! are emitted: they go, in order, to one writer task that stores
//! whatever has queued up in one transaction, then broadcasts it, so a
//! burst of ten thousand notifications does not slow the sends.

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

    /// An event to store with the state change it reports, at the bus's
    /// clock's now.
    pub fn event(
        &self,
        kind: &'static str,
        account_id: Option<&AccountId>,
        run_id: Option<RunId>,
        data: serde_json::Value,
    ) -> NewEvent {
        NewEvent {
            at: self.clock.now(),
            kind,
            account_id: account_id.cloned(),
            run_id,
            data,
        }
    }

    /// Sets an account's state and stores `account_state` (state, reason
    /// and `extra`'s fields) in one transaction, then broadcasts it.
    pub async fn account_state(
        &self,
        store: &dyn Store,
        id: &AccountId,
        state: crate::domain::AccountState,
        reason: Option<&str>,
        until: Option<chrono::DateTime<chrono::Utc>>,
    ) -> crate::ports::StoreResult<crate::domain::Account> {
        let event = self.event(
            "account_state",
            Some(id),
            None,
            serde_json::json!({"state": state, "reason": reason}),
        );
        let (account, stored) = store
            .change_account_state(id, state, reason, until, &event)
            .await?;
        self.published(Some(stored));
        Ok(account)
    }

    /// Broadcasts an event the store has committed with its change.
    pub fn published(&self, event: Option<Event>) {
        if let Some(e) = event {
            let _ = self.live.send(e);
        }
    }

    /// Queues an event for storing and broadcasting; returns at once. A
    /// store failure is logged, not returned (an event must never stop a
    /// delivery), and the event is tried again with the next ones, up to
    /// [`MAX_RETRY`] of them kept: `reminder_failed_to_fire`, told because
    /// the store refused a firing, is stored once the store answers again.
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
/// Events a failing store left to try again, at most; beyond, the oldest
/// are given up (and logged).
pub const MAX_RETRY: usize = 10_000;
/// How soon events left to try again are tried when nothing new comes.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

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
    let mut retry: std::collections::VecDeque<NewEvent> = Default::default();
    loop {
        // With events left to try again, wake after a while even if
        // nothing new comes; otherwise wait (no timer: a simulation's
        // trace does not depend on one).
        let first = if retry.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout(RETRY_EVERY, rx.recv()).await {
                Ok(item) => item,
                Err(_) => Some(Item::Flush(oneshot::channel().0)),
            }
        };
        let Some(first) = first else { return };
        batch.extend(retry.drain(..));
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
        let (stored, failed) = store_batch(&*store, &batch).await;
        for ev in stored {
            let _ = live.send(ev);
        }
        retry.extend(failed);
        while retry.len() > MAX_RETRY {
            if let Some(lost) = retry.pop_front() {
                tracing::error!(
                    kind = lost.kind,
                    "an event could not be stored and is given up"
                );
            }
        }
        batch.clear();
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// The events stored, in order, and those that could not be. If the
/// batch fails each event is tried on its own, so one failure holds back
/// only the events that fail themselves.
async fn store_batch(store: &dyn Store, batch: &[NewEvent]) -> (Vec<Event>, Vec<NewEvent>) {
    match batch {
        [] => return (Vec::new(), Vec::new()),
        [_] => {}
        _ => match store.append_events(batch).await {
            Ok(stored) => return (stored, Vec::new()),
            Err(e) => {
                tracing::warn!(error = %e, events = batch.len(), "could not store events together; trying one by one")
            }
        },
    }
    let mut stored = Vec::with_capacity(batch.len());
    let mut failed = Vec::new();
    for new in batch {
        match store.append_event(new).await {
            Ok(ev) => stored.push(ev),
            Err(e) => {
                tracing::warn!(error = %e, kind = new.kind, "could not store an event; it is tried again with the next ones");
                failed.push(new.clone());
            }
        }
    }
    (stored, failed)
}
