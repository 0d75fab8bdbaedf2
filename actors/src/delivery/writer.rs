//! Group commit for run-target transitions. Every account actor hands its
//! marks to one writer task; whatever arrives while a commit is in flight
//! goes into the next transaction, so a thousand accounts cost a handful of
//! commits a second instead of a thousand.

use crate::domain::Fence;
use crate::domain::Transition;
use crate::ports::{Store, StoreError, StoreResult};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Largest batch per transaction; keeps one commit's latency bounded.
const MAX_BATCH: usize = 4096;

struct Item {
    transitions: Vec<Transition>,
    /// Several daemons: the lease the marks are written under.
    fence: Option<Fence>,
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
        self.commit_fenced(t, None).await
    }

    /// [`StoreWriter::commit`] under an account lease: refused with
    /// [`StoreError::Fenced`] once `fence` is no longer current.
    pub async fn commit_fenced(&self, t: Transition, fence: Option<Fence>) -> StoreResult<()> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Item {
                transitions: vec![t],
                fence,
                done: Some(done),
            })
            .map_err(|_| closed())?;
        wait.await.map_err(|_| closed())?
    }

    /// Queues a transition without waiting. Safe for `sent` marks: if it is
    /// lost in a crash the part is re-sent with the same id and deduplicated.
    pub fn post(&self, t: Transition) {
        self.post_fenced(t, None)
    }

    /// [`StoreWriter::post`] under an account lease (a stale one is logged
    /// and dropped: the new owner re-sends with the same id).
    pub fn post_fenced(&self, t: Transition, fence: Option<Fence>) {
        let _ = self.tx.send(Item {
            transitions: vec![t],
            fence,
            done: None,
        });
    }

    /// Resolves once everything queued before it is committed.
    pub async fn flush(&self) -> StoreResult<()> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Item {
                transitions: vec![],
                fence: None,
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
    let mut fences: Vec<Fence> = Vec::new();
    for f in items.iter().filter_map(|i| i.fence.as_ref()) {
        if !fences.contains(f) {
            fences.push(f.clone());
        }
    }
    match apply_retrying(store, &fences, &batch).await {
        Ok(()) => {
            for item in items.iter_mut() {
                item.answer(Ok(()));
            }
        }
        Err(_) if items.len() > 1 => {
            for item in items.iter_mut() {
                let fences: Vec<Fence> = item.fence.iter().cloned().collect();
                let r = apply_retrying(store, &fences, &item.transitions).await;
                match &r {
                    Err(e @ StoreError::Fenced(_)) => {
                        tracing::warn!(error = %e, marks = item.transitions.len(), "marks of an account this daemon no longer owns; dropped")
                    }
                    Err(e) => {
                        tracing::error!(error = %e, marks = ?item.transitions, "a run-target mark can never apply; dropped")
                    }
                    Ok(()) => {}
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
async fn apply_retrying(store: &dyn Store, fences: &[Fence], ts: &[Transition]) -> StoreResult<()> {
    if ts.is_empty() {
        return Ok(());
    }
    let mut wait = FIRST_RETRY_WAIT;
    loop {
        let applied = if fences.is_empty() {
            store.apply_transitions(ts).await
        } else {
            store.apply_transitions_fenced(fences, ts).await
        };
        match applied {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::*;
    use crate::memstore::MemoryStore;
    use crate::ports::NewAccount;
    use crate::ports::{AccountStore, ReminderStore, RunStore};
    use chrono::{DateTime, Utc};

    fn t0() -> DateTime<Utc> {
        "2026-11-23T01:00:00Z".parse().unwrap()
    }

    /// Two runs (of two accounts) with `n` targets each.
    async fn two_runs(store: &MemoryStore, n: usize) -> [Vec<RunTarget>; 2] {
        let mut out = Vec::new();
        for name in ["a", "b"] {
            let id = AccountId::parse(name).unwrap();
            store
                .create_account(
                    &NewAccount {
                        id: id.clone(),
                        name: name.into(),
                        kind: GatewayKind::Simulator,
                        state: AccountState::Connected,
                        limits: AccountLimits::default(),
                    },
                    t0(),
                )
                .await
                .unwrap();
            let groups: Vec<GroupJid> = (1..=n)
                .map(crate::simulator::Simulator::numbered_group)
                .collect();
            let spec = NewReminder::new(
                id.clone(),
                "writer test",
                TimeZone::parse("UTC").unwrap(),
                Schedule::once("2000-01-01T00:00").unwrap(),
                WindowHours::parse(0, 24).unwrap(),
                false,
                vec![MessagePart::text("x").unwrap()],
                groups.clone(),
            )
            .unwrap();
            let r = store.create_reminder(&spec, t0()).await.unwrap();
            let run = store
                .create_run(r.id, &id, t0(), RunStatus::Running, None, t0())
                .await
                .unwrap()
                .run;
            store.create_targets(run.id, &groups).await.unwrap();
            out.push(store.list_targets(run.id, None, None, 0).await.unwrap());
        }
        [out.remove(0), out.remove(0)]
    }

    fn sending(t: &RunTarget) -> Transition {
        Transition::Sending {
            target_id: t.id,
            part: 0,
            message_id: format!("m{}", t.id),
        }
    }

    #[actix_rt::test]
    async fn a_failed_batch_is_retried_and_no_mark_is_lost() {
        tokio::time::pause();
        let store = Arc::new(MemoryStore::new());
        let [a, b] = two_runs(&store, 3).await;
        store.fail_next_transitions(3);
        let writer = StoreWriter::start(store.clone());
        for t in a.iter().chain(&b) {
            writer.post(sending(t));
        }
        writer
            .flush()
            .await
            .expect("flushed once the store recovers");
        for t in a.iter().chain(&b) {
            let stored = store.list_targets(t.run_id, None, None, 0).await.unwrap();
            let s = stored.iter().find(|x| x.id == t.id).unwrap();
            assert_eq!(s.status, TargetStatus::Sending, "mark of {} lost", t.id);
        }
    }

    #[actix_rt::test]
    async fn a_mark_that_can_never_apply_fails_alone() {
        let store = Arc::new(MemoryStore::new());
        let [a, b] = two_runs(&store, 2).await;
        let writer = StoreWriter::start(store.clone());
        let bad = Transition::Sending {
            target_id: 999_999,
            part: 0,
            message_id: "gone".into(),
        };
        // All in one batch: queued before the writer task first runs.
        let w = writer.clone();
        let good_a = sending(&a[0]);
        let good_b = sending(&b[1]);
        let (ra, rbad, rb) = tokio::join!(w.commit(good_a), w.commit(bad), w.commit(good_b));
        assert!(ra.is_ok() && rb.is_ok(), "{ra:?} {rb:?}");
        assert!(matches!(rbad, Err(StoreError::NotFound(_))), "{rbad:?}");
        let sa = store
            .list_targets(a[0].run_id, None, None, 0)
            .await
            .unwrap();
        let sb = store
            .list_targets(b[1].run_id, None, None, 0)
            .await
            .unwrap();
        assert_eq!(sa[0].status, TargetStatus::Sending);
        assert_eq!(sb[1].status, TargetStatus::Sending);
        assert_eq!(sa[1].status, TargetStatus::Pending, "only what was asked");
    }
}
