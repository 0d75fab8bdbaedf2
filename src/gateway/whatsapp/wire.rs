//! The seam between the gateway and whatsapp-rust: opening one account's
//! client ([`Connector`]) and the few calls the gateway makes on it
//! ([`Wire`]). The real implementations here drive `Bot`/`Client`; the
//! gateway's tests plug in a fake so the contract suite runs offline.

use super::classify::{failure_of, signal_of, Failure, Signal};
use super::media::StoredUpload;
use super::polls::{option_hashes, poll_secret, SealedVote};
use super::WhatsappConfig;
use async_trait::async_trait;
use herald_actors::domain::{AccountId, GroupJid, NewChatQuota, TimeLock};
use herald_actors::ports::StandingError;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use whatsapp_rust::bot::{Bot, BotHandle};
use whatsapp_rust::pair_code::PairCodeOptions;
use whatsapp_rust::send::SendOptions;
use whatsapp_rust::transport::{
    TokioWebSocketTransportFactory, Transport, TransportEvent, TransportFactory,
};
use whatsapp_rust::types::events::{Event, EventHandler, EventInterest, EventKind};
use whatsapp_rust::waproto::whatsapp as wa;
use whatsapp_rust::{Client, Jid};

/// Where an account's signals go (the session applies them).
pub type SignalSink = Arc<dyn Fn(Signal) + Send + Sync>;

/// What the gateway knows about one group for this account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupFacts {
    pub jid: String,
    pub member: bool,
    pub admin: bool,
    /// Only admins may post.
    pub announce: bool,
    pub suspended: bool,
    /// The group's name.
    pub subject: String,
    pub participants: u32,
    /// The community the group belongs to.
    pub community: Option<String>,
}

/// One account's connected client, as the gateway uses it.
#[async_trait]
pub trait Wire: Send + Sync + 'static {
    /// Sends; resolves once the stanza is written (the verdict comes as an ack).
    async fn send(
        &self,
        group: &GroupJid,
        message: wa::Message,
        wire_id: &str,
    ) -> Result<(), Failure>;
    async fn upload_image(&self, bytes: Vec<u8>) -> Result<StoredUpload, Failure>;
    /// Shows the account as typing in `group` (a `<chatstate>` stanza;
    /// nothing is acknowledged). The default shows nothing.
    async fn composing(&self, _group: &GroupJid) -> Result<(), Failure> {
        Ok(())
    }
    /// Every group the account is in, in one request.
    async fn participating(&self) -> Result<Vec<GroupFacts>, Failure>;
    /// The account's reach-out time-lock, as WhatsApp answers it. The
    /// default cannot ask.
    async fn reachout_timelock(&self) -> Result<TimeLock, StandingError> {
        Err(StandingError::Unsupported)
    }
    /// The account's new-chat quota, asked with the query's document id.
    /// The default cannot ask.
    async fn new_chat_quota(&self, _doc_id: &'static str) -> Result<NewChatQuota, StandingError> {
        Err(StandingError::Unsupported)
    }
    /// The message secret of the poll sent with `wire_id`
    /// ([`super::polls::poll_secret`]). The default cannot send polls.
    fn poll_secret(&self, _wire_id: &str) -> Result<[u8; 32], Failure> {
        Err(Failure::Other("this client cannot send polls".into()))
    }
    /// Opens a vote for a poll the account sent. The default cannot.
    async fn open_vote(&self, _vote: &SealedVote) -> Result<OpenedVote, Unopened> {
        Err(Unopened::Failed(
            "this client cannot open poll votes".into(),
        ))
    }
    /// One group the account may not be in.
    async fn group(&self, group: &GroupJid) -> Result<GroupFacts, Failure>;
    /// Stops the client, flushing its state.
    async fn shutdown(&self);
}

/// Why a vote was not opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unopened {
    /// It is for a poll another member sent: not Herald's to count.
    NotOurs,
    /// It is for the account's poll and did not open.
    Failed(String),
}

/// A vote opened: the options chosen, by whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedVote {
    /// The voter under its phone number where the client knows it, so a
    /// LID and a phone number of one person count as one voter.
    pub voter: String,
    /// The chosen options' hashes; empty withdraws the voter's vote.
    pub options: Vec<[u8; 32]>,
}

/// Opening an account's client.
pub struct OpenRequest {
    pub account: AccountId,
    /// `<data_dir>/whatsapp/<account>/` (its accepted-id journal).
    pub dir: PathBuf,
    /// Start pairing: `Some(None)` by QR, `Some(Some(phone))` by pair code.
    pub pairing: Option<Option<String>>,
    pub sink: SignalSink,
    /// Asked before the account's transport connects or writes a frame.
    pub guard: super::fence::WireGuard,
}

pub struct Opened {
    /// `None` when not pairing and the stored session holds no login: the
    /// client is not started.
    pub wire: Option<Arc<dyn Wire>>,
    /// The account's JID when the stored session holds a login.
    pub paired_as: Option<String>,
}

#[async_trait]
pub trait Connector: Send + Sync + 'static {
    async fn open(&self, req: OpenRequest) -> Result<Opened, String>;
    /// Whether the account's session holds a device (a login, or a
    /// pairing that got as far as making its keys).
    async fn stored(&self, account: &AccountId) -> Result<bool, String>;
    /// Forgets the account's session: it pairs as a new device.
    async fn wipe(&self, account: &AccountId) -> Result<(), String>;
}

/// The real connector: one `Bot` per account, on the account's session in
/// the shared database.
pub struct BotConnector {
    pub config: Arc<WhatsappConfig>,
    pub sessions: super::store::SessionStore,
    /// Every connection this gateway opens waits its turn here, so
    /// WhatsApp sees at most `logins_per_sec` a second however the opens
    /// before it bunched up (a slow session read, a stall).
    pub(super) pace: Arc<tokio::sync::Mutex<super::pace::LoginPace>>,
}

#[async_trait]
impl Connector for BotConnector {
    async fn open(&self, req: OpenRequest) -> Result<Opened, String> {
        // A bench build skips the check of WhatsApp's certificate chain (its
        // fake server's is signed by a test key): it must never reach
        // WhatsApp itself.
        #[cfg(feature = "bench")]
        if self.config.transport_url.is_none() {
            return Err(
                "this herald is built with benchmarks (feature `bench`), which skip the \
                        check of WhatsApp's certificate chain: it connects only to a \
                        whatsapp.server_url set in the settings. Build without `--features \
                        bench` to reach WhatsApp"
                    .into(),
            );
        }
        std::fs::create_dir_all(&req.dir)
            .map_err(|e| format!("creating {}: {e}", req.dir.display()))?;
        let store = self.sessions.backend(&req.account);
        let mut factory = TokioWebSocketTransportFactory::new();
        if let Some(url) = &self.config.transport_url {
            factory = factory.with_url(url.clone());
        }
        let mut builder = Bot::builder()
            .with_backend(store)
            .with_transport_factory(ObservedTransport {
                inner: factory,
                sink: req.sink.clone(),
                guard: req.guard.clone(),
                pace: self.pace.clone(),
            })
            .with_event_handler(SignalHandler {
                sink: req.sink.clone(),
            })
            // A sender has no use for the phone's chat history.
            .skip_history_sync();
        if let Some(v) = self.config.version_override {
            builder = builder.with_version(v);
        }
        if let Some(Some(phone)) = &req.pairing {
            builder = builder.with_pair_code(PairCodeOptions {
                phone_number: phone.clone(),
                ..Default::default()
            });
        }
        let bot = builder
            .build()
            .await
            .map_err(|e| format!("starting the WhatsApp client: {e}"))?;
        let client = bot.client();
        let paired_as = client.pn().map(|j| j.to_string());
        if req.pairing.is_none() && paired_as.is_none() {
            return Ok(Opened {
                wire: None,
                paired_as: None,
            });
        }
        let handle = bot.spawn();
        tracing::info!(account = %req.account, pairing = req.pairing.is_some(), "WhatsApp client started");
        Ok(Opened {
            wire: Some(Arc::new(ClientWire {
                client,
                handle: Mutex::new(Some(handle)),
                config: self.config.clone(),
            })),
            paired_as,
        })
    }

    async fn stored(&self, account: &AccountId) -> Result<bool, String> {
        self.sessions.stored(account).await
    }

    async fn wipe(&self, account: &AccountId) -> Result<(), String> {
        self.sessions.wipe(account).await
    }
}

/// Maps every event the gateway cares about to a [`Signal`], inline on the
/// crate's dispatch path (the sink only updates small tables).
struct SignalHandler {
    sink: SignalSink,
}

impl EventHandler for SignalHandler {
    fn handle_event(&self, event: Arc<Event>) {
        let s = signal_of(&event, chrono::Utc::now());
        if s != Signal::Ignore {
            (self.sink)(s);
        }
    }

    fn interest(&self) -> EventInterest {
        EventInterest::of(&[
            EventKind::Connected,
            EventKind::Disconnected,
            EventKind::LoggedOut,
            EventKind::TemporaryBan,
            EventKind::ConnectFailure,
            EventKind::ClientOutdated,
            EventKind::StreamReplaced,
            EventKind::PairingQrCode,
            EventKind::PairingCode,
            EventKind::PairSuccess,
            EventKind::PairError,
            EventKind::PairingCodeError,
            EventKind::PairingQrCodesExhausted,
            EventKind::QrScannedWithoutMultidevice,
            EventKind::ServerAck,
            EventKind::Receipt,
            // Poll votes come as messages.
            EventKind::Messages,
        ])
    }
}

/// The default WebSocket transport, reporting each connect attempt, and
/// fenced by the account's lease ([`super::fence`]): no connect and no
/// frame once the lease is gone. The crate's run loop only logs a failed
/// connect and retries; this is how the gateway learns *why* WhatsApp
/// cannot be reached.
struct ObservedTransport {
    inner: TokioWebSocketTransportFactory,
    sink: SignalSink,
    guard: super::fence::WireGuard,
    pace: Arc<tokio::sync::Mutex<super::pace::LoginPace>>,
}

#[async_trait]
impl TransportFactory for ObservedTransport {
    async fn create_transport(
        &self,
    ) -> Result<
        (
            Arc<dyn Transport>,
            whatsapp_rust::async_channel::Receiver<TransportEvent>,
        ),
        whatsapp_rust::anyhow::Error,
    > {
        // A daemon past its lease must not connect: its login would push
        // the new owner's connection off.
        if let Err(e) = self.guard.check() {
            return Err(whatsapp_rust::anyhow::anyhow!(e.to_string()));
        }
        self.pace.lock().await.wait().await;
        // Checked again: the lease may have gone while this waited.
        if let Err(e) = self.guard.check() {
            return Err(whatsapp_rust::anyhow::anyhow!(e.to_string()));
        }
        let got = self.inner.create_transport().await;
        if let Err(e) = &got {
            (self.sink)(Signal::TransportFailed(format!("{e:#}")));
        }
        let (transport, events) = got?;
        let fenced: Arc<dyn Transport> = Arc::new(super::fence::FencedTransport {
            inner: transport,
            guard: self.guard.clone(),
        });
        Ok((fenced, events))
    }
}

/// Runs a crate call on the current (WhatsApp) runtime with a time limit,
/// classifying its error.
async fn bounded<T, E, F>(limit: Duration, what: &str, fut: F) -> Result<T, Failure>
where
    F: Future<Output = Result<T, E>>,
    E: std::error::Error + 'static,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failure_of(&e)),
        Err(_) => Err(Failure::Timeout(format!(
            "{what} took longer than {limit:?}"
        ))),
    }
}

struct ClientWire {
    client: Arc<Client>,
    handle: Mutex<Option<BotHandle>>,
    config: Arc<WhatsappConfig>,
}

impl ClientWire {
    fn own_users(&self) -> Vec<String> {
        [self.client.pn(), self.client.lid()]
            .into_iter()
            .flatten()
            .map(|j| j.user.to_string())
            .collect()
    }

    fn facts(&self, meta: &whatsapp_rust::GroupMetadata) -> GroupFacts {
        let me = self.own_users();
        let is_me = |j: &Option<Jid>| j.as_ref().is_some_and(|j| me.iter().any(|u| *u == *j.user));
        let mine = meta.participants.iter().find(|p| {
            me.iter().any(|u| *u == *p.jid.user) || is_me(&p.phone_number) || is_me(&p.lid)
        });
        GroupFacts {
            jid: meta.id.to_string(),
            member: mine.is_some(),
            admin: mine.is_some_and(|p| p.is_admin()),
            announce: meta.is_announcement,
            suspended: meta.is_suspended,
            subject: meta.subject.clone(),
            participants: meta
                .size
                .unwrap_or_else(|| u32::try_from(meta.participants.len()).unwrap_or(u32::MAX)),
            community: meta.parent_group_jid.as_ref().map(|j| j.to_string()),
        }
    }
}

impl ClientWire {
    /// A voter's phone-number address: the stanza's other address, or the
    /// client's LID map; a LID nobody mapped stays a LID.
    async fn phone_number_of(&self, voter: &Jid, alt: Option<&str>) -> String {
        if !voter.is_lid() {
            return voter.to_non_ad_string();
        }
        if let Some(pn) = alt.filter(|a| a.ends_with("@s.whatsapp.net")) {
            return pn.to_owned();
        }
        match self.client.get_lid_pn_entry(voter).await {
            Ok(Some(e)) => format!("{}@s.whatsapp.net", e.phone_number),
            _ => voter.to_non_ad_string(),
        }
    }
}

fn group_jid(group: &GroupJid) -> Result<Jid, Failure> {
    group
        .as_str()
        .parse()
        .map_err(|e| Failure::Other(format!("invalid group JID {group}: {e}")))
}

#[async_trait]
impl Wire for ClientWire {
    async fn send(
        &self,
        group: &GroupJid,
        message: wa::Message,
        wire_id: &str,
    ) -> Result<(), Failure> {
        let to = group_jid(group)?;
        let opts = SendOptions::default().with_message_id(wire_id);
        bounded(
            self.config.request_timeout,
            "sending",
            self.client.send_message_with_options(to, message, opts),
        )
        .await
        .map(|_| ())
    }

    async fn composing(&self, group: &GroupJid) -> Result<(), Failure> {
        let to = group_jid(group)?;
        bounded(
            self.config.request_timeout,
            "showing typing",
            self.client.chatstate().send_composing(&to),
        )
        .await
    }

    async fn upload_image(&self, bytes: Vec<u8>) -> Result<StoredUpload, Failure> {
        let fut = self.client.upload(
            bytes,
            whatsapp_rust::download::MediaType::Image,
            whatsapp_rust::UploadOptions::default(),
        );
        match tokio::time::timeout(self.config.upload_timeout, fut).await {
            Ok(Ok(r)) => Ok(StoredUpload::from_response(&r)),
            Ok(Err(e)) => Err(failure_of(e.as_ref())),
            Err(_) => Err(Failure::Timeout(format!(
                "the upload took longer than {:?}",
                self.config.upload_timeout
            ))),
        }
    }

    async fn participating(&self) -> Result<Vec<GroupFacts>, Failure> {
        let groups = self.client.groups();
        let all = bounded(
            self.config.request_timeout,
            "listing groups",
            groups.get_participating(),
        )
        .await?;
        Ok(all.values().map(|m| self.facts(m)).collect())
    }

    async fn reachout_timelock(&self) -> Result<TimeLock, StandingError> {
        let answer = tokio::time::timeout(
            self.config.request_timeout,
            self.client.mex().fetch_reachout_timelock(),
        )
        .await
        .map_err(|_| StandingError::NotNow("WhatsApp did not answer in time".into()))?;
        super::standing::timelock(answer)
    }

    async fn new_chat_quota(&self, doc_id: &'static str) -> Result<NewChatQuota, StandingError> {
        use whatsapp_rust::features::MexRequest;
        use whatsapp_rust::wacore::iq::mex_operations::fetch_new_chat_message_capping_info as q;
        // As WhatsApp Web asks it: the quota of new individual chats.
        let vars = q::Variables {
            input: Some(q::Input {
                r#type: Some("INDIVIDUAL_NEW_CHAT_MSG".into()),
            }),
        };
        let answer = tokio::time::timeout(
            self.config.request_timeout,
            self.client
                .mex()
                .query(MexRequest::new(q::NAME, doc_id, vars)),
        )
        .await
        .map_err(|_| StandingError::NotNow("WhatsApp did not answer in time".into()))?;
        super::standing::quota(answer)
    }

    fn poll_secret(&self, wire_id: &str) -> Result<[u8; 32], Failure> {
        let device = self.client.persistence_manager().get_device_snapshot();
        Ok(poll_secret(
            device.identity_key.private_key.serialize(),
            wire_id,
        ))
    }

    async fn open_vote(&self, vote: &SealedVote) -> Result<OpenedVote, Unopened> {
        use whatsapp_rust::features::PollVoteCiphertext;
        // Members vote on each other's polls too; every member hears them.
        if let Some(author) = &vote.author {
            let user = author.split(['@', ':']).next().unwrap_or_default();
            if !self.own_users().iter().any(|u| u == user) {
                return Err(Unopened::NotOurs);
            }
        }
        let failed = |e: String| Unopened::Failed(e);
        let voter: Jid = vote
            .voter
            .parse()
            .map_err(|e| failed(format!("voter {}: {e}", vote.voter)))?;
        // The vote is sealed under the poll author's address in the voter's
        // namespace; the crate tries the other one when it knows both.
        let author = if voter.is_lid() {
            self.client.lid()
        } else {
            self.client.pn()
        }
        .ok_or_else(|| failed("the account is not logged in".into()))?;
        let secret = self
            .poll_secret(&vote.poll_id)
            .map_err(|f| failed(format!("{f:?}")))?;
        let opened = self
            .client
            .polls()
            .decrypt_vote(
                PollVoteCiphertext {
                    enc_payload: &vote.payload,
                    enc_iv: &vote.iv,
                },
                &secret,
                &vote.poll_id,
                &author,
                &voter,
            )
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok(OpenedVote {
            voter: self
                .phone_number_of(&voter, vote.voter_alt.as_deref())
                .await,
            options: option_hashes(opened).map_err(failed)?,
        })
    }

    async fn group(&self, group: &GroupJid) -> Result<GroupFacts, Failure> {
        let jid = group_jid(group)?;
        let groups = self.client.groups();
        let meta = bounded(
            self.config.request_timeout,
            "reading the group",
            groups.get_metadata(&jid),
        )
        .await?;
        Ok(self.facts(&meta))
    }

    async fn shutdown(&self) {
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if tokio::time::timeout(Duration::from_secs(10), h.shutdown())
                .await
                .is_err()
            {
                tracing::warn!("WhatsApp client did not stop within 10 s; it is dropped");
            }
        }
    }
}
