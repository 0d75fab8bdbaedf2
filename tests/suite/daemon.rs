//! The real `herald serve` process: systemd notifications and the watchdog,
//! a SIGTERM drain mid-run, and a SIGKILL crash mid-run, each followed by a
//! restart on the same data directory.
//!
//! Each test has its own temporary data dir and control port. The daemon's
//! stderr goes to a file in the data dir and is printed when a test fails.

use chrono::{Timelike, Utc};
use herald::store::SqlStore;
use herald_actors::delivery::outcome::message_id;
use herald_actors::domain::{AccountId, RunId, RunStatus, RunTarget, TargetStatus};
use herald_actors::ports::RunStore;
use std::collections::HashMap;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const GROUPS: usize = 60;

use crate::common::daemon as harness;
use crate::common::fan_out;
use harness::{Daemon, DRAIN_GRACE_SECS};

/// The `NOTIFY_SOCKET` end: what systemd would receive.
struct NotifySocket {
    sock: UnixDatagram,
    path: PathBuf,
}

impl NotifySocket {
    fn bind(dir: &Path) -> Self {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Self { sock, path }
    }

    /// One datagram's lines (e.g. `READY=1`, `STATUS=…`), or `None` on timeout.
    fn recv(&self) -> Option<Vec<String>> {
        let mut buf = [0u8; 4096];
        let n = self.sock.recv(&mut buf).ok()?;
        Some(
            String::from_utf8_lossy(&buf[..n])
                .lines()
                .map(str::to_owned)
                .collect(),
        )
    }

    /// Waits for a datagram carrying `line`, returning the datagrams seen
    /// before it.
    fn wait_for(&self, line: &str, within: Duration, d: &mut Daemon) -> Vec<Vec<String>> {
        let deadline = Instant::now() + within;
        let mut before = Vec::new();
        loop {
            match self.recv() {
                Some(msg) if msg.iter().any(|l| l == line) => return before,
                Some(msg) => before.push(msg),
                None => {}
            }
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!("herald exited with {status} before {line}\n{}", d.logs());
            }
            assert!(
                Instant::now() < deadline,
                "no {line} within {within:?} (got {before:?})\n{}",
                d.logs()
            );
        }
    }
}

#[test]
fn sd_notify_ready_after_the_port_answers_watchdog_while_healthy_stopping_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let notify = NotifySocket::bind(dir.path());
    let mut d = Daemon::start(
        dir.path(),
        &[
            ("NOTIFY_SOCKET", notify.path.display().to_string()),
            ("WATCHDOG_USEC", "200000".into()),
        ],
    );

    let before_ready = notify.wait_for("READY=1", Duration::from_secs(60), &mut d);
    // READY=1 promises a working daemon: the port answers at once, the
    // database answers (/healthz) and the daemon takes work (/readyz).
    assert_eq!(d.get("/healthz").map(|r| r.0), Some(200), "{}", d.logs());
    assert_eq!(d.get("/readyz").map(|r| r.0), Some(200));
    // The watchdog only starts once start-up is complete, as systemd expects.
    assert!(
        before_ready.is_empty(),
        "notifications before READY=1: {before_ready:?}"
    );

    // WATCHDOG_USEC=200 ms: a ping every ~100 ms while healthy.
    let until = Instant::now() + Duration::from_secs(2);
    let mut pings = Vec::new();
    while Instant::now() < until {
        if let Some(msg) = notify.recv() {
            if msg.iter().any(|l| l == "WATCHDOG=1") {
                pings.push(Instant::now());
            }
        }
    }
    assert!(
        pings.len() >= 3,
        "only {} WATCHDOG=1 in 2 s\n{}",
        pings.len(),
        d.logs()
    );

    // /metrics is served open on the same port, in the OpenMetrics format.
    let (status, body) = d.get("/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    assert!(body.contains("\nherald_ready 1\n"), "{body}");
    // No wait for a database connection past the threshold on an idle daemon.
    assert!(
        body.contains("\nherald_db_slow_acquires_total 0\n"),
        "{body}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");

    d.term();
    notify.wait_for("STOPPING=1", Duration::from_secs(10), &mut d);
    let status = d.wait_exit(Duration::from_secs(DRAIN_GRACE_SECS + 10));
    assert_eq!(status.code(), Some(0), "{}", d.logs());
    assert!(d.logs().contains("stopped cleanly"), "{}", d.logs());
}

// ------------------------------------------------------------ a fan-out

/// The database the daemon will open, from the test's side. Seeding goes
/// through the real store (the /v1 API is not there yet); reading while the
/// daemon runs is safe: SQLite is in WAL mode and both sides use a busy
/// timeout.
struct Db {
    rt: tokio::runtime::Runtime,
    store: SqlStore,
    dir: std::path::PathBuf,
}

impl Db {
    fn open(dir: &Path) -> Db {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let url = format!("sqlite://{}", dir.join("herald.db").display());
        let store = rt.block_on(SqlStore::connect(&url)).unwrap();
        Db {
            rt,
            store,
            dir: dir.to_path_buf(),
        }
    }

    fn targets(&self, run: RunId) -> Vec<RunTarget> {
        self.rt
            .block_on(self.store.list_targets(run, None, None, u32::MAX))
            .unwrap()
    }

    fn run_status(&self, run: RunId) -> RunStatus {
        self.rt
            .block_on(self.store.get_run(run))
            .unwrap()
            .unwrap()
            .status
    }

    /// Closes the pool and waits until SQLite has folded its WAL back into
    /// the database: a connection's last close happens on sqlx's worker
    /// thread, so without the wait a snapshot taken next can race it.
    fn close(self) {
        let wal = self.dir.join("herald.db-wal");
        self.rt.block_on(self.store.close());
        drop(self.store);
        drop(self.rt);
        let deadline = Instant::now() + Duration::from_secs(10);
        while wal.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A simulated, connected account sending 600 messages a minute, a
/// one-part reminder to GROUPS groups with an all-day UTC window, and a
/// queued run of it: what the scheduler leaves behind when it fires. The
/// daemon's start-up hands queued runs to their account.
///
/// One part per group keeps the before/after comparison exact: a target
/// left `sending` is re-sent with the very id recorded on its row.
fn seed_fan_out(dir: &Path) -> RunId {
    avoid_midnight_utc();
    let db = Db::open(dir);
    let account = AccountId::parse("sim-1").unwrap();
    let run = db.rt.block_on(async {
        let reminder =
            fan_out::seed_reminder(&db.store, &account, 600, GROUPS, "restart drill").await;
        fan_out::queue_run(&db.store, reminder, &account).await
    });
    db.close();
    run
}

/// An all-day UTC window still closes at midnight; a run that straddles it
/// would end partial and make the test flaky once a day.
fn avoid_midnight_utc() {
    let now = Utc::now();
    let left = 86_400 - i64::from(now.num_seconds_from_midnight());
    if left < 120 {
        std::thread::sleep(Duration::from_secs(left as u64 + 1));
    }
}

/// Polls until at least `n` targets are sent, while the daemon runs.
fn wait_sent(db: &Db, run: RunId, n: usize, d: &mut Daemon) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sent = db
            .targets(run)
            .iter()
            .filter(|t| t.status == TargetStatus::Sent)
            .count();
        if sent >= n {
            return;
        }
        if let Some(status) = d.child.try_wait().unwrap() {
            panic!("herald exited with {status} mid-run\n{}", d.logs());
        }
        assert!(
            Instant::now() < deadline,
            "only {sent} of {n} sent after 60 s\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls until the run has a final status.
fn wait_final(db: &Db, run: RunId, d: &mut Daemon) -> RunStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = db.run_status(run);
        if status.is_final() {
            return status;
        }
        if let Some(exit) = d.child.try_wait().unwrap() {
            panic!("herald exited with {exit} mid-run\n{}", d.logs());
        }
        assert!(
            Instant::now() < deadline,
            "run still {status} after 60 s\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the database can prove about delivery across two processes.
///
/// The engine commits a `sending` mark (which bumps `attempts` and records
/// the message id) before every gateway call, so `attempts` bounds from
/// above how many sends a target ever got, and an unchanged row means the
/// second process never called the gateway for it. For the parts left
/// `sending` when the first process stopped, the database shows the
/// precondition for the gateway to deduplicate: they are re-sent exactly
/// once more, with the same message id. Whether the group then received
/// the message once is read from the simulator's journal
/// (`assert_simulator_delivered_each_group_once`).
fn assert_each_target_sent_once(run: RunId, before: &[RunTarget], after: &[RunTarget]) {
    assert_eq!(after.len(), GROUPS);
    let count = |s: TargetStatus| before.iter().filter(|t| t.status == s).count();
    eprintln!(
        "at the stop: {} sent, {} sending, {} pending",
        count(TargetStatus::Sent),
        count(TargetStatus::Sending),
        count(TargetStatus::Pending)
    );
    let before: HashMap<i64, &RunTarget> = before.iter().map(|t| (t.id, t)).collect();
    for t in after {
        let want_id = message_id(run, &t.group, 0);
        assert_eq!(t.status, TargetStatus::Sent, "{t:?}");
        assert_eq!(t.parts_sent, 1, "{t:?}");
        assert_eq!(t.message_id.as_deref(), Some(want_id.as_str()), "{t:?}");
        assert!(t.error.is_none() && t.sent_at.is_some(), "{t:?}");
        match before.get(&t.id) {
            // Sent by the first process: the second left it untouched.
            Some(b) if b.status == TargetStatus::Sent => assert_eq!(*b, t, "re-sent"),
            // Marked but unconfirmed: one more send, with the same id.
            Some(b) if b.status == TargetStatus::Sending => {
                assert_eq!(b.message_id, t.message_id, "{b:?} -> {t:?}");
                assert_eq!(t.attempts, b.attempts + 1, "{b:?} -> {t:?}");
            }
            // Never marked before the stop: exactly one send now.
            Some(b) => {
                assert_eq!(b.status, TargetStatus::Pending, "{b:?}");
                assert_eq!(t.attempts, 1, "{t:?}");
            }
            None => assert_eq!(t.attempts, 1, "{t:?}"),
        }
    }
}

#[test]
fn sigterm_mid_run_drains_exits_0_and_the_restart_finishes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = seed_fan_out(dir.path());
    let mut d = Daemon::start(dir.path(), &[]);
    d.wait_healthy(Duration::from_secs(60));
    let db = Db::open(dir.path());
    wait_sent(&db, run, 10, &mut d);

    let asked = Instant::now();
    d.term();
    let status = d.wait_exit(Duration::from_secs(DRAIN_GRACE_SECS + 10));
    let took = asked.elapsed();
    assert_eq!(status.code(), Some(0), "{}", d.logs());
    assert!(
        took < Duration::from_secs(DRAIN_GRACE_SECS),
        "drain took {took:?}, past the {DRAIN_GRACE_SECS} s grace\n{}",
        d.logs()
    );

    let before = db.targets(run);
    let sent = before
        .iter()
        .filter(|t| t.status == TargetStatus::Sent)
        .count();
    assert!(
        sent < GROUPS,
        "the run finished before SIGTERM; nothing was interrupted"
    );
    // Drained, not ended: the run stays resumable.
    assert!(!db.run_status(run).is_final(), "{:?}", db.run_status(run));

    restart_and_finish(dir.path(), &db, run, &before);
    db.close();
}

#[test]
fn sigkill_mid_run_then_restart_resends_sending_parts_with_the_same_message_id() {
    let dir = tempfile::tempdir().unwrap();
    let run = seed_fan_out(dir.path());
    let mut d = Daemon::start(dir.path(), &[]);
    d.wait_healthy(Duration::from_secs(60));
    let db = Db::open(dir.path());
    wait_sent(&db, run, 10, &mut d);

    d.kill9();
    let before = db.targets(run);
    let sending: Vec<&RunTarget> = before
        .iter()
        .filter(|t| t.status == TargetStatus::Sending)
        .collect();
    assert!(
        before.iter().any(|t| t.status != TargetStatus::Sent),
        "the run finished before SIGKILL; nothing was interrupted"
    );
    // With 3 groups in flight the crash leaves parts marked but not
    // confirmed: the case this test is about.
    assert!(!sending.is_empty(), "no target left sending: {before:?}");
    for t in &sending {
        assert_eq!(
            t.message_id.as_deref(),
            Some(message_id(run, &t.group, t.parts_sent).as_str()),
            "{t:?}"
        );
    }

    restart_and_finish(dir.path(), &db, run, &before);
    db.close();
}

/// The simulated WhatsApp's own journal (it survives the crash, as the real
/// servers' memory does): every target group received the reminder exactly
/// once — none lost, none doubled — even though parts left `sending` by the
/// SIGKILL were sent again after the restart (deduplicated by message id).
fn assert_simulator_delivered_each_group_once(data_dir: &Path, targets: &[RunTarget]) {
    let log =
        herald_actors::simulator::read_journal(&data_dir.join("simulator").join("journal.jsonl"))
            .unwrap();
    let mut per_group: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for d in &log {
        *per_group.entry(d.group.as_str()).or_default() += 1;
    }
    for t in targets {
        assert_eq!(
            per_group.get(t.group.as_str()),
            Some(&1),
            "{} in the simulator's log: {per_group:?}",
            t.group
        );
    }
    assert_eq!(
        log.len(),
        targets.len(),
        "no delivery outside the run's targets"
    );
}

/// The second life of a stopped daemon: it finishes the run, every target
/// was sent once (database and simulator journal agree), and it stops cleanly.
fn restart_and_finish(dir: &Path, db: &Db, run: RunId, before: &[RunTarget]) {
    let mut d = Daemon::start(dir, &[]);
    d.wait_healthy(Duration::from_secs(60));
    assert_eq!(
        wait_final(db, run, &mut d),
        RunStatus::Success,
        "{}",
        d.logs()
    );
    assert_each_target_sent_once(run, before, &db.targets(run));
    assert_simulator_delivered_each_group_once(dir, &db.targets(run));
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(DRAIN_GRACE_SECS + 10))
            .code(),
        Some(0)
    );
}

/// The whole data dir as (relative path, sha256 of the bytes), to show a
/// refused start changed nothing.
fn dir_contents(dir: &Path) -> Vec<(PathBuf, String)> {
    use sha2::Digest;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_none_or(|x| x != "log") {
                let digest = sha2::Sha256::digest(std::fs::read(&p).unwrap());
                out.push((p.strip_prefix(dir).unwrap().into(), hex::encode(digest)));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_token_file_that_yields_no_token_stops_start_up_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    seed_fan_out(dir.path());
    let token_file = dir.path().join("empty.token");
    std::fs::write(&token_file, "\n").unwrap();
    let before = dir_contents(dir.path());
    let mut d = Daemon::start(
        dir.path(),
        &[(
            "HERALD_CONTROL__TOKEN_FILE",
            token_file.display().to_string(),
        )],
    );
    let status = d.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(78), "{}", d.logs());
    assert!(
        d.logs().contains("invalid setting control.token_file: ")
            && d.logs().contains("yields no token"),
        "{}",
        d.logs()
    );
    assert!(d.get("/healthz").is_none(), "the port must not be served");
    assert_eq!(dir_contents(dir.path()), before);
}

/// `herald …` as a user runs it, against the daemon on `port` with the
/// data dir (and so the generated token) of `dir`.
fn cli(dir: &Path, port: u16, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") || k.starts_with("BOT_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HERALD_STORAGE__DATA_DIR", dir)
        .env("HERALD_CONTROL__LISTEN", format!("127.0.0.1:{port}"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_first_start_generates_a_0600_token_the_cli_reads_with_no_flags() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), &[]);
    d.wait_healthy(Duration::from_secs(60));
    let file = dir.path().join("control.token");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(d.get("/v1/accounts").unwrap().0, 401);

    let out = cli(dir.path(), d.port, &["accounts", "add", "cli-1"]);
    assert!(out.status.success(), "{out:?}");
    let out = cli(dir.path(), d.port, &["--json", "accounts", "list"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("cli-1"));
    let out = cli(
        dir.path(),
        d.port,
        &["--token", "wrong", "accounts", "list"],
    );
    assert_eq!(out.status.code(), Some(6), "{out:?}");

    // A restart keeps the token.
    let token = std::fs::read_to_string(&file).unwrap();
    d.term();
    assert!(d.wait_exit(Duration::from_secs(30)).success());
    let mut d = Daemon::start(dir.path(), &[]);
    d.wait_healthy(Duration::from_secs(60));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), token);
    assert!(cli(dir.path(), d.port, &["accounts", "list"])
        .status
        .success());
    d.term();
    d.wait_exit(Duration::from_secs(30));
}

#[test]
fn the_cli_adds_a_user_whose_role_is_enforced_and_reads_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), &[]);
    d.wait_healthy(Duration::from_secs(60));
    let out = cli(
        dir.path(),
        d.port,
        &["users", "add", "vera", "--role", "viewer"],
    );
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        token.starts_with("hrld_"),
        "the token alone on stdout: {out:?}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("shown only this once"));

    let as_vera = |args: &[&str]| {
        let mut all = vec!["--token", token.as_str()];
        all.extend_from_slice(args);
        cli(dir.path(), d.port, &all)
    };
    assert!(as_vera(&["accounts", "list"]).status.success());
    let out = as_vera(&["accounts", "add", "not-hers"]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs the admin role"), "{err}");

    let out = cli(dir.path(), d.port, &["users", "list"]);
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(list.contains("vera") && list.contains("viewer"), "{list}");
    assert!(!list.contains(&token));

    let out = cli(dir.path(), d.port, &["--json", "audit", "--actor", "vera"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{v}");
    assert_eq!(items[0]["operation"], "createAccount");
    assert_eq!(items[0]["status"], 403);
    let out = cli(dir.path(), d.port, &["audit"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("createUser"), "{table}");

    let id = v["items"][0]["actor_id"].to_string();
    assert!(cli(dir.path(), d.port, &["users", "revoke", &id])
        .status
        .success());
    assert_eq!(as_vera(&["accounts", "list"]).status.code(), Some(6));
    d.term();
    d.wait_exit(Duration::from_secs(30));
}

#[test]
fn reminders_create_takes_targets_from_a_csv_of_names_and_refuses_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), &[]);
    d.wait_healthy(Duration::from_secs(60));
    let out = cli(dir.path(), d.port, &["accounts", "add", "sales-1"]);
    assert!(out.status.success(), "{out:?}");
    let spec = dir.path().join("r.json");
    std::fs::write(
        &spec,
        // All day: the run below is fired now, whatever the hour, and
        // the default 06–18 window would park it outside those hours.
        r#"{"account_id": "sales-1", "title": "Standup", "timezone": "UTC",
            "schedule": {"at": "2099-01-05T09:00"},
            "window": {"start_hour": 0, "end_hour": 24},
            "parts": [{"kind": "text", "text": "hi"}]}"#,
    )
    .unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "name\nGroup 0001\nNo such group\n").unwrap();
    let out = cli(
        dir.path(),
        d.port,
        &[
            "reminders",
            "create",
            "--file",
            spec.to_str().unwrap(),
            "--targets-csv",
            bad.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"No such group\" names no group"), "{err}");
    let out = cli(dir.path(), d.port, &["--json", "reminders", "list"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("Standup"),
        "a refused import created a reminder"
    );

    let good = dir.path().join("good.csv");
    std::fs::write(
        &good,
        "name\nGroup 0001\n\"group 0002\",notes\n120363000000000003@g.us\n",
    )
    .unwrap();
    let out = cli(
        dir.path(),
        d.port,
        &[
            "--json",
            "reminders",
            "create",
            "--file",
            spec.to_str().unwrap(),
            "--targets-csv",
            good.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["targets"],
        serde_json::json!([
            "120363000000000001@g.us",
            "120363000000000002@g.us",
            "120363000000000003@g.us"
        ])
    );

    // Its run's groups read by name, as they were picked, JID beside.
    let rid = v["id"].as_i64().unwrap().to_string();
    let out = cli(dir.path(), d.port, &["--json", "reminders", "fire", &rid]);
    assert!(out.status.success(), "{out:?}");
    let fired: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = fired["run_id"].as_i64().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let table = loop {
        let out = cli(dir.path(), d.port, &["runs", "targets", &run]);
        assert!(out.status.success(), "{out:?}");
        let table = String::from_utf8_lossy(&out.stdout).into_owned();
        if table.lines().count() > 3 {
            break table;
        }
        assert!(Instant::now() < deadline, "no targets: {table}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(table.lines().next().unwrap().contains("NAME"), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains("120363000000000002@g.us"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("Group 0002"), "{table}");
    // The same groups as CSV for a spreadsheet: a byte-order mark, a header,
    // a row a group, CRLF.
    let out = cli(dir.path(), d.port, &["runs", "targets", &run, "--csv"]);
    assert!(out.status.success(), "{out:?}");
    let csv = String::from_utf8(out.stdout).unwrap();
    let csv = csv.strip_prefix('\u{feff}').expect("a byte-order mark");
    let lines: Vec<&str> = csv.split_terminator("\r\n").collect();
    assert!(lines[0].starts_with("position,group,group_name,"), "{csv}");
    assert_eq!(lines.len(), 1 + 3, "{csv}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("120363000000000002@g.us,Group 0002,")),
        "{csv}"
    );
    // `runs list` names the run by its reminder, the id beside it.
    let out = cli(dir.path(), d.port, &["runs", "list"]);
    assert!(out.status.success(), "{out:?}");
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(list.contains(&format!("({rid})")), "{list}");

    // Corrected, then taken back, from the command line: each follows its
    // progress to the end, and `runs show` says where it stands.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(&cli(dir.path(), d.port, &["runs", "show", &run]).stdout)
        .contains("success")
    {
        assert!(Instant::now() < deadline, "the run did not finish");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = cli(
        dir.path(),
        d.port,
        &["runs", "edit", &run, "--caption", "x"],
    );
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("caption"), "the field is named: {err}");
    let out = cli(
        dir.path(),
        d.port,
        &[
            "runs",
            "edit",
            &run,
            "--text",
            "Standup moved to 10:30",
            "--wait",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("edit: 3 of 3 groups edited (finished)"),
        "{err}"
    );
    let out = cli(dir.path(), d.port, &["runs", "recall", &run, "--wait"]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("recall: 3 of 3 groups recalled (finished)"),
        "{err}"
    );
    let out = cli(dir.path(), d.port, &["runs", "show", &run]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("recall: 3 of 3 groups recalled (finished)"),
        "{shown}"
    );
    let out = cli(dir.path(), d.port, &["runs", "retry", &run]);
    assert!(
        !out.status.success(),
        "a recalled run is not retried: {out:?}"
    );
    d.term();
    d.wait_exit(Duration::from_secs(30));
}

/// SQLite takes one daemon: a second one on the same database file stops
/// at start-up, saying which process holds it, and never serves; once the
/// first has exited, the file is free again.
#[test]
fn a_second_daemon_on_the_same_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Daemon::start(dir.path(), &[]);
    first.wait_healthy(Duration::from_secs(30));
    let mut second = Daemon::start(dir.path(), &[]);
    let status = second.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(75), "{}", second.logs());
    let pid = first.child.id().to_string();
    assert!(
        second.logs().contains(&format!(
            "another Herald daemon (pid {pid}) is using the SQLite database"
        )) && second.logs().contains("one daemon per database"),
        "{}",
        second.logs()
    );
    assert!(
        second.get("/healthz").is_none(),
        "the second must not serve"
    );
    assert_eq!(first.get("/healthz").map(|r| r.0), Some(200));
    first.term();
    assert!(first.wait_exit(Duration::from_secs(30)).success());
    let mut third = Daemon::start(dir.path(), &[]);
    third.wait_healthy(Duration::from_secs(30));
    third.term();
    assert!(third.wait_exit(Duration::from_secs(30)).success());
}

/// The same on PostgreSQL: without leases (cluster.enabled), a second
/// daemon on the database stops at start-up instead of sending every run a
/// second time, and so does a daemon of a cluster. Needs `HERALD_TEST_POSTGRES_URL`.
#[test]
fn a_second_daemon_on_the_same_postgres_database_is_refused() {
    let Ok(base) = std::env::var("HERALD_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var("HERALD_REQUIRE_POSTGRES").is_err(),
            "HERALD_REQUIRE_POSTGRES=1 but HERALD_TEST_POSTGRES_URL is not set"
        );
        eprintln!(
            "SKIPPED: a_second_daemon_on_the_same_postgres_database_is_refused: set \
             HERALD_TEST_POSTGRES_URL to run it"
        );
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let scratch = rt
        .block_on(herald::bench::ScratchDb::create(&base))
        .unwrap();
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Daemons of one database share its session key file.
    let key_file = one.path().join("session.key");
    let db = [
        ("HERALD_STORAGE__DATABASE_URL", scratch.url.clone()),
        (
            "HERALD_WHATSAPP__SESSION_KEY_FILE",
            key_file.display().to_string(),
        ),
    ];
    let mut first = Daemon::start(one.path(), &db);
    first.wait_healthy(Duration::from_secs(30));
    let mut second = Daemon::start(two.path(), &db);
    let status = second.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(75), "{}", second.logs());
    assert!(
        second
            .logs()
            .contains("another Herald daemon is using this PostgreSQL database"),
        "{}",
        second.logs()
    );
    // A daemon of a cluster does not start beside a lone one either.
    let mut clustered = Daemon::start(
        two.path(),
        &[
            db[0].clone(),
            db[1].clone(),
            ("HERALD_CLUSTER__ENABLED", "true".into()),
            ("HERALD_CLUSTER__NODE_ID", "n1".into()),
        ],
    );
    let status = clustered.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(75), "{}", clustered.logs());
    assert!(
        clustered
            .logs()
            .contains("a Herald daemon without cluster.enabled is using this PostgreSQL"),
        "{}",
        clustered.logs()
    );
    first.term();
    assert!(first.wait_exit(Duration::from_secs(30)).success());
    let mut third = Daemon::start(two.path(), &db);
    third.wait_healthy(Duration::from_secs(30));
    third.term();
    assert!(third.wait_exit(Duration::from_secs(30)).success());
    // The same database with another key file: refused naming both keys,
    // though nothing is sealed.
    another_key_file_is_refused(two.path(), &db[0], &key_file);
    rt.block_on(scratch.cleanup()).unwrap();
}

/// Starts a daemon on `dir` with the database `db` and a key file of its
/// own: it stops at start-up naming the database's key (the one in
/// `recorded`) and its own, and saying nothing is sealed yet.
fn another_key_file_is_refused(dir: &Path, db: &(&str, String), recorded: &Path) {
    let own = dir.join("own.key");
    let ours = herald::seal::SessionKey::create(&own).unwrap();
    let theirs = herald::seal::SessionKey::load(recorded).unwrap().unwrap();
    let mut d = Daemon::start(
        dir,
        &[
            db.clone(),
            (
                "HERALD_WHATSAPP__SESSION_KEY_FILE",
                own.display().to_string(),
            ),
        ],
    );
    let status = d.wait_exit(Duration::from_secs(30));
    let logs = d.logs();
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains(&ours.id())
            && logs.contains(&theirs.id())
            && logs.contains("own.key")
            && logs.contains("nothing is sealed"),
        "{logs}"
    );
}

/// Two starts on one SQLite database with different key files: the first
/// records its key's id before anything is sealed, the second stops naming
/// both ids (a new key no longer takes over quietly).
#[test]
fn a_start_with_another_key_file_is_refused_before_anything_is_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("herald.db").display());
    let db = ("HERALD_STORAGE__DATABASE_URL", url);
    let mut first = Daemon::start(dir.path(), std::slice::from_ref(&db));
    first.wait_healthy(Duration::from_secs(60));
    first.term();
    assert!(first.wait_exit(Duration::from_secs(30)).success());
    another_key_file_is_refused(dir.path(), &db, &dir.path().join("session.key"));
}

/// One request as a browser sends it: a form body and a cookie, no token.
/// Answers (status, head).
fn browser_request(
    port: u16,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: &str,
) -> (u16, String) {
    let mut headers = vec!["Content-Type: application/x-www-form-urlencoded".to_owned()];
    headers.extend(cookie.map(|c| format!("Cookie: herald_session={c}")));
    let (status, head, _) = harness::request(port, method, path, &headers, form)
        .unwrap_or_else(|| panic!("{method} {path}: no answer"));
    (status, head)
}

/// A console sign-in outlives a restart of the daemon: the session is in
/// the database (as its hash), not in the process.
#[test]
fn a_console_session_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), &[]);
    d.wait_healthy(Duration::from_secs(60));
    let token = std::fs::read_to_string(dir.path().join("control.token")).unwrap();
    let (status, head) = browser_request(
        d.port,
        "POST",
        "/sign-in",
        None,
        &format!("token={}", token.trim()),
    );
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie: herald_session=")
                .then(|| l["set-cookie: herald_session=".len()..].to_owned())
        })
        .and_then(|v| v.split(';').next().map(str::to_owned))
        .unwrap_or_else(|| panic!("no session cookie: {head}"));
    let overview = |port| browser_request(port, "GET", "/", Some(&cookie), "").0;
    assert_eq!(overview(d.port), 200, "signed in");

    d.term();
    assert!(d.wait_exit(Duration::from_secs(30)).success());
    let mut d = Daemon::start(dir.path(), &[]);
    d.wait_healthy(Duration::from_secs(60));
    assert_eq!(overview(d.port), 200, "still signed in after the restart");
    assert_eq!(
        browser_request(d.port, "GET", "/", Some("not-a-session"), "").0,
        303,
        "a made-up cookie still goes to sign-in"
    );
    d.term();
    d.wait_exit(Duration::from_secs(30));
}

/// A poll from the command line against a real daemon (SQLite file,
/// simulated WhatsApp whose members vote): a bad poll is refused naming its
/// field; a good one goes to every group; `runs poll` answers per option
/// over all groups and per group, as a table, JSON and CSV, with each
/// group's voters those who voted and did not withdraw; an edit of the run
/// corrects its text and says the poll was left as sent.
#[test]
fn a_poll_from_the_command_line_is_answered_per_option_and_per_group() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("HERALD_SIMULATOR__VOTE_SHARE", "1".to_owned()),
        ("HERALD_SIMULATOR__VOTE_AFTER_SECS", "1".to_owned()),
        ("HERALD_SIMULATOR__VOTE_AGAIN_AFTER_SECS", "1".to_owned()),
    ];
    let mut d = Daemon::start(dir.path(), &env);
    d.wait_healthy(Duration::from_secs(60));
    let ok = |args: &[&str]| {
        let out = cli(dir.path(), d.port, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    ok(&["accounts", "add", "club"]);
    let targets: Vec<String> = (1..=3)
        .map(|i| format!("1203630000000000{i:02}@g.us"))
        .collect();
    let body = |options: &str| {
        format!(
            r#"{{"account_id": "club", "title": "Training", "timezone": "UTC",
                "schedule": {{"at": "2099-01-05T09:00"}},
                "window": {{"start_hour": 0, "end_hour": 24}},
                "parts": [{{"kind": "text", "text": "Training on Saturday"}},
                          {{"kind": "poll", "question": "Who drives, {{group_name}}?",
                            "options": {options}}}],
                "targets": {}}}"#,
            serde_json::to_string(&targets).unwrap()
        )
    };
    let spec = dir.path().join("poll.json");
    std::fs::write(&spec, body(r#"["Me", "Not me", "Me"]"#)).unwrap();
    let out = cli(
        dir.path(),
        d.port,
        &["reminders", "create", "--file", spec.to_str().unwrap()],
    );
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("parts[1].options[2]"),
        "the field is named: {err}"
    );
    assert!(err.contains("options[0]"), "and the rule: {err}");

    std::fs::write(&spec, body(r#"["Me", "Not me", "Maybe"]"#)).unwrap();
    let created: serde_json::Value = serde_json::from_str(&ok(&[
        "--json",
        "reminders",
        "create",
        "--file",
        spec.to_str().unwrap(),
    ]))
    .unwrap();
    let rid = created["id"].as_i64().unwrap().to_string();
    let fired: serde_json::Value =
        serde_json::from_str(&ok(&["--json", "reminders", "fire", &rid])).unwrap();
    let run = fired["run_id"].as_i64().unwrap().to_string();

    // Every member votes; every third votes again, every seventh of the
    // others withdraws (the simulator's documented plan).
    let want_voters = |g: &str| {
        let jid = herald_actors::domain::GroupJid::parse(g).unwrap();
        let others = herald_actors::simulator::sim_participants(&jid) - 1;
        (0..others).filter(|i| i % 3 == 0 || i % 7 != 1).count() as u64
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&["--json", "runs", "poll", &run])).unwrap();
        let settled = v["groups"].as_array().is_some_and(|gs| {
            gs.len() == 3
                && gs.iter().all(|g| {
                    g["voters"].as_u64() == Some(want_voters(g["group"].as_str().unwrap()))
                })
        });
        if settled {
            break v;
        }
        assert!(Instant::now() < deadline, "the votes did not settle: {v}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let poll = &answer["polls"][0];
    assert_eq!(poll["part"], 1);
    assert_eq!(poll["question"], "Who drives, {group_name}?");
    assert_eq!(poll["groups_voted"], 3);
    let groups = answer["groups"].as_array().unwrap();
    let total: u64 = groups.iter().map(|g| g["voters"].as_u64().unwrap()).sum();
    assert_eq!(poll["voters"].as_u64(), Some(total));
    for i in 0..3 {
        let per_group: u64 = groups
            .iter()
            .map(|g| g["options"][i]["votes"].as_u64().unwrap())
            .sum();
        assert_eq!(
            poll["options"][i]["votes"].as_u64(),
            Some(per_group),
            "option {i}"
        );
    }
    // One choice each: the options' votes add up to the voters.
    for g in groups {
        let sum: u64 = (0..3)
            .map(|i| g["options"][i]["votes"].as_u64().unwrap())
            .sum();
        assert_eq!(Some(sum), g["voters"].as_u64(), "{g}");
    }

    let table = ok(&["runs", "poll", &run]);
    assert!(table.contains("Who drives, {group_name}?"), "{table}");
    assert!(
        table.contains("Not me") && table.contains("VOTES"),
        "{table}"
    );
    let csv = ok(&["runs", "poll", &run, "--csv"]);
    let csv = csv.strip_prefix('\u{feff}').expect("a byte-order mark");
    let lines: Vec<&str> = csv.split_terminator("\r\n").collect();
    assert_eq!(
        lines[0], "position,group,group_name,voters,Me,Not me,Maybe",
        "{csv}"
    );
    assert_eq!(lines.len(), 1 + 3, "{csv}");
    let out = cli(dir.path(), d.port, &["runs", "poll", &run, "--part", "0"]);
    assert!(!out.status.success(), "part 0 is text: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("part"),
        "{out:?}"
    );

    // The text corrected; the poll left as it was, and said so.
    let edited: serde_json::Value = serde_json::from_str(&ok(&[
        "--json",
        "runs",
        "edit",
        &run,
        "--text",
        "Training on Sunday",
    ]))
    .unwrap();
    assert_eq!(
        edited["amendment"]["left_as_sent"],
        serde_json::json!(["parts[1]"]),
        "{edited}"
    );
    d.term();
    d.wait_exit(Duration::from_secs(30));
}
