//! The WindowActor: one timer per active run's window end, and one per
//! parked run's next opening.
//!
//! - [`ArmWindow`] sets (or replaces) a run's close timer; at the close it
//!   sends [`WindowClosed`] to the supervisor, which stops the run.
//! - [`DisarmWindow`] cancels it (the run finished early, or was parked).
//! - [`ParkRun`] (resume_next_window) sends [`RunDue`] at the next opening
//!   so the remainder resumes; `DisarmWindow` does not cancel a park, since
//!   a parking run disarms its close timer and parks in the same breath.
//!
//! Timers survive restarts: on start the actor re-arms from the store —
//! a close timer for every unfinished run whose `window_end_at` is still
//! ahead, and a resume timer for every parked run (below). A parked run
//! whose next opening passed while the daemon was down resumes at once; a
//! close that passed is left to the run loop, which checks its window when
//! the run is handed back.
//!
//! A parked run has status `parked` and is held to its next window: its
//! `window_end_at` is that window's close, so the window's opening is the
//! resume time. The supervisor's sweep hands back a parked run whose
//! opening passed without its timer firing.

use crate::domain::{ReminderState, RunId, RunStatus};
use crate::messages::{ArmWindow, DisarmWindow, ParkRun, RunDue, WindowClosed};
use crate::ports::{sleep_until, Store, StoreResult};
use crate::scheduling::scheduler::SchedulerPorts;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use serde_json::json;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

/// The WindowActor's ports: the same bundle as the scheduler's.
pub type WindowPorts = SchedulerPorts;

/// Tests: the timers currently armed.
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Clone, Message)]
#[rtype(result = "WindowTimers")]
pub struct GetWindowTimers;

/// What [`GetWindowTimers`] answers, each list ordered by run id.
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowTimers {
    /// Close timers: run and close instant.
    pub closes: Vec<(RunId, DateTime<Utc>)>,
    /// Parked runs: run and resume instant.
    pub parks: Vec<(RunId, DateTime<Utc>)>,
}

struct Timer {
    handle: SpawnHandle,
    /// When it fires: read only by `GetWindowTimers`, test machinery.
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    at: DateTime<Utc>,
    generation: u64,
}

/// What the start-up load found.
#[derive(Debug, Default)]
pub struct Rearm {
    pub closes: Vec<ArmWindow>,
    pub parks: Vec<ParkRun>,
}

/// Reads the timers to re-arm after a restart.
pub async fn load_rearm(store: &dyn Store, now: DateTime<Utc>) -> StoreResult<Rearm> {
    let mut out = Rearm::default();
    let mut reminders = HashMap::new();
    for run in store.unfinished_runs().await? {
        let Some(end) = run.window_end_at else {
            continue;
        };
        if run.status == RunStatus::Parked {
            let reminder = match reminders.entry(run.reminder_id) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(store.get_reminder(run.reminder_id).await?),
            };
            let Some(reminder) = reminder else {
                continue;
            };
            if reminder.state != ReminderState::Archived {
                let spec = &reminder.spec;
                // The opening of the window it is held to; if that passed
                // while we were down, resume at once (the run loop then
                // finds where it stands).
                let span = spec
                    .window
                    .span_at_or_after(&spec.timezone, end - chrono::Duration::seconds(1));
                out.parks.push(ParkRun {
                    due: RunDue {
                        run_id: run.id,
                        account_id: run.account_id,
                    },
                    at: span.open.max(now),
                });
            }
            continue;
        }
        // A close that passed while we were down is not re-sent: the run
        // loop checks its window when the run is handed back, and a late
        // WindowClosed could stop that run after it started in a new window.
        if end <= now {
            continue;
        }
        out.closes.push(ArmWindow {
            run_id: run.id,
            account_id: run.account_id,
            close_at: end,
        });
    }
    Ok(out)
}

/// Window-end and resume timers; see the module docs.
pub struct WindowActor {
    ports: WindowPorts,
    closed: Recipient<WindowClosed>,
    resume: Recipient<RunDue>,
    closes: HashMap<RunId, Timer>,
    parks: HashMap<RunId, Timer>,
    generation: u64,
    /// Runs armed, disarmed or parked while the start-up load was in
    /// flight: the load's older view must not override them.
    touched_while_loading: Option<HashSet<RunId>>,
}

impl WindowActor {
    /// `closed` receives `WindowClosed` (the supervisor); `resume` receives
    /// `RunDue` for a parked run at its next opening (the supervisor too).
    pub fn new(
        ports: WindowPorts,
        closed: Recipient<WindowClosed>,
        resume: Recipient<RunDue>,
    ) -> Self {
        Self {
            ports,
            closed,
            resume,
            closes: HashMap::new(),
            parks: HashMap::new(),
            generation: 0,
            touched_while_loading: None,
        }
    }

    fn touch(&mut self, run: RunId) {
        if let Some(t) = &mut self.touched_while_loading {
            t.insert(run);
        }
    }

    fn arm(&mut self, msg: ArmWindow, ctx: &mut Context<Self>) {
        if let Some(old) = self.closes.remove(&msg.run_id) {
            ctx.cancel_future(old.handle);
        }
        self.generation += 1;
        let generation = self.generation;
        let clock = self.ports.clock.clone();
        let (run_id, at) = (msg.run_id, msg.close_at);
        let handle = ctx.spawn(
            async move { sleep_until(&*clock, at).await }
                .into_actor(self)
                .map(move |_, act, ctx| {
                    if act.closes.get(&run_id).map(|t| t.generation) != Some(generation) {
                        return;
                    }
                    act.closes.remove(&run_id);
                    act.close(msg, ctx);
                }),
        );
        self.closes.insert(
            run_id,
            Timer {
                handle,
                at,
                generation,
            },
        );
    }

    fn close(&mut self, msg: ArmWindow, ctx: &mut Context<Self>) {
        self.closed.do_send(WindowClosed {
            run_id: msg.run_id,
            account_id: msg.account_id.clone(),
            close_at: msg.close_at,
        });
        self.ports.metrics.window_closed();
        tracing::info!(run_id = %msg.run_id, account_id = %msg.account_id, close_at = %msg.close_at, "delivery window closed");
        let events = self.ports.events.clone();
        ctx.spawn(
            async move {
                events
                    .emit(
                        "window_closed",
                        Some(&msg.account_id),
                        Some(msg.run_id),
                        json!({ "close_at": msg.close_at }),
                    )
                    .await;
            }
            .into_actor(self),
        );
    }

    fn park(&mut self, msg: ParkRun, ctx: &mut Context<Self>) {
        let run_id = msg.due.run_id;
        if let Some(old) = self.parks.remove(&run_id) {
            ctx.cancel_future(old.handle);
        }
        self.generation += 1;
        let generation = self.generation;
        let clock = self.ports.clock.clone();
        let at = msg.at;
        let handle = ctx.spawn(
            async move { sleep_until(&*clock, at).await }
                .into_actor(self)
                .map(move |_, act, ctx| {
                    if act.parks.get(&run_id).map(|t| t.generation) != Some(generation) {
                        return;
                    }
                    act.parks.remove(&run_id);
                    act.unpark(msg, ctx);
                }),
        );
        self.parks.insert(
            run_id,
            Timer {
                handle,
                at,
                generation,
            },
        );
    }

    fn unpark(&mut self, msg: ParkRun, ctx: &mut Context<Self>) {
        let due = msg.due;
        self.resume.do_send(due.clone());
        tracing::info!(run_id = %due.run_id, account_id = %due.account_id, "parked run resumes at its window opening");
        let events = self.ports.events.clone();
        ctx.spawn(
            async move {
                events
                    .emit(
                        "run_resume_due",
                        Some(&due.account_id),
                        Some(due.run_id),
                        json!({ "at": msg.at }),
                    )
                    .await;
            }
            .into_actor(self),
        );
    }
}

impl Actor for WindowActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.touched_while_loading = Some(HashSet::new());
        let store = self.ports.store.clone();
        let now = self.ports.clock.now();
        ctx.spawn(
            async move { load_rearm(&*store, now).await }
                .into_actor(self)
                .map(|res, act, ctx| {
                    let touched = act.touched_while_loading.take().unwrap_or_default();
                    match res {
                        Ok(rearm) => {
                            for m in rearm.closes {
                                if !touched.contains(&m.run_id) {
                                    act.arm(m, ctx);
                                }
                            }
                            for m in rearm.parks {
                                if !touched.contains(&m.due.run_id) {
                                    act.park(m, ctx);
                                }
                            }
                        }
                        Err(e) => tracing::error!(
                            error = %e,
                            "could not re-arm window timers; runs still stop at their window end, which the delivery loop checks"
                        ),
                    }
                }),
        );
    }
}

/// Stops the actor and its timers (the simulation's crash).
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct StopTimers;

#[cfg(any(test, feature = "testkit"))]
impl Handler<StopTimers> for WindowActor {
    type Result = ();
    fn handle(&mut self, _: StopTimers, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<ArmWindow> for WindowActor {
    type Result = ();

    fn handle(&mut self, msg: ArmWindow, ctx: &mut Self::Context) {
        self.touch(msg.run_id);
        self.arm(msg, ctx);
    }
}

impl Handler<DisarmWindow> for WindowActor {
    type Result = ();

    fn handle(&mut self, msg: DisarmWindow, ctx: &mut Self::Context) {
        self.touch(msg.run_id);
        if let Some(t) = self.closes.remove(&msg.run_id) {
            ctx.cancel_future(t.handle);
        }
    }
}

impl Handler<ParkRun> for WindowActor {
    type Result = ();

    fn handle(&mut self, msg: ParkRun, ctx: &mut Self::Context) {
        self.touch(msg.due.run_id);
        self.park(msg, ctx);
    }
}

#[cfg(any(test, feature = "testkit"))]
impl Handler<GetWindowTimers> for WindowActor {
    type Result = MessageResult<GetWindowTimers>;

    fn handle(&mut self, _: GetWindowTimers, _: &mut Self::Context) -> Self::Result {
        let list = |m: &HashMap<RunId, Timer>| {
            let mut v: Vec<_> = m.iter().map(|(id, t)| (*id, t.at)).collect();
            v.sort();
            v
        };
        MessageResult(WindowTimers {
            closes: list(&self.closes),
            parks: list(&self.parks),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AccountId, Schedule, WindowHours};
    use crate::ports::RunStore;
    use crate::ports::RunUpdate;
    use crate::scheduling::scheduler::tests::{collector, sec, spec, tz, utc, Got, World};
    use std::sync::atomic::Ordering;

    struct Rig {
        addr: Addr<WindowActor>,
        closed: Got<WindowClosed>,
        resumed: Got<RunDue>,
    }

    fn start(w: &World) -> Rig {
        let (closed_to, closed) = collector::<WindowClosed>(w.clock.clone());
        let (resume_to, resumed) = collector::<RunDue>(w.clock.clone());
        let addr = WindowActor::new(w.ports(), closed_to, resume_to).start();
        Rig {
            addr,
            closed,
            resumed,
        }
    }

    fn sales() -> AccountId {
        AccountId::parse("sales").unwrap()
    }

    fn closes(got: &Got<WindowClosed>) -> Vec<(RunId, DateTime<Utc>, DateTime<Utc>)> {
        got.lock()
            .unwrap()
            .iter()
            .map(|(m, at)| (m.run_id, m.close_at, sec(*at)))
            .collect()
    }

    fn resumes(got: &Got<RunDue>) -> Vec<(RunId, DateTime<Utc>)> {
        got.lock()
            .unwrap()
            .iter()
            .map(|(m, at)| (m.run_id, sec(*at)))
            .collect()
    }

    /// A stored run of a fresh reminder, in `status`, with `window_end_at`.
    async fn stored_run(
        w: &World,
        window: WindowHours,
        resume_next_window: bool,
        status: RunStatus,
        end: Option<DateTime<Utc>>,
    ) -> RunId {
        let mut s = spec("UTC", Schedule::cron("0 9 * * *").unwrap(), window);
        s.resume_next_window = resume_next_window;
        let r = w.reminder(s, utc("2026-05-01T00:00:00Z")).await;
        let run = w
            .store
            .create_run(
                r.id,
                &sales(),
                utc("2026-05-10T09:00:00Z"),
                status,
                None,
                utc("2026-05-10T09:00:00Z"),
            )
            .await
            .unwrap()
            .run;
        w.store
            .update_run(
                run.id,
                &RunUpdate {
                    window_end_at: end,
                    ..RunUpdate::default()
                },
            )
            .await
            .unwrap();
        run.id
    }

    #[actix_rt::test]
    async fn window_closed_is_sent_at_the_close_not_before() {
        let w = World::new(utc("2026-05-10T09:00:00Z")).await;
        let rig = start(&w);
        let close = utc("2026-05-10T18:00:00Z");
        rig.addr
            .send(ArmWindow {
                run_id: RunId(7),
                account_id: sales(),
                close_at: close,
            })
            .await
            .unwrap();
        w.run_until(utc("2026-05-10T17:59:59Z")).await;
        assert!(rig.closed.lock().unwrap().is_empty());
        w.run_until(utc("2026-05-10T18:00:01Z")).await;
        assert_eq!(closes(&rig.closed), vec![(RunId(7), close, close)]);
        assert_eq!(w.metrics.closed.load(Ordering::SeqCst), 1);
        assert!(w.event_kinds().await.contains(&"window_closed".to_string()));
        assert_eq!(
            rig.addr.send(GetWindowTimers).await.unwrap(),
            WindowTimers::default()
        );
    }

    #[actix_rt::test]
    async fn disarm_prevents_the_close_and_rearming_replaces_it() {
        let w = World::new(utc("2026-05-10T09:00:00Z")).await;
        let rig = start(&w);
        let arm = |run, close| ArmWindow {
            run_id: RunId(run),
            account_id: sales(),
            close_at: close,
        };
        rig.addr
            .send(arm(1, utc("2026-05-10T18:00:00Z")))
            .await
            .unwrap();
        rig.addr
            .send(arm(2, utc("2026-05-10T12:00:00Z")))
            .await
            .unwrap();
        // Run 2 re-armed later: only the later close counts.
        rig.addr
            .send(arm(2, utc("2026-05-10T13:00:00Z")))
            .await
            .unwrap();
        rig.addr
            .send(DisarmWindow { run_id: RunId(1) })
            .await
            .unwrap();
        assert_eq!(
            rig.addr.send(GetWindowTimers).await.unwrap().closes,
            vec![(RunId(2), utc("2026-05-10T13:00:00Z"))]
        );
        w.run_until(utc("2026-05-11T00:00:00Z")).await;
        assert_eq!(
            closes(&rig.closed),
            vec![(
                RunId(2),
                utc("2026-05-10T13:00:00Z"),
                utc("2026-05-10T13:00:00Z")
            )]
        );
    }

    #[actix_rt::test]
    async fn a_cross_midnight_window_closes_the_next_morning_even_across_fall_back() {
        // New York 22–06, run starting 23:00 EDT on 31 October: the night
        // gains an hour, the window closes at 06:00 EST = 11:00 UTC.
        let w = World::new(utc("2026-11-01T03:00:00Z")).await;
        let rig = start(&w);
        let window = WindowHours::parse(22, 6).unwrap();
        let span = window.span_at_or_after(&tz("America/New_York"), w.clock.now());
        assert_eq!(span.close, utc("2026-11-01T11:00:00Z"));
        rig.addr
            .send(ArmWindow {
                run_id: RunId(3),
                account_id: sales(),
                close_at: span.close,
            })
            .await
            .unwrap();
        // Still open at 06:00 EDT-by-the-old-clock (10:00 UTC).
        w.run_until(utc("2026-11-01T10:59:59Z")).await;
        assert!(rig.closed.lock().unwrap().is_empty());
        w.run_until(utc("2026-11-01T11:00:01Z")).await;
        assert_eq!(closes(&rig.closed).len(), 1);
        assert_eq!(closes(&rig.closed)[0].2, utc("2026-11-01T11:00:00Z"));
    }

    #[actix_rt::test]
    async fn timers_are_rearmed_from_the_store_on_start() {
        let w = World::new(utc("2026-05-10T12:00:00Z")).await;
        let running = stored_run(
            &w,
            WindowHours::default(),
            false,
            RunStatus::Running,
            Some(utc("2026-05-10T18:00:00Z")),
        )
        .await;
        // Its close passed while the daemon was down: the run loop sees
        // that when the run is handed back; no stale WindowClosed is sent.
        let _overdue = stored_run(
            &w,
            WindowHours::default(),
            false,
            RunStatus::Queued,
            Some(utc("2026-05-10T11:00:00Z")),
        )
        .await;
        // Not started yet: no window end, nothing to arm.
        let _queued = stored_run(&w, WindowHours::default(), false, RunStatus::Queued, None).await;
        // Finished runs are not re-armed.
        let _done = stored_run(
            &w,
            WindowHours::default(),
            false,
            RunStatus::Success,
            Some(utc("2026-05-10T18:00:00Z")),
        )
        .await;
        let rig = start(&w);
        w.run_until(utc("2026-05-10T12:00:01Z")).await;
        assert!(rig.closed.lock().unwrap().is_empty());
        assert_eq!(
            rig.addr.send(GetWindowTimers).await.unwrap().closes,
            vec![(running, utc("2026-05-10T18:00:00Z"))]
        );
        w.run_until(utc("2026-05-10T18:00:01Z")).await;
        assert_eq!(
            closes(&rig.closed),
            vec![(
                running,
                utc("2026-05-10T18:00:00Z"),
                utc("2026-05-10T18:00:00Z")
            )]
        );
    }

    #[actix_rt::test]
    async fn park_and_resume_at_the_next_opening() {
        // resume_next_window: the window closes at 18:00 with work left; the
        // account parks the run; it is due again at 06:00 the next morning.
        let w = World::new(utc("2026-05-10T09:00:00Z")).await;
        let rig = start(&w);
        let window = WindowHours::default();
        let z = tz("UTC");
        let close = window.span_at_or_after(&z, w.clock.now()).close;
        rig.addr
            .send(ArmWindow {
                run_id: RunId(5),
                account_id: sales(),
                close_at: close,
            })
            .await
            .unwrap();
        w.run_until(close).await;
        assert_eq!(closes(&rig.closed).len(), 1);
        // What the account does on WindowClosed for a resume_next_window run.
        let at = window.next_open_after(&z, w.clock.now()).open;
        rig.addr
            .send(DisarmWindow { run_id: RunId(5) })
            .await
            .unwrap();
        rig.addr
            .send(ParkRun {
                due: RunDue {
                    run_id: RunId(5),
                    account_id: sales(),
                },
                at,
            })
            .await
            .unwrap();
        w.run_until(utc("2026-05-11T05:59:59Z")).await;
        assert!(rig.resumed.lock().unwrap().is_empty());
        w.run_until(utc("2026-05-11T06:00:01Z")).await;
        assert_eq!(
            resumes(&rig.resumed),
            vec![(RunId(5), utc("2026-05-11T06:00:00Z"))]
        );
        assert!(w
            .event_kinds()
            .await
            .contains(&"run_resume_due".to_string()));
    }

    #[actix_rt::test]
    async fn parked_runs_are_rearmed_on_start() {
        let w = World::new(utc("2026-05-10T20:00:00Z")).await;
        let closed_at = Some(utc("2026-05-10T18:00:00Z"));
        // Parked at yesterday's 18:00 close: held to today's window.
        let parked = stored_run(
            &w,
            WindowHours::default(),
            true,
            RunStatus::Parked,
            Some(utc("2026-05-11T18:00:00Z")),
        )
        .await;
        // Paused by the operator (even with resume_next_window): waits for the operator.
        let _operator_too = stored_run(
            &w,
            WindowHours::default(),
            true,
            RunStatus::Paused,
            closed_at,
        )
        .await;
        let _operator = stored_run(
            &w,
            WindowHours::default(),
            false,
            RunStatus::Paused,
            closed_at,
        )
        .await;
        // Paused inside its window (an operator pause): its close is armed instead.
        let inside = stored_run(
            &w,
            WindowHours::parse(6, 22).unwrap(),
            true,
            RunStatus::Paused,
            Some(utc("2026-05-10T22:00:00Z")),
        )
        .await;
        let rig = start(&w);
        w.run_until(utc("2026-05-10T20:00:01Z")).await;
        assert_eq!(
            rig.addr.send(GetWindowTimers).await.unwrap(),
            WindowTimers {
                closes: vec![(inside, utc("2026-05-10T22:00:00Z"))],
                parks: vec![(parked, utc("2026-05-11T06:00:00Z"))],
            }
        );
        w.run_until(utc("2026-05-11T07:00:00Z")).await;
        assert_eq!(
            resumes(&rig.resumed),
            vec![(parked, utc("2026-05-11T06:00:00Z"))]
        );
    }

    #[actix_rt::test]
    async fn a_parked_run_whose_next_window_is_already_open_resumes_at_once() {
        // Down from 17:00 to 07:00 next day: the 06:00 opening passed.
        let w = World::new(utc("2026-05-11T07:00:00Z")).await;
        let parked = stored_run(
            &w,
            WindowHours::default(),
            true,
            RunStatus::Parked,
            Some(utc("2026-05-11T18:00:00Z")),
        )
        .await;
        let rig = start(&w);
        w.run_until(utc("2026-05-11T07:00:01Z")).await;
        assert_eq!(
            resumes(&rig.resumed),
            vec![(parked, utc("2026-05-11T07:00:00Z"))]
        );
    }
}
