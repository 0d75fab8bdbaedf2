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

/// A lease row as the store answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    pub account: AccountId,
    pub node: String,
    pub epoch: i64,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

impl Lease {
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
        let valid_until = asked_at + ttl.saturating_sub(margin);
        self.held
            .insert(account.clone(), Held { epoch, valid_until });
    }

    /// Forgets a lease (released, or lost to another daemon).
    pub fn drop_lease(&self, account: &AccountId) -> Option<i64> {
        self.held.remove(account).map(|(_, h)| h.epoch)
    }

    /// Every lease held, valid or not, with its epoch.
    pub fn held(&self) -> Vec<Fence> {
        self.held
            .iter()
            .map(|e| Fence {
                account: e.key().clone(),
                node: self.node.clone(),
                epoch: e.value().epoch,
            })
            .collect()
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
        t.hold(&a, 7, asked, Duration::from_secs(10), Duration::from_secs(1));
        assert_eq!(t.fence(&a).map(|f| f.epoch), Some(7));
        tokio::time::advance(Duration::from_millis(6_999)).await;
        assert!(t.fence(&a).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(t.fence(&a), None, "9 s after the request, 1 s before expiry");
        assert!(t.holds(&a), "still held until the keeper drops it");
        assert_eq!(t.drop_lease(&a), Some(7));
        assert!(t.fence(&a).is_none());
    }
}
