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
    events: Vec<Event>,
    last_reminder_id: i64,
    last_run_id: i64,
    last_target_id: i64,
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

    fn lock(&self) -> StoreResult<MutexGuard<'_, Inner>> {
        // A panic inside a call could only happen before its first write
        // (checks come first), but refuse to guess: report it as a backend fault.
        self.inner
            .lock()
            .map_err(|_| StoreError::Backend("memory store poisoned by a panic".into()))
    }
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

fn blocks_edit(s: RunStatus) -> bool {
    matches!(
        s,
        RunStatus::Queued | RunStatus::Running | RunStatus::Paused
    )
}

impl Inner {
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
                target.status = TargetStatus::Pending;
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
            limits: a.limits.clone(),
            created_at: now,
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
        let mut g = self.lock()?;
        let a = g.account_mut(id)?;
        a.state = state;
        a.state_reason = reason.map(str::to_owned);
        Ok(a.clone())
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
        // Archived reminders, their runs and the account's upload handles go
        // with it, as the SQL schema's cascading foreign keys do.
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
        Ok(reminder.clone())
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
        if let Some(run) = g
            .runs_by_reminder
            .get(&reminder_id)
            .and_then(|m| m.get(&scheduled_for))
        {
            return Ok(RunCreated {
                run: g.runs[run].run.clone(),
                created: false,
            });
        }
        if !g.reminders.contains_key(&reminder_id) {
            return Err(StoreError::NotFound(format!("reminder {reminder_id}")));
        }
        if !g.accounts.contains_key(account) {
            return Err(StoreError::NotFound(format!("account {account}")));
        }
        g.last_run_id += 1;
        let run = Run {
            id: RunId(g.last_run_id),
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
        };
        g.runs_by_reminder
            .entry(reminder_id)
            .or_default()
            .insert(scheduled_for, run.id.0);
        g.runs.insert(
            run.id.0,
            RunRecord {
                run: run.clone(),
                targets: Vec::new(),
            },
        );
        Ok(RunCreated { run, created: true })
    }

    async fn create_targets(&self, run: RunId, groups: &[GroupJid]) -> StoreResult<()> {
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
        // Idempotent per group: a group the run already has keeps its row;
        // new groups are appended after the existing ones, in the given order.
        let mut seen: HashSet<GroupJid> = rec.targets.iter().map(|t| t.group.clone()).collect();
        for group in groups {
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
        let mut g = self.lock()?;
        let run = &mut g
            .runs
            .get_mut(&id.0)
            .ok_or_else(|| StoreError::NotFound(format!("run {id}")))?
            .run;
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
        let mut g = self.lock()?;
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
            .filter(|r| blocks_edit(r.status))
            .cloned()
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
        let event = Event {
            id: g.events.len() as i64 + 1,
            at: e.at,
            kind: e.kind.to_owned(),
            account_id: e.account_id.as_ref().map(|a| a.as_str().to_owned()),
            run_id: e.run_id.map(|r| r.0),
            data: e.data.clone(),
        };
        g.events.push(event.clone());
        Ok(event)
    }

    async fn events_after(&self, after_id: i64, limit: u32) -> StoreResult<Vec<Event>> {
        let g = self.lock()?;
        // Ids are 1-based and dense, so event `id` sits at index `id - 1`.
        let start = usize::try_from(after_id.max(0))
            .unwrap_or(usize::MAX)
            .min(g.events.len());
        Ok(g.events[start..]
            .iter()
            .take(take_limit(limit))
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn t0() -> DateTime<Utc> {
        "2026-05-11T01:00:00Z".parse().unwrap()
    }

    fn acct(s: &str) -> AccountId {
        AccountId::parse(s).unwrap()
    }

    fn group(i: u32) -> GroupJid {
        GroupJid::parse(&format!("120363{i:012}@g.us")).unwrap()
    }

    fn media_info(bytes: &[u8]) -> MediaInfo {
        MediaInfo {
            id: MediaId::of_bytes(bytes),
            mime: "image/png".into(),
            size: bytes.len() as u64,
            filename: Some("pic.png".into()),
            created_at: t0(),
        }
    }

    fn reminder(account: &str, parts: Vec<MessagePart>, groups: u32) -> NewReminder {
        NewReminder::new(
            acct(account),
            "Standup",
            TimeZone::parse("Asia/Kuala_Lumpur").unwrap(),
            Schedule::cron("0 9 * * 1").unwrap(),
            WindowHours::default(),
            false,
            parts,
            (0..groups).map(group).collect(),
        )
        .unwrap()
    }

    fn text_reminder(account: &str) -> NewReminder {
        reminder(account, vec![MessagePart::text("hello").unwrap()], 3)
    }

    async fn store_with_account(id: &str) -> MemoryStore {
        let s = MemoryStore::new();
        s.create_account(
            &NewAccount {
                id: acct(id),
                name: "Sales".into(),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits::default(),
            },
            t0(),
        )
        .await
        .unwrap();
        s
    }

    /// A store with one account, one text reminder and one queued run of it
    /// with `groups` targets.
    async fn store_with_run(groups: u32) -> (MemoryStore, Run, Vec<RunTarget>) {
        let s = store_with_account("sales").await;
        let r = s
            .create_reminder(&text_reminder("sales"), t0())
            .await
            .unwrap();
        let run = s
            .create_run(r.id, &acct("sales"), t0(), RunStatus::Queued, None, t0())
            .await
            .unwrap()
            .run;
        let gs: Vec<_> = (0..groups).map(group).collect();
        s.create_targets(run.id, &gs).await.unwrap();
        let targets = s.list_targets(run.id, None, None, 0).await.unwrap();
        (s, run, targets)
    }

    #[tokio::test]
    async fn accounts_conflict_on_duplicate_id_and_update() {
        let s = store_with_account("sales").await;
        let again = s
            .create_account(
                &NewAccount {
                    id: acct("sales"),
                    name: "Other".into(),
                    kind: GatewayKind::Simulator,
                    state: AccountState::Pairing,
                    limits: AccountLimits::default(),
                },
                t0(),
            )
            .await;
        assert!(matches!(again, Err(StoreError::Conflict(_))));
        let limits = AccountLimits {
            max_per_minute: Some(20),
            ..Default::default()
        };
        let a = s
            .update_account_limits(&acct("sales"), &limits)
            .await
            .unwrap();
        assert_eq!(a.limits, limits);
        let a = s
            .set_account_state(&acct("sales"), AccountState::Banned, Some("temporary ban"))
            .await
            .unwrap();
        assert_eq!(a.state, AccountState::Banned);
        assert_eq!(a.state_reason.as_deref(), Some("temporary ban"));
        assert_eq!(s.get_account(&acct("sales")).await.unwrap(), Some(a));
        assert!(matches!(
            s.set_account_state(&acct("nobody"), AccountState::Connected, None)
                .await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn reminder_references_are_validated_by_field() {
        let s = store_with_account("sales").await;
        let err = s
            .create_reminder(&text_reminder("ghost"), t0())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Invalid(v) if v.field == "account_id"),
            "{err}"
        );

        let pic = media_info(b"picture");
        let parts = vec![
            MessagePart::text("see below").unwrap(),
            MessagePart::media(pic.id.clone(), Some("today")).unwrap(),
        ];
        let err = s
            .create_reminder(&reminder("sales", parts.clone(), 2), t0())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Invalid(v) if v.field == "parts[1].media"),
            "{err}"
        );
        assert!(s
            .list_reminders(&ReminderFilter::default())
            .await
            .unwrap()
            .is_empty());

        s.put_media(&pic).await.unwrap();
        let r = s
            .create_reminder(&reminder("sales", parts, 2), t0())
            .await
            .unwrap();
        assert_eq!(r.state, ReminderState::Active);
        // Updating to an unknown account is refused the same way, and changes nothing.
        let err = s
            .update_reminder(r.id, &text_reminder("ghost"), t0())
            .await
            .unwrap_err();
        assert!(matches!(&err, StoreError::Invalid(v) if v.field == "account_id"));
        assert_eq!(s.get_reminder(r.id).await.unwrap(), Some(r));
    }

    #[tokio::test]
    async fn put_media_is_idempotent() {
        let s = MemoryStore::new();
        let first = media_info(b"x");
        s.put_media(&first).await.unwrap();
        let mut second = first.clone();
        second.filename = Some("other.png".into());
        assert_eq!(s.put_media(&second).await.unwrap(), first);
        assert_eq!(s.get_media(&first.id).await.unwrap(), Some(first));
    }

    #[tokio::test]
    async fn create_run_is_the_firing_lock() {
        let s = store_with_account("sales").await;
        let r = s
            .create_reminder(&text_reminder("sales"), t0())
            .await
            .unwrap();
        let a = s
            .create_run(r.id, &acct("sales"), t0(), RunStatus::Queued, None, t0())
            .await
            .unwrap();
        assert!(a.created);
        let b = s
            .create_run(
                r.id,
                &acct("sales"),
                t0(),
                RunStatus::Missed,
                Some("MISSED_WINDOW"),
                t0(),
            )
            .await
            .unwrap();
        assert!(!b.created);
        assert_eq!(
            b.run, a.run,
            "the second caller sees the first run unchanged"
        );
        let later = t0() + Duration::days(7);
        let c = s
            .create_run(
                r.id,
                &acct("sales"),
                later,
                RunStatus::Missed,
                Some("MISSED_WINDOW"),
                t0(),
            )
            .await
            .unwrap();
        assert!(c.created);
        assert_eq!(c.run.error_summary.as_deref(), Some("MISSED_WINDOW"));
        assert_eq!(s.last_scheduled_for(r.id).await.unwrap(), Some(later));
        assert_eq!(s.last_scheduled_for(r.id + 1).await.unwrap(), None);
        assert!(matches!(
            s.create_run(99, &acct("sales"), t0(), RunStatus::Queued, None, t0())
                .await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn targets_are_ordered_idempotent_and_counted() {
        let (s, run, targets) = store_with_run(5).await;
        assert_eq!(targets.len(), 5);
        for (i, t) in targets.iter().enumerate() {
            assert_eq!(t.position, i as u32);
            assert_eq!(t.group, group(i as u32));
            assert_eq!(t.status, TargetStatus::Pending);
        }
        // Same groups again: nothing new. One more group: appended.
        s.create_targets(run.id, &(0..6).map(group).collect::<Vec<_>>())
            .await
            .unwrap();
        let all = s.list_targets(run.id, None, None, 0).await.unwrap();
        assert_eq!(all.len(), 6);
        assert_eq!(all[..5], targets[..]);
        assert_eq!(all[5].position, 5);
        let run = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(run.counts.pending, 6);
        assert_eq!(run.counts.total(), 6);

        let page = s.list_targets(run.id, None, Some(1), 2).await.unwrap();
        assert_eq!(page.iter().map(|t| t.position).collect::<Vec<_>>(), [2, 3]);
        assert!(matches!(
            s.create_targets(RunId(999), &[group(1)]).await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn transitions_follow_the_target_lifecycle() {
        let (s, run, targets) = store_with_run(4).await;
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| targets[i].id);
        let at = t0() + Duration::seconds(5);
        s.apply_transitions(&[
            Transition::Sending {
                target_id: a,
                part: 0,
                message_id: "m-a-0".into(),
            },
            Transition::Sent {
                target_id: a,
                part: 0,
                last: false,
                at,
                latency_ms: 120,
            },
            Transition::Sending {
                target_id: a,
                part: 1,
                message_id: "m-a-1".into(),
            },
            Transition::Sending {
                target_id: b,
                part: 0,
                message_id: "m-b-0".into(),
            },
            Transition::Failed {
                target_id: c,
                error: "group not found".into(),
            },
            Transition::Skipped {
                target_id: d,
                reason: "delivery window closed".into(),
            },
        ])
        .await
        .unwrap();
        let ts = s.list_targets(run.id, None, None, 0).await.unwrap();
        assert_eq!(ts[0].status, TargetStatus::Sending);
        assert_eq!(ts[0].parts_sent, 1);
        assert_eq!(ts[0].attempts, 2);
        assert_eq!(ts[0].message_id.as_deref(), Some("m-a-1"));
        assert_eq!(ts[0].sent_at, Some(at));
        assert_eq!(ts[0].latency_ms, Some(120));
        assert_eq!(ts[1].status, TargetStatus::Sending);
        assert_eq!(ts[2].status, TargetStatus::Failed);
        assert_eq!(ts[2].error.as_deref(), Some("group not found"));
        assert_eq!(ts[3].status, TargetStatus::Skipped);
        assert_eq!(ts[3].error.as_deref(), Some("delivery window closed"));
        let counts = s.get_run(run.id).await.unwrap().unwrap().counts;
        assert_eq!(
            counts,
            TargetCounts {
                pending: 0,
                sending: 2,
                sent: 0,
                failed: 1,
                skipped: 1
            }
        );

        // A transient failure sends b back to pending with its progress kept.
        s.apply_transitions(&[
            Transition::Failed {
                target_id: b,
                error: "transient".into(),
            },
            Transition::Requeue { target_id: b },
            Transition::Sent {
                target_id: a,
                part: 1,
                last: true,
                at,
                latency_ms: 90,
            },
        ])
        .await
        .unwrap();
        let ts = s.list_targets(run.id, None, None, 0).await.unwrap();
        assert_eq!(ts[0].status, TargetStatus::Sent);
        assert_eq!(ts[0].parts_sent, 2);
        assert_eq!(ts[1].status, TargetStatus::Pending);
        assert_eq!(ts[1].error, None);
        assert_eq!(ts[1].attempts, 1);
        assert_eq!(ts[1].message_id.as_deref(), Some("m-b-0"));
        let counts = s.get_run(run.id).await.unwrap().unwrap().counts;
        assert_eq!(
            counts,
            TargetCounts {
                pending: 1,
                sending: 0,
                sent: 1,
                failed: 1,
                skipped: 1
            }
        );
        let pending = s
            .list_targets(run.id, Some(TargetStatus::Pending), None, 0)
            .await
            .unwrap();
        assert_eq!(pending.iter().map(|t| t.id).collect::<Vec<_>>(), [b]);
    }

    #[tokio::test]
    async fn a_batch_with_an_unknown_target_writes_nothing() {
        let (s, run, targets) = store_with_run(2).await;
        let err = s
            .apply_transitions(&[
                Transition::Sending {
                    target_id: targets[0].id,
                    part: 0,
                    message_id: "m".into(),
                },
                Transition::Requeue { target_id: 12345 },
            ])
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NotFound(_)));
        assert_eq!(
            s.list_targets(run.id, None, None, 0).await.unwrap(),
            targets
        );
        assert_eq!(s.get_run(run.id).await.unwrap().unwrap().counts.pending, 2);
    }

    #[tokio::test]
    async fn reminder_is_locked_while_a_run_is_active() {
        let (s, run, _) = store_with_run(1).await;
        let edit = text_reminder("sales");
        for status in [RunStatus::Queued, RunStatus::Running, RunStatus::Paused] {
            s.update_run(
                run.id,
                &RunUpdate {
                    status: Some(status),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            assert!(matches!(
                s.update_reminder(run.reminder_id, &edit, t0()).await,
                Err(StoreError::Conflict(_))
            ));
        }
        s.update_run(
            run.id,
            &RunUpdate {
                status: Some(RunStatus::Partial),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let later = t0() + Duration::hours(1);
        let r = s
            .update_reminder(run.reminder_id, &edit, later)
            .await
            .unwrap();
        assert_eq!(r.updated_at, later);
        assert_eq!(r.created_at, t0());
        assert!(matches!(
            s.update_reminder(999, &edit, t0()).await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn account_with_live_reminders_cannot_be_deleted() {
        let (s, run, _) = store_with_run(1).await;
        let pic = media_info(b"pic");
        s.put_media(&pic).await.unwrap();
        let h = UploadHandle {
            handle: "h1".into(),
            expires_at: t0() + Duration::days(7),
        };
        s.put_upload_handle(&acct("sales"), &pic.id, &h)
            .await
            .unwrap();
        assert_eq!(
            s.get_upload_handle(&acct("sales"), &pic.id).await.unwrap(),
            Some(h)
        );

        assert!(matches!(
            s.delete_account(&acct("sales")).await,
            Err(StoreError::Conflict(_))
        ));
        s.set_reminder_state(run.reminder_id, ReminderState::Paused, t0())
            .await
            .unwrap();
        assert!(matches!(
            s.delete_account(&acct("sales")).await,
            Err(StoreError::Conflict(_))
        ));
        s.set_reminder_state(run.reminder_id, ReminderState::Archived, t0())
            .await
            .unwrap();
        s.delete_account(&acct("sales")).await.unwrap();
        assert_eq!(s.get_account(&acct("sales")).await.unwrap(), None);
        assert_eq!(s.get_reminder(run.reminder_id).await.unwrap(), None);
        assert_eq!(s.get_run(run.id).await.unwrap(), None);
        assert_eq!(
            s.get_upload_handle(&acct("sales"), &pic.id).await.unwrap(),
            None
        );
        assert!(matches!(
            s.delete_account(&acct("sales")).await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn runs_list_newest_first_and_unfinished_oldest_first() {
        let s = store_with_account("sales").await;
        let r = s
            .create_reminder(&text_reminder("sales"), t0())
            .await
            .unwrap();
        let statuses = [
            RunStatus::Running,
            RunStatus::Success,
            RunStatus::Queued,
            RunStatus::Paused,
            RunStatus::Missed,
        ];
        let mut ids = Vec::new();
        for (i, st) in statuses.iter().enumerate() {
            let at = t0() + Duration::days(i as i64);
            let run = s
                .create_run(r.id, &acct("sales"), at, *st, None, at)
                .await
                .unwrap()
                .run;
            ids.push(run.id);
        }
        let all = s.list_runs(&RunFilter::default()).await.unwrap();
        assert_eq!(
            all.iter().map(|r| r.id).collect::<Vec<_>>(),
            ids.iter().rev().copied().collect::<Vec<_>>()
        );
        let page = s
            .list_runs(&RunFilter {
                before_id: Some(ids[3].0),
                limit: 2,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            page.iter().map(|r| r.id).collect::<Vec<_>>(),
            [ids[2], ids[1]]
        );
        let queued = s
            .list_runs(&RunFilter {
                status: Some(RunStatus::Queued),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(queued.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[2]]);
        let other = s
            .list_runs(&RunFilter {
                reminder_id: Some(r.id + 1),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(other.is_empty());
        let unfinished = s.unfinished_runs().await.unwrap();
        assert_eq!(
            unfinished.iter().map(|r| r.id).collect::<Vec<_>>(),
            [ids[0], ids[2], ids[3]]
        );
    }

    #[tokio::test]
    async fn update_run_changes_only_given_fields() {
        let (s, run, _) = store_with_run(1).await;
        let end = t0() + Duration::hours(9);
        s.update_run(
            run.id,
            &RunUpdate {
                status: Some(RunStatus::Running),
                window_end_at: Some(end),
                started_at: Some(t0()),
                forecast: Some("fits".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        s.update_run(
            run.id,
            &RunUpdate {
                error_summary: Some("x".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let got = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(got.status, RunStatus::Running);
        assert_eq!(got.window_end_at, Some(end));
        assert_eq!(got.started_at, Some(t0()));
        assert_eq!(got.finished_at, None);
        assert_eq!(got.forecast.as_deref(), Some("fits"));
        assert_eq!(got.error_summary.as_deref(), Some("x"));
        assert!(matches!(
            s.update_run(RunId(77), &RunUpdate::default()).await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn events_page_by_id() {
        let s = MemoryStore::new();
        for i in 0..5 {
            let e = s
                .append_event(&NewEvent {
                    at: t0(),
                    kind: "run.progress",
                    account_id: Some(acct("sales")),
                    run_id: Some(RunId(3)),
                    data: serde_json::json!({ "sent": i }),
                })
                .await
                .unwrap();
            assert_eq!(e.id, i + 1);
            assert_eq!(e.account_id.as_deref(), Some("sales"));
        }
        let page = s.events_after(2, 2).await.unwrap();
        assert_eq!(page.iter().map(|e| e.id).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(s.events_after(5, 10).await.unwrap(), vec![]);
        assert_eq!(s.events_after(0, 0).await.unwrap().len(), 5);
    }
}
