//! `herald bench store`: how many run-target transitions per second the
//! store commits, batched the way the engine's group commit batches them.

use crate::store::SqlStore;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::{AccountStore, NewAccount, RunStore, StoreBase};
use std::time::{Duration, Instant};

/// Transitions per committed batch: a few hundred, as the engine gathers
/// from many accounts between commits.
const BATCH: usize = 256;

/// Runs the benchmark on a fresh database and returns its summary line.
///
/// `db_url`: `sqlite` or `sqlite::temp` for a temporary file, `sqlite://PATH`
/// for a given file, or `postgres://…`, through which a scratch database is
/// created and dropped afterwards.
pub async fn run(db_url: &str, transitions: u64) -> anyhow::Result<String> {
    super::on_scratch_store(db_url, async |store: &SqlStore| {
        let secs = drive(store, transitions).await?.as_secs_f64();
        Ok(format!(
            "store: backend={} transitions={} seconds={:.3} per_s={:.0}",
            store.backend(),
            transitions,
            secs,
            transitions as f64 / secs.max(1e-9)
        ))
    })
    .await
}

/// Sets up one run and times only the transitions. Each target goes
/// pending → sending → sent (one part), and every batch carries the `sent`
/// marks of the previous batch's targets beside the `sending` marks of new
/// ones, as a steady engine would.
async fn drive(store: &SqlStore, transitions: u64) -> anyhow::Result<Duration> {
    let now: DateTime<Utc> = Utc::now();
    // A random account id, so a given sqlite:// file can be reused.
    let account = AccountId::parse(&format!("bench-{:08x}", rand::random::<u32>()))?;
    store
        .create_account(
            &NewAccount {
                id: account.clone(),
                name: "bench".into(),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits::default(),
            },
            now,
        )
        .await?;
    let run = super::running_run(store, &account, "store benchmark", now).await?;

    let targets = transitions.div_ceil(2) as usize;
    let groups = (0..targets)
        .map(|i| GroupJid::parse(&format!("120363{i:012}@g.us")))
        .collect::<Result<Vec<_>, _>>()?;
    store.create_targets(run, &groups).await?;
    let ids: Vec<i64> = store
        .list_targets(run, None, None, 0)
        .await?
        .iter()
        .map(|t| t.id)
        .collect();
    anyhow::ensure!(ids.len() == targets, "expected {targets} targets");

    // Batch i: `sent` for the targets marked `sending` in batch i-1, then
    // `sending` for the next half batch of targets.
    let mut batches: Vec<Vec<Transition>> = Vec::new();
    let mut left = transitions as usize;
    let chunks: Vec<&[i64]> = ids.chunks(BATCH / 2).collect();
    for i in 0..=chunks.len() {
        let sent = i
            .checked_sub(1)
            .map(|p| chunks[p])
            .unwrap_or_default()
            .iter()
            .map(|&id| Transition::Sent {
                target_id: id,
                part: 0,
                last: true,
                at: now,
                latency_ms: 120,
            });
        let sending = chunks
            .get(i)
            .copied()
            .unwrap_or_default()
            .iter()
            .map(|&id| Transition::Sending {
                target_id: id,
                part: 0,
                message_id: format!("3EB0{id:016X}"),
            });
        let batch: Vec<Transition> = sent.chain(sending).take(left).collect();
        left -= batch.len();
        if !batch.is_empty() {
            batches.push(batch);
        }
    }
    let sent = batches
        .iter()
        .flatten()
        .filter(|t| matches!(t, Transition::Sent { .. }))
        .count() as u32;

    let started = Instant::now();
    for batch in &batches {
        store.apply_transitions(batch).await?;
    }
    let elapsed = started.elapsed();

    let counts = store
        .get_run(run)
        .await?
        .context("benchmark run vanished")?
        .counts;
    anyhow::ensure!(
        counts.sent == sent && counts.total() == targets as u32,
        "benchmark left wrong counts: {counts:?}, expected {sent} sent of {targets}"
    );
    Ok(elapsed)
}
