//! Daemons and account leases in memory: [`LeaseStore`], on the store's
//! clock like the SQL store's.

use super::{ttl_after, MemoryStore, NodeRow};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;

#[async_trait]
impl LeaseStore for MemoryStore {
    // ------------------------------------------------------------ leases

    async fn node_heartbeat(
        &self,
        node: &str,
        instance: &str,
        control_url: Option<&str>,
        ttl: std::time::Duration,
    ) -> StoreResult<()> {
        let now = self.now();
        let mut g = self.lock()?;
        if let Some(row) = g.nodes.get(node) {
            if row.instance != instance && row.expires_at > now {
                return Err(StoreError::Conflict(format!(
                    "node id {node} is in use by another live daemon"
                )));
            }
        }
        g.nodes.insert(
            node.to_string(),
            NodeRow {
                instance: instance.to_string(),
                control_url: control_url.map(str::to_string),
                expires_at: ttl_after(now, ttl),
            },
        );
        Ok(())
    }

    async fn node_leave(&self, node: &str, instance: &str) -> StoreResult<()> {
        let mut g = self.lock()?;
        if g.nodes.get(node).is_some_and(|r| r.instance == instance) {
            g.nodes.remove(node);
        }
        Ok(())
    }

    async fn live_nodes(&self) -> StoreResult<Vec<crate::domain::NodeInfo>> {
        let now = self.now();
        let g = self.lock()?;
        Ok(g.nodes
            .iter()
            .filter(|(_, r)| r.expires_at > now)
            .map(|(node, r)| crate::domain::NodeInfo {
                node: node.clone(),
                control_url: r.control_url.clone(),
                expires_at: r.expires_at,
            })
            .collect())
    }

    async fn list_leases(&self) -> StoreResult<Vec<crate::domain::Lease>> {
        let now = self.now();
        let g = self.lock()?;
        Ok(g.leases
            .values()
            .map(|l| crate::domain::Lease {
                expired: l.expires_at <= now,
                ..l.clone()
            })
            .collect())
    }

    async fn acquire_lease(
        &self,
        account: &AccountId,
        node: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<Option<crate::domain::Lease>> {
        let now = self.now();
        let mut g = self.lock()?;
        if !g.accounts.contains_key(account) {
            return Err(StoreError::NotFound(format!("account {account}")));
        }
        let epoch = match g.leases.get(account) {
            None => 1,
            Some(l) if l.expires_at <= now => l.epoch + 1,
            Some(_) => return Ok(None),
        };
        let lease = crate::domain::Lease {
            account: account.clone(),
            node: node.to_string(),
            epoch,
            expires_at: ttl_after(now, ttl),
            expired: false,
        };
        g.leases.insert(account.clone(), lease.clone());
        Ok(Some(lease))
    }

    async fn renew_leases(
        &self,
        fences: &[crate::domain::Fence],
        ttl: std::time::Duration,
    ) -> StoreResult<Vec<bool>> {
        let now = self.now();
        let mut g = self.lock()?;
        Ok(fences
            .iter()
            .map(|f| match g.leases.get_mut(&f.account) {
                Some(l) if l.is_held_by(f, now) => {
                    l.expires_at = ttl_after(now, ttl);
                    true
                }
                _ => false,
            })
            .collect())
    }

    async fn release_lease(&self, fence: &crate::domain::Fence) -> StoreResult<()> {
        let now = self.now();
        let mut g = self.lock()?;
        if g.check_fences(std::slice::from_ref(fence), now).is_ok() {
            if let Some(l) = g.leases.get_mut(&fence.account) {
                l.expires_at = now;
            }
        }
        Ok(())
    }
}
