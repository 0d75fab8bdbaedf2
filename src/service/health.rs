//! What the open routes tell: whether the daemon is alive and ready, and
//! its metrics. Not operations: they need no role and change nothing.

use super::Service;
use crate::metrics::{PromMetrics, StoreView};
use herald_actors::delivery::leases::LeaseTable;
use herald_actors::domain::AccountId;
use herald_actors::ports::{Store, StoreError};
use herald_actors::supervisor::Door;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct Health<'a> {
    store: &'a dyn Store,
    actors: &'a Door,
    ready: &'a AtomicBool,
    metrics: &'a PromMetrics,
    leases: Option<&'a Arc<LeaseTable>>,
}

impl<'a> Health<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
            actors: &state.door,
            ready: &state.ready,
            metrics: &state.metrics,
            leases: state.engine.leases.as_ref(),
        }
    }

    /// Alive: the database answers.
    pub async fn alive(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }

    /// Started and not draining.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The metrics' text: the engine's series, with the accounts this
    /// daemon no longer carries dropped and the store's view refreshed.
    pub async fn metrics(&self) -> String {
        let m = self.metrics;
        m.retain_accounts(|id| AccountId::parse(id).is_ok_and(|id| self.actors.carries(&id)));
        m.set_daemon_state(self.actors.carried(), self.ready());
        let slow = crate::telemetry::slow_acquires();
        m.set_slow_acquires(slow.count, slow.max_secs);
        match self.store_view().await {
            Ok(view) => m.set_store_view(&view),
            // The engine's own series still answer; /healthz tells the rest.
            Err(e) => tracing::warn!(error = %e, "metrics: could not read the store"),
        }
        m.render()
    }

    /// Account states and the webhook backlog from the store, and the
    /// leases this daemon may act on now.
    async fn store_view(&self) -> Result<StoreView, StoreError> {
        let now = chrono::Utc::now();
        let accounts = self.store.list_accounts().await?;
        let backlog = self.store.webhook_backlog(now).await?;
        let leases = self.leases;
        Ok(StoreView {
            accounts: accounts
                .iter()
                .map(|a| (a.id.as_str().to_owned(), a.state.as_str()))
                .collect(),
            node: leases.map(|t| t.node().to_owned()),
            leases_held: leases
                .map(|t| {
                    t.held()
                        .into_iter()
                        .filter(|f| t.fence(&f.account).is_some())
                        .map(|f| f.account.as_str().to_owned())
                        .collect()
                })
                .unwrap_or_default(),
            webhook_pending: backlog.pending,
            webhook_oldest_due_secs: backlog
                .oldest_due_at
                .map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1000.0),
            standings: accounts
                .iter()
                .map(|a| (a.id.as_str().to_owned(), a.standing.clone()))
                .collect(),
        })
    }
}
