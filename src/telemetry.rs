//! Logging set-up, separate from `main` so tests can send logs elsewhere.

use tracing::subscriber::set_global_default;
use tracing_subscriber::{fmt, layer::SubscriberExt, EnvFilter, Registry};

/// A subscriber writing human-readable lines to `sink`.
pub fn get_subscriber<W>(filter: &str, sink: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    Registry::default()
        .with(filter)
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
