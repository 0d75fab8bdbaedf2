//! Herald's real WhatsApp gateway, with the real whatsapp-rust client,
//! against the fake WhatsApp Web server in `fake-whatsapp/` (crate `herald-fake-whatsapp`): a real
//! `herald serve` process driven through its HTTP API, and a WebSocket on
//! loopback carrying WhatsApp's framing, Noise handshake and binary nodes.
//!
//! Polling loops below wait for a state with a deadline; no assertion is
//! about how long something took.

use herald_fake_whatsapp as fake_whatsapp;

use fake_whatsapp::{FakeWhatsApp, Verdict};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "fake-whatsapp-test-token";
/// The WhatsApp Web version Herald announces (nothing is fetched).
const VERSION: (u32, u32, u32) = (2, 3000, 1_027_000_000);

use crate::common::daemon as harness;
use crate::common::polls;
use crate::common::postgres;
use harness::free_port;

/// `herald serve` as a child process on `dir`, pointed at the fake server.
struct Herald {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Herald {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        harness::assert_no_panic(&self.logs(), "herald serve");
    }
}

impl Herald {
    fn start(dir: &Path, fake: &FakeWhatsApp) -> Herald {
        Self::start_with(dir, fake, &[])
    }

    /// `herald ARGS` with the settings every daemon of these tests uses.
    fn command(dir: &Path, fake: &FakeWhatsApp, port: u16, args: &[&str]) -> Command {
        Self::command_at(dir, &fake.url(), port, args)
    }

    /// [`Herald::command`] for the fake server at `server_url`.
    fn command_at(dir: &Path, server_url: &str, port: u16, args: &[&str]) -> Command {
        let mut cmd = harness::herald();
        cmd.args(args);
        let (a, b, c) = VERSION;
        cmd.env("HERALD_STORAGE__DATA_DIR", dir)
            .env("HERALD_CONTROL__LISTEN", format!("127.0.0.1:{port}"))
            .env("HERALD_CONTROL__TOKEN", TOKEN)
            .env("HERALD_WHATSAPP__SERVER_URL", server_url)
            .env("HERALD_WHATSAPP__VERSION", format!("{a}.{b}.{c}"))
            .env(
                "HERALD_LOG__FILTER",
                std::env::var("FAKE_WA_HERALD_LOG")
                    .unwrap_or_else(|_| "info,sqlx=warn,actix_server=warn".into()),
            )
            // Jitter between messages is not what these tests measure.
            .env("HERALD_DELIVERY__JITTER_MIN_MS", "0")
            .env("HERALD_DELIVERY__JITTER_MAX_MS", "20");
        cmd
    }

    fn start_with(dir: &Path, fake: &FakeWhatsApp, env: &[(&str, &str)]) -> Herald {
        Self::start_at(dir, &fake.url(), env)
    }

    fn start_at(dir: &Path, server_url: &str, env: &[(&str, &str)]) -> Herald {
        let port = free_port();
        let log = dir.join(format!("herald-{port}.log"));
        let mut cmd = Self::command_at(dir, server_url, port, &["serve"]);
        cmd.envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap());
        let mut h = Herald {
            child: cmd.spawn().expect("starting herald serve"),
            port,
            log,
        };
        h.wait_healthy();
        h
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("herald exited with {status}\n{}", self.logs());
            }
            if http(self.port, "GET", "/healthz", None).is_some_and(|(s, _)| s == 200) {
                return;
            }
            assert!(Instant::now() < deadline, "no /healthz\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A request to the API; panics (with Herald's log) if it gets no answer.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let (status, text) = http(self.port, method, path, body)
            .unwrap_or_else(|| panic!("{method} {path}: no answer\n{}", self.logs()));
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Polls `path` until `done` holds.
    fn wait_until(&self, path: &str, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let (status, v) = self.call("GET", path, None);
            if status == 200 && done(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{path} did not get there within {within:?}: {v}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A minimal HTTP/1.1 exchange with the bearer token; `None` when the
/// daemon does not answer.
fn http(port: u16, method: &str, path: &str, body: Option<Value>) -> Option<(u16, String)> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    http_raw(port, method, path, "application/json", body.as_bytes())
}

fn http_raw(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Option<(u16, String)> {
    let addr = ([127, 0, 0, 1], port).into();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .ok()?;
    s.write_all(body).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Some((status, if chunked { dechunk(body) } else { body.into() }))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn add_whatsapp_account(h: &Herald, id: &str) {
    let (status, v) = h.call(
        "POST",
        "/v1/accounts",
        Some(json!({"id": id, "name": "Front desk", "kind": "whatsapp"})),
    );
    assert_eq!(status, 201, "{v}");
}

/// Stage 1: the real client opens a WebSocket to the fake server,
/// completes the Noise XX handshake against its test certificate chain and
/// registers as a new device; the fake server answers with pairing refs and
/// Herald's API shows the QR code built from them, which carries the very
/// Noise key the client proved in the handshake.
#[test]
fn pairing_starts_over_a_real_noise_handshake_and_herald_shows_the_qr() {
    let fake = FakeWhatsApp::start();
    let dir = tempfile::tempdir().unwrap();
    let h = Herald::start(dir.path(), &fake);
    add_whatsapp_account(&h, "wa");

    let (status, v) = h.call("POST", "/v1/accounts/wa/pair", None);
    assert_eq!(status, 200, "{v}\n{}", h.logs());
    assert_eq!(v["state"], "waiting_qr", "{v}");
    let qr = fake_whatsapp::Qr::parse(v["qr"].as_str().unwrap()).unwrap();

    let hs = fake.log(|l| l.handshakes());
    assert_eq!(hs.len(), 1, "one connection, one handshake: {hs:?}");
    let (conn, ik, client_static, hello) = &hs[0];
    assert!(!ik, "a new device has no cached server key: Noise XX");
    assert!(hello.username.is_none(), "not a login: {hello:?}");
    let reg = hello.registration.as_ref().expect("a registration payload");
    assert_eq!(reg.identity_key.len(), 32, "{hello:?}");
    assert_eq!(hello.version, Some(VERSION), "the configured version");
    assert_eq!(
        &qr.noise_key, client_static,
        "the QR shows the Noise key the client used in the handshake"
    );
    assert_eq!(
        qr.identity_key.as_slice(),
        reg.identity_key.as_slice(),
        "and the identity key it registered"
    );
    assert!(
        qr.reference.starts_with(&format!("2@fake{conn}r0")),
        "{qr:?}"
    );
    // The client acknowledged the pair-device stanza over the encrypted
    // channel (the server decrypted and decoded it).
    fake.wait_for("ack of pair-device", Duration::from_secs(10), |l| {
        l.stanzas().any(|(c, n)| {
            c == *conn && n.tag == "iq" && n.attrs.get("type").is_some_and(|t| *t == "result")
        })
    });
}

impl Herald {
    /// SIGTERM, as systemd stops it, and waits for the exit.
    fn stop(mut self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "herald did not stop\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Pairs account `id` by QR through Herald's API: the fake phone scans the
/// code Herald shows. Answers the paired JID.
fn pair_by_qr(h: &Herald, fake: &FakeWhatsApp, id: &str) -> String {
    let (status, v) = h.call("POST", &format!("/v1/accounts/{id}/pair"), None);
    assert_eq!(status, 200, "{v}\n{}", h.logs());
    assert_eq!(v["state"], "waiting_qr", "{v}");
    fake.scan(v["qr"].as_str().unwrap()).unwrap();
    let v = h.wait_until(
        &format!("/v1/accounts/{id}/pair"),
        Duration::from_secs(30),
        |v| v["state"] == "paired",
    );
    v["jid"].as_str().unwrap_or_default().to_owned()
}

/// Stage 2: the phone scans the QR Herald shows; the device link is signed
/// both ways (the phone's account signature and HMAC over the QR's secret,
/// the device's counter-signature checked by the fake server); WhatsApp's
/// "restart required" makes the client log in as the new device, and the
/// account becomes `connected`. After a restart of Herald the stored
/// session logs in again without pairing.
#[test]
fn pairing_by_qr_links_the_device_and_a_restart_logs_in_with_the_stored_session() {
    let fake = FakeWhatsApp::start();
    let dir = tempfile::tempdir().unwrap();
    let h = Herald::start(dir.path(), &fake);
    add_whatsapp_account(&h, "wa");

    let jid = pair_by_qr(&h, &fake, "wa");
    let linked = fake.wait_linked(1, Duration::from_secs(10));
    assert_eq!(
        linked.len(),
        1,
        "the device signed its identity: {linked:?}"
    );
    assert!(jid.starts_with(&fake.phone().user), "{jid}");
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
    let logins: Vec<_> = fake.log(|l| l.handshakes());
    let (_, _, _, login) = logins.last().unwrap().clone();
    assert_eq!(
        login.username.map(|u| u.to_string()),
        Some(fake.phone().user.clone()),
        "after the link the client logs in as the account: {logins:?}"
    );
    assert_eq!(login.device, Some(linked[0].device));
    assert!(login.registration.is_none());

    h.stop();
    let before = fake.log(|l| l.handshakes().len());
    let last_conn = fake.log(|l| l.handshakes().last().unwrap().0);
    let h = Herald::start(dir.path(), &fake);
    // The stored state says "connected" already; what shows the restarted
    // daemon logged in is the server's side: a new connection that got
    // past <success> (the client then leaves passive mode).
    fake.wait_for(
        "a login by the restarted daemon",
        Duration::from_secs(60),
        |l| {
            l.stanzas().any(|(c, n)| {
                c > last_conn
                    && n.tag == "iq"
                    && n.attrs.get("xmlns").is_some_and(|x| *x == "passive")
            })
        },
    );
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
    let (status, v) = h.call("GET", "/v1/accounts/wa/pair", None);
    assert_eq!((status, v["state"].as_str()), (200, Some("paired")), "{v}");
    let after = fake.log(|l| l.handshakes());
    assert!(after.len() > before, "the restarted daemon connected again");
    for (_, ik, _, hello) in &after[before..] {
        assert!(
            *ik,
            "the stored session remembers the server's key: Noise IK, not XX"
        );
        assert!(
            hello.registration.is_none() && hello.username.is_some(),
            "a login with the stored session, not a new pairing: {hello:?}"
        );
    }
    assert_eq!(fake.linked().len(), 1, "no second device link");
}

/// A reminder (never due by itself) from `account` to `groups`, fired now;
/// answers the run id.
fn fire(h: &Herald, account: &str, groups: &[String], parts: Value) -> i64 {
    let (status, r) = h.call(
        "POST",
        "/v1/reminders",
        Some(json!({
            "account_id": account,
            "title": "Standup",
            "timezone": "UTC",
            "schedule": {"at": "2099-01-05T09:00"},
            "window": {"start_hour": 0, "end_hour": 24},
            "parts": parts,
            "targets": groups,
        })),
    );
    assert_eq!(status, 201, "{r}");
    let (status, f) = h.call(
        "POST",
        &format!("/v1/reminders/{}/fire", r["id"].as_i64().unwrap()),
        None,
    );
    assert_eq!(status, 202, "{f}");
    f["run_id"].as_i64().unwrap()
}

fn wait_run_end(h: &Herald, run: i64, within: Duration) -> Value {
    h.wait_until(&format!("/v1/runs/{run}"), within, |r| {
        r["status"]
            .as_str()
            .is_some_and(|s| s != "queued" && s != "running")
    })
}

fn targets(h: &Herald, run: i64) -> Vec<Value> {
    let (status, t) = h.call("GET", &format!("/v1/runs/{run}/targets?limit=1000"), None);
    assert_eq!(status, 200, "{t}");
    t["items"].as_array().unwrap().clone()
}

/// A paired, connected account `wa` on a fresh Herald.
fn paired(fake: &FakeWhatsApp, dir: &Path, env: &[(&str, &str)]) -> Herald {
    let h = Herald::start_with(dir, fake, env);
    add_whatsapp_account(&h, "wa");
    pair_by_qr(&h, fake, "wa");
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
    h
}

/// Stage 3: a text reminder to six groups. The client lists the account's
/// groups, fetches the members' device lists and pre-key bundles, opens
/// Signal sessions and hands each device the group's sender key, then
/// sends one group-encrypted message per group with the message id Herald
/// stored; the server acks each and the target is `sent`. The
/// announcement-only group fails fast as "not allowed" without a send.
#[test]
fn a_text_reminder_goes_to_each_group_encrypted_and_acknowledged() {
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(6, 2, 6));
    let dir = tempfile::tempdir().unwrap();
    let h = paired(
        &fake,
        dir.path(),
        &[("HERALD_DELIVERY__MAX_PER_MINUTE", "600")],
    );
    let groups: Vec<String> = (1..=6).map(|i| format!("120363{i:012}@g.us")).collect();

    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "text", "text": "Standup in 10 minutes"}]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "partial", "{done:#}\n{}", h.logs());
    assert_eq!(done["counts"]["sent"], 5, "{done:#}");

    let deliveries = fake.deliveries();
    let ts = targets(&h, run);
    for t in &ts {
        let group = t["group"].as_str().unwrap();
        let got: Vec<_> = deliveries.iter().filter(|d| d.group == group).collect();
        if group == groups[5] {
            assert_eq!(t["status"], "failed", "{t}");
            assert!(got.is_empty(), "nothing sent to the announcement group");
            continue;
        }
        assert_eq!(t["status"], "sent", "{t}");
        let id = t["message_id"].as_str().unwrap();
        assert_eq!(got.len(), 1, "{group}: {got:?}");
        let d = got[0];
        assert!(
            id.starts_with(&d.id),
            "the stored id {id} is the one sent ({})",
            d.id
        );
        assert_eq!(d.kind, "text");
        assert!(d.size > 0);
        assert!(
            d.key_shares >= 2,
            "the sender key went to the members' devices: {d:?}"
        );
        // The members' devices decrypt it, as their phones would: the
        // sender key from each one's pairwise message, then the group
        // message with it; each reads the reminder's text.
        assert!(d.read.failures.is_empty(), "{:?}", d.read.failures);
        assert_eq!(d.read.devices, 2, "both members' phones read it: {d:?}");
        assert_eq!(d.read.kind, "text");
        assert_eq!(d.read.text.as_deref(), Some("Standup in 10 minutes"));
    }
    assert!(fake.prekey_fetches() > 0, "pre-key bundles were fetched");

    // A second reminder to the same groups: the members hold the sender
    // key already and decrypt the group message with the next step of its
    // chain.
    let before = fake.deliveries().len();
    let again = fire(
        &h,
        "wa",
        &groups[..5],
        json!([{"kind": "text", "text": "Moved to 11"}]),
    );
    let done = wait_run_end(&h, again, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    for d in &fake.deliveries()[before..] {
        assert!(d.read.failures.is_empty(), "{:?}", d.read.failures);
        assert_eq!(
            (d.read.devices, d.read.text.as_deref()),
            (2, Some("Moved to 11")),
            "{d:?}"
        );
    }
}

/// Stage 3: WhatsApp's refusals, each on its own group of one run:
/// - a dropped ack: after `ack_timeout` the part is sent again with the same
///   id and the second copy is acked (the server sees the id twice, one
///   delivery);
/// - 429: the account backs off and the part is sent again, same id;
/// - 463 (a transient refusal in Herald's classification): retried, same id;
/// - 404: that group fails at once as not found, without a resend;
/// - the socket dropped instead of an ack: the client reconnects, the part
///   is sent again with the same id.
#[test]
fn nacks_drops_and_a_lost_socket_end_as_the_manual_says() {
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(6, 1, 0));
    let dir = tempfile::tempdir().unwrap();
    let h = paired(
        &fake,
        dir.path(),
        &[
            ("HERALD_DELIVERY__MAX_PER_MINUTE", "600"),
            ("HERALD_DELIVERY__GROUP_CONCURRENCY", "1"),
            ("HERALD_DELIVERY__RETRY_BASE_MS", "100"),
            ("HERALD_DELIVERY__RATE_LIMIT_COOLDOWN_SECS", "1"),
            ("HERALD_WHATSAPP__ACK_TIMEOUT_SECS", "2"),
        ],
    );
    let g = |i: usize| format!("120363{i:012}@g.us");
    let (dropped, limited, transient, missing, cut, plain) = (g(1), g(2), g(3), g(4), g(5), g(6));
    {
        let (dropped, limited, transient, missing, cut) = (
            dropped.clone(),
            limited.clone(),
            transient.clone(),
            missing.clone(),
            cut.clone(),
        );
        fake.set_policy(move |d| match (d.group.as_str(), d.seen_before) {
            (x, 0) if x == dropped => Verdict::Drop,
            (x, 0) if x == limited => Verdict::Nack(429),
            (x, 0) if x == transient => Verdict::Nack(463),
            (x, _) if x == missing => Verdict::Nack(404),
            (x, 0) if x == cut => Verdict::Disconnect,
            _ => Verdict::Ack,
        });
    }
    let all = vec![
        dropped.clone(),
        limited.clone(),
        transient.clone(),
        missing.clone(),
        cut.clone(),
        plain.clone(),
    ];
    let run = fire(&h, "wa", &all, json!([{"kind": "text", "text": "Standup"}]));
    let done = wait_run_end(&h, run, Duration::from_secs(120));
    assert_eq!(done["status"], "partial", "{done:#}\n{}", h.logs());
    assert_eq!(done["counts"]["sent"], 5, "{done:#}");

    let deliveries = fake.deliveries();
    let of = |group: &str| -> Vec<fake_whatsapp::Delivery> {
        deliveries
            .iter()
            .filter(|d| d.group == group)
            .cloned()
            .collect()
    };
    for t in targets(&h, run) {
        let group = t["group"].as_str().unwrap().to_owned();
        let got = of(&group);
        let id = t["message_id"].as_str().unwrap();
        assert!(
            got.iter().all(|d| id.starts_with(&d.id)),
            "{group}: every copy carries the stored id {id}: {got:?}"
        );
        if group == missing {
            assert_eq!(t["status"], "failed", "{t}");
            assert_eq!(got.len(), 1, "a missing group is not retried: {got:?}");
            continue;
        }
        assert_eq!(t["status"], "sent", "{t}");
        let expected = if group == plain { 1 } else { 2 };
        assert_eq!(got.len(), expected, "{group}: {got:?}");
        assert_eq!(got.last().unwrap().verdict, Verdict::Ack, "{got:?}");
    }
    // The lost socket was reconnected (a second login, with the cached key).
    let logins = fake.log(|l| {
        l.handshakes()
            .into_iter()
            .filter(|(_, _, _, hello)| hello.username.is_some())
            .count()
    });
    assert!(logins >= 2, "the client logged in again after the drop");
    let (_, metrics) = http(h.port, "GET", "/metrics", None).unwrap();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("herald_rate_limited_total{account=\"wa\"} ") && !l.ends_with(" 0")
        ),
        "the 429 counted as a rate limit:\n{metrics}"
    );
}

/// Stage 3: the phone removes the linked device: the account shows
/// `logged_out` with the reason and its queue stops (a run waits, nothing
/// is sent); pairing again by QR links a new device and the waiting run is
/// delivered. Then WhatsApp refuses the login with a temporary
/// ban (failure 402 with a code and an expiry): the account shows `banned`.
#[test]
fn logout_from_the_phone_then_re_pairing_then_a_temporary_ban() {
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(1, 1, 0));
    let dir = tempfile::tempdir().unwrap();
    let h = paired(&fake, dir.path(), &[]);

    fake.remove_device();
    // Logged out in the store, and the account's actor has stopped its queue.
    let a = h.wait_until("/v1/accounts/wa", Duration::from_secs(30), |v| {
        v["state"] == "logged_out" && v["live"]["halted"].is_string()
    });
    assert!(a["state_reason"].is_string(), "a reason is shown: {a}");
    let (_, p) = h.call("GET", "/v1/accounts/wa/pair", None);
    assert_eq!(p["state"], "logged_out", "{p}");
    // A run for the logged-out account waits in its queue.
    let run = fire(
        &h,
        "wa",
        &["120363000000000001@g.us".into()],
        json!([{"kind": "text", "text": "hello"}]),
    );
    let (_, r) = h.call("GET", &format!("/v1/runs/{run}"), None);
    assert_eq!(r["status"], "queued", "{r}");

    let registrations_before = fake.log(|l| {
        l.handshakes()
            .iter()
            .filter(|(_, _, _, hello)| hello.registration.is_some())
            .count()
    });
    pair_by_qr(&h, &fake, "wa");
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
    let registrations = fake.log(|l| {
        l.handshakes()
            .iter()
            .filter(|(_, _, _, hello)| hello.registration.is_some())
            .count()
    });
    assert_eq!(
        registrations,
        registrations_before + 1,
        "paired as a new device"
    );
    assert_eq!(fake.wait_linked(1, Duration::from_secs(10)).len(), 1);
    // The queue moves again: the waiting run is delivered by the new device.
    let done = wait_run_end(&h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    assert_eq!(fake.deliveries().len(), 1);

    fake.refuse_logins(Some((402, Some(101), Some(3600))));
    fake.drop_connections();
    let a = h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "banned"
    });
    assert!(
        a["state_reason"]
            .as_str()
            .is_some_and(|r| r.contains("101")),
        "the ban's code is shown: {a}"
    );
}

use crate::common::png;
use png::tiny_png;

/// Stage 4: a picture with a caption to 200 groups. The picture is
/// encrypted and uploaded once, over HTTPS to the media host the fake
/// server names in its media-connection answer; then 200 group messages
/// of type image, each with the message id Herald stored, each acked, so
/// every target is `sent`. Pacing, measured where the messages arrive: never
/// more than the account's limit in any 60 s window, and no faster than its
/// even spacing allows.
#[test]
fn a_picture_to_200_groups_is_uploaded_once_and_paced() {
    const GROUPS: usize = 200;
    const PER_MINUTE: usize = 600;
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(GROUPS, 1, 0));
    let dir = tempfile::tempdir().unwrap();
    let h = paired(
        &fake,
        dir.path(),
        &[("HERALD_DELIVERY__MAX_PER_MINUTE", &PER_MINUTE.to_string())],
    );
    let (status, text) = http_raw(
        h.port,
        "POST",
        "/v1/media?filename=dot.png",
        "image/png",
        &tiny_png(),
    )
    .unwrap();
    assert_eq!(status, 201, "{text}");
    let media: Value = serde_json::from_str(&text).unwrap();
    let groups: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "media", "media": media["id"], "caption": "Standup in 10 minutes"}]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(240));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    assert_eq!(done["counts"]["sent"], GROUPS);

    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 1, "one upload for all groups: {uploads:?}");
    assert!(uploads[0].path.starts_with("/mms/image/"), "{uploads:?}");
    assert!(
        uploads[0].hash_matches,
        "the encrypted picture arrived whole"
    );

    let deliveries = fake.deliveries();
    assert_eq!(deliveries.len(), GROUPS, "one message per group, no resend");
    let ts = targets(&h, run);
    assert_eq!(ts.len(), GROUPS);
    for t in &ts {
        assert_eq!(t["status"], "sent", "{t}");
        let group = t["group"].as_str().unwrap();
        let id = t["message_id"].as_str().unwrap();
        let d: Vec<_> = deliveries.iter().filter(|d| d.group == group).collect();
        assert_eq!(d.len(), 1, "{group}");
        assert!(id.starts_with(&d[0].id), "{id} vs {}", d[0].id);
        assert_eq!(d[0].kind, "media", "{:?}", d[0]);
        assert_eq!(d[0].media_type.as_deref(), Some("image"), "{:?}", d[0]);
        // Each member's phone decrypts a picture with the caption.
        let read = &d[0].read;
        assert!(read.failures.is_empty(), "{:?}", read.failures);
        assert!(read.devices >= 1, "{read:?}");
        assert_eq!(
            (read.kind.as_str(), read.text.as_deref()),
            ("image", Some("Standup in 10 minutes"))
        );
    }

    let at: Vec<Instant> = deliveries.iter().map(|d| d.at).collect();
    let window = Duration::from_secs(60);
    for (i, start) in at.iter().enumerate() {
        let inside = at[i..].iter().take_while(|t| **t - *start < window).count();
        assert!(inside <= PER_MINUTE, "{inside} messages within 60 s");
    }
    // One token per 100 ms: 200 messages cannot arrive in less than 19.9 s
    // (10% allowed for the network shifting single arrivals).
    let span = *at.last().unwrap() - at[0];
    let even = Duration::from_millis(60_000 / PER_MINUTE as u64) * (GROUPS as u32 - 1);
    assert!(span >= even * 9 / 10, "200 messages in {span:?}");
}

/// SIGKILL of Herald in the middle of a run against the fake server: after
/// a restart the run resumes from its stored marks and completes, and at
/// the server every group got exactly one message id (a part in flight at
/// the kill may arrive twice, with the same id), and no group got two.
#[test]
fn sigkill_mid_run_then_restart_gives_each_group_one_message_id() {
    const GROUPS: usize = 60;
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(GROUPS, 1, 0));
    let dir = tempfile::tempdir().unwrap();
    let env = [("HERALD_DELIVERY__MAX_PER_MINUTE", "600")];
    let mut h = paired(&fake, dir.path(), &env);
    let groups: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "text", "text": "Standup"}]),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while fake.deliveries().len() < GROUPS / 3 {
        assert!(
            Instant::now() < deadline,
            "the run did not get going\n{}",
            h.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    h.kill9();
    let at_kill = fake.deliveries().len();
    assert!(at_kill < GROUPS, "killed mid-run ({at_kill} sent)");

    let h = Herald::start_with(dir.path(), &fake, &env);
    let done = wait_run_end(&h, run, Duration::from_secs(120));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());

    let deliveries = fake.deliveries();
    for t in targets(&h, run) {
        let group = t["group"].as_str().unwrap();
        let ids: Vec<&str> = deliveries
            .iter()
            .filter(|d| d.group == group)
            .map(|d| d.id.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(ids.len(), 1, "{group} got ids {ids:?}");
        assert!(t["message_id"].as_str().unwrap().starts_with(ids[0]));
    }
}

impl Herald {
    /// SIGKILL (std's `Child::kill`), and reaps it.
    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// Stage 2, pair code: Herald's API shows the code WhatsApp Web's client
/// made; the fake phone's user types it: the phone unwraps the companion's
/// ephemeral key with it, answers with its own, opens the companion's key
/// bundle (which only the right code makes possible), derives the shared
/// ADV secret and links the device; the account becomes connected.
#[test]
fn pairing_by_pair_code_links_the_device() {
    let fake = FakeWhatsApp::start();
    let dir = tempfile::tempdir().unwrap();
    let h = Herald::start(dir.path(), &fake);
    add_whatsapp_account(&h, "wa");
    let (status, v) = h.call(
        "POST",
        "/v1/accounts/wa/pair",
        Some(json!({"phone": "+1 555 000 1111"})),
    );
    assert_eq!(status, 200, "{v}\n{}", h.logs());
    assert_eq!(v["state"], "waiting_pair_code", "{v}");
    assert_eq!(v["phone"], fake.phone().user, "{v}");
    let code = v["pair_code"].as_str().unwrap();
    fake.enter_pair_code(code).unwrap();
    let v = h.wait_until("/v1/accounts/wa/pair", Duration::from_secs(30), |v| {
        v["state"] == "paired"
    });
    assert!(
        v["jid"].as_str().unwrap().starts_with(&fake.phone().user),
        "{v}"
    );
    assert_eq!(
        fake.wait_linked(1, Duration::from_secs(10)).len(),
        1,
        "the device signed its identity"
    );
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
}

/// Participating-groups queries the client has sent so far.
fn participating_queries(fake: &FakeWhatsApp) -> usize {
    fake.log(|l| {
        l.stanzas()
            .filter(|(_, n)| {
                n.tag == "iq"
                    && n.attrs.get("xmlns").is_some_and(|x| *x == "w:g2")
                    && n.children()
                        .and_then(|c| c.first())
                        .is_some_and(|c| c.tag == "participating")
            })
            .count()
    })
}

/// The group directory over the real protocol: when the account connects,
/// Herald lists its groups with one participating-groups query (names,
/// members, announcement-only groups it may not post in); an on-demand
/// sync sees a group the account left and one it joined; a reminder for
/// `all` sends to the groups it may post in and fails the others up front,
/// without a message to them.
#[test]
fn the_directory_comes_from_one_participating_groups_query_and_feeds_selectors() {
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(8, 3, 4));
    let dir = tempfile::tempdir().unwrap();
    let h = paired(
        &fake,
        dir.path(),
        &[
            ("HERALD_DELIVERY__MAX_PER_MINUTE", "600"),
            ("HERALD_GROUPS__MIN_SYNC_INTERVAL_SECS", "1"),
        ],
    );
    let page = h.wait_until(
        "/v1/accounts/wa/groups?limit=100",
        Duration::from_secs(30),
        |v| v["total"] == 8,
    );
    assert_eq!(participating_queries(&fake), 1, "one query lists them all");
    let items = page["items"].as_array().unwrap();
    for g in items {
        let i: usize = g["jid"].as_str().unwrap()[6..18].parse().unwrap();
        assert_eq!(g["subject"], format!("Group {i}"), "{g}");
        assert_eq!(g["participants"], 4, "three members and the account: {g}");
        assert_eq!(g["announce"], i.is_multiple_of(4), "{g}");
        assert_eq!(
            g["can_post"],
            !i.is_multiple_of(4),
            "admins only, not admin: {g}"
        );
    }
    let (_, named) = h.call("GET", "/v1/accounts/wa/groups?name=group%203", None);
    assert_eq!(named["total"], 1, "{named}");

    // The account leaves group 2 and joins group 9; a sync on demand.
    let mut now = FakeWhatsApp::numbered_groups(9, 3, 4);
    now.remove(1);
    fake.set_groups(now);
    std::thread::sleep(Duration::from_millis(1100));
    let (status, sync) = h.call("POST", "/v1/accounts/wa/groups/sync", None);
    assert_eq!(status, 200, "{sync}");
    assert_eq!(
        (&sync["added"], &sync["left"]),
        (&json!(1), &json!(1)),
        "{sync}"
    );
    assert_eq!(participating_queries(&fake), 2);

    // `all`: the eight groups it is in now; 4 and 8 are admins-only.
    let (status, r) = h.call(
        "POST",
        "/v1/reminders",
        Some(json!({
            "account_id": "wa",
            "title": "Standup",
            "timezone": "UTC",
            "schedule": {"at": "2099-01-05T09:00"},
            "window": {"start_hour": 0, "end_hour": 24},
            "parts": [{"kind": "text", "text": "Standup in 10 minutes"}],
            "select": {"all": true},
        })),
    );
    assert_eq!(status, 201, "{r}");
    let refused: Vec<&str> = r["preflight"]["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["group"].as_str().unwrap())
        .collect();
    assert_eq!(
        refused,
        vec!["120363000000000004@g.us", "120363000000000008@g.us"],
        "{r}"
    );
    let (status, f) = h.call(
        "POST",
        &format!("/v1/reminders/{}/fire", r["id"].as_i64().unwrap()),
        None,
    );
    assert_eq!(status, 202, "{f}");
    let run = f["run_id"].as_i64().unwrap();
    let done = wait_run_end(&h, run, Duration::from_secs(60));
    assert_eq!(
        (&done["counts"]["sent"], &done["counts"]["failed"]),
        (&json!(6), &json!(2)),
        "{done:#}\n{}",
        h.logs()
    );
    let delivered: std::collections::BTreeSet<String> =
        fake.deliveries().into_iter().map(|d| d.group).collect();
    let want: std::collections::BTreeSet<String> = [1, 3, 5, 6, 7, 9]
        .iter()
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    assert_eq!(
        delivered, want,
        "nothing to the group it left or to those it may not post in"
    );
}

/// The upgrade from session files: `tests/fixtures/session-0.7.db` was
/// written by Herald before sessions moved into the database (the
/// whatsapp-rust-sqlite-storage 0.7 file of an account paired with this
/// fake server and sent from). Placed in an account's directory, it is
/// imported on the next start, sealed into the database and deleted; the
/// account logs in from it (no pairing, no new device) and sends.
#[test]
fn a_session_file_from_before_is_imported_and_logs_in_without_pairing() {
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(3, 2, 0));
    let dir = tempfile::tempdir().unwrap();
    let h = Herald::start(dir.path(), &fake);
    add_whatsapp_account(&h, "wa");
    h.stop();
    let account_dir = dir.path().join("whatsapp").join("wa");
    std::fs::create_dir_all(&account_dir).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/session-0.7.db");
    std::fs::copy(&fixture, account_dir.join("session.db")).unwrap();

    let h = Herald::start_with(
        dir.path(),
        &fake,
        &[("HERALD_DELIVERY__MAX_PER_MINUTE", "600")],
    );
    fake.wait_for(
        "a login with the imported session",
        Duration::from_secs(60),
        |l| {
            l.handshakes().iter().any(|(_, _, _, hello)| {
                hello.registration.is_none()
                    && hello.username.map(|u| u.to_string()).as_deref()
                        == Some(fake.phone().user.as_str())
            })
        },
    );
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
    assert!(
        h.logs().contains("imported the WhatsApp session file"),
        "{}",
        h.logs()
    );
    assert_eq!(
        std::fs::read_dir(&account_dir).unwrap().count(),
        0,
        "the imported file and its -wal/-shm are deleted"
    );
    let secrets = fixture_secrets(&fixture);
    assert_eq!(
        files_holding(dir.path(), &secrets),
        Vec::<PathBuf>::new(),
        "no file under the data dir holds the device's keys in plain text"
    );
    assert!(
        fake.linked().is_empty(),
        "no pairing: the device from the file logged in"
    );
    assert!(
        fake.log(|l| l
            .handshakes()
            .iter()
            .all(|(_, _, _, h)| h.registration.is_none())),
        "no new device registered"
    );

    let groups: Vec<String> = (1..=3).map(|i| format!("120363{i:012}@g.us")).collect();
    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "text", "text": "After the upgrade"}]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    assert_eq!(done["counts"]["sent"], 3, "{done:#}");

    // A restart reads the session from the database, not from a file.
    h.stop();
    let before = fake.log(|l| l.handshakes().len());
    let h = Herald::start(dir.path(), &fake);
    fake.wait_for("a login after the restart", Duration::from_secs(60), |l| {
        l.handshakes().len() > before
    });
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
    assert!(
        !h.logs().contains("imported the WhatsApp session file"),
        "imported once"
    );
    h.stop();

    // Another key than the one the sessions are sealed with stops start-up,
    // naming the key file; the sessions stay as they were.
    let key_file = dir.path().join("session.key");
    let right = std::fs::read_to_string(&key_file).unwrap();
    std::fs::write(&key_file, format!("{}\n", "ab".repeat(32))).unwrap();
    let out = Herald::command(dir.path(), &fake, free_port(), &["serve"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("session_key_file") && said.contains(&*key_file.to_string_lossy()),
        "{said}"
    );
    std::fs::remove_file(&key_file).unwrap();
    let out = Herald::command(dir.path(), &fake, free_port(), &["serve"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("does not exist"),
        "{said}"
    );
    assert!(!key_file.exists(), "no key is made over sealed sessions");

    // The right key back, then a rekey: the account logs in under the new one.
    std::fs::write(&key_file, &right).unwrap();
    let out = Herald::command(dir.path(), &fake, free_port(), &["whatsapp", "rekey"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("re-sealed") && said.contains("of 1 accounts"),
        "{said}"
    );
    let new = std::fs::read_to_string(&key_file).unwrap();
    assert_ne!(new, right);
    let mut old = key_file.clone().into_os_string();
    old.push(".old");
    assert_eq!(
        std::fs::read_to_string(old).unwrap(),
        right,
        "the old key is kept"
    );
    let before = fake.log(|l| l.handshakes().len());
    let h = Herald::start(dir.path(), &fake);
    fake.wait_for("a login under the new key", Duration::from_secs(60), |l| {
        l.handshakes().len() > before
    });
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
}

/// Secret bytes of the device in a legacy session file: the private
/// halves of its identity and Noise keys, and its ADV secret.
fn fixture_secrets(file: &Path) -> Vec<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(file)
            .read_only(true);
        let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
        let (identity, noise, adv): (Vec<u8>, Vec<u8>, Vec<u8>) =
            sqlx::query_as("SELECT identity_key, noise_key, adv_secret_key FROM device LIMIT 1")
                .fetch_one(&pool)
                .await
                .unwrap();
        pool.close().await;
        vec![identity[..32].to_vec(), noise[..32].to_vec(), adv]
    })
}

/// Every file under `dir` holding any of `secrets`.
fn files_holding(dir: &Path, secrets: &[Vec<u8>]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                if secrets
                    .iter()
                    .any(|s| bytes.windows(s.len()).any(|w| w == &s[..]))
                {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// A short `herald bench sessions` on `db` (real clients on sessions in
/// the store, against the fake server), so CI runs it end to end on both
/// stores and it cannot rot. Its figures are printed; what is judged is
/// what must hold at any size: every account logged in twice, no pool
/// acquire over sqlx's threshold, the fan-out reached every device.
async fn sessions_benchmark(db: &str, first_logins: bool) {
    let args = herald::bench::sessions::SessionsArgs {
        accounts: 4,
        fake_process: false,
        db: db.to_owned(),
        first_logins,
        idle: Duration::from_secs(1),
        logins_per_sec: 4,
        within: Duration::from_secs(90),
        fan_out: herald::bench::sessions::FanOut {
            groups: 2,
            members: 3,
            devices: 2,
            later_rounds: 2,
        },
    };
    let line = herald::bench::sessions::run(&args).await.unwrap();
    eprintln!("{line}");
    let backend = if db == "sqlite" { "sqlite" } else { "postgres" };
    assert!(
        line.starts_with(&format!(
            "sessions: fake=thread db={backend} first_logins={first_logins} accounts=4 rss_mb="
        )),
        "{line}"
    );
    assert!(line.contains(" fake_rss_mb=- "), "{line}");
    for key in [
        "idle_cpu_pct=",
        "threads=",
        "fds=",
        "connect_s=",
        "reconnect_s=",
        "peak_logins_per_s=",
        "storm_mark_ms_p50=",
        "storm_mark_ms_max=",
        "x25519=",
        "first_send_ms_p50=",
        "first_send_cpu_ms=",
        "send_cpu_us=",
    ] {
        assert!(line.contains(key), "{key} in {line}");
    }
    assert!(line.contains(" slow_acquires=0 "), "{line}");
    // Every member device got the group's sender key on the first send: 3
    // members x 2 devices, and the account's phone.
    assert!(line.contains(" group_devices=7 "), "{line}");
}

/// The agreement benchmark's short run: both X25519s on the same random
/// keys, every answer compared (it fails on one that differs).
#[test]
fn the_x25519_benchmark_compares_every_answer() {
    let line = herald::bench::x25519::run(300).unwrap();
    eprintln!("{line}");
    assert!(line.starts_with("x25519: detected="), "{line}");
    assert!(line.contains(" agreements=300 "), "{line}");
    assert!(line.ends_with(" differ=0"), "{line}");
}

/// First logins: each of the 4 devices uploads and stores its 812
/// pre-keys in the same storm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_benchmark_connects_every_account_twice_and_reports_a_line() {
    sessions_benchmark("sqlite", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_benchmark_runs_on_postgres() {
    let Some(base) = postgres::base("the_sessions_benchmark_runs_on_postgres") else {
        return;
    };
    sessions_benchmark(&base, false).await;
}

/// `herald bench sessions --fake-process`: the fake server in a process of
/// its own (`herald fake-whatsapp serve`, driven over its control), so the
/// line's RSS and CPU are Herald's alone and the fake's memory is its own
/// figure. Every account logs in twice and the fan-out reaches every
/// member device, as in-process.
#[test]
fn the_sessions_benchmark_measures_herald_alone_with_the_fake_in_its_own_process() {
    let out = harness::herald()
        .args([
            "bench",
            "sessions",
            "--accounts",
            "4",
            "--idle-secs",
            "1",
            "--logins-per-sec",
            "4",
            "--groups",
            "2",
            "--members",
            "3",
            "--devices",
            "2",
            "--later-rounds",
            "2",
            "--fake-process",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("running herald bench sessions");
    let line = String::from_utf8_lossy(&out.stdout);
    eprintln!("{line}");
    assert!(out.status.success(), "{:?}: {line}", out.status);
    let line = line
        .lines()
        .find(|l| l.starts_with("sessions: "))
        .expect(&line);
    assert!(
        line.starts_with("sessions: fake=process db=sqlite first_logins=false accounts=4 rss_mb="),
        "{line}"
    );
    let fake_mb: f64 = line
        .split_once(" fake_rss_mb=")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("fake_rss_mb in {line}"));
    assert!(fake_mb > 1.0, "the fake's own RSS: {line}");
    assert!(line.contains(" group_devices=7 "), "{line}");
}

/// `herald fake-whatsapp serve`: the fake server as a process of its own,
/// driven only through its HTTP control, as a test in another language
/// would. A daemon pairs against it (the QR it shows scanned through the
/// control) and sends a text to its groups; the control's deliveries and
/// log show each group's message once, and the process ends on SIGTERM.
#[test]
fn the_fake_server_as_its_own_process_serves_a_daemon_through_its_control() {
    let mut fake = harness::herald()
        .args(["fake-whatsapp", "serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting herald fake-whatsapp serve");
    let first = harness::first_line(&mut fake, Duration::from_secs(60));
    // "fake-whatsapp: control on http://ADDR, websocket on URL"
    let control: u16 = first
        .split("http://")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no control address in {first:?}"));
    let ctl = |method: &str, path: &str, body: Option<Value>| -> (u16, Value) {
        let (status, text) = http(control, method, path, body)
            .unwrap_or_else(|| panic!("{method} {path}: the fake's control did not answer"));
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    };
    let (status, health) = ctl("GET", "/health", None);
    assert_eq!(status, 200, "{health}");
    let url = health["websocket_url"].as_str().unwrap().to_owned();
    assert!(first.trim_end().ends_with(&url), "{first:?} / {health}");
    let (status, g) = ctl(
        "PUT",
        "/groups",
        Some(json!({"count": 3, "members": 2, "devices": 2})),
    );
    assert_eq!(status, 200, "{g}");
    let groups: Vec<String> = serde_json::from_value(g["groups"].clone()).unwrap();
    assert_eq!(groups.len(), 3);
    let (status, v) = ctl("POST", "/phone/scan", Some(json!({"qr": "not a qr"})));
    assert_eq!(status, 422, "a bad QR is refused: {v}");
    let every_receipt_at_once =
        json!({"at_once": 1.0, "late_after_ms": 0, "read_share": 1.0, "read_after_ms": 0});
    let (status, v) = ctl(
        "PUT",
        "/receipts",
        Some(json!({"at_once": 2.0, "late_after_ms": 0, "read_share": 1.0, "read_after_ms": 0})),
    );
    assert_eq!(status, 422, "a share over 1 is refused: {v}");
    let (status, _) = ctl("PUT", "/receipts", Some(every_receipt_at_once));
    assert_eq!(status, 204);

    let dir = tempfile::tempdir().unwrap();
    let h = Herald::start_at(
        dir.path(),
        &url,
        &[("HERALD_DELIVERY__MAX_PER_MINUTE", "600")],
    );
    add_whatsapp_account(&h, "wa");
    let (status, v) = h.call("POST", "/v1/accounts/wa/pair", None);
    assert_eq!((status, &v["state"]), (200, &json!("waiting_qr")), "{v}");
    let (status, answer) = ctl("POST", "/phone/scan", Some(json!({"qr": v["qr"]})));
    assert_eq!(status, 204, "{answer}");
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
    let (_, linked) = ctl("GET", "/linked", None);
    assert_eq!(linked.as_array().map(Vec::len), Some(1), "{linked}");

    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "text", "text": "Doors open at 9"}]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    let (_, deliveries) = ctl("GET", "/deliveries", None);
    let deliveries = deliveries.as_array().unwrap().clone();
    for t in targets(&h, run) {
        let got: Vec<&Value> = deliveries
            .iter()
            .filter(|d| d["group"] == t["group"])
            .collect();
        assert_eq!(got.len(), 1, "{t}: {deliveries:?}");
        assert_eq!(got[0]["verdict"], "ack");
        assert_eq!(got[0]["kind"], "text");
        assert_eq!(got[0]["read"]["failures"], json!([]), "{}", got[0]);
        assert!(got[0]["read"]["devices"].as_u64() >= Some(2), "{}", got[0]);
        // The sender key went to each member's two devices.
        assert!(got[0]["key_shares"].as_u64().unwrap() >= 4, "{}", got[0]);
        assert!(t["message_id"]
            .as_str()
            .unwrap()
            .starts_with(got[0]["id"].as_str().unwrap()));
    }
    // 3 groups × 2 members × 2 devices deliver, 3 × 2 phones read.
    let deadline = Instant::now() + Duration::from_secs(20);
    let receipts = loop {
        let (_, r) = ctl("GET", "/receipts", None);
        let r = r.as_array().unwrap().clone();
        if r.len() >= 18 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(receipts.len(), 18, "{receipts:?}");
    assert_eq!(receipts.iter().filter(|r| r["kind"] == "read").count(), 6);
    // The log reads in pages: the group messages are stanzas `message`
    // to each group, from position 0 on and none again after `next`.
    let (_, page) = ctl("GET", "/log?after=0", None);
    let to_groups = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == "stanza" && l["tag"] == "message")
        .filter(|l| groups.iter().any(|g| l["attrs"]["to"] == *g))
        .count();
    assert_eq!(to_groups, 3, "{page}");
    let next = page["next"].as_u64().unwrap();
    let (_, rest) = ctl("GET", &format!("/log?after={next}"), None);
    assert!(rest["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["index"].as_u64() >= Some(next)));

    drop(h);
    // SIGTERM ends it.
    harness::signal(&fake, "TERM");
    let status =
        harness::exited(&mut fake, Duration::from_secs(10)).expect("the fake ends on SIGTERM");
    assert!(status.success(), "{status}");
}

/// The fake's members' devices send receipts for each group message, as
/// WhatsApp relays them to the sender: a delivery receipt from every
/// device (half at once, half later marked offline) and a read receipt
/// from the phones of half the members. The real client takes each one
/// and acknowledges it (`<ack class="receipt">` with the message id, the
/// group and the participant): the receipts Herald will count arrive.
#[test]
fn members_devices_send_receipts_and_the_client_acknowledges_each() {
    let fake = receipts_fake(Duration::from_secs(2), Duration::from_secs(1));
    let dir = tempfile::tempdir().unwrap();
    let h = paired(&fake, dir.path(), &FAST);
    let run = lunch_run(&h);
    // Every member device (3 × 2 per group) decrypts the text.
    for d in fake.deliveries() {
        assert!(d.read.failures.is_empty(), "{:?}", d.read.failures);
        assert_eq!(
            (d.read.devices, d.read.text.as_deref()),
            (6, Some("Lunch at 1")),
            "{d:?}"
        );
    }

    // Per group: 3 members × 2 devices deliver, ceil(3 × 0.5) = 2 read.
    let expected = 2 * (6 + 2);
    let deadline = Instant::now() + Duration::from_secs(20);
    while fake.receipts().len() < expected {
        assert!(Instant::now() < deadline, "{:?}", fake.receipts());
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = fake.receipts();
    assert_eq!(sent.len(), expected, "{sent:?}");
    let ids: Vec<String> = targets(&h, run)
        .iter()
        .map(|t| t["message_id"].as_str().unwrap().to_owned())
        .collect();
    for r in &sent {
        assert!(r.conn.is_some(), "the account was connected: {r:?}");
        assert!(
            ids.iter().any(|id| id.starts_with(&r.message_id)),
            "{r:?} / {ids:?}"
        );
    }
    assert_eq!(
        sent.iter()
            .filter(|r| r.kind == "delivery" && r.offline)
            .count(),
        6
    );
    assert_eq!(sent.iter().filter(|r| r.kind == "read").count(), 4);
    // Each one acknowledged by the client.
    let acked = |r: &fake_whatsapp::ReceiptSent| {
        fake.log(|l| {
            l.stanzas().any(|(_, n)| {
                let a = |k: &str| n.attrs.get(k).map(|v| v.to_string());
                n.tag == "ack"
                    && a("class").as_deref() == Some("receipt")
                    && a("id").as_deref() == Some(r.message_id.as_str())
                    && a("participant").as_deref() == Some(r.participant.as_str())
                    && a("type").as_deref() == (r.kind == "read").then_some("read")
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let missing: Vec<_> = sent.iter().filter(|r| !acked(r)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not acknowledged: {missing:?}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Herald counts what the fake's log says: per group the distinct
    // members (not devices) that delivered, and those that read.
    let expect = expected_counts(&sent);
    let counted = wait_counts(&h, run, &expect);
    let (_, detail) = h.call("GET", &format!("/v1/runs/{run}"), None);
    let totals = &detail["receipts"];
    assert_eq!(totals["groups_delivered"], 2, "{detail}");
    assert_eq!(totals["groups_read"], 2, "{detail}");
    assert_eq!(totals["delivered"], 6, "{detail}");
    assert_eq!(totals["read"], 4, "{detail}");
    assert!(totals["first_receipt_at"].is_string(), "{detail}");

    // Every receipt relayed again, as a server replaying its queue: each
    // is counted as a repeat and the counts stay as they were.
    let replayed = fake.replay_receipts();
    assert_eq!(replayed, expected);
    wait_metric(&h, REPEATED, (repeats(&sent) + replayed) as f64);
    assert_eq!(counts_of(&h, run), counted);
    assert_eq!(
        metric(
            &h,
            "herald_receipts_counted_total{account=\"wa\",kind=\"delivered\"}"
        ),
        Some(6.0)
    );
}

/// Six hundred messages a minute: the receipts' tests wait on receipts,
/// not on the pace.
const FAST: [(&str, &str); 1] = [("HERALD_DELIVERY__MAX_PER_MINUTE", "600")];

/// Two groups of three members with two devices each, whose devices
/// deliver half at once and half `late_after`, and half the members read
/// after `read_after`.
fn receipts_fake(late_after: Duration, read_after: Duration) -> FakeWhatsApp {
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(2, 3, 0));
    fake.set_member_devices(2);
    fake.set_receipts(Some(fake_whatsapp::ReceiptPlan {
        at_once: 0.5,
        late_after,
        read_share: 0.5,
        read_after,
    }));
    fake
}

/// "Lunch at 1" to both groups of [`receipts_fake`], sent.
fn lunch_run(h: &Herald) -> i64 {
    let groups: Vec<String> = (1..=2).map(|i| format!("120363{i:012}@g.us")).collect();
    let run = fire(
        h,
        "wa",
        &groups,
        json!([{"kind": "text", "text": "Lunch at 1"}]),
    );
    let done = wait_run_end(h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    run
}

const REPEATED: &str = "herald_receipts_uncounted_total{outcome=\"repeated\"}";

/// The member of a device JID.
fn member(device: &str) -> String {
    let (user, server) = device.split_once('@').unwrap();
    format!("{}@{server}", user.split(':').next().unwrap())
}

/// How many of `sent`, counted in order, count nothing: a delivery from a
/// member already reached, a read from one who already read.
fn repeats(sent: &[fake_whatsapp::ReceiptSent]) -> usize {
    let (mut reached, mut read) = (BTreeSet::new(), BTreeSet::new());
    sent.iter()
        .filter(|r| {
            let key = (r.group.clone(), member(&r.participant));
            let new_reach = reached.insert(key.clone());
            let new_read = r.kind == "read" && read.insert(key);
            !new_reach && !new_read
        })
        .count()
}

/// Per group: (members with any device's delivery or a read, members who
/// read), from the receipts the fake relayed.
fn expected_counts(sent: &[fake_whatsapp::ReceiptSent]) -> BTreeMap<String, (u64, u64)> {
    let mut seen: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for r in sent {
        let g = seen.entry(r.group.clone()).or_default();
        g.0.insert(member(&r.participant));
        if r.kind == "read" {
            g.1.insert(member(&r.participant));
        }
    }
    seen.into_iter()
        .map(|(g, (d, r))| (g, (d.len() as u64, r.len() as u64)))
        .collect()
}

/// Per group: (delivered, read) as Herald counted them.
fn counts_of(h: &Herald, run: i64) -> BTreeMap<String, (u64, u64)> {
    targets(h, run)
        .iter()
        .map(|t| {
            let n = |k: &str| t["receipts"][k].as_u64().unwrap();
            (
                t["group"].as_str().unwrap().to_owned(),
                (n("delivered"), n("read")),
            )
        })
        .collect()
}

/// Waits until Herald's counts are `expect`; answers them.
fn wait_counts(
    h: &Herald,
    run: i64,
    expect: &BTreeMap<String, (u64, u64)>,
) -> BTreeMap<String, (u64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = counts_of(h, run);
        if &got == expect {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "counted {got:?}, the fake relayed {expect:?}\n{}",
            h.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A sample of `/metrics` (`name{labels}`), if it is there.
fn metric(h: &Herald, sample: &str) -> Option<f64> {
    let (status, text) = http(h.port, "GET", "/metrics", None)?;
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
}

fn wait_metric(h: &Herald, sample: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(h, sample).unwrap_or(0.0) < at_least {
        assert!(
            Instant::now() < deadline,
            "{sample} stayed at {:?}, below {at_least}",
            metric(h, sample)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Receipts that come due while Herald is down wait in the server's
/// offline queue and reach the restarted daemon, which counts them; the
/// ones it counted before the restart, relayed again, count nothing.
#[test]
fn receipts_due_while_herald_is_down_are_counted_once_after_its_restart() {
    // Half the devices at once; the rest, and the reads, 6 s later.
    let fake = receipts_fake(Duration::from_secs(6), Duration::from_secs(6));
    let dir = tempfile::tempdir().unwrap();
    let h = paired(&fake, dir.path(), &FAST);
    let run = lunch_run(&h);
    // Before the restart: the first three devices of six, two members.
    let deadline = Instant::now() + Duration::from_secs(5);
    while fake.receipts().len() < 6 {
        assert!(Instant::now() < deadline, "{:?}", fake.receipts());
        std::thread::sleep(Duration::from_millis(20));
    }
    let early = expected_counts(&fake.receipts());
    assert!(early.values().all(|c| *c == (2, 0)), "{early:?}");
    wait_counts(&h, run, &early);
    h.stop();

    // Due while nobody is connected: held, then relayed at the next login.
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(
        fake.receipts().len(),
        6,
        "none relayed while Herald is down"
    );
    let h = Herald::start_with(dir.path(), &fake, &FAST);
    let deadline = Instant::now() + Duration::from_secs(30);
    while fake.receipts().len() < 16 {
        assert!(
            Instant::now() < deadline,
            "{:?}\n{}",
            fake.receipts(),
            h.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = fake.receipts();
    assert!(sent[6..].iter().all(|r| r.offline), "{sent:?}");
    let all = expected_counts(&sent);
    assert!(all.values().all(|c| *c == (3, 2)), "{all:?}");
    let counted = wait_counts(&h, run, &all);

    // The early ones again, to the new daemon: repeats, nothing more.
    // This daemon heard the last ten: its repeats are theirs given the
    // first six, and then all sixteen again.
    assert_eq!(fake.replay_receipts(), 16);
    let heard_here = repeats(&sent) - repeats(&sent[..6]);
    wait_metric(&h, REPEATED, (heard_here + 16) as f64);
    assert_eq!(counts_of(&h, run), counted);
}

/// Issue 35: an edit, then a recall, of a run to 24 groups of two members,
/// through the real client to the fake server. Every member's device
/// decrypts, per group, one edit (`edit="1"`) and then one revoke
/// (`edit="7"`) naming that group's message, in the order of the run's
/// groups; Herald is SIGKILLed mid-recall and the restarted daemon
/// recalls the rest, no group under a second id.
#[test]
fn an_edit_and_a_recall_reach_every_members_device_once_even_across_a_sigkill() {
    const GROUPS: usize = 24;
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(GROUPS, 2, 0));
    let dir = tempfile::tempdir().unwrap();
    let env = [("HERALD_DELIVERY__MAX_PER_MINUTE", "120")];
    let mut h = paired(&fake, dir.path(), &env);
    let groups: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "text", "text": "Standup at 09:00"}]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(120));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    let original: BTreeMap<String, String> = fake
        .deliveries()
        .iter()
        .map(|d| (d.group.clone(), d.id.clone()))
        .collect();
    let amendment_over = |h: &Herald, kind: &str| {
        let kind = kind.to_owned();
        h.wait_until(
            &format!("/v1/runs/{run}"),
            Duration::from_secs(120),
            move |r| {
                r["amendment"]["kind"] == kind.as_str() && !r["amendment"]["finished_at"].is_null()
            },
        )
    };
    // Per group: the distinct ids of its `kind` messages, and what they
    // named and said, in order of first arrival.
    let amended = |kind: &str| {
        let mut out: BTreeMap<String, Vec<fake_whatsapp::Delivery>> = BTreeMap::new();
        for d in fake.deliveries() {
            if d.read.kind == kind && d.seen_before == 0 {
                out.entry(d.group.clone()).or_default().push(d);
            }
        }
        out
    };
    let first_arrivals = |kind: &str| -> Vec<String> {
        let mut seen = BTreeSet::new();
        fake.deliveries()
            .into_iter()
            .filter(|d| d.read.kind == kind && seen.insert(d.group.clone()))
            .map(|d| d.group)
            .collect()
    };

    let (status, r) = h.call(
        "POST",
        &format!("/v1/runs/{run}/edit"),
        Some(json!({"text": "Standup moved to 10:30"})),
    );
    assert_eq!(status, 202, "{r}");
    let edited = amendment_over(&h, "edit");
    assert_eq!(
        edited["amendment"]["progress"]["done"], GROUPS,
        "{edited:#}"
    );
    let edits = amended("edit");
    assert_eq!(edits.len(), GROUPS);
    for (group, ds) in &edits {
        assert_eq!(ds.len(), 1, "{group}: {ds:?}");
        let d = &ds[0];
        assert_eq!(d.edit.as_deref(), Some("1"), "{d:?}");
        assert!(d.read.failures.is_empty(), "{:?}", d.read.failures);
        assert_eq!(d.read.devices, 2, "{d:?}");
        assert_eq!(d.read.refers_to.as_ref(), original.get(group), "{d:?}");
        assert_eq!(d.read.text.as_deref(), Some("Standup moved to 10:30"));
    }
    assert_eq!(first_arrivals("edit"), groups, "in the run's order");

    let (status, r) = h.call("POST", &format!("/v1/runs/{run}/recall"), None);
    assert_eq!(status, 202, "{r}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while amended("revoke").len() < GROUPS / 3 {
        assert!(Instant::now() < deadline, "no recall\n{}", h.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    h.kill9();
    let at_kill = amended("revoke").len();
    assert!(at_kill < GROUPS, "killed mid-recall ({at_kill} recalled)");
    let h = Herald::start_with(dir.path(), &fake, &env);
    let recalled = amendment_over(&h, "recall");
    let p = &recalled["amendment"]["progress"];
    assert_eq!(
        (p["done"].as_u64(), p["total"].as_u64()),
        (Some(GROUPS as u64), Some(GROUPS as u64))
    );
    let revokes = amended("revoke");
    assert_eq!(revokes.len(), GROUPS);
    for (group, ds) in &revokes {
        assert_eq!(ds.len(), 1, "{group} revoked under two ids: {ds:?}");
        let d = &ds[0];
        assert_eq!(d.edit.as_deref(), Some("7"), "{d:?}");
        assert!(d.read.failures.is_empty(), "{:?}", d.read.failures);
        assert_eq!(d.read.devices, 2, "{d:?}");
        assert_eq!(d.read.refers_to.as_ref(), original.get(group), "{d:?}");
    }
    assert_eq!(first_arrivals("revoke"), groups, "in the run's order");
}

#[path = "../baileys/receive.rs"]
mod baileys;
use crate::common::baileys_device;

/// WhatsApp's word on the account: a run time-locked mid-run. The fake
/// nacks with 463 and its time-lock query says until when; Herald asks at
/// once, pauses the account until exactly that end (standing and pause in
/// the API), survives a SIGKILL during the lock (the restarted daemon
/// reads the stored end), sends nothing during the lock beyond the parts
/// already on the wire, resumes at the end and finishes with no group
/// twice.
#[test]
fn a_time_lock_mid_run_pauses_until_whatsapps_end_even_across_a_sigkill() {
    const GROUPS: usize = 30;
    const LOCK: Duration = Duration::from_secs(12);
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(GROUPS, 1, 0));
    let dir = tempfile::tempdir().unwrap();
    let env = [("HERALD_DELIVERY__MAX_PER_MINUTE", "120")];
    let mut h = paired(&fake, dir.path(), &env);
    let groups: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "text", "text": "Standup"}]),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while fake.deliveries().len() < GROUPS / 3 {
        assert!(Instant::now() < deadline, "no start\n{}", h.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Whole seconds: WhatsApp gives the end in Unix seconds.
    let now = chrono::Utc::now();
    let end = chrono::DateTime::from_timestamp(now.timestamp() + LOCK.as_secs() as i64, 0).unwrap();
    let locked_at = Instant::now();
    let ends_at = locked_at + (end - now).to_std().unwrap();
    fake.standing(|s| s.locked_until = Some(end));
    let paused = h.wait_until("/v1/accounts/wa", Duration::from_secs(20), |a| {
        a["state"] == "cooling_down"
    });
    let until: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(paused["state_until"].clone()).unwrap();
    assert_eq!(until, end, "paused until the end WhatsApp gave: {paused:#}");
    let lock = &paused["standing"]["timelock"];
    assert_eq!(lock["reading"], "known", "{paused:#}");
    assert_eq!(lock["active"], true);
    assert!(
        paused["state_reason"]
            .as_str()
            .unwrap()
            .contains("WhatsApp time-locked this account's reach-out until"),
        "{paused:#}"
    );
    // Killed during the lock; the new start reads the stored end.
    h.kill9();
    let h = Herald::start_with(dir.path(), &fake, &env);
    let done = wait_run_end(&h, run, Duration::from_secs(120));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());

    let deliveries = fake.deliveries();
    let acked_after: Vec<Instant> = deliveries
        .iter()
        .filter(|d| d.at > locked_at && d.verdict == fake_whatsapp::Verdict::Ack)
        .map(|d| d.at)
        .collect();
    assert!(
        acked_after.iter().all(|t| *t >= ends_at),
        "a message acked inside the lock"
    );
    let nacked = deliveries
        .iter()
        .filter(|d| d.verdict == fake_whatsapp::Verdict::Nack(463))
        .count();
    assert!(
        (1..=3).contains(&nacked),
        "only the parts already on the wire met the lock: {nacked}"
    );
    let first = *acked_after.iter().min().expect("sends after the lock");
    assert!(
        first.duration_since(ends_at) <= Duration::from_secs(2),
        "resumed {:?} after the lock's end",
        first.duration_since(ends_at)
    );
    for g in &groups {
        let ids: std::collections::BTreeSet<&str> = deliveries
            .iter()
            .filter(|d| &d.group == g && d.verdict == fake_whatsapp::Verdict::Ack)
            .map(|d| d.id.as_str())
            .collect();
        assert_eq!(ids.len(), 1, "{g}: {ids:?}");
    }
}

/// The new-chat quota moved by the fake through its warnings to capped:
/// each change reaches the API's standing, the metrics and an
/// `account.standing` webhook delivery; a quota query answered as WhatsApp
/// answers an unknown document id leaves the quota "unknown" and sending
/// as it was.
#[test]
fn the_new_chat_quota_through_its_warnings_and_an_unknown_document() {
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(3, 1, 0));
    let dir = tempfile::tempdir().unwrap();
    let env = [("HERALD_WEBHOOKS__ALLOW_PRIVATE", "true")];
    let h = paired(&fake, dir.path(), &env);
    let standing = |ready: &dyn Fn(&Value) -> bool| {
        h.wait_until("/v1/accounts/wa", Duration::from_secs(30), |a| {
            ready(&a["standing"]["quota"])
        })
    };
    // The first reading, taken at login (by the session and by the
    // account's actor at once: it is told once all the same).
    let read = standing(&|q| q["status"] == "none");
    assert_eq!(read["standing"]["quota"]["total"], 50, "{read:#}");
    // A subscription to standing changes: each change is a delivery row,
    // made with its event (to a port nobody answers; the rows are what is
    // checked).
    let (status, hook) = h.call(
        "POST",
        "/v1/webhooks",
        Some(json!({"url": "http://127.0.0.1:9/standing", "types": ["account.standing"]})),
    );
    assert_eq!(status, 201, "{hook}");
    let hook = hook["id"].as_i64().unwrap();
    for (status, used, want) in [
        ("FIRST_WARNING", 40, "first_warning"),
        ("SECOND_WARNING", 46, "second_warning"),
        ("CAPPED", 50, "capped"),
    ] {
        fake.standing(|s| {
            s.quota = fake_whatsapp::Quota {
                status: status.into(),
                used,
                total: 50,
                ..Default::default()
            }
        });
        // A dropped connection: the client logs in again, and Herald reads
        // the standing at once.
        fake.drop_connections();
        let a = standing(&|q| q["status"] == want);
        assert_eq!(a["standing"]["quota"]["used"], used, "{a:#}");
        wait_metric(
            &h,
            &format!("herald_account_new_chat_quota_status{{account=\"wa\",status=\"{want}\"}}"),
            1.0,
        );
    }
    wait_metric(
        &h,
        "herald_account_new_chat_quota_used{account=\"wa\"}",
        50.0,
    );
    // The CLI shows it too.
    let out = Herald::command(dir.path(), &fake, h.port, &["accounts", "show", "wa"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("new-chat quota") && l.contains("capped: 50 of 50 used")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("time-lock") && l.contains("none · read")),
        "{text}"
    );
    let (status, d) = h.call("GET", &format!("/v1/webhooks/{hook}/deliveries"), None);
    assert_eq!(status, 200, "{d}");
    let told = d["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["type"] == "account.standing")
        .count();
    assert_eq!(told, 3, "one per change: {d:#}");

    // A stale document id: the quota is unknown, and sending goes on.
    fake.standing(|s| s.forget_quota_document = true);
    fake.drop_connections();
    let a = standing(&|q| q["reading"] == "unknown");
    assert!(
        a["standing"]["quota"]["why"]
            .as_str()
            .unwrap()
            .contains("document not found"),
        "{a:#}"
    );
    let groups: Vec<String> = (1..=3).map(|i| format!("120363{i:012}@g.us")).collect();
    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "text", "text": "Still sending"}]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}");
    assert_eq!(
        h.logs()
            .matches("could not be read; shown as unknown")
            .count(),
        1,
        "logged once"
    );
}

/// Per group with a vote, per option: Herald's answer.
fn herald_tally(h: &Herald, run: i64) -> polls::Tally {
    let (status, a) = h.call("GET", &format!("/v1/runs/{run}/poll?limit=1000"), None);
    assert_eq!(status, 200, "{a}");
    polls::of_answer(&a)
}

/// Waits up to `within` for Herald's tally of `run` to be `want` (read
/// again each time), failing with both, what the fake could not send and
/// what a device asked for again.
fn wait_tally(
    h: &Herald,
    fake: &FakeWhatsApp,
    run: i64,
    within: Duration,
    want: impl Fn() -> polls::Tally,
) {
    let deadline = Instant::now() + within;
    loop {
        let (want, got) = (want(), herald_tally(h, run));
        if want == got {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Herald counted {got:?}\nthe voters' latest votes are {want:?}\nvotes the fake could not send: {:?}\nmessages a device asked for again: {:?}\n{}",
            fake.vote_failures(),
            fake.retries(),
            h.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stage 7: a poll to 30 groups of three members with two devices each,
/// through the real client. Every member's phone votes, sealed with the
/// poll's secret and Signal-encrypted to Herald's device as WhatsApp's
/// clients do; some votes are relayed twice. Once the first votes are
/// counted, Herald is SIGKILLed; the members change or withdraw their
/// votes while it is down, and the restarted daemon gets them from the
/// server's queue. Herald's tally, per group and in total, is the fake's
/// record of each member's latest vote throughout.
#[test]
fn a_poll_through_whatsapp_web_counts_each_members_latest_vote_across_a_sigkill() {
    const GROUPS: usize = 30;
    let options = ["Yes", "No", "Later"];
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(GROUPS, 3, 0));
    fake.set_member_devices(2);
    fake.set_votes(Some(fake_whatsapp::VotePlan {
        share: 1.0,
        after: Duration::from_secs(1),
        // Of three voters: the first two change their choice, the last
        // withdraws, well after the first votes.
        change_share: 0.5,
        withdraw_share: 0.2,
        again_after: Duration::from_secs(25),
        repeat_share: 0.3,
    }));
    let dir = tempfile::tempdir().unwrap();
    let mut h = paired(&fake, dir.path(), &FAST);
    let groups: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let run = fire(
        &h,
        "wa",
        &groups,
        json!([{"kind": "poll", "question": "Lunch at 1, {group_name}?",
                "options": options, "multiple": true}]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(120));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    // Every member device read the poll, its options and its secret.
    let deliveries = fake.deliveries();
    assert_eq!(deliveries.len(), GROUPS);
    for d in &deliveries {
        assert!(d.read.failures.is_empty(), "{:?}", d.read.failures);
        assert_eq!(d.read.kind, "poll", "{d:?}");
        assert_eq!(d.read.devices, 6, "{d:?}");
        assert_eq!(d.read.options, options, "{d:?}");
        assert_eq!(d.read.selectable, 3, "{d:?}");
        let question = d.read.text.as_deref().unwrap_or_default();
        assert!(question.starts_with("Lunch at 1, Group "), "{d:?}");
    }

    // The first votes, all counted; then a SIGKILL before the changes.
    let deadline = Instant::now() + Duration::from_secs(60);
    while fake.votes().len() < 3 * GROUPS {
        assert!(
            Instant::now() < deadline,
            "{} votes cast",
            fake.votes().len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_tally(&h, &fake, run, Duration::from_secs(40), || {
        polls::of_record(&fake, &options)
    });
    assert!(
        fake.votes().iter().all(|v| v.votes == 1),
        "the changes came before the kill: make again_after longer"
    );
    h.kill9();

    let h = Herald::start_with(dir.path(), &fake, &FAST);
    let deadline = Instant::now() + Duration::from_secs(60);
    while fake.votes().iter().any(|v| v.votes < 2) {
        assert!(Instant::now() < deadline, "{:?}", fake.votes());
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_tally(&h, &fake, run, Duration::from_secs(40), || {
        polls::of_record(&fake, &options)
    });
    let record = fake.votes();
    assert_eq!(
        record.iter().filter(|v| v.options.is_empty()).count(),
        GROUPS,
        "one withdrawal per group"
    );
    assert!(
        fake.vote_failures().is_empty(),
        "{:?}",
        fake.vote_failures()
    );
    assert_eq!(fake.retries(), vec![], "every vote opened the first time");
    let (_, a) = h.call("GET", &format!("/v1/runs/{run}/poll"), None);
    let poll = &a["polls"][0];
    assert_eq!(poll["voters"], 2 * GROUPS as u64, "{a}");
    assert_eq!(poll["groups_voted"], GROUPS as u64, "{a}");
    let total: u64 = polls::of_record(&fake, &options)
        .values()
        .map(|c| c[0])
        .sum();
    assert_eq!(poll["options"][0]["votes"].as_u64(), Some(total), "{a}");
    assert_eq!(
        metric(
            &h,
            "herald_poll_votes_uncounted_total{outcome=\"undecryptable\"}"
        ),
        None,
        "every vote opened"
    );
}
