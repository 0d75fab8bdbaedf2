//! Sending: what each account sent, failed, was told, and how fast it may
//! go (its bucket, its queue, its current run).

use super::labels::{AccountLabel, FailureLabels, FloatGauge, HistogramFamily, SignalLabels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashSet;

/// Send latency: the simulator answers in 80–400 ms, WhatsApp Web in about
/// the same; the tail buckets catch a struggling connection.
const LATENCY_BUCKETS: [f64; 11] = [0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

pub(super) struct Delivery {
    pub(super) sent: Family<AccountLabel, Counter>,
    pub(super) failures: Family<FailureLabels, Counter>,
    pub(super) rate_limited: Family<AccountLabel, Counter>,
    pub(super) signals: Family<SignalLabels, Counter>,
    pub(super) tokens: Family<AccountLabel, FloatGauge>,
    pub(super) rate: Family<AccountLabel, Gauge>,
    pub(super) queue_depth: Family<AccountLabel, Gauge>,
    pub(super) targets_remaining: Family<AccountLabel, Gauge>,
    pub(super) latency: HistogramFamily<AccountLabel>,
}

impl Delivery {
    pub(super) fn register(r: &mut Registry) -> Self {
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
        Self {
            sent,
            failures,
            rate_limited,
            signals,
            tokens,
            rate,
            queue_depth,
            targets_remaining,
            latency,
        }
    }

    /// Drops a deleted account's series; `reasons` are the failure reasons
    /// and signals seen for it (remembered in one set).
    pub(super) fn remove(&self, account: &str, reasons: &HashSet<&'static str>) {
        let l = AccountLabel {
            account: account.to_owned(),
        };
        for f in [&self.sent, &self.rate_limited] {
            f.remove(&l);
        }
        for f in [&self.rate, &self.queue_depth, &self.targets_remaining] {
            f.remove(&l);
        }
        self.tokens.remove(&l);
        self.latency.remove(&l);
        for reason in reasons.iter() {
            self.failures.remove(&FailureLabels {
                account: account.to_owned(),
                reason,
            });
            self.signals.remove(&SignalLabels {
                account: account.to_owned(),
                signal: reason,
            });
        }
    }
}
