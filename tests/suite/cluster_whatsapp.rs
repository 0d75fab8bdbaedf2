//! Real WhatsApp accounts fail over: three `herald serve` daemons on one
//! PostgreSQL database, the real whatsapp-rust client in each, and the fake
//! WhatsApp Web server (`fake-whatsapp/`) as the judge.
//!
//! Three accounts are paired once, through the first daemon, and their
//! sessions live in the database: when the other two join, the accounts
//! spread and each new owner logs its account in from the database (no
//! pairing). Each account then sends to `HERALD_CLUSTER_WA_GROUPS` groups
//! (300 by default). Mid-run the owner of one account is SIGKILLed: another
//! daemon logs the account in within the lease time and finishes its run.
//! Then a daemon is SIGSTOPped past its lease and SIGCONTed: its account was
//! taken over meanwhile, and it neither sends nor writes session state.
//!
//! The fake server's log must show every group's message once (one message
//! id per group; a resend carries the same id), never two connections of
//! one device sending in turn (a device's sends move from one connection to
//! the next, never back), and no account over its limit in any 60 s.
//! Last, one account's run is recalled and its owner SIGKILLed mid-recall:
//! the last daemon finishes it, every group's message revoked once. Needs
//! `HERALD_TEST_POSTGRES_URL` (`HERALD_REQUIRE_POSTGRES=1` makes its absence
//! a failure).

use crate::common::cluster;
use crate::common::daemon as harness;
use crate::common::polls;
use crate::common::postgres;
use herald_fake_whatsapp as fake_whatsapp;

use cluster::Db;
use fake_whatsapp::{Delivery, FakeWhatsApp};
use harness::{wait_until, wait_until_says, Daemon};
use herald_actors::domain::{AccountId, RunId, RunStatus};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

const ACCOUNTS: usize = 3;
/// Each account's limit, in any 60 s: below the groups per account, so the
/// limit binds across the changes of owner.
const RATE: usize = 240;
const LEASE_SECS: u64 = 4;
const TOKEN: &str = "cluster-whatsapp-token-0123456789abcdef";
const VERSION: &str = "2.3000.1027000000";

fn groups() -> usize {
    std::env::var("HERALD_CLUSTER_WA_GROUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn start_node(name: &str, dir: &Path, db_url: &str, fake: &FakeWhatsApp) -> Daemon {
    let env = [
        ("HERALD_WHATSAPP__SERVER_URL", fake.url()),
        ("HERALD_WHATSAPP__VERSION", VERSION.into()),
        // Every daemon of a cluster holds the same session key.
        (
            "HERALD_WHATSAPP__SESSION_KEY_FILE",
            dir.join("session.key").display().to_string(),
        ),
        ("HERALD_DELIVERY__MAX_PER_MINUTE", RATE.to_string()),
        ("HERALD_DELIVERY__JITTER_MIN_MS", "0".into()),
        ("HERALD_DELIVERY__JITTER_MAX_MS", "20".into()),
    ];
    let mut d = cluster::start_node(name, dir, db_url, TOKEN, LEASE_SECS, &env);
    d.wait_healthy(Duration::from_secs(60));
    d
}

/// One API call: (status, JSON body).
fn call(port: u16, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    harness::call_json(port, TOKEN, method, path, body.as_ref())
}

/// The device number of a paired account, from its JID (`user:N@…`).
fn device_of(jid: &str) -> u32 {
    jid.split('@')
        .next()
        .and_then(|u| u.split(':').nth(1))
        .and_then(|d| d.parse().ok())
        .unwrap_or(0)
}

/// Deliveries by device: each connection's device from its login handshake.
fn by_device(fake: &FakeWhatsApp) -> HashMap<u32, Vec<Delivery>> {
    let conn_device: HashMap<u64, u32> = fake.log(|l| {
        l.handshakes()
            .into_iter()
            .filter_map(|(conn, _, _, h)| h.device.map(|d| (conn, d)))
            .collect()
    });
    let mut out: HashMap<u32, Vec<Delivery>> = HashMap::new();
    for d in fake.deliveries() {
        if let Some(dev) = conn_device.get(&d.conn) {
            out.entry(*dev).or_default().push(d);
        }
    }
    out
}

fn max_in_any_60s(ds: &[Delivery]) -> usize {
    let mut at: Vec<Instant> = ds.iter().map(|d| d.at).collect();
    at.sort();
    let (mut lo, mut best) = (0, 0);
    for hi in 0..at.len() {
        while at[hi] - at[lo] >= Duration::from_secs(60) {
            lo += 1;
        }
        best = best.max(hi + 1 - lo);
    }
    best
}

#[test]
fn real_accounts_fail_over_between_three_daemons_with_each_group_sent_once() {
    let Some(base) = postgres::base("the real-account cluster test") else {
        return;
    };
    let groups = groups();
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(groups, 2, 0));
    let tmp = tempfile::tempdir().unwrap();
    if std::env::var_os("KEEP_CLUSTER_DIR").is_some() {
        eprintln!("daemon logs under {}", tmp.path().display());
    }
    let db = Db::create(&base);

    // One daemon first: it holds every lease, and the accounts pair there.
    let mut n1 = start_node("n1", tmp.path(), db.url(), &fake);
    let n1_port = n1.port;
    let accounts: Vec<AccountId> = (1..=ACCOUNTS)
        .map(|i| AccountId::parse(&format!("wa-{i}")).unwrap())
        .collect();
    let mut devices: BTreeMap<AccountId, u32> = BTreeMap::new();
    for a in &accounts {
        let (s, v) = call(
            n1_port,
            "POST",
            "/v1/accounts",
            Some(json!({"id": a.as_str(), "name": a.as_str(), "kind": "whatsapp"})),
        );
        assert_eq!(s, 201, "{v}");
        wait_until(
            Duration::from_secs(30),
            "the new account's lease",
            &mut [&mut n1],
            || db.owner_of().get(a).is_some_and(|n| n == "n1"),
        );
        let (s, v) = call(n1_port, "POST", &format!("/v1/accounts/{a}/pair"), None);
        assert_eq!(
            (s, v["state"].as_str()),
            (200, Some("waiting_qr")),
            "{v}\n{}",
            n1.logs()
        );
        fake.scan(v["qr"].as_str().unwrap()).unwrap();
        let mut jid = String::new();
        wait_until(
            Duration::from_secs(60),
            "the account paired and connected",
            &mut [&mut n1],
            || {
                let (_, p) = call(n1_port, "GET", &format!("/v1/accounts/{a}/pair"), None);
                let (_, acct) = call(n1_port, "GET", &format!("/v1/accounts/{a}"), None);
                jid = p["jid"].as_str().unwrap_or_default().to_owned();
                p["state"] == "paired" && acct["state"] == "connected"
            },
        );
        devices.insert(a.clone(), device_of(&jid));
    }
    assert_eq!(
        fake.wait_linked(ACCOUNTS, Duration::from_secs(10)).len(),
        ACCOUNTS
    );
    let distinct: HashSet<u32> = devices.values().copied().collect();
    assert_eq!(
        distinct.len(),
        ACCOUNTS,
        "one device per account: {devices:?}"
    );
    let sessions_on_disk = walk(tmp.path())
        .into_iter()
        .filter(|p| p.ends_with("session.db"))
        .count();
    assert_eq!(
        sessions_on_disk, 0,
        "sessions are in the database, not in files"
    );

    // Two more daemons: the accounts spread, and each new owner logs its
    // account in from the database.
    let logins_before = fake.log(|l| l.handshakes().len());
    let mut n2 = start_node("n2", tmp.path(), db.url(), &fake);
    let mut n3 = start_node("n3", tmp.path(), db.url(), &fake);
    wait_until(
        Duration::from_secs(60),
        "one account per daemon",
        &mut [&mut n1, &mut n2, &mut n3],
        || {
            let o = db.owner_of();
            o.len() == ACCOUNTS && o.values().collect::<HashSet<_>>().len() == 3
        },
    );
    wait_until(
        Duration::from_secs(60),
        "logins by the new owners",
        &mut [&mut n1, &mut n2, &mut n3],
        || fake.log(|l| l.handshakes().len()) >= logins_before + 2,
    );
    assert_eq!(
        fake.linked().len(),
        ACCOUNTS,
        "taken over without pairing again"
    );
    for (_, _, _, h) in &fake.log(|l| l.handshakes())[logins_before..] {
        assert!(h.registration.is_none(), "a login, not a new device: {h:?}");
    }

    // A run of every group per account, fired through whichever daemon.
    let targets: Vec<String> = (1..=groups)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let mut runs = Vec::new();
    for (i, a) in accounts.iter().enumerate() {
        let via = [&n1, &n2, &n3][i % 3];
        let parts = json!([{"kind": "text", "text": "Shift change at six"}]);
        runs.push(fire(
            via.port,
            a.as_str(),
            "Failover drill",
            parts,
            &targets,
        ));
    }
    let run_of = |r: RunId| db.run(r);
    let sent = || db.sent(&runs);
    let total = ACCOUNTS * groups;
    wait_until(
        Duration::from_secs(120),
        "10% sent",
        &mut [&mut n1, &mut n2, &mut n3],
        || sent() >= total / 10,
    );

    // SIGKILL the owner of wa-1 mid-run.
    let mut nodes: Vec<(String, Daemon)> =
        vec![("n1".into(), n1), ("n2".into(), n2), ("n3".into(), n3)];
    let victim = db.owner_of()[&accounts[0]].clone();
    let vi = nodes.iter().position(|(n, _)| *n == victim).unwrap();
    let (_, mut killed) = nodes.remove(vi);
    let before = fake.log(|l| l.handshakes().len());
    killed.kill9();
    let killed_at = Instant::now();
    let dev1 = devices[&accounts[0]];
    {
        let mut live: Vec<&mut Daemon> = nodes.iter_mut().map(|(_, d)| d).collect();
        wait_until(
            Duration::from_secs(4 * LEASE_SECS),
            "wa-1 taken over",
            &mut live,
            || {
                db.owner_of()
                    .get(&accounts[0])
                    .is_some_and(|n| *n != victim)
            },
        );
        wait_until(
            Duration::from_secs(4 * LEASE_SECS),
            "wa-1 logged in by its new owner",
            &mut live,
            || {
                fake.log(|l| {
                    l.handshakes()[before..]
                        .iter()
                        .any(|(_, _, _, h)| h.device == Some(dev1))
                })
            },
        );
    }
    eprintln!(
        "wa-1 logged in again {:?} after its owner was killed",
        killed_at.elapsed()
    );

    // SIGSTOP the owner of wa-2 past its lease; its account moves; SIGCONT
    // while the new owner's login is still under way (the fake server
    // makes it slow), so the paused daemon's socket is still open when it
    // wakes: it must write nothing more on it.
    let paused_name = db.owner_of()[&accounts[1]].clone();
    let pi = nodes.iter().position(|(n, _)| *n == paused_name).unwrap();
    let dev2 = devices[&accounts[1]];
    let old_conn = fake
        .log(|l| {
            l.handshakes()
                .into_iter()
                .filter(|(_, _, _, h)| h.device == Some(dev2))
                .map(|(c, ..)| c)
                .max()
        })
        .expect("wa-2 is connected");
    fake.slow_logins(Some(Duration::from_secs(3 * LEASE_SECS)));
    harness::signal(&nodes[pi].1.child, "STOP");
    {
        let (_, other) = &mut nodes[1 - pi];
        wait_until(
            Duration::from_secs(6 * LEASE_SECS),
            "wa-2 taken over from the paused daemon",
            &mut [other],
            || {
                db.owner_of()
                    .get(&accounts[1])
                    .is_some_and(|n| *n != paused_name)
            },
        );
    }
    std::thread::sleep(Duration::from_secs(LEASE_SECS));
    let before_resume = fake.log(|l| l.seen.len());
    let replaced_before = fake.log(|l| {
        l.seen
            .iter()
            .any(|s| matches!(s, fake_whatsapp::Seen::Replaced { old, .. } if *old == old_conn))
    });
    harness::signal(&nodes[pi].1.child, "CONT");
    let resumed_at = Instant::now();
    std::thread::sleep(Duration::from_secs(2 * LEASE_SECS));
    fake.slow_logins(None);
    // Nothing at all came on the paused daemon's connection after it woke
    // (not a message, not a ping): its lease had ended.
    let late: Vec<String> = fake.log(|l| {
        l.seen[before_resume..]
            .iter()
            .filter_map(|s| match s {
                fake_whatsapp::Seen::Stanza { conn, node } if *conn == old_conn => {
                    Some(format!("{} {:?}", node.tag, node.attrs))
                }
                _ => None,
            })
            .collect()
    });
    assert!(
        !replaced_before,
        "the new owner's login was to be slower than the pause"
    );
    assert!(
        late.is_empty(),
        "the resumed daemon wrote on connection {old_conn} after its lease ended: {late:?}"
    );

    // Every run finishes.
    let finished = || runs.iter().all(|r| run_of(*r).status.is_final());
    {
        let mut live: Vec<&mut Daemon> = nodes.iter_mut().map(|(_, d)| d).collect();
        wait_until(
            Duration::from_secs(300),
            "every run completed",
            &mut live,
            finished,
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    for r in &runs {
        let run = run_of(*r);
        assert_eq!(run.status, RunStatus::Success, "run {r}: {:?}", run.counts);
    }

    // The judge: the fake server's log.
    let all = by_device(&fake);
    for (acct, dev) in &devices {
        let ds = all.get(dev).cloned().unwrap_or_default();
        let mut ids: HashMap<&str, HashSet<&str>> = HashMap::new();
        for d in &ds {
            ids.entry(d.group.as_str())
                .or_default()
                .insert(d.id.as_str());
        }
        assert_eq!(ids.len(), groups, "{acct}: every group reached");
        let twice: Vec<_> = ids.iter().filter(|(_, i)| i.len() != 1).collect();
        assert!(
            twice.is_empty(),
            "{acct}: groups with more than one message id: {twice:?}"
        );
        // Sends of one device move from connection to connection, never back.
        let mut order = ds.clone();
        order.sort_by_key(|d| d.at);
        let mut seen_conns: Vec<u64> = Vec::new();
        for d in &order {
            if seen_conns.last() != Some(&d.conn) {
                assert!(
                    !seen_conns.contains(&d.conn),
                    "{acct}: two connections of device {dev} sent in turn: {seen_conns:?} then {}",
                    d.conn
                );
                seen_conns.push(d.conn);
            }
        }
        let busiest = max_in_any_60s(&ds);
        assert!(
            busiest <= RATE,
            "{acct}: {busiest} messages in one 60 s, over {RATE}"
        );
        eprintln!("{acct} (device {dev}): {} deliveries over connections {seen_conns:?}; busiest 60 s: {busiest}", ds.len());
    }
    // The paused daemon, once resumed, neither sent for wa-2 on the
    // connection the new owner's login replaced, nor kept its client: it
    // stopped it and recorded nothing for the account.
    let replaced: Vec<(u64, u64)> = fake.log(|l| {
        l.seen
            .iter()
            .filter_map(|s| match s {
                fake_whatsapp::Seen::Replaced { old, new } => Some((*old, *new)),
                _ => None,
            })
            .collect()
    });
    let wa2 = all.get(&dev2).cloned().unwrap_or_default();
    for (old, _) in &replaced {
        let late: Vec<_> = wa2
            .iter()
            .filter(|d| d.conn == *old && d.at > resumed_at)
            .collect();
        assert!(
            late.is_empty(),
            "sent on replaced connection {old} after the resume: {late:?}"
        );
    }
    let paused_logs = nodes[pi].1.logs();
    let stopped = paused_logs
        .lines()
        .any(|l| l.contains("lease gone, the WhatsApp client stops") && l.contains("wa-2"));
    assert!(
        stopped,
        "the resumed daemon stopped wa-2's client\n{paused_logs}"
    );
    eprintln!("connections replaced by a newer login of the same device: {replaced:?}");

    // Issue 35: a recall of wa-3's run, asked of the daemon that does not
    // carry it (forwarded to the owner); the owner is SIGKILLed mid-recall
    // and the last daemon takes the account over and finishes the recall.
    let a3 = &accounts[2];
    let run3 = runs[2];
    let dev3 = devices[a3];
    let owner3 = db.owner_of()[a3].clone();
    let oi = nodes.iter().position(|(n, _)| *n == owner3).unwrap();
    let asked_of = nodes[1 - oi].1.port;
    let (s, v) = call(asked_of, "POST", &format!("/v1/runs/{run3}/recall"), None);
    assert_eq!(s, 202, "{v}");
    let revokes = || -> Vec<Delivery> {
        by_device(&fake)
            .remove(&dev3)
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.read.kind == "revoke")
            .collect()
    };
    let recalled_groups = || {
        revokes()
            .iter()
            .map(|d| d.group.clone())
            .collect::<HashSet<_>>()
            .len()
    };
    {
        let mut live: Vec<&mut Daemon> = nodes.iter_mut().map(|(_, d)| d).collect();
        wait_until(
            Duration::from_secs(120),
            "a third of wa-3's groups recalled",
            &mut live,
            || recalled_groups() >= groups / 3,
        );
    }
    let (_, mut killed_mid_recall) = nodes.remove(oi);
    killed_mid_recall.kill9();
    assert!(recalled_groups() < groups, "killed mid-recall");
    let last = &mut nodes[0].1;
    let last_port = last.port;
    wait_until(
        Duration::from_secs(300),
        "the recall finished by the last daemon",
        &mut [last],
        || {
            let (_, r) = call(last_port, "GET", &format!("/v1/runs/{run3}"), None);
            !r["amendment"]["finished_at"].is_null()
        },
    );
    let (_, r) = call(last_port, "GET", &format!("/v1/runs/{run3}"), None);
    assert_eq!(r["amendment"]["progress"]["done"], groups, "{r}");
    let originals: HashMap<String, String> = all
        .get(&dev3)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|d| d.read.kind == "text")
        .map(|d| (d.group, d.id))
        .collect();
    let mut revoke_ids: HashMap<String, HashSet<String>> = HashMap::new();
    for d in revokes() {
        assert_eq!(d.read.refers_to.as_ref(), originals.get(&d.group), "{d:?}");
        revoke_ids.entry(d.group.clone()).or_default().insert(d.id);
    }
    assert_eq!(revoke_ids.len(), groups, "every group recalled");
    let twice: Vec<_> = revoke_ids.iter().filter(|(_, i)| i.len() != 1).collect();
    assert!(twice.is_empty(), "groups recalled under two ids: {twice:?}");
    let busiest = max_in_any_60s(&by_device(&fake).remove(&dev3).unwrap_or_default());
    assert!(busiest <= RATE, "wa-3: {busiest} messages in one 60 s");
    eprintln!("wa-3's run recalled in {groups} groups across its owner's SIGKILL; busiest 60 s: {busiest}");
    drop((nodes, killed, killed_mid_recall));
    if std::env::var_os("KEEP_CLUSTER_DIR").is_some() {
        let logins: Vec<(u64, Option<u32>)> = fake.log(|l| {
            l.handshakes()
                .into_iter()
                .map(|(c, _, _, h)| (c, h.device))
                .collect()
        });
        eprintln!("logins (connection, device): {logins:?}");
        let _ = tmp.keep();
    }
    db.drop_database();
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// `GET path` as raw bytes: (status line and headers, body).
fn get_bytes(port: u16, path: &str) -> (String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    (
        String::from_utf8_lossy(&raw[..end]).to_lowercase(),
        raw[end + 4..].to_vec(),
    )
}

/// Pairing through any daemon of a cluster: asked of the daemon that does
/// not hold the account's lease, the start, the state and the QR are
/// answered by the one that does (its connection is the one the phone
/// pairs), and the account pairs and connects there.
#[test]
fn pairing_asked_of_any_daemon_is_answered_by_the_account_s_owner() {
    let Some(base) = postgres::base("the pairing-anywhere cluster test") else {
        return;
    };
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(2, 2, 0));
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::create(&base);
    let mut n1 = start_node("n1", tmp.path(), db.url(), &fake);
    let mut n2 = start_node("n2", tmp.path(), db.url(), &fake);
    let a = AccountId::parse("wa-anywhere").unwrap();
    let (s, v) = call(
        n1.port,
        "POST",
        "/v1/accounts",
        Some(json!({"id": a.as_str(), "name": "anywhere", "kind": "whatsapp"})),
    );
    assert_eq!(s, 201, "{v}");
    let mut owner = String::new();
    wait_until(
        Duration::from_secs(30),
        "the new account's lease",
        &mut [&mut n1, &mut n2],
        || match db.owner_of().get(&a) {
            Some(n) => {
                owner = n.clone();
                true
            }
            None => false,
        },
    );
    let (asked, other) = if owner == "n1" {
        (n2.port, "n2")
    } else {
        (n1.port, "n1")
    };

    let auth = format!("Authorization: Bearer {TOKEN}");
    let (s, head, body) = harness::request(
        asked,
        "POST",
        &format!("/v1/accounts/{a}/pair"),
        &[auth],
        "",
    )
    .unwrap();
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!((s, v["state"].as_str()), (200, Some("waiting_qr")), "{v}");
    assert!(
        head.to_lowercase()
            .contains(&format!("x-herald-answered-by: {owner}")),
        "asked {other}, answered by the owner {owner}: {head}"
    );
    let qr = v["qr"].as_str().unwrap().to_owned();

    let (s, v) = call(asked, "GET", &format!("/v1/accounts/{a}/pair"), None);
    assert_eq!((s, v["state"].as_str()), (200, Some("waiting_qr")), "{v}");
    assert_eq!(v["qr"].as_str(), Some(qr.as_str()), "the owner's QR");
    let (head, png) = get_bytes(asked, &format!("/v1/accounts/{a}/pair/qr.png"));
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: image/png"), "{head}");
    assert!(png.starts_with(b"\x89PNG\r\n"), "a PNG from the owner");

    fake.scan(&qr).unwrap();
    wait_until(
        Duration::from_secs(60),
        "the account paired and connected",
        &mut [&mut n1, &mut n2],
        || {
            let (_, p) = call(asked, "GET", &format!("/v1/accounts/{a}/pair"), None);
            let (_, acct) = call(asked, "GET", &format!("/v1/accounts/{a}"), None);
            p["state"] == "paired" && acct["state"] == "connected"
        },
    );
    assert_eq!(fake.wait_linked(1, Duration::from_secs(10)).len(), 1);
    assert_eq!(
        db.owner_of().get(&a).map(String::as_str),
        Some(owner.as_str()),
        "paired where the lease was"
    );
    drop((n1, n2));
    db.drop_database();
}

use crate::common::baileys_device;

/// Baileys on the receiving side across a takeover: two members' devices
/// run by Baileys (an independent client with its own Signal
/// implementation) decrypt a run the account's owner sends; the owner is
/// SIGKILLed, the other daemon takes the account over and logs in from the
/// database, and its next run still decrypts on both devices: the Signal
/// sessions and sender keys the first daemon wrote are the ones the second
/// one sends with. No device asks for a message again.
#[test]
fn baileys_members_decrypt_the_account_s_runs_before_and_after_a_takeover() {
    use baileys_device::{Device, ALICE, BOB};
    let Some(node_dir) = baileys_device::baileys() else {
        return;
    };
    let Some(base) = postgres::base("the Baileys takeover test") else {
        return;
    };
    let fake = FakeWhatsApp::start();
    let groups = baileys_device::groups();
    let jids: Vec<String> = groups.iter().map(|g| g.jid.clone()).collect();
    fake.set_groups(groups);
    let tmp = tempfile::tempdir().unwrap();
    let mut alice = Device::link(&node_dir, &fake, &tmp.path().join("alice"), ALICE);
    let mut bob = Device::link(&node_dir, &fake, &tmp.path().join("bob"), BOB);
    let db = Db::create(&base);
    let n1 = start_node("n1", tmp.path(), db.url(), &fake);
    let n2 = start_node("n2", tmp.path(), db.url(), &fake);
    let mut nodes = vec![("n1".to_owned(), n1), ("n2".to_owned(), n2)];
    let a = AccountId::parse("wa-b").unwrap();
    let port = nodes[0].1.port;
    let (s, v) = call(
        port,
        "POST",
        "/v1/accounts",
        Some(json!({"id": a.as_str(), "name": "baileys", "kind": "whatsapp"})),
    );
    assert_eq!(s, 201, "{v}");
    let (s, v) = call(port, "POST", &format!("/v1/accounts/{a}/pair"), None);
    assert_eq!((s, v["state"].as_str()), (200, Some("waiting_qr")), "{v}");
    fake.scan(v["qr"].as_str().unwrap()).unwrap();
    let connected = |port: u16| {
        let (_, acct) = call(port, "GET", &format!("/v1/accounts/{a}"), None);
        acct["state"] == "connected"
    };
    {
        let mut live: Vec<&mut Daemon> = nodes.iter_mut().map(|(_, d)| d).collect();
        wait_until(
            Duration::from_secs(60),
            "the account paired",
            &mut live,
            || connected(port),
        );
    }
    let send = |port: u16, text: &str| -> RunId {
        let parts = json!([{"kind": "text", "text": text}]);
        fire(port, a.as_str(), text, parts, &jids)
    };
    let sent_whole = |nodes: &mut Vec<(String, Daemon)>, run: RunId| {
        let mut live: Vec<&mut Daemon> = nodes.iter_mut().map(|(_, d)| d).collect();
        wait_until(Duration::from_secs(60), "the run sent", &mut live, || {
            db.run(run).status == RunStatus::Success
        });
    };
    let texts = |d: &mut Device, n: usize| -> Vec<(String, String)> {
        d.messages(n)
            .iter()
            .map(|m| {
                (
                    m["group"].as_str().unwrap().to_owned(),
                    m["text"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };

    let first = send(port, "Shift change at six");
    sent_whole(&mut nodes, first);
    for d in [&mut alice, &mut bob] {
        // Groups go in parallel: compared in group order.
        let mut got = texts(d, jids.len());
        got.sort();
        let want: Vec<(String, String)> = jids
            .iter()
            .map(|g| (g.clone(), "Shift change at six".to_owned()))
            .collect();
        assert_eq!(got, want, "{}", d.jid);
    }

    // SIGKILL the owner; the other daemon takes the account over.
    let owner = db.owner_of()[&a].clone();
    let oi = nodes.iter().position(|(n, _)| *n == owner).unwrap();
    let (_, mut killed) = nodes.remove(oi);
    killed.kill9();
    let survivor = nodes[0].1.port;
    {
        let mut live: Vec<&mut Daemon> = nodes.iter_mut().map(|(_, d)| d).collect();
        wait_until(
            Duration::from_secs(8 * LEASE_SECS),
            "the account taken over and logged in",
            &mut live,
            || db.owner_of().get(&a).is_some_and(|n| *n != owner) && connected(survivor),
        );
    }
    let second = send(survivor, "Shift moved to seven");
    sent_whole(&mut nodes, second);
    for d in [&mut alice, &mut bob] {
        let got = texts(d, 2 * jids.len());
        assert!(
            got[jids.len()..]
                .iter()
                .all(|(_, t)| t == "Shift moved to seven"),
            "{}: {got:?}",
            d.jid
        );
    }
    assert_eq!(
        fake.retries(),
        vec![],
        "no device asked for a message again"
    );
    drop((nodes, killed));
    db.drop_database();
}

/// Creates a reminder of `parts` for `account` to every group of
/// `targets` through the daemon on `port`, fires it there, and answers
/// the run.
fn fire(port: u16, account: &str, title: &str, parts: Value, targets: &[String]) -> RunId {
    let (s, r) = call(
        port,
        "POST",
        "/v1/reminders",
        Some(json!({
            "account_id": account, "title": title, "timezone": "UTC",
            "schedule": {"at": "2099-01-05T09:00"}, "window": {"start_hour": 0, "end_hour": 24},
            "parts": parts, "targets": targets,
        })),
    );
    assert_eq!(s, 201, "{r}");
    let (s, f) = call(
        port,
        "POST",
        &format!("/v1/reminders/{}/fire", r["id"]),
        None,
    );
    assert_eq!(s, 202, "{f}");
    RunId(f["run_id"].as_i64().unwrap())
}

/// Account `wa-1` added and paired through a first daemon `n1`, which holds
/// its lease; then a second daemon `n2` on the same database.
fn paired_on_two(dir: &Path, db: &Db, fake: &FakeWhatsApp) -> (AccountId, Daemon, Daemon) {
    let mut n1 = start_node("n1", dir, db.url(), fake);
    let (s, v) = call(
        n1.port,
        "POST",
        "/v1/accounts",
        Some(json!({"id": "wa-1", "name": "wa-1", "kind": "whatsapp"})),
    );
    assert_eq!(s, 201, "{v}");
    let wa = AccountId::parse("wa-1").unwrap();
    wait_until(Duration::from_secs(30), "the lease", &mut [&mut n1], || {
        db.owner_of().get(&wa).is_some_and(|n| n == "n1")
    });
    let (s, v) = call(n1.port, "POST", "/v1/accounts/wa-1/pair", None);
    assert_eq!(s, 200, "{v}");
    fake.scan(v["qr"].as_str().unwrap()).unwrap();
    let n1_port = n1.port;
    wait_until(Duration::from_secs(60), "paired", &mut [&mut n1], || {
        call(n1_port, "GET", "/v1/accounts/wa-1", None).1["state"] == "connected"
    });
    let n2 = start_node("n2", dir, db.url(), fake);
    (wa, n1, n2)
}

/// WhatsApp's time-lock across a takeover: the owner of a real account
/// meets the lock mid-run (463), reads its end and pauses; killed during
/// the lock, the account's new owner reads the stored end and sends
/// nothing until then, then finishes the run with no group twice.
#[test]
fn a_time_lock_holds_across_a_takeover_by_another_daemon() {
    let Some(base) = postgres::base("the time-lock takeover test") else {
        return;
    };
    const GROUPS: usize = 40;
    const LOCK_SECS: i64 = 25;
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(GROUPS, 1, 0));
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::create(&base);
    let (wa, mut n1, mut n2) = paired_on_two(tmp.path(), &db, &fake);
    let targets: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let parts = json!([{"kind": "text", "text": "Standup"}]);
    let run = fire(n1.port, "wa-1", "Lock drill", parts, &targets);
    wait_until(
        Duration::from_secs(60),
        "a third sent",
        &mut [&mut n1, &mut n2],
        || db.sent(&[run]) >= GROUPS / 3,
    );
    // Whoever owns it now meets the lock.
    let now = chrono::Utc::now();
    let end = chrono::DateTime::from_timestamp(now.timestamp() + LOCK_SECS, 0).unwrap();
    let locked_at = Instant::now();
    let ends_at = locked_at + (end - now).to_std().unwrap();
    fake.standing(|s| s.locked_until = Some(end));
    let n2_port = n2.port;
    wait_until(
        Duration::from_secs(20),
        "paused",
        &mut [&mut n1, &mut n2],
        || {
            let a = call(n2_port, "GET", "/v1/accounts/wa-1", None).1;
            a["state"] == "cooling_down"
                && serde_json::from_value::<chrono::DateTime<chrono::Utc>>(a["state_until"].clone())
                    .is_ok_and(|u| u == end)
        },
    );
    // Kill the owner during the lock; the other takes the account over.
    let owner = db.owner_of()[&wa].clone();
    let (mut killed, mut other) = if owner == "n1" { (n1, n2) } else { (n2, n1) };
    killed.kill9();
    wait_until(
        Duration::from_secs(4 * LEASE_SECS),
        "taken over",
        &mut [&mut other],
        || db.owner_of().get(&wa).is_some_and(|n| *n != owner),
    );
    assert!(Instant::now() < ends_at, "taken over during the lock");
    wait_until(
        Duration::from_secs(120),
        "the run finished",
        &mut [&mut other],
        || db.run(run).status.is_final(),
    );
    assert_eq!(db.run(run).status, RunStatus::Success);
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
    let first = *acked_after.iter().min().expect("sent after the lock");
    assert!(
        first.duration_since(ends_at) <= Duration::from_secs(3),
        "the new owner resumed {:?} after the lock's end",
        first.duration_since(ends_at)
    );
    for g in &targets {
        let ids: HashSet<&str> = deliveries
            .iter()
            .filter(|d| &d.group == g && d.verdict == fake_whatsapp::Verdict::Ack)
            .map(|d| d.id.as_str())
            .collect();
        assert_eq!(ids.len(), 1, "{g}: {ids:?}");
    }
    other.stop();
    db.drop_database();
}

/// Per group with a vote, per option: a daemon's answer to the run's poll.
fn poll_tally(port: u16, run: RunId) -> polls::Tally {
    let (s, a) = call(
        port,
        "GET",
        &format!("/v1/runs/{}/poll?limit=1000", run.0),
        None,
    );
    assert_eq!(s, 200, "{a}");
    polls::of_answer(&a)
}

/// Whether the daemon on `port` answers the fake's record of the members'
/// latest votes once `cast` holds of them; else what each side says, and
/// what the fake could not deliver.
fn same_tally(
    port: u16,
    run: RunId,
    fake: &FakeWhatsApp,
    options: &[&str],
    cast: impl Fn(&[fake_whatsapp::CastVote]) -> bool,
) -> Result<(), String> {
    let votes = fake.votes();
    let (herald, record) = (poll_tally(port, run), polls::of_record(fake, options));
    if cast(&votes) && herald == record {
        return Ok(());
    }
    Err(format!(
        "{} votes cast; Herald's tally {herald:?}\nthe fake's record {record:?}\nvotes the fake could not send: {:?}\nmessages a device asked for again: {:?}",
        votes.len(),
        fake.vote_failures(),
        fake.retries()
    ))
}

/// A poll's votes follow its account to the daemon that takes it over:
/// the first votes are counted by the owner, which is then SIGKILLed; the
/// members change or withdraw their votes, the other daemon logs the
/// account in from the database within the lease time, opens the votes
/// the server kept for the device (the poll's secret comes from the
/// account's identity, which the session carries) and the tally is each
/// member's latest vote, none counted twice.
#[test]
fn a_polls_votes_are_counted_by_the_daemon_that_takes_the_account_over() {
    let Some(base) = postgres::base("the poll takeover test") else {
        return;
    };
    const GROUPS: usize = 10;
    let options = ["Yes", "No", "Later"];
    let fake = FakeWhatsApp::start();
    fake.set_groups(FakeWhatsApp::numbered_groups(GROUPS, 3, 0));
    fake.set_member_devices(2);
    fake.set_votes(Some(fake_whatsapp::VotePlan {
        share: 1.0,
        after: Duration::from_secs(1),
        change_share: 0.5,
        withdraw_share: 0.2,
        again_after: Duration::from_secs(25),
        repeat_share: 0.3,
    }));
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::create(&base);
    let (wa, mut n1, mut n2) = paired_on_two(tmp.path(), &db, &fake);
    let targets: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let parts = json!([{"kind": "poll", "question": "Lunch at 1?", "options": options,
                        "multiple": false}]);
    let run = fire(n1.port, "wa-1", "Lunch", parts, &targets);
    let n2_port = n2.port;
    // Every member's first vote cast, and counted by the owner.
    wait_until_says(
        Duration::from_secs(120),
        "the first votes counted",
        &mut [&mut n1, &mut n2],
        || same_tally(n2_port, run, &fake, &options, |v| v.len() == 3 * GROUPS),
    );
    assert!(
        fake.votes().iter().all(|v| v.votes == 1),
        "the changes came before the kill"
    );
    let owner = db.owner_of()[&wa].clone();
    let (mut killed, mut other) = if owner == "n1" { (n1, n2) } else { (n2, n1) };
    killed.kill9();
    let other_port = other.port;
    wait_until(
        Duration::from_secs(4 * LEASE_SECS),
        "taken over",
        &mut [&mut other],
        || db.owner_of().get(&wa).is_some_and(|n| *n != owner),
    );
    // The changes and withdrawals, each member's latest vote counted.
    wait_until_says(
        Duration::from_secs(90),
        "the new owner's tally",
        &mut [&mut other],
        || {
            same_tally(other_port, run, &fake, &options, |v| {
                v.iter().all(|v| v.votes >= 2)
            })
        },
    );
    let (_, a) = call(other_port, "GET", &format!("/v1/runs/{}/poll", run.0), None);
    assert_eq!(a["polls"][0]["voters"], 2 * GROUPS as u64, "{a}");
    assert!(
        fake.vote_failures().is_empty(),
        "{:?}",
        fake.vote_failures()
    );
    assert_eq!(fake.retries(), vec![], "every vote opened the first time");
    other.stop();
    db.drop_database();
}
