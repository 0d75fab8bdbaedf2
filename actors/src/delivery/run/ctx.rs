//! The state one run's execution shares between its groups in flight
//! ([`RunCtx`]), how an execution ends ([`RunEnd`]), and the small acts every
//! step uses: marking a target, counting progress, owning the account.

use crate::delivery::bucket::TokenBucket;
use crate::delivery::caps::{CapPolicy, SendLedger};
use crate::delivery::engine::{Engine, Halt, RunControl};
use crate::delivery::outcome::delivered_line;
use crate::delivery::signals::{AccountSignal, Breaker};
use crate::delivery::variation::RunTexts;
use crate::domain::*;
use crate::ports::{Gateway, GatewayError, StoreError};
use chrono::{DateTime, Utc};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// A slow run (human pacing, a long list) still tells its progress at
/// least this often while it sends, however far 5 % is.
pub const PROGRESS_HEARTBEAT: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// How a run's execution ended, for the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Finished, parked, or no longer this actor's to run (paused,
    /// stopped or finished by someone else).
    Done,
    /// Paused or drained mid-run: its targets stay as they are and the
    /// status says what happens next.
    Left,
    /// Back to the front of the account's queue: the account cannot send
    /// (`halt`), or the store failed and the run is tried again shortly.
    Requeue { halt: Option<Halt>, why: String },
}

impl From<StoreError> for RunEnd {
    fn from(e: StoreError) -> Self {
        match e {
            // Another daemon owns the account now: leave the run to it.
            StoreError::Fenced(_) => RunEnd::Left,
            e => RunEnd::Requeue {
                halt: None,
                why: e.to_string(),
            },
        }
    }
}

/// One group's failed tries of its current part, by kind: each kind has
/// its own allowance, and a sent part starts them over.
#[derive(Debug, Default)]
pub(super) struct Tries {
    /// Transient failures (and 463/479 below the breaker).
    pub(super) attempts: u32,
    /// Rate-limit answers.
    pub(super) limited: u32,
    /// Sends that found WhatsApp unreachable.
    pub(super) outage: u32,
}

impl Tries {
    pub(super) fn is_fresh(&self) -> bool {
        self.attempts == 0 && self.limited == 0 && self.outage == 0
    }
}

/// What [`RunCtx::after_failure`] decided for the group.
pub(super) enum After {
    /// Try the part again (the gate decides whether the group goes on).
    Retry,
    /// The group's target is failed; the group is done.
    Done,
}

/// Everything a group's delivery needs, shared by the groups in flight.
pub struct RunCtx {
    pub(super) engine: Arc<Engine>,
    pub(super) account: AccountId,
    pub(super) run: Run,
    pub(super) gateway: Arc<dyn Gateway>,
    pub(super) control: Rc<RunControl>,
    pub(super) bucket: Rc<RefCell<TokenBucket>>,
    pub(super) breaker: Rc<RefCell<Breaker>>,
    pub(super) uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
    pub(super) spec: NewReminder,
    /// The run's renderings of its templates.
    pub(super) texts: RunTexts,
    /// The account's daily, hourly and warm-up caps (`None`: unlimited)
    /// and its sends of the last day, counted as they go.
    pub(super) caps: Option<CapPolicy>,
    pub(super) ledger: RefCell<SendLedger>,
    pub(super) media_mime: HashMap<MediaId, String>,
    pub(super) window_end: DateTime<Utc>,
    pub(super) concurrency: usize,
    pub(super) open: RefCell<Vec<RunTarget>>,
    /// Set when a mark could not be stored.
    pub(super) store_error: RefCell<Option<String>>,
    pub(super) remaining: Cell<usize>,
    /// The lease epoch this run first acted under (several daemons): it
    /// acts under no other, so an actor left over from a lease this daemon
    /// lost and took again never sends beside the new one.
    pub(super) epoch: Cell<Option<i64>>,
    /// `run_progress` is told every this many groups (5 %), and at the
    /// latest [`PROGRESS_HEARTBEAT`] after the last time it was told.
    pub(super) progress_every: usize,
    pub(super) progress_told_at: Cell<DateTime<Utc>>,
    pub(super) counts: RefCell<TargetCounts>,
    /// The fire-concurrency permit, released when the execution ends (a
    /// paused run leaves, so it never holds one).
    pub(super) _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// What a group's delivery stopped on.
pub(super) enum Gate {
    Go,
    /// Skip the rest of this group with this reason.
    Skip(String),
    /// Leave the group as it is (pause, drain, halt, park, store error):
    /// it resumes later.
    Leave,
}

impl RunCtx {
    pub(super) fn metrics(&self) -> &dyn crate::ports::Metrics {
        &*self.engine.ports.metrics
    }

    pub(super) fn run_id(&self) -> RunId {
        self.run.id
    }

    pub(super) fn halt_with(&self, e: &GatewayError) {
        self.control.halt(Halt::from_gateway(e));
    }

    /// The text (or caption) `target` gets for `part`.
    pub(super) fn render(&self, target: &RunTarget, part: u32) -> Option<String> {
        self.texts
            .text(&self.spec, target.position, &target.group, part)
    }

    pub(super) fn record(&self, status: TargetStatus) {
        let mut counts = self.counts.borrow_mut();
        counts.pending = counts.pending.saturating_sub(1);
        counts.add(status, 1);
        drop(counts);
        let left = self.remaining.get().saturating_sub(1);
        self.remaining.set(left);
        self.metrics().targets_remaining(&self.account, left);
        let done = self.counts.borrow().total() as usize - left;
        let now = self.engine.ports.clock.now();
        let quiet_for = now - self.progress_told_at.get();
        if left == 0 || done.is_multiple_of(self.progress_every) || quiet_for >= PROGRESS_HEARTBEAT
        {
            self.progress_told_at.set(now);
            let counts = *self.counts.borrow();
            let engine = self.engine.clone();
            let (account, run) = (self.account.clone(), self.run_id());
            // Progress is informational: emitted without holding up the sends.
            actix_rt::spawn(async move {
                engine
                    .events
                    .emit(
                        "run_progress",
                        Some(&account),
                        Some(run),
                        serde_json::json!({"delivered": delivered_line(&counts), "counts": counts}),
                    )
                    .await;
            });
        }
    }

    pub(super) fn skip(&self, target: &RunTarget, mut reason: String, unconfirmed: bool) {
        if unconfirmed {
            reason.push_str(crate::lifecycle::MAYBE_DELIVERED);
        }
        self.post_mark(Transition::Skipped {
            target_id: target.id,
            reason,
        });
        self.record(TargetStatus::Skipped);
    }

    /// The fence to write and send under: the account's lease, as long as
    /// it is the one this run started acting under.
    pub(super) fn owned(&self) -> Result<Option<crate::domain::Fence>, crate::domain::LeaseLost> {
        self.engine.pinned_fence(&self.account, &self.epoch)
    }

    /// Posts a mark under the account's lease; with the lease lost it is
    /// not posted: the new owner sends the group again under the same
    /// message id, and the gateway does not deliver it twice.
    pub(super) fn post_mark(&self, t: Transition) {
        match self.owned() {
            Ok(fence) => self.engine.writer.post_fenced(t, fence),
            Err(_) => tracing::debug!(account = %self.account, "mark not posted: lease lost"),
        }
    }

    /// Another daemon owns the account now (or may, any moment): stop
    /// acting for it at once. The run leaves its targets as they are, like
    /// a drain, and the new owner carries it on.
    pub(super) fn lose_lease(&self, why: &str) {
        // Once per run, not once per group in flight.
        if !self.control.is_draining() {
            tracing::warn!(account = %self.account, run = %self.run_id(), %why, "account lease lost: leaving the run to its new owner");
        }
        self.control.drain();
    }

    pub(super) fn fail(&self, target: &RunTarget, e: &GatewayError, reason: &'static str) {
        self.metrics().send_failed(&self.account, reason);
        self.post_mark(Transition::Failed {
            target_id: target.id,
            error: e.to_string(),
        });
        self.record(TargetStatus::Failed);
    }

    /// Counts an account-level signal.
    pub(super) fn signal(&self, signal: AccountSignal) {
        self.metrics().account_signal(&self.account, signal.label());
    }

    /// Records an incident on the account: its warm-up starts over.
    pub(super) async fn incident(&self) {
        let now = self.engine.ports.clock.now();
        if let Err(e) = self
            .engine
            .ports
            .store
            .record_incident(&self.account, now)
            .await
        {
            tracing::warn!(account = %self.account, error = %e, "could not record the incident");
        }
    }
}
