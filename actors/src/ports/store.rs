//! The store port: Herald's persistence, one trait per table family
//! (accounts, media, reminders, runs and their targets, events, groups,
//! leases), and [`Store`], which is all of them. The daemon implements it on
//! sqlx (SQLite and PostgreSQL), `herald simulate` in memory.

use crate::domain::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::time::Duration;

// ---------------------------------------------------------------- store

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("database error: {0}")]
    Backend(String),
    /// A write carried a lease fence that is no longer the account's
    /// current one: another daemon owns the account now. Nothing was written.
    #[error("account lease lost: {0}")]
    Fenced(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// What a store answers a write under `fence` once it is not the
    /// account's current lease.
    pub fn fenced(fence: &Fence) -> Self {
        Self::Fenced(format!(
            "account {} is no longer leased to daemon {} at epoch {}",
            fence.account, fence.node, fence.epoch
        ))
    }
}

/// Refuses a status change that is not a compare-and-set.
pub fn check_update(u: &RunUpdate) -> StoreResult<()> {
    if u.status.is_some() && u.expect.is_empty() {
        return Err(StoreError::Invalid(ValidationError::new(
            "expect",
            "a run's status changes only from known statuses (compare-and-set)",
        )));
    }
    Ok(())
}

/// The Conflict a failed compare-and-set answers.
pub fn cas_conflict(id: RunId, actual: RunStatus) -> StoreError {
    StoreError::Conflict(format!("run {id} is {actual}"))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAccount {
    pub id: AccountId,
    pub name: String,
    pub kind: GatewayKind,
    pub state: AccountState,
    pub limits: AccountLimits,
}

impl NewAccount {
    /// An account named after its id, with the default limits.
    pub fn named_by_id(id: AccountId, kind: GatewayKind, state: AccountState) -> Self {
        Self {
            name: id.to_string(),
            id,
            kind,
            state,
            limits: AccountLimits::default(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ReminderFilter {
    pub account_id: Option<AccountId>,
    pub state: Option<ReminderState>,
}

/// A page of reminder summaries in id order (keyset paging).
#[derive(Debug, Clone, Default)]
pub struct ReminderPage {
    pub filter: ReminderFilter,
    /// Only reminders with an id above this.
    pub after_id: Option<i64>,
    pub limit: u32,
}

/// Which reminders [`ReminderStore::reminder_schedules`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleScan {
    /// Every active reminder (a scheduler's start-up and full pass).
    Active,
    /// Every reminder written after this version, whatever its state (a
    /// pause or an archive is a change too), in version order.
    ChangedAfter(i64),
}

#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub reminder_id: Option<i64>,
    pub account_id: Option<AccountId>,
    pub status: Option<RunStatus>,
    /// Only runs with an id below this (paging newest first).
    pub before_id: Option<i64>,
    pub limit: u32,
}

/// Fields of a run to change; `None` leaves a field as it is. Build a
/// status change with [`crate::lifecycle::RunEvent::update`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunUpdate {
    pub status: Option<RunStatus>,
    /// Compare-and-set: the update applies only while the run's status is
    /// one of these. Required (non-empty) with `status`; empty otherwise
    /// means "any status".
    pub expect: Vec<RunStatus>,
    /// When the update applies: targets still pending or sending are
    /// skipped with this reason in the same transaction.
    pub skip_open: Option<String>,
    /// When the update applies: failed and skipped targets go back to
    /// pending in the same transaction (a retry).
    pub requeue_unsent: bool,
    pub window_end_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub forecast: Option<String>,
    pub error_summary: Option<String>,
    /// Records an operator's stop of a sending run (cleared by a retry's
    /// `requeue_unsent`).
    pub stop_requested_at: Option<DateTime<Utc>>,
    /// Several daemons: the update applies only while this is the run's
    /// account's current lease ([`StoreError::Fenced`] otherwise).
    pub fence: Option<crate::domain::Fence>,
    /// The event that reports the change, stored in the same transaction
    /// (and its webhook deliveries with it): a crash or a failed write
    /// loses both or neither.
    pub event: Option<NewEvent>,
}

/// Result of [`RunStore::create_run`]: the run, and whether this call made it.
/// `created == false` means another caller already fired this occurrence.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCreated {
    pub run: Run,
    pub created: bool,
    /// The event stored with the run, when this call made it and gave one.
    pub event: Option<Event>,
}

/// One occurrence to fire with [`RunStore::create_runs`]: the arguments of
/// [`RunStore::create_run`] but `now`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub reminder_id: i64,
    pub account_id: AccountId,
    pub scheduled_for: DateTime<Utc>,
    pub status: RunStatus,
    pub error_summary: Option<String>,
    /// The event that reports the new run (its `run_id` is filled in),
    /// stored in the same transaction when this call creates the run.
    pub event: Option<NewEvent>,
}

/// What every store says of itself.
#[async_trait]
pub trait StoreBase: Send + Sync + 'static {
    /// Backend name for logs and benchmark output ("sqlite", "postgres", "memory").
    fn backend(&self) -> &'static str;
    async fn ping(&self) -> StoreResult<()>;
    /// The database's clock: what daemons sharing the database judge
    /// claims and expiries by, whatever their own clocks say. A store
    /// that is not shared answers this process's clock.
    async fn database_now(&self) -> StoreResult<DateTime<Utc>> {
        Ok(Utc::now())
    }
}

/// Accounts: who sends, their limits and their state.
#[async_trait]
pub trait AccountStore: StoreBase {
    /// Conflict if the id is taken.
    async fn create_account(&self, a: &NewAccount, now: DateTime<Utc>) -> StoreResult<Account>;
    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>>;
    async fn list_accounts(&self) -> StoreResult<Vec<Account>>;
    /// Up to `limit` accounts in id order, after `after` (keyset paging).
    async fn list_accounts_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<Account>>;
    async fn update_account_limits(
        &self,
        id: &AccountId,
        limits: &AccountLimits,
    ) -> StoreResult<Account>;
    /// Sets the state and its reason; the state has no end of its own.
    async fn set_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
    ) -> StoreResult<Account>;
    /// [`AccountStore::set_account_state`] for a state that ends by itself at
    /// `until` (a temporary ban, a cool-down), kept with it: a daemon that
    /// restarts or takes the account over meanwhile knows when to try
    /// again. The default keeps no end.
    async fn set_account_state_until(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
    ) -> StoreResult<Account> {
        let _ = until;
        self.set_account_state(id, state, reason).await
    }
    /// [`AccountStore::set_account_state_until`] and the event that reports
    /// the change, in one transaction: both are stored or neither.
    async fn change_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
        event: &NewEvent,
    ) -> StoreResult<(Account, Event)>;
    /// Records an account-level signal at `at` (its warm-up restarts).
    async fn record_incident(&self, id: &AccountId, at: DateTime<Utc>) -> StoreResult<()>;
    /// Keeps what WhatsApp last said of the account (its standing), with
    /// `changed`, the event that reports a change (none for a re-read that
    /// says the same), in one transaction. With `was`, only over that
    /// standing: Conflict, and nothing written, when another was kept
    /// meanwhile (so two readings do not both tell the same change).
    async fn set_account_standing(
        &self,
        id: &AccountId,
        was: Option<&Standing>,
        standing: &Standing,
        changed: Option<&NewEvent>,
    ) -> StoreResult<Option<Event>>;
    /// Conflict while the account has reminders that are not archived.
    async fn delete_account(&self, id: &AccountId) -> StoreResult<()>;
}

/// Media: pictures by content hash, and each account's upload handles.
#[async_trait]
pub trait MediaStore: StoreBase {
    /// Idempotent: storing the same bytes twice returns the first record.
    async fn put_media(&self, m: &MediaInfo) -> StoreResult<MediaInfo>;
    async fn get_media(&self, id: &MediaId) -> StoreResult<Option<MediaInfo>>;
    async fn get_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
    ) -> StoreResult<Option<UploadHandle>>;
    async fn put_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
        h: &UploadHandle,
    ) -> StoreResult<()>;
    /// Deletes up to `limit` media rows that no reminder uses and were
    /// stored before `before` (their upload handles go with them); answers
    /// their ids so the caller removes the files.
    async fn prune_media(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<MediaId>>;
}

/// Reminders: what to send, to whom, when.
#[async_trait]
pub trait ReminderStore: StoreBase {
    /// Invalid (naming the field) if the account or a media part does not exist.
    async fn create_reminder(&self, r: &NewReminder, now: DateTime<Utc>) -> StoreResult<Reminder>;
    async fn get_reminder(&self, id: i64) -> StoreResult<Option<Reminder>>;
    async fn list_reminders(&self, f: &ReminderFilter) -> StoreResult<Vec<Reminder>>;
    /// A page of summaries in id order: parts and targets counted, not read.
    async fn list_reminder_summaries(&self, p: &ReminderPage) -> StoreResult<Vec<ReminderSummary>>;
    /// What the scheduler needs of the reminders `scan` selects, without
    /// parts or targets.
    async fn reminder_schedules(&self, scan: ScheduleScan) -> StoreResult<Vec<ReminderSchedule>>;
    /// [`ReminderStore::reminder_schedules`] for one reminder, whatever its state.
    async fn get_reminder_schedule(&self, id: i64) -> StoreResult<Option<ReminderSchedule>>;
    /// The titles of reminders `ids`, to name their runs by (a reminder no
    /// longer stored has no entry). The default reads each whole reminder;
    /// a database reads the titles alone in one statement.
    async fn reminder_titles(&self, ids: &[i64]) -> StoreResult<HashMap<i64, String>> {
        let mut titles = HashMap::with_capacity(ids.len());
        for &id in ids {
            if let Some(r) = self.get_reminder(id).await? {
                titles.insert(id, r.spec.title);
            }
        }
        Ok(titles)
    }
    /// Conflict while one of its runs is queued, running or paused.
    async fn update_reminder(
        &self,
        id: i64,
        r: &NewReminder,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder>;
    async fn set_reminder_state(
        &self,
        id: i64,
        state: ReminderState,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder>;
}

/// Runs and their targets: one firing of a reminder and its groups' marks.
#[async_trait]
pub trait RunStore: StoreBase {
    /// Idempotent on (reminder, scheduled_for): the firing lock.
    async fn create_run(
        &self,
        reminder_id: i64,
        account: &AccountId,
        scheduled_for: DateTime<Utc>,
        status: RunStatus,
        error_summary: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<RunCreated>;
    /// [`RunStore::create_run`] for each element, in one transaction: one
    /// result per input, in input order. An occurrence repeated within the
    /// batch is created by its first element only. NotFound (nothing
    /// written) if one names an unknown reminder.
    ///
    /// The default calls `create_run` in turn, which is atomic only if no
    /// call after the first can fail; a store whose `create_run` can
    /// (an unknown reminder) must override it, or a caller retrying a
    /// failed batch would find some occurrences already fired by itself.
    async fn create_runs(
        &self,
        runs: &[NewRun],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<RunCreated>> {
        if runs.iter().any(|r| r.event.is_some()) {
            return Err(StoreError::Backend(
                "this store cannot store a run's event in the run's transaction".into(),
            ));
        }
        let mut out = Vec::with_capacity(runs.len());
        for r in runs {
            out.push(
                self.create_run(
                    r.reminder_id,
                    &r.account_id,
                    r.scheduled_for,
                    r.status,
                    r.error_summary.as_deref(),
                    now,
                )
                .await?,
            );
        }
        Ok(out)
    }
    /// Creates the run's targets as pending, in order, chosen explicitly;
    /// written once, as [`RunStore::create_chosen_targets`].
    async fn create_targets(&self, run: RunId, groups: &[GroupJid]) -> StoreResult<()> {
        let chosen: Vec<(GroupJid, String)> = groups
            .iter()
            .map(|g| (g.clone(), CHOSEN_EXPLICIT.to_owned()))
            .collect();
        self.create_chosen_targets(run, &chosen).await
    }
    /// Creates the run's targets as pending, in order, each with how it
    /// was chosen (see [`crate::domain::chosen_by`]). A run's groups are
    /// written once: if it has targets already, nothing changes, even when
    /// `groups` differs (two callers racing to freeze a run).
    async fn create_chosen_targets(
        &self,
        run: RunId,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()>;
    async fn get_run(&self, id: RunId) -> StoreResult<Option<Run>>;
    async fn list_runs(&self, f: &RunFilter) -> StoreResult<Vec<Run>>;
    /// Applies `u` if the run's status is one of `u.expect` (any, when
    /// empty): NotFound for an unknown run, Conflict naming the run's
    /// actual status when the compare-and-set fails, Invalid for a status
    /// change without `expect`. Nothing is written on an error. Answers
    /// `u.event` as stored with the change.
    async fn update_run(&self, id: RunId, u: &RunUpdate) -> StoreResult<Option<Event>>;
    /// Targets ordered by position, starting after `after_position`.
    async fn list_targets(
        &self,
        run: RunId,
        status: Option<TargetStatus>,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<RunTarget>>;
    /// Applies all transitions in one transaction. A transition whose target
    /// is not in one of [`Transition::allowed_from`] is skipped (a late or
    /// repeated mark); NotFound, with nothing written, if one names no target.
    async fn apply_transitions(&self, ts: &[Transition]) -> StoreResult<()>;
    /// [`RunStore::apply_transitions`], applied only while every fence is its
    /// account's current lease, in the same transaction
    /// ([`StoreError::Fenced`], nothing written, otherwise). The default
    /// keeps no leases: it refuses any fence.
    async fn apply_transitions_fenced(
        &self,
        fences: &[crate::domain::Fence],
        ts: &[Transition],
    ) -> StoreResult<()> {
        if fences.is_empty() {
            return self.apply_transitions(ts).await;
        }
        Err(no_leases(self.backend()))
    }
    /// Runs that were queued, running, paused or parked, oldest first.
    async fn unfinished_runs(&self) -> StoreResult<Vec<Run>>;
    /// What the account may have sent since `since`, for a new actor's
    /// bucket: (sent_at, parts_sent) of targets marked sent at or after it,
    /// and (None, 1) for each target of an unfinished run still marked
    /// `sending` (a send whose time is unknown).
    async fn sent_since(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<(Option<DateTime<Utc>>, u32)>>;
    /// The newest scheduled_for of a reminder's runs.
    async fn last_scheduled_for(&self, reminder_id: i64) -> StoreResult<Option<DateTime<Utc>>>;
    /// Deletes up to `limit` targets of finished runs that ended (or, never
    /// started, were created) before `before`, then up to `limit` such runs
    /// left without targets, in one short transaction. A reminder's newest
    /// run is kept: it is the scheduler's cursor. Unfinished runs are never
    /// touched.
    async fn prune_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<PrunedRuns>;
}

/// The event log `/v1/events` replays.
#[async_trait]
pub trait EventStore: StoreBase {
    async fn append_event(&self, e: &NewEvent) -> StoreResult<Event>;
    /// [`EventStore::append_event`] for each element, in one transaction: ids
    /// ascend in input order. The default appends one at a time, which is
    /// atomic only if no call after the first can fail.
    async fn append_events(&self, events: &[NewEvent]) -> StoreResult<Vec<Event>> {
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            out.push(self.append_event(e).await?);
        }
        Ok(out)
    }
    async fn events_after(&self, after_id: i64, limit: u32) -> StoreResult<Vec<Event>>;
    /// `account`'s state changes (`account_state` events) at or after
    /// `since`, oldest first, behind the newest one before it (the state
    /// the account was in at `since`). The default walks the whole log; a
    /// database reads its index of them.
    async fn account_states(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<Event>> {
        let mut before: Option<Event> = None;
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let page = self.events_after(after, 1000).await?;
            let Some(last) = page.last() else { break };
            after = last.id;
            for e in page {
                if e.kind != "account_state" || e.account_id.as_deref() != Some(account.as_str()) {
                    continue;
                }
                if e.at < since {
                    before = Some(e);
                } else {
                    out.push(e);
                }
            }
        }
        out.sort_by_key(|e| (e.at, e.id));
        Ok(before.into_iter().chain(out).collect())
    }
    /// Deletes up to `limit` of the oldest events stored before `before`,
    /// and records the highest id deleted (see
    /// [`EventStore::events_pruned_through`]).
    async fn prune_events(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64>;
    /// The highest event id retention has deleted (0 if none): a replay
    /// from below it has lost events.
    async fn events_pruned_through(&self) -> StoreResult<i64>;
}

/// Each account's group directory, as WhatsApp last listed it.
#[async_trait]
pub trait GroupStore: StoreBase {
    /// Replaces the account's directory with what the gateway listed at
    /// `now`: new groups are added, known ones updated (labels kept), and
    /// groups no longer listed marked as left. NotFound for an unknown
    /// account.
    async fn sync_groups(
        &self,
        account: &AccountId,
        groups: &[GroupInfo],
        now: DateTime<Utc>,
    ) -> StoreResult<GroupSyncSummary>;
    /// A page of the account's groups in JID order, and how many match.
    async fn list_groups(&self, f: &GroupFilter) -> StoreResult<GroupPage>;
    /// Sets a group's labels. NotFound for a group not in the directory.
    async fn set_group_labels(
        &self,
        account: &AccountId,
        group: &GroupJid,
        labels: &[Label],
    ) -> StoreResult<Group>;
    /// When the account's directory was last synced.
    async fn groups_synced_at(&self, account: &AccountId) -> StoreResult<Option<DateTime<Utc>>>;
    /// The directory's names of `groups` (left groups too: a run's page
    /// names a group the account has since left). A JID not in the
    /// directory, or an unknown account, has no entry.
    async fn group_names(
        &self,
        account: &AccountId,
        groups: &[GroupJid],
    ) -> StoreResult<HashMap<GroupJid, String>>;
}

/// Leases (several daemons on one database; expiry is read on the
/// database's clock). The defaults keep no leases.
#[async_trait]
pub trait LeaseStore: StoreBase {
    /// Registers or renews the daemon `node` (this start: `instance`) as
    /// live for `ttl`. Conflict while another instance holds a live row
    /// under the same node id.
    async fn node_heartbeat(
        &self,
        _node: &str,
        _instance: &str,
        _control_url: Option<&str>,
        _ttl: Duration,
    ) -> StoreResult<()> {
        Err(no_leases(self.backend()))
    }
    /// Removes the node's row (a clean exit), if this instance holds it.
    async fn node_leave(&self, _node: &str, _instance: &str) -> StoreResult<()> {
        Err(no_leases(self.backend()))
    }
    /// The daemons whose rows have not expired, by node id.
    async fn live_nodes(&self) -> StoreResult<Vec<crate::domain::NodeInfo>> {
        Err(no_leases(self.backend()))
    }
    /// Every lease row, expired or not, by account.
    async fn list_leases(&self) -> StoreResult<Vec<crate::domain::Lease>> {
        Err(no_leases(self.backend()))
    }
    /// Takes `account`'s lease for `node` for `ttl` if it is free: no row,
    /// or the row expired. Taking it raises the epoch. `None`: another
    /// daemon holds it (or this node holds it live: renew instead).
    async fn acquire_lease(
        &self,
        _account: &AccountId,
        _node: &str,
        _ttl: Duration,
    ) -> StoreResult<Option<crate::domain::Lease>> {
        Err(no_leases(self.backend()))
    }
    /// Extends each lease whose fence is current and not expired by `ttl`
    /// from now; one answer per fence (`false`: lost, do not act on it).
    async fn renew_leases(
        &self,
        _fences: &[crate::domain::Fence],
        _ttl: Duration,
    ) -> StoreResult<Vec<bool>> {
        Err(no_leases(self.backend()))
    }
    /// Ends a lease at once (handover), if the fence is current; the
    /// epoch stays, so the next owner's is higher.
    async fn release_lease(&self, _fence: &crate::domain::Fence) -> StoreResult<()> {
        Err(no_leases(self.backend()))
    }
}

/// Console sign-ins, kept across restarts and seen by every daemon on the
/// database, each until it expires.
#[async_trait]
pub trait ConsoleSessionStore: StoreBase {
    /// Stores a new session; drops the expired ones, and past `max` live
    /// sessions of the same user (`user_name`) that user's sessions that
    /// end soonest, so one user signing in again and again never ends
    /// another's sessions.
    async fn put_console_session(
        &self,
        session: &ConsoleSession,
        now: DateTime<Utc>,
        max: u32,
    ) -> StoreResult<()>;
    /// The session with this id hash, if it is still live at `now`.
    async fn get_console_session(
        &self,
        id_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ConsoleSession>>;
    /// Ends a session (sign-out); no error if there is none.
    async fn delete_console_session(&self, id_hash: &str) -> StoreResult<()>;
}

/// Named API users (`/v1/users`), each found by its token's hash.
#[async_trait]
pub trait UserStore: StoreBase {
    /// Conflict when the name is taken.
    async fn create_user(&self, user: &NewApiUser) -> StoreResult<ApiUser>;
    /// Every user, by id.
    async fn list_users(&self) -> StoreResult<Vec<ApiUser>>;
    async fn get_user(&self, id: i64) -> StoreResult<ApiUser>;
    /// The user whose token hashes to `token_hash`, if it has not expired
    /// at `now`.
    async fn user_by_token(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ApiUser>>;
    /// Revokes a user: the row and the user's console sessions go in one
    /// transaction, so the token and every sign-in made with it stop at
    /// once. NotFound when there is no such user.
    async fn delete_user(&self, id: i64) -> StoreResult<()>;
}

/// The audit log: one row per write through the control port.
#[async_trait]
pub trait AuditStore: StoreBase {
    /// Appends an entry; answers its id (ids grow with time).
    async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<i64>;
    /// Sets how many attempts entry `id` stands for (the per-minute
    /// aggregate of failed authentications and sign-ins).
    async fn set_audit_count(&self, id: i64, count: u32) -> StoreResult<()>;
    /// Newest first: at most `limit` entries matching `filter` with an id
    /// below `before_id`.
    async fn list_audit(
        &self,
        filter: &AuditFilter,
        before_id: Option<i64>,
        limit: u32,
    ) -> StoreResult<Vec<AuditEntry>>;
    /// Deletes up to `limit` entries older than `before`; answers how many.
    async fn prune_audit(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64>;
}

/// Webhook subscriptions and their deliveries. A delivery row is made for
/// every enabled subscription whose types match, in the same transaction
/// as the event it carries (a trigger on SQL), so a crash never loses one.
#[async_trait]
pub trait WebhookStore: StoreBase {
    async fn create_webhook(&self, w: &NewWebhook) -> StoreResult<Webhook>;
    /// Every subscription, by id.
    async fn list_webhooks(&self) -> StoreResult<Vec<Webhook>>;
    async fn get_webhook(&self, id: i64) -> StoreResult<Webhook>;
    /// Applies `patch`; enabling clears the disabled reason and the
    /// failure streak. Disabling holds the subscription's pending
    /// deliveries (status `held`, their claims dropped) and enabling makes
    /// them pending again, in the same transaction. NotFound when there is
    /// no such subscription.
    async fn update_webhook(&self, id: i64, patch: &WebhookPatch) -> StoreResult<Webhook>;
    /// `secret` signs from now on; the current one goes on signing beside
    /// it until `old_until`, and earlier ones still in their overlap at
    /// `now` until their own ends (those whose overlap ended are dropped).
    /// Conflict when [`MAX_SIGNING_SECRETS`] would sign at once.
    async fn rotate_webhook_secret(
        &self,
        id: i64,
        secret: &str,
        now: DateTime<Utc>,
        old_until: DateTime<Utc>,
    ) -> StoreResult<Webhook>;
    /// The subscription and its deliveries, in one transaction.
    async fn delete_webhook(&self, id: i64) -> StoreResult<()>;
    /// A delivery of the stored event `event_id` to `webhook_id`, due at
    /// `now` (a ping); held if the subscription is disabled.
    async fn add_delivery(
        &self,
        webhook_id: i64,
        event_id: i64,
        event_type: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<WebhookDelivery>;
    /// Newest first, ids below `before_id`.
    async fn list_deliveries(
        &self,
        webhook_id: i64,
        before_id: Option<i64>,
        limit: u32,
    ) -> StoreResult<Vec<WebhookDelivery>>;
    /// Claims up to `limit` pending deliveries due at `now` for `node`
    /// until `until`: another daemon skips them meanwhile, and takes them
    /// up once the claim lapses (a daemon that died mid-attempt). A
    /// delivery of a disabled subscription is never claimed.
    async fn claim_deliveries(
        &self,
        node: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<DueDelivery>>;
    /// Records an attempt (only while `node` holds the claim; otherwise
    /// nothing is written and the answer is Conflict), and the
    /// subscription's failure streak: a success ends it; a subscription
    /// failing for longer than `disable_after` is disabled with a reason,
    /// and its pending deliveries are held.
    async fn finish_attempt(
        &self,
        delivery_id: i64,
        node: &str,
        outcome: &AttemptOutcome,
        now: DateTime<Utc>,
        disable_after: Duration,
    ) -> StoreResult<()>;
    /// How many deliveries are pending, and since when the oldest of
    /// those due by `now` has waited.
    async fn webhook_backlog(&self, now: DateTime<Utc>) -> StoreResult<WebhookBacklog>;
    /// Makes a delivery pending again, due at `now` (a manual retry);
    /// held if the subscription is disabled.
    async fn retry_delivery(
        &self,
        webhook_id: i64,
        delivery_id: i64,
        now: DateTime<Utc>,
    ) -> StoreResult<WebhookDelivery>;
}

/// Receipts counted per run target (`domain::receipts`).
#[async_trait]
pub trait ReceiptStore: StoreBase {
    /// Counts a batch in one transaction: each receipt is matched to the
    /// run target whose current message id it names (and whose run's
    /// account and group it came from), and its participant is counted
    /// once per kind, never past the group's participants. A receipt that
    /// matches nothing is ignored. Safe to call from any daemon at any
    /// time: the counted participants are in the store, not in memory.
    async fn count_receipts(&self, batch: &[Receipt]) -> StoreResult<ReceiptTally>;
    /// A run's counts over its targets (zero for a run with none).
    async fn run_receipts(&self, run: RunId) -> StoreResult<RunReceipts>;
    /// Finished runs that ended before `before` and whose receipts have
    /// not been reported, the longest ended first.
    async fn unreported_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<RunId>>;
    /// Marks `run`'s receipts reported and stores `events` (its receipts,
    /// its polls' answers) in the same transaction, once. Answers the
    /// events stored: none if the run was reported already (by this daemon
    /// or another) or has gone.
    async fn report_receipts(
        &self,
        run: RunId,
        at: DateTime<Utc>,
        events: &[NewEvent],
    ) -> StoreResult<Vec<Event>>;
}

/// Polls a run sent and the votes on them ([`Vote`]): per group and poll,
/// each voter's current choice, one row per voter who voted.
#[async_trait]
pub trait PollStore: StoreBase {
    /// Keeps `run`'s poll parts as they are sent and the message of each
    /// group's copy, so votes can find them; idempotent (a resumed run
    /// calls it again and changes nothing).
    async fn open_polls(
        &self,
        run: RunId,
        polls: &[RunPoll],
        messages: &[PollMessage],
    ) -> StoreResult<()>;
    /// Counts a batch in one transaction: each vote is matched to the
    /// group's copy of the poll it names (and must come to the account that
    /// sent it, in that group), and becomes its voter's current choice
    /// unless the one kept is as new or newer. Safe to call from any daemon
    /// at any time: the choices are in the store, not in memory.
    async fn count_votes(&self, batch: &[Vote]) -> StoreResult<VoteTally>;
    /// The run's polls, each with its counts over all its groups (none for
    /// a run without polls).
    async fn run_polls(&self, run: RunId) -> StoreResult<Vec<PollResult>>;
    /// One poll's counts per group, by position after `after` (exclusive),
    /// at most `limit`; every group of the run, voted or not.
    async fn group_polls(
        &self,
        run: RunId,
        part: u32,
        after: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<GroupPoll>>;
}

/// Recalls and edits of sent runs ([`Amendment`]): one open at a time per
/// run, one mark per group before and after the wire.
#[async_trait]
pub trait AmendStore: StoreBase {
    /// Stores a requested amendment and `event` in one transaction, under
    /// `fences` (the account's lease, several daemons). Conflict if the run
    /// has one not finished yet (naming it); NotFound for an unknown run.
    async fn create_amendment(
        &self,
        a: &NewAmendment,
        fences: &[Fence],
        event: &NewEvent,
    ) -> StoreResult<(Amendment, Event)>;
    /// The run's newest amendment, with its progress.
    async fn run_amendment(&self, run: RunId) -> StoreResult<Option<Amendment>>;
    async fn get_amendment(&self, id: i64) -> StoreResult<Option<Amendment>>;
    /// Amendments not finished, oldest first, with their runs' accounts:
    /// what a daemon resumes for the accounts it carries.
    async fn unfinished_amendments(&self) -> StoreResult<Vec<(Amendment, AccountId)>>;
    /// The run's groups with at least one message that may have been
    /// delivered, by position after `after_position`, with where each
    /// stands in amendment `id`.
    async fn amend_targets(
        &self,
        id: i64,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<AmendTarget>>;
    /// Marks a group, under `fences`, if [`AmendState::allowed_from`] its
    /// state in amendment `id`: `false` (nothing written) if not. A group
    /// marked for an earlier amendment of the run counts as unmarked.
    async fn mark_amend(
        &self,
        fences: &[Fence],
        id: i64,
        target_id: i64,
        state: AmendState,
        error: Option<&str>,
        at: DateTime<Utc>,
    ) -> StoreResult<bool>;
    /// Closes amendment `id` and stores `event`, under `fences`, once:
    /// `None` if it was finished already.
    async fn finish_amendment(
        &self,
        fences: &[Fence],
        id: i64,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> StoreResult<Option<Event>>;
}

/// What the control port's own checks keep, before and after any
/// operation: who a bearer token or a console session is, sign-in
/// attempts, and the audit trail. The control port holds only this part
/// of the store; everything else it reaches through operations.
pub trait IdentityStore: UserStore + ConsoleSessionStore + AuditStore {}

impl<T: UserStore + ConsoleSessionStore + AuditStore> IdentityStore for T {}

/// Herald's persistence: every table family. Every method is atomic: a
/// call that returns an error has written nothing. Any type with all the
/// families is a `Store`.
pub trait Store:
    IdentityStore
    + AccountStore
    + MediaStore
    + ReminderStore
    + RunStore
    + EventStore
    + GroupStore
    + LeaseStore
    + ConsoleSessionStore
    + UserStore
    + AuditStore
    + WebhookStore
    + ReceiptStore
    + PollStore
    + AmendStore
{
}

impl<T> Store for T where
    T: AccountStore
        + MediaStore
        + ReminderStore
        + RunStore
        + EventStore
        + GroupStore
        + LeaseStore
        + ConsoleSessionStore
        + UserStore
        + AuditStore
        + WebhookStore
        + ReceiptStore
        + PollStore
        + AmendStore
{
}

/// What a store without lease rows answers to lease calls.
pub fn no_leases(backend: &str) -> StoreError {
    StoreError::Invalid(ValidationError::new(
        "cluster",
        format!("the {backend} store keeps no account leases: several daemons need PostgreSQL"),
    ))
}

/// What a rotation answers when [`MAX_SIGNING_SECRETS`] would sign at once
/// (`ends`: when the previous secrets still signing stop).
pub fn too_many_secrets(webhook_id: i64, ends: &[DateTime<Utc>]) -> StoreError {
    let first = ends
        .iter()
        .min()
        .map(|t| {
            format!(
                " (the first ends at {})",
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        })
        .unwrap_or_default();
    StoreError::Conflict(format!(
        "webhook {webhook_id} has {} secrets signing already, the most at once: rotate \
         again once an overlap has ended{first}",
        ends.len() + 1
    ))
}
