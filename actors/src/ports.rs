//! What the delivery core needs from the outside world: a store, a gateway
//! to WhatsApp, media bytes and a clock. The daemon plugs in sqlx and the
//! real gateways; tests and `herald simulate` plug in the memory store, the
//! simulator and virtual time.

use crate::domain::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::sync::Arc;
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

/// Which reminders [`Store::reminder_schedules`] reads.
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    pub fence: Option<crate::lease::Fence>,
}

/// Result of [`Store::create_run`]: the run, and whether this call made it.
/// `created == false` means another caller already fired this occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCreated {
    pub run: Run,
    pub created: bool,
}

/// One occurrence to fire with [`Store::create_runs`]: the arguments of
/// [`Store::create_run`] but `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRun {
    pub reminder_id: i64,
    pub account_id: AccountId,
    pub scheduled_for: DateTime<Utc>,
    pub status: RunStatus,
    pub error_summary: Option<String>,
}

/// Herald's persistence. Every method is atomic: a call that returns an
/// error has written nothing.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Backend name for logs and benchmark output ("sqlite", "postgres", "memory").
    fn backend(&self) -> &'static str;
    async fn ping(&self) -> StoreResult<()>;

    // accounts
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
    /// [`Store::set_account_state`] for a state that ends by itself at
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
    /// Records an account-level signal at `at` (its warm-up restarts).
    async fn record_incident(&self, id: &AccountId, at: DateTime<Utc>) -> StoreResult<()>;
    /// Conflict while the account has reminders that are not archived.
    async fn delete_account(&self, id: &AccountId) -> StoreResult<()>;

    // media
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

    // reminders
    /// Invalid (naming the field) if the account or a media part does not exist.
    async fn create_reminder(&self, r: &NewReminder, now: DateTime<Utc>) -> StoreResult<Reminder>;
    async fn get_reminder(&self, id: i64) -> StoreResult<Option<Reminder>>;
    async fn list_reminders(&self, f: &ReminderFilter) -> StoreResult<Vec<Reminder>>;
    /// A page of summaries in id order: parts and targets counted, not read.
    async fn list_reminder_summaries(&self, p: &ReminderPage) -> StoreResult<Vec<ReminderSummary>>;
    /// What the scheduler needs of the reminders `scan` selects, without
    /// parts or targets.
    async fn reminder_schedules(&self, scan: ScheduleScan) -> StoreResult<Vec<ReminderSchedule>>;
    /// [`Store::reminder_schedules`] for one reminder, whatever its state.
    async fn get_reminder_schedule(&self, id: i64) -> StoreResult<Option<ReminderSchedule>>;
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

    // runs
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
    /// [`Store::create_run`] for each element, in one transaction: one
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
    /// written once, as [`Store::create_chosen_targets`].
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
    /// change without `expect`. Nothing is written on an error.
    async fn update_run(&self, id: RunId, u: &RunUpdate) -> StoreResult<()>;
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
    /// [`Store::apply_transitions`], applied only while every fence is its
    /// account's current lease, in the same transaction
    /// ([`StoreError::Fenced`], nothing written, otherwise). The default
    /// keeps no leases: it refuses any fence.
    async fn apply_transitions_fenced(
        &self,
        fences: &[crate::lease::Fence],
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

    // events
    async fn append_event(&self, e: &NewEvent) -> StoreResult<Event>;
    /// [`Store::append_event`] for each element, in one transaction: ids
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

    // retention
    /// Deletes up to `limit` targets of finished runs that ended (or, never
    /// started, were created) before `before`, then up to `limit` such runs
    /// left without targets, in one short transaction. A reminder's newest
    /// run is kept: it is the scheduler's cursor. Unfinished runs are never
    /// touched.
    async fn prune_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<PrunedRuns>;
    /// Deletes up to `limit` of the oldest events stored before `before`,
    /// and records the highest id deleted (see
    /// [`Store::events_pruned_through`]).
    async fn prune_events(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64>;
    /// The highest event id retention has deleted (0 if none): a replay
    /// from below it has lost events.
    async fn events_pruned_through(&self) -> StoreResult<i64>;
    /// Deletes up to `limit` media rows that no reminder uses and were
    /// stored before `before` (their upload handles go with them); answers
    /// their ids so the caller removes the files.
    async fn prune_media(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<MediaId>>;

    // groups
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

    // leases (several daemons on one database; expiry is read on the
    // database's clock). The defaults keep no leases.
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
    async fn live_nodes(&self) -> StoreResult<Vec<crate::lease::NodeInfo>> {
        Err(no_leases(self.backend()))
    }
    /// Every lease row, expired or not, by account.
    async fn list_leases(&self) -> StoreResult<Vec<crate::lease::Lease>> {
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
    ) -> StoreResult<Option<crate::lease::Lease>> {
        Err(no_leases(self.backend()))
    }
    /// Extends each lease whose fence is current and not expired by `ttl`
    /// from now; one answer per fence (`false`: lost, do not act on it).
    async fn renew_leases(
        &self,
        _fences: &[crate::lease::Fence],
        _ttl: Duration,
    ) -> StoreResult<Vec<bool>> {
        Err(no_leases(self.backend()))
    }
    /// Ends a lease at once (handover), if the fence is current; the
    /// epoch stays, so the next owner's is higher.
    async fn release_lease(&self, _fence: &crate::lease::Fence) -> StoreResult<()> {
        Err(no_leases(self.backend()))
    }
}

/// What a store without lease rows answers to lease calls.
pub fn no_leases(backend: &str) -> StoreError {
    StoreError::Invalid(ValidationError::new(
        "cluster",
        format!("the {backend} store keeps no account leases: several daemons need PostgreSQL"),
    ))
}

// ---------------------------------------------------------------- gateway

/// How a gateway answered; the engine's failure classification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// Slow down: the whole account backs off.
    #[error("rate limited by WhatsApp")]
    RateLimited { retry_after: Option<Duration> },
    /// Worth retrying the same part with the same id.
    #[error("transient failure: {0}")]
    Transient(String),
    #[error("group not found")]
    GroupNotFound,
    #[error("account is not a participant of the group")]
    NotParticipant,
    #[error("not allowed to post in the group")]
    NotAllowed,
    /// The account must be paired again.
    #[error("account logged out")]
    LoggedOut,
    #[error("account temporarily banned")]
    Banned { until: Option<DateTime<Utc>> },
    /// WhatsApp refuses the account's messages for a while (463 reach-out
    /// time-lock, 479, …): the account cools down, then tries again.
    #[error("WhatsApp restricted the account (code {code})")]
    Restricted {
        code: u16,
        retry_after: Option<Duration>,
    },
    /// The upload handle can no longer be used; upload again.
    #[error("media upload expired")]
    MediaExpired,
    #[error("cannot reach WhatsApp: {0}")]
    Unreachable(String),
    /// The gateway does not offer this operation.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The send carried a lease epoch older than one the gateway has
    /// already seen for the account: another daemon owns it now. Nothing
    /// was sent; the run must stop acting for the account.
    #[error("refused: account lease epoch {sent} is older than {seen}")]
    Fenced { sent: i64, seen: i64 },
}

impl GatewayError {
    /// Ends one target (the group is the problem), not the account.
    pub fn is_target_failure(&self) -> bool {
        matches!(
            self,
            Self::GroupNotFound | Self::NotParticipant | Self::NotAllowed
        )
    }

    /// Stops the account's queue.
    pub fn is_account_failure(&self) -> bool {
        matches!(self, Self::LoggedOut | Self::Banned { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutgoingMessage {
    Text(String),
    Media {
        upload: UploadHandle,
        mime: String,
        caption: Option<String>,
    },
}

impl OutgoingMessage {
    /// Characters a person would type for it: the text or the caption.
    pub fn typed_chars(&self) -> usize {
        match self {
            Self::Text(t) => t.chars().count(),
            Self::Media { caption, .. } => caption.as_deref().map_or(0, |c| c.chars().count()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReceipt {
    /// True when the gateway had already accepted this message id.
    pub duplicate: bool,
}

#[async_trait]
pub trait Gateway: Send + Sync + 'static {
    /// The gateway itself counts the account-level signals that reach its
    /// session (logout, lock, ban) and records their incident, whether or
    /// not a send was under way; the run then does not count them again.
    fn reports_session_signals(&self) -> bool {
        false
    }
    /// Uploads media once; the handle is reused for every group.
    async fn upload(
        &self,
        account: &AccountId,
        media: &MediaId,
        mime: &str,
        bytes: Arc<[u8]>,
    ) -> Result<UploadHandle, GatewayError>;

    /// Resolves when the account can write to WhatsApp now (connected,
    /// logged in). The engine takes its token only after this, so sends
    /// queued behind a reconnect do not leave back to back.
    async fn ready(&self, _account: &AccountId) -> Result<(), GatewayError> {
        Ok(())
    }

    /// The groups the account is in, with one query to WhatsApp. Never
    /// called from the send loop: a group directory sync calls it, at most
    /// as often as its throttle allows.
    async fn list_groups(&self, _account: &AccountId) -> Result<Vec<GroupInfo>, GatewayError> {
        Err(GatewayError::Unsupported(
            "this gateway cannot list an account's groups",
        ))
    }

    /// Shows the account as typing in `group` for about `for_` (a chat
    /// presence, not a message); the engine waits that long, then sends.
    /// The default is a gateway without presences: nothing is shown.
    async fn typing(
        &self,
        _account: &AccountId,
        _group: &GroupJid,
        _for: Duration,
    ) -> Result<(), GatewayError> {
        Ok(())
    }

    /// Sends one message with a caller-chosen id. Sending the same id again
    /// must not deliver twice.
    async fn send(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
    ) -> Result<SendReceipt, GatewayError>;

    /// Tells the gateway that `fence` now holds the account, before its
    /// first send: from then on it refuses sends with an older epoch, so a
    /// request the previous owner had under way when it was paused cannot
    /// land after the new owner's limiter counted the account's minute.
    /// [`GatewayError::Fenced`] if a newer epoch was already seen. The
    /// default cannot check (WhatsApp knows nothing of leases).
    async fn claim_fence(&self, _fence: &crate::lease::Fence) -> Result<(), GatewayError> {
        Ok(())
    }

    /// [`Gateway::send`] by the holder of `fence` (several daemons). A
    /// gateway that can check it refuses an epoch older than the newest it
    /// has seen for the account with [`GatewayError::Fenced`], so a daemon
    /// that lost its lease while paused cannot send when it wakes. The
    /// default cannot check (WhatsApp itself knows nothing of leases) and
    /// sends; the engine's local lease deadline is then the only guard.
    async fn send_fenced(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        _fence: Option<&crate::lease::Fence>,
    ) -> Result<SendReceipt, GatewayError> {
        self.send(account, group, message, message_id).await
    }
}

/// Where media bytes live (files under the data dir in the daemon).
#[async_trait]
pub trait MediaSource: Send + Sync + 'static {
    async fn read(&self, media: &MediaId) -> std::io::Result<Arc<[u8]>>;
}

// ---------------------------------------------------------------- clock

/// Wall-clock time. Sleeping always goes through tokio so that tests and
/// `herald simulate` can run on paused, auto-advancing time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

/// The real wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that reads tokio's time from a fixed start: with
/// `tokio::time::pause()` it becomes virtual time that jumps whenever every
/// task is waiting on a timer.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start_utc: DateTime<Utc>,
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_at(start_utc: DateTime<Utc>) -> Self {
        Self {
            start_utc,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = tokio::time::Instant::now() - self.start;
        self.start_utc + chrono::Duration::from_std(elapsed).expect("elapsed fits")
    }
}

/// Sleeps until `at` on `clock`, re-reading the clock at least every minute
/// so a wall-clock step (NTP, suspend) does not make us oversleep.
pub async fn sleep_until(clock: &dyn Clock, at: DateTime<Utc>) {
    loop {
        let left = at - clock.now();
        let Ok(left) = left.to_std() else { return };
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(Duration::from_secs(60))).await;
    }
}

/// The bundle of ports an actor system runs on.
#[derive(Clone)]
pub struct Ports {
    pub store: Arc<dyn Store>,
    pub gateways: Arc<dyn GatewayRegistry>,
    pub media: Arc<dyn MediaSource>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<dyn Metrics>,
}

/// Picks the gateway for an account's kind.
pub trait GatewayRegistry: Send + Sync + 'static {
    fn gateway(&self, kind: GatewayKind) -> Option<Arc<dyn Gateway>>;
}

// ---------------------------------------------------------------- metrics

/// What the engine reports for `/metrics`. Labels are bounded: an account id
/// or a fixed reason, never a run or a group.
pub trait Metrics: Send + Sync + 'static {
    fn message_sent(&self, _account: &AccountId, _latency: Duration) {}
    fn send_failed(&self, _account: &AccountId, _reason: &'static str) {}
    fn rate_limited(&self, _account: &AccountId) {}
    /// An account-level signal (`signal` is one of
    /// [`crate::signals::AccountSignal::label`]'s few values).
    fn account_signal(&self, _account: &AccountId, _signal: &'static str) {}
    fn tokens_available(&self, _account: &AccountId, _tokens: f64, _per_minute: u32) {}
    fn queue_depth(&self, _account: &AccountId, _depth: usize) {}
    fn targets_remaining(&self, _account: &AccountId, _remaining: usize) {}
    fn media_uploaded(&self, _account: &AccountId, _bytes: u64) {}
    fn media_cache_hit(&self, _account: &AccountId) {}
    fn actor_restarted(&self, _kind: &'static str) {}
    fn fire_lag(&self, _lag: Duration) {}
    fn run_missed(&self) {}
    fn window_closed(&self) {}
}

/// Metrics that go nowhere (benchmarks, simulation).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoMetrics;
impl Metrics for NoMetrics {}
