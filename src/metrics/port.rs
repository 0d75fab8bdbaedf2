//! The engine's and the scheduler's reports ([`Metrics`]), each into its
//! family.

use super::labels::{FailureLabels, KindLabel, OutcomeLabel, ReceiptLabels, SignalLabels};
use super::PromMetrics;
use herald_actors::domain::AccountId;
use herald_actors::ports::Metrics;
use std::time::Duration;

impl Metrics for PromMetrics {
    fn message_sent(&self, account: &AccountId, latency: Duration) {
        let l = self.label(account, None);
        self.delivery.sent.get_or_create(&l).inc();
        self.delivery
            .latency
            .get_or_create(&l)
            .observe(latency.as_secs_f64());
    }

    fn send_failed(&self, account: &AccountId, reason: &'static str) {
        let l = self.label(account, Some(reason));
        self.delivery
            .failures
            .get_or_create(&FailureLabels {
                account: l.account,
                reason,
            })
            .inc();
    }

    fn rate_limited(&self, account: &AccountId) {
        let l = self.label(account, None);
        self.delivery.rate_limited.get_or_create(&l).inc();
    }

    fn account_signal(&self, account: &AccountId, signal: &'static str) {
        let l = self.label(account, Some(signal));
        self.delivery
            .signals
            .get_or_create(&SignalLabels {
                account: l.account,
                signal,
            })
            .inc();
    }

    fn tokens_available(&self, account: &AccountId, tokens: f64, per_minute: u32) {
        let l = self.label(account, None);
        self.delivery.tokens.get_or_create(&l).set(tokens);
        self.delivery
            .rate
            .get_or_create(&l)
            .set(i64::from(per_minute));
    }

    fn queue_depth(&self, account: &AccountId, depth: usize) {
        let l = self.label(account, None);
        self.delivery
            .queue_depth
            .get_or_create(&l)
            .set(depth as i64);
    }

    fn targets_remaining(&self, account: &AccountId, remaining: usize) {
        let l = self.label(account, None);
        self.delivery
            .targets_remaining
            .get_or_create(&l)
            .set(remaining as i64);
    }

    fn media_uploaded(&self, account: &AccountId, bytes: u64) {
        let l = self.label(account, None);
        self.media.uploads.get_or_create(&l).inc();
        self.media.uploaded_bytes.get_or_create(&l).inc_by(bytes);
    }

    fn media_cache_hit(&self, account: &AccountId) {
        let l = self.label(account, None);
        self.media.cache_hits.get_or_create(&l).inc();
    }

    fn receipts_counted(&self, account: &AccountId, kind: &'static str, n: u64) {
        let l = self.label(account, None);
        self.receipts
            .counted
            .get_or_create(&ReceiptLabels {
                account: l.account,
                kind,
            })
            .inc_by(n);
    }

    fn receipts_uncounted(&self, outcome: &'static str, n: u64) {
        self.receipts
            .uncounted
            .get_or_create(&OutcomeLabel { outcome })
            .inc_by(n);
    }

    fn votes_counted(&self, account: &AccountId, n: u64) {
        let l = self.label(account, None);
        self.receipts.votes.get_or_create(&l).inc_by(n);
    }

    fn votes_uncounted(&self, outcome: &'static str, n: u64) {
        self.receipts
            .votes_uncounted
            .get_or_create(&OutcomeLabel { outcome })
            .inc_by(n);
    }

    fn actor_restarted(&self, kind: &'static str) {
        self.supervision
            .restarts
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    fn fire_lag(&self, lag: Duration) {
        self.scheduling.fire_lag.observe(lag.as_secs_f64());
    }

    fn run_missed(&self) {
        self.scheduling.missed.inc();
    }

    fn window_closed(&self) {
        self.scheduling.window_closures.inc();
    }
}
