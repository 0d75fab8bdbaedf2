//! Several daemons: which daemon holds an account's lease, so an
//! operation that must reach the account's actor is performed there.

use super::error::{ApiError, Kind};
use super::Service;
use herald_actors::cluster::Keeper;
use herald_actors::delivery::leases::LeaseTable;
use herald_actors::domain::AccountId;
use herald_actors::ports::Store;
use std::sync::Arc;

/// Where an account's actor runs.
pub enum Owner {
    /// Here (or there is only one daemon).
    Here,
    /// Another live daemon, reachable at `url`.
    Elsewhere { node: String, url: String },
}

/// What finding an account's owner reads: this daemon's leases, the
/// store's table of them and of live daemons, and the keeper that can
/// take a free one.
#[derive(Clone, Copy)]
pub struct Owners<'a> {
    store: &'a dyn Store,
    leases: Option<&'a Arc<LeaseTable>>,
    /// Only pairing claims a lease, and only a build with WhatsApp pairs.
    #[cfg_attr(not(feature = "whatsapp"), allow(dead_code))]
    keeper: Option<&'a Arc<Keeper>>,
}

fn moving(account: &AccountId) -> ApiError {
    ApiError::new(
        Kind::Unavailable,
        format!(
            "account {account} has no live owner right now (its lease is moving between \
             daemons); try again in a few seconds"
        ),
    )
}

impl<'a> Owners<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
            leases: state.engine.leases.as_ref(),
            keeper: state.cluster.as_ref(),
        }
    }

    /// Which daemon carries `account` now. `hop`: the request was already
    /// forwarded once, so it is not forwarded again.
    pub async fn owner(&self, account: &AccountId, hop: bool) -> Result<Owner, ApiError> {
        let Some(table) = self.leases else {
            return Ok(Owner::Here);
        };
        if table.holds(account) {
            return Ok(Owner::Here);
        }
        if hop {
            return Err(moving(account));
        }
        let Some(lease) = self
            .store
            .list_leases()
            .await?
            .into_iter()
            .find(|l| &l.account == account && !l.expired && l.node != table.node())
        else {
            return Err(moving(account));
        };
        let url = self
            .store
            .live_nodes()
            .await?
            .into_iter()
            .find(|n| n.node == lease.node)
            .and_then(|n| n.control_url)
            .ok_or_else(|| moving(account))?;
        Ok(Owner::Elsewhere {
            node: lease.node,
            url,
        })
    }

    /// Which daemon carries `account` now, taking its lease here when no
    /// daemon holds it: what only the owner can do (pairing connects the
    /// device) must not wait for a rebalance round to place a new account.
    #[cfg(feature = "whatsapp")]
    pub async fn owner_or_claim(&self, account: &AccountId, hop: bool) -> Result<Owner, ApiError> {
        match self.owner(account, hop).await {
            Err(e) if e.kind == Kind::Unavailable => match self.keeper {
                Some(keeper) if keeper.claim(account).await? => Ok(Owner::Here),
                _ => Err(e),
            },
            other => other,
        }
    }
}
