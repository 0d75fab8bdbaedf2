//! `herald bench …`: benchmarks that print figures, one machine-readable
//! last line each. Behind the `bench` feature: they drive the fault
//! simulation and the in-memory parts, which a release build leaves out.
//!
//! Imports: what each benchmark measures: `settings`, `startup`, `store`,
//! `seal`, `telemetry`, `webhooks`, `gateway::whatsapp`, and the whole core
//! (`herald_actors`).

pub mod chaos;
pub mod command;
pub mod control;
pub mod db_cost;
pub mod engine;
pub mod fake_server;
pub mod groups;
pub mod leases;
pub mod polls;
pub mod receipts;
pub mod scale;
pub mod scheduler;
pub mod sessions;
pub mod store;
pub mod webhooks;
pub mod x25519;

/// The nearest-rank `p` percentile (0 < p ≤ 1) of `v` (sorted in place):
/// always one of the measured values; NaN for no values. The one
/// definition every benchmark reports with.
pub(crate) fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 * p).ceil() as usize).clamp(1, v.len().max(1)) - 1)
        .copied()
        .unwrap_or(f64::NAN)
}

/// The body of the answer to `what` (`"POST http://…"`), read up to
/// `limit` bytes; a request that failed, or a status other than 2xx, is an
/// error naming `what`, the status and the body. The one check of every
/// benchmark's calls to a control port.
pub(crate) async fn ok_body<S>(
    sent: Result<awc::ClientResponse<S>, awc::error::SendRequestError>,
    what: &str,
    limit: usize,
) -> anyhow::Result<Vec<u8>>
where
    S: futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>> + Unpin,
{
    let mut resp = sent.map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    let bytes = resp.body().limit(limit).await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "{what}: {} {}",
        resp.status(),
        String::from_utf8_lossy(&bytes)
    );
    Ok(bytes.to_vec())
}

use crate::store::scratch::ScratchPostgres;
use crate::store::SqlStore;
use std::path::PathBuf;

/// A throwaway database for one benchmark: `sqlite` gives a temporary file,
/// `postgres://…` a freshly created database that is dropped afterwards,
/// any other URL is used as it is.
pub struct ScratchDb {
    pub url: String,
    sqlite_file: Option<PathBuf>,
    postgres: Option<ScratchPostgres>,
}

impl ScratchDb {
    pub async fn create(db: &str) -> anyhow::Result<Self> {
        if db == "sqlite" || db == "sqlite::temp" {
            let path = std::env::temp_dir().join(format!(
                "herald-bench-{}-{:08x}.db",
                std::process::id(),
                rand::random::<u32>()
            ));
            Ok(Self {
                url: format!("sqlite://{}", path.display()),
                sqlite_file: Some(path),
                postgres: None,
            })
        } else if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            let scratch = ScratchPostgres::create(db).await?;
            Ok(Self {
                url: scratch.url.clone(),
                sqlite_file: None,
                postgres: Some(scratch),
            })
        } else {
            Ok(Self {
                url: db.to_owned(),
                sqlite_file: None,
                postgres: None,
            })
        }
    }

    pub async fn cleanup(self) -> anyhow::Result<()> {
        if let Some(path) = self.sqlite_file {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                std::fs::remove_file(p).ok();
            }
        }
        if let Some(pg) = self.postgres {
            pg.drop_database().await?;
        }
        Ok(())
    }
}

/// Connects a store to a fresh scratch database (`db` as for
/// [`ScratchDb::create`]), runs `drive` on it, then closes the store and
/// drops the database whatever `drive` answered.
pub async fn on_scratch_store<T>(
    db: &str,
    drive: impl AsyncFnOnce(&SqlStore) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let scratch = ScratchDb::create(db).await?;
    let out = match SqlStore::connect(&scratch.url).await {
        Ok(store) => {
            let out = drive(&store).await;
            store.close().await;
            out
        }
        Err(e) => Err(e),
    };
    scratch.cleanup().await?;
    out
}

/// A connected simulated account `id` and the JIDs of `groups` groups
/// (not in its directory): what a benchmark's run goes to.
pub(crate) async fn bench_account(
    store: &SqlStore,
    id: &str,
    groups: usize,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<(
    herald_actors::domain::AccountId,
    Vec<herald_actors::domain::GroupJid>,
)> {
    use herald_actors::domain::{AccountId, AccountState, GatewayKind, GroupJid};
    use herald_actors::ports::{AccountStore, NewAccount};
    let account = AccountId::parse(id)?;
    let new = NewAccount::named_by_id(
        account.clone(),
        GatewayKind::Simulator,
        AccountState::Connected,
    );
    store.create_account(&new, now).await?;
    let groups = (0..groups)
        .map(|i| GroupJid::parse(&format!("120363{i:012}@g.us")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((account, groups))
}

/// A running run of `account`, of a one-shot reminder (`title`, one text
/// part) that never fires by itself: something to give targets to.
pub(crate) async fn running_run(
    store: &SqlStore,
    account: &herald_actors::domain::AccountId,
    title: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<herald_actors::domain::RunId> {
    use herald_actors::domain::*;
    use herald_actors::ports::{ReminderStore, RunStore};
    let reminder = store
        .create_reminder(
            &NewReminder::new(
                account.clone(),
                title,
                TimeZone::parse("UTC")?,
                Schedule::once("2030-01-01T09:00")?,
                WindowHours::default(),
                false,
                vec![MessagePart::text("benchmark")?],
                vec![GroupJid::parse("120363000000000000@g.us")?],
            )?,
            now,
        )
        .await?;
    Ok(store
        .create_run(reminder.id, account, now, RunStatus::Running, None, now)
        .await?
        .run
        .id)
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.5), 50.0);
        assert_eq!(percentile(&mut v, 0.99), 99.0);
        assert_eq!(percentile(&mut v, 1.0), 100.0);
        assert_eq!(percentile(&mut [7.0], 0.01), 7.0);
        assert!(percentile(&mut [], 0.5).is_nan());
    }
}
