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

use crate::bucket::TokenBucket;
use crate::domain::*;
use crate::engine::{Engine, RunControl};
use crate::messages::{RunDue, WindowClosed};
use crate::outcome::StopReason;
use crate::run::{execute, RunEnd};
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

/// Fault injection for supervision tests and chaos drills: stop or panic
/// the actor as a bug would.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct InjectFault {
    pub panic: bool,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
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
    bucket: Rc<RefCell<TokenBucket>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
    /// Set when the account can no longer send (logged out, banned,
    /// disabled): queued runs wait until the account is usable again.
    halted: Option<String>,
    draining: bool,
    idle_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl AccountActor {
    pub fn new(
        id: AccountId,
        generation: u64,
        engine: Arc<Engine>,
        on_stop: Option<Recipient<AccountStopped>>,
    ) -> Self {
        let per_minute = engine.config.max_per_minute;
        Self {
            id,
            generation,
            engine,
            on_stop,
            queue: VecDeque::new(),
            current: None,
            // Empty at start: after a restart we under-send, never burst.
            bucket: Rc::new(RefCell::new(TokenBucket::new(
                per_minute,
                tokio::time::Instant::now(),
            ))),
            uploads: Rc::new(RefCell::new(HashMap::new())),
            halted: None,
            draining: false,
            idle_waiters: Vec::new(),
        }
    }

    fn enqueue(&mut self, run_id: RunId) {
        let busy = self.current.as_ref().is_some_and(|(r, _)| *r == run_id);
        if busy || self.queue.contains(&run_id) {
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
        if self.current.is_some() {
            return;
        }
        if self.halted.is_some() || self.draining {
            // Nothing more starts, so the account is idle: a Drain waiting
            // for the current run to end must hear about it now, not at the
            // end of the drain grace period.
            self.notify_idle();
            return;
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
            self.uploads.clone(),
        );
        ctx.spawn(fut.into_actor(self).map(move |end, act, ctx| {
            act.current = None;
            match end {
                RunEnd::Done | RunEnd::Drained => {}
                RunEnd::Halted { state, reason } => act.halt(state, reason, ctx),
                RunEnd::Error(e) => {
                    tracing::error!(account = %act.id, run = %run_id, error = %e, "run aborted; it stays resumable");
                }
            }
            act.start_next(ctx);
        }));
    }

    fn halt(&mut self, state: AccountState, reason: String, ctx: &mut Context<Self>) {
        tracing::warn!(account = %self.id, %state, %reason, "account halted: its queue stops");
        self.halted = Some(reason.clone());
        let engine = self.engine.clone();
        let id = self.id.clone();
        ctx.spawn(
            async move {
                if let Err(e) = engine
                    .ports
                    .store
                    .set_account_state(&id, state, Some(&reason))
                    .await
                {
                    tracing::error!(account = %id, error = %e, "could not record account state");
                }
                engine
                    .events
                    .emit(
                        "account_state",
                        Some(&id),
                        None,
                        serde_json::json!({"state": state, "reason": reason}),
                    )
                    .await;
            }
            .into_actor(self),
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

    /// Applies a status change to a run that is not executing here.
    fn update_idle_run(
        &self,
        run_id: RunId,
        expect: &'static [RunStatus],
        update: RunUpdate,
    ) -> impl std::future::Future<Output = Result<Run, ControlError>> + 'static {
        let store = self.engine.ports.store.clone();
        async move {
            let run = store
                .get_run(run_id)
                .await
                .map_err(|e| ControlError::Store(e.to_string()))?
                .ok_or_else(|| ControlError::NotFound(format!("run {run_id} not found")))?;
            if !expect.contains(&run.status) {
                return Err(ControlError::Conflict(format!(
                    "run {run_id} is {}; this needs one of: {}",
                    run.status,
                    expect
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            store
                .update_run(run_id, &update)
                .await
                .map_err(|e| ControlError::Store(e.to_string()))?;
            Ok(run)
        }
    }
}

use crate::ports::RunUpdate;

impl Actor for AccountActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Runs of a busy account queue in the mailbox; a larger mailbox keeps
        // control messages from waiting behind a burst of RunDue.
        ctx.set_mailbox_capacity(256);
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
    type Result = ResponseFuture<Result<(), ControlError>>;
    fn handle(&mut self, msg: StopRun, _ctx: &mut Context<Self>) -> Self::Result {
        if let Some(c) = self.control_of(msg.run_id) {
            c.stop(StopReason::Operator);
            return Box::pin(async { Ok(()) });
        }
        self.queue.retain(|r| *r != msg.run_id);
        self.report_queue();
        let now = self.engine.ports.clock.now();
        let update = RunUpdate {
            status: Some(RunStatus::Cancelled),
            finished_at: Some(now),
            error_summary: Some("Stopped by operator before it started.".into()),
            ..Default::default()
        };
        let fut = self.update_idle_run(
            msg.run_id,
            &[RunStatus::Scheduled, RunStatus::Queued, RunStatus::Paused],
            update,
        );
        let engine = self.engine.clone();
        let id = self.id.clone();
        Box::pin(async move {
            fut.await?;
            engine
                .events
                .emit(
                    "run_finished",
                    Some(&id),
                    Some(msg.run_id),
                    serde_json::json!({"status": "cancelled"}),
                )
                .await;
            Ok(())
        })
    }
}

impl Handler<PauseRun> for AccountActor {
    type Result = ResponseFuture<Result<(), ControlError>>;
    fn handle(&mut self, msg: PauseRun, _ctx: &mut Context<Self>) -> Self::Result {
        if let Some(c) = self.control_of(msg.run_id) {
            if c.is_paused() {
                return Box::pin(async move {
                    Err(ControlError::Conflict(format!(
                        "run {} is already paused",
                        msg.run_id
                    )))
                });
            }
            c.set_paused(true);
            let store = self.engine.ports.store.clone();
            return Box::pin(async move {
                store
                    .update_run(
                        msg.run_id,
                        &RunUpdate {
                            status: Some(RunStatus::Paused),
                            ..Default::default()
                        },
                    )
                    .await
                    .map_err(|e| ControlError::Store(e.to_string()))
            });
        }
        self.queue.retain(|r| *r != msg.run_id);
        self.report_queue();
        let fut = self.update_idle_run(
            msg.run_id,
            &[RunStatus::Queued],
            RunUpdate {
                status: Some(RunStatus::Paused),
                ..Default::default()
            },
        );
        Box::pin(async move { fut.await.map(|_| ()) })
    }
}

impl Handler<ResumeRun> for AccountActor {
    type Result = ResponseActFuture<Self, Result<(), ControlError>>;
    fn handle(&mut self, msg: ResumeRun, _ctx: &mut Context<Self>) -> Self::Result {
        if let Some(c) = self.control_of(msg.run_id) {
            if !c.is_paused() {
                return Box::pin(fut::ready(Err(ControlError::Conflict(format!(
                    "run {} is not paused",
                    msg.run_id
                )))));
            }
            c.set_paused(false);
            let store = self.engine.ports.store.clone();
            return Box::pin(
                async move {
                    store
                        .update_run(
                            msg.run_id,
                            &RunUpdate {
                                status: Some(RunStatus::Running),
                                ..Default::default()
                            },
                        )
                        .await
                        .map_err(|e| ControlError::Store(e.to_string()))
                }
                .into_actor(self),
            );
        }
        let fut = self.update_idle_run(
            msg.run_id,
            &[RunStatus::Paused],
            RunUpdate {
                status: Some(RunStatus::Queued),
                ..Default::default()
            },
        );
        Box::pin(fut.into_actor(self).map(move |res, act, ctx| {
            res?;
            act.enqueue(msg.run_id);
            act.start_next(ctx);
            Ok(())
        }))
    }
}

impl Handler<RetryRun> for AccountActor {
    type Result = ResponseActFuture<Self, Result<u32, ControlError>>;
    fn handle(&mut self, msg: RetryRun, _ctx: &mut Context<Self>) -> Self::Result {
        if self.control_of(msg.run_id).is_some() || self.queue.contains(&msg.run_id) {
            return Box::pin(fut::ready(Err(ControlError::Conflict(format!(
                "run {} is still in progress",
                msg.run_id
            )))));
        }
        let store = self.engine.ports.store.clone();
        let run_id = msg.run_id;
        let fut = async move {
            let err = |e: crate::ports::StoreError| ControlError::Store(e.to_string());
            let run = store
                .get_run(run_id)
                .await
                .map_err(err)?
                .ok_or_else(|| ControlError::NotFound(format!("run {run_id} not found")))?;
            if !matches!(
                run.status,
                RunStatus::Partial | RunStatus::Failed | RunStatus::Cancelled
            ) {
                return Err(ControlError::Conflict(format!(
                    "run {run_id} is {}; only partial, failed or cancelled runs can be retried",
                    run.status
                )));
            }
            let mut requeue = Vec::new();
            for status in [TargetStatus::Failed, TargetStatus::Skipped] {
                let ts = store
                    .list_targets(run_id, Some(status), None, u32::MAX)
                    .await
                    .map_err(err)?;
                requeue.extend(
                    ts.into_iter()
                        .map(|t| Transition::Requeue { target_id: t.id }),
                );
            }
            let n = requeue.len() as u32;
            if n == 0 {
                return Err(ControlError::Conflict(format!(
                    "run {run_id} has no unsent targets"
                )));
            }
            store.apply_transitions(&requeue).await.map_err(err)?;
            store
                .update_run(
                    run_id,
                    &RunUpdate {
                        status: Some(RunStatus::Queued),
                        ..Default::default()
                    },
                )
                .await
                .map_err(err)?;
            Ok(n)
        };
        Box::pin(fut.into_actor(self).map(move |res, act, ctx| {
            let n = res?;
            act.enqueue(run_id);
            act.start_next(ctx);
            Ok(n)
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
                    if let Ok(Some(account)) = res {
                        if account.state == AccountState::Connected {
                            act.halted = None;
                        } else {
                            act.halted = Some(format!("account is {}", account.state));
                        }
                        act.start_next(ctx);
                    }
                }),
        )
    }
}

impl Handler<Drain> for AccountActor {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, _msg: Drain, _ctx: &mut Context<Self>) -> Self::Result {
        self.draining = true;
        if let Some((_, c)) = &self.current {
            c.drain();
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
        })
    }
}

impl Handler<InjectFault> for AccountActor {
    type Result = ();
    fn handle(&mut self, msg: InjectFault, ctx: &mut Context<Self>) {
        if msg.panic {
            panic!("injected fault in account actor {}", self.id);
        }
        ctx.stop();
    }
}
