//! The Herald daemon: settings, the sqlx store, the control port, the CLI
//! and the benchmarks, around the delivery core in `herald-actors`.

pub mod backup;
#[cfg(feature = "bench")]
pub mod bench;
pub mod boottime;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod export;
pub mod gateway;
pub mod groups;
pub mod http;
pub mod media;
pub mod metrics;
pub mod proxies;
pub mod retention;
pub mod seal;
pub mod service;
pub mod settings;
pub mod simulate;
pub mod startup;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod token;
pub mod webhooks;
