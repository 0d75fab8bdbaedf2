//! Account leases: with several daemons on one database, each account is
//! owned by exactly one live daemon, proven by a [`Fence`] (the owner and
//! the lease's epoch, which grows on every change of owner).
//!
//! The store keeps the lease rows and refuses a durable mark whose fence is
//! not the current one; the gateway refuses a send whose epoch is older
//! than one it has already seen for the account. This module keeps the
//! daemon's own view: which leases it holds and until when it may act on
//! them by its *local monotonic* clock. That deadline is counted from the
//! moment the renewal was asked for, minus a margin, so it always passes
//! before the database's expiry does: a daemon that cannot renew stops
//! acting first (fail closed), even if it was paused and wakes up late.

use crate::domain::AccountId;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;

/// Proof that `node` holds `account`'s lease at `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fence {
    pub account: AccountId,
    pub node: String,
    pub epoch: i64,
}

/// This daemon does not hold the account's lease now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this daemon no longer holds the account's lease")]
pub struct LeaseLost;

/// A lease row as the store answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    pub account: AccountId,
    pub node: String,
    pub epoch: i64,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    /// Whether it had expired when read, on the database's clock: free to
    /// take. (A daemon's own clock may disagree with the database's.)
    pub expired: bool,
}

impl Fence {
    /// What a store answers a write under this fence once it is not the
    /// account's current lease.
    pub fn refused(&self) -> crate::ports::StoreError {
        crate::ports::StoreError::Fenced(format!(
            "account {} is no longer leased to daemon {} at epoch {}",
            self.account, self.node, self.epoch
        ))
    }
}

impl Lease {
    /// Whether `fence` is this lease, unexpired at `now`.
    pub fn is_held_by(&self, fence: &Fence, now: chrono::DateTime<chrono::Utc>) -> bool {
        self.node == fence.node && self.epoch == fence.epoch && self.expires_at > now
    }

    pub fn fence(&self) -> Fence {
        Fence {
            account: self.account.clone(),
            node: self.node.clone(),
            epoch: self.epoch,
        }
    }
}

/// A live daemon as the store answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    pub node: String,
    /// Where its control port answers (for forwarding), if it said.
    pub control_url: Option<String>,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Clone)]
struct Held {
    epoch: i64,
    /// Local deadline: after it, this daemon does nothing for the account.
    valid_until: Instant,
}

/// Until when a lease asked for at `asked_at` may be acted on: its `ttl`
/// counted from the request, less `margin`.
fn deadline(asked_at: Instant, ttl: Duration, margin: Duration) -> Instant {
    asked_at + ttl.saturating_sub(margin)
}

/// The leases this daemon holds, shared by its account actors (a send or
/// a mark asks [`LeaseTable::fence`] first) and its lease keeper.
#[derive(Debug)]
pub struct LeaseTable {
    node: String,
    held: DashMap<AccountId, Held>,
}

impl LeaseTable {
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            held: DashMap::new(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The fence to act with for `account`, or `None` if this daemon does
    /// not hold its lease or its local deadline has passed.
    pub fn fence(&self, account: &AccountId) -> Option<Fence> {
        let held = self.held.get(account)?;
        (Instant::now() < held.valid_until).then(|| Fence {
            account: account.clone(),
            node: self.node.clone(),
            epoch: held.epoch,
        })
    }

    /// Records a lease taken or renewed at `epoch`, for `ttl` counted from
    /// `asked_at` (when the request left, not when it was answered), less
    /// `margin`.
    pub fn hold(
        &self,
        account: &AccountId,
        epoch: i64,
        asked_at: Instant,
        ttl: Duration,
        margin: Duration,
    ) {
        let valid_until = deadline(asked_at, ttl, margin);
        self.held
            .insert(account.clone(), Held { epoch, valid_until });
    }

    /// Moves the local deadline of a lease renewed at `epoch`, if it is
    /// still held at that epoch: a lease dropped or taken again while its
    /// renewal was in flight is not brought back.
    pub fn extend(
        &self,
        account: &AccountId,
        epoch: i64,
        asked_at: Instant,
        ttl: Duration,
        margin: Duration,
    ) -> bool {
        match self.held.get_mut(account) {
            Some(mut h) if h.epoch == epoch => {
                h.valid_until = deadline(asked_at, ttl, margin);
                true
            }
            _ => false,
        }
    }

    /// Forgets a lease (released, or lost to another daemon).
    pub fn drop_lease(&self, account: &AccountId) -> Option<i64> {
        self.held.remove(account).map(|(_, h)| h.epoch)
    }

    /// Forgets a lease only if it is still held at `epoch`.
    pub fn drop_epoch(&self, account: &AccountId, epoch: i64) -> bool {
        self.held
            .remove_if(account, |_, h| h.epoch == epoch)
            .is_some()
    }

    /// Every lease held, valid or not, with its epoch, by account (a
    /// stable order: the seeded simulation replays what follows from it).
    pub fn held(&self) -> Vec<Fence> {
        let mut held: Vec<Fence> = self
            .held
            .iter()
            .map(|e| Fence {
                account: e.key().clone(),
                node: self.node.clone(),
                epoch: e.value().epoch,
            })
            .collect();
        held.sort_by(|a, b| a.account.cmp(&b.account));
        held
    }

    pub fn holds(&self, account: &AccountId) -> bool {
        self.held.contains_key(account)
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_stops_counting_before_the_database_would_expire_it() {
        let t = LeaseTable::new("n1");
        let a = AccountId::parse("acct").unwrap();
        let asked = Instant::now();
        // The answer came 2 s after the request: the deadline still counts
        // from the request.
        tokio::time::advance(Duration::from_secs(2)).await;
        t.hold(
            &a,
            7,
            asked,
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
        assert_eq!(t.fence(&a).map(|f| f.epoch), Some(7));
        tokio::time::advance(Duration::from_millis(6_999)).await;
        assert!(t.fence(&a).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            t.fence(&a),
            None,
            "9 s after the request, 1 s before expiry"
        );
        assert!(t.holds(&a), "still held until the keeper drops it");
        assert_eq!(t.drop_lease(&a), Some(7));
        assert!(t.fence(&a).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_renewal_never_brings_back_a_lease_dropped_or_taken_again() {
        let t = LeaseTable::new("n1");
        let a = AccountId::parse("acct").unwrap();
        let ttl = Duration::from_secs(10);
        let margin = Duration::from_secs(2);
        t.hold(&a, 3, Instant::now(), ttl, margin);
        // The renewal of epoch 3 was asked for here...
        let asked = Instant::now();
        // ...meanwhile a handover dropped the lease.
        assert!(t.drop_epoch(&a, 3));
        assert!(!t.extend(&a, 3, asked, ttl, margin));
        assert!(!t.holds(&a));
        // Taken again at epoch 4: neither a late renewal nor a late loss
        // of epoch 3 touches it.
        t.hold(&a, 4, Instant::now(), ttl, margin);
        tokio::time::advance(Duration::from_secs(7)).await;
        assert!(!t.extend(&a, 3, Instant::now(), ttl, margin));
        assert!(!t.drop_epoch(&a, 3));
        assert_eq!(t.fence(&a).map(|f| f.epoch), Some(4));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(t.fence(&a), None, "epoch 4's deadline was not moved");
        // Its own renewal moves it.
        assert!(t.extend(&a, 4, Instant::now(), ttl, margin));
        assert_eq!(t.fence(&a).map(|f| f.epoch), Some(4));
    }
}

// ---------------------------------------------------------------- keeper

/// How a daemon keeps its leases.
#[derive(Debug, Clone)]
pub struct KeeperConfig {
    /// How long a taken or renewed lease lasts on the database's clock.
    pub ttl: Duration,
    /// How often leases are renewed and shares rebalanced (ttl/3).
    pub every: Duration,
    /// Taken off the local deadline: the daemon stops acting this long
    /// before the database could hand the account to another.
    pub margin: Duration,
    /// Where other daemons reach this one's control port.
    pub control_url: Option<String>,
    /// How long a released account's parts in flight may take.
    pub drain_grace: Duration,
}

impl KeeperConfig {
    pub fn for_ttl(ttl: Duration) -> Self {
        Self {
            ttl,
            every: ttl / 3,
            margin: ttl / 5,
            control_url: None,
            drain_grace: Duration::from_secs(20),
        }
    }
}

/// Where an account may be served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Any daemon: shared out evenly (simulated accounts).
    Floating,
    /// Only this daemon: it holds the account's WhatsApp session, which
    /// lives in its data directory. Always taken when free; never handed
    /// over to balance.
    Pinned,
    /// Not this daemon: the session lives elsewhere.
    Elsewhere,
}

/// Says where an account may be served from.
pub type Placer = Box<dyn Fn(&crate::domain::Account) -> Placement + Send + Sync>;

/// Renews this daemon's leases, takes free ones up to its fair share, and
/// hands the surplus over when other daemons join.
pub struct Keeper {
    store: std::sync::Arc<dyn crate::ports::Store>,
    table: std::sync::Arc<LeaseTable>,
    supervisor: actix::Addr<crate::supervisor::Supervisor>,
    /// Drawn at start: tells this run of the daemon from an earlier one.
    instance: String,
    config: KeeperConfig,
    placer: Placer,
    /// Each account's row as last seen: a change made through another
    /// daemon's control port reaches this one's actor within a round.
    seen: std::sync::Mutex<std::collections::HashMap<AccountId, crate::domain::Account>>,
}

/// Accounts each of `nodes` daemons should own: an even share, rounded up.
pub fn fair_share(accounts: usize, nodes: usize) -> usize {
    accounts.div_ceil(nodes.max(1))
}

impl Keeper {
    pub fn new(
        store: std::sync::Arc<dyn crate::ports::Store>,
        table: std::sync::Arc<LeaseTable>,
        supervisor: actix::Addr<crate::supervisor::Supervisor>,
        config: KeeperConfig,
        placer: Placer,
    ) -> Self {
        let instance = format!("{}-{:016x}", std::process::id(), rand::random::<u64>());
        Self {
            store,
            table,
            supervisor,
            instance,
            config,
            placer,
            seen: Default::default(),
        }
    }

    pub fn table(&self) -> &std::sync::Arc<LeaseTable> {
        &self.table
    }

    /// Registers this daemon as live; Conflict if its node id is in use.
    pub async fn join(&self) -> crate::ports::StoreResult<()> {
        self.heartbeat().await
    }

    async fn heartbeat(&self) -> crate::ports::StoreResult<()> {
        self.store
            .node_heartbeat(
                self.table.node(),
                &self.instance,
                self.config.control_url.as_deref(),
                self.config.ttl,
            )
            .await
    }

    /// One round: [`keep`](Self::keep), then [`rebalance`](Self::rebalance).
    /// Errors leave the local deadlines to lapse by themselves (fail closed).
    pub async fn tick(&self) -> crate::ports::StoreResult<()> {
        self.keep().await?;
        self.rebalance().await
    }

    /// Heartbeat and renewal of every lease held. Never waits on an
    /// account's actor: a renewal that comes late lapses every lease.
    pub async fn keep(&self) -> crate::ports::StoreResult<()> {
        self.heartbeat().await?;
        self.renew().await
    }

    async fn renew(&self) -> crate::ports::StoreResult<()> {
        let held = self.table.held();
        if held.is_empty() {
            return Ok(());
        }
        let asked = Instant::now();
        let renewed = self.store.renew_leases(&held, self.config.ttl).await?;
        for (fence, ok) in held.into_iter().zip(renewed) {
            if ok {
                self.table.extend(
                    &fence.account,
                    fence.epoch,
                    asked,
                    self.config.ttl,
                    self.config.margin,
                );
            } else if self.table.drop_epoch(&fence.account, fence.epoch) {
                // (Not dropped here: a handover released it meanwhile.)
                tracing::warn!(account = %fence.account, epoch = fence.epoch, "account lease lost: another daemon owns it now");
                // The drop already stops the account's run; its actor
                // drains on its own time, not the renewal's.
                self.supervisor.do_send(crate::supervisor::Release {
                    account: fence.account,
                    grace: self.release_grace(),
                });
            }
        }
        Ok(())
    }

    /// Takes free accounts up to this daemon's fair share and hands the
    /// surplus over. A handover waits for its account's drain, so this runs
    /// beside [`keep`](Self::keep), never in its way.
    pub async fn rebalance(&self) -> crate::ports::StoreResult<()> {
        let nodes = self.store.live_nodes().await?;
        let accounts = self.store.list_accounts().await?;
        self.notice_changes(&accounts);
        let placed: Vec<(&crate::domain::Account, Placement)> =
            accounts.iter().map(|a| (a, (self.placer)(a))).collect();
        let floating: std::collections::HashSet<&AccountId> = placed
            .iter()
            .filter(|(_, p)| *p == Placement::Floating)
            .map(|(a, _)| &a.id)
            .collect();
        let share = fair_share(floating.len(), nodes.len());
        let mine: Vec<Fence> = self
            .table
            .held()
            .into_iter()
            .filter(|f| floating.contains(&f.account))
            .collect();
        if mine.len() > share {
            // A daemon joined: hand the surplus over, highest ids first.
            let surplus = mine.len() - share;
            let mut mine = mine;
            mine.sort_by(|a, b| b.account.cmp(&a.account));
            for fence in mine.into_iter().take(surplus) {
                self.hand_over(fence).await;
            }
        }
        let live: std::collections::HashSet<&str> = nodes.iter().map(|n| n.node.as_str()).collect();
        let leases: std::collections::HashMap<AccountId, Lease> = self
            .store
            .list_leases()
            .await?
            .into_iter()
            .map(|l| (l.account.clone(), l))
            .collect();
        // Free: never leased, released, expired, or held by a daemon no
        // longer live. The database has the last word on each.
        let is_free = |id: &AccountId| match leases.get(id) {
            None => true,
            Some(l) => !live.contains(l.node.as_str()) || l.expired,
        };
        let mut want = share.saturating_sub(
            self.table
                .held()
                .iter()
                .filter(|f| floating.contains(&f.account))
                .count(),
        );
        // Pinned accounts first and always; floating ones up to the share.
        let mut candidates: Vec<&(&crate::domain::Account, Placement)> = placed
            .iter()
            .filter(|(_, p)| *p != Placement::Elsewhere)
            .collect();
        candidates.sort_by_key(|(_, p)| *p != Placement::Pinned);
        for (account, placement) in candidates {
            if self.table.holds(&account.id) || !is_free(&account.id) {
                continue;
            }
            if *placement == Placement::Floating {
                if want == 0 {
                    break;
                }
                want -= 1;
            }
            let asked = Instant::now();
            match self
                .store
                .acquire_lease(&account.id, self.table.node(), self.config.ttl)
                .await
            {
                Ok(Some(lease)) => {
                    tracing::info!(account = %account.id, epoch = lease.epoch, "account lease taken");
                    self.table.hold(
                        &account.id,
                        lease.epoch,
                        asked,
                        self.config.ttl,
                        self.config.margin,
                    );
                    self.supervisor
                        .send(crate::supervisor::Adopt(account.id.clone()))
                        .await
                        .ok();
                }
                // Someone else was quicker; try the next one.
                Ok(None) => {
                    if *placement == Placement::Floating {
                        want += 1;
                    }
                }
                // Deleted meanwhile.
                Err(crate::ports::StoreError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Tells the actors of held accounts whose row changed (limits, state)
    /// since the last round: the change may have come through another
    /// daemon, whose supervisor has no actor to tell.
    fn notice_changes(&self, accounts: &[crate::domain::Account]) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for a in accounts {
            let changed = seen.get(&a.id).is_some_and(|old| old != a);
            if changed && self.table.holds(&a.id) {
                self.supervisor
                    .do_send(crate::supervisor::AccountUpdated(a.id.clone()));
            }
            seen.insert(a.id.clone(), a.clone());
        }
        let listed: std::collections::HashSet<&AccountId> =
            accounts.iter().map(|a| &a.id).collect();
        seen.retain(|id, _| listed.contains(id));
    }

    /// How long a released account's parts in flight may take: short of a
    /// round, so the other leases are renewed on time meanwhile.
    fn release_grace(&self) -> Duration {
        self.config.drain_grace.min(self.config.every)
    }

    /// Stops acting for the account, waits for its parts in flight, then
    /// ends the lease so another daemon can take it at once.
    async fn hand_over(&self, fence: Fence) {
        tracing::info!(account = %fence.account, epoch = fence.epoch, "handing account lease over");
        // Drained while the lease still holds, so the last parts' marks
        // land; a drain longer than the lease lapses it, failing closed.
        self.supervisor
            .send(crate::supervisor::Release {
                account: fence.account.clone(),
                grace: self.release_grace(),
            })
            .await
            .ok();
        self.table.drop_lease(&fence.account);
        if let Err(e) = self.store.release_lease(&fence).await {
            tracing::warn!(account = %fence.account, error = %e, "could not release the lease; it expires by itself");
        }
    }

    /// SIGTERM: hands every lease over and leaves the cluster. Call after
    /// the accounts were drained and the marks flushed.
    pub async fn leave(&self) {
        for fence in self.table.held() {
            self.table.drop_lease(&fence.account);
            if let Err(e) = self.store.release_lease(&fence).await {
                tracing::warn!(account = %fence.account, error = %e, "could not release the lease; it expires by itself");
            }
        }
        if let Err(e) = self
            .store
            .node_leave(self.table.node(), &self.instance)
            .await
        {
            tracing::warn!(error = %e, "could not leave the cluster; the node row expires by itself");
        }
    }

    /// Renews every `config.every`, and rebalances as often in a loop of
    /// its own, until the task is aborted: a handover draining an account
    /// must not hold up the renewal of the others.
    pub fn spawn(self: std::sync::Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let keeping = async {
                loop {
                    if let Err(e) = self.keep().await {
                        tracing::warn!(error = %e, "lease renewal failed; leases not renewed lapse by themselves");
                    }
                    tokio::time::sleep(self.config.every).await;
                }
            };
            let balancing = async {
                loop {
                    if let Err(e) = self.rebalance().await {
                        tracing::warn!(error = %e, "lease rebalancing failed; the next round tries again");
                    }
                    tokio::time::sleep(self.config.every).await;
                }
            };
            tokio::join!(keeping, balancing);
        })
    }
}
