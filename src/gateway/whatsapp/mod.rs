//! The WhatsApp Web gateway: real accounts through whatsapp-rust 0.7
//! (multi-device), one client and one session store per account.
//!
//! - Sessions live in the shared database ([`backend`], sealed by [`seal`]),
//!   so any daemon holding an account's lease can log it in;
//!   [`WhatsappGateway::resume`] reconnects the paired ones at start-up, and
//!   with leases [`WhatsappGateway::follow_leases`] connects the accounts
//!   this daemon holds and drops those it no longer does.
//! - Pairing by QR or pair code is a per-account state machine
//!   ([`pairing`]) the control port reads and drives.
//! - A send maps the engine's message id to the crate's id shape
//!   ([`ids`]), checks group membership (once per account, cached), writes
//!   the message and waits for the server's ack ([`ack`]) with a time
//!   limit; the verdict and every crate error map to the engine's
//!   `GatewayError` ([`classify`]).
//! - Account events (logged out, banned, disconnected, connected) update the
//!   session and are recorded in the store with an `account_state` event.
//! - All crate work runs on a small runtime of its own, so a slow or
//!   unreachable WhatsApp never occupies the actors' threads, and every
//!   network wait has a limit.
//!
//! Imports: `seal`, `settings`, `token`, `store::whatsapp`,
//! `gateway::pairing_view` (what it fills in), and of the core
//! `herald_actors::domain`, `herald_actors::ports`, `herald_actors::events`,
//! `herald_actors::delivery` and `herald_actors::supervisor`.

pub mod ack;
pub mod backend;
pub mod classify;
pub mod config;
pub mod crypto;
pub mod fence;
mod gather;
pub mod ids;
pub mod import;
pub mod known;
pub mod media;
mod pace;
pub mod pairing;
pub mod polls;
pub mod session;
pub mod standing;
pub mod store;
pub mod wire;

use async_trait::async_trait;
pub use config::WhatsappConfig;
use herald_actors::delivery::account::AccountChanged;
use herald_actors::domain::{
    Account, AccountId, AccountState, GatewayKind, GroupInfo, GroupJid, MediaId, NewChatQuota,
    TimeLock, UploadHandle,
};
use herald_actors::events::EventBus;
use herald_actors::ports::{
    Gateway, GatewayError, OutgoingMessage, ReceiptSink, SendReceipt, StandingError, Store,
};
use herald_actors::supervisor::Door;
use pace::LoginPace;
use pairing::{normalize_phone, Pairing, PairingError, PairingView, Phase, Started};
use session::Session;
pub use session::{Changes, Recorder};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use wire::{BotConnector, Connector, OpenRequest};

/// The runtime the crate's clients run on. Dropped without blocking, so
/// the gateway can go away inside an async context (tests, shutdown).
struct WaRuntime {
    rt: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl WaRuntime {
    fn new(threads: usize) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("whatsapp")
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        Ok(Self {
            rt: Some(rt),
            handle,
        })
    }
}

impl Drop for WaRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// One account's place in the gateway. `life` serialises opening, pairing
/// and stopping of that account only.
#[derive(Default)]
struct Slot {
    life: tokio::sync::Mutex<()>,
    session: Mutex<Option<Arc<Session>>>,
}

impl Slot {
    fn current(&self) -> Option<Arc<Session>> {
        self.session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, s: Option<Arc<Session>>) {
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }
}

struct Inner {
    config: Arc<WhatsappConfig>,
    root: PathBuf,
    runtime: WaRuntime,
    connector: Arc<dyn Connector>,
    slots: Mutex<HashMap<AccountId, Arc<Slot>>>,
    /// Where sessions report state changes (`None`: not recorded).
    recorder: Option<Recorder>,
    /// The sessions in the database (`None` under the tests' fake connector).
    sessions: Option<store::SessionStore>,
    /// Where receipts go to be counted (`None`: not counted).
    receipts: Option<ReceiptSink>,
}

/// The `whatsapp` gateway kind. Cheap to clone.
#[derive(Clone)]
pub struct WhatsappGateway {
    inner: Arc<Inner>,
}

impl WhatsappGateway {
    /// The real gateway: sessions in the database, accepted-id journals
    /// under `<data_dir>/whatsapp/`.
    pub fn new(
        config: WhatsappConfig,
        data_dir: &Path,
        sessions: store::SessionStore,
    ) -> std::io::Result<Self> {
        let config = Arc::new(config);
        let connector = Arc::new(BotConnector {
            config: config.clone(),
            sessions: sessions.clone(),
            pace: Arc::new(tokio::sync::Mutex::new(LoginPace::new(
                config.logins_per_sec,
                &mut rand::rng(),
            ))),
        });
        Self::with_connector(config, data_dir, connector, Some(sessions))
    }

    fn with_connector(
        config: Arc<WhatsappConfig>,
        data_dir: &Path,
        connector: Arc<dyn Connector>,
        sessions: Option<store::SessionStore>,
    ) -> std::io::Result<Self> {
        // Before any client: the agreement is chosen once per process.
        crypto::install();
        let root = data_dir.join("whatsapp");
        std::fs::create_dir_all(&root)?;
        Ok(Self {
            inner: Arc::new(Inner {
                runtime: WaRuntime::new(config.threads)?,
                config,
                root,
                connector,
                slots: Mutex::new(HashMap::new()),
                recorder: None,
                sessions,
                receipts: None,
            }),
        })
    }

    /// Hands the receipts every account's client hears to `sink`. Call
    /// right after building the gateway, before it is cloned.
    pub fn with_receipts(mut self, sink: ReceiptSink) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("receipts are attached before the gateway is shared")
            .receipts = Some(sink);
        self
    }

    /// Sessions report their account's state changes to `recorder`. Call
    /// right after building the gateway, before it is cloned.
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("the recorder is attached before the gateway is shared")
            .recorder = Some(recorder);
        self
    }

    /// Writes the `changes` this gateway's sessions report: stored in
    /// `store`, emitted on `events`, the account's actor woken, and
    /// `connected` called when an account becomes connected (a pairing, or
    /// back after a logout or a ban). Call once, on the daemon's runtime,
    /// once the actors exist and before [`resume`](Self::resume).
    pub fn record(
        &self,
        changes: Changes,
        store: Arc<dyn Store>,
        events: EventBus,
        metrics: Arc<dyn herald_actors::ports::Metrics>,
        actors: Door,
        connected: Arc<dyn Fn(&AccountId) + Send + Sync>,
    ) {
        let notify: session::Notify = Arc::new(move |id: &AccountId, state| {
            if let Some(actor) = actors.actor(id) {
                actor.do_send(AccountChanged);
            }
            if state == herald_actors::domain::AccountState::Connected {
                connected(id);
            }
        });
        changes.spawn(
            &tokio::runtime::Handle::current(),
            store,
            events,
            metrics,
            notify,
            self.inner
                .sessions
                .as_ref()
                .and_then(|s| s.leases().cloned()),
        );
    }

    fn slot(&self, id: &AccountId) -> Arc<Slot> {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.clone())
            .or_default()
            .clone()
    }

    /// Whether `id` has a client here (without making it a slot).
    fn client_open(&self, id: &AccountId) -> bool {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .is_some_and(|s| s.current().is_some())
    }

    /// `<data_dir>/whatsapp/<account_id>/`.
    pub fn account_dir(&self, id: &AccountId) -> PathBuf {
        self.inner.root.join(id.as_str())
    }

    fn config(&self) -> &WhatsappConfig {
        &self.inner.config
    }

    /// Opens an account's client on the WhatsApp runtime: to pair
    /// (`pairing: Some`), or from its stored session (`None`; `Ok(None)`
    /// when the store holds no login).
    async fn open(
        &self,
        id: &AccountId,
        pairing: Option<Option<String>>,
    ) -> Result<Option<Arc<Session>>, String> {
        let now = chrono::Utc::now();
        let mut state = Pairing::new(Phase::Paired { jid: None }, now);
        if let Some(phone) = &pairing {
            state = Pairing::new(Phase::Idle, now);
            let _ = state.start(phone.clone(), now);
        }
        let dir = self.account_dir(id);
        let session = Session::new(
            id.clone(),
            self.inner.config.clone(),
            self.inner.runtime.handle.clone(),
            self.inner.recorder.clone(),
            state,
            session::Heard {
                accepted: self.inner.sessions.as_ref().map(|s| s.rows().clone()),
                receipts: self.inner.receipts.clone(),
            },
            self.wire_guard(id),
        );
        session.load_accepted(&dir.join("acked-ids")).await?;
        let req = OpenRequest {
            account: id.clone(),
            dir,
            pairing: pairing.clone(),
            sink: session.sink(),
            guard: session.guard().clone(),
        };
        let connector = self.inner.connector.clone();
        let limit = self.config().connect_timeout;
        let opened = self
            .inner
            .runtime
            .handle
            .spawn(async move { tokio::time::timeout(limit, connector.open(req)).await })
            .await
            .map_err(|e| format!("opening the session: {e}"))?
            .map_err(|_| format!("opening the session store took longer than {limit:?}"))??;
        let Some(wire) = opened.wire else {
            return Ok(None);
        };
        if pairing.is_none() {
            let jid = opened.paired_as.clone();
            session.apply_pairing(move |p| p.phase = Phase::Paired { jid });
        }
        session.set_wire(wire);
        Ok(Some(session))
    }

    /// The session rows in the database (the accepted message ids among
    /// them), when sessions are kept there.
    pub fn session_rows(&self) -> Option<crate::store::whatsapp::WaRows> {
        self.inner.sessions.as_ref().map(|s| s.rows().clone())
    }

    /// What an account's session and transport ask before writing.
    fn wire_guard(&self, id: &AccountId) -> fence::WireGuard {
        match &self.inner.sessions {
            Some(s) => fence::WireGuard::new(id.clone(), s.leases().cloned()),
            None => fence::WireGuard::unfenced(id.clone()),
        }
    }

    /// The leases this daemon holds, when it shares the database.
    fn leases(&self) -> Option<&Arc<herald_actors::delivery::leases::LeaseTable>> {
        self.inner.sessions.as_ref().and_then(|s| s.leases())
    }

    /// Several daemons: only the account's lease holder connects it. A
    /// second connection of the same device would replace the owner's.
    fn served_here(&self, id: &AccountId) -> Result<(), GatewayError> {
        match self.leases() {
            Some(t) if t.fence(id).is_none() => Err(GatewayError::Transient(format!(
                "account {id} is served by another daemon of the cluster (it holds the lease)"
            ))),
            _ => Ok(()),
        }
    }

    async fn stored(&self, id: &AccountId) -> Result<bool, GatewayError> {
        self.inner
            .connector
            .stored(id)
            .await
            .map_err(GatewayError::Transient)
    }

    /// The session that sends for `id`, opened from its store if needed.
    async fn sending_session(&self, id: &AccountId) -> Result<Arc<Session>, GatewayError> {
        self.served_here(id)?;
        let slot = self.slot(id);
        if let Some(s) = slot.current() {
            return Ok(s);
        }
        let _life = slot.life.lock().await;
        if let Some(s) = slot.current() {
            return Ok(s);
        }
        if !self.stored(id).await? {
            return Err(GatewayError::LoggedOut);
        }
        match self.open(id, None).await {
            Ok(Some(s)) => {
                slot.set(Some(s.clone()));
                Ok(s)
            }
            Ok(None) => Err(GatewayError::LoggedOut),
            Err(e) => Err(GatewayError::Transient(e)),
        }
    }

    /// Reconnects the paired accounts at start-up, in the background and a
    /// few at a time. Logged-out and disabled accounts stay down. With
    /// leases, [`follow_leases`](Self::follow_leases) does this instead.
    pub fn resume(&self, accounts: &[Account]) {
        if self.leases().is_some() {
            return;
        }
        let ids: Vec<AccountId> = accounts
            .iter()
            .filter(|a| a.kind == GatewayKind::Whatsapp)
            .filter(|a| !matches!(a.state, AccountState::LoggedOut | AccountState::Disabled))
            .map(|a| a.id.clone())
            .collect();
        if ids.is_empty() {
            return;
        }
        let me = self.clone();
        self.inner.runtime.handle.spawn(async move {
            let limit = me.config().resume_concurrency.max(1);
            let permits = Arc::new(tokio::sync::Semaphore::new(limit));
            let mut opening = tokio::task::JoinSet::new();
            let mut pace = me.login_pace();
            for id in ids {
                pace.wait().await;
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let me = me.clone();
                opening.spawn(async move {
                    let _permit = permit;
                    match me.sending_session(&id).await {
                        Ok(_) => {}
                        // A store left by an unfinished pairing holds no login.
                        Err(GatewayError::LoggedOut) => {
                            tracing::info!(account = %id, "no WhatsApp login stored; pair the account")
                        }
                        Err(e) => {
                            tracing::warn!(account = %id, error = %e, "WhatsApp session not resumed")
                        }
                    }
                });
            }
            while opening.join_next().await.is_some() {}
        });
    }

    fn login_pace(&self) -> LoginPace {
        LoginPace::new(self.config().logins_per_sec, &mut rand::rng())
    }

    /// Several daemons (the session store was built with the same lease
    /// table): from now on, every `every`, connects the WhatsApp accounts this daemon
    /// holds the lease of (from the stored session: no pairing) and stops
    /// the clients of those it no longer holds, so one device never has
    /// two connections fighting over it. Runs until the gateway goes.
    pub fn follow_leases(
        &self,
        leases: Arc<herald_actors::delivery::leases::LeaseTable>,
        store: Arc<dyn Store>,
        every: std::time::Duration,
    ) {
        let me = self.clone();
        self.inner.runtime.handle.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Accounts held here that are not WhatsApp ones (a kind never
            // changes): not looked up again every round.
            let mut other_kinds = std::collections::HashSet::new();
            loop {
                tick.tick().await;
                me.follow_once(&leases, store.as_ref(), &mut other_kinds)
                    .await;
            }
        });
    }

    async fn follow_once(
        &self,
        leases: &herald_actors::delivery::leases::LeaseTable,
        store: &dyn Store,
        other_kinds: &mut std::collections::HashSet<AccountId>,
    ) {
        // Lost first: a client whose lease went stops before anything else.
        let open: Vec<(AccountId, Arc<Slot>)> = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, slot)| (id.clone(), slot.clone()))
            .collect();
        for (id, slot) in open {
            if leases.fence(&id).is_some() {
                continue;
            }
            let _life = slot.life.lock().await;
            if let Some(s) = slot.current() {
                tracing::info!(account = %id, "cluster: lease gone, the WhatsApp client stops");
                s.stop().await;
                slot.set(None);
            }
        }
        // Only the leases held here with no client yet: one lookup each,
        // not a listing of every account every round.
        let mut due = Vec::new();
        for fence in leases.held() {
            let id = fence.account;
            if other_kinds.contains(&id) || leases.fence(&id).is_none() || self.client_open(&id) {
                continue;
            }
            match store.get_account(&id).await {
                Ok(Some(a)) if a.kind != GatewayKind::Whatsapp => {
                    other_kinds.insert(id);
                }
                Ok(Some(a))
                    if !matches!(a.state, AccountState::LoggedOut | AccountState::Disabled) =>
                {
                    due.push(id)
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(account = %id, error = %e, "cluster: the account was not read");
                    return;
                }
            }
        }
        // At most a second's worth of logins a round: a takeover of many
        // accounts is spread over rounds, and lost leases are still
        // noticed every round.
        let rate = self.config().logins_per_sec.max(1) as usize;
        let mut pace = self.login_pace();
        for id in due.into_iter().take(rate) {
            pace.wait().await;
            match self.sending_session(&id).await {
                Ok(_) => {
                    tracing::info!(account = %id, "cluster: lease held, the WhatsApp client logs in from the stored session")
                }
                Err(GatewayError::LoggedOut) => {}
                Err(e) => tracing::warn!(account = %id, error = %e, "WhatsApp session not opened"),
            }
        }
    }

    /// Starts pairing (QR, or pair code when `phone` is given) and waits
    /// for WhatsApp's first answer, at most `connect_timeout`.
    pub async fn start_pairing(
        &self,
        account: &Account,
        phone: Option<&str>,
    ) -> Result<PairingView, PairingError> {
        if account.kind != GatewayKind::Whatsapp {
            return Err(PairingError::NotWhatsapp(account.id.to_string()));
        }
        let phone = phone.map(normalize_phone).transpose()?;
        if self.served_here(&account.id).is_err() {
            return Err(PairingError::Elsewhere(account.id.to_string()));
        }
        let slot = self.slot(&account.id);
        let session = {
            let _life = slot.life.lock().await;
            let mut was_logged_out = account.state == AccountState::LoggedOut;
            if let Some(s) = slot.current() {
                let mut p = s.pairing();
                match p.start(phone.clone(), chrono::Utc::now())? {
                    Started::AlreadyRunning => return Ok(s.view()),
                    Started::New => {}
                }
                was_logged_out |= matches!(s.link(), session::Link::LoggedOut(_))
                    || matches!(s.pairing().phase, Phase::LoggedOut { .. });
                s.stop().await;
                slot.set(None);
            }
            if slot.current().is_none()
                && !was_logged_out
                && self.stored(&account.id).await.unwrap_or(false)
            {
                // A stored login that start-up has not reopened yet: opening
                // it to pair would, offline, fail it and lose the login.
                if let Ok(Some(s)) = self.open(&account.id, None).await {
                    slot.set(Some(s.clone()));
                    let jid = match s.pairing().phase {
                        Phase::Paired { jid } => jid,
                        _ => None,
                    };
                    return Err(PairingError::AlreadyPaired(jid));
                }
            }
            if was_logged_out {
                // A logged-out device's keys are dead: pair as a new device.
                self.inner
                    .connector
                    .wipe(&account.id)
                    .await
                    .map_err(PairingError::Internal)?;
            }
            let s = match self.open(&account.id, Some(phone.clone())).await {
                Ok(Some(s)) => s,
                Ok(None) => return Err(PairingError::Internal("the client did not start".into())),
                Err(e) => return Err(PairingError::Internal(e)),
            };
            slot.set(Some(s.clone()));
            s.record_pairing_started();
            s
        };
        let mut rx = session.subscribe_pairing();
        let limit = self.config().connect_timeout;
        let answered =
            tokio::time::timeout(limit, rx.wait_for(|p| p.phase != Phase::Connecting)).await;
        if !matches!(answered, Ok(Ok(_))) {
            session.fail_pairing(format!(
                "cannot reach WhatsApp: no answer within {} s",
                limit.as_secs()
            ));
        }
        Ok(session.view())
    }

    /// The account's pairing state for the control port.
    pub async fn pairing(&self, account: &Account) -> PairingView {
        if let Some(s) = self.slot(&account.id).current() {
            return s.view();
        }
        let phase = match account.state {
            AccountState::LoggedOut => Phase::LoggedOut {
                reason: account
                    .state_reason
                    .clone()
                    .unwrap_or_else(|| "logged out of WhatsApp".into()),
            },
            // A stored login not yet reopened (resume is under way).
            _ if account.state != AccountState::Pairing
                && self.stored(&account.id).await.unwrap_or(false) =>
            {
                Phase::Paired { jid: None }
            }
            _ => Phase::Idle,
        };
        Pairing::new(phase, account.created_at).view(account.id.as_str())
    }

    /// The current QR as PNG, while the account waits for a scan.
    pub fn qr_png(&self, account: &Account) -> Option<Vec<u8>> {
        let s = self.slot(&account.id).current()?;
        match s.pairing().phase {
            Phase::WaitingQr { code, .. } => pairing::qr_png(&code).ok(),
            _ => None,
        }
    }

    /// Stops an account's client and deletes its session (the account was
    /// deleted from Herald).
    pub async fn forget(&self, id: &AccountId) {
        let slot = self.slot(id);
        {
            let _life = slot.life.lock().await;
            if let Some(s) = slot.current() {
                s.stop().await;
            }
            slot.set(None);
            let _ = std::fs::remove_dir_all(self.account_dir(id));
            if let Err(e) = self.inner.connector.wipe(id).await {
                tracing::warn!(account = %id, error = %e, "the WhatsApp session was not forgotten");
            }
        }
        self.inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Stops every client, flushing their state (SIGTERM).
    pub async fn shutdown(&self) {
        let sessions: Vec<Arc<Session>> = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(|s| s.current())
            .collect();
        futures_util::future::join_all(sessions.iter().map(|s| s.stop())).await;
    }
}

#[async_trait]
impl Gateway for WhatsappGateway {
    /// Logout, lock and ban reach the session (`session::Recorder`).
    fn reports_session_signals(&self) -> bool {
        true
    }

    async fn upload(
        &self,
        account: &AccountId,
        _media: &MediaId,
        mime: &str,
        bytes: Arc<[u8]>,
    ) -> Result<UploadHandle, GatewayError> {
        let s = self.sending_session(account).await?;
        s.upload(mime, bytes).await
    }

    async fn ready(&self, account: &AccountId) -> Result<(), GatewayError> {
        self.sending_session(account)
            .await?
            .ready()
            .await
            .map(|_| ())
    }

    async fn list_groups(&self, account: &AccountId) -> Result<Vec<GroupInfo>, GatewayError> {
        self.sending_session(account).await?.list_groups().await
    }

    async fn fetch_timelock(&self, account: &AccountId) -> Result<TimeLock, StandingError> {
        let s = self
            .sending_session(account)
            .await
            .map_err(|e| StandingError::NotNow(e.to_string()))?;
        s.timelock().await
    }

    async fn fetch_quota(&self, account: &AccountId) -> Result<NewChatQuota, StandingError> {
        let s = self
            .sending_session(account)
            .await
            .map_err(|e| StandingError::NotNow(e.to_string()))?;
        s.quota(self.config().quota_doc_id).await
    }

    async fn typing(
        &self,
        account: &AccountId,
        group: &GroupJid,
        _for: std::time::Duration,
    ) -> Result<(), GatewayError> {
        self.sending_session(account).await?.typing(group).await
    }

    async fn send(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
    ) -> Result<SendReceipt, GatewayError> {
        let wire_id = ids::wire_id(message_id)?;
        let s = self.sending_session(account).await?;
        s.send(group, message, &wire_id).await
    }
}

#[cfg(test)]
mod tests;
