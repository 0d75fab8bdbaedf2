//! A daemon that crashed comes back by itself, as a supervisor restarts
//! it: a cluster daemon SIGKILLed and started again at once with the same
//! node id waits its own dead registration out and serves again; a second
//! live daemon with a node id in use is still refused; every refusal at
//! start-up ends the process with its message and its exit code, never a
//! panic (the harness fails a test on any `panicked` a daemon prints); and
//! the shipped systemd unit's restart settings bring a crash-looping daemon
//! back every time. Needs `HERALD_TEST_POSTGRES_URL` for the cluster parts.

use crate::common::cluster;
use crate::common::daemon as harness;
use crate::common::fan_out;
use crate::common::postgres;

use cluster::Db;
use harness::{wait_until, Daemon, SimProcess};
use herald_actors::domain::AccountId;
use std::path::Path;
use std::time::{Duration, Instant};

const TOKEN: &str = "restart-test-token-0123456789abcdef";
/// `herald serve`'s codes (src/daemon.rs).
const EXIT_IN_USE: i32 = 75;
const EXIT_CONFIG: i32 = 78;

fn node(name: &str, dir: &Path, db: &Db, sim: &SimProcess, lease_secs: u64) -> Daemon {
    cluster::start_node(
        name,
        dir,
        db.url(),
        TOKEN,
        lease_secs,
        &[("HERALD_SIMULATOR__URL", sim.url())],
    )
}

fn seed(db: &Db, accounts: usize) -> Vec<AccountId> {
    db.rt.block_on(async {
        let mut out = Vec::new();
        for i in 1..=accounts {
            let id = AccountId::parse(&format!("acct-{i:02}")).unwrap();
            fan_out::seed_reminder(&db.store, &id, 60, 1, "restart drill").await;
            out.push(id);
        }
        out
    })
}

/// Polls `/readyz` until it answers 200: how long that took.
fn ready_within(d: &mut Daemon, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if let Some(status) = d.child.try_wait().unwrap() {
            panic!("herald exited with {status}\n{}", d.logs());
        }
        if matches!(d.get("/readyz"), Some((200, _))) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "/readyz not 200 within {within:?}\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sim(dir: &Path) -> SimProcess {
    SimProcess::start(
        &dir.join("sim"),
        &["--latency-min-ms", "1", "--latency-max-ms", "5"],
    )
}

#[test]
fn a_killed_daemon_started_again_at_once_serves_within_its_registrations_time_to_live() {
    let Some(base) = postgres::base("the restart test") else {
        return;
    };
    const LEASE: u64 = 3;
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::create(&base);
    seed(&db, 6);
    let sim = sim(tmp.path());
    let mut n1 = node("n1", tmp.path(), &db, &sim, LEASE);
    let mut n2 = node("n2", tmp.path(), &db, &sim, LEASE);
    let mut n3 = node("n3", tmp.path(), &db, &sim, LEASE);
    for d in [&mut n1, &mut n2, &mut n3] {
        d.wait_healthy(Duration::from_secs(60));
    }
    wait_until(
        Duration::from_secs(30),
        "every daemon holds accounts",
        &mut [&mut n1, &mut n2, &mut n3],
        || db.owners().len() == 3,
    );

    // SIGKILL n2 and start it again at once, as systemd or a container
    // runtime would: it waits its dead registration out, then serves.
    n2.kill9();
    let mut again = node("n2", tmp.path(), &db, &sim, LEASE);
    std::thread::sleep(Duration::from_millis(500));
    let (status, waiting) = again
        .get("/readyz")
        .expect("the port answers while waiting");
    assert_eq!(status, 503, "{waiting}");
    assert!(
        waiting.contains("node id \\\"n2\\\" is still registered by a previous run"),
        "{waiting}"
    );
    let took =
        ready_within(&mut again, Duration::from_secs(LEASE + 10)) + Duration::from_millis(500);
    eprintln!("restarted n2 served after {took:?} (lease {LEASE} s)");
    assert!(
        took <= Duration::from_secs(LEASE + 1),
        "ready {took:?} after the restart\n{}",
        again.logs()
    );
    assert!(again
        .logs()
        .contains("waiting for this node id's previous registration"));
    wait_until(
        Duration::from_secs(30),
        "n2 holds its share of accounts again",
        &mut [&mut n1, &mut again, &mut n3],
        || db.owners().get("n2").is_some_and(|a| a.len() == 2),
    );

    // A second live daemon with a node id in use: refused once the wait
    // shows the registration is renewed, with the error and its code.
    let dir = tmp.path().join("impostor");
    let mut impostor = Daemon::start(
        &dir,
        &[
            ("HERALD_STORAGE__DATABASE_URL", db.url().to_owned()),
            ("HERALD_CLUSTER__ENABLED", "true".into()),
            ("HERALD_CLUSTER__NODE_ID", "n1".into()),
            ("HERALD_CLUSTER__LEASE_SECS", LEASE.to_string()),
            ("HERALD_CONTROL__TOKEN", TOKEN.into()),
            (
                "HERALD_WHATSAPP__SESSION_KEY_FILE",
                tmp.path().join("session.key").display().to_string(),
            ),
            ("HERALD_SIMULATOR__URL", sim.url()),
        ],
    );
    let status = impostor.wait_exit(Duration::from_secs(2 * LEASE + 10));
    assert_eq!(status.code(), Some(EXIT_IN_USE), "{}", impostor.logs());
    assert!(
        impostor.logs().contains(
            "node id \"n1\" is in use by another running Herald daemon: its registration was \
             renewed while this daemon waited"
        ),
        "{}",
        impostor.logs()
    );
    assert!(
        n1.get("/readyz").is_some_and(|(s, _)| s == 200),
        "n1 untouched"
    );
    for d in [n1, again, n3] {
        d.stop();
    }
    db.drop_database();
}

/// Refusals at start-up, each with its message and code and no panic (the
/// harness checks every daemon's output): settings, a database that a
/// newer Herald migrated, SIGTERM while waiting to start, and a
/// PostgreSQL database that goes away under a running daemon. (A database
/// held by another daemon, and another key file, are refused in
/// tests/suite/daemon.rs.)
#[test]
fn every_refusal_ends_with_its_message_and_code_and_none_panics() {
    let dir = tempfile::tempdir().unwrap();
    // Bad settings: EX_CONFIG, before anything is opened.
    let mut d = Daemon::start(
        &dir.path().join("settings"),
        &[("HERALD_DELIVERY__MAX_PER_MINUTE", "0".into())],
    );
    assert_eq!(
        d.wait_exit(Duration::from_secs(20)).code(),
        Some(EXIT_CONFIG)
    );
    assert!(d
        .logs()
        .contains("invalid setting delivery.max_per_minute: must be 1–600"));
    drop(d);

    // The control port taken by another process: refused after the actors
    // started (this path panicked on its way out before: a query cut off
    // mid-flight dropped its pooled connection after the runtime).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    for _ in 0..3 {
        let mut d = Daemon::start(
            &dir.path().join("port"),
            &[("HERALD_CONTROL__LISTEN", format!("127.0.0.1:{port}"))],
        );
        assert_eq!(d.wait_exit(Duration::from_secs(20)).code(), Some(1));
        assert!(d.logs().contains("binding control port"), "{}", d.logs());
    }
    drop(taken);

    // A database a newer Herald migrated: refused, naming the migration.
    let newer = dir.path().join("newer");
    let mut d = Daemon::start(&newer, &[]);
    d.wait_healthy(Duration::from_secs(30));
    d.stop();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("sqlite://{}", newer.join("herald.db").display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (9999, 'from a newer Herald', 1, x'00', 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    });
    let mut d = Daemon::start(&newer, &[]);
    assert_eq!(d.wait_exit(Duration::from_secs(20)).code(), Some(1));
    assert!(d.logs().contains("migrat"), "{}", d.logs());
    drop(d);

    let Some(base) = postgres::base("the refusals on PostgreSQL") else {
        return;
    };
    // SIGTERM while a cluster daemon waits out its killed run's
    // registration: it stops at once, without a panic.
    let db = Db::create(&base);
    let sim = sim(dir.path());
    let mut first = node("n1", dir.path(), &db, &sim, 10);
    first.wait_healthy(Duration::from_secs(60));
    first.kill9();
    let mut waiting = node("n1", dir.path(), &db, &sim, 10);
    wait_until(
        Duration::from_secs(10),
        "the restarted daemon waits",
        &mut [],
        || {
            waiting
                .logs()
                .contains("waiting for this node id's previous registration")
        },
    );
    waiting.term();
    let stopped = Instant::now();
    waiting.wait_exit(Duration::from_secs(5));
    assert!(stopped.elapsed() < Duration::from_secs(5));
    drop(waiting);

    // The database goes away under a running daemon (dropped by force):
    // it reports it, and SIGTERM still ends it without a panic.
    let mut d = node("n1", dir.path(), &db, &sim, 10);
    // (It waits out the killed run's registration first.)
    ready_within(&mut d, Duration::from_secs(30));
    // Dropped WITH (FORCE): the daemon's connections are cut too.
    db.drop_database();
    wait_until(
        Duration::from_secs(20),
        "/healthz says the database is gone",
        &mut [],
        || matches!(d.get("/healthz"), Some((503, _))),
    );
    d.term();
    let status = d.wait_exit(Duration::from_secs(40));
    assert!(status.code().is_some(), "ended by itself: {status}");
}

/// What the shipped unit says systemd does on a failure.
struct Unit {
    restart_sec: u64,
    burst: usize,
    interval: Duration,
}

fn unit() -> Unit {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/herald.service"
    ))
    .unwrap();
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("deploy/herald.service has no {key}"))
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    assert!(text.contains("\nRestart=on-failure\n"));
    Unit {
        restart_sec: value("RestartSec"),
        burst: value("StartLimitBurst") as usize,
        interval: Duration::from_secs(value("StartLimitIntervalSec")),
    }
}

/// A faithful loop of the unit's restart settings (`Restart=on-failure`,
/// `RestartSec`, `StartLimitBurst` starts in `StartLimitIntervalSec`; no
/// systemd in a test container): three SIGKILLs `HERALD_CRASH_GAP_SECS`
/// apart (10 s here; 60 s shown in the note), each start counted, and the
/// daemon must be serving and holding its accounts again after each,
/// without hitting the start limit. Lease 15 s, the default.
#[test]
fn the_systemd_units_restart_settings_bring_a_crash_looping_daemon_back() {
    let Some(base) = postgres::base("the crash loop test") else {
        return;
    };
    let unit = unit();
    let gap = Duration::from_secs(
        std::env::var("HERALD_CRASH_GAP_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    const LEASE: u64 = 15;
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::create(&base);
    let accounts = seed(&db, 2);
    let sim = sim(tmp.path());
    let mut starts: Vec<Instant> = Vec::new();
    let start = |starts: &mut Vec<Instant>| {
        let now = Instant::now();
        starts.push(now);
        let recent = starts
            .iter()
            .filter(|t| now.duration_since(**t) < unit.interval)
            .count();
        assert!(
            recent <= unit.burst,
            "{recent} starts within {:?}: systemd would give up (StartLimitBurst={})",
            unit.interval,
            unit.burst
        );
        node("n1", tmp.path(), &db, &sim, LEASE)
    };
    let mut d = start(&mut starts);
    for kill in 1..=3 {
        // Running and holding its accounts.
        ready_within(&mut d, Duration::from_secs(LEASE + 30));
        wait_until(
            Duration::from_secs(30),
            "n1 holds every account",
            &mut [&mut d],
            || {
                db.owners()
                    .get("n1")
                    .is_some_and(|a| a.len() == accounts.len())
            },
        );
        std::thread::sleep(gap);
        d.kill9();
        // Restart=on-failure: a process ended by SIGKILL is restarted after
        // RestartSec; one that exits non-zero would be too, and counted.
        let mut status = None;
        loop {
            std::thread::sleep(Duration::from_secs(unit.restart_sec));
            d = start(&mut starts);
            if let Some(s) = harness::exited(&mut d.child, Duration::from_millis(300)) {
                status = Some(s);
                continue;
            }
            break;
        }
        assert!(
            status.is_none(),
            "kill {kill}: a start was refused ({status:?})"
        );
        let took = ready_within(&mut d, Duration::from_secs(LEASE + 30));
        eprintln!("kill {kill}: serving again {took:?} after the restart");
    }
    wait_until(
        Duration::from_secs(30),
        "n1 holds every account after the last restart",
        &mut [&mut d],
        || {
            db.owners()
                .get("n1")
                .is_some_and(|a| a.len() == accounts.len())
        },
    );
    assert_eq!(starts.len(), 4, "one start per crash, no refused ones");
    d.stop();
    db.drop_database();
}
