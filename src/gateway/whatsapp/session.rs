//! One account's WhatsApp session: its client, connection state, pairing
//! state, pending acks and group directory.
//!
//! Account events arrive on the crate's dispatch path and are applied
//! inline ([`Session::apply`]): they only update small tables and watch
//! channels, never await. Sends and uploads wait on those channels with
//! time limits, so a session that cannot reach WhatsApp answers
//! `Unreachable` instead of holding the account's actor. Nothing here is
//! shared between accounts; the only lock held across an await is the
//! account's own group directory, so concurrent sends of one account share
//! one membership request.

use super::ack::{AckJournal, AckOutcome, AckTable, AckWait};
use super::classify::{gateway_error, nack_error, Call, Failure, Signal};
use super::fence::WireGuard;
use super::media::{edit_message, image_message, revoke_message, text_message, StoredUpload};
use super::pairing::{Pairing, PairingView, Phase};
use super::polls::{poll_message, SealedVote};
use super::wire::{GroupFacts, SignalSink, Unopened, Wire};
use super::WhatsappConfig;
use crate::store::whatsapp::WaRows;
use chrono::{DateTime, Utc};
use herald_actors::delivery::signals::AccountSignal;
use herald_actors::domain::{
    AccountId, AccountState, GroupInfo, GroupJid, NewChatQuota, Receipt, TimeLock, UploadHandle,
    Vote, VoteIgnored,
};
use herald_actors::events::EventBus;
use herald_actors::ports::{
    GatewayError, Metrics, OutgoingMessage, ReceiptSink, SendReceipt, StandingError, Store,
};
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The connection as sends see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Connecting or reconnecting since `since`; `cause` is the last reason.
    Down {
        since: Instant,
        cause: Option<String>,
    },
    Up,
    LoggedOut(String),
    Banned {
        until: Option<DateTime<Utc>>,
        reason: String,
    },
    /// Cannot connect until something changes.
    Blocked(String),
}

impl Link {
    fn is_down(&self) -> bool {
        matches!(self, Link::Down { .. })
    }

    /// Applies a signal; true when the link changed.
    fn on_signal(&mut self, s: &Signal) -> bool {
        let next = match (s, &*self) {
            (Signal::Connected, Link::Up) => return false,
            (Signal::Connected, _) => Link::Up,
            (
                Signal::Disconnected(c) | Signal::ConnectRetry(c) | Signal::TransportFailed(c),
                Link::Up | Link::Down { .. },
            ) => Link::Down {
                since: match &*self {
                    Link::Down { since, .. } => *since,
                    _ => Instant::now(),
                },
                cause: Some(c.clone()),
            },
            (Signal::LoggedOut(r), _) => Link::LoggedOut(r.clone()),
            (Signal::Banned { until, reason }, _) => Link::Banned {
                until: *until,
                reason: reason.clone(),
            },
            (Signal::Blocked(r), _) => Link::Blocked(r.clone()),
            _ => return false,
        };
        *self = next;
        true
    }
}

/// Where sessions report account state changes; [`Changes`] writes them
/// to the store, emits `account_state` events and tells the account's
/// actor, on the daemon's runtime.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::UnboundedSender<Change>,
}

/// The changes reported to a [`Recorder`], waiting for the writer that
/// [`spawn`](Self::spawn) starts once what it reports to exists: the
/// gateway is built with its `Recorder` before the actors it wakes, and
/// changes reported in between wait in the channel.
pub struct Changes {
    rx: mpsc::UnboundedReceiver<Change>,
}

/// What a session reports to be written on the daemon's runtime.
enum Change {
    /// A state change to record, with the account-level signal it carries.
    State(
        AccountId,
        AccountState,
        Option<String>,
        Option<AccountSignal>,
    ),
    /// What WhatsApp said of the account as it logged in: its time-lock
    /// and its new-chat quota.
    Standing(
        AccountId,
        Result<TimeLock, StandingError>,
        Result<NewChatQuota, StandingError>,
    ),
}

/// The signal a session link state carries: a logout (a lock when WhatsApp
/// said so) or a ban. They arrive on the session whether or not a send is
/// under way, so they are counted here, once, not by the run.
fn link_signal(link: &Link) -> Option<AccountSignal> {
    match link {
        Link::LoggedOut(r) if r.starts_with(super::classify::LOCKED) => {
            Some(AccountSignal::AccountLocked)
        }
        Link::LoggedOut(_) => Some(AccountSignal::LoggedOut),
        Link::Banned { .. } => Some(AccountSignal::TemporaryBan),
        _ => None,
    }
}

/// Called after a state change is stored, with the new state (the daemon
/// wakes the account's actor, and syncs its groups when it connects).
pub type Notify = Arc<dyn Fn(&AccountId, AccountState) + Send + Sync>;

impl Recorder {
    /// A recorder and the changes it will carry.
    pub fn channel() -> (Self, Changes) {
        let (tx, rx) = mpsc::unbounded_channel::<Change>();
        (Self { tx }, Changes { rx })
    }
}

impl Changes {
    /// Spawns the writer on `handle` (the daemon's runtime, where the store
    /// lives).
    pub fn spawn(
        self,
        handle: &tokio::runtime::Handle,
        store: Arc<dyn Store>,
        events: EventBus,
        metrics: Arc<dyn Metrics>,
        notify: Notify,
        leases: Option<Arc<herald_actors::delivery::leases::LeaseTable>>,
    ) {
        let mut rx = self.rx;
        handle.spawn(async move {
            while let Some(change) = rx.recv().await {
                let (id, state, reason, signal) = match change {
                    Change::State(id, state, reason, signal) => (id, state, reason, signal),
                    Change::Standing(id, lock, quota) => {
                        if leases.as_ref().is_none_or(|t| t.fence(&id).is_some()) {
                            herald_actors::delivery::standing::keep_in(
                                store.as_ref(),
                                &events,
                                Utc::now(),
                                &id,
                                lock,
                                Some(quota),
                            )
                            .await;
                        }
                        continue;
                    }
                };
                // Several daemons: only the lease holder speaks for the
                // account (a client replaced by the new owner's login
                // must not mark it disconnected).
                if leases.as_ref().is_some_and(|t| t.fence(&id).is_none()) {
                    tracing::info!(account = %id, %state, "not recorded: the account is served by another daemon");
                    continue;
                }
                match store.get_account(&id).await {
                    // Deleted, or disabled by the operator: their word wins.
                    Ok(None) => continue,
                    Ok(Some(a)) if a.state == AccountState::Disabled => continue,
                    Ok(Some(a)) if a.state == state && a.state_reason == reason => continue,
                    Ok(Some(_)) => {}
                    Err(e) => {
                        tracing::warn!(account = %id, error = %e, "reading account before recording its state");
                    }
                }
                // The state and its event in one transaction.
                let told = events.event(
                    "account_state",
                    Some(&id),
                    None,
                    serde_json::json!({"state": state, "reason": reason, "source": "whatsapp"}),
                );
                match store
                    .change_account_state(&id, state, reason.as_deref(), None, &told)
                    .await
                {
                    Ok((_, stored)) => events.published(Some(stored)),
                    Err(e) => {
                        tracing::error!(account = %id, %state, error = %e, "could not record account state");
                        continue;
                    }
                }
                tracing::info!(account = %id, %state, reason = reason.as_deref().unwrap_or(""), "WhatsApp account state");
                if let Some(signal) = signal {
                    metrics.account_signal(&id, signal.label());
                    // A lock or a ban follows how the account sent: its
                    // warm-up starts over. A logout by the phone does not.
                    if signal != AccountSignal::LoggedOut {
                        if let Err(e) = store.record_incident(&id, Utc::now()).await {
                            tracing::warn!(account = %id, error = %e, "could not record the incident");
                        }
                    }
                    events
                        .emit(
                            "account_signal",
                            Some(&id),
                            None,
                            serde_json::json!({
                                "signal": signal.label(),
                                "reason": reason,
                                "source": "whatsapp",
                            }),
                        )
                        .await;
                }
                notify(&id, state);
            }
        });
    }
}

impl Recorder {
    pub fn record(&self, account: &AccountId, state: AccountState, reason: Option<String>) {
        let _ = self
            .tx
            .send(Change::State(account.clone(), state, reason, None));
    }

    /// What WhatsApp said of the account at login, to be kept.
    fn standing(
        &self,
        account: &AccountId,
        lock: Result<TimeLock, StandingError>,
        quota: Result<NewChatQuota, StandingError>,
    ) {
        let _ = self.tx.send(Change::Standing(account.clone(), lock, quota));
    }

    /// [`record`](Self::record) a change that carries an account signal.
    pub fn record_signal(
        &self,
        account: &AccountId,
        state: AccountState,
        reason: Option<String>,
        signal: AccountSignal,
    ) {
        let _ = self
            .tx
            .send(Change::State(account.clone(), state, reason, Some(signal)));
    }
}

/// Groups this account may post to, fetched once and kept for a while.
struct Directory {
    fetched: Instant,
    verdicts: HashMap<String, Result<(), GatewayError>>,
}

fn verdict(f: &GroupFacts) -> Result<(), GatewayError> {
    if !f.member {
        Err(GatewayError::NotParticipant)
    } else if f.suspended || (f.announce && !f.admin) {
        Err(GatewayError::NotAllowed)
    } else {
        Ok(())
    }
}

/// A listed group as the directory stores it; `None` for a group the
/// account is not a member of or whose JID Herald cannot use.
fn group_info(f: &GroupFacts) -> Option<GroupInfo> {
    if !f.member {
        return None;
    }
    Some(GroupInfo {
        jid: GroupJid::parse(&f.jid).ok()?,
        subject: f.subject.clone(),
        participants: f.participants,
        // A suspended group takes no messages from anyone, admins included.
        announce: f.announce || f.suspended,
        is_admin: f.admin && !f.suspended,
        community: f.community.as_deref().and_then(|c| GroupJid::parse(c).ok()),
    })
}

pub struct Session {
    pub account: AccountId,
    config: Arc<WhatsappConfig>,
    /// The WhatsApp runtime: crate calls and background work run there.
    rt: tokio::runtime::Handle,
    link: watch::Sender<Link>,
    pairing: watch::Sender<Pairing>,
    acks: Arc<AckTable>,
    /// Where the ids WhatsApp accepted are kept for every owner of the
    /// account (`None`: in memory only).
    accepted: Option<WaRows>,
    /// Where the receipts for the account's messages go to be counted.
    receipts: Option<ReceiptSink>,
    /// The account's client, once opened. A watch, not a cell: the client
    /// reports as soon as it logs in (the votes WhatsApp kept for the
    /// device among the first), before its opener has handed it over, and
    /// what needs the client then waits for it instead of dropping it.
    wire: watch::Sender<Option<Arc<dyn Wire>>>,
    directory: tokio::sync::Mutex<Option<Directory>>,
    recorder: Option<Recorder>,
    /// Opened to pair: a failed attempt stops the client instead of letting
    /// it cycle through QR codes in the background.
    pairing_mode: bool,
    /// Whether this daemon still holds the account's lease.
    guard: WireGuard,
}

/// Where what WhatsApp says of the account's messages is kept: the ids it
/// accepted and the receipts the members' devices send.
#[derive(Clone, Default)]
pub struct Heard {
    pub accepted: Option<WaRows>,
    pub receipts: Option<ReceiptSink>,
}

impl Session {
    pub fn new(
        account: AccountId,
        config: Arc<WhatsappConfig>,
        rt: tokio::runtime::Handle,
        recorder: Option<Recorder>,
        pairing: Pairing,
        heard: Heard,
        guard: WireGuard,
    ) -> Arc<Self> {
        let acks = AckTable::new(config.remember_acks);
        let pairing_mode = pairing.in_progress();
        Arc::new(Self {
            account,
            config,
            rt,
            link: watch::Sender::new(Link::Down {
                since: Instant::now(),
                cause: None,
            }),
            pairing: watch::Sender::new(pairing),
            acks,
            accepted: heard.accepted,
            receipts: heard.receipts,
            wire: watch::Sender::new(None),
            directory: tokio::sync::Mutex::new(None),
            recorder,
            pairing_mode,
            guard,
        })
    }

    /// Learns the ids WhatsApp accepted from the account, by this daemon
    /// or an earlier owner (the newest `whatsapp.remember_acks`), after
    /// importing a journal file an earlier version of Herald kept
    /// (`<data_dir>/whatsapp/<account>/acked-ids`), which is then deleted.
    pub async fn load_accepted(&self, legacy_journal: &Path) -> Result<(), String> {
        let Some(rows) = &self.accepted else {
            return Ok(());
        };
        if legacy_journal.exists() {
            let ids = AckJournal::load(legacy_journal);
            rows.accept_ids(&self.account, &ids, Utc::now())
                .await
                .map_err(|e| format!("importing {}: {e}", legacy_journal.display()))?;
            std::fs::remove_file(legacy_journal).map_err(|e| {
                format!(
                    "removing {} after its import: {e}",
                    legacy_journal.display()
                )
            })?;
            tracing::info!(account = %self.account, ids = ids.len(), "accepted message ids imported from the journal file into the database");
        }
        let limit = u32::try_from(self.config.remember_acks).unwrap_or(u32::MAX);
        let recent = rows
            .recent_accepted(&self.account, limit)
            .await
            .map_err(|e| format!("reading the accepted message ids: {e}"))?;
        self.acks
            .remember_accepted(recent.iter().rev().map(String::as_str));
        Ok(())
    }

    /// WhatsApp accepted `wire_id` already, from this daemon or another
    /// owner of the account (which may have taken it over meanwhile).
    async fn already_accepted(&self, wire_id: &str) -> Result<bool, GatewayError> {
        if self.acks.was_accepted(wire_id) {
            return Ok(true);
        }
        let Some(rows) = &self.accepted else {
            return Ok(false);
        };
        // Unknown is neither yes (the group would never get it) nor no (a
        // second stanza): the engine tries the part again.
        rows.was_accepted(&self.account, wire_id)
            .await
            .map_err(|e| {
                GatewayError::Transient(format!("could not read the accepted message ids: {e}"))
            })
    }

    /// What the session and its transport ask before writing.
    pub fn guard(&self) -> &WireGuard {
        &self.guard
    }

    /// The sink the account's client reports to. Weak: the client must not
    /// keep a stopped session alive.
    pub fn sink(self: &Arc<Self>) -> SignalSink {
        let me = Arc::downgrade(self);
        Arc::new(move |s| {
            if let Some(session) = Weak::upgrade(&me) {
                session.apply(s);
            }
        })
    }

    pub fn set_wire(&self, wire: Arc<dyn Wire>) {
        self.wire.send_if_modified(|w| {
            let first = w.is_none();
            if first {
                *w = Some(wire);
            }
            first
        });
    }

    /// The client, if it has been handed over yet.
    fn wire(&self) -> Option<Arc<dyn Wire>> {
        self.wire.borrow().clone()
    }

    /// The client once it is handed over: `None` if the session goes (its
    /// opening failed) or it takes longer than the connect timeout.
    fn wire_soon(&self) -> impl Future<Output = Option<Arc<dyn Wire>>> + Send + 'static {
        let mut rx = self.wire.subscribe();
        let limit = self.config.connect_timeout;
        async move {
            let handed = tokio::time::timeout(limit, rx.wait_for(Option::is_some)).await;
            handed.ok()?.ok()?.clone()
        }
    }

    pub fn link(&self) -> Link {
        self.link.borrow().clone()
    }

    pub fn pairing(&self) -> Pairing {
        self.pairing.borrow().clone()
    }

    pub fn view(&self) -> PairingView {
        self.pairing.borrow().view(self.account.as_str())
    }

    pub fn subscribe_pairing(&self) -> watch::Receiver<Pairing> {
        self.pairing.subscribe()
    }

    /// Adjusts the pairing state directly (the gateway sets what it learnt
    /// while opening the session).
    pub fn apply_pairing(&self, f: impl FnOnce(&mut Pairing)) {
        self.pairing.send_modify(f);
    }

    pub fn is_paired(&self) -> bool {
        matches!(self.pairing.borrow().phase, Phase::Paired { .. })
    }

    fn record(&self, state: AccountState, reason: Option<String>) {
        self.record_with(state, reason, None);
    }

    fn record_with(
        &self,
        state: AccountState,
        reason: Option<String>,
        signal: Option<AccountSignal>,
    ) {
        match (&self.recorder, signal) {
            (Some(r), Some(s)) => r.record_signal(&self.account, state, reason, s),
            (Some(r), None) => r.record(&self.account, state, reason),
            (None, _) => {}
        }
    }

    /// Opens votes for the account's polls off the dispatch path and hands
    /// them to the counter; one that does not open is counted as such.
    fn open_votes(&self, votes: Vec<SealedVote>) {
        let Some(sink) = self.receipts.clone() else {
            return;
        };
        let (account, wire) = (self.account.clone(), self.wire_soon());
        self.rt.spawn(async move {
            let Some(wire) = wire.await else {
                tracing::warn!(%account, votes = votes.len(), "votes heard while the account's client was opening were not opened: it never opened");
                return;
            };
            for v in votes {
                let Ok(chat) = GroupJid::parse(&v.chat) else {
                    continue;
                };
                match wire.open_vote(&v).await {
                    Ok(o) => {
                        sink.offer_vote(Vote {
                            account: account.clone(),
                            chat,
                            poll_id: v.poll_id,
                            voter: o.voter,
                            options: o.options,
                            at: v.at,
                        });
                    }
                    Err(Unopened::NotOurs) => {
                        sink.vote_unopened(VoteIgnored::UnknownPoll);
                    }
                    Err(Unopened::Failed(e)) => {
                        tracing::info!(%account, poll = %v.poll_id, voter = %v.voter, error = %e, "a vote on the account's poll did not open");
                        sink.vote_unopened(VoteIgnored::Undecryptable);
                    }
                }
            }
        });
    }

    /// Applies an account event. Inline on the crate's dispatch path: no
    /// awaiting, no blocking I/O.
    pub fn apply(&self, s: Signal) {
        if let Signal::Receipt {
            chat,
            participant,
            ids,
            kind,
            at,
        } = s
        {
            if let (Some(sink), Ok(chat)) = (&self.receipts, GroupJid::parse(&chat)) {
                for id in ids {
                    sink.offer(Receipt {
                        account: self.account.clone(),
                        chat: chat.clone(),
                        message_id: id,
                        participant: participant.clone(),
                        kind,
                        at,
                    });
                }
            }
            return;
        }
        if let Signal::PollVotes(votes) = s {
            self.open_votes(votes);
            return;
        }
        if let Signal::Ack { id, refused } = &s {
            let outcome = match refused {
                None => AckOutcome::Accepted,
                Some(code) => AckOutcome::Refused(code.clone()),
            };
            self.acks.resolve(id, outcome.clone());
            if outcome == AckOutcome::Accepted {
                if let Some(rows) = self.accepted.clone() {
                    let (account, ids) = (self.account.clone(), [id.clone()]);
                    self.rt.spawn(async move {
                        if let Err(e) = rows.accept_ids(&account, &ids, Utc::now()).await {
                            tracing::warn!(%account, error = %e, "could not record an accepted message id");
                        }
                    });
                }
            }
            return;
        }
        let now = Utc::now();
        let mut failed_pairing = None;
        self.pairing.send_if_modified(|p| {
            let changed = p.on_signal(&s, now);
            if changed {
                if let Phase::Failed { reason } = &p.phase {
                    failed_pairing = Some(reason.clone());
                }
            }
            changed
        });
        if let Some(reason) = failed_pairing {
            self.pairing_failed(reason);
        }
        let mut now_link = None;
        self.link.send_if_modified(|l| {
            let changed = l.on_signal(&s);
            if changed {
                now_link = Some(l.clone());
            }
            changed
        });
        let signal = now_link.as_ref().and_then(link_signal);
        match now_link {
            Some(Link::Up) => {
                self.record(AccountState::Connected, None);
                self.read_standing();
            }
            Some(Link::Down { cause, .. }) => self.record_if_still_down(cause),
            Some(Link::LoggedOut(r)) => self.record_with(AccountState::LoggedOut, Some(r), signal),
            Some(Link::Banned { until, reason }) => self.record_with(
                AccountState::Banned,
                Some(match until {
                    Some(t) => format!("{reason} until {}", t.to_rfc3339()),
                    None => reason,
                }),
                signal,
            ),
            Some(Link::Blocked(r)) => self.record(AccountState::Disconnected, Some(r)),
            None => {}
        }
    }

    /// Asks WhatsApp what it says of the account (time-lock, new-chat
    /// quota) as it logs in, as WhatsApp Web does, off the dispatch path;
    /// the recorder's writer keeps the answers.
    fn read_standing(&self) {
        let Some(recorder) = self.recorder.clone() else {
            return;
        };
        let (account, doc, wire) = (
            self.account.clone(),
            self.config.quota_doc_id,
            self.wire_soon(),
        );
        self.rt.spawn(async move {
            let Some(wire) = wire.await else {
                return;
            };
            let lock = wire.reachout_timelock().await;
            let quota = wire.new_chat_quota(doc).await;
            recorder.standing(&account, lock, quota);
        });
    }

    /// A dropped connection is recorded only if it stays down: WhatsApp
    /// recycles connections routinely and a flapping state would halt the
    /// account's queued runs for nothing.
    fn record_if_still_down(&self, cause: Option<String>) {
        if self.recorder.is_none() || !self.is_paired() {
            return;
        }
        let mut rx = self.link.subscribe();
        let wait = self.config.reconnect_wait;
        let recorder = self.recorder.clone();
        let account = self.account.clone();
        self.rt.spawn(async move {
            let back = tokio::time::timeout(wait, rx.wait_for(|l| !l.is_down())).await;
            if back.is_err() {
                if let Some(r) = recorder {
                    let why = cause.unwrap_or_else(|| "no connection to WhatsApp".into());
                    r.record(&account, AccountState::Disconnected, Some(why));
                }
            }
        });
    }

    fn pairing_failed(&self, reason: String) {
        self.record(AccountState::Pairing, Some(reason));
        if self.pairing_mode {
            if let Some(w) = self.wire() {
                self.rt.spawn(async move { w.shutdown().await });
            }
        }
    }

    /// Fails a pairing attempt that got no answer in time.
    pub fn fail_pairing(&self, reason: String) {
        let now = Utc::now();
        if self
            .pairing
            .send_if_modified(|p| p.fail(reason.clone(), now))
        {
            self.pairing_failed(reason);
        }
    }

    /// Records that pairing started (the account cannot send meanwhile).
    pub fn record_pairing_started(&self) {
        self.record(AccountState::Pairing, Some("pairing started".into()));
    }

    /// Stops the client (bounded).
    pub async fn stop(&self) {
        if let Some(w) = self.wire() {
            let _ = self
                .on_wa(Duration::from_secs(15), async move { w.shutdown().await })
                .await;
        }
    }

    /// Runs `fut` on the WhatsApp runtime, at most `limit` (the crate calls
    /// inside carry their own, shorter limits; this one is the backstop).
    async fn on_wa<T: Send + 'static>(
        &self,
        limit: Duration,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, GatewayError> {
        let task = self.rt.spawn(fut);
        let abort = task.abort_handle();
        match tokio::time::timeout(limit, task).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(GatewayError::Transient(format!("WhatsApp task ended: {e}"))),
            Err(_) => {
                abort.abort();
                Err(GatewayError::Transient(format!(
                    "WhatsApp did not answer within {limit:?}"
                )))
            }
        }
    }

    /// Waits (bounded) until the account can send, or says why it cannot.
    /// A connection that has been down longer than `reconnect_wait` fails at
    /// once, so a run on an unreachable account does not wait per message.
    pub async fn ready(&self) -> Result<Arc<dyn Wire>, GatewayError> {
        let Some(wire) = self.wire() else {
            return Err(GatewayError::LoggedOut);
        };
        let mut rx = self.link.subscribe();
        loop {
            let link = rx.borrow_and_update().clone();
            let (since, cause) = match link {
                Link::Up if self.is_paired() => return Ok(wire),
                // Connected but never paired cannot happen; treat as not paired.
                Link::Up => return Err(GatewayError::LoggedOut),
                Link::LoggedOut(_) => return Err(GatewayError::LoggedOut),
                _ if !self.is_paired() => return Err(GatewayError::LoggedOut),
                Link::Banned { until, .. } if until.is_none_or(|u| u > Utc::now()) => {
                    return Err(GatewayError::Banned { until })
                }
                Link::Banned { reason, .. } => (Instant::now(), Some(reason)),
                Link::Blocked(r) => return Err(GatewayError::Unreachable(r)),
                Link::Down { since, cause } => (since, cause),
            };
            let deadline = since + self.config.reconnect_wait;
            let why = || {
                let waited = self.config.reconnect_wait.as_secs();
                GatewayError::Unreachable(match &cause {
                    Some(c) => format!("{c} (no connection for {waited} s)"),
                    None => format!("no connection for {waited} s"),
                })
            };
            if Instant::now() >= deadline {
                return Err(why());
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => return Err(why()),
            }
        }
    }

    /// Whether the account may post to `group`: the account's groups are
    /// listed once (one request) and kept for `groups_ttl`; a group not on
    /// the list is looked up once, so a group the account is not in fails
    /// fast with `NotParticipant` (or `GroupNotFound`).
    async fn check_group(
        &self,
        wire: &Arc<dyn Wire>,
        group: &GroupJid,
    ) -> Result<(), GatewayError> {
        let limit = self.config.request_timeout + Duration::from_secs(5);
        let mut dir = self.directory.lock().await;
        let stale = dir
            .as_ref()
            .is_none_or(|d| d.fetched.elapsed() >= self.config.groups_ttl);
        if stale {
            let w = wire.clone();
            let listed = self
                .on_wa(limit, async move { w.participating().await })
                .await?
                .map_err(|f| gateway_error(&f, Call::Groups))?;
            *dir = Some(Directory {
                fetched: Instant::now(),
                verdicts: listed.iter().map(|f| (f.jid.clone(), verdict(f))).collect(),
            });
        }
        let d = dir.as_mut().expect("filled above");
        if let Some(v) = d.verdicts.get(group.as_str()) {
            return v.clone();
        }
        let (w, g) = (wire.clone(), group.clone());
        let looked_up = self.on_wa(limit, async move { w.group(&g).await }).await?;
        let v = match looked_up {
            Ok(facts) => verdict(&facts),
            Err(f) => match gateway_error(&f, Call::Groups) {
                e @ (GatewayError::GroupNotFound | GatewayError::NotParticipant) => Err(e),
                // Not an answer about the group: do not remember it.
                other => return Err(other),
            },
        };
        d.verdicts.insert(group.as_str().to_owned(), v.clone());
        v
    }

    /// Every group the account is in, with one request; the answer also
    /// refreshes the membership cache the send path checks.
    pub async fn list_groups(&self) -> Result<Vec<GroupInfo>, GatewayError> {
        let wire = self.ready().await?;
        let limit = self.config.request_timeout + Duration::from_secs(5);
        let listed = self
            .on_wa(limit, async move { wire.participating().await })
            .await?
            .map_err(|f| gateway_error(&f, Call::Groups))?;
        *self.directory.lock().await = Some(Directory {
            fetched: Instant::now(),
            verdicts: listed.iter().map(|f| (f.jid.clone(), verdict(f))).collect(),
        });
        Ok(listed.iter().filter_map(group_info).collect())
    }

    async fn forget_group(&self, group: &GroupJid) {
        if let Some(d) = self.directory.lock().await.as_mut() {
            d.verdicts.remove(group.as_str());
        }
    }

    /// The account's reach-out time-lock, asked of WhatsApp now.
    pub async fn timelock(&self) -> Result<TimeLock, StandingError> {
        let wire = self
            .ready()
            .await
            .map_err(|e| StandingError::NotNow(e.to_string()))?;
        let limit = self.config.request_timeout + Duration::from_secs(5);
        self.on_wa(limit, async move { wire.reachout_timelock().await })
            .await
            .map_err(|e| StandingError::NotNow(e.to_string()))?
    }

    /// The account's new-chat quota, asked of WhatsApp now.
    pub async fn quota(&self, doc_id: &'static str) -> Result<NewChatQuota, StandingError> {
        let wire = self
            .ready()
            .await
            .map_err(|e| StandingError::NotNow(e.to_string()))?;
        let limit = self.config.request_timeout + Duration::from_secs(5);
        self.on_wa(limit, async move { wire.new_chat_quota(doc_id).await })
            .await
            .map_err(|e| StandingError::NotNow(e.to_string()))?
    }

    /// Shows the account as typing in `group`. Only when the account is
    /// ready: a presence is not worth waiting for a reconnect.
    pub async fn typing(&self, group: &GroupJid) -> Result<(), GatewayError> {
        let wire = self.ready().await?;
        let (w, g) = (wire.clone(), group.clone());
        let limit = self.config.request_timeout + Duration::from_secs(5);
        self.on_wa(limit, async move { w.composing(&g).await })
            .await?
            .map_err(|f| gateway_error(&f, Call::Send))
    }

    /// Sends one message with the given wire id and waits for the server's
    /// verdict.
    pub async fn send(
        &self,
        group: &GroupJid,
        message: &OutgoingMessage,
        wire_id: &str,
    ) -> Result<SendReceipt, GatewayError> {
        let body = match message {
            OutgoingMessage::Text(t) => Some(text_message(t)),
            OutgoingMessage::Media {
                upload,
                mime,
                caption,
            } => {
                let stored = StoredUpload::decode(&upload.handle)
                    .filter(|_| StoredUpload::usable(upload.expires_at, Utc::now()))
                    .ok_or(GatewayError::MediaExpired)?;
                Some(image_message(&stored, caption.as_deref(), mime))
            }
            OutgoingMessage::Revoke { of } => {
                Some(revoke_message(group, &super::ids::wire_id(of)?))
            }
            OutgoingMessage::Edit { of, text } => Some(edit_message(
                group,
                &super::ids::wire_id(of)?,
                text,
                Utc::now(),
            )),
            // Built once the client is at hand: its secret comes from it.
            OutgoingMessage::Poll { .. } => None,
        };
        if self.already_accepted(wire_id).await? {
            return Ok(SendReceipt { duplicate: true });
        }
        let wire = self.ready().await?;
        self.check_group(&wire, group).await?;
        let body = match body {
            Some(body) => body,
            None => {
                let OutgoingMessage::Poll {
                    question,
                    options,
                    multiple,
                } = message
                else {
                    return Err(GatewayError::Unsupported("no message was built to send"));
                };
                let secret = wire
                    .poll_secret(wire_id)
                    .map_err(|f| gateway_error(&f, Call::Send))?;
                poll_message(question, options, *multiple, secret)
            }
        };
        // The last look before the client builds and writes the stanza (its
        // transport looks again at each frame).
        self.guard.check()?;
        let pending = self.acks.expect(wire_id);
        let (w, g, id) = (wire.clone(), group.clone(), wire_id.to_owned());
        let limit = self.config.request_timeout + Duration::from_secs(5);
        let written = self
            .on_wa(limit, async move { w.send(&g, body, &id).await })
            .await?;
        match written {
            Ok(()) => {}
            // The transport refused the frame: the lease ended meanwhile.
            Err(_) if !self.guard.may_write() => {
                drop(pending);
                return Err(self.guard.check().unwrap_err());
            }
            Err(Failure::Offline(cause)) => {
                drop(pending);
                // Take the dropped socket into account now rather than when
                // the crate's event arrives.
                self.apply(Signal::Disconnected(cause));
                self.ready().await?;
                return Err(GatewayError::Transient(
                    "the connection dropped while sending; it is back, so the part is sent again with the same id".into(),
                ));
            }
            Err(Failure::NotLoggedIn) => {
                drop(pending);
                return Err(match self.link() {
                    Link::LoggedOut(_) => GatewayError::LoggedOut,
                    // With the socket up, the crate drops its login only on a
                    // 429 or 503 stream error (which it does not dispatch as
                    // an event): slow the account down rather than retry at
                    // once into the same limit.
                    Link::Up => GatewayError::RateLimited { retry_after: None },
                    _ => GatewayError::Transient(
                        "the WhatsApp session is re-establishing its login".into(),
                    ),
                });
            }
            Err(f) => {
                let e = gateway_error(&f, Call::Send);
                if e.is_target_failure() {
                    self.forget_group(group).await;
                }
                return Err(e);
            }
        }
        match pending.wait(self.config.ack_timeout).await {
            AckWait::Accepted => Ok(SendReceipt { duplicate: false }),
            AckWait::Refused(code) => {
                let e = nack_error(&code);
                if e.is_target_failure() {
                    self.forget_group(group).await;
                }
                Err(e)
            }
            AckWait::TimedOut => Err(GatewayError::Transient(format!(
                "WhatsApp did not confirm message {wire_id} within {} s; it is sent again with the same id",
                self.config.ack_timeout.as_secs()
            ))),
        }
    }

    /// Uploads an image once; the handle serves every group until it expires.
    pub async fn upload(&self, mime: &str, bytes: Arc<[u8]>) -> Result<UploadHandle, GatewayError> {
        if !mime.starts_with("image/") {
            return Err(GatewayError::Transient(format!(
                "only images can be sent through WhatsApp by this version of Herald, not {mime}"
            )));
        }
        let wire = self.ready().await?;
        self.guard.check()?;
        let limit = self.config.upload_timeout + Duration::from_secs(5);
        let uploaded = self
            .on_wa(
                limit,
                async move { wire.upload_image(bytes.to_vec()).await },
            )
            .await?;
        match uploaded {
            Ok(u) => Ok(UploadHandle {
                handle: u.encode(),
                expires_at: Utc::now()
                    + chrono::Duration::from_std(self.config.upload_valid_for)
                        .unwrap_or_else(|_| chrono::Duration::days(7)),
            }),
            Err(Failure::Offline(cause)) => {
                self.apply(Signal::Disconnected(cause));
                self.ready().await?;
                Err(GatewayError::Transient(
                    "the connection dropped during the upload; try again".into(),
                ))
            }
            Err(f) => Err(gateway_error(&f, Call::Upload)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_follows_connection_signals() {
        let mut l = Link::Down {
            since: Instant::now(),
            cause: None,
        };
        assert!(l.on_signal(&Signal::Connected));
        assert_eq!(l, Link::Up);
        assert!(!l.on_signal(&Signal::Connected));
        assert!(l.on_signal(&Signal::Disconnected("reset".into())));
        assert!(matches!(&l, Link::Down { cause: Some(c), .. } if c == "reset"));
        assert!(l.on_signal(&Signal::LoggedOut("removed".into())));
        assert!(
            !l.on_signal(&Signal::TransportFailed("dns".into())),
            "a logged-out account stays logged out"
        );
        assert!(l.on_signal(&Signal::Connected), "until it logs in again");
        assert!(l.on_signal(&Signal::Banned {
            until: None,
            reason: "ban".into()
        }));
        assert!(l.on_signal(&Signal::Blocked("replaced".into())));
        assert!(!l.on_signal(&Signal::Qr {
            code: "x".into(),
            valid_for: Duration::from_secs(1)
        }));
    }

    #[test]
    fn listed_groups_say_who_may_post_as_the_send_path_does() {
        let facts = |jid: &str, member, admin, announce, suspended| GroupFacts {
            jid: jid.into(),
            member,
            admin,
            announce,
            suspended,
            subject: format!("Team {jid}"),
            participants: 7,
            community: Some("120363999999999999@g.us".into()),
        };
        for f in [
            facts("1@g.us", true, false, false, false),
            facts("2@g.us", true, false, true, false),
            facts("3@g.us", true, true, true, false),
            facts("4@g.us", true, true, false, true),
        ] {
            let info = group_info(&f).expect("a member's group is listed");
            assert_eq!(info.can_post(), verdict(&f).is_ok(), "{f:?}");
            assert_eq!(info.subject, f.subject);
            assert_eq!(info.participants, 7);
            assert_eq!(info.community.unwrap().as_str(), "120363999999999999@g.us");
        }
        assert!(group_info(&facts("5@g.us", false, false, false, false)).is_none());
        assert!(group_info(&facts("not-a-jid", true, false, false, false)).is_none());
    }

    #[test]
    fn group_verdicts() {
        let f = |member, admin, announce, suspended| GroupFacts {
            jid: "1@g.us".into(),
            member,
            admin,
            announce,
            suspended,
            subject: "Team".into(),
            participants: 5,
            community: None,
        };
        assert_eq!(verdict(&f(true, false, false, false)), Ok(()));
        assert_eq!(
            verdict(&f(false, false, false, false)),
            Err(GatewayError::NotParticipant)
        );
        assert_eq!(
            verdict(&f(true, false, true, false)),
            Err(GatewayError::NotAllowed)
        );
        assert_eq!(
            verdict(&f(true, true, true, false)),
            Ok(()),
            "admins post in announcement groups"
        );
        assert_eq!(
            verdict(&f(true, true, false, true)),
            Err(GatewayError::NotAllowed)
        );
    }
}
