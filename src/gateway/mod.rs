//! Gateways the daemon plugs into the delivery core beside the simulator
//! (which lives in `herald-actors`, so tests and benchmarks can use it),
//! and the shared simulator process (`herald simulator serve`) with its
//! client.
//!
//! Imports: `seal`, `settings`, `token`, `store::whatsapp` (sealed sessions),
//! and of the core `herald_actors::domain`, `herald_actors::ports` (the
//! gateway port), `herald_actors::events`, `herald_actors::delivery` (leases,
//! control answers, account signals), `herald_actors::supervisor` and
//! `herald_actors::simulator`.

pub mod pairing_view;
pub mod remote_sim;
pub mod sim_server;
pub mod sim_wire;
#[cfg(feature = "whatsapp")]
pub mod whatsapp;
