//! The metrics port: what the engine reports for `/metrics`.

use crate::domain::AccountId;
use std::time::Duration;

/// What the engine reports for `/metrics`. Labels are bounded: an account id
/// or a fixed reason, never a run or a group.
pub trait Metrics: Send + Sync + 'static {
    fn message_sent(&self, _account: &AccountId, _latency: Duration) {}
    fn send_failed(&self, _account: &AccountId, _reason: &'static str) {}
    fn rate_limited(&self, _account: &AccountId) {}
    /// An account-level signal (`signal` is one of
    /// [`crate::delivery::signals::AccountSignal::label`]'s few values).
    fn account_signal(&self, _account: &AccountId, _signal: &'static str) {}
    fn tokens_available(&self, _account: &AccountId, _tokens: f64, _per_minute: u32) {}
    fn queue_depth(&self, _account: &AccountId, _depth: usize) {}
    fn targets_remaining(&self, _account: &AccountId, _remaining: usize) {}
    fn media_uploaded(&self, _account: &AccountId, _bytes: u64) {}
    fn media_cache_hit(&self, _account: &AccountId) {}
    fn actor_restarted(&self, _kind: &'static str) {}
    fn fire_lag(&self, _lag: Duration) {}
    fn run_missed(&self) {}
    fn window_closed(&self) {}
    /// Participants newly counted from receipts (`kind`: delivered, read).
    fn receipts_counted(&self, _account: &AccountId, _kind: &'static str, _n: u64) {}
    /// Receipts that counted nothing: `outcome` is `repeated` or `ignored`.
    fn receipts_uncounted(&self, _outcome: &'static str, _n: u64) {}
    /// Poll votes that changed a voter's current choice in `account`'s polls.
    fn votes_counted(&self, _account: &AccountId, _n: u64) {}
    /// Poll votes not counted: `repeated`, `unknown_poll`, `bad_choice`,
    /// `undecryptable`.
    fn votes_uncounted(&self, _outcome: &'static str, _n: u64) {}
}

/// Metrics that go nowhere (benchmarks, simulation).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoMetrics;
impl Metrics for NoMetrics {}
