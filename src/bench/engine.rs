//! `herald bench engine` and `herald bench actors`: the delivery engine's
//! own throughput and footprint, with WhatsApp taken out of the picture
//! (zero-latency simulator, rate limits off) so the figures measure Herald.

use super::db_cost::DbCost;
use super::ScratchDb;
use crate::store::SqlStore;
use actix::prelude::*;
use chrono::Utc;
use herald_actors::delivery::account::Snapshot;
use herald_actors::delivery::engine::{Engine, EngineConfig};
use herald_actors::delivery::writer::StoreWriter;
use herald_actors::domain::*;
use herald_actors::memstore::MemoryStore;
use herald_actors::ports::*;
use herald_actors::simulator::{SimConfig, Simulator};
use herald_actors::supervisor::{GetRegistry, StartAll, Supervisor};
use herald_actors::world::{MemoryMedia, SimulatorOnly};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// So high the bucket never waits: "rate limits off".
const UNLIMITED_PER_MINUTE: u32 = 600_000_000;

fn arbiters() -> Vec<actix_rt::ArbiterHandle> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (0..cores).map(|_| Arbiter::new().handle()).collect()
}

pub async fn run(
    db: &str,
    accounts: usize,
    groups: usize,
    group_concurrency: u32,
) -> anyhow::Result<String> {
    let scratch = ScratchDb::create(db).await?;
    let result = drive(&scratch.url, accounts, groups, group_concurrency).await;
    scratch.cleanup().await?;
    result
}

async fn drive(
    url: &str,
    accounts: usize,
    groups: usize,
    group_concurrency: u32,
) -> anyhow::Result<String> {
    let store = Arc::new(SqlStore::connect(url).await?);
    let before = DbCost::read(url).await?;
    let (expected, secs) = drive_on(store.clone(), accounts, groups, group_concurrency).await?;
    // Closed first: a backend flushes its statistics when it exits.
    store.close().await;
    // Per 1,000 messages, creating their runs and targets included: every
    // send needs them.
    let cost = DbCost::since(before, url, expected, "db_").await?;
    Ok(format!(
        "engine: backend={} accounts={accounts} groups={groups} messages={expected} seconds={secs:.3} msgs_per_s={:.0}{cost}",
        store.backend(),
        expected as f64 / secs.max(1e-9)
    ))
}

/// Runs `accounts` runs of `groups` groups each through the engine on
/// `store`; answers the messages sent and the seconds they took.
pub async fn drive_on(
    store: Arc<SqlStore>,
    accounts: usize,
    groups: usize,
    group_concurrency: u32,
) -> anyhow::Result<(u64, f64)> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let sim = Arc::new(Simulator::new(SimConfig::instant(), clock.clone()));
    let ports = Ports {
        store: store.clone(),
        gateways: Arc::new(SimulatorOnly(sim.clone())),
        media: Arc::new(MemoryMedia::default()),
        clock: clock.clone(),
        metrics: Arc::new(NoMetrics),
    };
    let config = EngineConfig {
        max_per_minute: UNLIMITED_PER_MINUTE,
        group_concurrency,
        fire_concurrency: 0,
        jitter_min: Duration::ZERO,
        jitter_max: Duration::ZERO,
        // Throughput of the engine itself: no human pacing, no "typing…"
        // (which alone holds each message for about a second).
        pace_jitter: 0.0,
        typing: herald_actors::delivery::engine::TypingConfig::OFF,
        ..EngineConfig::default()
    };
    let writer = StoreWriter::start_on(store.clone(), &Arbiter::new().handle());
    let engine = Arc::new(Engine::new(ports, config, writer));
    let now = Utc::now();
    let mut runs = Vec::with_capacity(accounts);
    for i in 0..accounts {
        let id = AccountId::parse(&format!("bench-{i}"))?;
        let jids = sim.add_numbered_groups(&id, groups);
        store
            .create_account(
                &NewAccount {
                    id: id.clone(),
                    name: id.to_string(),
                    kind: GatewayKind::Simulator,
                    state: AccountState::Connected,
                    limits: AccountLimits::default(),
                },
                now,
            )
            .await?;
        let spec = herald_actors::world::reminder(
            &id,
            "UTC",
            WindowHours::parse(0, 24)?,
            vec![MessagePart::text("Benchmark reminder")?],
            jids,
        );
        let r = store.create_reminder(&spec, now).await?;
        let run = store
            .create_run(r.id, &id, now, RunStatus::Queued, None, now)
            .await?
            .run;
        // Targets are created by the engine at run start, as in production.
        runs.push((id, run.id));
    }
    let supervisor = Supervisor::new(engine.clone(), arbiters()).start();
    let started = Instant::now();
    // StartAll spawns every actor and hands each its queued run: the same
    // path as a daemon's start-up.
    let resumed = supervisor.send(StartAll).await??;
    anyhow::ensure!(
        resumed == accounts,
        "expected {accounts} runs handed out, got {resumed}"
    );
    let expected = (accounts * groups) as u64;
    loop {
        if sim.total_delivered() >= expected {
            let mut all_final = true;
            for (_, run) in &runs {
                if !store
                    .get_run(*run)
                    .await?
                    .is_some_and(|r| r.status.is_final())
                {
                    all_final = false;
                    break;
                }
            }
            if all_final {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    for (_, run) in &runs {
        let r = store.get_run(*run).await?.expect("run exists");
        anyhow::ensure!(
            r.status == RunStatus::Success,
            "run {} ended {}",
            r.id,
            r.status
        );
    }
    anyhow::ensure!(
        sim.duplicate_deliveries() == 0,
        "double sends during the benchmark"
    );
    Ok((expected, secs))
}

/// Resident memory of this process, from /proc (Linux).
fn rss_mb() -> anyhow::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/self/status"))?;
    Ok(kb / 1024.0)
}

/// Spawns one idle AccountActor per account, as a daemon with that many
/// paired accounts holds, and reports the process's resident memory.
pub async fn actors(accounts: usize) -> anyhow::Result<String> {
    let store = Arc::new(MemoryStore::new());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let now = Utc::now();
    for i in 0..accounts {
        store
            .create_account(
                &NewAccount {
                    id: AccountId::parse(&format!("acct-{i}"))?,
                    name: format!("Account {i}"),
                    kind: GatewayKind::Simulator,
                    state: AccountState::Connected,
                    limits: AccountLimits::default(),
                },
                now,
            )
            .await?;
    }
    let before = rss_mb()?;
    let ports = Ports {
        store: store.clone(),
        gateways: Arc::new(SimulatorOnly(Arc::new(Simulator::new(
            SimConfig::default(),
            clock.clone(),
        )))),
        media: Arc::new(MemoryMedia::default()),
        clock,
        metrics: Arc::new(NoMetrics),
    };
    let writer = StoreWriter::start_on(store.clone(), &Arbiter::new().handle());
    let engine = Arc::new(Engine::new(ports, EngineConfig::default(), writer));
    let supervisor = Supervisor::new(engine, arbiters()).start();
    supervisor.send(StartAll).await??;
    let registry = supervisor.send(GetRegistry).await?;
    anyhow::ensure!(
        registry.len() == accounts,
        "{} actors for {accounts} accounts",
        registry.len()
    );
    // Every actor answers: they are started, not merely allocated.
    let addrs: Vec<_> = registry.iter().map(|e| e.value().clone()).collect();
    for chunk in addrs.chunks(1000) {
        futures_util::future::try_join_all(chunk.iter().map(|a| a.send(Snapshot))).await?;
    }
    let after = rss_mb()?;
    Ok(format!(
        "actors: accounts={accounts} rss_mb={after:.1} per_actor_kb={:.2} baseline_mb={before:.1}",
        (after - before) * 1024.0 / accounts.max(1) as f64
    ))
}
