//! Three real `herald serve` daemons on one PostgreSQL database, sharing
//! twenty accounts by lease, all talking to one shared simulated WhatsApp
//! (`herald simulator serve`), whose journal is the judge.
//!
//! Each account fans one reminder out to `HERALD_CLUSTER_GROUPS` groups
//! (1,000 by default). Mid-run one daemon is SIGKILLed; later another is
//! SIGSTOPped past its lease, its accounts are taken over, and it is
//! SIGCONTed. Every group must get its message exactly once, no account may
//! send more than its limit in any 60 s, under one owner or across a change
//! of owner, and no delivery may carry an older lease epoch than one already
//! delivered for its account. Needs
//! `HERALD_TEST_POSTGRES_URL` (`HERALD_REQUIRE_POSTGRES=1` makes its absence
//! a failure).

use crate::common::cluster;
use crate::common::daemon as harness;
use crate::common::fan_out;
use crate::common::postgres;

use chrono::{DateTime, Utc};
use cluster::Db;
use harness::{wait_until, Daemon, SimProcess};
use herald_actors::domain::*;
use herald_actors::simulator::{read_journal, Delivery};
use std::collections::{BTreeMap, HashMap, HashSet};

use std::path::Path;

use std::time::{Duration, Instant};

const ACCOUNTS: usize = 20;
/// Each account's limit, in any 60 s.
const RATE: u32 = 600;
const LEASE_SECS: u64 = 3;
const TOKEN: &str = "cluster-test-token-0123456789abcdef";

fn groups() -> usize {
    std::env::var("HERALD_CLUSTER_GROUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn start_node(name: &str, dir: &Path, db_url: &str, sim: &SimProcess) -> Daemon {
    let env = [
        ("HERALD_SIMULATOR__URL", sim.url()),
        ("HERALD_SIMULATOR__GROUPS_PER_ACCOUNT", groups().to_string()),
        ("HERALD_DELIVERY__FIRE_CONCURRENCY", "0".into()),
    ];
    cluster::start_node(name, dir, db_url, TOKEN, LEASE_SECS, &env)
}

fn seed(db: &Db, groups: usize) -> (Vec<AccountId>, Vec<i64>) {
    db.rt.block_on(async {
        let mut accounts = Vec::new();
        let mut reminders = Vec::new();
        for i in 1..=ACCOUNTS {
            let id = AccountId::parse(&format!("acct-{i:02}")).unwrap();
            reminders
                .push(fan_out::seed_reminder(&db.store, &id, RATE, groups, "cluster drill").await);
            accounts.push(id);
        }
        (accounts, reminders)
    })
}

fn fire(db: &Db, accounts: &[AccountId], reminders: &[i64]) -> Vec<RunId> {
    db.rt.block_on(async {
        let mut runs = Vec::new();
        for (a, r) in accounts.iter().zip(reminders) {
            runs.push(fan_out::queue_run(&db.store, *r, a).await);
        }
        runs
    })
}

/// The busiest 60 s of `ds`: how many deliveries it holds, and the
/// deliveries themselves in arrival order.
fn busiest_60s<'a>(ds: &[&'a Delivery]) -> (usize, Vec<&'a Delivery>) {
    let mut by_time: Vec<&Delivery> = ds.to_vec();
    by_time.sort_by_key(|d| (d.at, d.seq));
    let mut best = (0, 0);
    let mut lo = 0;
    for hi in 0..by_time.len() {
        while by_time[hi].at - by_time[lo].at >= chrono::Duration::seconds(60) {
            lo += 1;
        }
        if hi + 1 - lo > best.1 - best.0 {
            best = (lo, hi + 1);
        }
    }
    (best.1 - best.0, by_time[best.0..best.1].to_vec())
}

fn max_in_any_60s(ds: &[&Delivery]) -> usize {
    busiest_60s(ds).0
}

/// Who sent in the busiest 60 s: each owner (node, epoch) with its count
/// and its first and last arrival, in order.
fn describe_busiest(ds: &[&Delivery]) -> String {
    let (n, window) = busiest_60s(ds);
    let mut out = format!("{n} deliveries in one 60 s window:\n");
    let mut runs: Vec<(String, usize, DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    for d in window {
        let owner = d
            .fence
            .as_ref()
            .map_or("-".to_owned(), |f| format!("{}@{}", f.node, f.epoch));
        match runs.last_mut() {
            Some(last) if last.0 == owner => {
                last.1 += 1;
                last.3 = d.at;
            }
            _ => runs.push((owner, 1, d.at, d.at)),
        }
    }
    for (owner, count, first, last) in runs {
        out.push_str(&format!(
            "  {owner}: {count} from {} to {}\n",
            first.format("%H:%M:%S%.3f"),
            last.format("%H:%M:%S%.3f")
        ));
    }
    out
}

#[test]
fn three_daemons_share_the_accounts_and_survive_a_kill_and_a_pause_with_each_group_sent_once() {
    let Some(base) = postgres::base("the cluster test") else {
        return;
    };
    let groups = groups();
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::create(&base);
    let (accounts, reminders) = seed(&db, groups);
    // The journal must show what Herald sent, not what a limit let through.
    let sim = SimProcess::start(
        &tmp.path().join("sim"),
        &[
            "--latency-min-ms",
            "2",
            "--latency-max-ms",
            "15",
            "--rate-limit-per-minute",
            "0",
            "--groups-per-account",
            &groups.to_string(),
        ],
    );

    let mut n1 = start_node("n1", tmp.path(), db.url(), &sim);
    let mut n2 = start_node("n2", tmp.path(), db.url(), &sim);
    let mut n3 = start_node("n3", tmp.path(), db.url(), &sim);
    for d in [&mut n1, &mut n2, &mut n3] {
        d.wait_healthy(Duration::from_secs(60));
    }
    // Spread fairly: 7, 7 and 6 of the 20.
    let spread = wait_until(
        Duration::from_secs(30),
        "a fair spread of the accounts",
        &mut [&mut n1, &mut n2, &mut n3],
        || {
            let o = db.owners();
            o.len() == 3
                && o.values().map(Vec::len).sum::<usize>() == ACCOUNTS
                && o.values().all(|a| (6..=7).contains(&a.len()))
        },
    );
    eprintln!("spread over three daemons in {spread:?}: {:?}", db.owners());

    let runs = fire(&db, &accounts, &reminders);
    let total = ACCOUNTS * groups;

    // A control request reaches the account's owner whichever daemon it is
    // sent to: pause through n3 and resume through n1 a run n2 carries.
    let owned_by_n2 = db.owners().remove("n2").expect("n2 owns accounts");
    let i = accounts.iter().position(|a| *a == owned_by_n2[0]).unwrap();
    let run = runs[i];
    // An operator, made on n1: every daemon finds the user in the store.
    let (status, _, made) = harness::request(
        n1.port,
        "POST",
        "/v1/users",
        &[
            format!("Authorization: Bearer {TOKEN}"),
            "Content-Type: application/json".into(),
        ],
        r#"{"name":"ops","role":"operator"}"#,
    )
    .expect("the daemon answers");
    assert_eq!(status, 201, "{made}");
    let made: serde_json::Value = serde_json::from_str(&made).unwrap();
    let ops = made["token"].as_str().unwrap().to_owned();
    for (via, verb, want, token) in [
        (&n3, "pause", RunStatus::Paused, ops.as_str()),
        (&n1, "resume", RunStatus::Running, TOKEN),
    ] {
        let path = format!("/v1/runs/{}/{verb}", run.0);
        let (status, head, body) =
            harness::http(via.port, "POST", &path, Some(token)).expect("the daemon answers");
        assert_eq!(status, 202, "{verb} via another daemon: {head}\n{body}");
        assert!(
            head.to_ascii_lowercase()
                .contains("x-herald-answered-by: n2"),
            "{verb} was not answered by the owner: {head}"
        );
        wait_until(
            Duration::from_secs(30),
            &format!("the run {verb}d"),
            &mut [&mut n2],
            || db.statuses(&[run])[0] == want || db.statuses(&[run])[0].is_final(),
        );
    }
    // Each forwarded write is in the audit log once, recorded where it ran
    // (the owner), under the principal it was forwarded for and naming the
    // daemon that forwarded it; that daemon records none of its own.
    for (verb, actor, by) in [
        ("pauseRun", "ops", "n3"),
        ("resumeRun", "control.token", "n1"),
    ] {
        let (status, _, body) = harness::http(
            n2.port,
            "GET",
            &format!("/v1/audit?operation={verb}"),
            Some(TOKEN),
        )
        .expect("the daemon answers");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let items = v["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{verb} recorded once: {body}");
        assert_eq!(items[0]["resource"], run.0.to_string(), "{body}");
        assert_eq!(items[0]["actor"], actor, "{body}");
        assert_eq!(items[0]["forwarded_by"], by, "{body}");
        assert_eq!(items[0]["status"], 202, "{body}");
    }
    wait_until(
        Duration::from_secs(120),
        "10% of the groups sent",
        &mut [&mut n1, &mut n2, &mut n3],
        || db.sent(&runs) >= total / 10,
    );

    // SIGKILL n1 mid-run: its accounts resume elsewhere within the lease time.
    let lost: Vec<AccountId> = db.owners().remove("n1").unwrap_or_default();
    n1.kill9();
    let killed_at = Instant::now();
    let takeover = wait_until(
        Duration::from_secs(4 * LEASE_SECS),
        "n1's accounts taken over",
        &mut [&mut n2, &mut n3],
        || {
            let o = db.owners();
            lost.iter().all(|a| {
                o.iter()
                    .any(|(node, accts)| node != "n1" && accts.contains(a))
            })
        },
    );
    eprintln!(
        "SIGKILL: {} accounts taken over {:.1} s after the kill (lease {LEASE_SECS} s)",
        lost.len(),
        takeover.as_secs_f64()
    );
    assert!(killed_at.elapsed() < Duration::from_secs(4 * LEASE_SECS));

    wait_until(
        Duration::from_secs(180),
        "40% of the groups sent",
        &mut [&mut n2, &mut n3],
        || db.sent(&runs) >= total * 4 / 10,
    );

    // SIGSTOP n2 past its lease; n3 takes everything; SIGCONT n2.
    let paused: Vec<AccountId> = db.owners().remove("n2").unwrap_or_default();
    assert!(!paused.is_empty());
    n2.signal("STOP");
    let stolen = wait_until(
        Duration::from_secs(6 * LEASE_SECS),
        "n2's accounts taken over while it is stopped",
        &mut [&mut n3],
        || {
            let o = db.owners();
            paused
                .iter()
                .all(|a| o.get("n3").is_some_and(|accts| accts.contains(a)))
        },
    );
    eprintln!(
        "SIGSTOP: n2's {} accounts taken over in {:.1} s",
        paused.len(),
        stolen.as_secs_f64()
    );
    // Let the new owner send for them a while before n2 wakes up.
    std::thread::sleep(Duration::from_secs(2));
    n2.signal("CONT");
    let n2_log = n2.log.clone();
    wait_until(
        Duration::from_secs(30),
        "n2 noticing it lost its leases",
        &mut [&mut n2, &mut n3],
        || {
            std::fs::read_to_string(&n2_log)
                .unwrap_or_default()
                .contains("account lease lost")
        },
    );

    wait_until(
        Duration::from_secs(600),
        "every run finished",
        &mut [&mut n2, &mut n3],
        || db.statuses(&runs).iter().all(|s| s.is_final()),
    );
    let statuses = db.statuses(&runs);
    assert!(
        statuses.iter().all(|s| *s == RunStatus::Success),
        "{statuses:?}\n{}\n-----\n{}",
        n2.logs(),
        n3.logs()
    );

    // SIGTERM hands the leases over: n3 holds all twenty soon after n2 exits.
    n2.term();
    assert!(
        n2.wait_exit(Duration::from_secs(30)).success(),
        "{}",
        n2.logs()
    );
    let handed = wait_until(
        Duration::from_secs(2 * LEASE_SECS),
        "n2's accounts handed to n3",
        &mut [&mut n3],
        || db.owners().get("n3").map_or(0, Vec::len) == ACCOUNTS,
    );
    eprintln!(
        "SIGTERM: n3 holds all accounts {:.1} s after n2 exited",
        handed.as_secs_f64()
    );
    n3.term();
    assert!(
        n3.wait_exit(Duration::from_secs(30)).success(),
        "{}",
        n3.logs()
    );

    // The shared simulator's journal is the judge.
    let log = read_journal(&sim.journal).unwrap();
    let mut per_account: HashMap<&AccountId, Vec<&Delivery>> = HashMap::new();
    for d in &log {
        per_account.entry(&d.account).or_default().push(d);
    }
    assert_eq!(per_account.len(), ACCOUNTS);
    let mut cross_owner_peak = 0;
    let mut over_limit = Vec::new();
    for (account, ds) in &per_account {
        let distinct: HashSet<&GroupJid> = ds.iter().map(|d| &d.group).collect();
        assert_eq!(distinct.len(), groups, "{account}: groups reached");
        assert_eq!(ds.len(), groups, "{account}: a group got its message twice");
        // Under one owner (one lease epoch) the limit holds exactly.
        let mut by_epoch: BTreeMap<i64, Vec<&Delivery>> = BTreeMap::new();
        for d in ds {
            let epoch = d.fence.as_ref().map_or(0, |f| f.epoch);
            by_epoch.entry(epoch).or_default().push(d);
        }
        for (epoch, under) in &by_epoch {
            let peak = max_in_any_60s(under);
            assert!(
                peak <= RATE as usize,
                "{account} epoch {epoch}: {peak} in one 60 s window"
            );
        }
        // And across every change of owner: the new owner counts the old
        // one's sends from the store.
        let peak = max_in_any_60s(ds);
        if peak > RATE as usize {
            // What each daemon said about the account: its leases and runs.
            let said: Vec<String> = [&n1, &n2, &n3]
                .iter()
                .flat_map(|d| {
                    let name = d.log.display().to_string();
                    d.logs()
                        .lines()
                        .filter(|l| l.contains(account.as_str()))
                        .map(|l| format!("    [{name}] {l}"))
                        .collect::<Vec<_>>()
                })
                .collect();
            over_limit.push(format!(
                "{account}: {}{}",
                describe_busiest(ds),
                said.join("\n")
            ));
        }
        cross_owner_peak = cross_owner_peak.max(peak);
        // Fencing: in acceptance order, an account's epochs never go back.
        let mut newest = 0;
        for d in ds {
            let fence = d
                .fence
                .as_ref()
                .expect("every cluster send carries its lease");
            assert!(
                fence.epoch >= newest,
                "{account}: delivery {} under epoch {} after epoch {newest}",
                d.seq,
                fence.epoch
            );
            newest = fence.epoch;
        }
    }
    assert_eq!(log.len(), total);
    let epochs: usize = per_account
        .values()
        .map(|ds| {
            ds.iter()
                .map(|d| d.fence.as_ref().unwrap().epoch)
                .collect::<HashSet<_>>()
                .len()
        })
        .sum();
    // n3 was never killed nor paused: any lease it lost was churn. A lapse
    // is a run that stopped at its local deadline (the renewal came late);
    // a loss is a lease the database gave to another daemon meanwhile.
    let n3_log = n3.logs();
    let n3_lapsed = n3_log.matches("leaving the run to its new owner").count();
    let n3_lost = n3_log.matches("another daemon owns it now").count();
    eprintln!(
        "cluster: accounts={ACCOUNTS} groups={groups} deliveries={} owner_epochs_seen={epochs} \
         n3_runs_lapsed={n3_lapsed} n3_leases_lost={n3_lost} max_per_60s_across_owners={cross_owner_peak} limit={RATE}",
        log.len()
    );
    assert!(
        over_limit.is_empty(),
        "over the limit of {RATE} in 60 s:\n{}",
        over_limit.join("\n")
    );
    sim.stop();
    db.drop_database();
}
