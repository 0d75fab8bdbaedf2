//! The cluster: several daemons on one PostgreSQL database share the
//! accounts through leases. The [`Keeper`] renews this daemon's leases,
//! takes free ones up to its fair share, hands the surplus over when
//! another daemon joins, and tells the supervisor which accounts to adopt
//! and release. It sits on the supervisor; nothing below imports it.

use crate::delivery::leases::LeaseTable;
use crate::domain::{AccountId, Fence, Lease};
use std::time::Duration;
use tokio::time::Instant;

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

/// A daemon's registration in the shared `nodes` table.
#[derive(Debug, Clone, Copy)]
pub struct Registration<'a> {
    pub node: &'a str,
    pub instance: &'a str,
    pub control_url: Option<&'a str>,
    pub ttl: Duration,
}

/// Registers `me`, waiting out a registration of the same node id that is
/// not being renewed (a killed daemon's, which expires within its time to
/// live): polls every `ttl/6`, and tells `waiting` the registration's end
/// once. A registration whose end moves while we wait is renewed by a
/// live daemon: Conflict, naming it. Never waits longer than one time to
/// live and a half (the registration cannot outlive its last renewal by
/// more than one).
pub async fn join_when_free(
    store: &dyn crate::ports::Store,
    me: Registration<'_>,
    mut waiting: impl FnMut(chrono::DateTime<chrono::Utc>),
) -> crate::ports::StoreResult<()> {
    use crate::ports::StoreError;
    let poll = (me.ttl / 6).max(Duration::from_millis(100));
    let give_up = Instant::now() + me.ttl + me.ttl / 2;
    let mut seen: Option<chrono::DateTime<chrono::Utc>> = None;
    loop {
        match store
            .node_heartbeat(me.node, me.instance, me.control_url, me.ttl)
            .await
        {
            Ok(()) => return Ok(()),
            Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
        let held_until = store
            .live_nodes()
            .await?
            .into_iter()
            .find(|n| n.node == me.node)
            .map(|n| n.expires_at);
        let renewed = |detail: &str| {
            StoreError::Conflict(format!(
                "node id {:?} is in use by another running Herald daemon: its registration {detail}; \
                 give each daemon its own cluster.node_id",
                me.node
            ))
        };
        match (held_until, seen) {
            // Expired since the heartbeat: take it at once.
            (None, _) => continue,
            (Some(until), None) => {
                seen = Some(until);
                waiting(until);
            }
            (Some(until), Some(first)) if until > first => {
                return Err(renewed(&format!(
                    "was renewed while this daemon waited for it to expire (until {first}, now \
                     until {until})"
                )))
            }
            (Some(_), Some(_)) => {}
        }
        if Instant::now() >= give_up {
            return Err(renewed("did not expire within its time to live"));
        }
        tokio::time::sleep(poll).await;
    }
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

    /// Registers this daemon as live. A node id still registered by an
    /// instance that no longer renews it (this daemon's own previous run,
    /// killed) is waited for until the registration expires, then taken;
    /// `waiting` is told until when first. Conflict if the registration
    /// is renewed meanwhile: a second live daemon with this node id.
    pub async fn join(
        &self,
        waiting: impl FnMut(chrono::DateTime<chrono::Utc>),
    ) -> crate::ports::StoreResult<()> {
        join_when_free(
            self.store.as_ref(),
            Registration {
                node: self.table.node(),
                instance: &self.instance,
                control_url: self.config.control_url.as_deref(),
                ttl: self.config.ttl,
            },
            waiting,
        )
        .await
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
        // An account being paired stays where its phone is scanning the
        // QR: handing it over would drop the pairing connection.
        let pairing: std::collections::HashSet<&AccountId> = accounts
            .iter()
            .filter(|a| a.state == crate::domain::AccountState::Pairing)
            .map(|a| &a.id)
            .collect();
        let mine: Vec<Fence> = self
            .table
            .held()
            .into_iter()
            .filter(|f| floating.contains(&f.account))
            .collect();
        if mine.len() > share {
            // A daemon joined: hand the surplus over, highest ids first.
            let surplus = mine.len() - share;
            let mut mine: Vec<Fence> = mine
                .into_iter()
                .filter(|f| !pairing.contains(&f.account))
                .collect();
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
                    // Told, not awaited: a supervisor slow to answer (a
                    // busy arbiter on a loaded machine) must not hold up
                    // the round's other takeovers. The account's actor
                    // acts only under the lease, whenever it starts.
                    self.supervisor
                        .do_send(crate::supervisor::Adopt(account.id.clone()));
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

    /// Takes `account`'s lease here if no daemon holds it: a request that
    /// only the owner can serve (pairing) arrived before any daemon took a
    /// new account, or while its lease was free. True when this daemon
    /// holds the lease afterwards; false when a live daemon holds it.
    pub async fn claim(&self, account: &AccountId) -> crate::ports::StoreResult<bool> {
        if self.table.holds(account) {
            return Ok(true);
        }
        let asked = Instant::now();
        let Some(lease) = self
            .store
            .acquire_lease(account, self.table.node(), self.config.ttl)
            .await?
        else {
            return Ok(false);
        };
        tracing::info!(account = %account, epoch = lease.epoch, "account lease taken on request");
        self.table.hold(
            account,
            lease.epoch,
            asked,
            self.config.ttl,
            self.config.margin,
        );
        self.supervisor
            .do_send(crate::supervisor::Adopt(account.clone()));
        Ok(true)
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
        // Waited for at most the grace and a second: a supervisor slow to
        // answer delays the handover by no more than that.
        let release = self.supervisor.send(crate::supervisor::Release {
            account: fence.account.clone(),
            grace: self.release_grace(),
        });
        if tokio::time::timeout(self.release_grace() + Duration::from_secs(1), release)
            .await
            .is_err()
        {
            tracing::warn!(account = %fence.account, "the supervisor did not confirm the drain in time; handing the account over anyway");
        }
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

#[cfg(test)]
mod join_tests {
    use super::*;
    use crate::memstore::MemoryStore;
    use crate::ports::{LeaseStore, StoreError, TokioClock};
    use std::sync::Arc;

    const TTL: Duration = Duration::from_secs(15);

    fn me(instance: &str) -> Registration<'_> {
        Registration {
            node: "n2",
            instance,
            control_url: Some("http://127.0.0.1:8790"),
            ttl: TTL,
        }
    }

    fn fresh_store() -> Arc<MemoryStore> {
        let t0 = "2026-11-28T06:00:00Z".parse().unwrap();
        Arc::new(MemoryStore::with_clock(Arc::new(TokioClock::starting_at(
            t0,
        ))))
    }

    #[tokio::test(start_paused = true)]
    async fn a_killed_instances_registration_is_waited_out_then_taken() {
        let store = fresh_store();
        // The previous run registered, then was SIGKILLed 2 s later.
        store.node_heartbeat("n2", "old", None, TTL).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        let mut told = Vec::new();
        join_when_free(store.as_ref(), me("new"), |until| told.push(until))
            .await
            .unwrap();
        let waited = started.elapsed();
        // Taken within one poll of the old registration's end.
        assert!(waited >= TTL - Duration::from_secs(2), "{waited:?}");
        assert!(
            waited <= TTL - Duration::from_secs(2) + TTL / 6,
            "{waited:?}"
        );
        assert_eq!(told.len(), 1, "told once: {told:?}");
        let live = store.live_nodes().await.unwrap();
        assert_eq!(live.len(), 1);
        assert_eq!(
            live[0].control_url.as_deref(),
            Some("http://127.0.0.1:8790")
        );
        // A free node id is taken at once, without waiting.
        let other = fresh_store();
        let started = Instant::now();
        join_when_free(other.as_ref(), me("new"), |_| panic!("nothing to wait for"))
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_registration_renewed_while_waiting_is_a_second_live_daemon() {
        let store = fresh_store();
        store.node_heartbeat("n2", "live", None, TTL).await.unwrap();
        // The live daemon renews every ttl/3, as its keeper does.
        let renewing = {
            let store = store.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(TTL / 3).await;
                    store.node_heartbeat("n2", "live", None, TTL).await.unwrap();
                }
            })
        };
        let started = Instant::now();
        let e = join_when_free(store.as_ref(), me("second"), |_| {})
            .await
            .unwrap_err();
        renewing.abort();
        let StoreError::Conflict(msg) = e else {
            panic!("{e:?}")
        };
        assert!(
            msg.contains("node id \"n2\" is in use by another running Herald daemon"),
            "{msg}"
        );
        assert!(msg.contains("renewed while this daemon waited"), "{msg}");
        // Found out at the first renewal, not after a time to live.
        assert!(
            started.elapsed() <= TTL / 3 + TTL / 6,
            "{:?}",
            started.elapsed()
        );
    }
}
