//! The daemon itself: its actors' restarts, its accounts, whether it
//! accepts work, and its version.

use super::labels::{KindLabel, VersionLabel};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Registered apart from [`Daemon`]: the families are exposed in the order
/// they were registered, and this one has always come before receipts.
pub(super) struct Supervision {
    pub(super) restarts: Family<KindLabel, Counter>,
}

impl Supervision {
    pub(super) fn register(r: &mut Registry) -> Self {
        let restarts = Family::default();
        r.register(
            "actor_restarts",
            "Actors restarted by their supervisor, by actor kind",
            Family::clone(&restarts),
        );
        Self { restarts }
    }
}

pub(super) struct Daemon {
    pub(super) accounts: Gauge,
    pub(super) ready: Gauge,
    pub(super) slow_acquires: Counter,
    pub(super) slow_acquire_max: Gauge<f64, AtomicU64>,
}

impl Daemon {
    pub(super) fn register(r: &mut Registry) -> Self {
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
        // A wait for a database connection past sqlx's threshold (2 s) is
        // the sign of a starved pool, as a login storm used to cause.
        let slow_acquires = Counter::default();
        r.register(
            "db_slow_acquires",
            "Waits for a database connection longer than 2 s, since the daemon started",
            slow_acquires.clone(),
        );
        let slow_acquire_max = Gauge::<f64, AtomicU64>::default();
        r.register(
            "db_slow_acquire_max_seconds",
            "The longest of those waits",
            slow_acquire_max.clone(),
        );
        Self {
            accounts,
            ready,
            slow_acquires,
            slow_acquire_max,
        }
    }
}

/// Herald's version, as an info metric.
pub(super) fn register_build(r: &mut Registry) {
    r.register(
        "build",
        "Herald's version",
        Info::new(VersionLabel {
            version: env!("CARGO_PKG_VERSION"),
        }),
    );
}
