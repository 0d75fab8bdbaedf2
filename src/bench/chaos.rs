//! `herald bench chaos`: the whole engine under seeded faults (see
//! `herald_actors::testkit::chaos`), many seeds over every core. A failing seed
//! prints what it broke and how to replay it; the last line sums it up.

use herald_actors::testkit::chaos::{run_seed, Breakage, ChaosOptions, ChaosReport};
use std::hash::{Hash, Hasher};
use std::time::Instant;

pub struct ChaosArgs {
    pub seeds: u64,
    pub first: u64,
    pub hours: u32,
    pub threads: usize,
    pub breakage: Option<Breakage>,
    /// Daemons sharing the store and WhatsApp (leases when more than one).
    pub nodes: usize,
}

/// Runs the seeds and returns the summary line; an error if any seed
/// broke a promise (after printing each).
pub fn run(args: &ChaosArgs) -> anyhow::Result<String> {
    let started = Instant::now();
    let threads = args.threads.max(1);
    let reports: Vec<ChaosReport> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads as u64)
            .map(|k| {
                s.spawn(move || {
                    (args.first..args.first + args.seeds)
                        .filter(|seed| seed % threads as u64 == k)
                        .map(|seed| {
                            let r = run_seed(&ChaosOptions {
                                hours: args.hours,
                                breakage: args.breakage,
                                ..ChaosOptions::cluster(seed, args.nodes)
                            });
                            if !r.violations.is_empty() {
                                eprintln!(
                                    "seed {seed} broke {} promise(s):\n  {}\n{}",
                                    r.violations.len(),
                                    r.violations.join("\n  "),
                                    r.replay_hint()
                                );
                            }
                            r
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a chaos worker panicked"))
            .collect()
    });
    let mut reports = reports;
    reports.sort_by_key(|r| r.seed);
    let secs = started.elapsed().as_secs_f64();
    let sum = |f: fn(&ChaosReport) -> u64| reports.iter().map(f).sum::<u64>();
    let failed = reports.iter().filter(|r| !r.violations.is_empty()).count();
    let mut trace = std::collections::hash_map::DefaultHasher::new();
    for r in &reports {
        (r.seed, r.trace).hash(&mut trace);
    }
    let line = format!(
        "chaos: nodes={} seeds={} seeds_per_s={:.1} violations={} runs={} sends={} resends={} restarts={} faults={} leases_sent_under={} receipts_counted={} receipts_uncounted={} votes_counted={} amendments={} trace={:016x}",
        args.nodes.max(1),
        reports.len(),
        reports.len() as f64 / secs.max(1e-9),
        sum(|r| r.violations.len() as u64),
        sum(|r| r.runs as u64),
        sum(|r| r.sends),
        sum(|r| r.resends),
        sum(|r| u64::from(r.restarts)),
        sum(|r| r.faults),
        sum(|r| r.owners as u64),
        sum(|r| r.receipts_counted),
        sum(|r| r.receipts_uncounted),
        sum(|r| r.votes_counted),
        sum(|r| r.amendments as u64),
        trace.finish(),
    );
    if failed > 0 {
        println!("{line}");
        anyhow::bail!("{failed} seed(s) broke a promise; replay one with --seed");
    }
    Ok(line)
}
