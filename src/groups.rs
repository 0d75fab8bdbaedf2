//! Each account's group directory, kept fresh from WhatsApp.
//!
//! A sync is one "which groups am I in" query to the account's gateway,
//! stored with [`Store::sync_groups`]. It runs when an account connects and
//! when an operator asks, never from the send loop (peers that fetch group
//! metadata while sending are the ones WhatsApp answers with
//! "rate-overlimit"), and at most once per `groups.min_sync_interval_secs`
//! per account, counted from the last attempt, successful or not, and
//! from the stored last sync, so a restart does not reset it.

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use herald_actors::domain::{AccountId, AccountState, GroupSyncSummary};
use herald_actors::ports::{Clock, GatewayError, GatewayRegistry, Store, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// Why a sync did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("no account '{0}'")]
    UnknownAccount(AccountId),
    /// Too soon after the last sync or attempt; try again after `retry_after`.
    #[error("the group list of '{account}' was synced or tried less than {min_interval_secs} s ago; try again in {} s", retry_after.as_secs().max(1))]
    Throttled {
        account: AccountId,
        retry_after: Duration,
        min_interval_secs: u64,
    },
    #[error("account '{0}' is {1}: it cannot list its groups until it is connected")]
    NotConnected(AccountId, AccountState),
    #[error("WhatsApp did not list the groups of '{0}': {1}")]
    Gateway(AccountId, GatewayError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The group directory's keeper, shared by the control port and start-up.
pub struct GroupDirectory {
    store: Arc<dyn Store>,
    gateways: Arc<dyn GatewayRegistry>,
    clock: Arc<dyn Clock>,
    min_interval: Duration,
    /// Last attempt per account, successful or not: a gateway that keeps
    /// failing is not asked again before the interval either.
    attempts: DashMap<AccountId, DateTime<Utc>>,
}

impl GroupDirectory {
    pub fn new(
        store: Arc<dyn Store>,
        gateways: Arc<dyn GatewayRegistry>,
        clock: Arc<dyn Clock>,
        min_interval: Duration,
    ) -> Self {
        Self {
            store,
            gateways,
            clock,
            min_interval,
            attempts: DashMap::new(),
        }
    }

    /// Lists the account's groups from WhatsApp and stores them.
    pub async fn sync(&self, account: &AccountId) -> Result<GroupSyncSummary, SyncError> {
        let acc = self
            .store
            .get_account(account)
            .await?
            .ok_or_else(|| SyncError::UnknownAccount(account.clone()))?;
        if acc.state != AccountState::Connected {
            return Err(SyncError::NotConnected(account.clone(), acc.state));
        }
        let now = self.clock.now();
        let stored = self.store.groups_synced_at(account).await?;
        self.claim(account, now, stored)?;
        let gateway = self.gateways.gateway(acc.kind).ok_or_else(|| {
            SyncError::Gateway(
                account.clone(),
                GatewayError::Unsupported("no such gateway in this build of Herald"),
            )
        })?;
        let groups = gateway
            .list_groups(account)
            .await
            .map_err(|e| SyncError::Gateway(account.clone(), e))?;
        let summary = self
            .store
            .sync_groups(account, &groups, self.clock.now())
            .await?;
        tracing::info!(
            account = %account,
            total = summary.total,
            added = summary.added,
            updated = summary.updated,
            left = summary.left,
            "group directory synced"
        );
        Ok(summary)
    }

    /// Takes the account's sync slot if the interval since its last sync
    /// or attempt has passed. The check and the claim happen under the
    /// map's entry lock, so two concurrent requests cannot both query.
    fn claim(
        &self,
        account: &AccountId,
        now: DateTime<Utc>,
        stored: Option<DateTime<Utc>>,
    ) -> Result<(), SyncError> {
        let mut entry = self
            .attempts
            .entry(account.clone())
            .or_insert(DateTime::UNIX_EPOCH);
        let last = (*entry).max(stored.unwrap_or(DateTime::UNIX_EPOCH));
        let next = last + chrono::Duration::from_std(self.min_interval).unwrap_or_default();
        if now < next {
            return Err(SyncError::Throttled {
                account: account.clone(),
                retry_after: (next - now).to_std().unwrap_or_default(),
                min_interval_secs: self.min_interval.as_secs(),
            });
        }
        *entry = now;
        Ok(())
    }

    /// Syncs every connected account in the background, a few at a time:
    /// at start-up, each account's directory catches up with what changed
    /// while the daemon was down. Failures are logged, not fatal.
    pub fn sync_connected_in_background(self: &Arc<Self>) {
        let this = self.clone();
        actix_rt::spawn(async move {
            let accounts = match this.store.list_accounts().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "could not list accounts for the group sync");
                    return;
                }
            };
            use futures_util::StreamExt;
            futures_util::stream::iter(
                accounts
                    .into_iter()
                    .filter(|a| a.state == AccountState::Connected),
            )
            .for_each_concurrent(4, |a| {
                let this = this.clone();
                async move { this.sync_quietly(&a.id).await }
            })
            .await;
        });
    }

    /// A new account's first sync. A passing store failure (a busy
    /// database) is tried again at once, a few times, outside the
    /// throttle: otherwise the account would be created with an empty
    /// directory that cannot be synced again for the whole interval.
    pub async fn sync_new(&self, account: &AccountId) -> Result<GroupSyncSummary, SyncError> {
        let mut wait = Duration::from_millis(50);
        let mut tries = 1;
        loop {
            match self.sync(account).await {
                Err(SyncError::Store(StoreError::Backend(e))) if tries < 4 => {
                    tracing::warn!(account = %account, error = %e, "first group sync failed; trying again");
                    self.attempts.remove(account);
                    tokio::time::sleep(wait).await;
                    wait *= 4;
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// A sync whose failure is only logged (start-up, a new account).
    pub async fn sync_quietly(&self, account: &AccountId) {
        match self.sync(account).await {
            Ok(_) | Err(SyncError::Throttled { .. }) => {}
            Err(e) => tracing::warn!(account = %account, error = %e, "group sync failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_actors::domain::*;
    use herald_actors::memstore::MemoryStore;
    use herald_actors::ports::{AccountStore, GroupStore};
    use herald_actors::ports::{NewAccount, TokioClock};
    use herald_actors::simulator::{GroupAccess, SimConfig, Simulator};
    use herald_actors::world::SimulatorOnly;

    fn t0() -> DateTime<Utc> {
        "2026-11-23T01:00:00Z".parse().unwrap()
    }

    async fn world() -> (
        Arc<GroupDirectory>,
        Arc<Simulator>,
        Arc<MemoryStore>,
        AccountId,
    ) {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(t0()));
        let sim = Arc::new(Simulator::new(SimConfig::instant(), clock.clone()));
        let store = Arc::new(MemoryStore::new());
        let a = AccountId::parse("a1").unwrap();
        store
            .create_account(
                &NewAccount {
                    id: a.clone(),
                    name: "a1".into(),
                    kind: GatewayKind::Simulator,
                    state: AccountState::Connected,
                    limits: AccountLimits::default(),
                },
                t0(),
            )
            .await
            .unwrap();
        let dir = Arc::new(GroupDirectory::new(
            store.clone(),
            Arc::new(SimulatorOnly(sim.clone())),
            clock,
            Duration::from_secs(300),
        ));
        (dir, sim, store, a)
    }

    #[tokio::test(start_paused = true)]
    async fn a_sync_stores_the_list_and_is_throttled_until_the_interval_passes() {
        let (dir, sim, store, a) = world().await;
        let g = sim.add_numbered_groups(&a, 5);
        sim.set_group_name(&a, &g[0], "Clients KL");
        let first = dir.sync(&a).await.unwrap();
        assert_eq!((first.added, first.total), (5, 5));

        sim.set_group_access(&a, &g[4], GroupAccess::NotParticipant);
        match dir.sync(&a).await {
            Err(SyncError::Throttled { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_secs(300))
            }
            other => panic!("expected throttled, got {other:?}"),
        }
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(matches!(
            dir.sync(&a).await,
            Err(SyncError::Throttled { .. })
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = dir.sync(&a).await.unwrap();
        assert_eq!((second.left, second.total), (1, 4));
        let page = store
            .list_groups(&GroupFilter::all_of(a.clone()))
            .await
            .unwrap();
        assert_eq!(page.items[0].info.subject, "Clients KL");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_query_counts_against_the_interval_and_stores_nothing() {
        let (dir, sim, store, a) = world().await;
        sim.add_numbered_groups(&a, 3);
        sim.log_out(&a);
        assert!(matches!(
            dir.sync(&a).await,
            Err(SyncError::Gateway(_, GatewayError::LoggedOut))
        ));
        assert_eq!(store.groups_synced_at(&a).await.unwrap(), None);
        sim.reconnect(&a);
        assert!(
            matches!(dir.sync(&a).await, Err(SyncError::Throttled { .. })),
            "a failing gateway is not asked again at once"
        );
        tokio::time::advance(Duration::from_secs(300)).await;
        assert_eq!(dir.sync(&a).await.unwrap().total, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_accounts_first_sync_outlasts_a_busy_database() {
        let (dir, sim, store, a) = world().await;
        sim.add_numbered_groups(&a, 4);
        store.fail_next_group_syncs(2);
        assert_eq!(dir.sync_new(&a).await.unwrap().total, 4);
        // A database that stays down is reported, not retried forever.
        let (dir, sim, store, b) = world().await;
        sim.add_numbered_groups(&b, 4);
        store.fail_next_group_syncs(10);
        assert!(matches!(
            dir.sync_new(&b).await,
            Err(SyncError::Store(StoreError::Backend(_)))
        ));
        assert_eq!(store.groups_synced_at(&b).await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_stored_sync_time_throttles_a_fresh_directory_too() {
        let (dir, sim, store, a) = world().await;
        sim.add_numbered_groups(&a, 2);
        dir.sync(&a).await.unwrap();
        // A new keeper (a restarted daemon) reads the last sync from the store.
        let again = GroupDirectory::new(
            store.clone(),
            Arc::new(SimulatorOnly(sim.clone())),
            Arc::new(TokioClock::starting_at(t0())),
            Duration::from_secs(300),
        );
        assert!(matches!(
            again.sync(&a).await,
            Err(SyncError::Throttled { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn accounts_that_cannot_send_or_do_not_exist_are_refused() {
        let (dir, _sim, store, a) = world().await;
        store
            .set_account_state(&a, AccountState::Disabled, Some("off"))
            .await
            .unwrap();
        assert!(matches!(
            dir.sync(&a).await,
            Err(SyncError::NotConnected(_, AccountState::Disabled))
        ));
        let nobody = AccountId::parse("nobody").unwrap();
        assert!(matches!(
            dir.sync(&nobody).await,
            Err(SyncError::UnknownAccount(_))
        ));
    }
}
