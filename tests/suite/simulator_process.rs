//! The shared simulated WhatsApp as its own process (`herald simulator
//! serve`) and its client, `RemoteSimulator`: the gateway contract over a
//! real port, lease fencing across clients, how failures of the link read,
//! and two real `herald serve` daemons (`simulator.url`) whose runs land in
//! the one journal exactly once per group.
//!
//! The contract runs against the real process, not an in-test server: it
//! needs no paused time (the process runs with zero latency and no rate
//! limit, and expiring uploads is an endpoint of the API).

use chrono::{Timelike, Utc};
use herald::gateway::remote_sim::RemoteSimulator;
use herald::store::SqlStore;
use herald_actors::domain::Fence;
use herald_actors::domain::{AccountId, GroupJid, RunId, RunStatus, TargetStatus};
use herald_actors::ports::{Gateway, GatewayError, OutgoingMessage, RunStore};
use herald_actors::simulator::{read_journal, Simulator};
use herald_actors::testkit::gateway_contract::{self, ContractSetup};
use std::collections::HashMap;

use std::path::Path;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::daemon as harness;
use crate::common::fan_out;
use harness::{herald, Daemon, SimProcess};

// ------------------------------------------------------------ the process

fn acct(s: &str) -> AccountId {
    AccountId::parse(s).unwrap()
}

fn text(s: &str) -> OutgoingMessage {
    OutgoingMessage::Text(s.to_owned())
}

/// Fresh accounts registered over HTTP.
struct RemoteSetup {
    sim: RemoteSimulator,
    next: AtomicUsize,
}

#[async_trait::async_trait]
impl ContractSetup for RemoteSetup {
    async fn account_with_groups(&self, n: usize) -> (AccountId, Vec<GroupJid>) {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let account = acct(&format!("contract-{i}"));
        let reg = self.sim.register(&account, n).await.unwrap();
        assert!(reg.created && reg.groups == n, "{reg:?}");
        (account, (0..n).map(Simulator::numbered_group).collect())
    }

    async fn expire_uploads(&self, account: &AccountId) -> bool {
        self.sim.expire_uploads(account).await.unwrap();
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_contract_holds_against_a_simulator_process_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let proc = SimProcess::start(
        dir.path(),
        &["--latency-max-ms", "0", "--rate-limit-per-minute", "0"],
    );
    let setup = RemoteSetup {
        sim: proc.client(),
        next: AtomicUsize::new(0),
    };
    gateway_contract::run_all(&setup.sim, &setup).await;

    // What the contract made is what the process delivered: 3 + 5 + 2 + 0
    // + 1 messages, none twice, in its journal on disk too.
    let log = setup.sim.deliveries(None).await.unwrap();
    assert_eq!(log.len(), 11, "{log:#?}");
    let health = setup.sim.health().await.unwrap();
    assert_eq!((health.delivered, health.duplicate_deliveries), (11, 0));
    let journal = read_journal(&proc.journal).unwrap();
    assert_eq!(journal, log, "the API's log is the journal's");
    // The second test's single upload fed its five groups.
    let second = acct("contract-1");
    let report = setup.sim.account(&second).await.unwrap();
    assert_eq!((report.uploads, report.delivered), (1, 5), "{report:?}");
    let mine: Vec<_> = log.iter().filter(|d| d.account == second).collect();
    assert!(mine.iter().all(|d| d.content_key == mine[0].content_key));
    // Registering a known account leaves it as it was.
    let again = setup.sim.register(&second, 50).await.unwrap();
    assert_eq!((again.created, again.groups), (false, 5));
    assert_eq!(setup.sim.list_groups(&second).await.unwrap().len(), 5);
    proc.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_send_through_the_remote_is_refused_once_a_newer_epoch_was_seen_or_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let proc = SimProcess::start(
        dir.path(),
        &["--latency-max-ms", "0", "--rate-limit-per-minute", "3"],
    );
    // Two daemons' clients of the one simulator.
    let (old_owner, new_owner) = (proc.client(), proc.client());
    let a = acct("leased");
    old_owner.register(&a, 4).await.unwrap();
    let g: Vec<GroupJid> = (0..4).map(Simulator::numbered_group).collect();
    let fence = |node: &str, epoch| Fence {
        account: a.clone(),
        node: node.into(),
        epoch,
    };
    let (n1, n2) = (fence("n1", 4), fence("n2", 5));
    let sent = old_owner
        .send_fenced(&a, &g[0], &text("hi"), "m0", Some(&n1))
        .await;
    assert!(sent.is_ok(), "{sent:?}");
    // The new owner claims the account before its first send; the old
    // owner wakes up late: refused, and nothing delivered.
    new_owner.claim_fence(&n2).await.unwrap();
    let late = old_owner
        .send_fenced(&a, &g[2], &text("hi"), "m2", Some(&n1))
        .await;
    assert_eq!(late, Err(GatewayError::Fenced { sent: 4, seen: 5 }));
    assert_eq!(
        old_owner.claim_fence(&n1).await,
        Err(GatewayError::Fenced { sent: 4, seen: 5 }),
        "a claim older than an epoch seen"
    );
    let sent = new_owner
        .send_fenced(&a, &g[1], &text("hi"), "m1", Some(&n2))
        .await;
    assert!(sent.is_ok(), "{sent:?}");
    let ids: Vec<String> = new_owner
        .deliveries(Some(&a))
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.message_id)
        .collect();
    assert_eq!(ids, ["m0", "m1"]);
    let report = new_owner.account(&a).await.unwrap();
    assert_eq!((report.fenced, report.fence_epoch), (1, Some(5)));

    // Other refusals come back as the same errors: the rate limit (3 a
    // minute) with its wait, an account the simulator never paired.
    let third = new_owner
        .send_fenced(&a, &g[2], &text("hi"), "m3", Some(&n2))
        .await;
    assert!(third.is_ok(), "{third:?}");
    let over = new_owner
        .send_fenced(&a, &g[3], &text("hi"), "m4", Some(&n2))
        .await;
    let Err(GatewayError::RateLimited {
        retry_after: Some(wait),
    }) = over
    else {
        panic!("{over:?}");
    };
    assert!(wait > Duration::from_secs(50) && wait <= Duration::from_secs(60));
    let stranger = new_owner
        .send(&acct("never"), &g[0], &text("x"), "s1")
        .await;
    assert_eq!(stranger, Err(GatewayError::LoggedOut));
    proc.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_simulator_or_a_5xx_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let proc = SimProcess::start(dir.path(), &["--latency-max-ms", "0"]);
    let sim = proc.client();
    let a = acct("a1");
    sim.register(&a, 1).await.unwrap();
    sim.ready(&a).await.unwrap();
    proc.stop();
    let got = sim
        .send(&a, &Simulator::numbered_group(0), &text("x"), "m1")
        .await;
    assert!(matches!(got, Err(GatewayError::Unreachable(_))), "{got:?}");

    // Something that answers 500 on the simulator's port (a proxy, a crash).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().take(1) {
            let mut s = stream.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = "upstream went away";
            let _ = write!(
                s,
                "HTTP/1.1 502 Bad Gateway\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let proxy = RemoteSimulator::new(&format!("http://127.0.0.1:{port}")).unwrap();
    let got = proxy.ready(&a).await;
    let Err(GatewayError::Unreachable(why)) = got else {
        panic!("{got:?}");
    };
    assert!(
        why.contains("502") && why.contains("upstream went away"),
        "{why}"
    );
}

// ------------------------------------------------------------ daemons

const GROUPS: usize = 40;
const GROUPS_PER_ACCOUNT: usize = 50;

fn start_daemon(dir: &Path, simulator_url: &str) -> Daemon {
    Daemon::start(
        dir,
        &[
            ("HERALD_SIMULATOR__URL", simulator_url.to_owned()),
            (
                "HERALD_SIMULATOR__GROUPS_PER_ACCOUNT",
                GROUPS_PER_ACCOUNT.to_string(),
            ),
        ],
    )
}

/// The database a daemon opens, from the test's side (SQLite in WAL mode;
/// both sides use a busy timeout).
struct Db {
    rt: tokio::runtime::Runtime,
    store: SqlStore,
}

impl Db {
    fn open(dir: &Path) -> Db {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let url = format!("sqlite://{}", dir.join("herald.db").display());
        let store = rt.block_on(SqlStore::connect(&url)).unwrap();
        Db { rt, store }
    }

    fn close(self) {
        self.rt.block_on(self.store.close());
    }
}

/// A simulated account sending 600 a minute and a queued one-part run of
/// it to groups `0..GROUPS` (the scheduler's leftovers: start-up hands
/// queued runs to their account).
fn seed_run(db: &Db, account: &AccountId) -> RunId {
    db.rt.block_on(async {
        let reminder =
            fan_out::seed_reminder(&db.store, account, 600, GROUPS, "shared simulator").await;
        fan_out::queue_run(&db.store, reminder, account).await
    })
}

fn wait_final(db: &Db, run: RunId, d: &mut Daemon) -> RunStatus {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = db
            .rt
            .block_on(db.store.get_run(run))
            .unwrap()
            .unwrap()
            .status;
        if status.is_final() {
            return status;
        }
        if let Some(exit) = d.child.try_wait().unwrap() {
            panic!("herald exited with {exit} mid-run\n{}", d.logs());
        }
        assert!(
            Instant::now() < deadline,
            "run still {status} after 120 s\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An all-day UTC window still closes at midnight.
fn avoid_midnight_utc() {
    let left = 86_400 - i64::from(Utc::now().num_seconds_from_midnight());
    if left < 180 {
        std::thread::sleep(Duration::from_secs(left as u64 + 1));
    }
}

/// `herald …` as a user runs it against the daemon of `dir` on `port`.
fn cli(dir: &Path, port: u16, args: &[&str]) -> std::process::Output {
    herald()
        .env("HERALD_STORAGE__DATA_DIR", dir)
        .env("HERALD_CONTROL__LISTEN", format!("127.0.0.1:{port}"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn two_daemons_on_one_simulator_process_deliver_each_group_exactly_once_in_its_journal() {
    avoid_midnight_utc();
    let root = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(
        &root.path().join("sim"),
        &[
            "--latency-min-ms",
            "5",
            "--latency-max-ms",
            "20",
            "--rate-limit-per-minute",
            "100000",
        ],
    );
    let accounts = [acct("north-1"), acct("south-1")];
    let mut nodes = Vec::new();
    for (i, account) in accounts.iter().enumerate() {
        let dir = root.path().join(format!("node-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir);
        let run = seed_run(&db, account);
        nodes.push((dir, db, run));
    }
    let mut daemons: Vec<Daemon> = nodes
        .iter()
        .map(|(dir, _, _)| start_daemon(dir, &sim.url()))
        .collect();
    for ((_, db, run), d) in nodes.iter().zip(&mut daemons) {
        assert_eq!(wait_final(db, *run, d), RunStatus::Success, "{}", d.logs());
        let targets = db
            .rt
            .block_on(db.store.list_targets(*run, None, None, u32::MAX))
            .unwrap();
        assert_eq!(targets.len(), GROUPS);
        assert!(targets.iter().all(|t| t.status == TargetStatus::Sent));
    }

    // The shared journal: every (account, group) of both runs exactly
    // once, nothing else.
    let journal = read_journal(&sim.journal).unwrap();
    let mut per_target: HashMap<(String, String), usize> = HashMap::new();
    for d in &journal {
        *per_target
            .entry((d.account.to_string(), d.group.to_string()))
            .or_default() += 1;
    }
    for account in &accounts {
        for g in (0..GROUPS).map(Simulator::numbered_group) {
            let key = (account.to_string(), g.to_string());
            assert_eq!(per_target.get(&key), Some(&1), "{key:?}: {per_target:?}");
        }
    }
    assert_eq!(journal.len(), 2 * GROUPS, "no delivery outside the runs");
    // Neither daemon kept a journal of its own: the shared one is the log.
    for (dir, _, _) in &nodes {
        assert!(!dir.join("simulator").join("journal.jsonl").exists());
    }

    // An account created through a daemon is registered on the shared
    // simulator before the answer, so its directory lists the groups at once.
    let (dir0, port0) = (&nodes[0].0, daemons[0].port);
    let out = cli(dir0, port0, &["accounts", "add", "created-1"]);
    assert!(out.status.success(), "{out:?}\n{}", daemons[0].logs());
    let out = cli(dir0, port0, &["groups", "list", "created-1", "--csv"]);
    assert!(out.status.success(), "{out:?}");
    let rows = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(rows, 1 + GROUPS_PER_ACCOUNT, "header and one row a group");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = rt
        .block_on(sim.client().account(&acct("created-1")))
        .unwrap();
    assert!(report.registered, "{report:?}");
    assert_eq!(report.groups, GROUPS_PER_ACCOUNT);

    for d in daemons {
        d.stop();
    }
    for (_, db, _) in nodes {
        db.close();
    }
    sim.stop();
}

#[test]
fn a_daemon_refuses_a_simulator_url_that_is_not_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let out = herald()
        .arg("serve")
        .env("HERALD_STORAGE__DATA_DIR", dir.path())
        .env("HERALD_SIMULATOR__URL", "https://127.0.0.1:7790")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid setting simulator.url"), "{err}");
    assert!(!dir.path().join("herald.db").exists(), "nothing opened");
}
