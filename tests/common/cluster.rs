//! What the cluster tests share: a scratch PostgreSQL database with the
//! test's own view of it, and a `herald serve` daemon of the cluster.
//! Needs `mod harness` (`common/daemon.rs`) beside it.

#![allow(dead_code)] // each test file uses its own part

use crate::common::daemon::Daemon;
use chrono::Utc;
use herald::store::scratch::ScratchPostgres;
use herald::store::SqlStore;
use herald_actors::domain::{AccountId, Lease, Run, RunId, RunStatus};
use herald_actors::ports::{LeaseStore, RunStore};
use std::collections::BTreeMap;
use std::path::Path;

/// The test's own view of the cluster's database.
pub struct Db {
    pub rt: tokio::runtime::Runtime,
    pub store: SqlStore,
    pub scratch: ScratchPostgres,
}

impl Db {
    /// A new scratch database on the server at `base`.
    pub fn create(base: &str) -> Db {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let scratch = rt.block_on(ScratchPostgres::create(base)).unwrap();
        let store = rt.block_on(SqlStore::connect(&scratch.url)).unwrap();
        Db { rt, store, scratch }
    }

    /// Closes the pools and drops the database.
    pub fn drop_database(self) {
        self.rt.block_on(self.store.close());
        self.rt.block_on(self.scratch.drop_database()).unwrap();
    }

    pub fn url(&self) -> &str {
        &self.scratch.url
    }

    pub fn leases(&self) -> Vec<Lease> {
        self.rt.block_on(self.store.list_leases()).unwrap()
    }

    fn live_leases(&self) -> impl Iterator<Item = Lease> {
        let now = Utc::now();
        self.leases()
            .into_iter()
            .filter(move |l| l.expires_at > now)
    }

    /// Accounts per live owner.
    pub fn owners(&self) -> BTreeMap<String, Vec<AccountId>> {
        let mut out: BTreeMap<String, Vec<AccountId>> = BTreeMap::new();
        for l in self.live_leases() {
            out.entry(l.node).or_default().push(l.account);
        }
        out
    }

    /// The live owner of each account.
    pub fn owner_of(&self) -> BTreeMap<AccountId, String> {
        self.live_leases().map(|l| (l.account, l.node)).collect()
    }

    pub fn run(&self, id: RunId) -> Run {
        self.rt.block_on(self.store.get_run(id)).unwrap().unwrap()
    }

    pub fn sent(&self, runs: &[RunId]) -> usize {
        runs.iter().map(|r| self.run(*r).counts.sent as usize).sum()
    }

    pub fn statuses(&self, runs: &[RunId]) -> Vec<RunStatus> {
        runs.iter().map(|r| self.run(*r).status).collect()
    }
}

/// Daemon `name` of the cluster on `db_url`, in `<dir>/<name>`: leases of
/// `lease_secs`, no typing, no warm-up, a 5 s drain, the cluster's one
/// session key file `<dir>/session.key` (a daemon with another key is
/// refused), then the test's own settings in `env`.
pub fn start_node(
    name: &str,
    dir: &Path,
    db_url: &str,
    token: &str,
    lease_secs: u64,
    env: &[(&str, String)],
) -> Daemon {
    let mut all = vec![
        ("HERALD_STORAGE__DATABASE_URL", db_url.to_owned()),
        ("HERALD_CLUSTER__ENABLED", "true".into()),
        ("HERALD_CLUSTER__NODE_ID", name.into()),
        ("HERALD_CLUSTER__LEASE_SECS", lease_secs.to_string()),
        ("HERALD_CONTROL__TOKEN", token.into()),
        ("HERALD_DELIVERY__TYPING", "false".into()),
        ("HERALD_DELIVERY__WARMUP", "off".into()),
        ("HERALD_DELIVERY__DRAIN_GRACE_SECS", "5".into()),
        (
            "HERALD_WHATSAPP__SESSION_KEY_FILE",
            dir.join("session.key").display().to_string(),
        ),
    ];
    all.extend(env.iter().cloned());
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    Daemon::start(&dir, &all)
}
