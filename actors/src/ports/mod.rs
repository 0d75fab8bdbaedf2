//! What the delivery core needs from the outside world: a store, a gateway
//! to WhatsApp, media bytes, a clock and somewhere to report metrics. The
//! daemon plugs in sqlx and the real gateways; tests and `herald simulate`
//! plug in the memory store, the simulator and virtual time.
//!
//! Imports: `domain` only. Everything above the ports reaches them as
//! `crate::ports::…`.

mod clock;
mod gateway;
mod metrics;
mod store;

pub use clock::*;
pub use gateway::*;
pub use metrics::*;
pub use store::*;

use std::sync::Arc;

/// The bundle of ports an actor system runs on.
#[derive(Clone)]
pub struct Ports {
    pub store: Arc<dyn Store>,
    pub gateways: Arc<dyn GatewayRegistry>,
    pub media: Arc<dyn MediaSource>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<dyn Metrics>,
}
