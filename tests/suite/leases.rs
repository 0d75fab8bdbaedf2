//! Account leases in the sqlx store, on SQLite and PostgreSQL: who may own
//! an account, how epochs grow, and that a write under a lost lease is
//! refused with nothing written. PostgreSQL runs when
//! `HERALD_TEST_POSTGRES_URL` is set (`HERALD_REQUIRE_POSTGRES=1` makes its
//! absence a failure); it also races several takers for one lease.

use chrono::{DateTime, Utc};
use herald::store::scratch::ScratchPostgres;
use herald::store::SqlStore;
use herald_actors::domain::Fence;
use herald_actors::domain::*;
use herald_actors::ports::*;
use herald_actors::simulator::Simulator;
use std::sync::Arc;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(600);

fn t0() -> DateTime<Utc> {
    "2026-11-23T09:00:00Z".parse().unwrap()
}

fn acct(s: &str) -> AccountId {
    AccountId::parse(s).unwrap()
}

use crate::common::daemon;
use crate::common::postgres;
use daemon::{bench_line, figure};
use postgres::base as postgres_base;

async fn add_account(store: &dyn Store, id: &AccountId) {
    store
        .create_account(
            &NewAccount {
                id: id.clone(),
                name: id.to_string(),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits::default(),
            },
            t0(),
        )
        .await
        .unwrap();
}

/// A run of `account` with `n` pending targets.
async fn run_with_targets(
    store: &dyn Store,
    account: &AccountId,
    n: usize,
) -> (RunId, Vec<RunTarget>) {
    let groups: Vec<GroupJid> = (1..=n).map(Simulator::numbered_group).collect();
    let spec = herald_actors::world::reminder(
        account,
        "UTC",
        WindowHours::parse(0, 24).unwrap(),
        vec![MessagePart::text("x").unwrap()],
        groups.clone(),
    );
    let r = store.create_reminder(&spec, t0()).await.unwrap();
    let run = store
        .create_run(r.id, account, t0(), RunStatus::Running, None, t0())
        .await
        .unwrap()
        .run;
    store.create_targets(run.id, &groups).await.unwrap();
    let targets = store.list_targets(run.id, None, None, 0).await.unwrap();
    (run.id, targets)
}

fn sending(t: &RunTarget) -> Transition {
    Transition::Sending {
        target_id: t.id,
        part: 0,
        message_id: format!("m{}", t.id),
    }
}

async fn lease_contract(store: Arc<dyn Store>) {
    // The clock daemons judge claims and expiries by: the database's own,
    // which agrees with this machine's here.
    let db_now = store.database_now().await.unwrap();
    let skew = (db_now - Utc::now()).num_milliseconds().abs();
    assert!(
        skew < 5_000,
        "{} says {db_now}, {skew} ms off",
        store.backend()
    );
    let s = &*store;
    let (a, b) = (acct("a"), acct("b"));
    add_account(s, &a).await;
    add_account(s, &b).await;

    // The first taker gets epoch 1; nobody else, not even itself, takes a
    // live lease again.
    let l1 = s
        .acquire_lease(&a, "n1", LONG)
        .await
        .unwrap()
        .expect("free");
    assert_eq!((l1.node.as_str(), l1.epoch), ("n1", 1));
    assert_eq!(s.acquire_lease(&a, "n2", LONG).await.unwrap(), None);
    assert_eq!(s.acquire_lease(&a, "n1", LONG).await.unwrap(), None);
    let f1 = l1.fence();
    let stale = Fence {
        epoch: 0,
        ..f1.clone()
    };
    let other = Fence {
        node: "n2".into(),
        ..f1.clone()
    };
    assert_eq!(
        s.renew_leases(&[f1.clone(), stale.clone(), other], LONG)
            .await
            .unwrap(),
        [true, false, false]
    );

    // Writes under the current fence land.
    let (run, targets) = run_with_targets(s, &a, 3).await;
    s.apply_transitions_fenced(std::slice::from_ref(&f1), &[sending(&targets[0])])
        .await
        .unwrap();
    let forecast = RunUpdate {
        forecast: Some("under n1".into()),
        fence: Some(f1.clone()),
        ..Default::default()
    };
    s.update_run(run, &forecast).await.unwrap();

    // Handover: n1 releases, n2 takes it at a higher epoch, and n1's
    // fence no longer writes anything, whatever it carries.
    s.release_lease(&f1).await.unwrap();
    let l2 = s
        .acquire_lease(&a, "n2", LONG)
        .await
        .unwrap()
        .expect("released");
    assert_eq!((l2.node.as_str(), l2.epoch), ("n2", 2));
    let before = s.list_targets(run, None, None, 0).await.unwrap();
    let late = s
        .apply_transitions_fenced(std::slice::from_ref(&f1), &[sending(&targets[1])])
        .await;
    assert!(matches!(late, Err(StoreError::Fenced(_))), "{late:?}");
    // A batch mixing a current and a stale fence writes nothing either.
    let mixed = s
        .apply_transitions_fenced(&[l2.fence(), f1.clone()], &[sending(&targets[2])])
        .await;
    assert!(matches!(mixed, Err(StoreError::Fenced(_))), "{mixed:?}");
    assert_eq!(s.list_targets(run, None, None, 0).await.unwrap(), before);
    let finish = RunUpdate {
        forecast: Some("late n1".into()),
        fence: Some(f1.clone()),
        ..RunUpdate::default()
    };
    let late = s.update_run(run, &finish).await;
    assert!(matches!(late, Err(StoreError::Fenced(_))), "{late:?}");
    assert_eq!(
        s.get_run(run).await.unwrap().unwrap().forecast.as_deref(),
        Some("under n1")
    );
    assert_eq!(
        s.renew_leases(std::slice::from_ref(&f1), LONG)
            .await
            .unwrap(),
        [false]
    );
    // The new owner writes.
    s.apply_transitions_fenced(&[l2.fence()], &[sending(&targets[1])])
        .await
        .unwrap();

    // Expiry, on the database's clock: a lease of no time is free at once,
    // and listed as such (a daemon's own clock is not asked).
    let short = s
        .acquire_lease(&b, "n1", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let expired = |leases: &[herald_actors::domain::Lease]| -> Vec<(String, bool)> {
        leases
            .iter()
            .map(|l| (l.account.to_string(), l.expired))
            .collect()
    };
    assert_eq!(
        expired(&s.list_leases().await.unwrap()),
        [("a".to_string(), false), ("b".to_string(), true)]
    );
    assert!(!l2.expired, "a lease just taken is live");
    assert_eq!(
        s.renew_leases(&[short.fence()], LONG).await.unwrap(),
        [false]
    );
    let taken = s
        .acquire_lease(&b, "n2", LONG)
        .await
        .unwrap()
        .expect("expired");
    assert_eq!(taken.epoch, short.epoch + 1);
    let leases = s.list_leases().await.unwrap();
    let owners: Vec<(&str, &str, i64)> = leases
        .iter()
        .map(|l| (l.account.as_str(), l.node.as_str(), l.epoch))
        .collect();
    assert_eq!(owners, [("a", "n2", 2), ("b", "n2", 2)]);

    // Unknown accounts are named; a deleted account's lease goes with it.
    let unknown = s.acquire_lease(&acct("nobody"), "n1", LONG).await;
    assert!(
        matches!(unknown, Err(StoreError::NotFound(_))),
        "{unknown:?}"
    );

    // Nodes: one live instance per node id.
    s.node_heartbeat("n1", "i1", Some("http://127.0.0.1:1"), LONG)
        .await
        .unwrap();
    let dup = s.node_heartbeat("n1", "i2", None, LONG).await;
    assert!(
        matches!(&dup, Err(StoreError::Conflict(m)) if m.contains("n1")),
        "{dup:?}"
    );
    s.node_heartbeat("n1", "i1", Some("http://127.0.0.1:1"), LONG)
        .await
        .unwrap();
    s.node_heartbeat("n2", "j1", None, Duration::ZERO)
        .await
        .unwrap();
    let live: Vec<_> = s.live_nodes().await.unwrap();
    assert_eq!(live.len(), 1, "n2's row expired at once: {live:?}");
    assert_eq!(live[0].control_url.as_deref(), Some("http://127.0.0.1:1"));
    // Leaving takes only this instance's row.
    s.node_leave("n1", "i2").await.unwrap();
    assert_eq!(s.live_nodes().await.unwrap().len(), 1);
    s.node_leave("n1", "i1").await.unwrap();
    assert!(s.live_nodes().await.unwrap().is_empty());
    s.node_heartbeat("n1", "i2", None, LONG).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("herald.db").display());
    lease_contract(Arc::new(SqlStore::connect(&url).await.unwrap())).await;
}

/// The memory store keeps leases too: the seeded chaos simulation runs
/// several daemons on it.
#[tokio::test]
async fn leases_in_memory() {
    lease_contract(Arc::new(herald_actors::memstore::MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_postgres() {
    let Some(base) = postgres_base("leases_on_postgres") else {
        return;
    };
    let db = ScratchPostgres::create(&base).await.unwrap();
    let store = Arc::new(SqlStore::connect(&db.url).await.unwrap());
    lease_contract(store.clone()).await;
    store.close().await;
    db.drop_database().await.unwrap();
}

/// Eight daemons race for one free account, twenty rounds, each round
/// after the last owner released it: exactly one wins each round, and the
/// epochs count the rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_takers_get_one_owner_per_epoch_on_postgres() {
    let Some(base) = postgres_base("racing_takers_get_one_owner_per_epoch_on_postgres") else {
        return;
    };
    let db = ScratchPostgres::create(&base).await.unwrap();
    let store = Arc::new(SqlStore::connect(&db.url).await.unwrap());
    let a = acct("contended");
    add_account(&*store, &a).await;
    for round in 1..=20i64 {
        let takers = (0..8).map(|n| {
            let (store, a) = (store.clone(), a.clone());
            tokio::spawn(async move { store.acquire_lease(&a, &format!("n{n}"), LONG).await })
        });
        let won: Vec<_> = futures_util::future::join_all(takers)
            .await
            .into_iter()
            .filter_map(|r| r.unwrap().unwrap())
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        assert_eq!(won[0].epoch, round);
        store.release_lease(&won[0].fence()).await.unwrap();
    }
    store.close().await;
    db.drop_database().await.unwrap();
}

// ---------------------------------------------------------------- keepers

/// A daemon's lease keeper with a real supervisor over `store`.
struct Node {
    keeper: herald_actors::cluster::Keeper,
    supervisor: actix::Addr<herald_actors::supervisor::Supervisor>,
}

impl Node {
    async fn start(store: &Arc<dyn Store>, name: &str, dir: &std::path::Path) -> Node {
        Self::start_with(store, name, dir, LONG, None).await
    }

    /// `arbiter`: the thread the supervisor runs on (the test's own when
    /// `None`).
    async fn start_with(
        store: &Arc<dyn Store>,
        name: &str,
        dir: &std::path::Path,
        ttl: Duration,
        arbiter: Option<&actix::ArbiterHandle>,
    ) -> Node {
        use herald_actors::cluster::{Keeper, KeeperConfig, Placement};
        use herald_actors::delivery::engine::{Engine, EngineConfig};
        use herald_actors::delivery::leases::LeaseTable;
        use herald_actors::ports::{NoMetrics, Ports, SystemClock};
        use herald_actors::simulator::SimConfig;
        let sim = Arc::new(Simulator::new(SimConfig::instant(), Arc::new(SystemClock)));
        let ports = Ports {
            store: store.clone(),
            gateways: Arc::new(herald_actors::world::SimulatorOnly(sim)),
            media: Arc::new(herald::media::FileMedia::new(&dir.join(name)).unwrap()),
            clock: Arc::new(SystemClock),
            metrics: Arc::new(NoMetrics),
        };
        let writer = herald_actors::delivery::writer::StoreWriter::start(store.clone());
        let table = Arc::new(LeaseTable::new(name));
        let engine = Arc::new(
            Engine::new(ports, EngineConfig::default(), writer).with_leases(table.clone()),
        );
        let supervisor = herald_actors::supervisor::Supervisor::new(engine, vec![]);
        let supervisor = match arbiter {
            Some(a) => actix::Actor::start_in_arbiter(a, |_| supervisor),
            None => actix::Actor::start(supervisor),
        };
        let keeper = Keeper::new(
            store.clone(),
            table,
            supervisor.clone(),
            KeeperConfig::for_ttl(ttl),
            Box::new(|_| Placement::Floating),
        );
        keeper.join(|_| {}).await.unwrap();
        Node { keeper, supervisor }
    }

    /// Accounts with an actor here, and the leases held, by id.
    async fn serving(&self) -> (Vec<String>, Vec<String>) {
        let registry = self
            .supervisor
            .send(herald_actors::supervisor::GetRegistry)
            .await
            .unwrap();
        let mut actors: Vec<String> = registry.iter().map(|e| e.key().to_string()).collect();
        let mut held: Vec<String> = self
            .keeper
            .table()
            .held()
            .into_iter()
            .map(|f| f.account.to_string())
            .collect();
        actors.sort();
        held.sort();
        (actors, held)
    }
}

/// Keepers ticked by hand: the first daemon takes every account, a second
/// one gets half after one round each, a departing one hands its half
/// back, and a lease taken by someone else is dropped with its actor.
#[actix_rt::test]
async fn keepers_spread_the_accounts_hand_them_over_and_drop_lost_ones() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("herald.db").display());
    let store: Arc<dyn Store> = Arc::new(SqlStore::connect(&url).await.unwrap());
    let ids: Vec<AccountId> = (1..=6).map(|i| acct(&format!("a{i}"))).collect();
    for a in &ids {
        add_account(&*store, a).await;
    }
    let all: Vec<String> = ids.iter().map(ToString::to_string).collect();

    let n1 = Node::start(&store, "n1", dir.path()).await;
    n1.keeper.tick().await.unwrap();
    assert_eq!(
        n1.serving().await,
        (all.clone(), all.clone()),
        "alone, n1 serves all"
    );

    let n2 = Node::start(&store, "n2", dir.path()).await;
    n2.keeper.tick().await.unwrap();
    assert_eq!(n2.serving().await.1.len(), 0, "nothing is free yet");
    n1.keeper.tick().await.unwrap();
    n2.keeper.tick().await.unwrap();
    let (one, two) = (n1.serving().await, n2.serving().await);
    assert_eq!(one.0, one.1, "an actor for exactly the leases held");
    assert_eq!(two.0, two.1);
    assert_eq!((one.1.len(), two.1.len()), (3, 3), "{one:?} {two:?}");
    let mut both: Vec<String> = one.1.iter().chain(&two.1).cloned().collect();
    both.sort();
    assert_eq!(both, all, "every account exactly once");
    // The handed-over ones were taken anew: a higher epoch.
    for l in store.list_leases().await.unwrap() {
        let want = if l.node == "n2" { 2 } else { 1 };
        assert_eq!(l.epoch, want, "{l:?}");
    }

    // n2 leaves (SIGTERM): n1 takes everything at its next round.
    n2.keeper.leave().await;
    n1.keeper.tick().await.unwrap();
    assert_eq!(n1.serving().await, (all.clone(), all.clone()));

    // Another daemon takes one of n1's accounts (as after a long pause):
    // n1's next renewal drops the lease and its actor.
    let victim = n1.keeper.table().held()[0].clone();
    store.release_lease(&victim).await.unwrap();
    store
        .acquire_lease(&victim.account, "n3", LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(
        n1.keeper.table().fence(&victim.account).is_some(),
        "not noticed yet"
    );
    n1.keeper.tick().await.unwrap();
    let (actors, held) = n1.serving().await;
    assert!(!held.contains(&victim.account.to_string()), "{held:?}");
    assert!(!actors.contains(&victim.account.to_string()), "{actors:?}");
    assert_eq!(held.len(), 5);
}

// ---------------------------------------------------------------- model

/// What the lease rows must do, as a few lines of plain Rust: the owner,
/// its epoch and whether the lease is live, per account.
#[derive(Debug, Clone, Default)]
struct Model {
    row: Option<(String, i64, bool)>,
}

impl Model {
    fn acquire(&mut self, node: &str, live: bool) -> Option<i64> {
        match &self.row {
            Some((_, _, true)) => None,
            Some((_, epoch, false)) => {
                let e = epoch + 1;
                self.row = Some((node.into(), e, live));
                Some(e)
            }
            None => {
                self.row = Some((node.into(), 1, live));
                Some(1)
            }
        }
    }

    fn current(&self, f: &Fence) -> bool {
        matches!(&self.row, Some((n, e, true)) if *n == f.node && *e == f.epoch)
    }

    fn release(&mut self, f: &Fence) {
        if let Some((n, e, live)) = &mut self.row {
            if *n == f.node && *e == f.epoch {
                *live = false;
            }
        }
    }
}

/// Random acquires (live, or of no time, so already expired), renewals,
/// releases and fenced writes by three daemons, each holding the last
/// fence it got however stale. The store must answer as the model does,
/// so it never has two owners nor lets a stale fence write.
async fn lease_model_check(store: Arc<dyn Store>, seed: u64) {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let a = acct("m");
    add_account(&*store, &a).await;
    let (run, targets) = run_with_targets(&*store, &a, 1).await;
    let nodes = ["n1", "n2", "n3"];
    let mut fences: [Option<Fence>; 3] = Default::default();
    let mut model = Model::default();
    for step in 0..150 {
        let i = rng.random_range(0..3);
        let node = nodes[i];
        let ctx = format!("seed {seed} step {step} {node} model {model:?}");
        match rng.random_range(0..4) {
            0 => {
                let live = rng.random_bool(0.7);
                let ttl = if live { LONG } else { Duration::ZERO };
                let got = store.acquire_lease(&a, node, ttl).await.unwrap();
                let want = model.acquire(node, live);
                assert_eq!(got.as_ref().map(|l| l.epoch), want, "acquire: {ctx}");
                if let Some(l) = got {
                    fences[i] = Some(l.fence());
                }
            }
            1 => {
                let Some(f) = fences[i].clone() else { continue };
                let got = store
                    .renew_leases(std::slice::from_ref(&f), LONG)
                    .await
                    .unwrap();
                assert_eq!(got, [model.current(&f)], "renew: {ctx}");
            }
            2 => {
                let Some(f) = fences[i].clone() else { continue };
                store.release_lease(&f).await.unwrap();
                model.release(&f);
            }
            _ => {
                let Some(f) = fences[i].clone() else { continue };
                let update = RunUpdate {
                    forecast: Some(format!("{step}")),
                    fence: Some(f.clone()),
                    ..Default::default()
                };
                let wrote = store.update_run(run, &update).await;
                let marked = store
                    .apply_transitions_fenced(std::slice::from_ref(&f), &[sending(&targets[0])])
                    .await;
                let want = model.current(&f);
                assert_eq!(wrote.is_ok(), want, "update_run: {ctx}: {wrote:?}");
                assert_eq!(marked.is_ok(), want, "marks: {ctx}: {marked:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_rows_follow_the_model_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 0..20 {
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("s{seed}.db")).display()
        );
        lease_model_check(Arc::new(SqlStore::connect(&url).await.unwrap()), seed).await;
    }
}

#[tokio::test]
async fn lease_rows_follow_the_model_in_memory() {
    for seed in 0..20 {
        let store = Arc::new(herald_actors::memstore::MemoryStore::new());
        lease_model_check(store, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_rows_follow_the_model_on_postgres() {
    let Some(base) = postgres_base("lease_rows_follow_the_model_on_postgres") else {
        return;
    };
    for seed in 0..5 {
        let db = ScratchPostgres::create(&base).await.unwrap();
        let store = Arc::new(SqlStore::connect(&db.url).await.unwrap());
        lease_model_check(store.clone(), seed).await;
        store.close().await;
        db.drop_database().await.unwrap();
    }
}

/// A takeover never waits on the supervisor: the daemon that survives has
/// its supervisor stalled (a busy arbiter on a loaded machine), yet one
/// round of its keeper takes every account of the daemon that died, right
/// after their leases end.
#[actix_rt::test]
async fn a_stalled_supervisor_never_holds_a_takeover_up() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("herald.db").display());
    let store: Arc<dyn Store> = Arc::new(SqlStore::connect(&url).await.unwrap());
    let ids: Vec<AccountId> = (1..=10).map(|i| acct(&format!("a{i:02}"))).collect();
    for a in &ids {
        add_account(&*store, a).await;
    }
    let ttl = Duration::from_secs(2);
    let n1 = Node::start_with(&store, "n1", dir.path(), ttl, None).await;
    n1.keeper.tick().await.unwrap();
    assert_eq!(n1.keeper.table().len(), 10);
    let other = actix::Arbiter::new();
    let n2 = Node::start_with(&store, "n2", dir.path(), ttl, Some(&other.handle())).await;
    // n1 dies (it renews nothing more); n2's supervisor is stuck for 30 s.
    n2.supervisor
        .do_send(herald_actors::supervisor::Stall(Duration::from_secs(30)));
    // The database's clock ends n1's node row and leases after the ttl.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    let round = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), n2.keeper.tick())
        .await
        .expect("the round waited on the stalled supervisor")
        .unwrap();
    eprintln!("one round took every account in {:?}", round.elapsed());
    assert_eq!(
        n2.keeper.table().len(),
        10,
        "every account taken in one round"
    );
    assert!(ids.iter().all(|a| n2.keeper.table().fence(a).is_some()));
    drop(n1);
    // `other` is left to the process's end, as a daemon's arbiters are:
    // stopping it would drop its supervisor's store query outside any
    // runtime once the stall ends, and sqlx's connection then panics in
    // its drop, which aborts the whole test process.
    drop(other);
}

/// Pairing asked of a daemon when no daemon holds the account: the daemon
/// takes the lease at once (a new account need not wait for a round),
/// another daemon cannot take it from a live holder, and a rebalance that
/// hands surplus accounts over keeps the one being paired where its phone
/// is scanning the QR.
#[actix_rt::test]
async fn a_pairing_request_takes_a_free_account_and_a_rebalance_leaves_it_there() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("herald.db").display());
    let store: Arc<dyn Store> = Arc::new(SqlStore::connect(&url).await.unwrap());
    let ids: Vec<AccountId> = (1..=4).map(|i| acct(&format!("a{i}"))).collect();
    for a in &ids {
        add_account(&*store, a).await;
    }
    // The highest id: the first a rebalance would hand over.
    let paired = acct("z-new");
    store
        .create_account(
            &NewAccount {
                id: paired.clone(),
                name: "new".into(),
                kind: GatewayKind::Whatsapp,
                state: AccountState::Pairing,
                limits: AccountLimits::default(),
            },
            t0(),
        )
        .await
        .unwrap();

    let n1 = Node::start(&store, "n1", dir.path()).await;
    assert!(n1.keeper.claim(&paired).await.unwrap(), "free: taken here");
    assert!(n1.keeper.table().holds(&paired));
    assert!(n1.keeper.claim(&paired).await.unwrap(), "held here already");
    let owner: Vec<Lease> = store
        .list_leases()
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.account == paired)
        .collect();
    assert_eq!((owner.len(), owner[0].node.as_str()), (1, "n1"));
    // The claimed account got its actor (told, not awaited).
    let mut adopted = false;
    for _ in 0..50 {
        if n1.serving().await.0.contains(&paired.to_string()) {
            adopted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(adopted, "the claimed account has an actor");

    // Alone, n1 takes every account; when n2 joins, n1 holds more than
    // its share and hands the surplus over, never the account being paired.
    n1.keeper.tick().await.unwrap();
    assert_eq!(n1.keeper.table().len(), ids.len() + 1);
    let n2 = Node::start(&store, "n2", dir.path()).await;
    assert!(
        !n2.keeper.claim(&paired).await.unwrap(),
        "held by a live daemon: not taken"
    );
    for _ in 0..3 {
        n1.keeper.tick().await.unwrap();
        n2.keeper.tick().await.unwrap();
    }
    let (one, two) = (n1.serving().await.1, n2.serving().await.1);
    assert!(one.contains(&paired.to_string()), "{one:?} {two:?}");
    assert_eq!(one.len() + two.len(), ids.len() + 1, "{one:?} {two:?}");
    assert_eq!(two.len(), 2, "the others were shared: {one:?} {two:?}");
}

/// `herald bench leases`: each daemon's renewals are one statement a
/// round and PostgreSQL writes one row a renewal (and one per heartbeat);
/// on SQLite it says why it cannot run.
#[test]
fn the_leases_benchmark_counts_what_renewals_cost_postgres() {
    let refused = daemon::herald()
        .args(["bench", "leases", "--db", "sqlite"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("--db: leases are kept on PostgreSQL only"),
        "{refused:?}"
    );
    let Some(base) = postgres_base("the_leases_benchmark_counts_what_renewals_cost_postgres")
    else {
        return;
    };
    let line = bench_line(&[
        "bench",
        "leases",
        "--db",
        &base,
        "--daemons",
        "2",
        "--accounts",
        "60",
        "--rounds",
        "4",
    ]);
    let field = |k: &str| figure(&line, k);
    assert!(
        line.starts_with("leases: daemons=2 accounts=60 rounds=4 renewals=240 "),
        "{line}"
    );
    // 240 renewals and 8 heartbeats: 1,033 rows per 1,000 renewals at
    // most. PostgreSQL's statistics lose part of the counts in some runs
    // (533–1,033 seen in six runs of this size), so only the bound that a
    // renewal writing more than its row would break is held.
    let rows = field("db_rows_per_1000");
    assert!(rows > 0.0 && rows <= 1100.0, "{line}");
    assert!(field("renewals_per_s_at_default") == 12.0, "{line}");
    assert!(field("wal_kb_per_1000") > 0.0, "{line}");
}
