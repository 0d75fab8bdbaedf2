//! Scheduling: how late reminders fire, how many were missed, and the
//! runs their window stopped.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// Fire lag: normally milliseconds; minutes mean the daemon was busy or
/// down (past `late_fire_grace`, 300 s by default, the run is missed).
const FIRE_LAG_BUCKETS: [f64; 10] = [0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 300.0];

pub(super) struct Scheduling {
    pub(super) fire_lag: Histogram,
    pub(super) missed: Counter,
    pub(super) window_closures: Counter,
}

impl Scheduling {
    pub(super) fn register(r: &mut Registry) -> Self {
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
        Self {
            fire_lag,
            missed,
            window_closures,
        }
    }
}
