//! The gateway end to end, offline.
//!
//! Most tests put a fake [`Connector`] under the gateway: a WhatsApp that
//! knows each account's groups, acks (or nacks, or ignores) messages and
//! emits account events on demand. That runs the gateway contract suite
//! and the gateway's own logic (ids, acks, group checks, account events,
//! state recording) without a network. The `unreachable_*` tests use the
//! real whatsapp-rust client, pointed at a closed loopback port: what this
//! machine can show of the real crate is how it fails without WhatsApp.

use super::classify::{Failure, Signal};
use super::media::StoredUpload;
use super::polls::SealedVote;
use super::session::Recorder;
use super::wire::{
    Connector, GroupFacts, OpenRequest, Opened, OpenedVote, SignalSink, Unopened, Wire,
};
use super::*;
use herald_actors::domain::{AccountLimits, MediaId};
use herald_actors::memstore::MemoryStore;
use herald_actors::ports::{AccountStore, EventStore};
use herald_actors::ports::{Clock, NewAccount, SystemClock};
use herald_actors::testkit::gateway_contract::{self, ContractSetup};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use std::time::Instant as StdInstant;
use whatsapp_rust::waproto::whatsapp as wa;

/// How the fake server answers a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckMode {
    Accept,
    Silent,
    Nack(&'static str),
}

/// A fake WhatsApp shared by the fake clients.
struct FakeNet {
    /// Groups each account is in.
    groups: Mutex<HashMap<AccountId, Vec<String>>>,
    /// Groups that exist but the account is not in.
    foreign: Mutex<HashSet<String>>,
    offline: Mutex<HashSet<AccountId>>,
    ack: Mutex<AckMode>,
    /// The next send fails this way instead of being written.
    fail_next: Mutex<Option<Failure>>,
    /// Sinks of open clients, to push events as WhatsApp would.
    sinks: Mutex<HashMap<AccountId, SignalSink>>,
    sent: Mutex<Vec<(AccountId, String, wa::Message, String)>>,
    /// Typing presences shown, by group.
    composing: Mutex<Vec<String>>,
    uploads: AtomicUsize,
    listings: AtomicUsize,
    lookups: AtomicUsize,
    /// Accounts whose session holds a device.
    stored: Mutex<HashSet<AccountId>>,
    /// What the server kept for an account's device, reported as its
    /// client logs in, before the client is handed to the gateway.
    at_login: Mutex<HashMap<AccountId, Vec<Signal>>>,
}

impl FakeNet {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            groups: Mutex::default(),
            foreign: Mutex::default(),
            offline: Mutex::default(),
            ack: Mutex::new(AckMode::Accept),
            fail_next: Mutex::default(),
            composing: Mutex::default(),
            sinks: Mutex::default(),
            sent: Mutex::default(),
            uploads: AtomicUsize::new(0),
            listings: AtomicUsize::new(0),
            lookups: AtomicUsize::new(0),
            stored: Mutex::default(),
            at_login: Mutex::default(),
        })
    }

    fn emit(&self, account: &AccountId, s: Signal) {
        let sink = self.sinks.lock().unwrap().get(account).cloned();
        (sink.expect("client open"))(s);
    }

    fn sent_to(&self, account: &AccountId) -> Vec<(String, wa::Message, String)> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(a, ..)| a == account)
            .map(|(_, g, m, id)| (g.clone(), m.clone(), id.clone()))
            .collect()
    }
}

struct FakeConnector {
    net: Arc<FakeNet>,
}

#[async_trait]
impl Connector for FakeConnector {
    async fn open(&self, req: OpenRequest) -> Result<Opened, String> {
        let known = self.net.groups.lock().unwrap().contains_key(&req.account);
        if !known && req.pairing.is_none() {
            return Ok(Opened {
                wire: None,
                paired_as: None,
            });
        }
        self.net
            .sinks
            .lock()
            .unwrap()
            .insert(req.account.clone(), req.sink.clone());
        if self.net.offline.lock().unwrap().contains(&req.account) {
            (req.sink)(Signal::TransportFailed(
                "IO error: Connection refused (os error 111)".into(),
            ));
        } else if req.pairing.is_some() {
            (req.sink)(Signal::Qr {
                code: "2@fake,qr".into(),
                valid_for: Duration::from_secs(60),
            });
        } else {
            (req.sink)(Signal::Connected);
            let kept = self.net.at_login.lock().unwrap().remove(&req.account);
            for s in kept.unwrap_or_default() {
                (req.sink)(s);
            }
        }
        Ok(Opened {
            wire: Some(Arc::new(FakeWire {
                account: req.account.clone(),
                net: self.net.clone(),
                sink: req.sink,
            })),
            paired_as: Some(OWN_JID.into()),
        })
    }

    async fn stored(&self, account: &AccountId) -> Result<bool, String> {
        Ok(self.net.stored.lock().unwrap().contains(account))
    }

    async fn wipe(&self, account: &AccountId) -> Result<(), String> {
        self.net.stored.lock().unwrap().remove(account);
        Ok(())
    }
}

struct FakeWire {
    account: AccountId,
    net: Arc<FakeNet>,
    sink: SignalSink,
}

#[async_trait]
impl Wire for FakeWire {
    async fn send(
        &self,
        group: &GroupJid,
        message: wa::Message,
        wire_id: &str,
    ) -> Result<(), Failure> {
        assert!(ids::is_wire_id(wire_id), "the crate's id shape: {wire_id}");
        if let Some(f) = self.net.fail_next.lock().unwrap().take() {
            return Err(f);
        }
        self.net.sent.lock().unwrap().push((
            self.account.clone(),
            group.to_string(),
            message,
            wire_id.to_owned(),
        ));
        let mode = *self.net.ack.lock().unwrap();
        let (sink, id) = (self.sink.clone(), wire_id.to_owned());
        // The verdict arrives after the write, as from the real server.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            match mode {
                AckMode::Accept => sink(Signal::Ack { id, refused: None }),
                AckMode::Nack(code) => sink(Signal::Ack {
                    id,
                    refused: Some(code.into()),
                }),
                AckMode::Silent => {}
            }
        });
        Ok(())
    }

    async fn composing(&self, group: &GroupJid) -> Result<(), Failure> {
        self.net.composing.lock().unwrap().push(group.to_string());
        Ok(())
    }

    async fn upload_image(&self, bytes: Vec<u8>) -> Result<StoredUpload, Failure> {
        let n = self.net.uploads.fetch_add(1, Ordering::SeqCst);
        let mut u = super::media::sample_upload();
        u.direct_path = format!("/v/t62/upload-{n}");
        u.file_length = bytes.len() as u64;
        Ok(u)
    }

    async fn participating(&self) -> Result<Vec<GroupFacts>, Failure> {
        self.net.listings.fetch_add(1, Ordering::SeqCst);
        let groups = self.net.groups.lock().unwrap();
        Ok(groups[&self.account]
            .iter()
            .map(|g| GroupFacts {
                jid: g.clone(),
                member: true,
                admin: false,
                announce: false,
                suspended: false,
                subject: format!("Group {g}"),
                participants: 3,
                community: None,
            })
            .collect())
    }

    async fn group(&self, group: &GroupJid) -> Result<GroupFacts, Failure> {
        self.net.lookups.fetch_add(1, Ordering::SeqCst);
        if self.net.foreign.lock().unwrap().contains(group.as_str()) {
            return Ok(GroupFacts {
                jid: group.to_string(),
                member: false,
                admin: false,
                announce: false,
                suspended: false,
                subject: String::new(),
                participants: 0,
                community: None,
            });
        }
        Err(Failure::Refused {
            code: 404,
            text: "item-not-found".into(),
            backoff: None,
        })
    }

    fn poll_secret(&self, wire_id: &str) -> Result<[u8; 32], Failure> {
        Ok(super::polls::poll_secret(&identity(&self.account), wire_id))
    }

    async fn open_vote(&self, v: &SealedVote) -> Result<OpenedVote, Unopened> {
        use whatsapp_rust::wacore::poll;
        if v.author.as_deref().is_some_and(|a| a != OWN_JID) {
            return Err(Unopened::NotOurs);
        }
        let failed = |e: String| Unopened::Failed(e);
        let secret = self
            .poll_secret(&v.poll_id)
            .map_err(|f| failed(format!("{f:?}")))?;
        let ciphertext = poll::PollVoteCiphertext {
            enc_payload: &v.payload,
            enc_iv: &v.iv,
        };
        let hashes =
            poll::decrypt_poll_vote_with_secret(ciphertext, &secret, &v.poll_id, OWN_JID, &v.voter)
                .map_err(|e| failed(e.to_string()))?;
        Ok(OpenedVote {
            voter: v.voter.clone(),
            options: super::polls::option_hashes(hashes).map_err(failed)?,
        })
    }

    async fn shutdown(&self) {}
}

/// The phone number the fake clients are paired as.
const OWN_JID: &str = "60123456789@s.whatsapp.net";

/// A fake account's identity private key.
fn identity(account: &AccountId) -> [u8; 32] {
    herald_actors::domain::option_hash(account.as_str())
}

fn config() -> WhatsappConfig {
    WhatsappConfig {
        ack_timeout: Duration::from_millis(300),
        reconnect_wait: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
        upload_timeout: Duration::from_secs(2),
        threads: 1,
        ..WhatsappConfig::default()
    }
}

struct Fake {
    gw: WhatsappGateway,
    /// What the gateway's sessions report, until a test records it.
    changes: Mutex<Option<Changes>>,
    net: Arc<FakeNet>,
    next: AtomicUsize,
    _dir: tempfile::TempDir,
}

impl Fake {
    fn new(config: WhatsappConfig) -> Self {
        Self::hearing(config, None)
    }

    /// A fake whose clients hand what they hear to `receipts`.
    fn hearing(config: WhatsappConfig, receipts: Option<ReceiptSink>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let net = FakeNet::new();
        let mut gw = WhatsappGateway::with_connector(
            Arc::new(config),
            dir.path(),
            Arc::new(FakeConnector { net: net.clone() }),
            None,
        )
        .unwrap();
        if let Some(sink) = receipts {
            gw = gw.with_receipts(sink);
        }
        let (recorder, changes) = Recorder::channel();
        Self {
            gw: gw.with_recorder(recorder),
            changes: Mutex::new(Some(changes)),
            net,
            next: AtomicUsize::new(0),
            _dir: dir,
        }
    }

    /// Writes what the sessions report to `store`, counting `signals` and
    /// noting whose actor would be woken in `woken`.
    fn record(
        &self,
        store: Arc<MemoryStore>,
        woken: Arc<Mutex<Vec<AccountId>>>,
        signals: Arc<Signals>,
    ) {
        let changes = self.changes.lock().unwrap().take().expect("recorded once");
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let events = EventBus::new(store.clone(), clock);
        changes.spawn(
            &tokio::runtime::Handle::current(),
            store,
            events,
            signals,
            Arc::new(move |id: &AccountId, _| woken.lock().unwrap().push(id.clone())),
            None,
        );
    }

    /// A paired account (a stored session exists) in `n` groups.
    fn paired(&self, n: usize) -> (AccountId, Vec<GroupJid>) {
        let i = self.next.fetch_add(1, Ordering::SeqCst);
        let id = AccountId::parse(&format!("wa-{i}")).unwrap();
        let groups: Vec<GroupJid> = (1..=n)
            .map(|g| GroupJid::parse(&format!("1203630{i:05}{g:06}@g.us")).unwrap())
            .collect();
        self.net
            .groups
            .lock()
            .unwrap()
            .insert(id.clone(), groups.iter().map(|g| g.to_string()).collect());
        self.net.stored.lock().unwrap().insert(id.clone());
        (id, groups)
    }
}

#[async_trait]
impl ContractSetup for Fake {
    async fn account_with_groups(&self, n: usize) -> (AccountId, Vec<GroupJid>) {
        self.paired(n)
    }
}

fn text(s: &str) -> OutgoingMessage {
    OutgoingMessage::Text(s.into())
}

const DELIVERED: SendReceipt = SendReceipt { duplicate: false };

#[tokio::test]
async fn passes_the_gateway_contract_over_a_fake_whatsapp() {
    let fake = Fake::new(config());
    gateway_contract::run_all(&fake.gw, &fake).await;
}

/// WhatsApp hands a device the votes it kept while the device was away as
/// the client logs in, before the gateway holds the client: those are
/// opened once it does, not dropped (they were, and a restarted or
/// taken-over daemon undercounted the votes cast while it was down).
#[tokio::test]
async fn votes_heard_as_the_client_logs_in_are_opened_once_it_is_handed_over() {
    use herald_actors::domain::{option_hash, Vote};
    use herald_actors::ports::Heard;
    use whatsapp_rust::wacore::poll;
    let (sink, mut heard) = ReceiptSink::channel(16);
    let fake = Fake::hearing(config(), Some(sink));
    let (account, groups) = fake.paired(1);
    let wire_id = "3EB0C0FFEE0000000001";
    let secret = super::polls::poll_secret(&identity(&account), wire_id);
    let voter = "15551112222@s.whatsapp.net";
    let chosen = vec![poll::compute_option_hash("Yes").to_vec()];
    let (payload, iv) =
        poll::encrypt_poll_vote_with_secret(&chosen, &secret, wire_id, OWN_JID, voter).unwrap();
    let at = chrono::Utc::now();
    fake.net.at_login.lock().unwrap().insert(
        account.clone(),
        vec![Signal::PollVotes(vec![SealedVote {
            chat: groups[0].to_string(),
            poll_id: wire_id.into(),
            author: Some(OWN_JID.into()),
            voter: voter.into(),
            voter_alt: None,
            payload,
            iv: iv.to_vec(),
            at,
        }])],
    );
    fake.gw.ready(&account).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(2), heard.recv())
        .await
        .expect("the vote kept for the device reaches the counter");
    assert_eq!(
        got,
        Some(Heard::Vote(Vote {
            account: account.clone(),
            chat: groups[0].clone(),
            poll_id: wire_id.into(),
            voter: voter.into(),
            options: vec![option_hash("Yes")],
            at,
        }))
    );
}

#[tokio::test]
async fn a_poll_goes_out_with_the_accounts_secret_and_its_votes_reach_the_counter_opened() {
    use herald_actors::domain::{option_hash, Vote, VoteIgnored};
    use herald_actors::ports::Heard;
    use whatsapp_rust::wacore::poll;
    let (sink, mut heard) = ReceiptSink::channel(16);
    let fake = Fake::hearing(config(), Some(sink));
    let (account, groups) = fake.paired(1);
    let options: Vec<String> = vec!["Yes".into(), "No".into()];
    let poll = OutgoingMessage::Poll {
        question: "Coming?".into(),
        options: options.clone(),
        multiple: false,
    };
    let engine_id = herald_actors::delivery::outcome::message_id(
        herald_actors::domain::RunId(9),
        &groups[0],
        1,
    );
    let sent = fake.gw.send(&account, &groups[0], &poll, &engine_id).await;
    assert_eq!(sent, Ok(DELIVERED));
    let (_, message, wire_id) = fake.net.sent_to(&account).remove(0);
    let p = message
        .poll_creation_message_v3
        .as_option()
        .expect("a single-choice poll");
    assert_eq!(p.name.as_deref(), Some("Coming?"));
    let secret = message
        .message_context_info
        .as_option()
        .unwrap()
        .message_secret
        .clone()
        .unwrap();
    assert_eq!(
        secret,
        super::polls::poll_secret(&identity(&account), &wire_id)
    );

    // A member seals a vote with the secret its device read; another
    // sends one that does not open.
    let voter = "15551112222@s.whatsapp.net";
    let chosen = vec![poll::compute_option_hash("No").to_vec()];
    let (payload, iv) =
        poll::encrypt_poll_vote_with_secret(&chosen, &secret, &wire_id, OWN_JID, voter).unwrap();
    let at = chrono::Utc::now();
    let sealed = |payload: Vec<u8>| SealedVote {
        chat: groups[0].to_string(),
        poll_id: wire_id.clone(),
        author: Some(OWN_JID.into()),
        voter: voter.into(),
        voter_alt: None,
        payload,
        iv: iv.to_vec(),
        at,
    };
    let mut broken = payload.clone();
    broken[0] ^= 1;
    // And a vote on a poll another member sent, which every member hears.
    let mut theirs = sealed(payload.clone());
    theirs.author = Some("15553334444@s.whatsapp.net".into());
    fake.net.emit(
        &account,
        Signal::PollVotes(vec![sealed(payload), sealed(broken), theirs]),
    );
    let first = tokio::time::timeout(Duration::from_secs(2), heard.recv())
        .await
        .unwrap();
    assert_eq!(
        first,
        Some(Heard::Vote(Vote {
            account: account.clone(),
            chat: groups[0].clone(),
            poll_id: wire_id.clone(),
            voter: voter.into(),
            options: vec![option_hash("No")],
            at,
        }))
    );
    let second = tokio::time::timeout(Duration::from_secs(2), heard.recv())
        .await
        .unwrap();
    assert_eq!(second, Some(Heard::Unopened(VoteIgnored::Undecryptable)));
    let third = tokio::time::timeout(Duration::from_secs(2), heard.recv())
        .await
        .unwrap();
    assert_eq!(third, Some(Heard::Unopened(VoteIgnored::UnknownPoll)));
}

#[tokio::test]
async fn one_upload_is_reused_for_every_group() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(5);
    let bytes: Arc<[u8]> = Arc::from(&b"\x89PNG picture"[..]);
    let handle = fake
        .gw
        .upload(
            &account,
            &MediaId::of_bytes(&bytes),
            "image/png",
            bytes.clone(),
        )
        .await
        .unwrap();
    assert!(handle.expires_at > chrono::Utc::now() + chrono::Duration::days(6));
    let msg = OutgoingMessage::Media {
        upload: handle,
        mime: "image/png".into(),
        caption: Some("Reminder".into()),
    };
    for (i, g) in groups.iter().enumerate() {
        let got = fake.gw.send(&account, g, &msg, &format!("m{i}")).await;
        assert_eq!(got, Ok(DELIVERED));
    }
    assert_eq!(fake.net.uploads.load(Ordering::SeqCst), 1, "uploaded once");
    let sent = fake.net.sent_to(&account);
    let targets: HashSet<&str> = sent.iter().map(|(g, ..)| g.as_str()).collect();
    assert_eq!(targets.len(), 5, "five different groups");
    assert!(
        sent.windows(2).all(|w| w[0].1 == w[1].1),
        "one message body"
    );
    let img = sent[0].1.image_message.as_option().unwrap();
    assert_eq!(img.direct_path.as_deref(), Some("/v/t62/upload-0"));
    assert_eq!(img.caption.as_deref(), Some("Reminder"));
    assert_eq!(
        fake.net.listings.load(Ordering::SeqCst),
        1,
        "membership checked once for the run"
    );
}

#[tokio::test]
async fn engine_ids_go_out_in_the_crates_shape_and_resends_keep_them() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(1);
    let engine_id = herald_actors::delivery::outcome::message_id(
        herald_actors::domain::RunId(9),
        &groups[0],
        0,
    );
    assert_eq!(
        fake.gw
            .send(&account, &groups[0], &text("hi"), &engine_id)
            .await,
        Ok(DELIVERED)
    );
    let sent = fake.net.sent_to(&account);
    assert_eq!(sent[0].2, engine_id[..22]);
    let again = fake
        .gw
        .send(&account, &groups[0], &text("hi"), &engine_id)
        .await;
    assert_eq!(again, Ok(SendReceipt { duplicate: true }));
    assert_eq!(fake.net.sent_to(&account).len(), 1, "not written twice");
}

#[tokio::test]
async fn no_ack_in_time_is_transient_and_a_late_ack_makes_the_retry_a_duplicate() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(1);
    *fake.net.ack.lock().unwrap() = AckMode::Silent;
    let started = StdInstant::now();
    let got = fake
        .gw
        .send(&account, &groups[0], &text("hello"), "p1")
        .await;
    assert!(
        matches!(&got, Err(GatewayError::Transient(m)) if m.contains("did not confirm")),
        "{got:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    // The ack arrives after the timeout: the engine's retry must not resend.
    let wire_id = fake.net.sent_to(&account)[0].2.clone();
    fake.net.emit(
        &account,
        Signal::Ack {
            id: wire_id,
            refused: None,
        },
    );
    let retry = fake
        .gw
        .send(&account, &groups[0], &text("hello"), "p1")
        .await;
    assert_eq!(retry, Ok(SendReceipt { duplicate: true }));
    assert_eq!(fake.net.sent_to(&account).len(), 1);
}

#[tokio::test]
async fn typing_shows_a_composing_presence_in_the_group() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(1);
    fake.gw
        .typing(&account, &groups[0], Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(
        *fake.net.composing.lock().unwrap(),
        vec![groups[0].to_string()]
    );
    assert!(
        fake.net.sent_to(&account).is_empty(),
        "a presence, not a message"
    );
}

#[tokio::test]
async fn nacks_are_classified() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(1);
    for (code, want) in [
        ("429", GatewayError::RateLimited { retry_after: None }),
        (
            "463",
            GatewayError::Restricted {
                code: 463,
                retry_after: None,
            },
        ),
        (
            "479",
            GatewayError::Restricted {
                code: 479,
                retry_after: None,
            },
        ),
        // Last: a group's refusal makes the gateway forget the group.
        ("403", GatewayError::NotAllowed),
    ] {
        *fake.net.ack.lock().unwrap() = AckMode::Nack(code);
        let got = fake.gw.send(&account, &groups[0], &text("x"), code).await;
        assert_eq!(got, Err(want));
    }
}

#[tokio::test]
async fn send_failures_are_classified() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(1);
    let msg = text("x");
    let send = |id: &'static str| fake.gw.send(&account, &groups[0], &msg, id);
    let cases = [
        (
            Failure::Refused {
                code: 429,
                text: "rate-overlimit".into(),
                backoff: Some(Duration::from_secs(20)),
            },
            GatewayError::RateLimited {
                retry_after: Some(Duration::from_secs(20)),
            },
        ),
        // The socket is up but the server dropped the login (429/503
        // stream error): slow down.
        (
            Failure::NotLoggedIn,
            GatewayError::RateLimited { retry_after: None },
        ),
        (
            Failure::Timeout("sending took longer than 2s".into()),
            GatewayError::Transient("no answer from WhatsApp: sending took longer than 2s".into()),
        ),
    ];
    for (i, (failure, want)) in cases.into_iter().enumerate() {
        *fake.net.fail_next.lock().unwrap() = Some(failure);
        let id: &'static str = ["s0", "s1", "s2"][i];
        assert_eq!(send(id).await, Err(want));
    }
    // The socket drops mid-send and comes back at once: retry the part.
    *fake.net.fail_next.lock().unwrap() = Some(Failure::Offline("socket closed".into()));
    let net = fake.net.clone();
    let id = account.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        net.emit(&id, Signal::Connected);
    });
    assert!(matches!(send("s3").await, Err(GatewayError::Transient(m)) if m.contains("same id")));
    assert_eq!(send("s3").await, Ok(DELIVERED));
}

#[tokio::test]
async fn groups_the_account_is_not_in_fail_fast_and_are_looked_up_once() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(2);
    let foreign = GroupJid::parse("120363999999999999@g.us").unwrap();
    fake.net.foreign.lock().unwrap().insert(foreign.to_string());
    for i in 0..3 {
        let got = fake
            .gw
            .send(&account, &foreign, &text("x"), &format!("f{i}"))
            .await;
        assert_eq!(got, Err(GatewayError::NotParticipant));
    }
    assert_eq!(fake.net.lookups.load(Ordering::SeqCst), 1);
    assert!(fake.net.sent_to(&account).is_empty(), "nothing was written");
    assert_eq!(
        fake.gw.send(&account, &groups[1], &text("x"), "ok").await,
        Ok(DELIVERED)
    );
    assert_eq!(fake.net.listings.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_account_without_a_session_is_logged_out() {
    let fake = Fake::new(config());
    let id = AccountId::parse("never-paired").unwrap();
    let g = GroupJid::parse("120363000000000001@g.us").unwrap();
    assert_eq!(
        fake.gw.send(&id, &g, &text("x"), "a").await,
        Err(GatewayError::LoggedOut)
    );
}

async fn store_with(ids: &[&AccountId]) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    for id in ids {
        let new = NewAccount::named_by_id(
            (*id).clone(),
            GatewayKind::Whatsapp,
            AccountState::Connected,
        );
        store
            .create_account(&new, chrono::Utc::now())
            .await
            .unwrap();
    }
    store
}

/// Account signals counted by label, as `/metrics` counts them.
#[derive(Default)]
struct Signals(Mutex<Vec<&'static str>>);

impl herald_actors::ports::Metrics for Signals {
    fn account_signal(&self, _account: &AccountId, signal: &'static str) {
        self.0.lock().unwrap().push(signal);
    }
}

/// Polls the store until the account reaches `state` (the recorder is
/// asynchronous), at most two seconds.
async fn wait_state(store: &MemoryStore, id: &AccountId, state: AccountState) -> Account {
    let until = StdInstant::now() + Duration::from_secs(2);
    loop {
        let a = store.get_account(id).await.unwrap().unwrap();
        if a.state == state || StdInstant::now() > until {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn logged_out_halts_and_is_recorded_then_the_account_can_pair_again() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(1);
    let store = store_with(&[&account]).await;
    let woken = Arc::new(Mutex::new(Vec::new()));
    fake.record(store.clone(), woken.clone(), Arc::default());
    assert_eq!(
        fake.gw.send(&account, &groups[0], &text("a"), "a").await,
        Ok(DELIVERED)
    );

    fake.net.emit(
        &account,
        Signal::LoggedOut("the phone removed this linked device, or WhatsApp logged it out".into()),
    );
    assert_eq!(
        fake.gw.send(&account, &groups[0], &text("b"), "b").await,
        Err(GatewayError::LoggedOut)
    );
    let a = wait_state(&store, &account, AccountState::LoggedOut).await;
    assert_eq!(a.state, AccountState::LoggedOut);
    assert!(a
        .state_reason
        .as_deref()
        .unwrap()
        .contains("removed this linked device"));
    let events = store.events_after(0, 10).await.unwrap();
    assert!(events
        .iter()
        .any(|e| e.kind == "account_state" && e.data["state"] == "logged_out"));
    assert!(
        woken.lock().unwrap().contains(&account),
        "the actor is told"
    );

    let view = fake.gw.pairing(&a).await;
    assert_eq!(view.state, "logged_out");
    let again = fake.gw.start_pairing(&a, None).await.unwrap();
    assert_eq!(again.state, "waiting_qr");
    assert!(again.qr_text.is_some());
    assert!(fake.gw.qr_png(&a).is_some());
}

#[tokio::test]
async fn a_temporary_ban_answers_banned_until_its_end() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(1);
    let store = store_with(&[&account]).await;
    fake.record(store.clone(), Arc::default(), Arc::default());
    fake.gw
        .send(&account, &groups[0], &text("a"), "a")
        .await
        .unwrap();
    let until = chrono::Utc::now() + chrono::Duration::hours(1);
    fake.net.emit(
        &account,
        Signal::Banned {
            until: Some(until),
            reason: "temporarily banned by WhatsApp (101: …)".into(),
        },
    );
    assert_eq!(
        fake.gw.send(&account, &groups[0], &text("b"), "b").await,
        Err(GatewayError::Banned { until: Some(until) })
    );
    let a = wait_state(&store, &account, AccountState::Banned).await;
    assert_eq!(a.state, AccountState::Banned);
}

/// Logout, lock and ban are counted when they reach the session, idle or
/// not, each once; a lock and a ban restart the warm-up, a logout by the
/// phone does not.
#[tokio::test]
async fn session_signals_are_counted_once_and_a_lock_or_ban_is_an_incident() {
    for (signal, state, label, incident) in [
        (
            Signal::LoggedOut("the phone removed this linked device".into()),
            AccountState::LoggedOut,
            "logged_out",
            false,
        ),
        (
            Signal::LoggedOut(super::classify::LOCKED.into()),
            AccountState::LoggedOut,
            "account_locked",
            true,
        ),
        (
            Signal::Banned {
                until: None,
                reason: "temporarily banned by WhatsApp".into(),
            },
            AccountState::Banned,
            "temporary_ban",
            true,
        ),
    ] {
        let fake = Fake::new(config());
        let (account, groups) = fake.paired(1);
        let store = store_with(&[&account]).await;
        let signals = Arc::new(Signals::default());
        fake.record(store.clone(), Arc::default(), signals.clone());
        // The session opens on a first send; then, idle, it hears the signal.
        fake.gw
            .send(&account, &groups[0], &text("a"), "a")
            .await
            .unwrap();
        fake.net.emit(&account, signal.clone());
        let a = wait_state(&store, &account, state).await;
        assert_eq!(a.state, state, "{label}");
        // A send after it fails on it; the run does not count it again
        // (the gateway says it reports session signals itself).
        assert!(fake
            .gw
            .send(&account, &groups[0], &text("b"), "b")
            .await
            .is_err());
        assert!(fake.gw.reports_session_signals());
        // The signal's event is emitted last, after the incident is stored.
        let until = StdInstant::now() + Duration::from_secs(2);
        let told = loop {
            let events = store.events_after(0, 20).await.unwrap();
            let told = events
                .iter()
                .any(|e| e.kind == "account_signal" && e.data["signal"] == label);
            if told || StdInstant::now() > until {
                break told;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(told, "{label}: an account_signal event");
        assert_eq!(*signals.0.lock().unwrap(), vec![label], "{label}");
        let a = store.get_account(&account).await.unwrap().unwrap();
        assert_eq!(a.incident_at.is_some(), incident, "{label}: incident");
    }
}

#[tokio::test]
async fn a_dropped_connection_is_waited_for_then_unreachable() {
    let fake = Fake::new(config());
    let (account, groups) = fake.paired(1);
    let store = store_with(&[&account]).await;
    fake.record(store.clone(), Arc::default(), Arc::default());
    fake.gw
        .send(&account, &groups[0], &text("a"), "a")
        .await
        .unwrap();

    // Back within the wait: the send goes through.
    fake.net.emit(
        &account,
        Signal::Disconnected("connection lost: stream ended (EOF)".into()),
    );
    let net = fake.net.clone();
    let id = account.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        net.emit(&id, Signal::Connected);
    });
    assert_eq!(
        fake.gw.send(&account, &groups[0], &text("b"), "b").await,
        Ok(DELIVERED)
    );

    // Not back: Unreachable after the bounded wait, then at once.
    fake.net.emit(
        &account,
        Signal::Disconnected("connection lost: read error: reset".into()),
    );
    let started = StdInstant::now();
    let got = fake.gw.send(&account, &groups[0], &text("c"), "c").await;
    let waited = started.elapsed();
    let Err(e @ GatewayError::Unreachable(_)) = got else {
        panic!("{got:?}")
    };
    assert!(
        e.to_string()
            .starts_with("cannot reach WhatsApp: connection lost"),
        "{e}"
    );
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(3));
    let started = StdInstant::now();
    assert!(matches!(
        fake.gw.send(&account, &groups[0], &text("d"), "d").await,
        Err(GatewayError::Unreachable(_))
    ));
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "no second wait"
    );
    let a = wait_state(&store, &account, AccountState::Disconnected).await;
    assert_eq!(a.state, AccountState::Disconnected);
    fake.net.emit(&account, Signal::Connected);
    assert_eq!(
        wait_state(&store, &account, AccountState::Connected)
            .await
            .state,
        AccountState::Connected
    );
}

#[tokio::test]
async fn an_unreachable_account_does_not_hold_up_the_others() {
    let fake = Fake::new(config());
    let (down, down_groups) = fake.paired(1);
    fake.net.offline.lock().unwrap().insert(down.clone());
    let (up, up_groups) = fake.paired(5);
    let gw = fake.gw.clone();
    let g = down_groups[0].clone();
    let stuck = tokio::spawn(async move {
        gw.send(&down, &g, &OutgoingMessage::Text("x".into()), "x")
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = StdInstant::now();
    for (i, g) in up_groups.iter().enumerate() {
        assert_eq!(
            fake.gw.send(&up, g, &text("y"), &format!("y{i}")).await,
            Ok(DELIVERED)
        );
    }
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(
        !stuck.is_finished(),
        "the other account is still waiting for its connection"
    );
    let got = stuck.await.unwrap();
    assert!(
        matches!(&got, Err(GatewayError::Unreachable(m)) if m.contains("Connection refused")),
        "{got:?}"
    );
}

fn whatsapp_account(id: &str, state: AccountState) -> Account {
    Account {
        id: AccountId::parse(id).unwrap(),
        name: id.into(),
        kind: GatewayKind::Whatsapp,
        state,
        state_reason: None,
        state_until: None,
        limits: AccountLimits::default(),
        created_at: chrono::Utc::now(),
        incident_at: None,
        standing: Default::default(),
    }
}

#[tokio::test]
async fn pairing_by_qr_over_the_fake() {
    let fake = Fake::new(config());
    let acct = whatsapp_account("fresh", AccountState::Pairing);
    assert_eq!(fake.gw.pairing(&acct).await.state, "idle");
    assert!(fake.gw.qr_png(&acct).is_none());
    let v = fake.gw.start_pairing(&acct, None).await.unwrap();
    assert_eq!(v.state, "waiting_qr");
    assert_eq!(v.qr.as_deref(), Some("2@fake,qr"));
    let png = fake.gw.qr_png(&acct).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
    fake.net.emit(
        &acct.id,
        Signal::PairSuccess {
            jid: "60123456789@s.whatsapp.net".into(),
        },
    );
    let v = fake.gw.pairing(&acct).await;
    assert_eq!(v.state, "paired");
    assert_eq!(v.jid.as_deref(), Some("60123456789@s.whatsapp.net"));
    assert!(matches!(
        fake.gw.start_pairing(&acct, None).await,
        Err(PairingError::AlreadyPaired(_))
    ));
    let sim = Account {
        kind: GatewayKind::Simulator,
        ..acct.clone()
    };
    assert!(matches!(
        fake.gw.start_pairing(&sim, None).await,
        Err(PairingError::NotWhatsapp(_))
    ));
    assert!(matches!(
        fake.gw.start_pairing(&acct, Some("0123")).await,
        Err(PairingError::Invalid { field: "phone", .. })
    ));
}

#[test]
fn config_from_settings() {
    let env: HashMap<String, String> = [
        ("HERALD_WHATSAPP__ACK_TIMEOUT_SECS", "45"),
        ("HERALD_WHATSAPP__UPLOAD_VALID_HOURS", "24"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let settings = crate::settings::Settings::load_from(None, &env).unwrap();
    let c = WhatsappConfig::from_settings(&settings.whatsapp);
    assert_eq!(c.ack_timeout, Duration::from_secs(45));
    assert_eq!(c.upload_valid_for, Duration::from_secs(24 * 3600));
    assert_eq!(c.threads, 2);
    assert_eq!(c.reconnect_wait, Duration::from_secs(30));
}

// ------------------------------------------------------------ real client

/// A loopback port nothing listens on: connecting is refused at once, as
/// when WhatsApp is unreachable.
fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("ws://127.0.0.1:{port}/ws/chat")
}

/// The real gateway on a SQLite database in `dir` holding `accounts`.
async fn real_gateway(dir: &Path, accounts: &[&str]) -> (WhatsappGateway, store::SessionStore) {
    use herald_actors::ports::AccountStore as _;
    let url = format!("sqlite://{}", dir.join("herald.db").display());
    let sql = crate::store::SqlStore::connect(&url).await.unwrap();
    for id in accounts {
        let new = NewAccount::named_by_id(
            AccountId::parse(id).unwrap(),
            GatewayKind::Whatsapp,
            AccountState::Pairing,
        );
        sql.create_account(&new, chrono::Utc::now()).await.unwrap();
    }
    let key = crate::seal::key_file::open_key(&dir.join("session.key"), &sql.sealed())
        .await
        .unwrap();
    let sessions = store::SessionStore::new(sql.wa_rows(), key);
    let gw = WhatsappGateway::new(
        WhatsappConfig {
            transport_url: Some(closed_port_url()),
            // No version fetch over HTTP: the test must not depend on DNS.
            version_override: Some((2, 3000, 1_000_000_000)),
            ..config()
        },
        dir,
        sessions.clone(),
    )
    .unwrap();
    (gw, sessions)
}

/// Stores a session that holds a login, as after pairing, so the real
/// client starts and tries to connect.
async fn seed_paired_session(sessions: &store::SessionStore, id: &AccountId) {
    use whatsapp_rust::wacore::store::traits::DeviceStore as _;
    let mut device = whatsapp_rust::wacore::store::Device::new();
    device.pn = Some("60123456789@s.whatsapp.net".parse().unwrap());
    sessions.backend(id).save(&device).await.unwrap();
}

#[tokio::test]
async fn unreachable_pairing_fails_promptly_with_a_clear_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, sessions) = real_gateway(dir.path(), &["nowhere"]).await;
    let acct = whatsapp_account("nowhere", AccountState::Pairing);
    let started = StdInstant::now();
    let v = gw.start_pairing(&acct, None).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(v.state, "failed");
    let reason = v.reason.unwrap();
    assert!(reason.starts_with("cannot reach WhatsApp: "), "{reason}");
    assert_eq!(gw.pairing(&acct).await.state, "failed");
    assert!(
        sessions.stored(&acct.id).await.unwrap(),
        "the new device's keys are in the database"
    );
    // The pair-code flow fails the same way.
    let v = gw
        .start_pairing(&acct, Some("+60 12 345 6789"))
        .await
        .unwrap();
    assert_eq!(v.state, "failed");
    assert_eq!(v.phone.as_deref(), Some("60123456789"));
}

#[tokio::test]
async fn unreachable_sends_answer_unreachable_promptly_on_every_account() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, sessions) = real_gateway(dir.path(), &["down-a", "down-b", "pairing-meanwhile"]).await;
    let a = AccountId::parse("down-a").unwrap();
    let b = AccountId::parse("down-b").unwrap();
    seed_paired_session(&sessions, &a).await;
    seed_paired_session(&sessions, &b).await;
    let g = GroupJid::parse("120363000000000001@g.us").unwrap();
    let started = StdInstant::now();
    let pairing = whatsapp_account("pairing-meanwhile", AccountState::Pairing);
    let (x, y) = (text("x"), text("y"));
    let (ra, rb, rp) = tokio::join!(
        gw.send(&a, &g, &x, "x"),
        gw.send(&b, &g, &y, "y"),
        gw.start_pairing(&pairing, None),
    );
    let elapsed = started.elapsed();
    for got in [ra, rb] {
        let Err(e @ GatewayError::Unreachable(_)) = got else {
            panic!("{got:?}")
        };
        assert!(e.to_string().starts_with("cannot reach WhatsApp: "), "{e}");
    }
    assert_eq!(rp.unwrap().state, "failed");
    // One reconnect wait (1 s here), not one per account.
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    // Uploads fail the same way, at once now that the wait is spent.
    let bytes: Arc<[u8]> = Arc::from(&b"\x89PNG"[..]);
    let started = StdInstant::now();
    let up = gw
        .upload(&a, &MediaId::of_bytes(&bytes), "image/png", bytes)
        .await;
    assert!(matches!(up, Err(GatewayError::Unreachable(_))), "{up:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    gw.shutdown().await;
}

/// Logins of many accounts, on controlled time: never more than
/// `logins_per_sec` in any second, whatever stalls hold some of them back
/// (a stall is not caught up in a burst), and without stalls the storm runs
/// at the rate itself (5,000 at 50 a second take 100 s, not 112). Seeded:
/// a failing seed is printed, to be kept here.
#[tokio::test(start_paused = true)]
async fn logins_keep_to_the_rate_in_every_second_and_reach_it() {
    use rand::{RngExt as _, SeedableRng as _};
    for seed in 0..300u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let rate = rng.random_range(1..=120u32);
        let logins = rng.random_range(1..=4 * rate as usize);
        let stalls = rng.random_bool(0.5);
        let started = tokio::time::Instant::now();
        let mut pace = super::pace::LoginPace::new(rate, &mut rng);
        let mut at = Vec::with_capacity(logins);
        for _ in 0..logins {
            if stalls && rng.random_bool(0.1) {
                let stall = std::time::Duration::from_millis(rng.random_range(0..3000));
                tokio::time::sleep(stall).await;
            }
            pace.wait().await;
            at.push(tokio::time::Instant::now());
        }
        for (i, t) in at.iter().enumerate() {
            let within = at[i..]
                .iter()
                .take_while(|u| **u - *t < std::time::Duration::from_secs(1))
                .count();
            assert!(
                within <= rate as usize,
                "seed {seed}: {within} logins within a second at {rate} a second"
            );
        }
        if !stalls {
            let took = (at[logins - 1] - started).as_secs_f64();
            let least = (logins - 1) as f64 / f64::from(rate);
            let most = logins as f64 / f64::from(rate) + 0.002;
            assert!(
                took >= least && took <= most,
                "seed {seed}: {logins} logins at {rate} a second took {took} s, not {least}..{most}"
            );
        }
    }
}
