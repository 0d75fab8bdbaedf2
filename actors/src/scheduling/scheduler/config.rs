//! The scheduler's settings, what it talks to, and the bounds that keep a
//! catch-up or a burst cheap.

use crate::events::EventBus;
use crate::ports::{Clock, Metrics, Ports, Store};
use chrono::Duration as ChronoDuration;
use std::sync::Arc;
use std::time::Duration;

/// Longest gap between two window openings (a day plus a DST hour), with a
/// margin: an occurrence this long before an instant is certainly due
/// before it, whatever the window.
pub(crate) const MAX_OPENING_GAP: ChronoDuration = ChronoDuration::hours(26);

/// How many missed occurrences one catch-up counts exactly before jumping
/// ahead (a minutely cron down for a year would otherwise walk 500k steps
/// on the actor's thread).
pub(crate) const MAX_CATCH_UP_SCAN: u64 = 100_000;

/// A 5-field cron fires at most 1,500 times across the longest closed
/// stretch of a window; enough to find the last one before an opening.
pub(crate) const MAX_COALESCE: usize = 2_000;

/// Fires in flight at once when many reminders are due together and
/// cannot be batched (missed, released, or a batch that failed).
pub(crate) const FIRE_CONCURRENCY: usize = 32;

/// Every this many reconcile passes (the first included), one reads every
/// active reminder rather than only those changed since the last pass.
pub const FULL_RECONCILE_EVERY: u64 = 10;

/// Runs queued per `Store::create_runs` call: a burst of ten thousand costs
/// ten transactions, and one batch still commits in milliseconds.
pub(crate) const FIRE_BATCH: usize = 1000;

// ---------------------------------------------------------------- config

/// The scheduler's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// A run picked up later than this after its send time is recorded as
    /// missed (MISSED_WINDOW) and never sent (seed 004).
    pub late_fire_grace: Duration,
    /// How often the safety-net reconcile pass reloads reminders.
    pub reconcile_every: Duration,
    /// Most missed runs recorded per reminder in one catch-up.
    pub missed_cap: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            late_fire_grace: Duration::from_secs(5 * 60),
            reconcile_every: Duration::from_secs(30),
            missed_cap: 100,
        }
    }
}

/// What the scheduler talks to.
#[derive(Clone)]
pub struct SchedulerPorts {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<dyn Metrics>,
    pub events: EventBus,
}

impl SchedulerPorts {
    pub fn from_ports(p: &Ports, events: EventBus) -> Self {
        Self {
            store: p.store.clone(),
            clock: p.clock.clone(),
            metrics: p.metrics.clone(),
            events,
        }
    }
}
