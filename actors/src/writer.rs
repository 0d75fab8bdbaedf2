//! Group commit for run-target transitions. Every account actor hands its
//! marks to one writer task; whatever arrives while a commit is in flight
//! goes into the next transaction, so a thousand accounts cost a handful of
//! commits a second instead of a thousand.

use crate::domain::Transition;
use crate::ports::{Store, StoreError, StoreResult};
use std::sync::Arc;
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

async fn run(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Item>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut waiters = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut take = |item: Item, batch: &mut Vec<Transition>| {
            batch.extend(item.transitions);
            if let Some(done) = item.done {
                waiters.push(done);
            }
        };
        take(first, &mut batch);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(item) => take(item, &mut batch),
                Err(_) => break,
            }
        }
        let result = if batch.is_empty() {
            Ok(())
        } else {
            store.apply_transitions(&batch).await
        };
        if let Err(e) = &result {
            tracing::error!(error = %e, marks = batch.len(), "committing run-target marks failed");
        }
        for done in waiters.drain(..) {
            let _ = done.send(result.clone());
        }
        batch.clear();
    }
}
