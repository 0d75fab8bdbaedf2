//! Account leases as values: with several daemons on one database, each
//! account is owned by exactly one live daemon, proven by a [`Fence`] (the
//! owner and the lease's epoch, which grows on every change of owner). The
//! store keeps the rows (`ports::LeaseStore`); the delivery engine's lease
//! table (`delivery::leases`) and the cluster's keeper act on them.

use super::AccountId;
use serde::{Deserialize, Serialize};

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
