//! Gateways the daemon plugs into the delivery core beside the simulator
//! (which lives in `herald-actors`, so tests and benchmarks can use it).

#[cfg(feature = "whatsapp")]
pub mod whatsapp;
