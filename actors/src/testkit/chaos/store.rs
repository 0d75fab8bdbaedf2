//! The memory store, failing and stalling as the seed says.

use super::faults::FaultCtl;
use crate::domain::*;
use crate::memstore::MemoryStore;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;

/// The memory store, failing and stalling as the seed says.
pub(super) struct ChaosStore {
    pub(super) inner: Arc<MemoryStore>,
    pub(super) ctl: Arc<FaultCtl>,
    pub(super) blind_writes: bool,
    /// Events are stored apart from their change ([`Breakage::EventAfterCommit`]).
    pub(super) event_after_commit: bool,
    /// Fences are dropped on the way in ([`Breakage::NoFencing`]).
    pub(super) unfenced: bool,
}

impl ChaosStore {
    pub(super) async fn gate(&self) -> StoreResult<()> {
        self.ctl.alive().await;
        if self.ctl.roll(self.ctl.store_error_rate / 4.0) {
            tokio::time::sleep(Duration::from_millis(400)).await;
            self.ctl.alive().await;
        }
        if self.ctl.roll(self.ctl.store_error_rate) {
            return Err(StoreError::Backend("injected: database is locked".into()));
        }
        Ok(())
    }
}

macro_rules! through {
    ($self:ident . $m:ident ( $($a:expr),* )) => {{
        $self.gate().await?;
        let out = $self.inner.$m($($a),*).await;
        $self.ctl.alive().await;
        out
    }};
}

#[async_trait]
impl StoreBase for ChaosStore {
    fn backend(&self) -> &'static str {
        "chaos"
    }
    async fn ping(&self) -> StoreResult<()> {
        through!(self.ping())
    }
    async fn database_now(&self) -> StoreResult<DateTime<Utc>> {
        through!(self.database_now())
    }
}

#[async_trait]
impl AccountStore for ChaosStore {
    async fn create_account(&self, a: &NewAccount, now: DateTime<Utc>) -> StoreResult<Account> {
        through!(self.create_account(a, now))
    }
    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        through!(self.get_account(id))
    }
    async fn list_accounts(&self) -> StoreResult<Vec<Account>> {
        through!(self.list_accounts())
    }
    async fn list_accounts_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<Account>> {
        through!(self.list_accounts_page(after, limit))
    }
    async fn update_account_limits(
        &self,
        id: &AccountId,
        limits: &AccountLimits,
    ) -> StoreResult<Account> {
        through!(self.update_account_limits(id, limits))
    }
    async fn set_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
    ) -> StoreResult<Account> {
        through!(self.set_account_state(id, state, reason))
    }
    async fn set_account_state_until(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
    ) -> StoreResult<Account> {
        through!(self.set_account_state_until(id, state, reason, until))
    }
    async fn change_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
        event: &NewEvent,
    ) -> StoreResult<(Account, Event)> {
        through!(self.change_account_state(id, state, reason, until, event))
    }
    async fn delete_account(&self, id: &AccountId) -> StoreResult<()> {
        through!(self.delete_account(id))
    }
    async fn record_incident(&self, id: &AccountId, at: DateTime<Utc>) -> StoreResult<()> {
        through!(self.record_incident(id, at))
    }
    async fn set_account_standing(
        &self,
        id: &AccountId,
        was: Option<&Standing>,
        standing: &Standing,
        changed: Option<&NewEvent>,
    ) -> StoreResult<Option<Event>> {
        through!(self.set_account_standing(id, was, standing, changed))
    }
}

#[async_trait]
impl MediaStore for ChaosStore {
    async fn put_media(&self, m: &MediaInfo) -> StoreResult<MediaInfo> {
        through!(self.put_media(m))
    }
    async fn get_media(&self, id: &MediaId) -> StoreResult<Option<MediaInfo>> {
        through!(self.get_media(id))
    }
    async fn get_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
    ) -> StoreResult<Option<UploadHandle>> {
        through!(self.get_upload_handle(account, media))
    }
    async fn put_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
        h: &UploadHandle,
    ) -> StoreResult<()> {
        through!(self.put_upload_handle(account, media, h))
    }
    async fn prune_media(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<MediaId>> {
        through!(self.prune_media(before, limit))
    }
}

#[async_trait]
impl ReminderStore for ChaosStore {
    async fn create_reminder(&self, r: &NewReminder, now: DateTime<Utc>) -> StoreResult<Reminder> {
        through!(self.create_reminder(r, now))
    }
    async fn get_reminder(&self, id: i64) -> StoreResult<Option<Reminder>> {
        through!(self.get_reminder(id))
    }
    async fn list_reminders(&self, f: &ReminderFilter) -> StoreResult<Vec<Reminder>> {
        through!(self.list_reminders(f))
    }
    async fn list_reminder_summaries(&self, p: &ReminderPage) -> StoreResult<Vec<ReminderSummary>> {
        through!(self.list_reminder_summaries(p))
    }
    async fn reminder_schedules(&self, scan: ScheduleScan) -> StoreResult<Vec<ReminderSchedule>> {
        through!(self.reminder_schedules(scan))
    }
    async fn get_reminder_schedule(&self, id: i64) -> StoreResult<Option<ReminderSchedule>> {
        through!(self.get_reminder_schedule(id))
    }
    async fn update_reminder(
        &self,
        id: i64,
        r: &NewReminder,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        through!(self.update_reminder(id, r, now))
    }
    async fn set_reminder_state(
        &self,
        id: i64,
        state: ReminderState,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        through!(self.set_reminder_state(id, state, now))
    }
}

#[async_trait]
impl RunStore for ChaosStore {
    async fn prune_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<PrunedRuns> {
        through!(self.prune_runs(before, limit))
    }
    async fn create_run(
        &self,
        reminder_id: i64,
        account: &AccountId,
        scheduled_for: DateTime<Utc>,
        status: RunStatus,
        error_summary: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<RunCreated> {
        through!(self.create_run(
            reminder_id,
            account,
            scheduled_for,
            status,
            error_summary,
            now
        ))
    }
    async fn create_runs(
        &self,
        runs: &[NewRun],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<RunCreated>> {
        through!(self.create_runs(runs, now))
    }
    async fn create_chosen_targets(
        &self,
        run: RunId,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        through!(self.create_chosen_targets(run, groups))
    }
    async fn get_run(&self, id: RunId) -> StoreResult<Option<Run>> {
        through!(self.get_run(id))
    }
    async fn list_runs(&self, f: &RunFilter) -> StoreResult<Vec<Run>> {
        through!(self.list_runs(f))
    }
    async fn update_run(&self, id: RunId, u: &RunUpdate) -> StoreResult<Option<Event>> {
        if self.unfenced && u.fence.is_some() {
            let unfenced = RunUpdate {
                fence: None,
                ..u.clone()
            };
            return through!(self.update_run(id, &unfenced));
        }
        if self.blind_writes && u.status.is_some() {
            let blind = RunUpdate {
                expect: RunStatus::ALL.to_vec(),
                ..u.clone()
            };
            return through!(self.update_run(id, &blind));
        }
        if let (true, Some(event)) = (self.event_after_commit, &u.event) {
            let bare = RunUpdate {
                event: None,
                ..u.clone()
            };
            through!(self.update_run(id, &bare))?;
            // The second write, which can fail or never happen.
            return Ok(Some(through!(self.append_event(event))?));
        }
        through!(self.update_run(id, u))
    }
    async fn list_targets(
        &self,
        run: RunId,
        status: Option<TargetStatus>,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<RunTarget>> {
        through!(self.list_targets(run, status, after_position, limit))
    }
    async fn apply_transitions(&self, ts: &[Transition]) -> StoreResult<()> {
        through!(self.apply_transitions(ts))
    }
    async fn unfinished_runs(&self) -> StoreResult<Vec<Run>> {
        through!(self.unfinished_runs())
    }
    async fn sent_since(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<(Option<DateTime<Utc>>, u32)>> {
        through!(self.sent_since(account, since))
    }
    async fn last_scheduled_for(&self, reminder_id: i64) -> StoreResult<Option<DateTime<Utc>>> {
        through!(self.last_scheduled_for(reminder_id))
    }
    async fn apply_transitions_fenced(
        &self,
        fences: &[crate::domain::Fence],
        ts: &[Transition],
    ) -> StoreResult<()> {
        if self.unfenced {
            return through!(self.apply_transitions(ts));
        }
        through!(self.apply_transitions_fenced(fences, ts))
    }
}

#[async_trait]
impl EventStore for ChaosStore {
    async fn prune_events(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        through!(self.prune_events(before, limit))
    }
    async fn events_pruned_through(&self) -> StoreResult<i64> {
        through!(self.events_pruned_through())
    }
    async fn append_event(&self, e: &NewEvent) -> StoreResult<Event> {
        through!(self.append_event(e))
    }
    async fn append_events(&self, events: &[NewEvent]) -> StoreResult<Vec<Event>> {
        through!(self.append_events(events))
    }
    async fn events_after(&self, after_id: i64, limit: u32) -> StoreResult<Vec<Event>> {
        through!(self.events_after(after_id, limit))
    }
}

#[async_trait]
impl GroupStore for ChaosStore {
    async fn sync_groups(
        &self,
        account: &AccountId,
        groups: &[GroupInfo],
        now: DateTime<Utc>,
    ) -> StoreResult<GroupSyncSummary> {
        through!(self.sync_groups(account, groups, now))
    }
    async fn list_groups(&self, f: &GroupFilter) -> StoreResult<GroupPage> {
        through!(self.list_groups(f))
    }
    async fn set_group_labels(
        &self,
        account: &AccountId,
        group: &GroupJid,
        labels: &[Label],
    ) -> StoreResult<Group> {
        through!(self.set_group_labels(account, group, labels))
    }
    async fn groups_synced_at(&self, account: &AccountId) -> StoreResult<Option<DateTime<Utc>>> {
        through!(self.groups_synced_at(account))
    }
    async fn group_names(
        &self,
        account: &AccountId,
        groups: &[GroupJid],
    ) -> StoreResult<std::collections::HashMap<GroupJid, String>> {
        through!(self.group_names(account, groups))
    }
}

#[async_trait]
impl LeaseStore for ChaosStore {
    async fn node_heartbeat(
        &self,
        node: &str,
        instance: &str,
        control_url: Option<&str>,
        ttl: Duration,
    ) -> StoreResult<()> {
        through!(self.node_heartbeat(node, instance, control_url, ttl))
    }
    async fn node_leave(&self, node: &str, instance: &str) -> StoreResult<()> {
        through!(self.node_leave(node, instance))
    }
    async fn live_nodes(&self) -> StoreResult<Vec<crate::domain::NodeInfo>> {
        through!(self.live_nodes())
    }
    async fn list_leases(&self) -> StoreResult<Vec<crate::domain::Lease>> {
        through!(self.list_leases())
    }
    async fn acquire_lease(
        &self,
        account: &AccountId,
        node: &str,
        ttl: Duration,
    ) -> StoreResult<Option<crate::domain::Lease>> {
        through!(self.acquire_lease(account, node, ttl))
    }
    async fn renew_leases(
        &self,
        fences: &[crate::domain::Fence],
        ttl: Duration,
    ) -> StoreResult<Vec<bool>> {
        through!(self.renew_leases(fences, ttl))
    }
    async fn release_lease(&self, fence: &crate::domain::Fence) -> StoreResult<()> {
        through!(self.release_lease(fence))
    }
}

#[async_trait]
impl ConsoleSessionStore for ChaosStore {
    async fn put_console_session(
        &self,
        session: &ConsoleSession,
        now: DateTime<Utc>,
        max: u32,
    ) -> StoreResult<()> {
        through!(self.put_console_session(session, now, max))
    }
    async fn get_console_session(
        &self,
        id_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ConsoleSession>> {
        through!(self.get_console_session(id_hash, now))
    }
    async fn delete_console_session(&self, id_hash: &str) -> StoreResult<()> {
        through!(self.delete_console_session(id_hash))
    }
}

#[async_trait]
impl UserStore for ChaosStore {
    async fn create_user(&self, user: &NewApiUser) -> StoreResult<ApiUser> {
        through!(self.create_user(user))
    }
    async fn list_users(&self) -> StoreResult<Vec<ApiUser>> {
        through!(self.list_users())
    }
    async fn get_user(&self, id: i64) -> StoreResult<ApiUser> {
        through!(self.get_user(id))
    }
    async fn user_by_token(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ApiUser>> {
        through!(self.user_by_token(token_hash, now))
    }
    async fn delete_user(&self, id: i64) -> StoreResult<()> {
        through!(self.delete_user(id))
    }
}

#[async_trait]
impl AuditStore for ChaosStore {
    async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<i64> {
        through!(self.append_audit(entry))
    }
    async fn set_audit_count(&self, id: i64, count: u32) -> StoreResult<()> {
        through!(self.set_audit_count(id, count))
    }
    async fn list_audit(
        &self,
        filter: &AuditFilter,
        before_id: Option<i64>,
        limit: u32,
    ) -> StoreResult<Vec<AuditEntry>> {
        through!(self.list_audit(filter, before_id, limit))
    }
    async fn prune_audit(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        through!(self.prune_audit(before, limit))
    }
}

#[async_trait]
impl WebhookStore for ChaosStore {
    async fn create_webhook(&self, w: &NewWebhook) -> StoreResult<Webhook> {
        through!(self.create_webhook(w))
    }
    async fn list_webhooks(&self) -> StoreResult<Vec<Webhook>> {
        through!(self.list_webhooks())
    }
    async fn get_webhook(&self, id: i64) -> StoreResult<Webhook> {
        through!(self.get_webhook(id))
    }
    async fn update_webhook(&self, id: i64, patch: &WebhookPatch) -> StoreResult<Webhook> {
        through!(self.update_webhook(id, patch))
    }
    async fn rotate_webhook_secret(
        &self,
        id: i64,
        secret: &str,
        now: DateTime<Utc>,
        old_until: DateTime<Utc>,
    ) -> StoreResult<Webhook> {
        through!(self.rotate_webhook_secret(id, secret, now, old_until))
    }
    async fn delete_webhook(&self, id: i64) -> StoreResult<()> {
        through!(self.delete_webhook(id))
    }
    async fn add_delivery(
        &self,
        webhook_id: i64,
        event_id: i64,
        event_type: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<WebhookDelivery> {
        through!(self.add_delivery(webhook_id, event_id, event_type, now))
    }
    async fn list_deliveries(
        &self,
        webhook_id: i64,
        before_id: Option<i64>,
        limit: u32,
    ) -> StoreResult<Vec<WebhookDelivery>> {
        through!(self.list_deliveries(webhook_id, before_id, limit))
    }
    async fn claim_deliveries(
        &self,
        node: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<DueDelivery>> {
        through!(self.claim_deliveries(node, now, until, limit))
    }
    async fn finish_attempt(
        &self,
        delivery_id: i64,
        node: &str,
        outcome: &AttemptOutcome,
        now: DateTime<Utc>,
        disable_after: Duration,
    ) -> StoreResult<()> {
        through!(self.finish_attempt(delivery_id, node, outcome, now, disable_after))
    }
    async fn retry_delivery(
        &self,
        webhook_id: i64,
        delivery_id: i64,
        now: DateTime<Utc>,
    ) -> StoreResult<WebhookDelivery> {
        through!(self.retry_delivery(webhook_id, delivery_id, now))
    }
    async fn webhook_backlog(&self, now: DateTime<Utc>) -> StoreResult<WebhookBacklog> {
        through!(self.webhook_backlog(now))
    }
}

#[async_trait]
impl ReceiptStore for ChaosStore {
    async fn count_receipts(&self, batch: &[Receipt]) -> StoreResult<ReceiptTally> {
        through!(self.count_receipts(batch))
    }
    async fn run_receipts(&self, run: RunId) -> StoreResult<RunReceipts> {
        through!(self.run_receipts(run))
    }
    async fn unreported_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<RunId>> {
        through!(self.unreported_runs(before, limit))
    }
    async fn report_receipts(
        &self,
        run: RunId,
        at: DateTime<Utc>,
        events: &[NewEvent],
    ) -> StoreResult<Vec<Event>> {
        through!(self.report_receipts(run, at, events))
    }
}

#[async_trait]
impl PollStore for ChaosStore {
    async fn open_polls(
        &self,
        run: RunId,
        polls: &[RunPoll],
        messages: &[PollMessage],
    ) -> StoreResult<()> {
        through!(self.open_polls(run, polls, messages))
    }
    async fn count_votes(&self, batch: &[Vote]) -> StoreResult<VoteTally> {
        through!(self.count_votes(batch))
    }
    async fn run_polls(&self, run: RunId) -> StoreResult<Vec<PollResult>> {
        through!(self.run_polls(run))
    }
    async fn group_polls(
        &self,
        run: RunId,
        part: u32,
        after: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<GroupPoll>> {
        through!(self.group_polls(run, part, after, limit))
    }
}

#[async_trait]
impl AmendStore for ChaosStore {
    async fn create_amendment(
        &self,
        a: &NewAmendment,
        fences: &[Fence],
        event: &NewEvent,
    ) -> StoreResult<(Amendment, Event)> {
        through!(self.create_amendment(a, fences, event))
    }
    async fn run_amendment(&self, run: RunId) -> StoreResult<Option<Amendment>> {
        through!(self.run_amendment(run))
    }
    async fn get_amendment(&self, id: i64) -> StoreResult<Option<Amendment>> {
        through!(self.get_amendment(id))
    }
    async fn unfinished_amendments(&self) -> StoreResult<Vec<(Amendment, AccountId)>> {
        through!(self.unfinished_amendments())
    }
    async fn amend_targets(
        &self,
        id: i64,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<AmendTarget>> {
        through!(self.amend_targets(id, after_position, limit))
    }
    async fn mark_amend(
        &self,
        fences: &[Fence],
        id: i64,
        target_id: i64,
        state: AmendState,
        error: Option<&str>,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        through!(self.mark_amend(fences, id, target_id, state, error, at))
    }
    async fn finish_amendment(
        &self,
        fences: &[Fence],
        id: i64,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> StoreResult<Option<Event>> {
        through!(self.finish_amendment(fences, id, at, event))
    }
}
