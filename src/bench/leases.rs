//! `herald bench leases`: what keeping accounts' leases costs PostgreSQL.
//! `daemons` daemons share `accounts` accounts on one scratch database and
//! each renews all of its leases `rounds` times, as its lease keeper does
//! every `lease_secs / 3` (one `UPDATE … FROM UNNEST` per daemon and round)
//! with its node row's heartbeat beside it. Prints the statement's time
//! and, counted by PostgreSQL, the transactions, rows and WAL per 1,000
//! lease renewals, and what that makes a second at the default interval.

use super::db_cost::DbCost;
use super::ScratchDb;
use crate::store::SqlStore;
use chrono::Utc;
use herald_actors::domain::*;
use herald_actors::ports::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The default `cluster.lease_secs`; the keeper renews every third of it.
const TTL: Duration = Duration::from_secs(15);

pub async fn run(
    db: &str,
    daemons: usize,
    accounts: usize,
    rounds: usize,
) -> anyhow::Result<String> {
    anyhow::ensure!(
        db.starts_with("postgres://") || db.starts_with("postgresql://"),
        "--db: leases are kept on PostgreSQL only (cluster mode is refused on SQLite); give a postgres:// URL"
    );
    anyhow::ensure!(daemons >= 1, "--daemons: must be at least 1");
    anyhow::ensure!(
        accounts >= daemons,
        "--accounts: must be at least --daemons"
    );
    anyhow::ensure!(rounds >= 1, "--rounds: must be at least 1");
    let scratch = ScratchDb::create(db).await?;
    let out = measure(&scratch.url, daemons, accounts, rounds).await;
    scratch.cleanup().await?;
    out
}

fn node(d: usize) -> String {
    format!("bench-node-{d}")
}

/// Accounts and their leases first, on a pool closed before the counting.
async fn setup(url: &str, daemons: usize, accounts: usize) -> anyhow::Result<Vec<Vec<Fence>>> {
    let store = SqlStore::connect(url).await?;
    let now = Utc::now();
    let mut fences = vec![Vec::new(); daemons];
    for i in 0..accounts {
        let id = AccountId::parse(&format!("bench-{i:06}"))?;
        store
            .create_account(
                &NewAccount::named_by_id(
                    id.clone(),
                    GatewayKind::Simulator,
                    AccountState::Connected,
                ),
                now,
            )
            .await?;
        let d = i % daemons;
        let lease = store
            // Long enough to outlast the setup of thousands of accounts.
            .acquire_lease(&id, &node(d), Duration::from_secs(3600))
            .await?
            .ok_or_else(|| anyhow::anyhow!("the lease of {id} was not free"))?;
        fences[d].push(lease.fence());
    }
    store.close().await;
    Ok(fences)
}

async fn measure(
    url: &str,
    daemons: usize,
    accounts: usize,
    rounds: usize,
) -> anyhow::Result<String> {
    let fences = setup(url, daemons, accounts).await?;
    let before = DbCost::read(url)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no PostgreSQL statistics"))?;
    let store = Arc::new(SqlStore::connect(url).await?);
    let mut times = Vec::with_capacity(daemons * rounds);
    for _ in 0..rounds {
        // The daemons renew at once, as they would on their own timers.
        let round = fences.iter().enumerate().map(|(d, f)| {
            let store = store.clone();
            async move {
                let started = Instant::now();
                store.node_heartbeat(&node(d), "bench", None, TTL).await?;
                let kept = store.renew_leases(f, TTL).await?;
                anyhow::ensure!(kept.iter().all(|k| *k), "a lease was lost");
                Ok::<_, anyhow::Error>(started.elapsed().as_secs_f64() * 1000.0)
            }
        });
        for t in futures_util::future::join_all(round).await {
            times.push(t?);
        }
    }
    store.close().await;
    let after = DbCost::read(url)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no PostgreSQL statistics"))?;
    let renewals = (accounts * rounds) as u64;
    let cost = after.per_thousand(&before, renewals, "db_");
    // Renewals a second with every daemon on the default interval.
    let per_s = accounts as f64 / (TTL.as_secs_f64() / 3.0);
    let (wal_kb, rows) = after.totals_since(&before);
    let k = renewals as f64 / 1000.0;
    Ok(format!(
        "leases: daemons={daemons} accounts={accounts} rounds={rounds} renewals={renewals} \
         renew_ms_p50={:.1} renew_ms_max={:.1} renewals_per_s_at_default={per_s:.0} \
         db_rows_per_s_at_default={:.0} wal_kb_per_s_at_default={:.1}{cost}",
        super::percentile(&mut times.clone(), 0.5),
        times.iter().cloned().fold(0.0, f64::max),
        rows / k * per_s / 1000.0,
        wal_kb / k * per_s / 1000.0,
    ))
}
