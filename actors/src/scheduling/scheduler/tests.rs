//! The scheduler, driven by hand on controlled time (the state) and as an
//! actor on a paused clock (dispatch, restarts, two schedulers, fire-now).

use super::*;
use crate::domain::{
    AccountId, ReminderSchedule, ReminderState, Run, RunId, RunStatus, Schedule, TimeZone,
    WindowHours,
};
use crate::domain::{
    AccountLimits, AccountState, GatewayKind, GroupJid, MessagePart, NewReminder, Reminder,
};
use crate::events::EventBus;
use crate::memstore::MemoryStore;
use crate::messages::{ReminderChanged, RunDue};
use crate::ports::{sleep_until, Clock, Metrics, RunFilter, ScheduleScan};
use crate::ports::{AccountStore, EventStore, ReminderStore, RunStore};
use crate::ports::{NewAccount, TokioClock};
use actix::prelude::*;
use chrono::{DateTime, Timelike, Utc};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

pub(crate) fn utc(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

pub(crate) fn tz(name: &str) -> TimeZone {
    TimeZone::parse(name).unwrap()
}

fn all_day() -> WindowHours {
    WindowHours::parse(0, 24).unwrap()
}

pub(crate) fn spec(zone: &str, schedule: Schedule, window: WindowHours) -> NewReminder {
    NewReminder::new(
        AccountId::parse("sales").unwrap(),
        "Monday standup",
        tz(zone),
        schedule,
        window,
        false,
        vec![MessagePart::text("Standup in 10 minutes").unwrap()],
        vec![GroupJid::parse("120363000000000001@g.us").unwrap()],
    )
    .unwrap()
}

fn reminder(id: i64, spec: NewReminder, created: DateTime<Utc>) -> Reminder {
    Reminder {
        id,
        state: ReminderState::Active,
        spec,
        created_at: created,
        updated_at: created,
    }
}

fn snap(r: Reminder) -> ReminderSchedule {
    ReminderSchedule::of(&r, 0, None)
}

fn grace5() -> SchedulerConfig {
    SchedulerConfig::default()
}

/// Drives the state the way the timer does (waking exactly on time)
/// until `until`; returns each firing with the instant it happened.
fn drive(state: &mut SchedulerState, until: DateTime<Utc>) -> Vec<(DateTime<Utc>, Firing)> {
    let mut out = Vec::new();
    while let Some(at) = state.next_wake() {
        if at > until {
            break;
        }
        out.extend(state.due_now(at).into_iter().map(|f| (at, f)));
    }
    out
}

fn fired_at(fs: &[(DateTime<Utc>, Firing)]) -> Vec<DateTime<Utc>> {
    fs.iter()
        .filter(|(_, f)| f.action == Action::Queue)
        .map(|(at, _)| *at)
        .collect()
}

// ------------------------------------------------------------ pure

#[test]
fn due_inside_the_window_is_the_occurrence() {
    let s = Schedule::cron("0 9 * * 1").unwrap();
    let d = next_due(
        &s,
        &tz("Asia/Kuala_Lumpur"),
        &WindowHours::default(),
        utc("2026-11-21T00:00:00Z"),
    )
    .unwrap();
    assert_eq!(d.occurrence, utc("2026-11-23T01:00:00Z"));
    assert_eq!(d.effective, d.occurrence);
}

#[test]
fn due_before_the_window_waits_for_the_opening() {
    // 04:00 KL with a 06–18 window: sent at 06:00 KL (22:00 UTC the day before).
    let s = Schedule::cron("0 4 * * *").unwrap();
    let d = next_due(
        &s,
        &tz("Asia/Kuala_Lumpur"),
        &WindowHours::default(),
        utc("2026-05-10T00:00:00Z"),
    )
    .unwrap();
    assert_eq!(d.occurrence, utc("2026-05-10T20:00:00Z"));
    assert_eq!(d.effective, utc("2026-05-10T22:00:00Z"));
}

#[test]
fn occurrences_before_one_opening_coalesce_into_the_latest() {
    // At half past every hour with a 06–18 UTC window: 18:30 through 05:30
    // wait for 06:00 as one run, for 05:30.
    let s = Schedule::cron("30 * * * *").unwrap();
    let w = WindowHours::default();
    let d = next_due(&s, &tz("UTC"), &w, utc("2026-05-10T17:45:00Z")).unwrap();
    assert_eq!(
        d,
        Due {
            occurrence: utc("2026-05-11T05:30:00Z"),
            effective: utc("2026-05-11T06:00:00Z"),
        }
    );
    // And the next one is 06:30 itself, inside the window.
    let d = next_due(&s, &tz("UTC"), &w, d.occurrence).unwrap();
    assert_eq!(d.effective, utc("2026-05-11T06:30:00Z"));
    assert_eq!(d.occurrence, d.effective);
}

#[test]
fn an_occurrence_at_the_opening_takes_the_nights_place_and_sends_once() {
    // Hourly with a 06–18 UTC window: 18:00 (the close is exclusive)
    // through 05:00 are superseded by 06:00's own occurrence; two runs at
    // 06:00 would send the same reminder twice in every group.
    let s = Schedule::cron("0 * * * *").unwrap();
    let w = WindowHours::default();
    let z = tz("UTC");
    let d = next_due(&s, &z, &w, utc("2026-05-10T17:30:00Z")).unwrap();
    let six = utc("2026-05-11T06:00:00Z");
    assert_eq!(
        d,
        Due {
            occurrence: six,
            effective: six
        }
    );
    let next = next_due(&s, &z, &w, d.occurrence).unwrap();
    assert_eq!(next.effective, utc("2026-05-11T07:00:00Z"));
    // Walking a whole day: twelve sends, 06:00 to 17:00, each once.
    let mut at = utc("2026-05-10T18:00:00Z");
    let mut sends = Vec::new();
    while let Some(d) = next_due(&s, &z, &w, at) {
        if d.effective >= utc("2026-05-11T18:00:00Z") {
            break;
        }
        sends.push(d.effective);
        at = d.occurrence;
    }
    assert_eq!(sends.len(), 12, "{sends:?}");
    assert!(sends.windows(2).all(|p| p[0] < p[1]), "{sends:?}");
}

#[test]
fn cross_midnight_window_sends_evening_occurrences_at_22_and_night_ones_at_once() {
    let w = WindowHours::parse(22, 6).unwrap();
    let z = tz("UTC");
    let evening = Schedule::cron("0 20 * * *").unwrap();
    let d = next_due(&evening, &z, &w, utc("2026-05-10T12:00:00Z")).unwrap();
    assert_eq!(d.occurrence, utc("2026-05-10T20:00:00Z"));
    assert_eq!(d.effective, utc("2026-05-10T22:00:00Z"));
    let night = Schedule::cron("0 2 * * *").unwrap();
    let d = next_due(&night, &z, &w, utc("2026-05-10T12:00:00Z")).unwrap();
    assert_eq!(d.occurrence, utc("2026-05-11T02:00:00Z"));
    assert_eq!(d.effective, d.occurrence);
}

#[test]
fn missed_summary_reads_like_the_seed() {
    let d = Due {
        occurrence: utc("2026-05-11T01:00:00Z"),
        effective: utc("2026-05-11T01:00:00Z"),
    };
    let now = utc("2026-05-11T04:12:00Z");
    assert_eq!(
        missed_summary(&d, &tz("Asia/Kuala_Lumpur"), now),
        "MISSED_WINDOW: due 09:00 Asia/Kuala_Lumpur, picked up 3 hours 12 minutes late; not sent"
    );
    let pushed = Due {
        occurrence: utc("2026-05-10T20:00:00Z"),
        effective: utc("2026-05-10T22:00:00Z"),
    };
    assert_eq!(
        missed_summary(&pushed, &tz("Asia/Kuala_Lumpur"), utc("2026-05-12T23:00:00Z")),
        "MISSED_WINDOW: due 2026-05-11 06:00 Asia/Kuala_Lumpur (window opening; scheduled 2026-05-11 04:00), picked up 2 days 1 hour late; not sent"
    );
}

// ------------------------------------------------------------ state

#[test]
fn one_shot_fires_once_at_its_instant() {
    let mut st = SchedulerState::new(grace5());
    let s = Schedule::once("2026-12-01T09:00").unwrap();
    st.apply(
        snap(reminder(
            1,
            spec("Asia/Kuala_Lumpur", s, WindowHours::default()),
            utc("2026-11-30T00:00:00Z"),
        )),
        0,
    );
    let fs = drive(&mut st, utc("2027-01-01T00:00:00Z"));
    assert_eq!(fired_at(&fs), vec![utc("2026-12-01T01:00:00Z")]);
    assert_eq!(fs[0].1.due.occurrence, utc("2026-12-01T01:00:00Z"));
    // No next occurrence afterwards; the reminder stays as it is.
    assert_eq!(st.next_of(1), None);
    assert_eq!(st.next_wake(), None);
}

#[test]
fn weekly_cron_in_kuala_lumpur_fires_every_monday_0900() {
    let mut st = SchedulerState::new(grace5());
    let s = Schedule::cron("0 9 * * 1").unwrap();
    st.apply(
        snap(reminder(
            1,
            spec("Asia/Kuala_Lumpur", s, WindowHours::default()),
            utc("2026-11-21T00:00:00Z"),
        )),
        0,
    );
    let fs = drive(&mut st, utc("2026-12-08T00:00:00Z"));
    assert_eq!(
        fired_at(&fs),
        vec![
            utc("2026-11-23T01:00:00Z"),
            utc("2026-11-30T01:00:00Z"),
            utc("2026-12-07T01:00:00Z")
        ]
    );
}

#[test]
fn london_spring_forward_fires_at_the_end_of_the_gap_and_fall_back_once() {
    let mut st = SchedulerState::new(grace5());
    let s = Schedule::cron("30 1 * * *").unwrap();
    st.apply(
        snap(reminder(
            1,
            spec("Europe/London", s, all_day()),
            utc("2026-03-28T00:00:00Z"),
        )),
        0,
    );
    let fs = drive(&mut st, utc("2026-03-30T12:00:00Z"));
    // 01:30 does not exist on 29 March: fires at 02:00 BST = 01:00 UTC.
    assert_eq!(
        fired_at(&fs),
        vec![
            utc("2026-03-28T01:30:00Z"),
            utc("2026-03-29T01:00:00Z"),
            utc("2026-03-30T00:30:00Z")
        ]
    );
    let mut st = SchedulerState::new(grace5());
    let s = Schedule::cron("30 1 * * *").unwrap();
    st.apply(
        snap(reminder(
            1,
            spec("Europe/London", s, all_day()),
            utc("2026-10-24T12:00:00Z"),
        )),
        0,
    );
    let fs = drive(&mut st, utc("2026-10-26T12:00:00Z"));
    // 01:30 happens twice on 25 October: fires once, at the first (BST).
    assert_eq!(
        fired_at(&fs),
        vec![utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")]
    );
}

#[test]
fn new_york_spring_forward_and_fall_back() {
    let mut st = SchedulerState::new(grace5());
    st.apply(
        snap(reminder(
            1,
            spec(
                "America/New_York",
                Schedule::cron("30 2 * * *").unwrap(),
                all_day(),
            ),
            utc("2026-03-07T12:00:00Z"),
        )),
        0,
    );
    // 02:30 on 8 March does not exist: 03:00 EDT = 07:00 UTC.
    let fs = drive(&mut st, utc("2026-03-09T12:00:00Z"));
    assert_eq!(
        fired_at(&fs),
        vec![utc("2026-03-08T07:00:00Z"), utc("2026-03-09T06:30:00Z")]
    );
    let mut st = SchedulerState::new(grace5());
    st.apply(
        snap(reminder(
            1,
            spec(
                "America/New_York",
                Schedule::cron("30 1 * * *").unwrap(),
                all_day(),
            ),
            utc("2026-10-31T12:00:00Z"),
        )),
        0,
    );
    let fs = drive(&mut st, utc("2026-11-02T12:00:00Z"));
    // 01:30 on 1 November happens at 05:30 and 06:30 UTC: fires only at 05:30.
    assert_eq!(
        fired_at(&fs),
        vec![utc("2026-11-01T05:30:00Z"), utc("2026-11-02T06:30:00Z")]
    );
}

#[test]
fn due_before_the_window_fires_at_the_opening_and_grace_counts_from_it() {
    // 04:00 UTC with a 06–18 window.
    let make = || {
        let mut st = SchedulerState::new(grace5());
        st.apply(
            snap(reminder(
                1,
                spec(
                    "UTC",
                    Schedule::cron("0 4 * * *").unwrap(),
                    WindowHours::default(),
                ),
                utc("2026-05-10T00:00:00Z"),
            )),
            0,
        );
        st
    };
    let mut st = make();
    assert_eq!(st.next_wake(), Some(utc("2026-05-10T06:00:00Z")));
    assert!(st.due_now(utc("2026-05-10T05:59:59Z")).is_empty());
    // Two hours after the occurrence but four minutes after the opening: sent.
    let fs = make().due_now(utc("2026-05-10T06:04:00Z"));
    assert_eq!(fs.len(), 1);
    assert_eq!(fs[0].action, Action::Queue);
    assert_eq!(fs[0].due.occurrence, utc("2026-05-10T04:00:00Z"));
    // Six minutes after the opening: missed.
    let fs = make().due_now(utc("2026-05-10T06:06:00Z"));
    assert_eq!(fs[0].action, Action::Miss);
}

#[test]
fn picked_up_late_is_missed_and_the_next_occurrence_is_scheduled() {
    let mut st = SchedulerState::new(grace5());
    st.apply(
        snap(reminder(
            1,
            spec(
                "Asia/Kuala_Lumpur",
                Schedule::cron("0 9 * * *").unwrap(),
                WindowHours::default(),
            ),
            utc("2026-05-10T02:00:00Z"),
        )),
        0,
    );
    // Exactly at the grace edge still fires.
    let mut edge = SchedulerState::new(grace5());
    edge.apply(
        snap(reminder(
            1,
            spec(
                "Asia/Kuala_Lumpur",
                Schedule::cron("0 9 * * *").unwrap(),
                WindowHours::default(),
            ),
            utc("2026-05-10T02:00:00Z"),
        )),
        0,
    );
    assert_eq!(
        edge.due_now(utc("2026-05-11T01:05:00Z"))[0].action,
        Action::Queue
    );
    let fs = st.due_now(utc("2026-05-11T04:12:00Z"));
    assert_eq!(fs.len(), 1);
    assert_eq!(fs[0].action, Action::Miss);
    assert_eq!(
        st.next_of(1).unwrap().occurrence,
        utc("2026-05-12T01:00:00Z")
    );
}

#[test]
fn catch_up_keeps_the_newest_missed_up_to_the_cap() {
    let mut st = SchedulerState::new(SchedulerConfig {
        missed_cap: 100,
        ..grace5()
    });
    // Every minute, down for a week: 10,080 occurrences.
    st.apply(
        snap(reminder(
            1,
            spec("UTC", Schedule::cron("* * * * *").unwrap(), all_day()),
            utc("2026-05-01T00:00:00Z"),
        )),
        0,
    );
    let now = utc("2026-05-08T00:00:30Z");
    let fs = st.due_now(now);
    let missed: Vec<_> = fs.iter().filter(|f| f.action == Action::Miss).collect();
    assert_eq!(missed.len(), 100);
    assert_eq!(
        missed.last().unwrap().due.occurrence,
        // 23:55 is 5 min 30 s late at 00:00:30: the newest missed.
        utc("2026-05-07T23:55:00Z")
    );
    let queued: Vec<_> = fs.iter().filter(|f| f.action == Action::Queue).collect();
    // 23:56 .. 00:00 are within the five-minute grace.
    assert_eq!(queued.len(), 5);
    match &fs[0].action {
        Action::SkipMissed {
            count,
            at_least,
            recorded,
        } => {
            assert_eq!(
                (*count, *at_least, *recorded),
                (10_080 - 5 - 100, false, 100)
            );
        }
        other => panic!("expected a skip note first, got {other:?}"),
    }
    assert_eq!(
        st.next_of(1).unwrap().occurrence,
        utc("2026-05-08T00:01:00Z")
    );
}

#[test]
fn a_paused_stretch_is_not_reported_as_missed() {
    let mut st = SchedulerState::new(grace5());
    let mut r = reminder(
        1,
        spec("UTC", Schedule::cron("0 9 * * *").unwrap(), all_day()),
        utc("2026-05-01T00:00:00Z"),
    );
    // Resumed on the 8th at noon after a pause; last run on the 3rd.
    r.updated_at = utc("2026-05-08T12:00:00Z");
    st.apply(
        ReminderSchedule::of(&r, 0, Some(utc("2026-05-03T09:00:00Z"))),
        0,
    );
    assert!(st.due_now(utc("2026-05-08T12:00:01Z")).is_empty());
    assert_eq!(
        st.next_of(1).unwrap().occurrence,
        utc("2026-05-09T09:00:00Z")
    );
    // Paused reminders are not scheduled at all.
    r.state = ReminderState::Paused;
    st.apply(snap(r), 1);
    assert_eq!(st.next_wake(), None);
}

#[test]
fn an_older_load_cannot_overwrite_a_newer_one() {
    let mut st = SchedulerState::new(grace5());
    let r = reminder(
        1,
        spec("UTC", Schedule::cron("0 9 * * *").unwrap(), all_day()),
        utc("2026-05-01T00:00:00Z"),
    );
    let mut paused = r.clone();
    paused.state = ReminderState::Paused;
    st.apply(snap(paused), 5);
    st.apply(snap(r), 3);
    assert_eq!(st.next_wake(), None);
}

// ------------------------------------------------------------ actor, on paused time

/// Records metrics the scheduler and window actor report.
#[derive(Default)]
pub(crate) struct TestMetrics {
    pub lags: Mutex<Vec<Duration>>,
    pub missed: AtomicU64,
    pub closed: AtomicU64,
}

impl Metrics for TestMetrics {
    fn fire_lag(&self, lag: Duration) {
        self.lags.lock().unwrap().push(lag);
    }
    fn run_missed(&self) {
        self.missed.fetch_add(1, Ordering::SeqCst);
    }
    fn window_closed(&self) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

/// Stands in for the supervisor: records what it receives and when.
pub(crate) struct Collector<M: Send + 'static> {
    clock: Arc<dyn Clock>,
    pub got: Got<M>,
}

impl<M: Send + 'static> Actor for Collector<M> {
    type Context = Context<Self>;
}

impl<M> Handler<M> for Collector<M>
where
    M: Message<Result = ()> + Send + 'static,
{
    type Result = ();
    fn handle(&mut self, msg: M, _: &mut Context<Self>) {
        let now = self.clock.now();
        self.got.lock().unwrap().push((msg, now));
    }
}

pub(crate) type Got<M> = Arc<Mutex<Vec<(M, DateTime<Utc>)>>>;

pub(crate) fn collector<M>(clock: Arc<dyn Clock>) -> (Recipient<M>, Got<M>)
where
    M: Message<Result = ()> + Send + 'static,
{
    let got: Got<M> = Arc::default();
    let addr = Collector {
        clock,
        got: got.clone(),
    }
    .start();
    (addr.recipient(), got)
}

/// A memory store with account "sales", virtual time from `start`.
pub(crate) struct World {
    pub store: Arc<MemoryStore>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<TestMetrics>,
    pub events: EventBus,
}

impl World {
    /// Call inside an actix system; pauses tokio time.
    pub async fn new(start: DateTime<Utc>) -> Self {
        tokio::time::pause();
        let store = Arc::new(MemoryStore::new());
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(start));
        store
            .create_account(
                &NewAccount {
                    id: AccountId::parse("sales").unwrap(),
                    name: "Sales".into(),
                    kind: GatewayKind::Simulator,
                    state: AccountState::Connected,
                    limits: AccountLimits::default(),
                },
                start,
            )
            .await
            .unwrap();
        let events = EventBus::new(store.clone(), clock.clone());
        Self {
            store,
            clock,
            metrics: Arc::default(),
            events,
        }
    }

    pub fn ports(&self) -> SchedulerPorts {
        SchedulerPorts {
            store: self.store.clone(),
            clock: self.clock.clone(),
            metrics: self.metrics.clone(),
            events: self.events.clone(),
        }
    }

    pub async fn reminder(&self, spec: NewReminder, at: DateTime<Utc>) -> Reminder {
        self.store.create_reminder(&spec, at).await.unwrap()
    }

    /// Lets virtual time run until `at` (every actor keeps running).
    pub async fn run_until(&self, at: DateTime<Utc>) {
        sleep_until(&*self.clock, at).await;
        // Let woken actors finish what the instant started.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    pub async fn runs(&self, reminder_id: i64) -> Vec<Run> {
        let mut runs = self
            .store
            .list_runs(&RunFilter {
                reminder_id: Some(reminder_id),
                ..RunFilter::default()
            })
            .await
            .unwrap();
        runs.sort_by_key(|r| r.scheduled_for);
        runs
    }

    pub async fn event_kinds(&self) -> Vec<String> {
        self.store
            .events_after(0, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }
}

fn start_scheduler(
    w: &World,
    dispatch: Recipient<RunDue>,
    config: SchedulerConfig,
) -> Addr<SchedulerActor> {
    SchedulerActor::new(w.ports(), dispatch, config).start()
}

/// Tokio timers round a deadline up to the next millisecond, so a
/// wake-up lands up to 1 ms after its instant: compare whole seconds.
pub(crate) fn sec(t: DateTime<Utc>) -> DateTime<Utc> {
    t.with_nanosecond(0).unwrap()
}

fn times(got: &Got<RunDue>) -> Vec<DateTime<Utc>> {
    got.lock().unwrap().iter().map(|(_, at)| sec(*at)).collect()
}

fn run_ids(got: &Got<RunDue>) -> Vec<RunId> {
    got.lock().unwrap().iter().map(|(m, _)| m.run_id).collect()
}

#[actix_rt::test]
async fn one_shot_is_dispatched_at_its_instant_not_before() {
    let w = World::new(utc("2026-11-30T00:00:00Z")).await;
    let r = w
        .reminder(
            spec(
                "Asia/Kuala_Lumpur",
                Schedule::once("2026-12-01T09:00").unwrap(),
                WindowHours::default(),
            ),
            utc("2026-11-30T00:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-12-01T00:59:59Z")).await;
    assert!(got.lock().unwrap().is_empty());
    w.run_until(utc("2026-12-08T00:00:00Z")).await;
    assert_eq!(times(&got), vec![utc("2026-12-01T01:00:00Z")]);
    let runs = w.runs(r.id).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Queued);
    assert_eq!(runs[0].scheduled_for, utc("2026-12-01T01:00:00Z"));
    assert_eq!(run_ids(&got), vec![runs[0].id]);
    assert_eq!(w.metrics.lags.lock().unwrap().len(), 1);
    assert!(w.metrics.lags.lock().unwrap()[0] < Duration::from_millis(2));
    assert!(w.event_kinds().await.contains(&"run_queued".to_string()));
    // The one-shot keeps its state: no archive, no next occurrence.
    assert_eq!(
        w.store.get_reminder(r.id).await.unwrap().unwrap().state,
        ReminderState::Active
    );
}

#[actix_rt::test]
async fn weekly_cron_in_kuala_lumpur_is_dispatched_each_monday() {
    // 2026-11-21 is a Saturday.
    let w = World::new(utc("2026-11-21T00:00:00Z")).await;
    let r = w
        .reminder(
            spec(
                "Asia/Kuala_Lumpur",
                Schedule::cron("0 9 * * 1").unwrap(),
                WindowHours::default(),
            ),
            utc("2026-11-21T00:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-12-08T00:00:00Z")).await;
    assert_eq!(
        times(&got),
        vec![
            utc("2026-11-23T01:00:00Z"),
            utc("2026-11-30T01:00:00Z"),
            utc("2026-12-07T01:00:00Z")
        ]
    );
    let runs = w.runs(r.id).await;
    assert_eq!(
        runs.iter().map(|r| r.scheduled_for).collect::<Vec<_>>(),
        times(&got)
    );
}

#[actix_rt::test]
async fn dst_gap_and_repeated_hour_on_the_actor() {
    // New York: 02:30 daily skips into 03:00 EDT on 8 March; 01:30 daily
    // fires once on 1 November.
    let w = World::new(utc("2026-03-07T12:00:00Z")).await;
    let gap = w
        .reminder(
            spec(
                "America/New_York",
                Schedule::cron("30 2 * * *").unwrap(),
                all_day(),
            ),
            utc("2026-03-07T12:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-03-09T12:00:00Z")).await;
    assert_eq!(
        times(&got),
        vec![utc("2026-03-08T07:00:00Z"), utc("2026-03-09T06:30:00Z")]
    );
    assert_eq!(w.runs(gap.id).await.len(), 2);
}

#[actix_rt::test]
async fn fall_back_hour_fires_once_on_the_actor() {
    let w = World::new(utc("2026-10-24T12:00:00Z")).await;
    let r = w
        .reminder(
            spec(
                "Europe/London",
                Schedule::cron("30 1 * * *").unwrap(),
                all_day(),
            ),
            utc("2026-10-24T12:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-10-26T12:00:00Z")).await;
    assert_eq!(
        times(&got),
        vec![utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")]
    );
    assert_eq!(w.runs(r.id).await.len(), 2);
}

#[actix_rt::test]
async fn due_at_0400_with_a_06_18_window_is_dispatched_at_0600() {
    let w = World::new(utc("2026-05-10T00:00:00Z")).await;
    let r = w
        .reminder(
            spec(
                "UTC",
                Schedule::once("2026-05-10T04:00").unwrap(),
                WindowHours::default(),
            ),
            utc("2026-05-10T00:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-10T05:59:59Z")).await;
    assert!(got.lock().unwrap().is_empty());
    assert!(w.runs(r.id).await.is_empty());
    w.run_until(utc("2026-05-10T07:00:00Z")).await;
    assert_eq!(times(&got), vec![utc("2026-05-10T06:00:00Z")]);
    // The run keeps the occurrence as its key; lag counts from the opening.
    assert_eq!(
        w.runs(r.id).await[0].scheduled_for,
        utc("2026-05-10T04:00:00Z")
    );
    assert_eq!(w.metrics.lags.lock().unwrap().len(), 1);
    assert!(w.metrics.lags.lock().unwrap()[0] < Duration::from_millis(2));
}

#[actix_rt::test]
async fn cross_midnight_window_dispatches_at_2200_and_inside_it_on_time() {
    let w = World::new(utc("2026-05-10T12:00:00Z")).await;
    let night = WindowHours::parse(22, 6).unwrap();
    let evening = w
        .reminder(
            spec("UTC", Schedule::cron("0 20 * * *").unwrap(), night),
            utc("2026-05-10T12:00:00Z"),
        )
        .await;
    let small_hours = w
        .reminder(
            spec("UTC", Schedule::cron("0 2 * * *").unwrap(), night),
            utc("2026-05-10T12:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-11T12:00:00Z")).await;
    assert_eq!(
        times(&got),
        vec![utc("2026-05-10T22:00:00Z"), utc("2026-05-11T02:00:00Z")]
    );
    assert_eq!(
        w.runs(evening.id).await[0].scheduled_for,
        utc("2026-05-10T20:00:00Z")
    );
    assert_eq!(
        w.runs(small_hours.id).await[0].scheduled_for,
        utc("2026-05-11T02:00:00Z")
    );
}

#[actix_rt::test]
async fn start_up_after_downtime_records_each_missed_once_and_dispatches_none() {
    // Daily 09:00 UTC, created on the 1st, fired on the 1st, then down until the 5th at noon.
    let w = World::new(utc("2026-05-05T12:00:00Z")).await;
    let r = w
        .reminder(
            spec("UTC", Schedule::cron("0 9 * * *").unwrap(), all_day()),
            utc("2026-05-01T00:00:00Z"),
        )
        .await;
    let account = AccountId::parse("sales").unwrap();
    w.store
        .create_run(
            r.id,
            &account,
            utc("2026-05-01T09:00:00Z"),
            RunStatus::Success,
            None,
            utc("2026-05-01T09:00:00Z"),
        )
        .await
        .unwrap();
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let s = start_scheduler(&w, dispatch.clone(), SchedulerConfig::default());
    w.run_until(utc("2026-05-05T12:01:00Z")).await;
    assert!(got.lock().unwrap().is_empty());
    let runs = w.runs(r.id).await;
    let missed: Vec<_> = runs
        .iter()
        .filter(|r| r.status == RunStatus::Missed)
        .collect();
    assert_eq!(
        missed.iter().map(|r| r.scheduled_for).collect::<Vec<_>>(),
        vec![
            utc("2026-05-02T09:00:00Z"),
            utc("2026-05-03T09:00:00Z"),
            utc("2026-05-04T09:00:00Z"),
            utc("2026-05-05T09:00:00Z")
        ]
    );
    let summary = missed[3].error_summary.as_deref().unwrap();
    assert_eq!(
        summary,
        "MISSED_WINDOW: due 09:00 UTC, picked up 3 hours late; not sent"
    );
    assert!(missed[0]
        .error_summary
        .as_deref()
        .unwrap()
        .starts_with("MISSED_WINDOW: due 2026-05-02 09:00 UTC"));
    assert_eq!(w.metrics.missed.load(Ordering::SeqCst), 4);
    assert_eq!(
        w.event_kinds()
            .await
            .iter()
            .filter(|k| *k == "run_missed")
            .count(),
        4
    );
    // The next occurrence is scheduled, and fires on time.
    assert_eq!(
        s.send(NextDue { reminder_id: r.id })
            .await
            .unwrap()
            .unwrap()
            .occurrence,
        utc("2026-05-06T09:00:00Z")
    );
    w.run_until(utc("2026-05-06T10:00:00Z")).await;
    assert_eq!(times(&got), vec![utc("2026-05-06T09:00:00Z")]);
    // A second scheduler starting on the same store records nothing again.
    let (dispatch2, got2) = collector::<RunDue>(w.clock.clone());
    let _s2 = start_scheduler(&w, dispatch2, SchedulerConfig::default());
    w.run_until(utc("2026-05-06T10:01:00Z")).await;
    assert!(got2.lock().unwrap().is_empty());
    assert_eq!(w.runs(r.id).await.len(), 1 + 4 + 1);
}

#[actix_rt::test]
async fn a_minutely_cron_after_a_week_down_writes_at_most_the_cap() {
    let w = World::new(utc("2026-05-08T00:00:30Z")).await;
    let r = w
        .reminder(
            spec("UTC", Schedule::cron("* * * * *").unwrap(), all_day()),
            utc("2026-05-01T00:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-08T00:00:31Z")).await;
    let runs = w.runs(r.id).await;
    assert_eq!(
        runs.iter()
            .filter(|r| r.status == RunStatus::Missed)
            .count(),
        100
    );
    // The five within grace are still sent.
    assert_eq!(got.lock().unwrap().len(), 5);
    let events = w.store.events_after(0, 0).await.unwrap();
    let skipped: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "missed_runs_skipped")
        .collect();
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].data["count"], 10_080 - 105);
    assert_eq!(w.metrics.missed.load(Ordering::SeqCst), 10_080 - 5);
}

#[actix_rt::test]
async fn no_double_fire_across_a_restart() {
    let w = World::new(utc("2026-05-10T08:00:00Z")).await;
    let r = w
        .reminder(
            spec("UTC", Schedule::cron("0 9 * * *").unwrap(), all_day()),
            utc("2026-05-10T08:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let first = start_scheduler(&w, dispatch.clone(), SchedulerConfig::default());
    w.run_until(utc("2026-05-10T09:00:10Z")).await;
    assert_eq!(got.lock().unwrap().len(), 1);
    first.send(Shutdown).await.unwrap();
    // A new scheduler within the grace period must not fire 09:00 again.
    let second = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-10T09:10:00Z")).await;
    assert_eq!(got.lock().unwrap().len(), 1);
    assert_eq!(w.runs(r.id).await.len(), 1);
    // It does take over the next one.
    w.run_until(utc("2026-05-11T09:00:10Z")).await;
    assert_eq!(
        times(&got),
        vec![utc("2026-05-10T09:00:00Z"), utc("2026-05-11T09:00:00Z")]
    );
    drop(second);
}

#[actix_rt::test]
async fn two_schedulers_on_one_store_dispatch_each_occurrence_once() {
    let w = World::new(utc("2026-05-10T08:00:00Z")).await;
    let mut ids = Vec::new();
    for cron in ["* * * * *", "*/2 * * * *", "0 9 * * *"] {
        ids.push(
            w.reminder(
                spec("UTC", Schedule::cron(cron).unwrap(), all_day()),
                utc("2026-05-10T08:00:00Z"),
            )
            .await
            .id,
        );
    }
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _a = start_scheduler(&w, dispatch.clone(), SchedulerConfig::default());
    let _b = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-10T09:00:30Z")).await;
    // 60 + 30 + 1 occurrences in (08:00, 09:00].
    let mut dispatched = run_ids(&got);
    assert_eq!(dispatched.len(), 91);
    dispatched.sort();
    dispatched.dedup();
    assert_eq!(dispatched.len(), 91);
    let mut total = 0;
    for id in ids {
        total += w.runs(id).await.len();
    }
    assert_eq!(total, 91);
}

#[actix_rt::test]
async fn reminder_changed_wakes_the_scheduler_early() {
    let w = World::new(utc("2026-05-10T08:00:00Z")).await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    // Reconcile only hourly: the ten-second fire must come from the wake-up.
    let s = start_scheduler(
        &w,
        dispatch,
        SchedulerConfig {
            reconcile_every: Duration::from_secs(3600),
            ..SchedulerConfig::default()
        },
    );
    w.run_until(utc("2026-05-10T08:00:05Z")).await;
    let r = w
        .reminder(
            spec(
                "UTC",
                Schedule::once("2026-05-10T08:00:15").unwrap(),
                all_day(),
            ),
            utc("2026-05-10T08:00:05Z"),
        )
        .await;
    s.send(ReminderChanged { reminder_id: r.id }).await.unwrap();
    w.run_until(utc("2026-05-10T08:00:20Z")).await;
    assert_eq!(times(&got), vec![utc("2026-05-10T08:00:15Z")]);
}

#[actix_rt::test]
async fn a_reminder_gone_from_a_batch_does_not_hold_back_the_others() {
    let w = World::new(utc("2026-05-10T08:00:00Z")).await;
    let gone_account = AccountId::parse("gone").unwrap();
    w.store
        .create_account(
            &NewAccount {
                id: gone_account.clone(),
                name: "Gone".into(),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits::default(),
            },
            utc("2026-05-10T08:00:00Z"),
        )
        .await
        .unwrap();
    let daily = || spec("UTC", Schedule::cron("0 9 * * *").unwrap(), all_day());
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(w.reminder(daily(), utc("2026-05-10T08:00:00Z")).await.id);
    }
    // Due in the same batch, after the others.
    let mut gone_spec = daily();
    gone_spec.account_id = gone_account.clone();
    let gone = w.reminder(gone_spec, utc("2026-05-10T08:00:00Z")).await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(
        &w,
        dispatch,
        SchedulerConfig {
            reconcile_every: Duration::from_secs(7200),
            ..SchedulerConfig::default()
        },
    );
    w.run_until(utc("2026-05-10T08:30:00Z")).await;
    // Deleted behind the scheduler's back: its batch fails as a whole.
    w.store
        .set_reminder_state(
            gone.id,
            ReminderState::Archived,
            utc("2026-05-10T08:30:00Z"),
        )
        .await
        .unwrap();
    w.store.delete_account(&gone_account).await.unwrap();
    w.run_until(utc("2026-05-10T09:00:10Z")).await;
    assert_eq!(
        times(&got),
        vec![utc("2026-05-10T09:00:00Z"); 5],
        "the others are dispatched, each once"
    );
    for id in ids {
        assert_eq!(w.runs(id).await.len(), 1);
    }
    assert!(w.runs(gone.id).await.is_empty());
    w.events.flush().await;
    let kinds = w.event_kinds().await;
    assert_eq!(kinds.iter().filter(|k| *k == "run_queued").count(), 5);
}

#[actix_rt::test]
async fn the_reconcile_pass_is_a_safety_net_for_a_lost_change() {
    let w = World::new(utc("2026-05-10T08:00:00Z")).await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-10T08:00:05Z")).await;
    // Created without telling the scheduler.
    w.reminder(
        spec(
            "UTC",
            Schedule::once("2026-05-10T08:00:10").unwrap(),
            all_day(),
        ),
        utc("2026-05-10T08:00:05Z"),
    )
    .await;
    w.run_until(utc("2026-05-10T08:01:00Z")).await;
    // Picked up by the reconcile at 08:00:30, within grace.
    assert_eq!(times(&got), vec![utc("2026-05-10T08:00:30Z")]);
}

#[test]
fn reconcile_reads_changes_and_every_tenth_pass_everything() {
    let mut st = SchedulerState::new(grace5());
    let r = reminder(
        1,
        spec("UTC", Schedule::cron("0 9 * * *").unwrap(), all_day()),
        utc("2026-05-01T00:00:00Z"),
    );
    assert_eq!(st.next_scan(), ScheduleScan::Active);
    st.apply_reconcile(
        Reconciled {
            active: Some(HashSet::from([1])),
            changed: vec![ReminderSchedule::of(&r, 7, None)],
            high_version: 7,
            deferred: vec![],
        },
        1,
    );
    assert!(st.next_of(1).is_some());
    assert_eq!(st.clean(), HashMap::from([(1, 7)]));
    // Incremental passes ask for what was written after the highest
    // version seen; a paused row among them unschedules its reminder.
    assert_eq!(st.next_scan(), ScheduleScan::ChangedAfter(7));
    let mut paused = ReminderSchedule::of(&r, 9, None);
    paused.state = ReminderState::Paused;
    st.apply_reconcile(
        Reconciled {
            changed: vec![paused],
            high_version: 9,
            ..Reconciled::default()
        },
        2,
    );
    assert_eq!(st.next_of(1), None);
    assert_eq!(st.next_scan(), ScheduleScan::ChangedAfter(9));
    // An incremental pass knows nothing of the others: it drops nothing.
    st.apply(ReminderSchedule::of(&r, 10, None), 3);
    for seq in 4..(2 + FULL_RECONCILE_EVERY) {
        assert!(matches!(st.next_scan(), ScheduleScan::ChangedAfter(_)));
        st.apply_reconcile(Reconciled::default(), seq);
    }
    assert!(st.next_of(1).is_some());
    // Every tenth pass reads the whole active set, and what is not in
    // it (a row deleted outright) is dropped.
    assert_eq!(st.next_scan(), ScheduleScan::Active);
    st.apply_reconcile(
        Reconciled {
            active: Some(HashSet::new()),
            ..Reconciled::default()
        },
        100,
    );
    assert_eq!(st.next_of(1), None);
}

#[actix_rt::test]
async fn an_incremental_reconcile_notices_a_pause_it_was_not_told_about() {
    let w = World::new(utc("2026-05-10T08:00:00Z")).await;
    let r = w
        .reminder(
            spec("UTC", Schedule::cron("0 9 * * *").unwrap(), all_day()),
            utc("2026-05-10T08:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-10T08:00:05Z")).await;
    assert!(s
        .send(NextDue { reminder_id: r.id })
        .await
        .unwrap()
        .is_some());
    // Paused behind the scheduler's back (no ReminderChanged); the
    // pass at 08:00:30 is incremental, not the start-up full one.
    w.store
        .set_reminder_state(r.id, ReminderState::Paused, utc("2026-05-10T08:00:10Z"))
        .await
        .unwrap();
    w.run_until(utc("2026-05-10T08:00:45Z")).await;
    assert_eq!(s.send(NextDue { reminder_id: r.id }).await.unwrap(), None);
    w.run_until(utc("2026-05-10T10:00:00Z")).await;
    assert!(times(&got).is_empty());
}

#[actix_rt::test]
async fn paused_reminders_are_not_scheduled_and_resume_without_backfill() {
    let w = World::new(utc("2026-05-10T08:00:00Z")).await;
    let r = w
        .reminder(
            spec("UTC", Schedule::cron("0 9 * * *").unwrap(), all_day()),
            utc("2026-05-10T08:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-10T08:30:00Z")).await;
    w.store
        .set_reminder_state(r.id, ReminderState::Paused, w.clock.now())
        .await
        .unwrap();
    s.send(ReminderChanged { reminder_id: r.id }).await.unwrap();
    w.run_until(utc("2026-05-12T12:00:00Z")).await;
    assert!(got.lock().unwrap().is_empty());
    assert!(w.runs(r.id).await.is_empty());
    w.store
        .set_reminder_state(r.id, ReminderState::Active, w.clock.now())
        .await
        .unwrap();
    s.send(ReminderChanged { reminder_id: r.id }).await.unwrap();
    w.run_until(utc("2026-05-13T10:00:00Z")).await;
    // Nothing recorded for the paused days; the 13th fires.
    assert_eq!(times(&got), vec![utc("2026-05-13T09:00:00Z")]);
    assert_eq!(w.runs(r.id).await.len(), 1);
}

#[actix_rt::test]
async fn fire_now_inside_the_window_dispatches_at_once() {
    let w = World::new(utc("2026-05-10T10:00:00.700Z")).await;
    let r = w
        .reminder(
            spec(
                "UTC",
                Schedule::cron("0 9 * * 1").unwrap(),
                WindowHours::default(),
            ),
            utc("2026-05-10T08:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    let run_id = s
        .send(FireNow { reminder_id: r.id })
        .await
        .unwrap()
        .unwrap();
    w.run_until(utc("2026-05-10T10:00:01Z")).await;
    assert_eq!(run_ids(&got), vec![run_id]);
    let run = w.store.get_run(run_id).await.unwrap().unwrap();
    assert_eq!(run.scheduled_for, utc("2026-05-10T10:00:00Z"));
    assert_eq!(run.status, RunStatus::Queued);
    // Refused for a paused or unknown reminder.
    w.store
        .set_reminder_state(r.id, ReminderState::Paused, w.clock.now())
        .await
        .unwrap();
    assert!(matches!(
        s.send(FireNow { reminder_id: r.id }).await.unwrap(),
        Err(FireNowError::NotActive { .. })
    ));
    assert_eq!(
        s.send(FireNow { reminder_id: 999 }).await.unwrap(),
        Err(FireNowError::NotFound(999))
    );
}

#[actix_rt::test]
async fn fire_now_outside_the_window_waits_for_the_opening() {
    let w = World::new(utc("2026-05-10T04:00:00Z")).await;
    let r = w
        .reminder(
            spec(
                "UTC",
                Schedule::cron("0 9 * * 1").unwrap(),
                WindowHours::default(),
            ),
            utc("2026-05-10T00:00:00Z"),
        )
        .await;
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let s = start_scheduler(&w, dispatch.clone(), SchedulerConfig::default());
    let run_id = s
        .send(FireNow { reminder_id: r.id })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        w.store.get_run(run_id).await.unwrap().unwrap().status,
        RunStatus::Scheduled
    );
    // Survives a restart: the new scheduler finds the scheduled run.
    s.send(Shutdown).await.unwrap();
    let _s2 = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-05-10T05:59:59Z")).await;
    assert!(got.lock().unwrap().is_empty());
    w.run_until(utc("2026-05-10T06:01:00Z")).await;
    assert_eq!(
        got.lock()
            .unwrap()
            .iter()
            .map(|(m, at)| (m.run_id, sec(*at)))
            .collect::<Vec<_>>(),
        vec![(run_id, utc("2026-05-10T06:00:00Z"))]
    );
    assert_eq!(
        w.store.get_run(run_id).await.unwrap().unwrap().status,
        RunStatus::Queued
    );
}

#[actix_rt::test]
async fn a_fire_the_store_refuses_is_told_and_retried_at_the_next_reconcile() {
    let w = World::new(utc("2026-11-30T00:00:00Z")).await;
    let r = w
        .reminder(
            spec(
                "UTC",
                Schedule::once("2026-11-30T09:00").unwrap(),
                WindowHours::default(),
            ),
            utc("2026-11-30T00:00:00Z"),
        )
        .await;
    // The batch and the one-by-one retry both fail.
    w.store.fail_next_run_creates(2);
    let (dispatch, got) = collector::<RunDue>(w.clock.clone());
    let _s = start_scheduler(&w, dispatch, SchedulerConfig::default());
    w.run_until(utc("2026-11-30T09:00:01Z")).await;
    assert!(w.runs(r.id).await.is_empty());
    let told: Vec<crate::domain::Event> = w
        .store
        .events_after(0, 0)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "reminder_failed_to_fire")
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].data["reminder_id"], r.id);
    assert!(
        told[0].data["error"].as_str().unwrap().contains("injected"),
        "{:?}",
        told[0].data
    );
    // The next reconcile fires it.
    w.run_until(utc("2026-11-30T10:00:00Z")).await;
    assert_eq!(w.runs(r.id).await.len(), 1);
    assert_eq!(run_ids(&got).len(), 1);
}
