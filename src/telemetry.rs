//! Logging set-up, separate from `main` so tests can send logs elsewhere.

use std::sync::atomic::{AtomicU64, Ordering};
use tracing::subscriber::set_global_default;
use tracing_subscriber::{fmt, layer::SubscriberExt, EnvFilter, Layer, Registry};

/// A subscriber writing human-readable lines to `sink`.
pub fn get_subscriber<W>(filter: &str, sink: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    Registry::default()
        .with(filter)
        .with(SlowAcquires)
        // Colour only for a person at a terminal, not for journald or files.
        .with(
            fmt::layer()
                .with_writer(sink)
                .with_target(true)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
}

/// Installs the subscriber for the whole process; a second call is a no-op.
pub fn init_subscriber(subscriber: impl tracing::Subscriber + Send + Sync) {
    let _ = set_global_default(subscriber);
}

/// Database connections handed out only after sqlx's slow threshold (2 s):
/// how many since the process started, and the longest wait. Counted from
/// sqlx's own warning, so the figure is the one an operator sees in the log.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SlowAcquireCount {
    pub count: u64,
    pub max_secs: f64,
}

static SLOW_ACQUIRES: AtomicU64 = AtomicU64::new(0);
/// The longest wait in microseconds.
static SLOW_ACQUIRE_MAX_US: AtomicU64 = AtomicU64::new(0);

/// The slow acquires counted so far (see [`SlowAcquireCount`]).
pub fn slow_acquires() -> SlowAcquireCount {
    SlowAcquireCount {
        count: SLOW_ACQUIRES.load(Ordering::Relaxed),
        max_secs: SLOW_ACQUIRE_MAX_US.load(Ordering::Relaxed) as f64 / 1e6,
    }
}

/// Counts sqlx's "time to acquire exceeded slow threshold" warnings.
struct SlowAcquires;

/// Reads the wait out of the warning's `aquired_after_secs` field (sqlx's
/// spelling).
struct AcquiredAfter(Option<f64>);

impl tracing::field::Visit for AcquiredAfter {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        if field.name() == "aquired_after_secs" {
            self.0 = Some(value);
        }
    }

    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> Layer<S> for SlowAcquires {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() != "sqlx::pool::acquire" || *meta.level() > tracing::Level::WARN {
            return;
        }
        // Only the slow-threshold warning carries the threshold field.
        if meta.fields().field("slow_acquire_threshold_secs").is_none() {
            return;
        }
        let mut after = AcquiredAfter(None);
        event.record(&mut after);
        SLOW_ACQUIRES.fetch_add(1, Ordering::Relaxed);
        if let Some(secs) = after.0 {
            SLOW_ACQUIRE_MAX_US.fetch_max((secs * 1e6) as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sqlx's slow-acquire warning is counted with its wait; its plain
    /// "acquired connection" event and other targets' warnings are not.
    #[test]
    fn sqlx_slow_acquire_warnings_are_counted_with_the_longest_wait() {
        let before = slow_acquires();
        let subscriber = Registry::default().with(SlowAcquires);
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(
                target: "sqlx::pool::acquire",
                aquired_after_secs = 3.5f64,
                slow_acquire_threshold_secs = 2.0f64,
                "acquired connection, but time to acquire exceeded slow threshold"
            );
            tracing::warn!(
                target: "sqlx::pool::acquire",
                aquired_after_secs = 900.0f64,
                "acquired connection"
            );
            tracing::warn!(
                aquired_after_secs = 900.0f64,
                slow_acquire_threshold_secs = 2.0f64,
                "not sqlx"
            );
        });
        let after = slow_acquires();
        assert_eq!(after.count, before.count + 1);
        assert!(after.max_secs >= 3.5 && after.max_secs < 900.0, "{after:?}");
    }
}
