//! Receipts under chaos: the simulated groups send receipts for every
//! message WhatsApp accepts, the counter counts them while the store
//! refuses batches now and then, and the checker holds the counts to
//! their promises: never more than a group's other members, never a
//! reader who was not reached, and every group sent to counted whole.

use crate::delivery::receipts::{spawn, CounterConfig, CounterHandle};
use crate::domain::SeededRng;
use crate::domain::*;
use crate::memstore::MemoryStore;
use crate::ports::*;
use crate::simulator::{sim_participants, SimReceipts};
use rand::{RngExt, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The seed's receipts: their plan, own random stream (so the rest of the
/// seed replays as it did before receipts), the sink the simulator offers
/// to and the counter.
pub(super) struct Receipts {
    pub(super) plan: SimReceipts,
    rng: SeededRng,
    pub(super) sink: ReceiptSink,
    inbox: Option<mpsc::Receiver<Heard>>,
    counter: Option<CounterHandle>,
    /// What the counter did, once it finished.
    pub(super) tally: ReceiptTally,
}

impl Receipts {
    pub(super) fn new(seed: u64) -> Self {
        let mut rng = SeededRng::seed_from_u64(seed ^ 0x5ece_1975);
        let plan = SimReceipts {
            read_share: rng.random_range(0.0..=1.0),
            read_after: Duration::from_secs(rng.random_range(1..900)),
            // Some seeds hear receipts twice, as after a server's replay.
            repeat_every: [0, 1, 3, 17][rng.random_range(0..4)],
        };
        let (sink, inbox) = ReceiptSink::channel(RECEIPT_BACKLOG);
        Self {
            plan,
            rng,
            sink,
            inbox: Some(inbox),
            counter: None,
            tally: ReceiptTally::default(),
        }
    }

    /// Starts counting into `mem`.
    pub(super) fn start(&mut self, mem: Arc<MemoryStore>) {
        if let Some(inbox) = self.inbox.take() {
            self.counter = Some(spawn(
                inbox,
                mem,
                Arc::new(NoMetrics),
                CounterConfig::default(),
            ));
        }
    }

    /// Participants counted (reached and read) once the counter finished.
    pub(super) fn counted(&self) -> u64 {
        self.tally.counted.values().sum()
    }

    /// Poll votes that changed a voter's choice once the counter finished.
    pub(super) fn votes_counted(&self) -> u64 {
        self.tally.votes.counted_total()
    }

    /// Receipts that counted nothing: repeats, and those of a group's
    /// earlier part once its next one was on its way.
    pub(super) fn uncounted(&self) -> u64 {
        self.tally.repeated + self.tally.ignored
    }

    /// Now and then the store refuses the counter's next batches.
    pub(super) fn maybe_fault(&mut self, mem: &MemoryStore) {
        if self.rng.random_bool(0.02) {
            mem.fail_next_receipt_counts(self.rng.random_range(1..4));
        }
    }
}

impl Receipts {
    /// Once everything settled: waits for the last readers, counts what
    /// is waiting, then checks every group of every run; answers what it
    /// found broken.
    pub(super) async fn check(&mut self, mem: &MemoryStore) -> Vec<String> {
        let mut broken = Vec::new();
        tokio::time::sleep(self.plan.read_after + Duration::from_secs(5)).await;
        if let Some(counter) = self.counter.take() {
            self.tally = counter.finish().await;
        }
        if self.sink.dropped() > 0 {
            broken.push(format!(
                "{} receipts dropped by a backlogged counter",
                self.sink.dropped()
            ));
        }
        let share = self.plan.read_share;
        let runs = mem
            .list_runs(&RunFilter::default())
            .await
            .unwrap_or_default();
        for run in &runs {
            let targets = mem
                .list_targets(run.id, None, None, 0)
                .await
                .unwrap_or_default();
            for t in &targets {
                let others = sim_participants(&t.group) - 1;
                let readers = (f64::from(others) * share).ceil() as u32;
                let c = t.receipts;
                if c.delivered > others || c.read > c.delivered {
                    broken.push(format!(
                        "run {} group {} counts {} reached and {} readers of {others} others",
                        run.id, t.group, c.delivered, c.read
                    ));
                }
                // Its last part was accepted, and that part's receipts name
                // the message the group has now: all of them count.
                if t.status == TargetStatus::Sent && (c.delivered, c.read) != (others, readers) {
                    broken.push(format!(
                        "run {} group {} sent, counts {} reached and {} readers, not {others} and {readers}",
                        run.id, t.group, c.delivered, c.read
                    ));
                }
            }
        }
        broken
    }
}
