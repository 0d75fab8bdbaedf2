//! What several test files share: starting daemons, clusters and
//! PostgreSQL schemas, the fan-out checks, pictures, ports and tools.

#[path = "../baileys/device.rs"]
pub mod baileys_device;
pub mod cluster;
pub mod daemon;
pub mod fan_out;
pub mod net;
pub mod png;
pub mod polls;
pub mod postgres;
pub mod tools;
