//! The receipt counter: takes what gateways hear from their [`ReceiptSink`]
//! inbox (receipts and poll votes) and counts it in the store in batches
//! (a transaction per batch and kind, not per receipt), so a 1,000-group
//! run's half a million delivery receipts cost a few thousand writes. A
//! batch that fails is kept and tried again: counting is idempotent (the
//! store remembers who it counted and each voter's latest choice), so a
//! retry after a half-known outcome cannot count twice.
//!
//! [`ReceiptSink`]: crate::ports::ReceiptSink

use crate::domain::{
    NewEvent, PollResult, Receipt, ReceiptTally, Run, RunReceipts, Vote, VoteTally,
};
use crate::events::EventBus;
use crate::ports::{Clock, Heard, Metrics, Store, StoreResult};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How the counter batches.
#[derive(Debug, Clone, Copy)]
pub struct CounterConfig {
    /// The most receipts in one transaction.
    pub batch: usize,
    /// How long the first receipt of a batch waits for others.
    pub linger: Duration,
    /// The wait before a failed batch is tried again.
    pub retry_after: Duration,
}

impl Default for CounterConfig {
    fn default() -> Self {
        Self {
            batch: 2_000,
            linger: Duration::from_millis(200),
            retry_after: Duration::from_secs(1),
        }
    }
}

/// The running counter; [`CounterHandle::finish`] counts what is waiting
/// and stops it.
pub struct CounterHandle {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<ReceiptTally>,
}

impl CounterHandle {
    /// Stops taking receipts, counts those already offered, and answers
    /// the totals since the start.
    pub async fn finish(mut self) -> ReceiptTally {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.unwrap_or_default()
    }
}

/// Starts counting `inbox` into `store` on the current runtime.
pub fn spawn(
    inbox: mpsc::Receiver<Heard>,
    store: Arc<dyn Store>,
    metrics: Arc<dyn Metrics>,
    config: CounterConfig,
) -> CounterHandle {
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(run(inbox, store, metrics, config, stopped));
    CounterHandle {
        stop: Some(stop),
        task,
    }
}

async fn run(
    inbox: mpsc::Receiver<Heard>,
    store: Arc<dyn Store>,
    metrics: Arc<dyn Metrics>,
    config: CounterConfig,
    stopped: oneshot::Receiver<()>,
) -> ReceiptTally {
    let mut c = Counter {
        inbox,
        stopped,
        stopping: false,
        store,
        metrics,
        config,
        total: ReceiptTally::default(),
    };
    let mut batch: Vec<Heard> = Vec::with_capacity(config.batch);
    loop {
        c.fill(&mut batch).await;
        if c.stopping && batch.is_empty() {
            return c.total;
        }
        c.count(&mut batch).await;
    }
}

/// The counter's task state.
struct Counter {
    inbox: mpsc::Receiver<Heard>,
    stopped: oneshot::Receiver<()>,
    /// Asked to stop (or every sink is gone): what is in the inbox is all
    /// there will be.
    stopping: bool,
    store: Arc<dyn Store>,
    metrics: Arc<dyn Metrics>,
    config: CounterConfig,
    total: ReceiptTally,
}

impl Counter {
    /// Adds to `batch` up to its size: waits for a first receipt, then
    /// gathers for `linger` (receipts come in bursts per message); once
    /// stopping, takes only what is already there.
    async fn fill(&mut self, batch: &mut Vec<Heard>) {
        let full = self.config.batch;
        if !self.stopping && batch.is_empty() {
            tokio::select! {
                got = self.inbox.recv() => match got {
                    Some(r) => batch.push(r),
                    None => self.stopping = true,
                },
                _ = &mut self.stopped => self.stop(),
            }
        }
        if !self.stopping {
            let linger = tokio::time::sleep(self.config.linger);
            tokio::pin!(linger);
            while batch.len() < full && !self.stopping {
                tokio::select! {
                    got = self.inbox.recv() => match got {
                        Some(r) => batch.push(r),
                        None => self.stopping = true,
                    },
                    _ = &mut linger => break,
                    _ = &mut self.stopped => self.stop(),
                }
            }
        }
        if self.stopping {
            while batch.len() < full {
                match self.inbox.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
        }
    }

    fn stop(&mut self) {
        self.stopping = true;
        self.inbox.close();
    }

    /// Counts `batch` and empties it; on a store error keeps it for the
    /// next try after `retry_after` (once more only when stopping: then
    /// the receipts are lost, an undercount said in the log).
    async fn count(&mut self, batch: &mut Vec<Heard>) {
        let tries = if self.stopping { 2 } else { 1 };
        let (mut receipts, mut votes) = (Vec::new(), Vec::new());
        let mut tally = ReceiptTally::default();
        for h in batch.drain(..) {
            match h {
                Heard::Receipt(r) => receipts.push(r),
                Heard::Vote(v) => votes.push(v),
                Heard::Unopened(why) => *tally.votes.ignored.entry(why).or_default() += 1,
            }
        }
        for attempt in 1..=tries {
            let left = receipts.len() + votes.len();
            match count_both(self.store.as_ref(), &mut receipts, &mut votes, &mut tally).await {
                Ok(()) => {
                    tally.batches += 1;
                    break;
                }
                Err(e) if attempt == tries && self.stopping => {
                    tracing::warn!(error = %e, receipts = left, "receipts not counted at shutdown");
                    receipts.clear();
                    votes.clear();
                }
                Err(e) => {
                    tracing::warn!(error = %e, receipts = left, "could not count receipts; trying again");
                    tokio::time::sleep(self.config.retry_after).await;
                }
            }
        }
        report(self.metrics.as_ref(), &tally);
        self.total.merge(tally);
        // What is left was not counted: it goes with the next batch.
        batch.extend(receipts.into_iter().map(Heard::Receipt));
        batch.extend(votes.into_iter().map(Heard::Vote));
    }
}

/// Counts the receipts, then the votes, each in its own transaction, into
/// `tally`; what was counted is taken out of its list, so a retry after
/// the votes failed does not write the receipts again.
async fn count_both(
    store: &dyn Store,
    receipts: &mut Vec<Receipt>,
    votes: &mut Vec<Vote>,
    tally: &mut ReceiptTally,
) -> StoreResult<()> {
    if !receipts.is_empty() {
        tally.merge(store.count_receipts(receipts).await?);
        receipts.clear();
    }
    if !votes.is_empty() {
        tally.votes.merge(store.count_votes(votes).await?);
        votes.clear();
    }
    Ok(())
}

fn report(metrics: &dyn Metrics, tally: &ReceiptTally) {
    report_votes(metrics, &tally.votes);
    for ((account, kind), n) in &tally.counted {
        metrics.receipts_counted(account, kind.as_str(), *n);
    }
    if tally.repeated > 0 {
        metrics.receipts_uncounted("repeated", tally.repeated);
    }
    if tally.ignored > 0 {
        metrics.receipts_uncounted("ignored", tally.ignored);
    }
}

fn report_votes(metrics: &dyn Metrics, tally: &VoteTally) {
    for (account, n) in &tally.counted {
        metrics.votes_counted(account, *n);
    }
    if tally.repeated > 0 {
        metrics.votes_uncounted("repeated", tally.repeated);
    }
    for (why, n) in &tally.ignored {
        metrics.votes_uncounted(why.as_str(), *n);
    }
}

/// The kind of the event that reports a run's receipts once they settle.
pub const RUN_RECEIPTS: &str = "run_receipts";

/// The `run_receipts` event of `run`.
pub fn receipts_event(run: &Run, receipts: &RunReceipts, at: DateTime<Utc>) -> NewEvent {
    settled_event(
        run,
        RUN_RECEIPTS,
        at,
        "receipts",
        serde_json::json!(receipts),
    )
}

/// The kind of the event that reports a run's polls' answers once they
/// settle (with its receipts).
pub const RUN_POLL: &str = "run_poll";

/// The `run_poll` event of `run`: each poll's counts over all its groups.
pub fn poll_event(run: &Run, polls: &[PollResult], at: DateTime<Utc>) -> NewEvent {
    settled_event(run, RUN_POLL, at, "polls", serde_json::json!(polls))
}

/// An event of what came back for `run` once it settled: the run, its
/// status and groups, and `what` under `key`.
fn settled_event(
    run: &Run,
    kind: &'static str,
    at: DateTime<Utc>,
    key: &str,
    what: serde_json::Value,
) -> NewEvent {
    let mut data = serde_json::json!({
        "run_id": run.id.0,
        "reminder_id": run.reminder_id,
        "account_id": run.account_id.as_str(),
        "status": run.status.as_str(),
        "groups": run.counts.total(),
        "sent": run.counts.sent,
    });
    data[key] = what;
    NewEvent {
        at,
        kind,
        account_id: Some(run.account_id.clone()),
        run_id: Some(run.id),
        data,
    }
}

/// Reports the receipts of every run that ended `settle_after` ago or
/// more and was not reported yet: a `run_receipts` event for a run that
/// sent something, and a `run_poll` event for one that sent a poll
/// (stored, then broadcast on `events`), a mark alone for one that sent
/// nothing. Votes that come later still count in `GET /v1/runs/{id}/poll`. Any daemon may call it at any time: the store
/// reports a run once. Answers how many events it stored.
pub async fn report_settled(
    store: &dyn Store,
    events: &EventBus,
    clock: &dyn Clock,
    settle_after: Duration,
) -> StoreResult<usize> {
    let now = clock.now();
    let before = now - chrono::Duration::from_std(settle_after).unwrap_or(chrono::Duration::MAX);
    let mut reported = 0;
    loop {
        let due = store.unreported_runs(before, 100).await?;
        if due.is_empty() {
            return Ok(reported);
        }
        for id in due {
            let mut told = Vec::new();
            if let Some(run) = store.get_run(id).await?.filter(|r| r.counts.sent > 0) {
                let receipts = store.run_receipts(id).await?;
                told.push(receipts_event(&run, &receipts, now));
                let polls = store.run_polls(id).await?;
                if !polls.is_empty() {
                    told.push(poll_event(&run, &polls, now));
                }
            }
            let stored = store.report_receipts(id, now, &told).await?;
            reported += stored.len();
            for e in stored {
                events.published(Some(e));
            }
        }
    }
}

/// Reports settled runs every `every` until the task is dropped.
pub fn spawn_reporter(
    store: Arc<dyn Store>,
    events: EventBus,
    clock: Arc<dyn Clock>,
    settle_after: Duration,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Err(e) =
                report_settled(store.as_ref(), &events, clock.as_ref(), settle_after).await
            {
                tracing::warn!(error = %e, "could not report settled receipts; trying again");
            }
            tokio::time::sleep(every).await;
        }
    })
}
