//! The SchedulerActor: the timer loop that glues the state, the reloads and
//! the firing together, and the messages it answers.

use super::config::{SchedulerConfig, SchedulerPorts, FIRE_BATCH};
use super::due::Due;
use super::fire::{fire_each, fire_now, fire_queue_batch, FireNowError, FireNowOutcome};
use super::reconcile::{load_reconcile, load_reminder};
use super::state::{Action, Firing, SchedulerState};
use crate::domain::RunId;
use crate::messages::{ReminderChanged, RunDue};
use crate::ports::sleep_until;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use std::cell::RefCell;
use std::time::Duration;

/// Control port → SchedulerActor: fire a reminder now (to the second). If
/// now is inside its window the run is queued and dispatched at once,
/// otherwise it is created as `scheduled` and queued when the window opens.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<RunId, FireNowError>")]
pub struct FireNow {
    pub reminder_id: i64,
}

/// Tests and the control port: where is a reminder scheduled next?
#[derive(Debug, Clone, Message)]
#[rtype(result = "Option<Due>")]
pub struct NextDue {
    pub reminder_id: i64,
}

/// Daemon → SchedulerActor: stop firing (SIGTERM). Fires in flight are
/// dropped mid-way, which is safe: every step is idempotent and the next
/// start recomputes from the store.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Shutdown;

/// Turns reminders into runs; see the module docs.
pub struct SchedulerActor {
    ports: SchedulerPorts,
    dispatch: Recipient<RunDue>,
    state: SchedulerState,
    timer: Option<(SpawnHandle, DateTime<Utc>)>,
    load_seq: u64,
    reconciling: bool,
}

impl SchedulerActor {
    /// `dispatch` receives `RunDue` for every queued run (the supervisor).
    pub fn new(
        ports: SchedulerPorts,
        dispatch: Recipient<RunDue>,
        config: SchedulerConfig,
    ) -> Self {
        Self {
            ports,
            dispatch,
            state: SchedulerState::new(config),
            timer: None,
            load_seq: 0,
            reconciling: false,
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.load_seq += 1;
        self.load_seq
    }

    /// Keeps exactly one timer, for the earliest due time.
    fn arm(&mut self, ctx: &mut Context<Self>) {
        let next = self.state.next_wake();
        if let Some((handle, at)) = self.timer {
            if Some(at) == next {
                return;
            }
            ctx.cancel_future(handle);
            self.timer = None;
        }
        let Some(at) = next else { return };
        let clock = self.ports.clock.clone();
        let handle = ctx.spawn(
            async move { sleep_until(&*clock, at).await }
                .into_actor(self)
                .map(|_, act, ctx| {
                    act.timer = None;
                    act.wake(ctx);
                }),
        );
        self.timer = Some((handle, at));
    }

    fn wake(&mut self, ctx: &mut Context<Self>) {
        let now = self.ports.clock.now();
        let firings = self.state.due_now(now);
        if !firings.is_empty() {
            let ports = self.ports.clone();
            let dispatch = self.dispatch.clone();
            // Plain fires are queued in batches, a burst of thousands due
            // at one instant in a few transactions; the rest (missed,
            // released) one by one, alongside.
            let (queue, other): (Vec<Firing>, Vec<Firing>) =
                firings.into_iter().partition(|f| f.action == Action::Queue);
            ctx.spawn(
                async move {
                    let failed = RefCell::new(Vec::new());
                    let batched = async {
                        for batch in queue.chunks(FIRE_BATCH) {
                            fire_queue_batch(&ports, &dispatch, batch, now, &failed).await;
                        }
                    };
                    futures_util::join!(
                        batched,
                        fire_each(&ports, &dispatch, &other, now, &failed)
                    );
                    failed.into_inner()
                }
                .into_actor(self)
                .map(|failed, act, _| {
                    for id in failed {
                        act.state.mark_dirty(id);
                    }
                }),
            );
        }
        self.arm(ctx);
    }

    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.reconciling {
            return;
        }
        self.reconciling = true;
        let seq = self.next_seq();
        let store = self.ports.store.clone();
        let scan = self.state.next_scan();
        let clean = self.state.clean();
        let dirty = self.state.dirty();
        let known = self.state.deferred_ids();
        ctx.spawn(
            async move { load_reconcile(&*store, scan, &clean, &dirty, &known).await }
                .into_actor(self)
                .map(move |res, act, ctx| {
                    act.reconciling = false;
                    match res {
                        Ok(rec) => act.state.apply_reconcile(rec, seq),
                        Err(e) => tracing::error!(error = %e, "scheduler reconcile failed"),
                    }
                    act.wake(ctx);
                }),
        );
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.reconcile(ctx);
        // A zero period would spin (and tokio refuses it).
        let every = self
            .state
            .config()
            .reconcile_every
            .max(Duration::from_secs(1));
        ctx.run_interval(every, |act, ctx| act.reconcile(ctx));
    }
}

impl Handler<ReminderChanged> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: ReminderChanged, ctx: &mut Self::Context) {
        let seq = self.next_seq();
        let store = self.ports.store.clone();
        let id = msg.reminder_id;
        ctx.spawn(
            async move { load_reminder(&*store, id).await }
                .into_actor(self)
                .map(move |res, act, ctx| {
                    match res {
                        Ok(Some(snap)) => act.state.apply(snap, seq),
                        Ok(None) => act.state.remove(id, seq),
                        Err(e) => {
                            tracing::error!(error = %e, reminder_id = id, "could not reload reminder; the next reconcile will");
                            act.state.mark_dirty(id);
                        }
                    }
                    act.wake(ctx);
                }),
        );
    }
}

impl Handler<FireNow> for SchedulerActor {
    type Result = ResponseActFuture<Self, Result<RunId, FireNowError>>;

    fn handle(&mut self, msg: FireNow, _ctx: &mut Self::Context) -> Self::Result {
        let ports = self.ports.clone();
        let dispatch = self.dispatch.clone();
        let now = ports.clock.now();
        Box::pin(
            async move { fire_now(&ports, &dispatch, msg.reminder_id, now).await }
                .into_actor(self)
                .map(|res, act, ctx| {
                    let outcome = res?;
                    let run_id = outcome.run_id();
                    if let FireNowOutcome::Deferred(d) = outcome {
                        act.state.defer(d);
                        act.arm(ctx);
                    }
                    Ok(run_id)
                }),
        )
    }
}

impl Handler<Shutdown> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<NextDue> for SchedulerActor {
    type Result = Option<Due>;

    fn handle(&mut self, msg: NextDue, _ctx: &mut Self::Context) -> Option<Due> {
        self.state.next_of(msg.reminder_id)
    }
}
