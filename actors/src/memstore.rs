//! [`MemoryStore`]: the [`Store`] kept in process memory.
//!
//! `herald simulate` runs the real engine on paused tokio time; a database's
//! I/O waits would let virtual time jump while a write is in flight, so the
//! planner needs a store whose futures never wait on anything. Actor tests
//! use it for the same reason. It keeps the SQL store's semantics: every call
//! is atomic (all checks happen before the first write), `create_run` is the
//! firing lock, and the same conflicts and validation errors come back.
//!
//! One `std::sync::Mutex` guards everything and is only held inside the
//! synchronous body of a call, never across an `.await`.

use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

/// An in-memory [`Store`] with the SQL store's behaviour.
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// What lease and node expiry is read on (the database's clock, for
    /// the SQL store); the system clock when not given.
    clock: Option<std::sync::Arc<dyn Clock>>,
    /// The next this many `apply_transitions` calls fail as a busy
    /// database would (for the writer's tests).
    transition_faults: std::sync::atomic::AtomicU32,
    /// The same for `sync_groups`.
    sync_faults: std::sync::atomic::AtomicU32,
}

#[derive(Default)]
struct Inner {
    accounts: BTreeMap<AccountId, Account>,
    media: HashMap<MediaId, MediaInfo>,
    handles: HashMap<(AccountId, MediaId), UploadHandle>,
    reminders: BTreeMap<i64, Reminder>,
    runs: BTreeMap<i64, RunRecord>,
    /// reminder id → scheduled_for → run id: the firing lock, and the
    /// answer to `last_scheduled_for` without a scan.
    runs_by_reminder: HashMap<i64, BTreeMap<DateTime<Utc>, i64>>,
    /// target id → (run id, position): transitions find their row in O(1).
    target_index: HashMap<i64, (i64, usize)>,
    events: BTreeMap<i64, Event>,
    last_event_id: i64,
    events_pruned_through: i64,
    /// reminder id → version, bumped from `last_version` on every write.
    versions: HashMap<i64, i64>,
    last_version: i64,
    /// account → JID → group: the directory, in JID order for paging.
    groups: HashMap<AccountId, BTreeMap<GroupJid, Group>>,
    group_syncs: HashMap<AccountId, DateTime<Utc>>,
    /// Live daemons, by node id (several daemons on one store).
    nodes: BTreeMap<String, NodeRow>,
    /// Account leases, by account.
    leases: BTreeMap<AccountId, crate::lease::Lease>,
    last_reminder_id: i64,
    last_run_id: i64,
    last_target_id: i64,
}

struct NodeRow {
    instance: String,
    control_url: Option<String>,
    expires_at: DateTime<Utc>,
}

/// A run and its targets; `targets[i].position == i`. `run.counts` is kept
/// in step with the targets' statuses on every change.
struct RunRecord {
    run: Run,
    targets: Vec<RunTarget>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store whose leases expire on `clock` (virtual time in simulations).
    pub fn with_clock(clock: std::sync::Arc<dyn Clock>) -> Self {
        Self {
            clock: Some(clock),
            ..Self::default()
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.as_ref().map_or_else(Utc::now, |c| c.now())
    }

    /// Makes the next `n` `apply_transitions` calls fail with a backend
    /// error, writing nothing.
    pub fn fail_next_transitions(&self, n: u32) {
        self.transition_faults
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the next `n` `sync_groups` calls fail with a backend error,
    /// writing nothing.
    pub fn fail_next_group_syncs(&self, n: u32) {
        self.sync_faults
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    fn lock(&self) -> StoreResult<MutexGuard<'_, Inner>> {
        // A panic inside a call could only happen before its first write
        // (checks come first), but refuse to guess: report it as a backend fault.
        self.inner
            .lock()
            .map_err(|_| StoreError::Backend("memory store poisoned by a panic".into()))
    }
}

impl Inner {
    /// Refuses unless every fence is its account's current, unexpired lease.
    fn check_fences(&self, fences: &[crate::lease::Fence], now: DateTime<Utc>) -> StoreResult<()> {
        match fences.iter().find(|f| {
            !self
                .leases
                .get(&f.account)
                .is_some_and(|l| l.is_held_by(f, now))
        }) {
            Some(f) => Err(f.refused()),
            None => Ok(()),
        }
    }
}

fn ttl_after(now: DateTime<Utc>, ttl: std::time::Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX)
}

/// `limit == 0` means no limit.
fn take_limit(limit: u32) -> usize {
    if limit == 0 {
        usize::MAX
    } else {
        limit as usize
    }
}

fn count_of(c: &mut TargetCounts, s: TargetStatus) -> &mut u32 {
    match s {
        TargetStatus::Pending => &mut c.pending,
        TargetStatus::Sending => &mut c.sending,
        TargetStatus::Sent => &mut c.sent,
        TargetStatus::Failed => &mut c.failed,
        TargetStatus::Skipped => &mut c.skipped,
    }
}

/// Runs still under way: what crash resume and the sweep read.
fn unfinished(s: RunStatus) -> bool {
    matches!(
        s,
        RunStatus::Queued | RunStatus::Running | RunStatus::Paused | RunStatus::Parked
    )
}

/// A run that will still send refuses edits to its reminder: it sends
/// what the reminder said when it fired.
fn blocks_edit(s: RunStatus) -> bool {
    s == RunStatus::Scheduled || unfinished(s)
}

impl Inner {
    /// Records a write of reminder `id` (the SQL store's `version` column).
    fn touch(&mut self, id: i64) {
        self.last_version += 1;
        self.versions.insert(id, self.last_version);
    }

    fn schedule_of(&self, r: &Reminder) -> ReminderSchedule {
        let last = self
            .runs_by_reminder
            .get(&r.id)
            .and_then(|m| m.keys().next_back().copied());
        ReminderSchedule::of(r, self.versions.get(&r.id).copied().unwrap_or(0), last)
    }

    fn account_mut(&mut self, id: &AccountId) -> StoreResult<&mut Account> {
        self.accounts
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(format!("account {id}")))
    }

    /// The checks a reminder's references must pass, naming the field.
    fn validate_reminder(&self, r: &NewReminder) -> StoreResult<()> {
        if !self.accounts.contains_key(&r.account_id) {
            return Err(ValidationError::new(
                "account_id",
                format!("no account '{}'", r.account_id),
            )
            .into());
        }
        for (i, part) in r.parts.iter().enumerate() {
            if let Some(m) = part.media_id() {
                if !self.media.contains_key(m) {
                    return Err(ValidationError::new(
                        format!("parts[{i}].media"),
                        format!("no media {m}: upload it first"),
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    fn run_ids_of_reminder(&self, reminder_id: i64) -> impl Iterator<Item = i64> + '_ {
        self.runs_by_reminder
            .get(&reminder_id)
            .into_iter()
            .flat_map(|m| m.values().copied())
    }

    fn run_at(&self, reminder_id: i64, scheduled_for: DateTime<Utc>) -> Option<i64> {
        self.runs_by_reminder
            .get(&reminder_id)
            .and_then(|m| m.get(&scheduled_for))
            .copied()
    }

    /// What `create_run` refuses; an occurrence that exists is never refused.
    fn check_new_run(
        &self,
        reminder_id: i64,
        account: &AccountId,
        scheduled_for: DateTime<Utc>,
    ) -> StoreResult<()> {
        if self.run_at(reminder_id, scheduled_for).is_some() {
            return Ok(());
        }
        if !self.reminders.contains_key(&reminder_id) {
            return Err(StoreError::NotFound(format!("reminder {reminder_id}")));
        }
        if !self.accounts.contains_key(account) {
            return Err(StoreError::NotFound(format!("account {account}")));
        }
        Ok(())
    }

    /// The firing lock, after `check_new_run` passed.
    fn insert_run(
        &mut self,
        reminder_id: i64,
        account: &AccountId,
        scheduled_for: DateTime<Utc>,
        status: RunStatus,
        error_summary: Option<&str>,
        now: DateTime<Utc>,
    ) -> RunCreated {
        if let Some(id) = self.run_at(reminder_id, scheduled_for) {
            return RunCreated {
                run: self.runs[&id].run.clone(),
                created: false,
            };
        }
        self.last_run_id += 1;
        let run = Run {
            id: RunId(self.last_run_id),
            reminder_id,
            account_id: account.clone(),
            scheduled_for,
            window_end_at: None,
            status,
            forecast: None,
            error_summary: error_summary.map(str::to_owned),
            counts: TargetCounts::default(),
            created_at: now,
            started_at: None,
            finished_at: None,
            stop_requested_at: None,
        };
        self.runs_by_reminder
            .entry(reminder_id)
            .or_default()
            .insert(scheduled_for, run.id.0);
        self.runs.insert(
            run.id.0,
            RunRecord {
                run: run.clone(),
                targets: Vec::new(),
            },
        );
        RunCreated { run, created: true }
    }

    fn remove_run(&mut self, id: i64) {
        if let Some(rec) = self.runs.remove(&id) {
            for t in &rec.targets {
                self.target_index.remove(&t.id);
            }
            if let Some(m) = self.runs_by_reminder.get_mut(&rec.run.reminder_id) {
                m.remove(&rec.run.scheduled_for);
                if m.is_empty() {
                    self.runs_by_reminder.remove(&rec.run.reminder_id);
                }
            }
        }
    }
}

impl RunRecord {
    fn apply(&mut self, pos: usize, t: &Transition) {
        let target = &mut self.targets[pos];
        let before = target.status;
        if !t.allowed_from().contains(&before) {
            return;
        }
        match t {
            Transition::Sending { message_id, .. } => {
                target.status = TargetStatus::Sending;
                target.message_id = Some(message_id.clone());
                target.attempts += 1;
            }
            Transition::Sent {
                part,
                last,
                at,
                latency_ms,
                ..
            } => {
                target.parts_sent = part + 1;
                target.status = if *last {
                    TargetStatus::Sent
                } else {
                    TargetStatus::Pending
                };
                target.sent_at = Some(*at);
                target.latency_ms = Some(*latency_ms);
            }
            Transition::Failed { error, .. } => {
                target.status = TargetStatus::Failed;
                target.error = Some(error.clone());
            }
            Transition::Skipped { reason, .. } => {
                target.status = TargetStatus::Skipped;
                target.error = Some(reason.clone());
            }
            Transition::Requeue { .. } => {
                // A group whose last message may have arrived goes back as
                // `sending`: its resend reuses the id, and if it is skipped
                // again it still says so.
                let maybe = target
                    .error
                    .as_deref()
                    .is_some_and(|e| e.ends_with(crate::lifecycle::MAYBE_DELIVERED));
                target.status = if maybe {
                    TargetStatus::Sending
                } else {
                    TargetStatus::Pending
                };
                target.error = None;
            }
        }
        let after = target.status;
        if before != after {
            *count_of(&mut self.run.counts, before) -= 1;
            *count_of(&mut self.run.counts, after) += 1;
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.lock().map(drop)
    }

    // ------------------------------------------------------------ accounts

    async fn create_account(&self, a: &NewAccount, now: DateTime<Utc>) -> StoreResult<Account> {
        let mut g = self.lock()?;
        if g.accounts.contains_key(&a.id) {
            return Err(StoreError::Conflict(format!(
                "account {} already exists",
                a.id
            )));
        }
        let account = Account {
            id: a.id.clone(),
            name: a.name.clone(),
            kind: a.kind,
            state: a.state,
            state_reason: None,
            state_until: None,
            limits: a.limits.clone(),
            created_at: now,
            incident_at: None,
        };
        g.accounts.insert(a.id.clone(), account.clone());
        Ok(account)
    }

    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        Ok(self.lock()?.accounts.get(id).cloned())
    }

    async fn list_accounts(&self) -> StoreResult<Vec<Account>> {
        Ok(self.lock()?.accounts.values().cloned().collect())
    }

    async fn list_accounts_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<Account>> {
        let g = self.lock()?;
        Ok(g.accounts
            .values()
            .filter(|a| after.is_none_or(|after| a.id.as_str() > after))
            .take(take_limit(limit))
            .cloned()
            .collect())
    }

    async fn update_account_limits(
        &self,
        id: &AccountId,
        limits: &AccountLimits,
    ) -> StoreResult<Account> {
        let mut g = self.lock()?;
        let a = g.account_mut(id)?;
        a.limits = limits.clone();
        Ok(a.clone())
    }

    async fn set_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
    ) -> StoreResult<Account> {
        self.set_account_state_until(id, state, reason, None).await
    }

    async fn set_account_state_until(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
    ) -> StoreResult<Account> {
        let mut g = self.lock()?;
        let a = g.account_mut(id)?;
        a.state = state;
        a.state_reason = reason.map(str::to_owned);
        a.state_until = until;
        Ok(a.clone())
    }

    async fn record_incident(&self, id: &AccountId, at: DateTime<Utc>) -> StoreResult<()> {
        let mut g = self.lock()?;
        g.account_mut(id)?.incident_at = Some(at);
        Ok(())
    }

    async fn delete_account(&self, id: &AccountId) -> StoreResult<()> {
        let mut g = self.lock()?;
        if !g.accounts.contains_key(id) {
            return Err(StoreError::NotFound(format!("account {id}")));
        }
        let live = g
            .reminders
            .values()
            .filter(|r| &r.spec.account_id == id && r.state != ReminderState::Archived)
            .count();
        if live > 0 {
            return Err(StoreError::Conflict(format!(
                "account {id} has {live} reminder(s) that are not archived"
            )));
        }
        // Archived reminders, their runs, the account's upload handles and
        // its lease go with it, as the SQL schema's cascading foreign keys do.
        g.leases.remove(id);
        let reminders: Vec<i64> = g
            .reminders
            .values()
            .filter(|r| &r.spec.account_id == id)
            .map(|r| r.id)
            .collect();
        let mut runs: Vec<i64> = reminders
            .iter()
            .flat_map(|r| g.run_ids_of_reminder(*r).collect::<Vec<_>>())
            .collect();
        runs.extend(
            g.runs
                .values()
                .filter(|r| &r.run.account_id == id)
                .map(|r| r.run.id.0),
        );
        for run in runs {
            g.remove_run(run);
        }
        for r in reminders {
            g.reminders.remove(&r);
        }
        g.handles.retain(|(a, _), _| a != id);
        g.groups.remove(id);
        g.group_syncs.remove(id);
        g.accounts.remove(id);
        Ok(())
    }

    // ------------------------------------------------------------ media

    async fn put_media(&self, m: &MediaInfo) -> StoreResult<MediaInfo> {
        let mut g = self.lock()?;
        Ok(g.media
            .entry(m.id.clone())
            .or_insert_with(|| m.clone())
            .clone())
    }

    async fn get_media(&self, id: &MediaId) -> StoreResult<Option<MediaInfo>> {
        Ok(self.lock()?.media.get(id).cloned())
    }

    async fn get_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
    ) -> StoreResult<Option<UploadHandle>> {
        Ok(self
            .lock()?
            .handles
            .get(&(account.clone(), media.clone()))
            .cloned())
    }

    async fn put_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
        h: &UploadHandle,
    ) -> StoreResult<()> {
        let mut g = self.lock()?;
        if !g.accounts.contains_key(account) {
            return Err(StoreError::NotFound(format!("account {account}")));
        }
        if !g.media.contains_key(media) {
            return Err(StoreError::NotFound(format!("media {media}")));
        }
        g.handles
            .insert((account.clone(), media.clone()), h.clone());
        Ok(())
    }

    // ------------------------------------------------------------ reminders

    async fn create_reminder(&self, r: &NewReminder, now: DateTime<Utc>) -> StoreResult<Reminder> {
        let mut g = self.lock()?;
        g.validate_reminder(r)?;
        g.last_reminder_id += 1;
        let reminder = Reminder {
            id: g.last_reminder_id,
            state: ReminderState::Active,
            spec: r.clone(),
            created_at: now,
            updated_at: now,
        };
        g.reminders.insert(reminder.id, reminder.clone());
        g.touch(reminder.id);
        Ok(reminder)
    }

    async fn get_reminder(&self, id: i64) -> StoreResult<Option<Reminder>> {
        Ok(self.lock()?.reminders.get(&id).cloned())
    }

    async fn list_reminders(&self, f: &ReminderFilter) -> StoreResult<Vec<Reminder>> {
        let g = self.lock()?;
        Ok(g.reminders
            .values()
            .filter(|r| {
                f.account_id
                    .as_ref()
                    .is_none_or(|a| &r.spec.account_id == a)
            })
            .filter(|r| f.state.is_none_or(|s| r.state == s))
            .cloned()
            .collect())
    }

    async fn update_reminder(
        &self,
        id: i64,
        r: &NewReminder,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        let mut g = self.lock()?;
        if !g.reminders.contains_key(&id) {
            return Err(StoreError::NotFound(format!("reminder {id}")));
        }
        g.validate_reminder(r)?;
        let busy = g
            .run_ids_of_reminder(id)
            .find(|run| blocks_edit(g.runs[run].run.status));
        if let Some(run) = busy {
            let status = g.runs[&run].run.status;
            return Err(StoreError::Conflict(format!(
                "reminder {id} cannot change while run {run} is {status}"
            )));
        }
        g.touch(id);
        let reminder = g.reminders.get_mut(&id).expect("checked above");
        reminder.spec = r.clone();
        reminder.updated_at = now;
        Ok(reminder.clone())
    }

    async fn set_reminder_state(
        &self,
        id: i64,
        state: ReminderState,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        let mut g = self.lock()?;
        let reminder = g
            .reminders
            .get_mut(&id)
            .ok_or_else(|| StoreError::NotFound(format!("reminder {id}")))?;
        reminder.state = state;
        reminder.updated_at = now;
        let out = reminder.clone();
        g.touch(id);
        Ok(out)
    }

    async fn list_reminder_summaries(&self, p: &ReminderPage) -> StoreResult<Vec<ReminderSummary>> {
        let g = self.lock()?;
        let f = &p.filter;
        let after = p.after_id.unwrap_or(i64::MIN);
        Ok(g.reminders
            .range(after.saturating_add(1)..)
            .map(|(_, r)| r)
            .filter(|r| {
                f.account_id
                    .as_ref()
                    .is_none_or(|a| &r.spec.account_id == a)
            })
            .filter(|r| f.state.is_none_or(|s| r.state == s))
            .take(take_limit(p.limit))
            .map(ReminderSummary::of)
            .collect())
    }

    async fn reminder_schedules(&self, scan: ScheduleScan) -> StoreResult<Vec<ReminderSchedule>> {
        let g = self.lock()?;
        let mut out: Vec<ReminderSchedule> = g
            .reminders
            .values()
            .filter(|r| match scan {
                ScheduleScan::Active => r.state == ReminderState::Active,
                ScheduleScan::ChangedAfter(v) => g.versions.get(&r.id).is_some_and(|n| *n > v),
            })
            .map(|r| g.schedule_of(r))
            .collect();
        if let ScheduleScan::ChangedAfter(_) = scan {
            out.sort_by_key(|r| r.version);
        }
        Ok(out)
    }

    async fn get_reminder_schedule(&self, id: i64) -> StoreResult<Option<ReminderSchedule>> {
        let g = self.lock()?;
        Ok(g.reminders.get(&id).map(|r| g.schedule_of(r)))
    }

    // ------------------------------------------------------------ runs

    async fn create_run(
        &self,
        reminder_id: i64,
        account: &AccountId,
        scheduled_for: DateTime<Utc>,
        status: RunStatus,
        error_summary: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<RunCreated> {
        let mut g = self.lock()?;
        g.check_new_run(reminder_id, account, scheduled_for)?;
        Ok(g.insert_run(
            reminder_id,
            account,
            scheduled_for,
            status,
            error_summary,
            now,
        ))
    }

    async fn create_runs(
        &self,
        runs: &[NewRun],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<RunCreated>> {
        let mut g = self.lock()?;
        // Every check before the first insert: a refused batch writes nothing.
        for r in runs {
            g.check_new_run(r.reminder_id, &r.account_id, r.scheduled_for)?;
        }
        Ok(runs
            .iter()
            .map(|r| {
                g.insert_run(
                    r.reminder_id,
                    &r.account_id,
                    r.scheduled_for,
                    r.status,
                    r.error_summary.as_deref(),
                    now,
                )
            })
            .collect())
    }

    async fn create_chosen_targets(
        &self,
        run: RunId,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        let mut g = self.lock()?;
        let Inner {
            runs,
            target_index,
            last_target_id,
            ..
        } = &mut *g;
        let rec = runs
            .get_mut(&run.0)
            .ok_or_else(|| StoreError::NotFound(format!("run {run}")))?;
        // A run's groups are written once: a later call changes nothing.
        if !rec.targets.is_empty() {
            return Ok(());
        }
        let mut seen: HashSet<GroupJid> = HashSet::new();
        for (group, chosen_by) in groups {
            if !seen.insert(group.clone()) {
                continue;
            }
            *last_target_id += 1;
            let position = rec.targets.len();
            target_index.insert(*last_target_id, (run.0, position));
            rec.targets.push(RunTarget {
                id: *last_target_id,
                run_id: run,
                position: position as u32,
                group: group.clone(),
                status: TargetStatus::Pending,
                parts_sent: 0,
                message_id: None,
                attempts: 0,
                error: None,
                sent_at: None,
                latency_ms: None,
                chosen_by: chosen_by.clone(),
            });
            rec.run.counts.pending += 1;
        }
        Ok(())
    }

    async fn get_run(&self, id: RunId) -> StoreResult<Option<Run>> {
        Ok(self.lock()?.runs.get(&id.0).map(|r| r.run.clone()))
    }

    async fn list_runs(&self, f: &RunFilter) -> StoreResult<Vec<Run>> {
        let g = self.lock()?;
        let upper = f.before_id.unwrap_or(i64::MAX);
        Ok(g.runs
            .range(..upper)
            .rev()
            .map(|(_, r)| &r.run)
            .filter(|r| f.reminder_id.is_none_or(|id| r.reminder_id == id))
            .filter(|r| f.account_id.as_ref().is_none_or(|a| &r.account_id == a))
            .filter(|r| f.status.is_none_or(|s| r.status == s))
            .take(take_limit(f.limit))
            .cloned()
            .collect())
    }

    async fn update_run(&self, id: RunId, u: &RunUpdate) -> StoreResult<()> {
        check_update(u)?;
        let now = self.now();
        let mut g = self.lock()?;
        if let Some(f) = &u.fence {
            g.check_fences(std::slice::from_ref(f), now)?;
        }
        let rec = g
            .runs
            .get_mut(&id.0)
            .ok_or_else(|| StoreError::NotFound(format!("run {id}")))?;
        if !u.expect.is_empty() && !u.expect.contains(&rec.run.status) {
            return Err(cas_conflict(id, rec.run.status));
        }
        if u.requeue_unsent {
            for pos in 0..rec.targets.len() {
                let target_id = rec.targets[pos].id;
                rec.apply(pos, &Transition::Requeue { target_id });
            }
        }
        if let Some(reason) = &u.skip_open {
            for pos in 0..rec.targets.len() {
                let target_id = rec.targets[pos].id;
                let mut reason = reason.clone();
                if rec.targets[pos].status == TargetStatus::Sending {
                    reason.push_str(crate::lifecycle::MAYBE_DELIVERED);
                }
                rec.apply(pos, &Transition::Skipped { target_id, reason });
            }
        }
        let run = &mut rec.run;
        if let Some(s) = u.status {
            run.status = s;
        }
        if let Some(t) = u.window_end_at {
            run.window_end_at = Some(t);
        }
        if let Some(t) = u.started_at {
            run.started_at = Some(t);
        }
        if let Some(t) = u.finished_at {
            run.finished_at = Some(t);
        }
        if let Some(f) = &u.forecast {
            run.forecast = Some(f.clone());
        }
        if let Some(e) = &u.error_summary {
            run.error_summary = Some(e.clone());
        }
        if let Some(t) = u.stop_requested_at {
            run.stop_requested_at = Some(t);
        }
        if u.requeue_unsent {
            run.stop_requested_at = None;
        }
        Ok(())
    }

    async fn list_targets(
        &self,
        run: RunId,
        status: Option<TargetStatus>,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<RunTarget>> {
        let g = self.lock()?;
        let Some(rec) = g.runs.get(&run.0) else {
            return Ok(Vec::new());
        };
        let start = after_position.map_or(0, |p| p as usize + 1);
        Ok(rec
            .targets
            .get(start..)
            .unwrap_or_default()
            .iter()
            .filter(|t| status.is_none_or(|s| t.status == s))
            .take(take_limit(limit))
            .cloned()
            .collect())
    }

    async fn apply_transitions(&self, ts: &[Transition]) -> StoreResult<()> {
        self.apply_transitions_fenced(&[], ts).await
    }

    async fn apply_transitions_fenced(
        &self,
        fences: &[crate::lease::Fence],
        ts: &[Transition],
    ) -> StoreResult<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let faults = &self.transition_faults;
        if faults
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::Backend("injected: database is locked".into()));
        }
        let now = self.now();
        let mut g = self.lock()?;
        g.check_fences(fences, now)?;
        // Check every row first so a bad id writes nothing.
        if let Some(t) = ts
            .iter()
            .find(|t| !g.target_index.contains_key(&t.target_id()))
        {
            return Err(StoreError::NotFound(format!(
                "run target {}",
                t.target_id()
            )));
        }
        let Inner {
            runs, target_index, ..
        } = &mut *g;
        for t in ts {
            let (run, pos) = target_index[&t.target_id()];
            runs.get_mut(&run)
                .expect("indexed targets belong to a stored run")
                .apply(pos, t);
        }
        Ok(())
    }

    async fn unfinished_runs(&self) -> StoreResult<Vec<Run>> {
        let g = self.lock()?;
        Ok(g.runs
            .values()
            .map(|r| &r.run)
            .filter(|r| unfinished(r.status))
            .cloned()
            .collect())
    }

    async fn sent_since(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<(Option<DateTime<Utc>>, u32)>> {
        let g = self.lock()?;
        Ok(g.runs
            .values()
            .filter(|r| &r.run.account_id == account)
            .filter(|r| r.run.finished_at.is_none_or(|f| f >= since))
            .flat_map(|r| &r.targets)
            .filter_map(|t| {
                if t.status == TargetStatus::Sending {
                    Some((None, 1))
                } else {
                    t.sent_at
                        .filter(|at| *at >= since)
                        .map(|at| (Some(at), t.parts_sent))
                }
            })
            .collect())
    }

    async fn last_scheduled_for(&self, reminder_id: i64) -> StoreResult<Option<DateTime<Utc>>> {
        let g = self.lock()?;
        Ok(g.runs_by_reminder
            .get(&reminder_id)
            .and_then(|m| m.keys().next_back().copied()))
    }

    // ------------------------------------------------------------ events

    async fn append_event(&self, e: &NewEvent) -> StoreResult<Event> {
        let mut g = self.lock()?;
        g.last_event_id += 1;
        let event = Event {
            id: g.last_event_id,
            at: e.at,
            kind: e.kind.to_owned(),
            account_id: e.account_id.as_ref().map(|a| a.as_str().to_owned()),
            run_id: e.run_id.map(|r| r.0),
            data: e.data.clone(),
        };
        g.events.insert(event.id, event.clone());
        Ok(event)
    }

    async fn events_after(&self, after_id: i64, limit: u32) -> StoreResult<Vec<Event>> {
        let g = self.lock()?;
        Ok(g.events
            .range(after_id.saturating_add(1)..)
            .map(|(_, e)| e)
            .take(take_limit(limit))
            .cloned()
            .collect())
    }

    // ------------------------------------------------------------ retention

    async fn prune_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<PrunedRuns> {
        let mut g = self.lock()?;
        let limit = take_limit(limit) as u64;
        let newest: HashSet<i64> = g
            .runs_by_reminder
            .values()
            .filter_map(|m| m.values().next_back().copied())
            .collect();
        let prunable: Vec<i64> = g
            .runs
            .values()
            .filter(|r| {
                r.run.status.is_final()
                    && r.run.finished_at.unwrap_or(r.run.created_at) < before
                    && !newest.contains(&r.run.id.0)
            })
            .map(|r| r.run.id.0)
            .collect();
        let mut out = PrunedRuns::default();
        // Targets first, up to the limit, as the SQL store's batches go.
        for id in &prunable {
            if out.targets >= limit {
                break;
            }
            let rec = g.runs.get_mut(id).expect("listed above");
            let n = (rec.targets.len() as u64).min(limit - out.targets) as usize;
            let cut = rec.targets.len() - n;
            let gone: Vec<i64> = rec.targets.drain(cut..).map(|t| t.id).collect();
            out.targets += gone.len() as u64;
            for t in gone {
                g.target_index.remove(&t);
            }
        }
        for id in prunable {
            if out.runs >= limit {
                break;
            }
            if g.runs[&id].targets.is_empty() {
                g.remove_run(id);
                out.runs += 1;
            }
        }
        Ok(out)
    }

    async fn prune_events(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        let mut g = self.lock()?;
        let gone: Vec<i64> = g
            .events
            .values()
            .filter(|e| e.at < before)
            .take(take_limit(limit))
            .map(|e| e.id)
            .collect();
        for id in &gone {
            g.events.remove(id);
        }
        if let Some(max) = gone.iter().max() {
            g.events_pruned_through = g.events_pruned_through.max(*max);
        }
        Ok(gone.len() as u64)
    }

    async fn events_pruned_through(&self) -> StoreResult<i64> {
        Ok(self.lock()?.events_pruned_through)
    }

    async fn prune_media(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<MediaId>> {
        let mut g = self.lock()?;
        let used: HashSet<&MediaId> = g
            .reminders
            .values()
            .flat_map(|r| r.spec.parts.iter().filter_map(|p| p.media_id()))
            .collect();
        let mut gone: Vec<MediaId> = g
            .media
            .values()
            .filter(|m| m.created_at < before && !used.contains(&m.id))
            .map(|m| m.id.clone())
            .collect();
        gone.sort();
        gone.truncate(take_limit(limit));
        for id in &gone {
            g.media.remove(id);
        }
        g.handles.retain(|(_, m), _| !gone.contains(m));
        Ok(gone)
    }

    async fn sync_groups(
        &self,
        account: &AccountId,
        groups: &[GroupInfo],
        now: DateTime<Utc>,
    ) -> StoreResult<GroupSyncSummary> {
        use std::sync::atomic::Ordering::SeqCst;
        if self
            .sync_faults
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::Backend("injected: database is locked".into()));
        }
        let mut g = self.lock()?;
        g.account_mut(account)?;
        let dir = g.groups.entry(account.clone()).or_default();
        let mut summary = GroupSyncSummary::default();
        let listed: HashSet<&GroupJid> = groups.iter().map(|i| &i.jid).collect();
        for info in groups {
            match dir.get_mut(&info.jid) {
                Some(known) => {
                    if !known.member {
                        summary.added += 1;
                    } else if known.info != *info {
                        summary.updated += 1;
                    }
                    known.info = info.clone();
                    known.can_post = info.can_post();
                    known.member = true;
                    known.synced_at = now;
                }
                None => {
                    summary.added += 1;
                    dir.insert(
                        info.jid.clone(),
                        Group {
                            account_id: account.clone(),
                            info: info.clone(),
                            can_post: info.can_post(),
                            labels: Vec::new(),
                            member: true,
                            synced_at: now,
                        },
                    );
                }
            }
        }
        for known in dir.values_mut() {
            if known.member && !listed.contains(&known.info.jid) {
                known.member = false;
                known.synced_at = now;
                summary.left += 1;
            }
        }
        summary.total = dir.values().filter(|g| g.member).count() as u32;
        g.group_syncs.insert(account.clone(), now);
        Ok(summary)
    }

    async fn list_groups(&self, f: &GroupFilter) -> StoreResult<GroupPage> {
        let g = self.lock()?;
        if !g.accounts.contains_key(&f.account_id) {
            return Err(StoreError::NotFound(format!("account {}", f.account_id)));
        }
        let name = f.name.as_deref().map(fold_name);
        let matching = g
            .groups
            .get(&f.account_id)
            .into_iter()
            .flat_map(|dir| dir.values())
            .filter(|grp| f.include_left || grp.member)
            .filter(|grp| f.can_post.is_none_or(|c| grp.can_post == c))
            .filter(|grp| f.label.as_ref().is_none_or(|l| grp.labels.contains(l)))
            .filter(|grp| {
                name.as_deref()
                    .is_none_or(|n| fold_name(&grp.info.subject).contains(n))
            });
        let (mut items, mut total) = (Vec::new(), 0u64);
        for grp in matching {
            total += 1;
            if f.after.as_ref().is_none_or(|a| grp.info.jid > *a)
                && items.len() < take_limit(f.limit)
            {
                items.push(grp.clone());
            }
        }
        Ok(GroupPage { items, total })
    }

    async fn set_group_labels(
        &self,
        account: &AccountId,
        group: &GroupJid,
        labels: &[Label],
    ) -> StoreResult<Group> {
        let mut g = self.lock()?;
        let known = g
            .groups
            .get_mut(account)
            .and_then(|dir| dir.get_mut(group))
            .ok_or_else(|| StoreError::NotFound(format!("group {group} of account {account}")))?;
        let mut labels = labels.to_vec();
        labels.sort();
        labels.dedup();
        known.labels = labels;
        Ok(known.clone())
    }

    async fn groups_synced_at(&self, account: &AccountId) -> StoreResult<Option<DateTime<Utc>>> {
        let g = self.lock()?;
        if !g.accounts.contains_key(account) {
            return Err(StoreError::NotFound(format!("account {account}")));
        }
        Ok(g.group_syncs.get(account).copied())
    }

    // ------------------------------------------------------------ leases

    async fn node_heartbeat(
        &self,
        node: &str,
        instance: &str,
        control_url: Option<&str>,
        ttl: std::time::Duration,
    ) -> StoreResult<()> {
        let now = self.now();
        let mut g = self.lock()?;
        if let Some(row) = g.nodes.get(node) {
            if row.instance != instance && row.expires_at > now {
                return Err(StoreError::Conflict(format!(
                    "node id {node} is in use by another live daemon"
                )));
            }
        }
        g.nodes.insert(
            node.to_string(),
            NodeRow {
                instance: instance.to_string(),
                control_url: control_url.map(str::to_string),
                expires_at: ttl_after(now, ttl),
            },
        );
        Ok(())
    }

    async fn node_leave(&self, node: &str, instance: &str) -> StoreResult<()> {
        let mut g = self.lock()?;
        if g.nodes.get(node).is_some_and(|r| r.instance == instance) {
            g.nodes.remove(node);
        }
        Ok(())
    }

    async fn live_nodes(&self) -> StoreResult<Vec<crate::lease::NodeInfo>> {
        let now = self.now();
        let g = self.lock()?;
        Ok(g.nodes
            .iter()
            .filter(|(_, r)| r.expires_at > now)
            .map(|(node, r)| crate::lease::NodeInfo {
                node: node.clone(),
                control_url: r.control_url.clone(),
                expires_at: r.expires_at,
            })
            .collect())
    }

    async fn list_leases(&self) -> StoreResult<Vec<crate::lease::Lease>> {
        let now = self.now();
        let g = self.lock()?;
        Ok(g.leases
            .values()
            .map(|l| crate::lease::Lease {
                expired: l.expires_at <= now,
                ..l.clone()
            })
            .collect())
    }

    async fn acquire_lease(
        &self,
        account: &AccountId,
        node: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<Option<crate::lease::Lease>> {
        let now = self.now();
        let mut g = self.lock()?;
        if !g.accounts.contains_key(account) {
            return Err(StoreError::NotFound(format!("account {account}")));
        }
        let epoch = match g.leases.get(account) {
            None => 1,
            Some(l) if l.expires_at <= now => l.epoch + 1,
            Some(_) => return Ok(None),
        };
        let lease = crate::lease::Lease {
            account: account.clone(),
            node: node.to_string(),
            epoch,
            expires_at: ttl_after(now, ttl),
            expired: false,
        };
        g.leases.insert(account.clone(), lease.clone());
        Ok(Some(lease))
    }

    async fn renew_leases(
        &self,
        fences: &[crate::lease::Fence],
        ttl: std::time::Duration,
    ) -> StoreResult<Vec<bool>> {
        let now = self.now();
        let mut g = self.lock()?;
        Ok(fences
            .iter()
            .map(|f| match g.leases.get_mut(&f.account) {
                Some(l) if l.is_held_by(f, now) => {
                    l.expires_at = ttl_after(now, ttl);
                    true
                }
                _ => false,
            })
            .collect())
    }

    async fn release_lease(&self, fence: &crate::lease::Fence) -> StoreResult<()> {
        let now = self.now();
        let mut g = self.lock()?;
        if g.check_fences(std::slice::from_ref(fence), now).is_ok() {
            if let Some(l) = g.leases.get_mut(&fence.account) {
                l.expires_at = now;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The shared store contract covers the semantics; these cover what is
    //! particular to the memory store.

    use super::*;
    use futures_util::FutureExt;
    use proptest::prelude::*;
    use std::future::Future;
    use std::sync::Arc;

    #[tokio::test]
    async fn memory_store_meets_the_store_contract() {
        crate::testkit::store_contract::run_all(|| async {
            Arc::new(MemoryStore::new()) as Arc<dyn Store>
        })
        .await;
    }

    /// Completes a call on its first poll: on paused time a store that
    /// waited would let virtual time jump.
    fn now<T>(f: impl Future<Output = T>) -> T {
        f.now_or_never()
            .expect("a MemoryStore call completes without waiting")
    }

    fn t0() -> DateTime<Utc> {
        "2026-05-11T01:00:00Z".parse().unwrap()
    }

    fn group(i: u32) -> GroupJid {
        GroupJid::parse(&format!("120363{i:012}@g.us")).unwrap()
    }

    /// A store holding one running run with `n` targets.
    fn store_with_run(n: u32) -> (MemoryStore, RunId) {
        let s = MemoryStore::new();
        let account = AccountId::parse("sales").unwrap();
        now(s.create_account(
            &NewAccount {
                id: account.clone(),
                name: "Sales".into(),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits::default(),
            },
            t0(),
        ))
        .unwrap();
        let spec = NewReminder::new(
            account.clone(),
            "Standup",
            TimeZone::parse("UTC").unwrap(),
            Schedule::cron("0 9 * * 1").unwrap(),
            WindowHours::default(),
            false,
            vec![MessagePart::text("hello").unwrap()],
            (0..n).map(group).collect(),
        )
        .unwrap();
        let r = now(s.create_reminder(&spec, t0())).unwrap();
        let run = now(s.create_run(r.id, &account, t0(), RunStatus::Running, None, t0()))
            .unwrap()
            .run;
        now(s.create_targets(run.id, &spec.targets)).unwrap();
        (s, run.id)
    }

    #[test]
    fn a_runs_groups_are_written_once_each_group_once() {
        let (s, run) = store_with_run(3);
        let before = now(s.list_targets(run, None, None, 0)).unwrap();
        now(s.create_targets(run, &[group(9), group(1), group(9)])).unwrap();
        assert_eq!(now(s.list_targets(run, None, None, 0)).unwrap(), before);
        let (s, _) = store_with_run(1);
        let fresh = now(s.create_run(
            1,
            &AccountId::parse("sales").unwrap(),
            t0() + chrono::Duration::minutes(1),
            RunStatus::Running,
            None,
            t0(),
        ))
        .unwrap()
        .run;
        now(s.create_targets(fresh.id, &[group(9), group(1), group(9)])).unwrap();
        let got: Vec<_> = now(s.list_targets(fresh.id, None, None, 0))
            .unwrap()
            .into_iter()
            .map(|t| (t.position, t.group))
            .collect();
        assert_eq!(
            got,
            vec![(0, group(9)), (1, group(1))],
            "a repeat adds nothing"
        );
        assert_eq!(now(s.get_run(fresh.id)).unwrap().unwrap().counts.pending, 2);
    }

    fn transition() -> impl Strategy<Value = (usize, u8, u32, bool)> {
        (0usize..8, 0u8..5, 0u32..3, any::<bool>())
    }

    proptest! {
        /// Counts are kept incrementally; they must always equal a recount.
        #[test]
        fn counts_always_match_the_targets(
            steps in proptest::collection::vec(transition(), 0..80),
            batch in 1usize..6,
        ) {
            let (s, run) = store_with_run(8);
            let ids: Vec<i64> = now(s.list_targets(run, None, None, 0))
                .unwrap()
                .iter()
                .map(|t| t.id)
                .collect();
            let ts: Vec<Transition> = steps
                .iter()
                .map(|&(i, kind, part, last)| {
                    let target_id = ids[i];
                    match kind {
                        0 => Transition::Sending { target_id, part, message_id: format!("m{i}-{part}") },
                        1 => Transition::Sent { target_id, part, last, at: t0(), latency_ms: 100 },
                        2 => Transition::Failed { target_id, error: "failed".into() },
                        3 => Transition::Skipped { target_id, reason: "window".into() },
                        _ => Transition::Requeue { target_id },
                    }
                })
                .collect();
            for chunk in ts.chunks(batch) {
                now(s.apply_transitions(chunk)).unwrap();
            }
            let mut recount = TargetCounts::default();
            for t in now(s.list_targets(run, None, None, 0)).unwrap() {
                recount.add(t.status, 1);
            }
            let counts = now(s.get_run(run)).unwrap().unwrap().counts;
            prop_assert_eq!(counts, recount);
            prop_assert_eq!(counts.total(), 8);
        }
    }
}
