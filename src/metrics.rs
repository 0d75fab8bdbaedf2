//! Prometheus metrics for `/metrics`: the engine and the scheduler report
//! through [`herald_actors::ports::Metrics`]; this renders them in the
//! OpenMetrics text format (which Prometheus scrapes natively).
//!
//! Labels are bounded by construction: `account` (one per paired account),
//! `reason` (a `&'static str` chosen by the engine) and `kind` (an actor
//! kind). Runs and groups are never labels: a 1000-group fan-out must not
//! become 1000 series.

use herald_actors::domain::AccountId;
use herald_actors::ports::Metrics;
use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::RwLock;
use std::time::Duration;

/// The content type prometheus-client's encoder produces.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Send latency: the simulator answers in 80–400 ms, WhatsApp Web in about
/// the same; the tail buckets catch a struggling connection.
const LATENCY_BUCKETS: [f64; 11] = [0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Fire lag: normally milliseconds; minutes mean the daemon was busy or
/// down (past `late_fire_grace`, 300 s by default, the run is missed).
const FIRE_LAG_BUCKETS: [f64; 10] = [0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 300.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountLabel {
    account: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    account: String,
    reason: &'static str,
}

/// `signal` is one of `AccountSignal::label`'s few values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    account: String,
    signal: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// `kind`: `delivered` or `read`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReceiptLabels {
    account: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// `status` is a final run status (`FINAL_STATUSES`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    account: String,
    status: &'static str,
}

/// `state` is one of `AccountState::NAMES`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    account: String,
    state: &'static str,
}

/// `status` is one of the quota's few statuses, or `unknown`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    account: String,
    status: &'static str,
}

/// `node` is this daemon's cluster node id: one value per daemon.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    account: String,
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

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

type FloatGauge = Gauge<f64, AtomicU64>;

/// The families an operator alerts on beside the engine's own.
struct Operations {
    runs_finished: Family<StatusLabels, Counter>,
    account_state: Family<StateLabels, Gauge>,
    lease_held: Family<LeaseLabels, Gauge>,
    cluster_enabled: Gauge,
    webhook_attempts: Family<OutcomeLabel, Counter>,
    webhook_pending: Gauge,
    webhook_oldest_due: FloatGauge,
    timelock_active: Family<AccountLabel, Gauge>,
    timelock_until: Family<AccountLabel, Gauge>,
    quota_used: Family<AccountLabel, Gauge>,
    quota_total: Family<AccountLabel, Gauge>,
    quota_status: Family<QuotaLabels, Gauge>,
    /// Accounts whose outcome counters exist (started at 0).
    finished_seen: RwLock<HashSet<String>>,
}

impl Operations {
    fn register(r: &mut Registry) -> Self {
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
        let family = |r: &mut Registry, name: &str, help: &str| {
            let f: Family<AccountLabel, Gauge> = Family::default();
            r.register(name, help, Family::clone(&f));
            f
        };
        let timelock_active = family(
            r,
            "account_timelock_active",
            "1 while WhatsApp's reach-out time-lock holds for the account, as last read",
        );
        let timelock_until = family(
            r,
            "account_timelock_until_seconds",
            "When the account's reach-out time-lock ends, as WhatsApp gave it (Unix seconds; 0 with no lock or no end given)",
        );
        let quota_used = family(
            r,
            "account_new_chat_quota_used",
            "Messages to new individual chats the account sent this quota cycle, as WhatsApp counts them",
        );
        let quota_total = family(
            r,
            "account_new_chat_quota_total",
            "The account's new-chat quota for this cycle, as WhatsApp gives it",
        );
        let quota_status = Family::default();
        r.register(
            "account_new_chat_quota_status",
            "1 for the account's new-chat quota status (none, first_warning, second_warning, capped, unknown)",
            Family::clone(&quota_status),
        );
        Self {
            runs_finished,
            account_state,
            lease_held,
            cluster_enabled,
            webhook_attempts,
            webhook_pending,
            webhook_oldest_due,
            timelock_active,
            timelock_until,
            quota_used,
            quota_total,
            quota_status,
            finished_seen: RwLock::default(),
        }
    }
}
type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Herald's metrics, registered once; cheap to update from any thread.
pub struct PromMetrics {
    registry: Registry,
    sent: Family<AccountLabel, Counter>,
    failures: Family<FailureLabels, Counter>,
    rate_limited: Family<AccountLabel, Counter>,
    signals: Family<SignalLabels, Counter>,
    tokens: Family<AccountLabel, FloatGauge>,
    rate: Family<AccountLabel, Gauge>,
    queue_depth: Family<AccountLabel, Gauge>,
    targets_remaining: Family<AccountLabel, Gauge>,
    latency: HistogramFamily<AccountLabel>,
    uploads: Family<AccountLabel, Counter>,
    uploaded_bytes: Family<AccountLabel, Counter>,
    cache_hits: Family<AccountLabel, Counter>,
    restarts: Family<KindLabel, Counter>,
    receipts: Family<ReceiptLabels, Counter>,
    receipts_uncounted: Family<OutcomeLabel, Counter>,
    fire_lag: Histogram,
    missed: Counter,
    window_closures: Counter,
    accounts: Gauge,
    ready: Gauge,
    /// Run outcomes, account states, leases and webhooks: what the
    /// dashboard and the alert rules in deploy/ read.
    ops: Operations,
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
        let sent = Family::default();
        r.register(
            "messages_sent",
            "Messages the gateway accepted, per account",
            Family::clone(&sent),
        );
        let failures = Family::default();
        r.register(
            "send_failures",
            "Failed sends and uploads by reason (group_not_found, not_participant, not_allowed, rate_limited, transient, upload, account)",
            Family::clone(&failures),
        );
        let rate_limited = Family::default();
        r.register(
            "rate_limited",
            "Rate-limit answers from WhatsApp; each one slows the account down",
            Family::clone(&rate_limited),
        );
        let signals = Family::default();
        r.register(
            "account_signals",
            "Account-level signals from WhatsApp or the engine (rate_limit, rate_limit_repeated, reach_out_locked_463, refused_479, restricted, temporary_ban, logged_out, repeated_failures); all but rate_limit and logged_out pause the account for a cool-down or a ban",
            Family::clone(&signals),
        );
        let tokens = Family::default();
        r.register(
            "tokens_available",
            "Send tokens in the account's bucket after the last take",
            Family::clone(&tokens),
        );
        let rate = Family::default();
        r.register(
            "send_rate_per_minute",
            "The account's configured send rate (messages per minute)",
            Family::clone(&rate),
        );
        let queue_depth = Family::default();
        r.register(
            "run_queue_depth",
            "Runs waiting in the account's queue behind the current one",
            Family::clone(&queue_depth),
        );
        let targets_remaining = Family::default();
        r.register(
            "run_targets_remaining",
            "Groups not yet finished in the account's current run",
            Family::clone(&targets_remaining),
        );
        let latency: HistogramFamily<AccountLabel> =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        r.register_with_unit(
            "send_latency",
            "Time from handing a message to the gateway to its acceptance",
            Unit::Seconds,
            latency.clone(),
        );
        let uploads = Family::default();
        r.register(
            "media_uploads",
            "Media uploads through the gateway",
            Family::clone(&uploads),
        );
        let uploaded_bytes = Family::default();
        r.register_with_unit(
            "media_uploaded",
            "Bytes of media uploaded through the gateway",
            Unit::Bytes,
            Family::clone(&uploaded_bytes),
        );
        let cache_hits = Family::default();
        r.register(
            "media_upload_cache_hits",
            "Media parts that reused a still-valid upload handle instead of uploading",
            Family::clone(&cache_hits),
        );
        let restarts = Family::default();
        r.register(
            "actor_restarts",
            "Actors restarted by their supervisor, by actor kind",
            Family::clone(&restarts),
        );
        let receipts = Family::default();
        r.register(
            "receipts_counted",
            "Participants counted from WhatsApp's receipts for the account's group messages, by kind (delivered, read)",
            Family::clone(&receipts),
        );
        let receipts_uncounted = Family::default();
        r.register(
            "receipts_uncounted",
            "Receipts that counted nothing: a participant already counted (repeated) or no message of a run (ignored)",
            Family::clone(&receipts_uncounted),
        );
        let fire_lag = Histogram::new(FIRE_LAG_BUCKETS);
        r.register_with_unit(
            "scheduler_fire_lag",
            "Delay between a reminder's due time and its firing",
            Unit::Seconds,
            fire_lag.clone(),
        );
        let missed = Counter::default();
        r.register(
            "scheduler_missed_runs",
            "Occurrences recorded as missed (picked up past the late-fire grace)",
            missed.clone(),
        );
        let window_closures = Counter::default();
        r.register(
            "window_closures",
            "Runs stopped because their delivery window closed",
            window_closures.clone(),
        );
        let accounts = Gauge::default();
        r.register(
            "accounts",
            "Accounts with a running actor",
            accounts.clone(),
        );
        // Prometheus's own `up` says whether the port answered; this says
        // whether the daemon accepts work (false while starting or draining).
        let ready = Gauge::default();
        r.register(
            "ready",
            "1 when started and not draining, as /readyz",
            ready.clone(),
        );
        let ops = Operations::register(&mut r);
        r.register(
            "build",
            "Herald's version",
            Info::new(VersionLabel {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        Self {
            registry: r,
            sent,
            failures,
            rate_limited,
            signals,
            tokens,
            rate,
            queue_depth,
            targets_remaining,
            latency,
            uploads,
            uploaded_bytes,
            cache_hits,
            restarts,
            receipts,
            receipts_uncounted,
            fire_lag,
            missed,
            window_closures,
            accounts,
            ready,
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
            let l = AccountLabel {
                account: account.clone(),
            };
            for f in [
                &self.sent,
                &self.rate_limited,
                &self.uploads,
                &self.uploaded_bytes,
                &self.cache_hits,
            ] {
                f.remove(&l);
            }
            for f in [&self.rate, &self.queue_depth, &self.targets_remaining] {
                f.remove(&l);
            }
            self.tokens.remove(&l);
            self.latency.remove(&l);
            for kind in ["delivered", "read"] {
                self.receipts.remove(&ReceiptLabels {
                    account: account.clone(),
                    kind,
                });
            }
            // Failure reasons and signals are remembered in one set.
            for reason in reasons.iter() {
                self.failures.remove(&FailureLabels {
                    account: account.clone(),
                    reason,
                });
                self.signals.remove(&SignalLabels {
                    account: account.clone(),
                    signal: reason,
                });
            }
            false
        });
    }

    /// Point-in-time values the control port knows at scrape time.
    pub fn set_daemon_state(&self, accounts: usize, ready: bool) {
        self.accounts.set(accounts as i64);
        self.ready.set(i64::from(ready));
    }

    /// A run of `account` ended with `status` on this daemon (counted from
    /// its own event stream, so the daemons of a cluster add up).
    pub fn run_finished(&self, account: &str, status: &'static str) {
        self.ops
            .runs_finished
            .get_or_create(&StatusLabels {
                account: account.to_owned(),
                status,
            })
            .inc();
    }

    /// One webhook attempt: `delivered`, `retry` or `gave_up`.
    pub fn webhook_attempt(&self, outcome: &'static str) {
        self.ops
            .webhook_attempts
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// What the store and the lease table say at scrape time.
    pub fn set_store_view(&self, view: &StoreView) {
        let ops = &self.ops;
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
        self.set_standings(&view.standings);
    }

    /// The standing gauges, from the store: a lock that holds and its
    /// end, the quota's counts and its status (a reading never taken
    /// shows nothing).
    fn set_standings(&self, standings: &[(String, herald_actors::domain::Standing)]) {
        use herald_actors::domain::Reading;
        let ops = &self.ops;
        for f in [
            &ops.timelock_active,
            &ops.timelock_until,
            &ops.quota_used,
            &ops.quota_total,
        ] {
            f.clear();
        }
        ops.quota_status.clear();
        let now = chrono::Utc::now();
        for (account, s) in standings {
            let l = AccountLabel {
                account: account.clone(),
            };
            if let Some(lock) = s.timelock.known() {
                let holds = lock.holds_at(now);
                ops.timelock_active.get_or_create(&l).set(i64::from(holds));
                let until = lock.until.filter(|_| holds).map_or(0, |u| u.timestamp());
                ops.timelock_until.get_or_create(&l).set(until);
            }
            let status = match &s.quota {
                Reading::Never => continue,
                Reading::Unknown { .. } => "unknown",
                Reading::Known { value, .. } => {
                    if let Some(n) = value.used {
                        ops.quota_used.get_or_create(&l).set(n as i64);
                    }
                    if let Some(n) = value.total {
                        ops.quota_total.get_or_create(&l).set(n as i64);
                    }
                    value.status.as_str()
                }
            };
            ops.quota_status
                .get_or_create(&QuotaLabels {
                    account: account.clone(),
                    status,
                })
                .set(1);
        }
    }

    /// The OpenMetrics text exposition, ending in `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
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

impl Metrics for PromMetrics {
    fn message_sent(&self, account: &AccountId, latency: Duration) {
        let l = self.label(account, None);
        self.sent.get_or_create(&l).inc();
        self.latency
            .get_or_create(&l)
            .observe(latency.as_secs_f64());
    }

    fn send_failed(&self, account: &AccountId, reason: &'static str) {
        let l = self.label(account, Some(reason));
        self.failures
            .get_or_create(&FailureLabels {
                account: l.account,
                reason,
            })
            .inc();
    }

    fn rate_limited(&self, account: &AccountId) {
        let l = self.label(account, None);
        self.rate_limited.get_or_create(&l).inc();
    }

    fn account_signal(&self, account: &AccountId, signal: &'static str) {
        let l = self.label(account, Some(signal));
        self.signals
            .get_or_create(&SignalLabels {
                account: l.account,
                signal,
            })
            .inc();
    }

    fn tokens_available(&self, account: &AccountId, tokens: f64, per_minute: u32) {
        let l = self.label(account, None);
        self.tokens.get_or_create(&l).set(tokens);
        self.rate.get_or_create(&l).set(i64::from(per_minute));
    }

    fn queue_depth(&self, account: &AccountId, depth: usize) {
        let l = self.label(account, None);
        self.queue_depth.get_or_create(&l).set(depth as i64);
    }

    fn targets_remaining(&self, account: &AccountId, remaining: usize) {
        let l = self.label(account, None);
        self.targets_remaining
            .get_or_create(&l)
            .set(remaining as i64);
    }

    fn media_uploaded(&self, account: &AccountId, bytes: u64) {
        let l = self.label(account, None);
        self.uploads.get_or_create(&l).inc();
        self.uploaded_bytes.get_or_create(&l).inc_by(bytes);
    }

    fn media_cache_hit(&self, account: &AccountId) {
        let l = self.label(account, None);
        self.cache_hits.get_or_create(&l).inc();
    }

    fn receipts_counted(&self, account: &AccountId, kind: &'static str, n: u64) {
        let l = self.label(account, None);
        self.receipts
            .get_or_create(&ReceiptLabels {
                account: l.account,
                kind,
            })
            .inc_by(n);
    }

    fn receipts_uncounted(&self, outcome: &'static str, n: u64) {
        self.receipts_uncounted
            .get_or_create(&OutcomeLabel { outcome })
            .inc_by(n);
    }

    fn actor_restarted(&self, kind: &'static str) {
        self.restarts.get_or_create(&KindLabel { kind }).inc();
    }

    fn fire_lag(&self, lag: Duration) {
        self.fire_lag.observe(lag.as_secs_f64());
    }

    fn run_missed(&self) {
        self.missed.inc();
    }

    fn window_closed(&self) {
        self.window_closures.inc();
    }
}

#[cfg(test)]
mod tests {
    //! The exposition is checked with a small strict OpenMetrics parser
    //! rather than a crate: `prometheus-parse` predates OpenMetrics (it does
    //! not know `# EOF`, `# UNIT` or `_created`) and would accept output
    //! Prometheus rejects, while these rules are few and exactly the ones
    //! Prometheus applies to what we emit.

    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug)]
    struct Sample {
        name: String,
        labels: BTreeMap<String, String>,
        value: f64,
    }

    #[derive(Debug)]
    struct MetricFamily {
        name: String,
        kind: String,
        help: Option<String>,
        samples: Vec<Sample>,
    }

    fn valid_name(s: &str) -> bool {
        let mut b = s.bytes();
        b.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_' || c == b':')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
    }

    fn parse_value(s: &str) -> Result<f64, String> {
        match s {
            "+Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            "NaN" => Ok(f64::NAN),
            _ => s.parse().map_err(|_| format!("bad value {s:?}")),
        }
    }

    /// `{a="x",b="y"}` → labels, and the rest of the line after `}`.
    fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
        let mut labels = BTreeMap::new();
        let mut rest = s.strip_prefix('{').ok_or("expected {")?;
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        loop {
            let eq = rest.find('=').ok_or("label without =")?;
            let name = &rest[..eq];
            if !valid_name(name) || name.contains(':') {
                return Err(format!("bad label name {name:?}"));
            }
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or("label value not quoted")?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next().ok_or("unterminated label value")? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                        '\\' => value.push('\\'),
                        '"' => value.push('"'),
                        'n' => value.push('\n'),
                        c => return Err(format!("bad escape \\{c}")),
                    },
                    (_, '\n') => return Err("raw newline in label value".into()),
                    (_, c) => value.push(c),
                }
            };
            if labels.insert(name.to_owned(), value).is_some() {
                return Err(format!("label {name} repeated"));
            }
            rest = &rest[end + 1..];
            if let Some(r) = rest.strip_prefix('}') {
                return Ok((labels, r));
            }
            rest = rest.strip_prefix(',').ok_or("expected , or }")?;
        }
    }

    fn suffixes(kind: &str) -> &'static [&'static str] {
        match kind {
            "counter" => &["_total", "_created"],
            "gauge" | "unknown" => &[""],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            "info" => &["_info"],
            _ => &[],
        }
    }

    /// Parses the OpenMetrics text format strictly: every family declared
    /// once with a known type before its samples, sample names matching
    /// their family's type, well-formed labels and values, counters not
    /// negative, histogram buckets cumulative up to `+Inf` = `_count`, and
    /// `# EOF` as the last line.
    fn parse(text: &str) -> Result<Vec<MetricFamily>, String> {
        let body = text.strip_suffix("# EOF\n").ok_or("missing final # EOF")?;
        let mut families: Vec<MetricFamily> = Vec::new();
        for (n, line) in body.lines().enumerate() {
            let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
            if let Some(meta) = line.strip_prefix("# ") {
                let mut it = meta.splitn(3, ' ');
                let (what, name) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
                let arg = it
                    .next()
                    .ok_or_else(|| at("metadata without value".into()))?;
                if !valid_name(name) {
                    return Err(at(format!("bad family name {name:?}")));
                }
                // Metadata opens a family or adds to the one just opened,
                // and only before its first sample.
                let open = families
                    .last()
                    .is_some_and(|f| f.name == name && f.samples.is_empty());
                if !open {
                    if families.iter().any(|f| f.name == name) {
                        return Err(at("family declared twice or metadata after samples".into()));
                    }
                    families.push(MetricFamily {
                        name: name.into(),
                        kind: "unknown".into(),
                        help: None,
                        samples: vec![],
                    });
                }
                let f = families.last_mut().expect("pushed above");
                match what {
                    "TYPE" if f.kind == "unknown" && !suffixes(arg).is_empty() => {
                        f.kind = arg.into()
                    }
                    "HELP" if f.help.is_none() => f.help = Some(arg.into()),
                    "UNIT" if name.ends_with(&format!("_{arg}")) => {}
                    _ => return Err(at(format!("bad or repeated # {what}"))),
                }
                continue;
            }
            let name_end = line
                .find(['{', ' '])
                .ok_or_else(|| at("sample without value".into()))?;
            let name = &line[..name_end];
            let (labels, rest) = if line[name_end..].starts_with('{') {
                parse_labels(&line[name_end..]).map_err(at)?
            } else {
                (BTreeMap::new(), &line[name_end..])
            };
            let mut fields = rest
                .strip_prefix(' ')
                .ok_or_else(|| at("expected a space before the value".into()))?
                .split(' ');
            let value = parse_value(fields.next().unwrap_or("")).map_err(at)?;
            if let Some(ts) = fields.next() {
                parse_value(ts).map_err(at)?;
            }
            if fields.next().is_some() {
                return Err(at("trailing fields".into()));
            }
            let f = families
                .last_mut()
                .ok_or_else(|| at("sample before any metadata".into()))?;
            if f.kind == "unknown" {
                return Err(at("sample of a family without # TYPE".into()));
            }
            let ok = suffixes(&f.kind)
                .iter()
                .any(|s| name.strip_suffix(s) == Some(f.name.as_str()));
            if !ok {
                return Err(at(format!(
                    "sample does not belong to {} {}",
                    f.kind, f.name
                )));
            }
            if f.kind == "counter" && (value.is_nan() || value < 0.0) {
                return Err(at("negative counter".into()));
            }
            f.samples.push(Sample {
                name: name.into(),
                labels,
                value,
            });
        }
        for f in families.iter().filter(|f| f.kind == "histogram") {
            check_histogram(f)?;
        }
        Ok(families)
    }

    fn check_histogram(f: &MetricFamily) -> Result<(), String> {
        // Labels other than `le` → (buckets as (le, count), _count).
        type Series = (Vec<(f64, f64)>, Option<f64>);
        let mut series: BTreeMap<Vec<(String, String)>, Series> = BTreeMap::new();
        for s in &f.samples {
            let mut key: Vec<_> = s.labels.clone().into_iter().collect();
            key.retain(|(k, _)| k != "le");
            let e = series.entry(key).or_default();
            if s.name.ends_with("_bucket") {
                let le = s.labels.get("le").ok_or("bucket without le")?;
                e.0.push((parse_value(le)?, s.value));
            } else if s.name.ends_with("_count") {
                e.1 = Some(s.value);
            }
        }
        for (key, (buckets, count)) in series {
            let bad = |why: &str| Err(format!("{} {key:?}: {why}", f.name));
            if buckets
                .windows(2)
                .any(|w| w[0].0 >= w[1].0 || w[0].1 > w[1].1)
            {
                return bad("buckets not increasing and cumulative");
            }
            match buckets.last() {
                Some((le, n)) if le.is_infinite() && Some(*n) == count => {}
                _ => return bad("+Inf bucket missing or not equal to _count"),
            }
        }
        Ok(())
    }

    fn family<'a>(fs: &'a [MetricFamily], name: &str) -> &'a MetricFamily {
        fs.iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no family {name}"))
    }

    fn value(fs: &[MetricFamily], sample: &str, labels: &[(&str, &str)]) -> Option<f64> {
        fs.iter()
            .flat_map(|f| &f.samples)
            .find(|s| {
                s.name == sample
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
            })
            .map(|s| s.value)
    }

    fn id(s: &str) -> AccountId {
        AccountId::parse(s).unwrap()
    }

    /// What an account's run reports, roughly in the engine's order.
    fn exercise(m: &PromMetrics, a: &AccountId, sends: u32) {
        m.queue_depth(a, 2);
        m.media_uploaded(a, 150_000);
        m.media_cache_hit(a);
        m.targets_remaining(a, 10);
        for i in 0..sends {
            m.tokens_available(a, 3.5, 40);
            m.message_sent(a, Duration::from_millis(100 + 50 * u64::from(i)));
        }
        m.rate_limited(a);
        m.account_signal(a, "rate_limit");
        m.send_failed(a, "group_not_found");
        m.send_failed(a, "transient");
        m.receipts_counted(a, "delivered", 40);
        m.receipts_counted(a, "read", 12);
        m.receipts_uncounted("repeated", 3);
    }

    const PER_ACCOUNT: &[&str] = &[
        "herald_messages_sent_total",
        "herald_send_failures_total",
        "herald_rate_limited_total",
        "herald_account_signals_total",
        "herald_tokens_available",
        "herald_send_rate_per_minute",
        "herald_run_queue_depth",
        "herald_run_targets_remaining",
        "herald_send_latency_seconds_bucket",
        "herald_send_latency_seconds_count",
        "herald_send_latency_seconds_sum",
        "herald_media_uploads_total",
        "herald_media_uploaded_bytes_total",
        "herald_media_upload_cache_hits_total",
        "herald_receipts_counted_total",
    ];

    #[test]
    fn render_parses_strictly_with_series_for_every_account() {
        let m = PromMetrics::new();
        let accounts = [id("acme"), id("globex-2")];
        exercise(&m, &accounts[0], 3);
        exercise(&m, &accounts[1], 1);
        m.actor_restarted("account");
        m.fire_lag(Duration::from_millis(3));
        m.fire_lag(Duration::from_secs(90));
        m.run_missed();
        m.window_closed();
        m.set_daemon_state(2, true);

        let text = m.render();
        let fs = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

        for f in &fs {
            assert!(f.name.starts_with("herald_"), "{}", f.name);
            assert!(f.help.is_some(), "{} has no HELP", f.name);
            for s in &f.samples {
                for k in s.labels.keys() {
                    assert!(
                        [
                            "account", "reason", "signal", "kind", "le", "version", "status",
                            "state", "node", "outcome"
                        ]
                        .contains(&k.as_str()),
                        "{}: unbounded label {k}",
                        s.name
                    );
                }
            }
        }
        for a in &accounts {
            for sample in PER_ACCOUNT {
                let found = fs.iter().flat_map(|f| &f.samples).any(|s| {
                    s.name == *sample
                        && s.labels.get("account").map(String::as_str) == Some(a.as_str())
                });
                assert!(found, "no {sample} series for account {a:?}\n{text}");
            }
        }

        let acme = [("account", "acme")];
        assert_eq!(value(&fs, "herald_messages_sent_total", &acme), Some(3.0));
        assert_eq!(
            value(&fs, "herald_send_latency_seconds_count", &acme),
            Some(3.0)
        );
        let sum = value(&fs, "herald_send_latency_seconds_sum", &acme).unwrap();
        assert!((sum - 0.45).abs() < 1e-9, "{sum}");
        assert_eq!(
            value(
                &fs,
                "herald_send_latency_seconds_bucket",
                &[("account", "acme"), ("le", "0.1")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &fs,
                "herald_send_failures_total",
                &[("account", "acme"), ("reason", "group_not_found")]
            ),
            Some(1.0)
        );
        assert_eq!(value(&fs, "herald_tokens_available", &acme), Some(3.5));
        assert_eq!(
            value(
                &fs,
                "herald_receipts_counted_total",
                &[("account", "acme"), ("kind", "read")]
            ),
            Some(12.0)
        );
        assert_eq!(
            value(
                &fs,
                "herald_receipts_uncounted_total",
                &[("outcome", "repeated")]
            ),
            Some(6.0),
            "both accounts' repeats, one series"
        );
        assert_eq!(value(&fs, "herald_send_rate_per_minute", &acme), Some(40.0));
        assert_eq!(
            value(&fs, "herald_media_uploaded_bytes_total", &acme),
            Some(150_000.0)
        );
        assert_eq!(
            value(
                &fs,
                "herald_messages_sent_total",
                &[("account", "globex-2")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&fs, "herald_actor_restarts_total", &[("kind", "account")]),
            Some(1.0)
        );
        assert_eq!(
            value(&fs, "herald_scheduler_fire_lag_seconds_count", &[]),
            Some(2.0)
        );
        assert_eq!(
            value(&fs, "herald_scheduler_missed_runs_total", &[]),
            Some(1.0)
        );
        assert_eq!(value(&fs, "herald_window_closures_total", &[]), Some(1.0));
        assert_eq!(value(&fs, "herald_accounts", &[]), Some(2.0));
        assert_eq!(value(&fs, "herald_ready", &[]), Some(1.0));
        assert_eq!(family(&fs, "herald_send_latency_seconds").kind, "histogram");
        assert_eq!(family(&fs, "herald_build").kind, "info");
    }

    #[test]
    fn an_accounts_standing_is_exposed_for_the_rules() {
        use herald_actors::domain::*;
        let m = PromMetrics::new();
        let now = chrono::Utc::now();
        let until = now + chrono::Duration::hours(2);
        let locked = Standing {
            timelock: Reading::Known {
                value: TimeLock {
                    active: true,
                    until: Some(until),
                    kind: None,
                },
                read_at: now,
            },
            quota: Reading::Known {
                value: NewChatQuota {
                    status: QuotaStatus::SecondWarning,
                    used: Some(45),
                    total: Some(50),
                    cycle_start: None,
                    cycle_end: None,
                },
                read_at: now,
            },
        };
        let unknown = Standing {
            timelock: Reading::Never,
            quota: Reading::Unknown {
                why: "document not found".into(),
                read_at: now,
            },
        };
        m.set_store_view(&StoreView {
            accounts: vec![
                ("acme".into(), "cooling_down"),
                ("globex".into(), "connected"),
            ],
            node: None,
            leases_held: Vec::new(),
            webhook_pending: 0,
            webhook_oldest_due_secs: 0.0,
            standings: vec![("acme".into(), locked), ("globex".into(), unknown)],
        });
        let text = m.render();
        for line in [
            "herald_account_timelock_active{account=\"acme\"} 1".to_owned(),
            format!(
                "herald_account_timelock_until_seconds{{account=\"acme\"}} {}",
                until.timestamp()
            ),
            "herald_account_new_chat_quota_used{account=\"acme\"} 45".to_owned(),
            "herald_account_new_chat_quota_total{account=\"acme\"} 50".to_owned(),
            "herald_account_new_chat_quota_status{account=\"acme\",status=\"second_warning\"} 1"
                .to_owned(),
            "herald_account_new_chat_quota_status{account=\"globex\",status=\"unknown\"} 1"
                .to_owned(),
        ] {
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
        assert!(!text.contains("herald_account_timelock_active{account=\"globex\"}"));
    }

    #[test]
    fn run_outcomes_states_leases_and_webhooks_are_exposed_for_the_rules() {
        let m = PromMetrics::new();
        let view =
            |accounts: &[(&str, &'static str)], node: Option<&str>, held: &[&str]| StoreView {
                accounts: accounts.iter().map(|(a, s)| (a.to_string(), *s)).collect(),
                node: node.map(str::to_owned),
                leases_held: held.iter().map(|a| a.to_string()).collect(),
                webhook_pending: 7,
                webhook_oldest_due_secs: 42.5,
                standings: Vec::new(),
            };
        m.set_store_view(&view(
            &[("acme", "connected"), ("globex", "banned")],
            Some("herald-a"),
            &["acme"],
        ));
        m.run_finished("acme", "partial");
        m.run_finished("acme", "success");
        m.run_finished("acme", "success");
        m.webhook_attempt("delivered");
        m.webhook_attempt("retry");
        let text = m.render();
        let fs = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let run = |a: &str, st: &str| {
            value(
                &fs,
                "herald_runs_finished_total",
                &[("account", a), ("status", st)],
            )
        };
        assert_eq!(run("acme", "success"), Some(2.0));
        assert_eq!(run("acme", "partial"), Some(1.0));
        // Started at 0 for every account and final status, so increase()
        // sees an account's first partial run.
        assert_eq!(run("globex", "partial"), Some(0.0));
        assert_eq!(run("globex", "missed"), Some(0.0));
        let state = |a: &str, st: &str| {
            value(
                &fs,
                "herald_account_state",
                &[("account", a), ("state", st)],
            )
        };
        assert_eq!(state("acme", "connected"), Some(1.0));
        assert_eq!(state("globex", "banned"), Some(1.0));
        assert_eq!(state("acme", "banned"), None, "only the current state");
        assert_eq!(
            value(
                &fs,
                "herald_account_lease_held",
                &[("account", "acme"), ("node", "herald-a")]
            ),
            Some(1.0)
        );
        assert_eq!(value(&fs, "herald_cluster_enabled", &[]), Some(1.0));
        assert_eq!(
            value(
                &fs,
                "herald_webhook_attempts_total",
                &[("outcome", "retry")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&fs, "herald_webhook_deliveries_pending", &[]),
            Some(7.0)
        );
        assert_eq!(
            value(&fs, "herald_webhook_oldest_due_age_seconds", &[]),
            Some(42.5)
        );

        // The next scrape: globex logged out and then deleted, acme's lease
        // gone, no cluster. The old series go with them.
        m.set_store_view(&view(&[("acme", "logged_out")], None, &[]));
        let text = m.render();
        let fs = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(
            value(
                &fs,
                "herald_account_state",
                &[("account", "acme"), ("state", "logged_out")]
            ),
            Some(1.0)
        );
        assert!(!text.contains("state=\"connected\""), "{text}");
        assert!(!text.contains("globex"), "{text}");
        assert!(!text.contains("herald_account_lease_held{"), "{text}");
        assert_eq!(value(&fs, "herald_cluster_enabled", &[]), Some(0.0));
        assert_eq!(
            value(
                &fs,
                "herald_runs_finished_total",
                &[("account", "acme"), ("status", "success")]
            ),
            Some(2.0),
            "counters survive a scrape"
        );
    }

    #[test]
    fn run_outcomes_are_read_from_the_events_that_end_runs() {
        let event = |kind: &str, data: serde_json::Value| herald_actors::domain::Event {
            id: 1,
            at: chrono::Utc::now(),
            kind: kind.into(),
            account_id: Some("acme".into()),
            run_id: Some(1),
            data,
        };
        let finished = |status: &str| event("run_finished", serde_json::json!({"status": status}));
        assert_eq!(run_outcome(&finished("partial")), Some("partial"));
        assert_eq!(run_outcome(&finished("cancelled")), Some("cancelled"));
        assert_eq!(
            run_outcome(&event("run_missed", serde_json::json!({}))),
            Some("missed")
        );
        assert_eq!(run_outcome(&finished("running")), None, "not final");
        assert_eq!(
            run_outcome(&event("run_started", serde_json::json!({}))),
            None
        );
        assert_eq!(
            run_outcome(&event("run_finished", serde_json::json!({}))),
            None
        );
    }

    #[test]
    fn a_deleted_accounts_series_go_away() {
        let m = PromMetrics::new();
        exercise(&m, &id("acme"), 2);
        exercise(&m, &id("gone"), 2);
        m.retain_accounts(|a| a == "acme");
        let text = m.render();
        let fs = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let accounts: HashSet<&str> = fs
            .iter()
            .flat_map(|f| &f.samples)
            .filter_map(|s| s.labels.get("account").map(String::as_str))
            .collect();
        assert_eq!(accounts, HashSet::from(["acme"]), "{text}");
        // The account reporting again brings its series back.
        m.message_sent(&id("gone"), Duration::from_millis(5));
        assert!(m.render().contains("account=\"gone\""));
    }

    #[test]
    fn the_parser_rejects_malformed_expositions() {
        for bad in [
            "herald_x 1\n# EOF\n",
            "# TYPE herald_x counter\nherald_x 1\n# EOF\n",
            "# TYPE herald_x gauge\nherald_x{a=\"1\",a=\"2\"} 1\n# EOF\n",
            "# TYPE herald_x gauge\nherald_x{a=1} 1\n# EOF\n",
            "# TYPE herald_x gauge\nherald_x one\n# EOF\n",
            "# TYPE herald_x gauge\nherald_x 1\n",
            "# TYPE herald_x counter\nherald_x_total -1\n# EOF\n",
            "# TYPE herald_h histogram\nherald_h_bucket{le=\"1\"} 2\nherald_h_bucket{le=\"+Inf\"} 1\nherald_h_count 1\n# EOF\n",
            "# TYPE herald_h histogram\nherald_h_bucket{le=\"+Inf\"} 2\nherald_h_count 3\n# EOF\n",
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
        assert!(parse(
            "# TYPE herald_x gauge\n# HELP herald_x x\nherald_x{a=\"q\\\"\"} 1\n# EOF\n"
        )
        .is_ok());
    }
}
