//! Gateways the daemon plugs into the delivery core beside the simulator
//! (which lives in `herald-actors`, so tests and benchmarks can use it),
//! and the shared simulator process (`herald simulator serve`) with its
//! client.

pub mod remote_sim;
pub mod sim_server;
pub mod sim_wire;
#[cfg(feature = "whatsapp")]
pub mod whatsapp;
