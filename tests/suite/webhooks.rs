//! Webhooks end to end, with real processes: a daemon, runs to a few
//! hundred simulated groups, and a receiver on loopback that verifies
//! every signature with the `standardwebhooks` reference package from PyPI
//! (tests/webhooks/receiver.py), not with Herald's code. The receiver fails
//! its first answers, then goes away while the daemon is SIGKILLed
//! mid-retry: every event still arrives, each `webhook-id` at least once.
//! A secret rotation signs with both secrets during its overlap only.
//!
//! Needs python3 with `standardwebhooks` (`.ci/run` installs it and sets
//! HERALD_REQUIRE_STANDARDWEBHOOKS=1, which makes its absence a failure).

use crate::common::daemon as harness;

use harness::{free_port, Daemon};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "webhooks-test-token-0a9b8c7d";
const GROUPS: usize = 200;

fn reference_library() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import standardwebhooks"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("HERALD_REQUIRE_STANDARDWEBHOOKS").as_deref() != Ok("1"),
            "HERALD_REQUIRE_STANDARDWEBHOOKS=1 but python3 cannot import standardwebhooks \
             (pip install standardwebhooks)"
        );
        eprintln!(
            "SKIPPED: the webhooks test needs python3 with the standardwebhooks package \
             (pip install standardwebhooks)"
        );
    }
    ok
}

struct Receiver {
    child: Child,
    log: PathBuf,
    secrets: PathBuf,
}

impl Receiver {
    fn start(dir: &Path, port: u16, fail_first: u32) -> Receiver {
        let (log, secrets) = (dir.join("received.jsonl"), dir.join("secrets.txt"));
        if !secrets.exists() {
            std::fs::write(&secrets, "").unwrap();
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webhooks/receiver.py");
        let child = Command::new("python3")
            .arg(script)
            .args([
                &port.to_string(),
                secrets.to_str().unwrap(),
                log.to_str().unwrap(),
            ])
            .arg(fail_first.to_string())
            .stdin(Stdio::null())
            .spawn()
            .expect("starting the receiver");
        let r = Receiver {
            child,
            log,
            secrets,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the receiver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    fn set_secrets(&self, secrets: &[&str]) {
        std::fs::write(&self.secrets, secrets.join("\n")).unwrap();
    }

    fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

fn call(d: &Daemon, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    harness::call_json(d.port, TOKEN, method, path, body.as_ref())
}

fn start_daemon(dir: &Path) -> Daemon {
    let mut d = Daemon::start(
        dir,
        &[
            ("HERALD_CONTROL__TOKEN", TOKEN.into()),
            ("HERALD_WEBHOOKS__ALLOW_PRIVATE", "true".into()),
            // 5 s, 5 min, 30 min … become 2.5 ms, 0.15 s, 0.9 s … (about
            // 50 s from the first attempt to giving up).
            ("HERALD_WEBHOOKS__RETRY_SCALE", "0.0005".into()),
            ("HERALD_WEBHOOKS__POLL_MS", "50".into()),
            ("HERALD_WEBHOOKS__TIMEOUT_SECS", "2".into()),
            ("HERALD_SIMULATOR__GROUPS_PER_ACCOUNT", GROUPS.to_string()),
            ("HERALD_DELIVERY__JITTER_MIN_MS", "0".into()),
            ("HERALD_DELIVERY__JITTER_MAX_MS", "5".into()),
            ("HERALD_DELIVERY__MAX_PER_MINUTE", "600".into()),
            // No warm-up ramp or typing pause: the run's pace is not what
            // this test is about.
            ("HERALD_DELIVERY__WARMUP", "off".into()),
            ("HERALD_DELIVERY__TYPING", "false".into()),
            ("HERALD_SIMULATOR__LATENCY_MIN_MS", "1".into()),
            ("HERALD_SIMULATOR__LATENCY_MAX_MS", "5".into()),
        ],
    );
    d.wait_healthy(Duration::from_secs(60));
    d
}

fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    let deadline = t0 + within;
    loop {
        if let Some(v) = f() {
            eprintln!("{what}: {:.1} s", t0.elapsed().as_secs_f64());
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn fire(d: &Daemon, reminder: i64) -> i64 {
    let (status, v) = call(d, "POST", &format!("/v1/reminders/{reminder}/fire"), None);
    assert_eq!(status, 202, "{v}");
    v["run_id"].as_i64().unwrap()
}

fn wait_run_end(d: &Daemon, run: i64) {
    wait_for("the run to end", Duration::from_secs(120), || {
        let (_, r) = call(d, "GET", &format!("/v1/runs/{run}"), None);
        ["success", "partial", "failed"]
            .contains(&r["status"].as_str().unwrap_or(""))
            .then_some(())
    });
}

/// Every delivery of the subscription, once none is pending.
fn all_delivered(d: &Daemon, hook: i64) -> Vec<Value> {
    wait_for(
        "every delivery to be delivered",
        Duration::from_secs(120),
        || {
            let (status, v) = call(
                d,
                "GET",
                &format!("/v1/webhooks/{hook}/deliveries?limit=500"),
                None,
            );
            assert_eq!(status, 200, "{v}");
            let items = v["items"].as_array().unwrap().clone();
            let failed: Vec<&Value> = items.iter().filter(|i| i["status"] == "failed").collect();
            assert!(failed.is_empty(), "given up: {failed:?}");
            items
                .iter()
                .all(|i| i["status"] == "delivered")
                .then_some(items)
        },
    )
}

/// What the receiver accepted (answered 204), by `webhook-id`.
fn accepted(r: &Receiver) -> HashMap<String, Value> {
    r.received()
        .into_iter()
        .filter(|x| x["answered"] == 204)
        .map(|x| (x["id"].as_str().unwrap().to_owned(), x))
        .collect()
}

fn run_types(got: &HashMap<String, Value>, run: i64) -> Vec<String> {
    let mut types: Vec<String> = got
        .values()
        .filter(|x| x["body"]["data"]["run_id"] == run)
        .map(|x| x["body"]["type"].as_str().unwrap().to_owned())
        .collect();
    types.sort();
    types.dedup();
    types
}

/// A short run of `herald bench webhooks`, so it cannot rot; its figures
/// are read off the release build, not asserted here.
#[test]
fn the_webhooks_bench_delivers_everything_and_prints_its_line() {
    let line = actix_rt::System::new()
        .block_on(herald::bench::webhooks::run("sqlite", 300, 2, 200))
        .unwrap();
    assert!(
        line.starts_with("webhooks: backend=sqlite events=300 "),
        "{line}"
    );
    for key in [
        "delivered_per_s=",
        "engine_msgs_per_s=",
        "engine_msgs_per_s_slow_receiver=",
        "ratio=",
    ] {
        assert!(line.contains(key), "{line}");
    }
}

#[test]
fn every_event_arrives_signed_through_failures_a_kill_and_a_rotation() {
    if !reference_library() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rport = free_port();
    let mut rx = Receiver::start(dir.path(), rport, 4);
    let mut d = start_daemon(dir.path());

    let (status, hook) = call(
        &d,
        "POST",
        "/v1/webhooks",
        Some(json!({
            "url": format!("http://127.0.0.1:{rport}/herald"),
            "types": ["run.started", "run.progress", "run.finished", "run.missed", "account.state_changed"],
            "description": "the test's receiver",
        })),
    );
    assert_eq!(status, 201, "{hook}");
    let secret = hook["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    let id = hook["id"].as_i64().unwrap();
    rx.set_secrets(&[&secret]);
    let (_, listed) = call(&d, "GET", &format!("/v1/webhooks/{id}"), None);
    assert!(listed.get("secret").is_none(), "the secret is shown once");

    let (status, v) = call(
        &d,
        "POST",
        "/v1/accounts",
        Some(json!({"id": "wh-1", "kind": "simulator"})),
    );
    assert_eq!(status, 201, "{v}");
    let targets: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let (status, r) = call(
        &d,
        "POST",
        "/v1/reminders",
        Some(json!({
            "account_id": "wh-1", "title": "Standup", "timezone": "UTC",
            "schedule": {"at": "2099-01-05T09:00"},
            "window": {"start_hour": 0, "end_hour": 24},
            "parts": [{"kind": "text", "text": "Standup in 10 minutes"}],
            "targets": targets,
        })),
    );
    assert_eq!(status, 201, "{r}");
    let reminder = r["id"].as_i64().unwrap();

    // A run while the receiver fails its first four answers.
    let run1 = fire(&d, reminder);
    wait_run_end(&d, run1);
    let deliveries = all_delivered(&d, id);
    let got = accepted(&rx);
    let sent_ids: BTreeSet<String> = deliveries
        .iter()
        .map(|x| x["webhook_message_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        sent_ids.iter().all(|i| got.contains_key(i)),
        "every delivery arrived: missing {:?}",
        sent_ids
            .iter()
            .filter(|i| !got.contains_key(*i))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        run_types(&got, run1),
        ["run.finished", "run.progress", "run.started"]
    );
    let all = rx.received();
    assert!(all.iter().filter(|x| x["answered"] == 500).count() == 4);
    for x in &all {
        assert_eq!(
            x["verified"][&secret], true,
            "verified by the reference library: {x}"
        );
    }
    // The ones refused came again, with the same webhook-id.
    for x in all.iter().filter(|x| x["answered"] == 500) {
        assert!(got.contains_key(x["id"].as_str().unwrap()), "retried: {x}");
    }
    let finished = got
        .values()
        .find(|x| x["body"]["type"] == "run.finished" && x["body"]["data"]["run_id"] == run1)
        .unwrap();
    let (_, r1) = call(&d, "GET", &format!("/v1/runs/{run1}"), None);
    assert_eq!(
        finished["body"]["data"]["status"], r1["status"],
        "{finished}"
    );
    // Named as people know it, beside the ids.
    assert_eq!(finished["body"]["data"]["reminder_title"], "Standup");
    assert_eq!(finished["body"]["data"]["account_name"], r1["account_name"]);

    // The receiver goes away; a run's events wait in retry; the daemon is
    // SIGKILLed mid-run and mid-retry; both come back: nothing is lost.
    rx.stop();
    let run2 = fire(&d, reminder);
    wait_for(
        "attempts to fail while the receiver is gone",
        Duration::from_secs(30),
        || {
            let (_, v) = call(
                &d,
                "GET",
                &format!("/v1/webhooks/{id}/deliveries?limit=500"),
                None,
            );
            v["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["status"] == "pending" && x["attempts"].as_u64() >= Some(2))
                .then_some(())
        },
    );
    d.kill9();
    let rx = Receiver::start(dir.path(), rport, 0);
    let d = start_daemon(dir.path());
    wait_run_end(&d, run2);
    all_delivered(&d, id);
    let got = accepted(&rx);
    assert_eq!(
        run_types(&got, run2),
        ["run.finished", "run.progress", "run.started"],
        "run 2's events arrived after the kill"
    );

    // Rotation: during the overlap both secrets sign; after it, only the
    // new one.
    let (status, rotated) = call(
        &d,
        "POST",
        &format!("/v1/webhooks/{id}/rotate?overlap_hours=1"),
        None,
    );
    assert_eq!(status, 200, "{rotated}");
    let second = rotated["secret"].as_str().unwrap().to_owned();
    rx.set_secrets(&[&secret, &second]);
    let ping = |d: &Daemon| {
        let (status, p) = call(d, "POST", &format!("/v1/webhooks/{id}/ping"), None);
        assert_eq!(status, 202, "{p}");
        let msg = p["webhook_message_id"].as_str().unwrap().to_owned();
        wait_for("the ping", Duration::from_secs(30), || {
            accepted(&rx).remove(&msg)
        })
    };
    let p = ping(&d);
    assert_eq!(p["body"]["type"], "webhook.ping");
    assert_eq!(
        p["verified"][&secret], true,
        "the old secret still signs: {p}"
    );
    assert_eq!(p["verified"][&second], true, "the new one signs: {p}");
    let (_, third) = call(
        &d,
        "POST",
        &format!("/v1/webhooks/{id}/rotate?overlap_hours=0"),
        None,
    );
    let third = third["secret"].as_str().unwrap().to_owned();
    rx.set_secrets(&[&second, &third]);
    let p = ping(&d);
    assert_eq!(p["verified"][&third], true, "{p}");
    assert_eq!(
        p["verified"][&second], false,
        "no overlap: the old one stopped: {p}"
    );
}

/// A receiver on loopback answering 204 to every request; answers its
/// port and the request lines it got.
fn plain_receiver() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let log = got.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut r = BufReader::new(s);
            let (mut first, mut len) = (String::new(), 0usize);
            let _ = r.read_line(&mut first);
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            log.lock().unwrap().push(first.trim().to_owned());
            let _ = r
                .get_mut()
                .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
        }
    });
    (port, got)
}

/// HTTP_PROXY, HTTPS_PROXY and ALL_PROXY in the daemon's environment do
/// not carry webhook attempts (a proxy would resolve the receiver's name
/// past the address check): the "proxy" they name never sees a
/// connection, and the receiver gets the delivery directly.
#[test]
fn the_sender_ignores_proxy_environment_variables() {
    let dir = tempfile::tempdir().unwrap();
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let proxy = format!("http://127.0.0.1:{}", trap.local_addr().unwrap().port());
    let (rport, got) = plain_receiver();
    let mut env = vec![
        ("HERALD_CONTROL__TOKEN", TOKEN.to_owned()),
        ("HERALD_WEBHOOKS__ALLOW_PRIVATE", "true".into()),
        ("HERALD_WEBHOOKS__POLL_MS", "50".into()),
        ("HERALD_WEBHOOKS__TIMEOUT_SECS", "2".into()),
        // Nothing exempted from the proxy, whatever the shell had.
        ("NO_PROXY", String::new()),
        ("no_proxy", String::new()),
    ];
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        env.push((var, proxy.clone()));
    }
    let mut d = Daemon::start(dir.path(), &env);
    d.wait_healthy(Duration::from_secs(60));
    let (status, hook) = call(
        &d,
        "POST",
        "/v1/webhooks",
        Some(json!({"url": format!("http://127.0.0.1:{rport}/hook"), "types": ["run.finished"]})),
    );
    assert_eq!(status, 201, "{hook}");
    let id = hook["id"].as_i64().unwrap();
    let (status, p) = call(&d, "POST", &format!("/v1/webhooks/{id}/ping"), None);
    assert_eq!(status, 202, "{p}");
    wait_for("the ping, sent directly", Duration::from_secs(30), || {
        let (_, v) = call(&d, "GET", &format!("/v1/webhooks/{id}/deliveries"), None);
        (v["items"][0]["status"] == "delivered").then_some(())
    });
    assert_eq!(got.lock().unwrap().as_slice(), ["POST /hook HTTP/1.1"]);
    assert_eq!(
        trap.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the proxy from the environment never saw a connection"
    );
}
