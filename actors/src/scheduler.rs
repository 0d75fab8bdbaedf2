//! The SchedulerActor: turns reminders into runs at the right instant.
//!
//! It is event-driven. The next due time of every active reminder lives in
//! memory in a min-heap; one timer sleeps until the earliest; a
//! [`ReminderChanged`] reloads that reminder and re-arms the timer at once;
//! a slow reconcile pass (default every 30 s) reloads what changed behind
//! our back, as a safety net only. It reads only reminders written since
//! its last pass (the store's per-reminder version), and what the
//! scheduler needs of them (no parts, no targets); every
//! [`FULL_RECONCILE_EVERY`]th pass reads every active reminder's slim row,
//! to notice what an incremental read cannot (a row deleted outright, or on
//! PostgreSQL a write that committed after a later one was read).
//!
//! The logic is split so tests can drive it by hand:
//! - [`next_due`]: pure — the next occurrence and when it may be sent;
//! - [`SchedulerState`]: synchronous — `apply` loaded reminders, `due_now`
//!   pops what is due at an instant and decides fire / missed;
//! - [`fire`], [`fire_now`], [`load_reminder`], [`load_reconcile`]: async
//!   store work that holds no scheduler state across an `.await`;
//! - [`SchedulerActor`]: the timer loop gluing the three together.
//!
//! Firing is safe to repeat: `Store::create_run` (and `create_runs`, which
//! queues a burst due together in a few transactions) is idempotent on
//! (reminder, scheduled_for), and only the call that created the run
//! dispatches it. A restarted scheduler, or a second one on the same
//! database, therefore never sends an occurrence twice.
//!
//! Decisions where the design is silent:
//! - A reminder's cursor is its newest run's `scheduled_for` (else its
//!   `created_at`); occurrences whose send time is at or before the
//!   reminder's `updated_at` are dropped silently: they fell while it was
//!   paused or before an edit, and are not "missed" by us.
//! - Several occurrences outside the window before one opening (an hourly
//!   cron with a 06–18 window) coalesce into one run for the latest of them
//!   at the opening, rather than a burst of runs at 06:00.
//! - After downtime the most recent `missed_cap` missed occurrences are
//!   recorded (so the cursor lands on the newest), older ones are counted
//!   in one `missed_runs_skipped` event.
//! - A one-shot reminder keeps its state after firing; it simply has no
//!   next occurrence. Archiving is the operator's call.
//! - `FireNow` outside the window creates the run as `scheduled` at once
//!   (so the caller gets its id and it survives a restart) and queues it
//!   at the opening; if the reminder is no longer active by then, the run
//!   is cancelled.

use crate::domain::{
    AccountId, ReminderSchedule, ReminderState, Run, RunId, RunStatus, Schedule, TimeZone,
    WindowHours,
};
use crate::events::EventBus;
use crate::lifecycle::RunEvent;
use crate::messages::{ReminderChanged, RunDue};
use crate::ports::{
    sleep_until, Clock, Metrics, NewRun, Ports, RunFilter, RunUpdate, ScheduleScan, Store,
    StoreError, StoreResult,
};
use actix::prelude::*;
use chrono::{DateTime, Duration as ChronoDuration, Timelike, Utc};
use futures_util::StreamExt;
use serde_json::json;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Longest gap between two window openings (a day plus a DST hour), with a
/// margin: an occurrence this long before an instant is certainly due
/// before it, whatever the window.
const MAX_OPENING_GAP: ChronoDuration = ChronoDuration::hours(26);

/// How many missed occurrences one catch-up counts exactly before jumping
/// ahead (a minutely cron down for a year would otherwise walk 500k steps
/// on the actor's thread).
const MAX_CATCH_UP_SCAN: u64 = 100_000;

/// A 5-field cron fires at most 1,500 times across the longest closed
/// stretch of a window; enough to find the last one before an opening.
const MAX_COALESCE: usize = 2_000;

/// Fires in flight at once when many reminders are due together and
/// cannot be batched (missed, released, or a batch that failed).
const FIRE_CONCURRENCY: usize = 32;

/// Every this many reconcile passes (the first included), one reads every
/// active reminder rather than only those changed since the last pass.
pub const FULL_RECONCILE_EVERY: u64 = 10;

/// Runs queued per `Store::create_runs` call: a burst of ten thousand costs
/// ten transactions, and one batch still commits in milliseconds.
const FIRE_BATCH: usize = 1000;

// ---------------------------------------------------------------- config

/// The scheduler's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// A run picked up later than this after its send time is recorded as
    /// missed (MISSED_WINDOW) and never sent (seed 004).
    pub late_fire_grace: Duration,
    /// How often the safety-net reconcile pass reloads reminders.
    pub reconcile_every: Duration,
    /// Most missed runs recorded per reminder in one catch-up.
    pub missed_cap: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            late_fire_grace: Duration::from_secs(5 * 60),
            reconcile_every: Duration::from_secs(30),
            missed_cap: 100,
        }
    }
}

/// What the scheduler talks to.
#[derive(Clone)]
pub struct SchedulerPorts {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<dyn Metrics>,
    pub events: EventBus,
}

impl SchedulerPorts {
    pub fn from_ports(p: &Ports, events: EventBus) -> Self {
        Self {
            store: p.store.clone(),
            clock: p.clock.clone(),
            metrics: p.metrics.clone(),
            events,
        }
    }
}

// ---------------------------------------------------------------- pure

/// One occurrence of a reminder and when it may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// The schedule's instant: the run's `scheduled_for` (its firing lock).
    pub occurrence: DateTime<Utc>,
    /// The occurrence itself, or the window's opening if it falls outside
    /// the window. Late-fire grace counts from here.
    pub effective: DateTime<Utc>,
}

/// The first occurrence strictly after `after`, pushed to the window's
/// opening if it falls outside the window. Occurrences that fall before
/// the same opening coalesce into the latest of them.
pub fn next_due(
    schedule: &Schedule,
    tz: &TimeZone,
    window: &WindowHours,
    after: DateTime<Utc>,
) -> Option<Due> {
    let occurrence = schedule.next_after(tz, after)?;
    let span = window.span_at_or_after(tz, occurrence);
    if span.contains(occurrence) {
        return Some(Due {
            occurrence,
            effective: occurrence,
        });
    }
    let before_open = span.open - ChronoDuration::nanoseconds(1);
    let latest = schedule
        .occurrences(tz, occurrence, before_open, MAX_COALESCE)
        .last()
        .copied()
        .unwrap_or(occurrence);
    Some(Due {
        occurrence: latest,
        effective: span.open,
    })
}

/// The first due whose send time is after `floor`, looking after `cursor`.
fn first_due_after_floor(
    schedule: &Schedule,
    tz: &TimeZone,
    window: &WindowHours,
    cursor: DateTime<Utc>,
    floor: DateTime<Utc>,
) -> Option<Due> {
    // Occurrences this far before the floor were sendable before it.
    let mut cursor = cursor.max(floor - MAX_OPENING_GAP);
    loop {
        let due = next_due(schedule, tz, window, cursor)?;
        if due.effective > floor {
            return Some(due);
        }
        cursor = due.occurrence;
    }
}

/// "MISSED_WINDOW: due 09:00 Asia/Kuala_Lumpur, picked up 3 h 12 min late; not sent"
pub fn missed_summary(due: &Due, tz: &TimeZone, now: DateTime<Utc>) -> String {
    let local = |t: DateTime<Utc>| t.with_timezone(&tz.tz());
    let when = |t: DateTime<Utc>| {
        if local(t).date_naive() == local(now).date_naive() {
            local(t).format("%H:%M").to_string()
        } else {
            local(t).format("%Y-%m-%d %H:%M").to_string()
        }
    };
    let pushed = if due.effective != due.occurrence {
        format!(" (window opening; scheduled {})", when(due.occurrence))
    } else {
        String::new()
    };
    format!(
        "MISSED_WINDOW: due {} {tz}{pushed}, picked up {} late; not sent",
        when(due.effective),
        human_duration(now - due.effective)
    )
}

/// "3 h 12 min", "2 d 4 h", "45 s".
fn human_duration(d: ChronoDuration) -> String {
    let secs = d.num_seconds().max(0);
    let (days, hours, mins) = (secs / 86_400, secs % 86_400 / 3_600, secs % 3_600 / 60);
    match (days, hours, mins) {
        (0, 0, 0) => format!("{secs} s"),
        (0, 0, m) => format!("{m} min"),
        (0, h, 0) => format!("{h} h"),
        (0, h, m) => format!("{h} h {m} min"),
        (d, 0, _) => format!("{d} d"),
        (d, h, _) => format!("{d} d {h} h"),
    }
}

fn to_chrono(d: Duration) -> ChronoDuration {
    ChronoDuration::from_std(d).unwrap_or(ChronoDuration::MAX)
}

// ---------------------------------------------------------------- state

/// A `scheduled` run (from `FireNow` outside the window) waiting for the
/// window to open.
#[derive(Debug, Clone)]
pub struct DeferredRun {
    pub run_id: RunId,
    pub reminder_id: i64,
    pub account_id: AccountId,
    pub tz: TimeZone,
    pub due: Due,
}

impl DeferredRun {
    fn new(run: &Run, tz: TimeZone, window: &WindowHours) -> Self {
        let span = window.span_at_or_after(&tz, run.scheduled_for);
        let effective = if span.contains(run.scheduled_for) {
            run.scheduled_for
        } else {
            span.open
        };
        Self {
            run_id: run.id,
            reminder_id: run.reminder_id,
            account_id: run.account_id.clone(),
            tz,
            due: Due {
                occurrence: run.scheduled_for,
                effective,
            },
        }
    }
}

/// What to do about one due occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create the run as queued and dispatch it.
    Queue,
    /// Too late: create the run as missed, never dispatch it.
    Miss,
    /// Older missed occurrences beyond the cap: only an event says so.
    /// `due` is the newest of them.
    SkipMissed {
        count: u64,
        at_least: bool,
        /// How many newer missed runs were recorded.
        recorded: usize,
    },
    /// A `scheduled` run whose window opened: queue and dispatch it.
    Release(RunId),
    /// A `scheduled` run picked up too late after its window opened.
    ReleaseMissed(RunId),
}

/// One step for [`fire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    pub reminder_id: i64,
    pub account_id: AccountId,
    pub tz: TimeZone,
    pub due: Due,
    /// The reminder picks groups with a selector: the run's groups are
    /// frozen as soon as it is created (see [`freeze_selected`]).
    pub selects: bool,
    pub action: Action,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    Reminder(i64),
    Deferred(RunId),
}

struct Entry {
    version: u64,
    account_id: AccountId,
    tz: TimeZone,
    schedule: Schedule,
    window: WindowHours,
    /// The reminder has a target selector.
    selects: bool,
    /// The store's version of the reminder when it was loaded.
    store_version: i64,
    /// Occurrences at or before this are done (fired, missed or skipped).
    cursor: DateTime<Utc>,
    next: Option<Due>,
    /// A fire failed: reload from the store at the next reconcile.
    dirty: bool,
}

struct Deferred {
    version: u64,
    run: DeferredRun,
}

/// The scheduler's memory: next due time per reminder, deferred runs, and
/// a min-heap over both with lazy invalidation by version.
pub struct SchedulerState {
    config: SchedulerConfig,
    reminders: HashMap<i64, Entry>,
    deferred: HashMap<RunId, Deferred>,
    heap: BinaryHeap<Reverse<(DateTime<Utc>, Slot, u64)>>,
    next_version: u64,
    /// Newest load sequence applied per reminder, so a slow reconcile
    /// cannot overwrite what a later `ReminderChanged` loaded.
    applied_seq: HashMap<i64, u64>,
    /// The highest store version a reconcile has read: the next
    /// incremental pass reads what was written after it.
    seen_version: i64,
    /// Reconcile passes applied (full or not).
    passes: u64,
}

impl SchedulerState {
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            reminders: HashMap::new(),
            deferred: HashMap::new(),
            heap: BinaryHeap::new(),
            next_version: 0,
            applied_seq: HashMap::new(),
            seen_version: 0,
            passes: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    fn bump(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    /// True if a load started at `seq` may still change reminder `id`.
    fn accept(&mut self, id: i64, seq: u64) -> bool {
        let last = self.applied_seq.entry(id).or_insert(0);
        if seq < *last {
            return false;
        }
        *last = seq;
        true
    }

    /// Takes a freshly loaded reminder (loaded at sequence `seq`; use an
    /// increasing number per load, or 0 when driving by hand).
    pub fn apply(&mut self, r: ReminderSchedule, seq: u64) {
        if !self.accept(r.id, seq) {
            return;
        }
        if r.state != ReminderState::Active {
            self.reminders.remove(&r.id);
            return;
        }
        let cursor = r.last_scheduled_for.unwrap_or(r.created_at);
        let next = first_due_after_floor(&r.schedule, &r.timezone, &r.window, cursor, r.updated_at);
        let version = self.bump();
        if let Some(d) = next {
            self.heap
                .push(Reverse((d.effective, Slot::Reminder(r.id), version)));
        }
        self.reminders.insert(
            r.id,
            Entry {
                version,
                account_id: r.account_id,
                tz: r.timezone,
                schedule: r.schedule,
                window: r.window,
                selects: r.selects,
                store_version: r.version,
                cursor,
                next,
                dirty: false,
            },
        );
    }

    /// Forgets a reminder (deleted, paused or archived).
    pub fn remove(&mut self, reminder_id: i64, seq: u64) {
        if self.accept(reminder_id, seq) {
            self.reminders.remove(&reminder_id);
        }
    }

    /// Applies a reconcile pass: changed reminders, the full active set
    /// (on a full pass), and `scheduled` runs not yet known.
    pub fn apply_reconcile(&mut self, rec: Reconciled, seq: u64) {
        if let Some(active) = &rec.active {
            let gone: Vec<i64> = self
                .reminders
                .keys()
                .filter(|id| !active.contains(id))
                .copied()
                .collect();
            for id in gone {
                self.remove(id, seq);
            }
        }
        self.seen_version = self.seen_version.max(rec.high_version);
        self.passes += 1;
        for r in rec.changed {
            self.apply(r, seq);
        }
        for d in rec.deferred {
            self.defer(d);
        }
    }

    /// Waits for a `scheduled` run's window to open.
    pub fn defer(&mut self, run: DeferredRun) {
        if self.deferred.contains_key(&run.run_id) {
            return;
        }
        let version = self.bump();
        self.heap.push(Reverse((
            run.due.effective,
            Slot::Deferred(run.run_id),
            version,
        )));
        self.deferred.insert(run.run_id, Deferred { version, run });
    }

    /// Marks a reminder for reloading at the next reconcile (a fire failed).
    pub fn mark_dirty(&mut self, reminder_id: i64) {
        if let Some(e) = self.reminders.get_mut(&reminder_id) {
            e.dirty = true;
        }
    }

    /// The next due of a reminder, if it is scheduled.
    pub fn next_of(&self, reminder_id: i64) -> Option<Due> {
        self.reminders.get(&reminder_id).and_then(|e| e.next)
    }

    /// The store version of every reminder held in a clean state: what a
    /// full reconcile can skip reloading.
    pub fn clean(&self) -> HashMap<i64, i64> {
        self.reminders
            .iter()
            .filter(|(_, e)| !e.dirty)
            .map(|(id, e)| (*id, e.store_version))
            .collect()
    }

    /// Reminders whose fire failed: every reconcile reloads them.
    pub fn dirty(&self) -> Vec<i64> {
        self.reminders
            .iter()
            .filter(|(_, e)| e.dirty)
            .map(|(id, _)| *id)
            .collect()
    }

    /// What the next reconcile pass reads.
    pub fn next_scan(&self) -> ScheduleScan {
        if self.passes.is_multiple_of(FULL_RECONCILE_EVERY) {
            ScheduleScan::Active
        } else {
            ScheduleScan::ChangedAfter(self.seen_version)
        }
    }

    pub fn deferred_ids(&self) -> HashSet<RunId> {
        self.deferred.keys().copied().collect()
    }

    fn is_live(&self, slot: Slot, version: u64) -> bool {
        match slot {
            Slot::Reminder(id) => self
                .reminders
                .get(&id)
                .is_some_and(|e| e.version == version),
            Slot::Deferred(run) => self
                .deferred
                .get(&run)
                .is_some_and(|d| d.version == version),
        }
    }

    /// When the timer should next wake, if anything is scheduled.
    pub fn next_wake(&mut self) -> Option<DateTime<Utc>> {
        while let Some(Reverse((at, slot, version))) = self.heap.peek().copied() {
            if self.is_live(slot, version) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// Everything due at `now`, in the order to act on it, with the
    /// fire-or-missed decision made; advances each reminder to its next
    /// occurrence. Does no I/O.
    pub fn due_now(&mut self, now: DateTime<Utc>) -> Vec<Firing> {
        let mut out = Vec::new();
        while let Some(Reverse((at, slot, version))) = self.heap.peek().copied() {
            if at > now {
                break;
            }
            self.heap.pop();
            if !self.is_live(slot, version) {
                continue;
            }
            match slot {
                Slot::Reminder(id) => self.collect_reminder(id, now, &mut out),
                Slot::Deferred(run) => {
                    let d = self.deferred.remove(&run).expect("live").run;
                    let late = now - d.due.effective > to_chrono(self.config.late_fire_grace);
                    out.push(Firing {
                        reminder_id: d.reminder_id,
                        account_id: d.account_id,
                        tz: d.tz,
                        due: d.due,
                        // Frozen when FireNow created it.
                        selects: false,
                        action: if late {
                            Action::ReleaseMissed(run)
                        } else {
                            Action::Release(run)
                        },
                    });
                }
            }
        }
        out
    }

    /// Walks one reminder's dues up to `now`: late ones become missed (the
    /// newest `missed_cap` recorded, older ones counted), the rest fire.
    fn collect_reminder(&mut self, id: i64, now: DateTime<Utc>, out: &mut Vec<Firing>) {
        let grace = to_chrono(self.config.late_fire_grace);
        let cap = self.config.missed_cap;
        let e = self.reminders.get_mut(&id).expect("live");
        let Some(mut due) = e.next else { return };
        let mut missed: VecDeque<Due> = VecDeque::new();
        let mut skipped: u64 = 0;
        let mut newest_skipped = due;
        let mut jumped = false;
        let mut fires = Vec::new();
        let mut steps: u64 = 0;
        loop {
            if now - due.effective > grace {
                missed.push_back(due);
                if missed.len() > cap {
                    newest_skipped = missed.pop_front().expect("non-empty");
                    skipped += 1;
                }
            } else {
                fires.push(due);
            }
            e.cursor = due.occurrence;
            steps += 1;
            if steps >= MAX_CATCH_UP_SCAN && !jumped {
                // Everything this old is certainly missed; stop counting.
                jumped = true;
                e.cursor = e.cursor.max(now - grace - MAX_OPENING_GAP);
            }
            e.next = next_due(&e.schedule, &e.tz, &e.window, e.cursor);
            match e.next {
                Some(d) if d.effective <= now => due = d,
                _ => break,
            }
        }
        let version = self.next_version + 1;
        self.next_version = version;
        e.version = version;
        if let Some(d) = e.next {
            self.heap
                .push(Reverse((d.effective, Slot::Reminder(id), version)));
        }
        let firing = |due: Due, action: Action| Firing {
            reminder_id: id,
            account_id: e.account_id.clone(),
            tz: e.tz,
            due,
            selects: e.selects,
            action,
        };
        if skipped > 0 {
            out.push(firing(
                newest_skipped,
                Action::SkipMissed {
                    count: skipped,
                    at_least: jumped,
                    recorded: missed.len(),
                },
            ));
        }
        out.extend(missed.into_iter().map(|d| firing(d, Action::Miss)));
        out.extend(fires.into_iter().map(|d| firing(d, Action::Queue)));
    }
}

// ---------------------------------------------------------------- async steps

/// Loads what the scheduler needs of one reminder for
/// [`SchedulerState::apply`]; `None` if it is gone.
pub async fn load_reminder(store: &dyn Store, id: i64) -> StoreResult<Option<ReminderSchedule>> {
    store.get_reminder_schedule(id).await
}

/// What a reconcile pass found.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Every active reminder, on a full pass only.
    pub active: Option<HashSet<i64>>,
    /// Reminders that are new, changed or dirty (any state: a paused or
    /// archived one is dropped when applied).
    pub changed: Vec<ReminderSchedule>,
    /// The highest store version read.
    pub high_version: i64,
    /// `scheduled` runs not known yet.
    pub deferred: Vec<DeferredRun>,
}

/// Reads the reminders `scan` selects (skipping those in `clean` at the
/// same version) and reloads the `dirty` ones; finds `scheduled` runs not
/// in `known_deferred`.
pub async fn load_reconcile(
    store: &dyn Store,
    scan: ScheduleScan,
    clean: &HashMap<i64, i64>,
    dirty: &[i64],
    known_deferred: &HashSet<RunId>,
) -> StoreResult<Reconciled> {
    let mut rec = Reconciled::default();
    let rows = store.reminder_schedules(scan).await?;
    if scan == ScheduleScan::Active {
        rec.active = Some(rows.iter().map(|r| r.id).collect());
    }
    let mut by_id: HashMap<i64, (TimeZone, WindowHours)> = HashMap::new();
    for r in rows {
        rec.high_version = rec.high_version.max(r.version);
        by_id.insert(r.id, (r.timezone, r.window));
        if clean.get(&r.id) != Some(&r.version) || dirty.contains(&r.id) {
            rec.changed.push(r);
        }
    }
    for id in dirty {
        if by_id.contains_key(id) {
            continue;
        }
        if let Some(r) = store.get_reminder_schedule(*id).await? {
            by_id.insert(r.id, (r.timezone, r.window));
            rec.changed.push(r);
        }
    }
    let mut before_id = None;
    loop {
        let page = store
            .list_runs(&RunFilter {
                status: Some(RunStatus::Scheduled),
                before_id,
                limit: 500,
                ..RunFilter::default()
            })
            .await?;
        let Some(last) = page.last() else { break };
        before_id = Some(last.id.0);
        for run in &page {
            if known_deferred.contains(&run.id) {
                continue;
            }
            // A paused reminder's run is still loaded: it is cancelled at
            // its opening unless the reminder is active again by then.
            let (tz, window) = match by_id.get(&run.reminder_id) {
                Some(r) => *r,
                None => match store.get_reminder_schedule(run.reminder_id).await? {
                    Some(r) => (r.timezone, r.window),
                    None => continue,
                },
            };
            rec.deferred.push(DeferredRun::new(run, tz, &window));
        }
    }
    Ok(rec)
}

/// What [`fire`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// Created as queued and dispatched.
    Queued(RunId),
    /// Recorded as missed.
    Missed(RunId),
    /// Someone (a restart, another scheduler) already created this run.
    AlreadyFired(RunId),
    /// Only an event noted skipped missed occurrences.
    SkipNoted,
    /// A deferred run was no longer `scheduled` (cancelled meanwhile).
    NotScheduled(RunId),
    /// A deferred run's reminder is no longer active: run cancelled.
    Cancelled(RunId),
}

/// Carries out one [`Firing`] at `now` (the instant `due_now` used).
pub async fn fire(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    f: &Firing,
    now: DateTime<Utc>,
) -> StoreResult<Fired> {
    let store = &*ports.store;
    let data = |extra| firing_data(f, extra);
    match &f.action {
        Action::Queue => {
            let c = store
                .create_run(
                    f.reminder_id,
                    &f.account_id,
                    f.due.occurrence,
                    RunStatus::Queued,
                    None,
                    now,
                )
                .await?;
            if !c.created {
                return Ok(Fired::AlreadyFired(c.run.id));
            }
            if f.selects {
                freeze_selected(store, f.reminder_id, c.run.id).await;
            }
            queued(ports, dispatch, f, c.run.id, now, data(json!({}))).await;
            Ok(Fired::Queued(c.run.id))
        }
        Action::Miss => {
            let summary = missed_summary(&f.due, &f.tz, now);
            let c = store
                .create_run(
                    f.reminder_id,
                    &f.account_id,
                    f.due.occurrence,
                    RunStatus::Missed,
                    Some(&summary),
                    now,
                )
                .await?;
            if !c.created {
                return Ok(Fired::AlreadyFired(c.run.id));
            }
            missed(ports, f, c.run.id, &summary, data(json!({}))).await;
            Ok(Fired::Missed(c.run.id))
        }
        Action::SkipMissed {
            count,
            at_least,
            recorded,
        } => {
            for _ in 0..*count {
                ports.metrics.run_missed();
            }
            let more = if *at_least { "more than " } else { "" };
            let message = format!(
                "MISSED_WINDOW: {more}{count} older missed occurrences (the last due {}) were not recorded; only the newest {recorded} were; none sent",
                local_text(f.due.occurrence, &f.tz),
            );
            tracing::warn!(reminder_id = f.reminder_id, count, "{message}");
            ports
                .events
                .emit(
                    "missed_runs_skipped",
                    Some(&f.account_id),
                    None,
                    data(json!({"count": count, "at_least": at_least, "message": message})),
                )
                .await;
            Ok(Fired::SkipNoted)
        }
        Action::Release(run_id) | Action::ReleaseMissed(run_id) => {
            let run_id = *run_id;
            // Cancelled or started by someone else meanwhile: leave it.
            match store.get_run(run_id).await? {
                Some(run) if run.status == RunStatus::Scheduled => {}
                _ => return Ok(Fired::NotScheduled(run_id)),
            }
            let active = store
                .get_reminder(f.reminder_id)
                .await?
                .is_some_and(|r| r.state == ReminderState::Active);
            if !active {
                let dropped = store
                    .update_run(
                        run_id,
                        &RunUpdate {
                            finished_at: Some(now),
                            error_summary: Some(
                                "reminder was paused or archived before its window opened; not sent"
                                    .into(),
                            ),
                            ..RunEvent::Drop(RunStatus::Cancelled).update()
                        },
                    )
                    .await;
                return match dropped {
                    Ok(()) => Ok(Fired::Cancelled(run_id)),
                    Err(StoreError::Conflict(_)) => Ok(Fired::NotScheduled(run_id)),
                    Err(e) => Err(e),
                };
            }
            if matches!(f.action, Action::ReleaseMissed(_)) {
                let summary = missed_summary(&f.due, &f.tz, now);
                let dropped = store
                    .update_run(
                        run_id,
                        &RunUpdate {
                            finished_at: Some(now),
                            error_summary: Some(summary.clone()),
                            ..RunEvent::Drop(RunStatus::Missed).update()
                        },
                    )
                    .await;
                match dropped {
                    Ok(()) => {}
                    Err(StoreError::Conflict(_)) => return Ok(Fired::NotScheduled(run_id)),
                    Err(e) => return Err(e),
                }
                missed(ports, f, run_id, &summary, data(json!({}))).await;
                return Ok(Fired::Missed(run_id));
            }
            match store.update_run(run_id, &RunEvent::Release.update()).await {
                Ok(()) => {}
                // Stopped by the operator since we read it.
                Err(StoreError::Conflict(_)) => return Ok(Fired::NotScheduled(run_id)),
                Err(e) => return Err(e),
            }
            queued(ports, dispatch, f, run_id, now, data(json!({}))).await;
            Ok(Fired::Queued(run_id))
        }
    }
}

/// Resolves a selector reminder's groups the moment its run is created,
/// so a sync or a label change while the run waits in its account's queue
/// or for its window cannot change which groups it sends to. Should this
/// fail, the run's first start resolves them instead; nothing is lost.
async fn freeze_selected(store: &dyn Store, reminder_id: i64, run: RunId) {
    match store.get_reminder(reminder_id).await {
        Ok(Some(r)) => freeze_spec(store, reminder_id, run, &r.spec).await,
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, run_id = %run, reminder_id, "could not freeze the run's groups now; its first start will")
        }
    }
}

/// [`freeze_selected`] with the reminder already read.
async fn freeze_spec(
    store: &dyn Store,
    reminder_id: i64,
    run: RunId,
    spec: &crate::domain::NewReminder,
) {
    let frozen = crate::preflight::freeze_targets(store, run, spec)
        .await
        .map(|t| t.len());
    match frozen {
        Ok(groups) => tracing::debug!(run_id = %run, reminder_id, groups, "run's groups frozen"),
        Err(e) => {
            tracing::warn!(error = %e, run_id = %run, reminder_id, "could not freeze the run's groups now; its first start will")
        }
    }
}

/// An event's data about a firing, with `extra`'s fields added.
fn firing_data(f: &Firing, extra: serde_json::Value) -> serde_json::Value {
    let mut v = json!({
        "reminder_id": f.reminder_id,
        "scheduled_for": f.due.occurrence,
        "due_at": f.due.effective,
    });
    if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
        v.extend(extra);
    }
    v
}

/// Carries out firings one at a time, `FIRE_CONCURRENCY` in flight; the
/// reminders that could not fire are added to `failed`.
async fn fire_each(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    firings: &[Firing],
    now: DateTime<Utc>,
    failed: &RefCell<Vec<i64>>,
) {
    // Occurrences of different reminders are independent and each fire is
    // idempotent: overlap their store round trips.
    futures_util::stream::iter(firings)
        .for_each_concurrent(FIRE_CONCURRENCY, |f| async move {
            if let Err(e) = fire(ports, dispatch, f, now).await {
                tracing::error!(error = %e, reminder_id = f.reminder_id, "could not fire; retrying at the next reconcile");
                failed.borrow_mut().push(f.reminder_id);
            }
        })
        .await;
}

/// Carries out [`Action::Queue`] firings with one `Store::create_runs`
/// call, then dispatches each run it created as [`fire`] does. If the batch
/// fails (say one reminder was deleted meanwhile) nothing was written, and
/// the firings are retried one by one so the others still go out.
async fn fire_queue_batch(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    batch: &[Firing],
    now: DateTime<Utc>,
    failed: &RefCell<Vec<i64>>,
) {
    let runs: Vec<NewRun> = batch
        .iter()
        .map(|f| NewRun {
            reminder_id: f.reminder_id,
            account_id: f.account_id.clone(),
            scheduled_for: f.due.occurrence,
            status: RunStatus::Queued,
            error_summary: None,
        })
        .collect();
    let created = ports.store.create_runs(&runs, now).await.and_then(|c| {
        if c.len() == runs.len() {
            Ok(c)
        } else {
            Err(StoreError::Backend(format!(
                "create_runs answered {} of {} runs",
                c.len(),
                runs.len()
            )))
        }
    });
    match created {
        Ok(created) => {
            let fresh: Vec<(&Firing, RunId)> = batch
                .iter()
                .zip(created)
                .filter(|(_, c)| c.created)
                .map(|(f, c)| (f, c.run.id))
                .collect();
            futures_util::stream::iter(fresh.iter().filter(|(f, _)| f.selects))
                .for_each_concurrent(FIRE_CONCURRENCY, |(f, run)| {
                    freeze_selected(&*ports.store, f.reminder_id, *run)
                })
                .await;
            for (f, run) in fresh {
                queued(ports, dispatch, f, run, now, firing_data(f, json!({}))).await;
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, firings = batch.len(), "could not fire a batch; firing one by one");
            fire_each(ports, dispatch, batch, now, failed).await;
        }
    }
}

fn local_text(t: DateTime<Utc>, tz: &TimeZone) -> String {
    format!(
        "{} {tz}",
        t.with_timezone(&tz.tz()).format("%Y-%m-%d %H:%M")
    )
}

async fn queued(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    f: &Firing,
    run_id: RunId,
    now: DateTime<Utc>,
    data: serde_json::Value,
) {
    dispatch.do_send(RunDue {
        run_id,
        account_id: f.account_id.clone(),
    });
    let lag = (now - f.due.effective).to_std().unwrap_or_default();
    ports.metrics.fire_lag(lag);
    tracing::info!(run_id = %run_id, reminder_id = f.reminder_id, account_id = %f.account_id, lag_ms = lag.as_millis() as u64, "run queued");
    ports
        .events
        .emit("run_queued", Some(&f.account_id), Some(run_id), data)
        .await;
}

async fn missed(
    ports: &SchedulerPorts,
    f: &Firing,
    run_id: RunId,
    summary: &str,
    mut data: serde_json::Value,
) {
    ports.metrics.run_missed();
    tracing::warn!(run_id = %run_id, reminder_id = f.reminder_id, account_id = %f.account_id, "{summary}");
    if let Some(o) = data.as_object_mut() {
        o.insert("error_summary".into(), json!(summary));
    }
    ports
        .events
        .emit("run_missed", Some(&f.account_id), Some(run_id), data)
        .await;
}

/// Why `FireNow` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FireNowError {
    #[error("reminder {0} not found")]
    NotFound(i64),
    #[error("reminder {id} is {state}; only an active reminder can fire")]
    NotActive { id: i64, state: ReminderState },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// For callers whose message to the actor was not delivered.
    #[error("the scheduler is not running")]
    Unavailable,
}

impl From<MailboxError> for FireNowError {
    fn from(_: MailboxError) -> Self {
        Self::Unavailable
    }
}

/// What `FireNow` did.
#[derive(Debug, Clone)]
pub enum FireNowOutcome {
    /// Inside the window: queued and dispatched (or it already existed).
    Queued(RunId),
    /// Outside the window: created as `scheduled`, waiting for the opening.
    Deferred(DeferredRun),
}

impl FireNowOutcome {
    pub fn run_id(&self) -> RunId {
        match self {
            Self::Queued(id) => *id,
            Self::Deferred(d) => d.run_id,
        }
    }
}

/// Creates a run for `now` (to the second), subject to the window.
pub async fn fire_now(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    reminder_id: i64,
    now: DateTime<Utc>,
) -> Result<FireNowOutcome, FireNowError> {
    let store = &*ports.store;
    let r = store
        .get_reminder(reminder_id)
        .await?
        .ok_or(FireNowError::NotFound(reminder_id))?;
    if r.state != ReminderState::Active {
        return Err(FireNowError::NotActive {
            id: reminder_id,
            state: r.state,
        });
    }
    let at = now.with_nanosecond(0).unwrap_or(now);
    let tz = r.spec.timezone;
    let span = r.spec.window.span_at_or_after(&tz, at);
    let inside = span.contains(at);
    let status = if inside {
        RunStatus::Queued
    } else {
        RunStatus::Scheduled
    };
    let c = store
        .create_run(reminder_id, &r.spec.account_id, at, status, None, now)
        .await?;
    if c.created && r.spec.select.is_some() {
        // Also a run waiting for its window: its groups are those of now.
        freeze_spec(store, reminder_id, c.run.id, &r.spec).await;
    }
    let f = Firing {
        reminder_id,
        account_id: r.spec.account_id.clone(),
        tz,
        due: Due {
            occurrence: at,
            effective: if inside { at } else { span.open },
        },
        selects: false,
        action: Action::Queue,
    };
    let data = json!({
        "reminder_id": reminder_id,
        "scheduled_for": at,
        "due_at": f.due.effective,
        "fire_now": true,
    });
    if inside || c.run.status != RunStatus::Scheduled {
        if c.created {
            queued(ports, dispatch, &f, c.run.id, now, data).await;
        }
        return Ok(FireNowOutcome::Queued(c.run.id));
    }
    if c.created {
        ports
            .events
            .emit("run_scheduled", Some(&f.account_id), Some(c.run.id), data)
            .await;
    }
    Ok(FireNowOutcome::Deferred(DeferredRun::new(
        &c.run,
        tz,
        &r.spec.window,
    )))
}

// ---------------------------------------------------------------- actor

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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::{
        AccountLimits, AccountState, GatewayKind, GroupJid, MessagePart, NewReminder, Reminder,
    };
    use crate::memstore::MemoryStore;
    use crate::ports::{NewAccount, TokioClock};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

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
        // Hourly with a 06–18 UTC window: 18:00 (the close is exclusive)
        // through 05:00 wait for 06:00 as one run, for 05:00.
        let s = Schedule::cron("0 * * * *").unwrap();
        let w = WindowHours::default();
        let d = next_due(&s, &tz("UTC"), &w, utc("2026-05-10T17:30:00Z")).unwrap();
        assert_eq!(
            d,
            Due {
                occurrence: utc("2026-05-11T05:00:00Z"),
                effective: utc("2026-05-11T06:00:00Z"),
            }
        );
        // And the next one is 06:00 itself, inside the window.
        let d = next_due(&s, &tz("UTC"), &w, d.occurrence).unwrap();
        assert_eq!(d.effective, utc("2026-05-11T06:00:00Z"));
        assert_eq!(d.occurrence, d.effective);
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
            "MISSED_WINDOW: due 09:00 Asia/Kuala_Lumpur, picked up 3 h 12 min late; not sent"
        );
        let pushed = Due {
            occurrence: utc("2026-05-10T20:00:00Z"),
            effective: utc("2026-05-10T22:00:00Z"),
        };
        assert_eq!(
            missed_summary(&pushed, &tz("Asia/Kuala_Lumpur"), utc("2026-05-12T23:00:00Z")),
            "MISSED_WINDOW: due 2026-05-11 06:00 Asia/Kuala_Lumpur (window opening; scheduled 2026-05-11 04:00), picked up 2 d 1 h late; not sent"
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
            "MISSED_WINDOW: due 09:00 UTC, picked up 3 h late; not sent"
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
}
