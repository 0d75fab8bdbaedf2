//! Prometheus metrics for `/metrics`: the engine and the scheduler report
//! through [`herald_actors::ports::Metrics`]; this renders them in the
//! OpenMetrics text format (which Prometheus scrapes natively).
//!
//! Labels are bounded by construction: `account` (one per paired account),
//! `reason` (a `&'static str` chosen by the engine) and `kind` (an actor
//! kind). Runs and groups are never labels: a 1000-group fan-out must not
//! become 1000 series.
//!
//! One file per family of metrics: `delivery` (sends, failures, pace),
//! `media`, `receipts`, `scheduling`, `daemon` (restarts, accounts,
//! readiness, version), `operations` (run outcomes, account states,
//! leases, webhooks) and `standing` (what WhatsApp says of each account); `port` takes the engine's reports into them. They
//! are registered in one order, the order `/metrics` lists them in.
//!
//! Imports: `herald_actors::domain` and `herald_actors::ports` (the
//! metrics port it implements).

mod daemon;
mod delivery;
mod labels;
mod media;
mod operations;
mod port;
mod receipts;
mod scheduling;
mod standing;
#[cfg(test)]
mod tests;

pub use operations::{run_outcome, StoreView, FINAL_STATUSES};

use herald_actors::domain::AccountId;
use labels::AccountLabel;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

/// The content type prometheus-client's encoder produces.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Herald's metrics, registered once; cheap to update from any thread.
pub struct PromMetrics {
    registry: Registry,
    delivery: delivery::Delivery,
    media: media::Media,
    supervision: daemon::Supervision,
    receipts: receipts::Receipts,
    scheduling: scheduling::Scheduling,
    daemon: daemon::Daemon,
    /// Run outcomes, account states, leases and webhooks: what the
    /// dashboard and the alert rules in deploy/ read.
    ops: operations::Operations,
    /// Accounts with series, and the failure reasons seen for each, so a
    /// deleted account's series can be dropped (see [`Self::retain_accounts`]).
    seen: RwLock<HashMap<String, HashSet<&'static str>>>,
}

impl Default for PromMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl PromMetrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("herald");
        // In this order: `/metrics` lists the families as registered.
        let delivery = delivery::Delivery::register(&mut r);
        let media = media::Media::register(&mut r);
        let supervision = daemon::Supervision::register(&mut r);
        let receipts = receipts::Receipts::register(&mut r);
        let scheduling = scheduling::Scheduling::register(&mut r);
        let daemon = daemon::Daemon::register(&mut r);
        let ops = operations::Operations::register(&mut r);
        daemon::register_build(&mut r);
        Self {
            registry: r,
            delivery,
            media,
            supervision,
            receipts,
            scheduling,
            daemon,
            ops,
            seen: RwLock::new(HashMap::new()),
        }
    }

    /// The label of an account, remembering it (and a failure reason) so
    /// that [`Self::retain_accounts`] can find its series later.
    fn label(&self, account: &AccountId, reason: Option<&'static str>) -> AccountLabel {
        let id = account.as_str();
        let known = {
            let seen = self.seen.read().unwrap_or_else(|e| e.into_inner());
            seen.get(id)
                .is_some_and(|r| reason.is_none_or(|reason| r.contains(reason)))
        };
        if !known {
            let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
            let reasons = seen.entry(id.to_owned()).or_default();
            if let Some(reason) = reason {
                reasons.insert(reason);
            }
        }
        AccountLabel {
            account: id.to_owned(),
        }
    }

    /// Drops the series of accounts for which `live` is false (deleted
    /// accounts), so stale gauges do not linger until the next restart.
    pub fn retain_accounts(&self, live: impl Fn(&str) -> bool) {
        let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
        seen.retain(|account, reasons| {
            if live(account) {
                return true;
            }
            self.delivery.remove(account, reasons);
            let label = AccountLabel {
                account: account.clone(),
            };
            self.media.remove(&label);
            self.receipts.remove(account, &label);
            false
        });
    }

    /// Point-in-time values the control port knows at scrape time.
    pub fn set_daemon_state(&self, accounts: usize, ready: bool) {
        self.daemon.accounts.set(accounts as i64);
        self.daemon.ready.set(i64::from(ready));
    }

    /// The slow waits for a database connection counted so far in this
    /// process, and the longest (read from the log at scrape time).
    pub fn set_slow_acquires(&self, count: u64, max_secs: f64) {
        let d = &self.daemon;
        d.slow_acquires
            .inc_by(count.saturating_sub(d.slow_acquires.get()));
        d.slow_acquire_max.set(max_secs);
    }

    /// A run of `account` ended with `status` on this daemon (counted from
    /// its own event stream, so the daemons of a cluster add up).
    pub fn run_finished(&self, account: &str, status: &'static str) {
        self.ops.run_finished(account, status);
    }

    /// One webhook attempt: `delivered`, `retry` or `gave_up`.
    pub fn webhook_attempt(&self, outcome: &'static str) {
        self.ops.webhook_attempt(outcome);
    }

    /// What the store and the lease table say at scrape time.
    pub fn set_store_view(&self, view: &StoreView) {
        self.ops.set_store_view(view);
    }

    /// The OpenMetrics text exposition, ending in `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Counts the runs this daemon ends from its own event stream into
/// `herald_runs_finished_total`, until aborted.
pub fn count_run_outcomes(
    metrics: std::sync::Arc<PromMetrics>,
    mut events: tokio::sync::broadcast::Receiver<herald_actors::domain::Event>,
) -> tokio::task::JoinHandle<()> {
    use tokio::sync::broadcast::error::RecvError;
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(e) => {
                    if let (Some(status), Some(account)) = (run_outcome(&e), &e.account_id) {
                        metrics.run_finished(account, status);
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(
                        skipped = n,
                        "metrics fell behind the event stream; some run outcomes were not counted"
                    );
                }
                Err(RecvError::Closed) => return,
            }
        }
    })
}
