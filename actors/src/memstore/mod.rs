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
//!
//! Imports: `domain`, `ports` (the store traits it implements) and
//! `lifecycle`.

use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

mod accounts;
mod amend;
mod events;
mod groups;
mod leases;
mod polls;
mod receipts;
mod reminders;
mod runs;
mod sessions;
mod users;
mod webhooks;

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
    user_lookup_faults: std::sync::atomic::AtomicU32,
    /// The same for `create_run` and `create_runs`.
    run_create_faults: std::sync::atomic::AtomicU32,
    /// The same for `count_receipts`.
    receipt_faults: std::sync::atomic::AtomicU32,
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
    leases: BTreeMap<AccountId, crate::domain::Lease>,
    /// Console sessions, by id hash.
    console_sessions: HashMap<String, ConsoleSession>,
    /// API users, by id.
    users: BTreeMap<i64, ApiUser>,
    last_user_id: i64,
    /// The audit log, by id.
    audit: BTreeMap<i64, AuditEntry>,
    last_audit_id: i64,
    /// Webhook subscriptions and their deliveries, by id.
    webhooks: BTreeMap<i64, Webhook>,
    last_webhook_id: i64,
    deliveries: BTreeMap<i64, MemDelivery>,
    last_delivery_id: i64,
    last_reminder_id: i64,
    last_run_id: i64,
    last_target_id: i64,
    /// Receipt key of a message id sent → target id (a target's earlier
    /// parts stay here: a receipt is checked against the target's current
    /// id when read, as the SQL store's lookup checks it).
    wire_index: HashMap<String, i64>,
    /// Target id → its receipts so far.
    receipts: HashMap<i64, TargetTally>,
    /// Runs whose receipts were reported.
    receipts_reported: std::collections::HashSet<i64>,
    /// (run id, part) → the poll as sent.
    polls: BTreeMap<(i64, u32), RunPoll>,
    /// Receipt key of a poll message → (target id, part).
    poll_keys: HashMap<String, (i64, u32)>,
    /// (target id, part) → voter token → (choices, cast at).
    votes: HashMap<(i64, u32), Voters>,
    /// Recalls and edits, by id.
    amendments: BTreeMap<i64, AmendRecord>,
    last_amendment_id: i64,
}

/// One poll's voters in one group: token → (choices, cast at).
type Voters = HashMap<String, (u16, DateTime<Utc>)>;

/// A recall or an edit and its marks by target id.
struct AmendRecord {
    a: Amendment,
    account: AccountId,
    marks: HashMap<i64, (AmendState, DateTime<Utc>)>,
}

/// A webhook delivery and who holds its claim until when.
struct MemDelivery {
    d: WebhookDelivery,
    claimed_by: Option<String>,
    claimed_until: Option<DateTime<Utc>>,
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

    /// Makes the next `n` `create_run`/`create_runs` calls fail with a
    /// backend error, writing nothing.
    pub fn fail_next_run_creates(&self, n: u32) {
        self.run_create_faults
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// One injected fault of `faults`, if any is left.
    pub(super) fn injected(faults: &std::sync::atomic::AtomicU32) -> StoreResult<()> {
        use std::sync::atomic::Ordering::SeqCst;
        match faults.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)) {
            Ok(_) => Err(StoreError::Backend("injected: database is locked".into())),
            Err(_) => Ok(()),
        }
    }

    /// Makes the next `n` `count_receipts` calls fail with a backend
    /// error, counting nothing.
    pub fn fail_next_receipt_counts(&self, n: u32) {
        self.receipt_faults
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the next `n` `sync_groups` calls fail with a backend error,
    /// writing nothing.
    pub fn fail_next_group_syncs(&self, n: u32) {
        self.sync_faults
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the next `n` `user_by_token` calls fail with a backend
    /// error (a database that cannot answer who a token is).
    pub fn fail_next_user_lookups(&self, n: u32) {
        self.user_lookup_faults
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
    fn check_fences(&self, fences: &[crate::domain::Fence], now: DateTime<Utc>) -> StoreResult<()> {
        match fences.iter().find(|f| {
            !self
                .leases
                .get(&f.account)
                .is_some_and(|l| l.is_held_by(f, now))
        }) {
            Some(f) => Err(StoreError::fenced(f)),
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
                event: None,
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
        RunCreated {
            run,
            created: true,
            event: None,
        }
    }

    fn remove_run(&mut self, id: i64) {
        if let Some(rec) = self.runs.remove(&id) {
            self.receipts_reported.remove(&id);
            self.amendments.retain(|_, a| a.a.run_id.0 != id);
            for t in &rec.targets {
                self.target_index.remove(&t.id);
                self.receipts.remove(&t.id);
            }
            self.forget_polls(id, rec.targets.iter().map(|t| t.id));
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
impl StoreBase for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.lock().map(drop)
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
