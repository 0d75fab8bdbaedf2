//! The scheduler's synchronous state: every active reminder's next due
//! time in a heap, applied loads, and the fire / missed decision at an
//! instant. Holds nothing across an `.await`.

use super::config::{SchedulerConfig, FULL_RECONCILE_EVERY, MAX_CATCH_UP_SCAN, MAX_OPENING_GAP};
use super::due::{first_due_after_floor, next_due, to_chrono, Due};
use crate::domain::{
    AccountId, ReminderSchedule, ReminderState, Run, RunId, Schedule, TimeZone, WindowHours,
};
use crate::ports::ScheduleScan;
use chrono::{DateTime, Utc};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

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
    pub(super) fn new(run: &Run, tz: TimeZone, window: &WindowHours) -> Self {
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

pub(crate) struct Deferred {
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
