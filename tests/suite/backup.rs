//! `herald backup` and `herald restore` on a real embedded install: a
//! daemon mid-run is backed up by a second process, keeps sending, and is
//! SIGKILLed; the backup goes into a new data directory, a daemon starts on
//! it and finds every reminder, run, group label and media file; the run
//! resumes from the backup's marks and finishes. Both daemons send to one
//! shared simulated WhatsApp (as both would to WhatsApp itself), whose
//! journal must show every group's every part exactly once: what the first
//! daemon sent after the backup goes again with the same message ids and is
//! not delivered twice.

use crate::common::daemon as harness;
use crate::common::png;

use harness::{herald, Daemon, SimProcess};
use herald_actors::simulator::{read_journal, Simulator};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

const TOKEN: &str = "backup-test-token-5e1d-0a9b";
const GROUPS: usize = 120;
/// Messages a minute (the most an account may have): two parts to 120
/// groups take about 25 s.
const RATE: u32 = 600;

fn api(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    harness::call_json(port, TOKEN, method, path, body)
}

fn start(dir: &Path, sim: &SimProcess) -> Daemon {
    std::fs::create_dir_all(dir).unwrap();
    let mut d = Daemon::start(
        dir,
        &[
            ("HERALD_CONTROL__TOKEN", TOKEN.into()),
            ("HERALD_SIMULATOR__URL", sim.url()),
            ("HERALD_SIMULATOR__GROUPS_PER_ACCOUNT", GROUPS.to_string()),
            ("HERALD_DELIVERY__TYPING", "false".into()),
            ("HERALD_DELIVERY__WARMUP", "off".into()),
            ("HERALD_DELIVERY__JITTER_MIN_MS", "0".into()),
            ("HERALD_DELIVERY__JITTER_MAX_MS", "5".into()),
        ],
    );
    d.wait_healthy(Duration::from_secs(60));
    d
}

/// `herald backup|restore FILE` on the install in `data_dir`.
fn herald_cli(verb: &str, file: &Path, data_dir: &Path) -> std::process::Output {
    herald()
        .arg(verb)
        .arg(file)
        .env("HERALD_STORAGE__DATA_DIR", data_dir)
        .output()
        .unwrap()
}

fn sent(port: u16, run: i64) -> (u64, String) {
    let (status, r) = api(port, "GET", &format!("/v1/runs/{run}"), None);
    assert_eq!(status, 200, "{r}");
    (
        r["counts"]["sent"].as_u64().unwrap(),
        r["status"].as_str().unwrap().to_owned(),
    )
}

fn wait_sent(d: &mut Daemon, run: i64, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while sent(d.port, run).0 < at_least {
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "the daemon exited\n{}",
            d.logs()
        );
        assert!(
            Instant::now() < deadline,
            "run {run} stuck at {:?}\n{}",
            sent(d.port, run),
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_backup_taken_mid_run_restores_everything_and_the_run_resumes_without_a_group_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let (first_dir, second_dir) = (tmp.path().join("first"), tmp.path().join("second"));
    let sim = SimProcess::start(
        &tmp.path().join("sim"),
        &[
            "--latency-min-ms",
            "2",
            "--latency-max-ms",
            "10",
            "--rate-limit-per-minute",
            "0",
            "--groups-per-account",
            &GROUPS.to_string(),
        ],
    );
    let mut first = start(&first_dir, &sim);
    let port = first.port;

    // An account, a labelled group, a picture, and a reminder of a text and
    // the picture to every group.
    let (status, r) = api(
        port,
        "POST",
        "/v1/accounts",
        Some(&json!({"id": "demo", "kind": "simulator", "max_per_minute": RATE})),
    );
    assert_eq!(status, 201, "{r}");
    let vip = Simulator::numbered_group(7).as_str().to_owned();
    let (status, r) = api(
        port,
        "PUT",
        &format!("/v1/accounts/demo/groups/{vip}/labels"),
        Some(&json!({"labels": ["vip"]})),
    );
    assert_eq!(status, 200, "{r}");
    let picture = png::tiny_png();
    let media = upload(port, &picture);
    let targets: Vec<String> = (0..GROUPS)
        .map(|i| Simulator::numbered_group(i).as_str().to_owned())
        .collect();
    let reminder = json!({
        "account_id": "demo",
        "title": "Standup",
        "timezone": "UTC",
        "schedule": {"at": "2099-01-05T09:00"},
        "window": {"start_hour": 0, "end_hour": 24},
        "parts": [
            {"kind": "text", "text": "Standup in 10 minutes"},
            {"kind": "media", "media": media, "caption": "the board"}
        ],
        "targets": targets,
    });
    let (status, r) = api(port, "POST", "/v1/reminders", Some(&reminder));
    assert_eq!(status, 201, "{r}");
    let reminder_id = r["id"].as_i64().unwrap();
    let (status, r) = api(
        port,
        "POST",
        &format!("/v1/reminders/{reminder_id}/fire"),
        None,
    );
    assert_eq!(status, 202, "{r}");
    let run = r["run_id"].as_i64().or(r["id"].as_i64()).expect("a run id");

    // Back up mid-run, from another process, while the daemon sends.
    wait_sent(&mut first, run, GROUPS as u64 / 5);
    let file = tmp.path().join("herald-backup.tar");
    let began = Instant::now();
    let out = herald_cli("backup", &file, &first_dir);
    let took = began.elapsed();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("1 media files"), "{said}");
    assert!(said.contains("not in the backup"), "{said}");
    let at_backup = sent(port, run).0;
    assert!(at_backup < GROUPS as u64, "the run was still going");
    // A backup never overwrites.
    let again = herald_cli("backup", &file, &first_dir);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));

    // The first daemon sends on past the backup, then dies.
    wait_sent(&mut first, run, at_backup + GROUPS as u64 / 5);
    first.kill9();

    // Restoring over an install is refused; into a new directory it works.
    let refused = herald_cli("restore", &file, &first_dir);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("is not empty") && why.contains("restore only into an empty data directory"),
        "{why}"
    );
    let out = herald_cli("restore", &file, &second_dir);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("put back the session key"), "{said}");
    // The session key is kept apart from the backup (it unseals what the
    // database holds): the operator puts it back, as restore says.
    std::fs::copy(
        first_dir.join("session.key"),
        second_dir.join("session.key"),
    )
    .unwrap();
    assert_eq!(
        std::fs::read(second_dir.join("media").join(media.as_str().unwrap())).unwrap(),
        picture,
        "the media file came back, byte for byte"
    );

    let mut second = start(&second_dir, &sim);
    let port = second.port;
    let (status, r) = api(port, "GET", &format!("/v1/reminders/{reminder_id}"), None);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["parts"][1]["media"], media, "{r}");
    let (status, r) = api(port, "GET", "/v1/accounts/demo/groups?label=vip", None);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["items"][0]["jid"], vip, "{r}");
    let (status, r) = api(
        port,
        "GET",
        &format!("/v1/media/{}", media.as_str().unwrap()),
        None,
    );
    assert_eq!(status, 200, "{r}");
    let (restored_sent, _) = sent(port, run);
    assert!(
        restored_sent >= at_backup.saturating_sub(3) && restored_sent <= at_backup + 3,
        "the restored run starts from the backup's marks: {restored_sent} vs {at_backup}"
    );

    // The run resumes and finishes.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (n, status) = sent(port, run);
        if status == "success" {
            assert_eq!(n, GROUPS as u64);
            break;
        }
        assert!(
            !["partial", "failed", "cancelled"].contains(&status.as_str()),
            "run ended {status}\n{}",
            second.logs()
        );
        assert!(
            Instant::now() < deadline,
            "run stuck at {n} ({status})\n{}",
            second.logs()
        );
        assert!(
            second.child.try_wait().unwrap().is_none(),
            "{}",
            second.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    second.stop();

    // The simulated WhatsApp's journal: each part to each group once.
    let log = read_journal(&sim.journal).unwrap();
    let mut per_group: HashMap<String, Vec<String>> = HashMap::new();
    for d in &log {
        per_group
            .entry(d.group.as_str().to_owned())
            .or_default()
            .push(d.message_id.clone());
    }
    assert_eq!(per_group.len(), GROUPS, "every group reached");
    for (group, ids) in &per_group {
        assert_eq!(
            ids.len(),
            2,
            "{group} got {ids:?}: each of the two parts once"
        );
    }
    // What the first daemon sent after the backup went again under the
    // same message ids, and the simulated WhatsApp recognised each.
    let (status, counters) = harness::http_get(sim.port, "/accounts/demo").unwrap();
    assert_eq!(status, 200, "{counters}");
    let counters: Value = serde_json::from_str(&counters).unwrap();
    let dedup_hits = counters["dedup_hits"].as_u64().unwrap();
    assert!(dedup_hits > 0, "nothing was sent again: {counters}");
    assert_eq!(counters["duplicate_deliveries"], 0, "{counters}");
    eprintln!(
        "backup: took {:.2} s mid-run at {at_backup} of {GROUPS} groups; the first daemon sent on \
         to about {} before SIGKILL; the restored daemon finished the run, sending {dedup_hits} \
         messages again that WhatsApp knew by their ids; {} deliveries, none twice",
        took.as_secs_f64(),
        at_backup + GROUPS as u64 / 5,
        log.len()
    );
    sim.stop();
}

/// POST /v1/media with raw bytes (the harness sends text bodies only).
fn upload(port: u16, bytes: &[u8]) -> Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST /v1/media?filename=dot.png HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \
         {TOKEN}\r\nContent-Type: image/png\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        bytes.len()
    )
    .unwrap();
    s.write_all(bytes).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");
    let body: Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
    body["id"].clone()
}
