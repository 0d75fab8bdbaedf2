//! The whole engine under seeded faults: every seed must keep every
//! promise, the same seed must replay the same trace, and the checker must
//! catch a deliberately broken engine. `herald bench chaos` runs many more.

use herald_actors::testkit::chaos::{run_seed, Breakage, ChaosOptions, ChaosReport};

/// Seeds per run; HERALD_CHAOS_SEEDS overrides (CI keeps the default),
/// HERALD_CHAOS_SEED runs just that one.
fn seeds() -> std::ops::Range<u64> {
    let var = |name| std::env::var(name).ok().and_then(|s| s.parse().ok());
    match var("HERALD_CHAOS_SEED") {
        Some(seed) => seed..seed + 1,
        None => 0..var("HERALD_CHAOS_SEEDS").unwrap_or(120),
    }
}

fn explain(r: &ChaosReport) -> String {
    format!(
        "seed {} broke {} promise(s):\n  {}\n{}",
        r.seed,
        r.violations.len(),
        r.violations.join("\n  "),
        r.replay_hint()
    )
}

/// Sums of the reports of a batch of seeds, after asserting that none broke
/// a promise and that something was sent.
#[derive(Default)]
struct Totals {
    runs: usize,
    sends: u64,
    restarts: u32,
    faults: u64,
    owners: usize,
    receipts: u64,
    votes: u64,
    amendments: usize,
}

/// Runs `options(seed)` for each seed, prints the sums under `label`,
/// and fails with every broken promise.
fn keep_every_promise(
    label: &str,
    seeds: std::ops::Range<u64>,
    options: impl Fn(u64) -> ChaosOptions,
) -> Totals {
    let mut t = Totals::default();
    let mut failed = Vec::new();
    for seed in seeds.clone() {
        let r = run_seed(&options(seed));
        t.runs += r.runs;
        t.sends += r.sends;
        t.restarts += r.restarts;
        t.faults += r.faults;
        t.owners += r.owners;
        t.receipts += r.receipts_counted;
        t.votes += r.votes_counted;
        t.amendments += r.amendments;
        if !r.violations.is_empty() {
            failed.push(explain(&r));
        }
    }
    eprintln!(
        "{label}: seeds={seeds:?} runs={} sends={} restarts={} faults={} leases_sent_under={} receipts_counted={} votes_counted={} amendments={}",
        t.runs, t.sends, t.restarts, t.faults, t.owners, t.receipts, t.votes, t.amendments
    );
    assert!(t.votes > 0, "no poll vote was counted");
    assert!(t.runs > 0 && t.sends > 0, "the simulation sent nothing");
    assert!(
        t.receipts > 0,
        "the simulated groups' receipts were not counted"
    );
    assert!(t.amendments > 0, "the operator recalled or edited no run");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    t
}

#[test]
fn every_seed_keeps_every_promise() {
    keep_every_promise("chaos", seeds(), ChaosOptions::seed);
}

/// Three daemons on one store and one simulated WhatsApp, accounts owned
/// through leases; one may crash or be cut off for minutes while the
/// others take its accounts over. The same promises hold across owners.
#[test]
fn every_seed_keeps_every_promise_with_three_daemons() {
    let t = keep_every_promise("chaos, 3 daemons", cluster_seeds(), |seed| {
        ChaosOptions::cluster(seed, 3)
    });
    // At most three accounts a seed: more leases than that sent, so
    // accounts changed hands mid-run.
    let (owners, seeds) = (t.owners, cluster_seeds().count());
    assert!(
        owners > 3 * seeds,
        "accounts never changed hands while sending ({owners} leases over {seeds} seeds)"
    );
}

/// Seeds that once broke a promise with three daemons, kept so the fix
/// stays fixed. 82: a daemon that took over an account mid-ban read it as
/// banned with no end and held its queue forever (the ban's end now lives
/// with the account). 639: a daemon that had just lost an account
/// accepted the operator's stop of its run and wrote it unfenced, while
/// the new owner, which had read the run before the stop, sent on for
/// three minutes (control writes now go under the lease, and a daemon
/// without it answers "moved"). 56: a daemon that took over an edit found
/// a group the previous owner had marked before the wire past the edit's
/// window and called it too old, though its edit had gone (a marked group
/// is now sent again under its ids). 1419: a retried run kept its first
/// end, so a new owner's limiter, reading what the account sent in the
/// last minute, skipped that run's sends and allowed 41 in 60 s (a run
/// still under way now counts whatever its earlier end).
#[test]
fn seeds_that_failed_with_three_daemons_keep_every_promise() {
    const FAILED: &[u64] = &[82, 639, 56, 1419];
    for &seed in FAILED {
        let r = run_seed(&ChaosOptions::cluster(seed, 3));
        assert!(r.violations.is_empty(), "{}", explain(&r));
    }
}

/// Seeds for three daemons; HERALD_CHAOS_SEEDS and HERALD_CHAOS_SEED apply
/// as for one (a third as many by default: each seed runs three engines).
fn cluster_seeds() -> std::ops::Range<u64> {
    let s = seeds();
    if std::env::var("HERALD_CHAOS_SEEDS").is_ok() || s.end - s.start == 1 {
        s
    } else {
        s.start..s.start + (s.end - s.start) / 3
    }
}

#[test]
fn the_same_seed_replays_the_same_trace() {
    for seed in [3, 17] {
        let a = run_seed(&ChaosOptions::seed(seed));
        let b = run_seed(&ChaosOptions::seed(seed));
        assert_eq!(a, b, "seed {seed} did not replay");
    }
    let a = run_seed(&ChaosOptions::cluster(5, 3));
    let b = run_seed(&ChaosOptions::cluster(5, 3));
    assert_eq!(a, b, "seed 5 with three daemons did not replay");
}

/// The first seed below `limit` on which the checker catches `breakage`.
fn first_caught(breakage: Breakage, limit: u64) -> Option<ChaosReport> {
    (0..limit).find_map(|seed| {
        let r = run_seed(&ChaosOptions {
            breakage: Some(breakage),
            ..ChaosOptions::seed(seed)
        });
        (!r.violations.is_empty()).then_some(r)
    })
}

#[test]
fn the_checker_catches_status_writes_without_compare_and_set() {
    let caught =
        first_caught(Breakage::NoCompareAndSet, 400).expect("no seed caught blind status writes");
    eprintln!("blind status writes: {}", explain(&caught));
}

#[test]
fn the_checker_catches_daemons_that_ignore_fences() {
    let caught = (0..200)
        .find_map(|seed| {
            let r = run_seed(&ChaosOptions {
                breakage: Some(Breakage::NoFencing),
                ..ChaosOptions::cluster(seed, 3)
            });
            (!r.violations.is_empty()).then_some(r)
        })
        .expect("no seed caught daemons that ignore fences");
    eprintln!("no fencing: {}", explain(&caught));
}

#[test]
fn the_checker_catches_events_stored_after_their_change() {
    let caught = first_caught(Breakage::EventAfterCommit, 400)
        .expect("no seed caught an event lost between a change and its second write");
    eprintln!("events after commit: {}", explain(&caught));
}

#[test]
fn the_checker_catches_an_engine_that_guesses_a_time_locks_end() {
    let caught = first_caught(Breakage::NoTimeLockEnd, 400)
        .expect("no seed caught sends while a known time-lock held");
    eprintln!("time-lock end hidden: {}", explain(&caught));
    assert!(
        caught
            .violations
            .iter()
            .any(|v| v.contains("while its time-lock until")),
        "{:?}",
        caught.violations
    );
}

#[test]
fn the_checker_catches_an_engine_without_the_ownership_sweep() {
    let caught =
        first_caught(Breakage::NoSweep, 400).expect("no seed caught a missing ownership sweep");
    eprintln!("no sweep: {}", explain(&caught));
}

/// Seeds `herald bench chaos --seeds 20000` found breaking a promise, kept
/// as regressions: a lowered limit lost to a store error on the actor's
/// reload (1533, 5548, 9965); an operator's stop of the sending run lost
/// to a crash (7172, 16539, 18614); and a retry that forgot a group's last
/// message may have arrived, so a later skip did not say so (6927, 7740).
#[test]
fn seeds_found_by_the_long_soak() {
    let failed: Vec<String> = [1533, 5548, 6927, 7172, 7740, 9965, 16539, 18614]
        .into_iter()
        .map(|seed| run_seed(&ChaosOptions::seed(seed)))
        .filter(|r| !r.violations.is_empty())
        .map(|r| explain(&r))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
