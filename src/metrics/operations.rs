//! Operations: what the dashboard and the alert rules in deploy/ read
//! beside the engine's own families: run outcomes, account states, leases,
//! and webhooks.

use super::labels::{FloatGauge, LeaseLabels, OutcomeLabel, StateLabels, StatusLabels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashSet;
use std::sync::RwLock;

/// The statuses a run ends in.
pub const FINAL_STATUSES: [&str; 5] = ["success", "partial", "failed", "cancelled", "missed"];

/// What `/metrics` reads from the store and the lease table at scrape
/// time. The store's part is the same on every daemon of a cluster (a
/// dashboard takes the max over them); the leases are this daemon's own.
#[derive(Debug, Default)]
pub struct StoreView {
    /// Every account and its state name.
    pub accounts: Vec<(String, &'static str)>,
    /// This daemon's node id, in cluster mode.
    pub node: Option<String>,
    /// Accounts whose lease this daemon holds and may act on now.
    pub leases_held: Vec<String>,
    /// Webhook deliveries not yet delivered nor given up.
    pub webhook_pending: u64,
    /// How long the oldest pending delivery has been due (0 when none is).
    pub webhook_oldest_due_secs: f64,
    /// What WhatsApp last said of each account, as the store has it.
    pub standings: Vec<(String, herald_actors::domain::Standing)>,
}

/// The families an operator alerts on beside the engine's own.
pub(super) struct Operations {
    runs_finished: Family<StatusLabels, Counter>,
    account_state: Family<StateLabels, Gauge>,
    lease_held: Family<LeaseLabels, Gauge>,
    cluster_enabled: Gauge,
    webhook_attempts: Family<OutcomeLabel, Counter>,
    webhook_pending: Gauge,
    webhook_oldest_due: FloatGauge,
    standings: super::standing::Standings,
    /// Accounts whose outcome counters exist (started at 0).
    finished_seen: RwLock<HashSet<String>>,
}

impl Operations {
    pub(super) fn register(r: &mut Registry) -> Self {
        let runs_finished = Family::default();
        r.register(
            "runs_finished",
            "Runs this daemon ended, by account and final status (success, partial, failed, cancelled, missed)",
            Family::clone(&runs_finished),
        );
        let account_state = Family::default();
        r.register(
            "account_state",
            "1 for each account's current state (pairing, connected, disconnected, logged_out, banned, disabled, cooling_down), as the store has it",
            Family::clone(&account_state),
        );
        let lease_held = Family::default();
        r.register(
            "account_lease_held",
            "1 for each account whose lease this daemon (label node) holds and may act on (cluster mode)",
            Family::clone(&lease_held),
        );
        let cluster_enabled = Gauge::default();
        r.register(
            "cluster_enabled",
            "1 when this daemon shares its accounts with others by lease (cluster.enabled)",
            cluster_enabled.clone(),
        );
        let webhook_attempts = Family::default();
        r.register(
            "webhook_attempts",
            "Webhook delivery attempts this daemon made, by outcome (delivered, retry, gave_up)",
            Family::clone(&webhook_attempts),
        );
        let webhook_pending = Gauge::default();
        r.register(
            "webhook_deliveries_pending",
            "Webhook deliveries waiting to be delivered (due now or retrying later)",
            webhook_pending.clone(),
        );
        let webhook_oldest_due = FloatGauge::default();
        r.register_with_unit(
            "webhook_oldest_due_age",
            "How long the oldest pending webhook delivery has been due",
            Unit::Seconds,
            webhook_oldest_due.clone(),
        );
        Self {
            runs_finished,
            account_state,
            lease_held,
            cluster_enabled,
            webhook_attempts,
            webhook_pending,
            webhook_oldest_due,
            standings: super::standing::Standings::register(r),
            finished_seen: RwLock::default(),
        }
    }
}

impl Operations {
    /// A run of `account` ended with `status` on this daemon (counted from
    /// its own event stream, so the daemons of a cluster add up).
    pub(super) fn run_finished(&self, account: &str, status: &'static str) {
        self.runs_finished
            .get_or_create(&StatusLabels {
                account: account.to_owned(),
                status,
            })
            .inc();
    }

    /// One webhook attempt: `delivered`, `retry` or `gave_up`.
    pub(super) fn webhook_attempt(&self, outcome: &'static str) {
        self.webhook_attempts
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// What the store and the lease table say at scrape time.
    pub(super) fn set_store_view(&self, view: &StoreView) {
        let ops = self;
        ops.account_state.clear();
        for (account, state) in &view.accounts {
            ops.account_state
                .get_or_create(&StateLabels {
                    account: account.clone(),
                    state,
                })
                .set(1);
        }
        // Every account has its outcome counters from 0, so an alert's
        // increase() sees the first partial run too; a deleted account's go.
        {
            let mut seen = ops.finished_seen.write().unwrap_or_else(|e| e.into_inner());
            let live: HashSet<&str> = view.accounts.iter().map(|(a, _)| a.as_str()).collect();
            seen.retain(|account| {
                let keep = live.contains(account.as_str());
                if !keep {
                    for status in FINAL_STATUSES {
                        ops.runs_finished.remove(&StatusLabels {
                            account: account.clone(),
                            status,
                        });
                    }
                }
                keep
            });
            for (account, _) in &view.accounts {
                if seen.insert(account.clone()) {
                    for status in FINAL_STATUSES {
                        drop(ops.runs_finished.get_or_create(&StatusLabels {
                            account: account.clone(),
                            status,
                        }));
                    }
                }
            }
        }
        ops.lease_held.clear();
        ops.cluster_enabled.set(i64::from(view.node.is_some()));
        if let Some(node) = &view.node {
            for account in &view.leases_held {
                ops.lease_held
                    .get_or_create(&LeaseLabels {
                        account: account.clone(),
                        node: node.clone(),
                    })
                    .set(1);
            }
        }
        ops.webhook_pending.set(view.webhook_pending as i64);
        ops.webhook_oldest_due.set(view.webhook_oldest_due_secs);
        ops.standings.set(&view.standings);
    }
}

/// The final status a stored event reports, if it ends a run: `run_finished`
/// carries it in `data.status`, `run_missed` is one.
pub fn run_outcome(event: &herald_actors::domain::Event) -> Option<&'static str> {
    let status = match event.kind.as_str() {
        "run_finished" => event.data.get("status")?.as_str()?,
        "run_missed" => "missed",
        _ => return None,
    };
    FINAL_STATUSES.into_iter().find(|s| *s == status)
}
