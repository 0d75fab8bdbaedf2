//! A fake WhatsApp Web server for Herald's tests and `herald bench sessions`
//! (the daemon's `bench` feature; release builds leave it out): the real WhatsApp framing,
//! Noise handshake (XX and IK, as the responder) and binary nodes, on a
//! WebSocket on loopback, built from the protocol crates whatsapp-rust is
//! made of. It also plays the operator's phone (it scans the QR code Herald
//! shows and signs the new device's identity, see [`Phone`]).
//!
//! What it serves is listed in [`Server::handle`]; everything else the
//! client asks for gets an empty `result`, which whatsapp-rust treats as
//! "nothing there" (its post-login housekeeping only logs about it).
//!
//! Every connection, client payload and stanza is recorded in [`Log`] so
//! tests can assert on what went over the wire. `FAKE_WA_TRACE=1` prints
//! each stanza as it passes.
//!
//! Imports: nothing of Herald: it speaks only the protocol, so the real
//! client is tested against code that shares none of its assumptions.

use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_websockets::{Message, ServerBuilder};
use whatsapp_rust::wacore::libsignal::protocol::KeyPair;
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::marshal::{marshal, unmarshal_ref};
use whatsapp_rust::wacore_binary::util::unpack;
use whatsapp_rust::wacore_binary::{Node, NodeContent};

mod controls;
mod delivery;
mod external;
mod groups;
mod log;
mod media;
mod nodes;
mod noise;
mod pair_code;
mod phone;
mod receipts;
mod recipient;
mod relays;
mod standing;
mod votes;
pub use delivery::{Delivery, Linked, Policy, Verdict};
pub use external::{ExternalDevice, RetryAsked};
pub use groups::Group;
pub use log::{Log, Seen, SeenLine};
pub use media::Upload;
use nodes::SERVER;
use nodes::*;
use noise::*;
pub use noise::{ClientHello, Registration};
use phone::*;
pub use phone::{key_pair, sign, Phone, Qr};
pub use receipts::{ReceiptPlan, ReceiptSent};
pub use recipient::Decrypted;
pub use standing::{Quota, Standing};
pub use votes::{CastVote, VotePlan};

/// A pair-success sent: (the QR scanned, the device number, the member it
/// links to; `None`: the account's phone).
type PendingLink = (Qr, u32, Option<String>);

/// A receipt waiting for its time: (due, receipt, the sender's login).
type DueReceipt = (Instant, ReceiptSent, (u64, u32));

/// Shared state of the server.
struct Shared {
    noise_static: KeyPair,
    cert_chain: Vec<u8>,
    log: Mutex<Log>,
    next_conn: AtomicU64,
    next_id: AtomicU64,
    /// Open connections: conn number -> outgoing stanza queue.
    conns: Mutex<HashMap<u64, mpsc::UnboundedSender<Out>>>,
    /// Pairing refs handed out: ref -> conn.
    refs: Mutex<HashMap<String, u64>>,
    /// Pair-success sent, waiting for the device's signature: iq id ->
    /// (qr, device, the member it links to; `None`: the account's phone).
    pending_links: Mutex<HashMap<String, PendingLink>>,
    /// Devices of members run by other clients, and what they uploaded.
    externals: Mutex<external::Externals>,
    linked: Mutex<Vec<Linked>>,
    phone: Phone,
    groups: Mutex<Vec<Group>>,
    deliveries: Mutex<Vec<Delivery>>,
    policy: Mutex<Option<Policy>>,
    /// Pre-key bundles handed out, by device JID.
    keys: Mutex<HashMap<String, Arc<DeviceKeys>>>,
    /// The member devices' Signal state, as recipients.
    recipients: Mutex<recipient::Recipients>,
    prekey_fetches: AtomicU64,
    /// Answered to a login instead of `<success>`: `<failure>` attributes.
    login_failure: Mutex<Option<Vec<(&'static str, String)>>>,
    /// How long a login waits before `<success>` (and before it replaces
    /// the device's older connection).
    login_delay: Mutex<Option<Duration>>,
    /// How long the device-list and pre-key queries a first send to a group
    /// makes wait for their answers.
    key_query_delay: Mutex<Option<Duration>>,
    /// `127.0.0.1:port` of the media (HTTPS) server.
    media: Arc<media::MediaHost>,
    pair_codes: Mutex<Vec<pair_code::PairCodeRequest>>,
    /// The connection each logged-in device (user, device number) is on:
    /// one device, one connection.
    logins: Mutex<HashMap<(u64, u32), u64>>,
    /// Devices per group member (the phone and companions).
    member_devices: AtomicU32,
    /// Receipts group messages get (none by default).
    receipt_plan: Mutex<Option<ReceiptPlan>>,
    receipts_due: Mutex<Vec<DueReceipt>>,
    /// Relayed receipts, with the login they went to.
    receipts_sent: Mutex<Vec<(ReceiptSent, (u64, u32))>>,
    /// The polls sent and the members' votes on them (none unless planned).
    votes: Mutex<votes::Votes>,
    /// The linked devices' own pre-key uploads, handed out (each one-time
    /// key once) to a member's phone or another client's device opening a
    /// session with one: a vote or a member's message goes to it.
    linked_keys: Mutex<external::Externals>,
    /// Log stanzas without their children (see [`FakeWhatsApp::shallow_log`]).
    shallow_log: AtomicBool,
    /// The account's time-lock and new-chat quota.
    standing: Mutex<standing::Standing>,
    trace: bool,
}

enum Out {
    Node(Node),
    /// Close the socket (after what was queued before).
    Close,
}

/// The running fake server. Dropping it stops it.
pub struct FakeWhatsApp {
    shared: Arc<Shared>,
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for FakeWhatsApp {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl FakeWhatsApp {
    /// Binds 127.0.0.1 on a free port and serves on a runtime of its own.
    pub fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-whatsapp")
            .enable_all()
            .build()
            .expect("runtime");
        let noise_static = key_pair();
        let cert_chain = wacore_noise::test_util::build_cert_chain_bytes(&pub32(&noise_static));
        let trace = std::env::var_os("FAKE_WA_TRACE").is_some();
        let shared = Arc::new(Shared {
            noise_static,
            cert_chain,
            log: Mutex::default(),
            next_conn: AtomicU64::new(1),
            next_id: AtomicU64::new(1),
            conns: Mutex::default(),
            refs: Mutex::default(),
            pending_links: Mutex::default(),
            externals: Mutex::default(),
            linked: Mutex::default(),
            phone: Phone::new("15550001111", "100000000000001"),
            groups: Mutex::default(),
            deliveries: Mutex::default(),
            policy: Mutex::default(),
            keys: Mutex::default(),
            recipients: Mutex::default(),
            prekey_fetches: AtomicU64::new(0),
            login_failure: Mutex::default(),
            login_delay: Mutex::default(),
            key_query_delay: Mutex::default(),
            media: Arc::new(media::MediaHost::new(trace)),
            pair_codes: Mutex::default(),
            logins: Mutex::default(),
            member_devices: AtomicU32::new(1),
            receipt_plan: Mutex::default(),
            receipts_due: Mutex::default(),
            receipts_sent: Mutex::default(),
            votes: Mutex::default(),
            linked_keys: Mutex::default(),
            shallow_log: AtomicBool::new(false),
            standing: Mutex::default(),
            trace,
        });
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().unwrap();
        let s = shared.clone();
        rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let conn = s.next_conn.fetch_add(1, Ordering::SeqCst);
                    if let Err(e) = serve(s.clone(), conn, tcp).await {
                        if s.trace {
                            eprintln!("[fake-wa {conn}] ended: {e}");
                        }
                    }
                    s.conns.lock().unwrap().remove(&conn);
                    s.log.lock().unwrap().seen.push(Seen::Closed(conn));
                });
            }
        });
        let media = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        *shared.media.host.lock().unwrap() = media.local_addr().unwrap().to_string();
        rt.spawn(media::serve_media(shared.media.clone(), media));
        let s = shared.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                s.send_due_receipts();
                s.send_due_votes();
            }
        });
        Self {
            shared,
            addr,
            rt: Some(rt),
        }
    }

    /// Reads or changes what the server says of the account (its
    /// time-lock, its new-chat quota, whether it knows the quota query):
    /// e.g. `fake.standing(|s| s.locked_until = Some(end))`.
    pub fn standing<T>(&self, f: impl FnOnce(&mut Standing) -> T) -> T {
        f(&mut self.shared.standing.lock().unwrap())
    }

    /// Media uploads received, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.media.uploads.lock().unwrap().clone()
    }

    /// The WebSocket URL for `whatsapp.server_url`.
    pub fn url(&self) -> String {
        format!("ws://{}/ws/chat", self.addr)
    }

    /// Reads the log.
    pub fn log<T>(&self, f: impl FnOnce(&Log) -> T) -> T {
        f(&self.shared.log.lock().unwrap())
    }

    /// Polls the log until `cond` holds; panics after `within`.
    pub fn wait_for(&self, what: &str, within: Duration, cond: impl Fn(&Log) -> bool) {
        let deadline = Instant::now() + within;
        while !self.log(&cond) {
            assert!(
                Instant::now() < deadline,
                "fake WhatsApp: no {what} within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn phone(&self) -> &Phone {
        &self.shared.phone
    }

    pub fn linked(&self) -> Vec<Linked> {
        self.shared.linked.lock().unwrap().clone()
    }

    /// The linked devices once there are `n`. The client reports the pairing
    /// when it has *sent* its counter-signature; the server checks it a
    /// moment later, so a test that reads `linked()` at once races it.
    pub fn wait_linked(&self, n: usize, within: Duration) -> Vec<Linked> {
        let deadline = Instant::now() + within;
        loop {
            let linked = self.linked();
            if linked.len() >= n || Instant::now() >= deadline {
                return linked;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The phone scans `qr_code` (as shown by Herald): the server sends the
    /// device on the connection that was given that ref its pair-success.
    pub fn scan(&self, qr_code: &str) -> Result<(), String> {
        let qr = Qr::parse(qr_code)?;
        let conn = self.shared.conn_given(&qr)?;
        let id = self.shared.id();
        let (node, device) = self.shared.phone.pair_success(&qr, &id);
        self.shared
            .pending_links
            .lock()
            .unwrap()
            .insert(id, (qr, device, None));
        self.shared.send(conn, node)
    }

    /// The phone of group member `member` (a phone number of
    /// [`Self::set_groups`]) scans `qr_code`, as shown by another client:
    /// that client becomes one of the member's devices, in every group the
    /// member is in. Answers the device's JID; the link holds once the
    /// device has signed it ([`Self::external_devices`]).
    pub fn scan_as_member(&self, qr_code: &str, member: &str) -> Result<String, String> {
        let qr = Qr::parse(qr_code)?;
        let conn = self.shared.conn_given(&qr)?;
        let known = self
            .shared
            .groups
            .lock()
            .unwrap()
            .iter()
            .any(|g| g.members.iter().any(|m| m == member));
        if !known {
            return Err(format!("{member} is not a member of any group"));
        }
        let primary = self.shared.keys_of(&external::device_jid(member, 0));
        let device = self.shared.externals.lock().unwrap().next_device();
        let id = self.shared.id();
        let who = phone::Primary {
            user: member,
            lid: None,
            identity: &primary.identity,
            name: member,
        };
        let node = phone::pair_success(&who, &qr, &id, device);
        self.shared
            .pending_links
            .lock()
            .unwrap()
            .insert(id, (qr, device, Some(member.to_owned())));
        self.shared.send(conn, node)?;
        Ok(external::device_jid(member, device))
    }

    /// Members' devices run by other clients, linked so far.
    pub fn external_devices(&self) -> Vec<ExternalDevice> {
        self.shared.externals.lock().unwrap().devices.clone()
    }

    /// One-time pre-keys the device `jid` has on the server (0 before its
    /// upload).
    pub fn prekeys_of(&self, jid: &str) -> usize {
        self.shared.externals.lock().unwrap().count(jid)
    }

    /// Whether the device `jid` (`user:N@s.whatsapp.net`) has a connection
    /// open now.
    pub fn online(&self, jid: &str) -> bool {
        let conn = external::login_of(jid)
            .and_then(|login| self.shared.logins.lock().unwrap().get(&login).copied());
        conn.is_some_and(|c| self.shared.conns.lock().unwrap().contains_key(&c))
    }

    /// Messages a device (another client's, or the account's linked one)
    /// asked to be sent again: it could not decrypt them.
    pub fn retries(&self) -> Vec<RetryAsked> {
        self.shared.externals.lock().unwrap().retries.clone()
    }

    /// From now on the log keeps each stanza's tag and attributes only: a
    /// benchmark of many accounts measures the client's memory, not the
    /// log's (a login's pre-key upload alone is hundreds of nodes).
    pub fn shallow_log(&self) {
        self.shared.shallow_log.store(true, Ordering::SeqCst);
    }

    /// The phone removes the linked device (Linked devices → Log out):
    /// WhatsApp's `<stream:error><conflict type="device_removed"/>`.
    pub fn remove_device(&self) {
        self.shared.linked.lock().unwrap().clear();
        let node = conflict("device_removed");
        for tx in self.shared.conns.lock().unwrap().values() {
            let _ = tx.send(Out::Node(node.clone()));
            let _ = tx.send(Out::Close);
        }
    }

    /// From now on a login is refused with `<failure reason=…>` (and
    /// `code`, `expire` in seconds when given): 402 is a temporary ban,
    /// 403 a locked account. `None` lets logins succeed again.
    pub fn refuse_logins(&self, failure: Option<(u16, Option<u32>, Option<u64>)>) {
        *self.shared.login_failure.lock().unwrap() =
            failure.map(|(reason, code, expire)| failure_attrs(reason, code, expire));
    }

    /// From now on each login (not a new device's registration) waits `d`
    /// before it succeeds; `None`: at once again. A slow login keeps the
    /// device's older connection open meanwhile.
    pub fn slow_logins(&self, d: Option<Duration>) {
        *self.shared.login_delay.lock().unwrap() = d;
    }

    /// From now on the device-list (`usync`) and pre-key (`encrypt`)
    /// queries wait `d` for their answers: a first send to a group is held
    /// inside the client that long. `None`: answered at once again.
    pub fn hold_key_queries(&self, d: Option<Duration>) {
        *self.shared.key_query_delay.lock().unwrap() = d;
    }

    /// The phone user types `code` (as Herald shows it, e.g. `ABCD-EFGH`)
    /// under Linked devices → Link with phone number: the phone unwraps the
    /// companion's ephemeral key with it and answers with its own
    /// (`primary_hello`), wrapped with the same code.
    pub fn enter_pair_code(&self, code: &str) -> Result<(), String> {
        let mut requests = self.shared.pair_codes.lock().unwrap();
        // WhatsApp routes the request to the number the companion named.
        let mine = format!("{}@s.whatsapp.net", self.shared.phone.user);
        let (conn, node) = pair_code::typed(
            &mut requests,
            &mine,
            code,
            &self.shared.phone.identity,
            self.shared.id(),
        )?;
        self.shared.send(conn, node)
    }

    /// Closes every open connection from the server's side.
    pub fn drop_connections(&self) {
        for tx in self.shared.conns.lock().unwrap().values() {
            let _ = tx.send(Out::Close);
        }
    }
}

impl Shared {
    /// The connection that was given the ref `qr` shows.
    fn conn_given(&self, qr: &Qr) -> Result<u64, String> {
        self.refs
            .lock()
            .unwrap()
            .get(&qr.reference)
            .copied()
            .ok_or_else(|| format!("no connection was given the ref {}", qr.reference))
    }

    fn id(&self) -> String {
        format!("fake.{}", self.next_id.fetch_add(1, Ordering::SeqCst))
    }

    fn send(&self, conn: u64, node: Node) -> Result<(), String> {
        let conns = self.conns.lock().unwrap();
        let tx = conns
            .get(&conn)
            .ok_or_else(|| format!("connection {conn} is closed"))?;
        tx.send(Out::Node(node))
            .map_err(|_| format!("connection {conn} is closed"))
    }

    /// Answers one stanza from the client on connection `conn`.
    fn handle(&self, conn: u64, node: &Node, out: &mpsc::UnboundedSender<Out>) {
        let attr = |n: &Node, k: &str| n.attrs.get(k).map(|v| v.to_string());
        if node.tag == "message" {
            self.message(conn, node, out);
            return;
        }
        if node.tag == "receipt" {
            self.device_receipt(conn, node);
            return;
        }
        if node.tag != "iq" {
            // Acks, presence, notifications' acks: nothing to answer.
            return;
        }
        let id = attr(node, "id").unwrap_or_default();
        let kind = attr(node, "type").unwrap_or_default();
        let xmlns = attr(node, "xmlns").unwrap_or_default();
        let first = node.children().and_then(|c| c.first());
        let result = || {
            NodeBuilder::new("iq")
                .attr("from", SERVER)
                .attr("type", "result")
                .attr("id", id.clone())
        };
        match (kind.as_str(), xmlns.as_str(), first.map(|c| c.tag.as_ref())) {
            // The device's answer to pair-success.
            ("result", _, Some("pair-device-sign")) => {
                let Some((qr, device, member)) = self.pending_links.lock().unwrap().remove(&id)
                else {
                    return;
                };
                let signed = first
                    .and_then(|c| c.get_optional_child("device-identity"))
                    .and_then(|d| match &d.content {
                        Some(NodeContent::Bytes(b)) => Some(b.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                let signer = match &member {
                    Some(m) => self.keys_of(&external::device_jid(m, 0)).identity.clone(),
                    None => self.phone.identity.clone(),
                };
                match phone::verify_device_signature(&signer, &qr, &signed) {
                    Ok(()) => {
                        match member {
                            Some(user) => {
                                self.externals.lock().unwrap().devices.push(ExternalDevice {
                                    user,
                                    device,
                                    identity_key: qr.identity_key,
                                })
                            }
                            None => self.linked.lock().unwrap().push(Linked {
                                user: self.phone.user.clone(),
                                device,
                                identity_key: qr.identity_key,
                            }),
                        }
                        // As WhatsApp does: "restart required"; the device
                        // reconnects and logs in as itself.
                        let _ = out.send(Out::Node(
                            NodeBuilder::new("stream:error").attr("code", "515").build(),
                        ));
                        let _ = out.send(Out::Close);
                    }
                    Err(e) => eprintln!("[fake-wa {conn}] device link refused: {e}"),
                }
            }
            ("result" | "error", _, _) => {}
            // Pair code, stage 1: the companion's ephemeral key wrapped with
            // the code it shows; the server answers a pairing ref.
            ("set", "md", Some("link_code_companion_reg"))
                if first.and_then(|f| attr(f, "stage")).as_deref() == Some("companion_hello") =>
            {
                let (request, body) = pair_code::hello(conn, first.expect("matched"));
                self.pair_codes.lock().unwrap().push(request);
                let _ = out.send(Out::Node(result().children([body]).build()));
            }
            // Pair code, stage 2: the companion's key bundle, encrypted to the
            // phone's ephemeral key. The phone opens it, derives the ADV
            // secret both sides now share, and links the device.
            ("set", "md", Some("link_code_companion_reg"))
                if first.and_then(|f| attr(f, "stage")).as_deref() == Some("companion_finish") =>
            {
                let _ = out.send(Out::Node(result().build()));
                let f = first.expect("matched");
                let opened = pair_code::open_key_bundle(
                    &self.pair_codes.lock().unwrap(),
                    &self.phone.identity,
                    f,
                );
                match opened {
                    Ok(qr) => {
                        let id = self.id();
                        let (node, device) = self.phone.pair_success(&qr, &id);
                        self.pending_links
                            .lock()
                            .unwrap()
                            .insert(id, (qr, device, None));
                        let _ = out.send(Out::Node(node));
                    }
                    Err(e) => eprintln!("[fake-wa {conn}] pair code refused: {e}"),
                }
            }
            // Privacy settings: read receipts on, so a client that asks
            // before it reads sends them.
            ("get", "privacy", _) => {
                let _ = out.send(Out::Node(result().children([privacy()]).build()));
            }
            // Keep-alive.
            ("get", "w:p", _) => {
                let _ = out.send(Out::Node(result().build()));
            }
            // Going active: WhatsApp then says the offline queue is empty.
            ("set", "passive", _) => {
                let _ = out.send(Out::Node(result().build()));
                let _ = out.send(Out::Node(offline_done()));
            }
            // What WhatsApp says of the account: its time-lock, its
            // new-chat quota (MEX queries).
            ("get", "w:mex", Some("query")) => {
                let answer = self
                    .standing
                    .lock()
                    .unwrap()
                    .answer(first.expect("matched"));
                let reply = match answer {
                    Some(r) => result().children([r]).build(),
                    None => error(&id, 400, "unknown query"),
                };
                let _ = out.send(Out::Node(reply));
            }
            // The groups the account is in.
            ("get", "w:g2", Some("participating")) => {
                let groups: Vec<Node> = self
                    .groups
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|g| self.group_node(g))
                    .collect();
                let body = NodeBuilder::new("groups").children(groups).build();
                let _ = out.send(Out::Node(result().children([body]).build()));
            }
            // One group's info.
            ("get", "w:g2", Some("query")) => {
                let to = attr(node, "to").unwrap_or_default();
                let group = self
                    .groups
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|g| g.jid == to)
                    .map(|g| self.group_node(g));
                let reply = match group {
                    Some(g) => result().children([g]).build(),
                    None => error(&id, 404, "item-not-found"),
                };
                let _ = out.send(Out::Node(reply));
            }
            // Device lists.
            ("get", "usync", Some("usync")) => {
                // A client that asks for LIDs gets each user's with its devices.
                let lids = first
                    .and_then(|u| u.get_optional_child("query"))
                    .is_some_and(|q| q.get_optional_child("lid").is_some());
                let users: Vec<Node> = first
                    .and_then(|u| u.get_optional_child("list"))
                    .and_then(|l| l.children())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|u| attr(u, "jid"))
                    .map(|jid| self.device_list(&jid, lids))
                    .collect();
                let body = NodeBuilder::new("usync")
                    .children([NodeBuilder::new("list").children(users).build()])
                    .build();
                let _ = out.send(Out::Node(result().children([body]).build()));
            }
            // A member's device run by another client uploads its pre-keys,
            // and asks how many the server holds.
            ("set", "encrypt", _) if self.external_on(conn).is_some() => {
                let jid = self.external_on(conn).expect("matched");
                let kept = self.externals.lock().unwrap().upload(&jid, node);
                let _ = out.send(Out::Node(match kept {
                    Ok(_) => result().build(),
                    Err(e) => error(&id, 400, &e),
                }));
            }
            ("get", "encrypt", Some("count")) if self.external_on(conn).is_some() => {
                let jid = self.external_on(conn).expect("matched");
                let n = self.externals.lock().unwrap().count(&jid);
                let count = NodeBuilder::new("count")
                    .attr("value", n.to_string())
                    .build();
                let _ = out.send(Out::Node(result().children([count]).build()));
            }
            // The account's linked device uploads its pre-keys: kept for
            // the members' phones, answered as before.
            ("set", "encrypt", _) => {
                if let Some((user, device)) = self.login_on(conn) {
                    let jid = external::device_jid(&user.to_string(), device);
                    let _ = self.linked_keys.lock().unwrap().upload(&jid, node);
                }
                let _ = out.send(Out::Node(result().build()));
            }
            // Pre-key bundles, so the client can open Signal sessions and
            // hand the group's sender key to each device: a device of
            // another client's as it uploaded them, a simulated one's as
            // the server made them.
            ("get", "encrypt", Some("key")) => {
                self.prekey_fetches.fetch_add(1, Ordering::SeqCst);
                let users: Vec<Node> = first
                    .and_then(|k| k.children())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|u| attr(u, "jid"))
                    .map(|jid| {
                        let pn = self.pn_jid(&jid);
                        let uploaded = self.externals.lock().unwrap().bundle(&pn, &jid);
                        let uploaded = uploaded.or_else(|| self.linked_bundle(&pn, &jid));
                        uploaded.unwrap_or_else(|| self.keys_of(&pn).bundle(&jid))
                    })
                    .collect();
                let body = NodeBuilder::new("list").children(users).build();
                let _ = out.send(Out::Node(result().children([body]).build()));
            }
            // Where to upload media: our HTTPS server on loopback.
            ("set", "w:m", Some("media_conn")) => {
                let host = self.media.host.lock().unwrap().clone();
                let _ = out.send(Out::Node(result().children([media_conn(host)]).build()));
            }
            // App state: every collection is empty at version 0.
            ("set", "w:sync:app:state", Some("sync")) => {
                let names: Vec<String> = first
                    .and_then(|s| s.children())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|c| attr(c, "name"))
                    .collect();
                let _ = out.send(Out::Node(
                    result().children([empty_app_state(names)]).build(),
                ));
            }
            _ => {
                let _ = out.send(Out::Node(result().build()));
            }
        }
    }

    fn group_node(&self, g: &Group) -> Node {
        groups::group_node(&self.phone.user, g)
    }

    /// A user's devices, with its LID when the client asked for LIDs.
    fn device_list(&self, asked: &str, lids: bool) -> Node {
        let node = self.devices_of(asked);
        if !lids {
            return node;
        }
        let user = self.pn_jid(asked);
        let user = user.split(['@', ':']).next().unwrap_or_default();
        let lid = if user == self.phone.user {
            self.phone.lid.clone()
        } else {
            external::member_lid(user)
        };
        groups::with_lid(node, &lid)
    }

    /// `jid` in phone-number form (see [`external::pn_jid`]).
    fn pn_jid(&self, jid: &str) -> String {
        external::pn_jid(jid, (&self.phone.user, &self.phone.lid))
    }

    /// Device lists: the account has its phone and the linked devices;
    /// every member has `member_devices` and its devices run by other
    /// clients. Asked by phone number or LID; answered under the JID asked.
    fn devices_of(&self, jid: &str) -> Node {
        let pn = self.pn_jid(jid);
        let user = pn.split(['@', ':']).next().unwrap_or_default();
        if user == self.phone.user {
            let linked: Vec<u32> = self
                .linked
                .lock()
                .unwrap()
                .iter()
                .map(|l| l.device)
                .collect();
            return groups::device_list(
                jid,
                std::iter::once(0).chain(linked),
                &self.phone.identity,
            );
        }
        let phone = self.keys_of(&format!("{user}@s.whatsapp.net"));
        let external = self.externals.lock().unwrap().devices_of(user);
        groups::device_list(
            jid,
            (0..self.member_devices.load(Ordering::SeqCst)).chain(external),
            &phone.identity,
        )
    }

    /// The keys of one device, made on first request and then kept (the
    /// phone's device 0 uses the phone's identity key).
    fn keys_of(&self, jid: &str) -> Arc<DeviceKeys> {
        let mut keys = self.keys.lock().unwrap();
        keys.entry(jid.to_owned())
            .or_insert_with(|| {
                let user = jid.split(['@', ':']).next().unwrap_or_default();
                let primary = !jid.contains(':');
                let identity = if primary && (user == self.phone.user || user == self.phone.lid) {
                    self.phone.identity.clone()
                } else {
                    key_pair()
                };
                Arc::new(DeviceKeys::new(identity))
            })
            .clone()
    }

    /// A group message: record it and answer as the policy says.
    fn message(&self, conn: u64, node: &Node, out: &mpsc::UnboundedSender<Out>) {
        let attr = |n: &Node, k: &str| n.attrs.get(k).map(|v| v.to_string());
        let to = attr(node, "to").unwrap_or_default();
        if !to.ends_with("@g.us") {
            let _ = out.send(Out::Node(ack(node, &to, None)));
            return;
        }
        let id = attr(node, "id").unwrap_or_default();
        let enc = group_part(node);
        let size = match enc.and_then(|e| e.content.as_ref()) {
            Some(NodeContent::Bytes(b)) => b.len(),
            _ => 0,
        };
        let key_shares = node
            .get_optional_child("participants")
            .and_then(|p| p.children())
            .map(|c| c.len())
            .unwrap_or(0);
        let read = self.decrypt(conn, &to, node);
        let mut d = Delivery {
            read,
            group: to.clone(),
            kind: attr(node, "type").unwrap_or_default(),
            media_type: enc.and_then(|e| attr(e, "mediatype")),
            edit: attr(node, "edit"),
            size,
            key_shares,
            at: Instant::now(),
            seen_before: 0,
            verdict: Verdict::Ack,
            id,
            conn,
        };
        let mut all = self.deliveries.lock().unwrap();
        d.seen_before = all.iter().filter(|x| x.id == d.id).count();
        if self.standing.lock().unwrap().locked(chrono::Utc::now()) {
            // The account's reach-out is time-locked: refused, as WhatsApp
            // refuses it.
            d.verdict = Verdict::Nack(463);
        } else if let Some(p) = self.policy.lock().unwrap().as_ref() {
            d.verdict = p(&d);
        }
        match &d.verdict {
            Verdict::Ack => {
                let _ = out.send(Out::Node(ack(node, &to, None)));
                if d.seen_before == 0 {
                    self.plan_receipts(conn, &d);
                    self.plan_votes(conn, &d);
                    self.relay(conn, &to, node);
                }
            }
            Verdict::Nack(code) => {
                let _ = out.send(Out::Node(ack(node, &to, Some(*code))));
            }
            Verdict::Drop => {}
            Verdict::Disconnect => {
                let _ = out.send(Out::Close);
            }
        }
        all.push(d);
    }

    /// What the group's member devices read in a group message from the
    /// login on `conn`: each `<participants><to>` device takes the sender
    /// key from its pairwise message, then every member device holding it
    /// decrypts the `skmsg`.
    fn decrypt(&self, conn: u64, group: &str, node: &Node) -> Decrypted {
        let Some((user, device)) = self.login_on(conn) else {
            return Decrypted::default();
        };
        let sender = format!("{user}:{device}");
        let (mut participants, skmsg) = recipient::parts(node, |j| self.pn_jid(j));
        // Another client's devices read for themselves.
        let externals = self.externals.lock().unwrap();
        participants.retain(|(jid, _, _)| !externals.is_external(jid));
        drop(externals);
        let members: Vec<String> = self.devices_in(group).into_iter().flatten().collect();
        self.recipients.lock().unwrap().receive(
            group,
            &sender,
            &participants,
            skmsg.as_deref(),
            &members,
            |jid| self.keys_of(jid),
        )
    }

    /// The JID of the member's device of another client's logged in on
    /// `conn`, if that is what is there.
    fn external_on(&self, conn: u64) -> Option<String> {
        let (user, device) = self.login_on(conn)?;
        let jid = external::device_jid(&user.to_string(), device);
        self.externals
            .lock()
            .unwrap()
            .is_external(&jid)
            .then_some(jid)
    }

    /// A receipt from a device of another client's: delivery and read go
    /// to the message's author as the server's receipt; a retry request is
    /// recorded.
    fn device_receipt(&self, conn: u64, node: &Node) {
        let Some(device) = self.external_on(conn) else {
            // The account's own device asking for a message again (a vote,
            // a member's message it could not decrypt): recorded too.
            if let (Some(Err(mut retry)), Some((user, device))) =
                (external::receipt(node), self.login_on(conn))
            {
                retry.device = external::device_jid(&user.to_string(), device);
                self.externals.lock().unwrap().retries.push(retry);
            }
            return;
        };
        let (kind, group, ids, author) = match external::receipt(node) {
            None => return,
            Some(Err(mut retry)) => {
                retry.device = device;
                self.externals.lock().unwrap().retries.push(retry);
                return;
            }
            Some(Ok(r)) => (r.kind, r.group, r.ids, r.author),
        };
        for message_id in ids {
            let known = self
                .externals
                .lock()
                .unwrap()
                .authors
                .get(&message_id)
                .copied();
            let Some(sender) = known.or_else(|| external::login_of(&author)) else {
                continue;
            };
            let r = ReceiptSent {
                group: group.clone(),
                message_id,
                participant: device.clone(),
                kind,
                offline: false,
                conn: None,
            };
            // Through the same queue as the planned receipts: one due while
            // the author is offline waits for its next login.
            self.receipts_due
                .lock()
                .unwrap()
                .push((Instant::now(), r, sender));
        }
    }

    /// The login (user, device) connected on `conn`.
    fn login_on(&self, conn: u64) -> Option<(u64, u32)> {
        let logins = self.logins.lock().unwrap();
        logins.iter().find_map(|(k, c)| (*c == conn).then_some(*k))
    }

    /// Each member's device JIDs in `group`, the phone first.
    fn devices_in(&self, group: &str) -> Vec<Vec<String>> {
        let n = self.member_devices.load(Ordering::SeqCst);
        let all = self.groups.lock().unwrap();
        all.iter()
            .filter(|g| g.jid == group)
            .flat_map(|g| g.members.iter())
            .map(|m| groups::member_devices(m, n).collect())
            .collect()
    }

    /// Queues the receipts of a message just accepted, as the plan says,
    /// addressed to the sender's login (its connection may change before
    /// a late one is due).
    fn plan_receipts(&self, conn: u64, d: &Delivery) {
        let Some(plan) = self.receipt_plan.lock().unwrap().clone() else {
            return;
        };
        let Some(sender) = self.login_on(conn) else {
            return;
        };
        let devices = self.devices_in(&d.group);
        let now = Instant::now();
        let mut due = self.receipts_due.lock().unwrap();
        for (after, r) in receipts::planned(&plan, &d.group, &d.id, &devices) {
            due.push((now + after, r, sender));
        }
    }

    /// Relays the receipts whose time has come.
    fn send_due_receipts(&self) {
        let now = Instant::now();
        let ready: Vec<_> = self
            .receipts_due
            .lock()
            .unwrap()
            .extract_if(.., |(at, _, _)| *at <= now)
            .collect();
        for (at, mut r, sender) in ready {
            r.conn = self.logins.lock().unwrap().get(&sender).copied();
            let sent = r
                .conn
                .is_some_and(|conn| self.send(conn, receipts::node(&r)).is_ok());
            if !sent {
                // The sender is offline: held, as WhatsApp's offline queue
                // holds it, until it logs in again.
                r.conn = None;
                r.offline = true;
                self.receipts_due.lock().unwrap().push((at, r, sender));
                continue;
            }
            self.receipts_sent.lock().unwrap().push((r, sender));
        }
    }

    /// What the server sends right after the handshake.
    fn greet(&self, conn: u64, hello: &ClientHello, out: &mpsc::UnboundedSender<Out>) {
        if hello.registration.is_some() {
            // A new device: hand it refs to show as QR codes.
            let refs: Vec<String> = (0..6)
                .map(|i| format!("2@fake{conn}r{i}{:x}", rand::random::<u32>()))
                .collect();
            {
                let mut map = self.refs.lock().unwrap();
                for r in &refs {
                    map.insert(r.clone(), conn);
                }
            }
            let _ = out.send(Out::Node(pair_device(self.id(), refs)));
        } else if let Some(attrs) = self.login_failure.lock().unwrap().clone() {
            let mut b = NodeBuilder::new("failure");
            for (k, v) in attrs {
                b = b.attr(k, v);
            }
            let _ = out.send(Out::Node(b.build()));
            let _ = out.send(Out::Close);
        } else {
            if let (Some(user), Some(device)) = (hello.username, hello.device) {
                let old = self.logins.lock().unwrap().insert((user, device), conn);
                if let Some(old) = old.filter(|o| *o != conn) {
                    if let Some(tx) = self.conns.lock().unwrap().get(&old) {
                        let _ = tx.send(Out::Node(conflict("replaced")));
                        let _ = tx.send(Out::Close);
                        self.log
                            .lock()
                            .unwrap()
                            .seen
                            .push(Seen::Replaced { old, new: conn });
                    }
                }
            }
            // The account's own LID; a member's device gets one made from
            // its number.
            let lid = match hello.username {
                Some(u) if u.to_string() != self.phone.user => external::member_lid(&u.to_string()),
                _ => self.phone.lid.clone(),
            };
            let _ = out.send(Out::Node(success(&lid)));
            // What came for this device while it was away: the offline queue.
            if let (Some(user), Some(device)) = (hello.username, hello.device) {
                let waiting: Vec<Node> = self
                    .externals
                    .lock()
                    .unwrap()
                    .waiting
                    .extract_if(.., |(login, _)| *login == (user, device))
                    .map(|(_, n)| n)
                    .collect();
                for n in waiting {
                    let _ = out.send(Out::Node(n));
                }
            }
        }
    }
}

async fn serve(s: Arc<Shared>, conn: u64, tcp: tokio::net::TcpStream) -> Result<(), String> {
    let (_req, ws) = ServerBuilder::new()
        .accept(tcp)
        .await
        .map_err(|e| format!("websocket: {e}"))?;
    let (mut ws, mut rd) = ws.split();
    s.log.lock().unwrap().seen.push(Seen::Connected(conn));
    let mut frames = Frames {
        buf: Vec::new(),
        header_seen: false,
    };
    let (read, write, ik, client_static, hello) = handshake(
        &s.noise_static,
        &s.cert_chain,
        &mut ws,
        &mut rd,
        &mut frames,
    )
    .await?;
    if s.trace {
        eprintln!(
            "[fake-wa {conn}] handshake ({}) {hello:?}",
            if ik { "IK" } else { "XX" }
        );
    }
    s.log.lock().unwrap().seen.push(Seen::Handshake {
        conn,
        ik,
        client_static,
        payload: hello.clone(),
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<Out>();
    s.conns.lock().unwrap().insert(conn, tx.clone());
    let login_delay = *s.login_delay.lock().unwrap();
    if let Some(d) = login_delay.filter(|_| hello.registration.is_none()) {
        tokio::time::sleep(d).await;
    }
    s.greet(conn, &hello, &tx);
    let mut read_counter = 0u32;
    let mut write_counter = 0u32;
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(Out::Node(node)) => {
                    if s.trace {
                        eprintln!("[fake-wa {conn}] >> {}", whatsapp_rust::wacore::xml::DisplayableNode(&node));
                    }
                    let plain = marshal(&node).map_err(|e| format!("marshal: {e}"))?;
                    let sealed = write
                        .encrypt_with_counter(write_counter, &plain)
                        .map_err(|e| format!("encrypt: {e}"))?;
                    write_counter += 1;
                    ws.send(Message::binary(frame(&sealed)))
                        .await
                        .map_err(|e| format!("write: {e}"))?;
                }
                Some(Out::Close) | None => {
                    let _ = ws.close().await;
                    return Ok(());
                }
            },
            f = frames.next(&mut rd) => {
                let mut f = f?;
                read.decrypt_in_place_with_counter(read_counter, &mut f)
                    .map_err(|e| format!("decrypt frame {read_counter}: {e}"))?;
                read_counter += 1;
                let plain = unpack(&f).map_err(|e| format!("unpack: {e}"))?;
                let node = unmarshal_ref(&plain)
                    .map_err(|e| format!("unmarshal: {e}"))?
                    .to_owned();
                if s.trace {
                    eprintln!("[fake-wa {conn}] << {}", whatsapp_rust::wacore::xml::DisplayableNode(&node));
                }
                let key_query = node.tag == "iq"
                    && node.attrs.get("xmlns").is_some_and(|x| *x == "usync" || *x == "encrypt");
                let hold = *s.key_query_delay.lock().unwrap();
                if let Some(d) = hold.filter(|_| key_query) {
                    tokio::time::sleep(d).await;
                }
                s.handle(conn, &node, &tx);
                let node = if s.shallow_log.load(Ordering::Relaxed) {
                    Node::new(node.tag, node.attrs, None)
                } else {
                    node
                };
                s.log.lock().unwrap().seen.push(Seen::Stanza { conn, node });
            }
        }
    }
}
