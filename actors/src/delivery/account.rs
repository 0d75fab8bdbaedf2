//! The AccountActor: one per paired account. It owns the account's token
//! bucket, its serial run queue and its media-upload cache, so two runs of
//! one account never overlap and no lock is needed: everything below runs on
//! the actor's own thread.
//!
//! A run executes as a future spawned in the actor's context, so stop,
//! pause, resume, window-closed and snapshot messages are handled while it is
//! in flight. The run and the actor share small `Rc<RefCell<…>>` cells (the
//! bucket, the cache, the run's control flags); they live on one thread and
//! no borrow is held across an `.await`.

use crate::delivery::amend::AmendAsk;
use crate::delivery::bucket::TokenBucket;
use crate::delivery::engine::{Engine, Halt, RunControl};
use crate::delivery::outcome::StopReason;
use crate::delivery::run::{backoff, execute, RunEnd};
use crate::delivery::signals::Breaker;
use crate::domain::*;
use crate::lifecycle::RunEvent;
use crate::messages::{RunDue, WindowClosed};
use crate::ports::StoreError;
use actix::prelude::*;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

/// Errors of the control messages, mapped to HTTP codes by the control port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Store(String),
    /// This daemon no longer holds the account's lease: the run is
    /// another daemon's to control now, so nothing was written.
    #[error("{0}")]
    Moved(String),
    /// The request names a field it cannot have (an edit's text).
    #[error(transparent)]
    Invalid(ValidationError),
}

/// Stop a run: remaining targets are skipped, "stopped by operator".
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ControlError>")]
pub struct StopRun {
    pub run_id: RunId,
}

/// Pause a run: parts in flight finish, nothing new is sent until resumed.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ControlError>")]
pub struct PauseRun {
    pub run_id: RunId,
}

/// Resume a paused run (also one paused before a restart).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ControlError>")]
pub struct ResumeRun {
    pub run_id: RunId,
}

/// Send a finished run's unsent targets again: same run, same message ids,
/// queued ahead of newer runs.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<u32, ControlError>")]
pub struct RetryRun {
    pub run_id: RunId,
}

/// Recall or edit every message a run sent (a run still sending is
/// stopped first). Answers the amendment as stored; its execution follows
/// in the account's queue, ahead of runs waiting there.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Amendment, ControlError>")]
pub struct AmendRun {
    pub run_id: RunId,
    pub ask: AmendAsk,
}

/// An unfinished amendment of this account's (start-up, sweep, takeover):
/// carried forward unless already queued or under way.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct AmendDue {
    pub amendment_id: i64,
}

/// The account's row changed (limits, state): reload it.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct AccountChanged;

/// SIGTERM: start nothing new, let parts in flight finish, leave the run
/// resumable. Resolves when the actor is idle.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Drain;

/// A live view of the actor, answered even mid-run.
#[derive(Debug, Clone, Message)]
#[rtype(result = "AccountSnapshot")]
pub struct Snapshot;

/// Stops the actor for good, leaving its runs to the store: the
/// supervisor sends it once the account is out of its registry (released,
/// removed, or every actor terminated), so the stop is not taken for a
/// crash.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct StopActor;

/// Fault injection for supervision tests and chaos drills: stop or panic
/// the actor as a bug would, while it is still registered. Test machinery:
/// a release build does not carry it.
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct InjectFault {
    pub panic: bool,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub struct AccountSnapshot {
    pub account_id: AccountId,
    pub queue_depth: usize,
    pub queued: Vec<RunId>,
    pub current_run: Option<RunId>,
    pub paused: bool,
    pub per_minute: u32,
    pub tokens: f64,
    pub slowed: bool,
    pub halted: Option<String>,
    pub cached_uploads: usize,
    /// The recall or edit under way, by amendment id.
    pub amending: Option<i64>,
}

/// Tells the supervisor an account actor stopped, so it can restart it.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct AccountStopped {
    pub account_id: AccountId,
    pub generation: u64,
}

pub struct AccountActor {
    id: AccountId,
    generation: u64,
    engine: Arc<Engine>,
    on_stop: Option<Recipient<AccountStopped>>,
    queue: VecDeque<RunId>,
    current: Option<(RunId, Rc<RunControl>)>,
    /// Recalls and edits waiting, by amendment id: they go before runs.
    amends: VecDeque<i64>,
    amending: Option<(i64, Rc<RunControl>)>,
    bucket: Rc<RefCell<TokenBucket>>,
    /// The account's circuit breaker: survives its runs, so repeated
    /// signals escalate the cool-down.
    breaker: Rc<RefCell<Breaker>>,
    /// When the current ban or cool-down ends by itself: a timer of an
    /// earlier one (ended early by the operator) must not end a later one.
    resume_at: Option<chrono::DateTime<chrono::Utc>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
    /// Set when the account can no longer send (logged out, banned,
    /// disabled): queued runs wait until the account is usable again.
    halted: Option<String>,
    draining: bool,
    idle_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// After a store failure the queue waits this long before the next
    /// start (doubling while failures repeat).
    store_failures: u32,
    retry_at: Option<tokio::time::Instant>,
    /// The account was connected when last seen: a reconnect reads its
    /// standing again.
    connected: bool,
}

impl AccountActor {
    pub fn new(
        id: AccountId,
        generation: u64,
        engine: Arc<Engine>,
        on_stop: Option<Recipient<AccountStopped>>,
    ) -> Self {
        let per_minute = engine.config.max_per_minute;
        let now = tokio::time::Instant::now();
        // Empty at start: after a restart we under-send, never burst.
        let bucket = TokenBucket::new(per_minute, now).with_pacing(engine.pacing(&id), now);
        Self {
            id,
            generation,
            engine,
            on_stop,
            queue: VecDeque::new(),
            current: None,
            amends: VecDeque::new(),
            amending: None,
            bucket: Rc::new(RefCell::new(bucket)),
            breaker: Rc::new(RefCell::new(Breaker::default())),
            resume_at: None,
            uploads: Rc::new(RefCell::new(HashMap::new())),
            halted: None,
            draining: false,
            idle_waiters: Vec::new(),
            store_failures: 0,
            retry_at: None,
            connected: false,
        }
    }

    /// Reads the account's standing from WhatsApp (time-lock and new-chat
    /// quota) and keeps it; beside the runs, never in their way.
    fn refresh_standing(&self, ctx: &mut Context<Self>) {
        let engine = self.engine.clone();
        let id = self.id.clone();
        ctx.spawn(
            async move {
                let account = match engine.ports.store.get_account(&id).await {
                    Ok(Some(a)) => a,
                    _ => return,
                };
                let Some(gateway) = engine.ports.gateways.gateway(account.kind) else {
                    return;
                };
                crate::delivery::standing::refresh(
                    &engine,
                    gateway.as_ref(),
                    &id,
                    crate::delivery::standing::Parts::Both,
                )
                .await;
            }
            .into_actor(self),
        );
    }

    /// Queues a run unless this actor already carries it forward. A run
    /// whose execution is on its way out (paused, halted) is queued again,
    /// so a resume that lands while it leaves is not lost.
    fn enqueue(&mut self, run_id: RunId) {
        let carried = self
            .current
            .as_ref()
            .is_some_and(|(r, c)| *r == run_id && !c.is_leaving());
        if carried || self.queue.contains(&run_id) {
            return;
        }
        // Older runs first: a retried or resumed run goes ahead of newer ones.
        let at = self
            .queue
            .iter()
            .position(|r| *r > run_id)
            .unwrap_or(self.queue.len());
        self.queue.insert(at, run_id);
        self.report_queue();
    }

    fn report_queue(&self) {
        self.engine
            .ports
            .metrics
            .queue_depth(&self.id, self.queue.len());
    }

    /// Starts the next queued run if the account is free to send.
    fn start_next(&mut self, ctx: &mut Context<Self>) {
        if self.current.is_some() || self.amending.is_some() {
            return;
        }
        if self.halted.is_some() || self.draining {
            // Nothing more starts, so the account is idle: a Drain waiting
            // for the current run to end must hear about it now, not at the
            // end of the drain grace period.
            self.notify_idle();
            return;
        }
        if let Some(at) = self.retry_at {
            let now = tokio::time::Instant::now();
            if at > now {
                ctx.run_later(at - now, |act, ctx| act.start_next(ctx));
                return;
            }
            self.retry_at = None;
        }
        // A recall is the operator taking back a mistake: it goes first.
        if let Some(id) = self.amends.pop_front() {
            return self.start_amendment(id, ctx);
        }
        let Some(run_id) = self.queue.pop_front() else {
            self.notify_idle();
            return;
        };
        self.report_queue();
        let control = Rc::new(RunControl::default());
        self.current = Some((run_id, control.clone()));
        let fut = execute(
            self.engine.clone(),
            self.id.clone(),
            run_id,
            control,
            self.bucket.clone(),
            self.breaker.clone(),
            self.uploads.clone(),
        );
        ctx.spawn(fut.into_actor(self).map(move |end, act, ctx| {
            act.current = None;
            act.ended(run_id, end, ctx);
            act.start_next(ctx);
        }));
    }

    fn start_amendment(&mut self, id: i64, ctx: &mut Context<Self>) {
        let control = Rc::new(RunControl::default());
        self.amending = Some((id, control.clone()));
        let fut = crate::delivery::amend::execute(
            self.engine.clone(),
            self.id.clone(),
            id,
            control,
            self.bucket.clone(),
        );
        ctx.spawn(fut.into_actor(self).map(move |end, act, ctx| {
            act.amending = None;
            if let RunEnd::Requeue { .. } = &end {
                act.amends.retain(|a| *a != id);
                act.amends.push_front(id);
            }
            act.after_work(end, ctx);
            act.start_next(ctx);
        }));
    }

    /// Queues an amendment unless it is already queued or under way.
    fn enqueue_amendment(&mut self, id: i64) {
        let carried = self
            .amending
            .as_ref()
            .is_some_and(|(a, c)| *a == id && !c.is_leaving());
        if !carried && !self.amends.contains(&id) {
            self.amends.push_back(id);
        }
    }

    /// The controls of whatever the actor is executing.
    fn controls(&self) -> impl Iterator<Item = &Rc<RunControl>> {
        self.current
            .iter()
            .map(|(_, c)| c)
            .chain(self.amending.iter().map(|(_, c)| c))
    }

    /// What the actor does when a run's execution ends.
    fn ended(&mut self, run_id: RunId, end: RunEnd, ctx: &mut Context<Self>) {
        if let RunEnd::Requeue { .. } = &end {
            // The run stays this actor's: first in line when it can go on.
            self.queue.retain(|r| *r != run_id);
            self.queue.push_front(run_id);
            self.report_queue();
        }
        self.after_work(end, ctx);
    }

    /// A halt or a store back-off after a run's or an amendment's end.
    fn after_work(&mut self, end: RunEnd, ctx: &mut Context<Self>) {
        match end {
            RunEnd::Done | RunEnd::Left => self.store_failures = 0,
            RunEnd::Requeue { halt, why } => match halt {
                Some(h) => self.halt(h, ctx),
                None => {
                    self.store_failures += 1;
                    let wait = backoff(std::time::Duration::from_millis(500), self.store_failures)
                        .min(std::time::Duration::from_secs(60));
                    tracing::error!(account = %self.id, error = %why, retry_in_ms = wait.as_millis() as u64, "work interrupted (the store, or WhatsApp); it is tried again");
                    self.retry_at = Some(tokio::time::Instant::now() + wait);
                }
            },
        }
    }

    fn halt(&mut self, halt: Halt, ctx: &mut Context<Self>) {
        let Halt {
            state,
            reason,
            record,
            until,
        } = halt;
        tracing::warn!(account = %self.id, %state, %reason, "account halted: its queue waits until it can send");
        self.halted = Some(reason.clone());
        self.resume_at_end(until, ctx);
        if !record {
            return;
        }
        let engine = self.engine.clone();
        let id = self.id.clone();
        ctx.spawn(
            async move {
                // Its end is kept with it: a daemon that restarts or takes
                // the account over meanwhile resumes it on time too.
                if let Err(e) = engine
                    .events
                    .account_state(&*engine.ports.store, &id, state, Some(&reason), until)
                    .await
                {
                    tracing::error!(account = %id, error = %e, "could not record account state");
                }
            }
            .into_actor(self),
        );
    }

    /// Resumes the queue at `until`, when the halt ends by itself.
    fn resume_at_end(
        &mut self,
        until: Option<chrono::DateTime<chrono::Utc>>,
        ctx: &mut Context<Self>,
    ) {
        self.resume_at = until;
        if let Some(until) = until {
            let wait = (until - self.engine.ports.clock.now())
                .to_std()
                .unwrap_or_default();
            ctx.run_later(wait, move |act, ctx| {
                if act.resume_at == Some(until) {
                    act.ban_over(ctx);
                }
            });
        }
    }

    /// A temporary ban or a cool-down ended: the account is usable again
    /// unless someone changed its state meanwhile (the operator disabled
    /// it, or it was logged out).
    fn ban_over(&mut self, ctx: &mut Context<Self>) {
        self.resume_at = None;
        let engine = self.engine.clone();
        let id = self.id.clone();
        ctx.spawn(
            async move {
                let store = &engine.ports.store;
                let ended = match store.get_account(&id).await {
                    Ok(Some(a)) if a.state == AccountState::Banned => "temporary ban ended",
                    Ok(Some(a)) if a.state == AccountState::CoolingDown => "cool-down ended",
                    _ => return false,
                };
                // Stored with no reason, told with why it ended.
                let told = engine.events.event(
                    "account_state",
                    Some(&id),
                    None,
                    serde_json::json!({"state": AccountState::Connected, "reason": ended}),
                );
                match store
                    .change_account_state(&id, AccountState::Connected, None, None, &told)
                    .await
                {
                    Ok((_, stored)) => engine.events.published(Some(stored)),
                    Err(e) => {
                        tracing::error!(account = %id, error = %e, "could not end the ban; retrying at the next account change");
                        return false;
                    }
                }
                true
            }
            .into_actor(self)
            .map(|resumed, act, ctx| {
                if resumed {
                    tracing::info!(account = %act.id, "ban or cool-down ended: the account's queue resumes");
                    act.halted = None;
                    act.start_next(ctx);
                }
            }),
        );
    }

    fn notify_idle(&mut self) {
        for w in self.idle_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    fn control_of(&self, run_id: RunId) -> Option<Rc<RunControl>> {
        self.current
            .as_ref()
            .filter(|(r, _)| *r == run_id)
            .map(|(_, c)| c.clone())
    }

    /// Applies `event` to a run this actor is not executing: Conflict (with
    /// the run's actual status) if it is not in one of the event's statuses.
    fn apply_idle(
        &self,
        run_id: RunId,
        update: RunUpdate,
    ) -> impl std::future::Future<Output = Result<(), ControlError>> + 'static {
        let engine = self.engine.clone();
        let id = self.id.clone();
        // Under the lease: a daemon that lost the account must not accept
        // a stop (or pause) that the run's new owner would never read.
        async move {
            engine
                .update_owned_run(&id, run_id, &update)
                .await
                .map_err(control_error)
        }
    }
}

/// A run a control message names, or NotFound.
async fn load_run(store: &dyn crate::ports::Store, run_id: RunId) -> Result<Run, ControlError> {
    store
        .get_run(run_id)
        .await
        .map_err(control_error)?
        .ok_or_else(|| ControlError::NotFound(format!("run {run_id} not found")))
}

/// Cancels run `run_id`, which this actor is not executing (queued, paused,
/// parked, or not started): its groups are listed, each skipped, so a retry
/// can send them, and the run finishes `cancelled` under the lease.
async fn cancel_idle(
    engine: Arc<Engine>,
    id: AccountId,
    run_id: RunId,
) -> Result<(), ControlError> {
    let store = &engine.ports.store;
    let run = load_run(&**store, run_id).await?;
    if !RunEvent::Cancel.from().contains(&run.status) {
        return Err(ControlError::Conflict(format!(
            "run {run_id} is {}",
            run.status
        )));
    }
    // A run stopped before it started still lists its groups, each
    // skipped, so a retry can send them.
    if let Some(r) = store
        .get_reminder(run.reminder_id)
        .await
        .map_err(control_error)?
    {
        store
            .create_targets(run_id, &r.spec.targets)
            .await
            .map_err(control_error)?;
    }
    let now = engine.ports.clock.now();
    let counts = store
        .get_run(run_id)
        .await
        .map_err(control_error)?
        .map(|r| r.counts)
        .unwrap_or_default();
    let summary = format!(
        "Stopped by operator. {} of {} groups delivered.",
        counts.sent,
        counts.total()
    );
    let finished = engine.events.event(
        "run_finished",
        Some(&id),
        Some(run_id),
        serde_json::json!({"status": "cancelled", "summary": summary}),
    );
    let update = RunUpdate {
        event: Some(finished),
        ..RunEvent::Cancel.finish_update(now, Some(summary), "stopped by operator")
    };
    engine
        .update_owned_run(&id, run_id, &update)
        .await
        .map_err(control_error)?;
    if let Some(links) = engine.window.as_ref() {
        links
            .disarm
            .do_send(crate::messages::DisarmWindow { run_id });
    }
    Ok(())
}

/// Sends run `run_id`'s unsent (failed and skipped) targets again: the
/// run and those targets go back in one write; answers how many targets.
/// Refused for a run its reminder no longer describes, or one that was
/// recalled or edited.
async fn retry_unsent(
    engine: Arc<Engine>,
    id: AccountId,
    run_id: RunId,
) -> Result<u32, ControlError> {
    let store = engine.ports.store.clone();
    let run = load_run(&*store, run_id).await?;
    if !RunEvent::Retry.from().contains(&run.status) {
        return Err(ControlError::Conflict(format!(
            "run {run_id} is {}; only partial, failed or cancelled runs can be retried",
            run.status
        )));
    }
    // A run sends what its reminder said when it fired: after an
    // edit, the old content is gone, so the run cannot be retried.
    let changed = store
        .get_reminder(run.reminder_id)
        .await
        .map_err(control_error)?
        .is_none_or(|r| r.updated_at > run.created_at);
    if changed {
        return Err(ControlError::Conflict(format!(
                "run {run_id} cannot be retried: its reminder was changed or deleted after the run fired; fire the reminder again instead"
            )));
    }
    // What was taken back (or corrected) must not go out again as it was.
    if let Some(a) = store.run_amendment(run_id).await.map_err(control_error)? {
        return Err(ControlError::Conflict(format!(
                "run {run_id} cannot be retried: it was {} at {}, and a retry would send what was taken back; fire the reminder again instead",
                a.kind.done_word(),
                a.requested_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )));
    }
    let n = run.counts.failed + run.counts.skipped;
    if n == 0 {
        return Err(ControlError::Conflict(format!(
            "run {run_id} has no unsent targets"
        )));
    }
    // One write: the run and its unsent targets go back together,
    // or (a lost race, a store error) nothing changes.
    engine
        .update_owned_run(&id, run_id, &crate::lifecycle::retry_update())
        .await
        .map_err(control_error)?;
    Ok(n)
}

/// The control port's view of a store error.
fn control_error(e: StoreError) -> ControlError {
    match e {
        StoreError::NotFound(what) => ControlError::NotFound(format!("{what} not found")),
        StoreError::Conflict(why) => ControlError::Conflict(why),
        StoreError::Invalid(v) => ControlError::Invalid(v),
        StoreError::Fenced(why) => ControlError::Moved(format!(
            "{why}; the account is carried by another daemon now, retry there"
        )),
        e => ControlError::Store(e.to_string()),
    }
}

use crate::ports::RunUpdate;

impl Actor for AccountActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Runs of a busy account queue in the mailbox; a larger mailbox keeps
        // control messages from waiting behind a burst of RunDue.
        ctx.set_mailbox_capacity(256);
        // What WhatsApp says of the account: now, then on a schedule.
        self.refresh_standing(ctx);
        ctx.run_interval(self.engine.config.standing_every, |act, ctx| {
            act.refresh_standing(ctx)
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.notify_idle();
        if let Some(sup) = &self.on_stop {
            sup.do_send(AccountStopped {
                account_id: self.id.clone(),
                generation: self.generation,
            });
        }
    }
}

impl Handler<RunDue> for AccountActor {
    type Result = ();
    fn handle(&mut self, msg: RunDue, ctx: &mut Context<Self>) {
        self.enqueue(msg.run_id);
        self.start_next(ctx);
    }
}

impl Handler<WindowClosed> for AccountActor {
    type Result = ();
    fn handle(&mut self, msg: WindowClosed, _ctx: &mut Context<Self>) {
        if let Some(c) = self.control_of(msg.run_id) {
            c.stop(StopReason::WindowClosed(msg.close_at));
        }
        // A queued run whose window closed is handled when it starts: it
        // finds its window closed and skips (or parks) its targets.
    }
}

impl Handler<StopRun> for AccountActor {
    type Result = ResponseActFuture<Self, Result<(), ControlError>>;
    fn handle(&mut self, msg: StopRun, _ctx: &mut Context<Self>) -> Self::Result {
        let run_id = msg.run_id;
        if let Some(c) = self.control_of(run_id) {
            // Its groups skip what is left; the run finishes `cancelled`.
            c.stop(StopReason::Operator);
            // Answered once written: a run that restarts after a crash (or
            // a store failure) must still end cancelled, not send on.
            let update = RunUpdate {
                expect: crate::lifecycle::UNFINISHED.to_vec(),
                stop_requested_at: Some(self.engine.ports.clock.now()),
                ..Default::default()
            };
            return Box::pin(self.apply_idle(run_id, update).into_actor(self));
        }
        let was_queued = self.queue.contains(&run_id);
        self.queue.retain(|r| *r != run_id);
        self.report_queue();
        let fut = cancel_idle(self.engine.clone(), self.id.clone(), run_id);
        Box::pin(fut.into_actor(self).map(move |res, act, ctx| {
            if res.is_err() && was_queued {
                // Not ours to cancel after all (it started, or moved on): keep it.
                act.enqueue(run_id);
                act.start_next(ctx);
            }
            res
        }))
    }
}

impl Handler<PauseRun> for AccountActor {
    type Result = ResponseActFuture<Self, Result<(), ControlError>>;
    fn handle(&mut self, msg: PauseRun, _ctx: &mut Context<Self>) -> Self::Result {
        let run_id = msg.run_id;
        if let Some(c) = self.control_of(run_id) {
            if c.is_paused() {
                return Box::pin(fut::ready(Err(ControlError::Conflict(format!(
                    "run {run_id} is already paused"
                )))));
            }
            // Parts in flight finish; the run then leaves its targets as
            // they are and gives up its fire permit.
            c.pause();
        }
        let was_queued = self.queue.contains(&run_id);
        self.queue.retain(|r| *r != run_id);
        self.report_queue();
        let fut = self.apply_idle(run_id, RunEvent::Pause.update());
        Box::pin(fut.into_actor(self).map(move |res, act, ctx| {
            if res.is_err() && was_queued {
                act.enqueue(run_id);
                act.start_next(ctx);
            }
            res
        }))
    }
}

impl Handler<ResumeRun> for AccountActor {
    type Result = ResponseActFuture<Self, Result<(), ControlError>>;
    fn handle(&mut self, msg: ResumeRun, _ctx: &mut Context<Self>) -> Self::Result {
        let run_id = msg.run_id;
        let fut = self.apply_idle(run_id, RunEvent::Resume.update());
        Box::pin(fut.into_actor(self).map(move |res, act, ctx| {
            res?;
            act.enqueue(run_id);
            act.start_next(ctx);
            Ok(())
        }))
    }
}

impl Handler<RetryRun> for AccountActor {
    type Result = ResponseActFuture<Self, Result<u32, ControlError>>;
    fn handle(&mut self, msg: RetryRun, _ctx: &mut Context<Self>) -> Self::Result {
        let run_id = msg.run_id;
        let fut = retry_unsent(self.engine.clone(), self.id.clone(), run_id);
        Box::pin(fut.into_actor(self).map(move |res, act, ctx| {
            let n = res?;
            act.enqueue(run_id);
            act.start_next(ctx);
            Ok(n)
        }))
    }
}

impl Handler<AmendDue> for AccountActor {
    type Result = ();
    fn handle(&mut self, msg: AmendDue, ctx: &mut Context<Self>) {
        self.enqueue_amendment(msg.amendment_id);
        self.start_next(ctx);
    }
}

impl Handler<AmendRun> for AccountActor {
    type Result = ResponseActFuture<Self, Result<Amendment, ControlError>>;
    fn handle(&mut self, msg: AmendRun, ctx: &mut Context<Self>) -> Self::Result {
        let run_id = msg.run_id;
        // A run still under way is stopped first: its groups in flight
        // finish, the rest are skipped, and the amendment, queued behind
        // it in this actor, starts once it has ended.
        let stop = self.handle(StopRun { run_id }, ctx);
        let engine = self.engine.clone();
        let id = self.id.clone();
        Box::pin(stop.then(move |stopped, act, _ctx| {
            let fut = async move {
                match stopped {
                    // Ended already, or stopped now: either way it may go on.
                    Ok(()) | Err(ControlError::Conflict(_)) => {}
                    Err(e) => return Err(e),
                }
                let run = load_run(&*engine.ports.store, run_id).await?;
                crate::delivery::amend::request(&engine, &id, &run, &msg.ask)
                    .await
                    .map_err(control_error)
            };
            fut.into_actor(act).map(|res, act, ctx| {
                let a = res?;
                act.enqueue_amendment(a.id);
                act.start_next(ctx);
                Ok(a)
            })
        }))
    }
}

impl Handler<AccountChanged> for AccountActor {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _msg: AccountChanged, _ctx: &mut Context<Self>) -> Self::Result {
        let store = self.engine.ports.store.clone();
        let id = self.id.clone();
        Box::pin(
            async move { store.get_account(&id).await }
                .into_actor(self)
                .map(|res, act, ctx| {
                    let account = match res {
                        Ok(Some(account)) => account,
                        Ok(None) => return,
                        Err(e) => {
                            // A lower limit or a disable must not be lost to
                            // a busy database: read again shortly.
                            tracing::warn!(account = %act.id, error = %e, "could not reload the account; retrying");
                            ctx.notify_later(AccountChanged, std::time::Duration::from_millis(200));
                            return;
                        }
                    };
                    // A new limit applies to the run in flight at once; a
                    // lower one also to the minute already under way.
                    let per_minute = act.engine.per_minute(&account.limits);
                    act.bucket
                        .borrow_mut()
                        .set_per_minute(per_minute, tokio::time::Instant::now());
                    let connected = account.state == AccountState::Connected;
                    if connected && !act.connected {
                        // Logged in again: ask again what WhatsApp says.
                        act.refresh_standing(ctx);
                    }
                    act.connected = connected;
                    if connected {
                        act.halted = None;
                    } else {
                        // The queue's own timer ends the halt, not the run's.
                        let halt = Halt {
                            until: None,
                            ..Halt::of_account(&account)
                        };
                        act.halted = Some(halt.reason.clone());
                        // A ban or cool-down recorded elsewhere (another
                        // daemon, an earlier start) ends when it said.
                        if act.resume_at != account.state_until {
                            act.resume_at_end(account.state_until, ctx);
                        }
                        for c in act.controls() {
                            c.halt(halt.clone());
                        }
                    }
                    act.start_next(ctx);
                }),
        )
    }
}

impl Handler<Drain> for AccountActor {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, _msg: Drain, _ctx: &mut Context<Self>) -> Self::Result {
        self.draining = true;
        let busy: Vec<Rc<RunControl>> = self.controls().cloned().collect();
        if !busy.is_empty() {
            for c in busy {
                c.drain();
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.idle_waiters.push(tx);
            Box::pin(async move {
                let _ = rx.await;
            })
        } else {
            Box::pin(async {})
        }
    }
}

impl Handler<Snapshot> for AccountActor {
    type Result = MessageResult<Snapshot>;
    fn handle(&mut self, _msg: Snapshot, _ctx: &mut Context<Self>) -> Self::Result {
        let now = tokio::time::Instant::now();
        let mut bucket = self.bucket.borrow_mut();
        MessageResult(AccountSnapshot {
            account_id: self.id.clone(),
            queue_depth: self.queue.len(),
            queued: self.queue.iter().copied().collect(),
            current_run: self.current.as_ref().map(|(r, _)| *r),
            paused: self.current.as_ref().is_some_and(|(_, c)| c.is_paused()),
            per_minute: bucket.per_minute(),
            tokens: bucket.available(now),
            slowed: bucket.is_slowed(now),
            halted: self.halted.clone(),
            cached_uploads: self.uploads.borrow().len(),
            amending: self.amending.as_ref().map(|(a, _)| *a),
        })
    }
}

impl Handler<StopActor> for AccountActor {
    type Result = ();
    fn handle(&mut self, _msg: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

#[cfg(any(test, feature = "testkit"))]
impl Handler<InjectFault> for AccountActor {
    type Result = ();
    fn handle(&mut self, msg: InjectFault, ctx: &mut Context<Self>) {
        if msg.panic {
            panic!("injected fault in account actor {}", self.id);
        }
        ctx.stop();
    }
}
