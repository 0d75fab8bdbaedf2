//! Group commit for run-target transitions. Every account actor hands its
//! marks to one writer task; whatever arrives while a commit is in flight
//! goes into the next transaction, so a thousand accounts cost a handful of
//! commits a second instead of a thousand.

use crate::domain::Transition;
use crate::ports::{Store, StoreError, StoreResult};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Largest batch per transaction; keeps one commit's latency bounded.
const MAX_BATCH: usize = 4096;

struct Item {
    transitions: Vec<Transition>,
    done: Option<oneshot::Sender<StoreResult<()>>>,
}

/// A cheap, cloneable handle to the writer task.
#[derive(Clone)]
pub struct StoreWriter {
    tx: mpsc::UnboundedSender<Item>,
}

impl StoreWriter {
    /// Starts the writer on the current runtime (an actix arbiter or tokio).
    pub fn start(store: Arc<dyn Store>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        actix_rt::spawn(run(store, rx));
        Self { tx }
    }

    /// Starts the writer on its own arbiter thread.
    pub fn start_on(store: Arc<dyn Store>, arbiter: &actix_rt::ArbiterHandle) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        arbiter.spawn(run(store, rx));
        Self { tx }
    }

    /// Resolves once the transition is committed. Use before a send.
    pub async fn commit(&self, t: Transition) -> StoreResult<()> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Item {
                transitions: vec![t],
                done: Some(done),
            })
            .map_err(|_| closed())?;
        wait.await.map_err(|_| closed())?
    }

    /// Queues a transition without waiting. Safe for `sent` marks: if it is
    /// lost in a crash the part is re-sent with the same id and deduplicated.
    pub fn post(&self, t: Transition) {
        let _ = self.tx.send(Item {
            transitions: vec![t],
            done: None,
        });
    }

    /// Resolves once everything queued before it is committed.
    pub async fn flush(&self) -> StoreResult<()> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Item {
                transitions: vec![],
                done: Some(done),
            })
            .map_err(|_| closed())?;
        wait.await.map_err(|_| closed())?
    }
}

fn closed() -> StoreError {
    StoreError::Backend("the store writer has stopped".into())
}

/// A batch that failed with a backend error (busy, failover, timeout) is
/// tried again after this, doubling to [`MAX_RETRY_WAIT`]: marks are never
/// dropped for a passing fault, and a send waits for its `sending` mark
/// however long the store takes.
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(50);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

async fn run(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Item>) {
    let mut items: Vec<Item> = Vec::with_capacity(64);
    while let Some(first) = rx.recv().await {
        items.push(first);
        let mut marks = items[0].transitions.len();
        while marks < MAX_BATCH {
            match rx.try_recv() {
                Ok(item) => {
                    marks += item.transitions.len();
                    items.push(item);
                }
                Err(_) => break,
            }
        }
        commit_batch(&*store, &mut items).await;
        items.clear();
    }
}

/// Commits every item's transitions, answering each waiter. A failed batch
/// is retried whole while the error is the backend's; a batch refused for
/// its content (a target that no longer exists) is split so that only the
/// items that can never apply fail, and everyone else's marks land.
async fn commit_batch(store: &dyn Store, items: &mut [Item]) {
    let batch: Vec<Transition> = items
        .iter()
        .flat_map(|i| i.transitions.iter().cloned())
        .collect();
    match apply_retrying(store, &batch).await {
        Ok(()) => {
            for item in items.iter_mut() {
                item.answer(Ok(()));
            }
        }
        Err(_) if items.len() > 1 => {
            for item in items.iter_mut() {
                let r = apply_retrying(store, &item.transitions).await;
                if let Err(e) = &r {
                    tracing::error!(error = %e, marks = ?item.transitions, "a run-target mark can never apply; dropped");
                }
                item.answer(r);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, marks = ?batch, "a run-target mark can never apply; dropped");
            for item in items.iter_mut() {
                item.answer(Err(e.clone()));
            }
        }
    }
}

/// Applies `ts`, retrying backend errors with backoff until they pass.
async fn apply_retrying(store: &dyn Store, ts: &[Transition]) -> StoreResult<()> {
    if ts.is_empty() {
        return Ok(());
    }
    let mut wait = FIRST_RETRY_WAIT;
    loop {
        match store.apply_transitions(ts).await {
            Err(StoreError::Backend(e)) => {
                tracing::warn!(error = %e, marks = ts.len(), retry_in_ms = wait.as_millis() as u64, "committing run-target marks failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_RETRY_WAIT);
            }
            other => return other,
        }
    }
}

impl Item {
    fn answer(&mut self, r: StoreResult<()>) {
        if let Some(done) = self.done.take() {
            let _ = done.send(r);
        }
    }
}
