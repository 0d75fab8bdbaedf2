//! Herald's integration tests, in one binary. Cargo runs test binaries
//! one after another; in one binary libtest runs the tests of every file
//! side by side (most of them wait on daemons, sockets and clients rather
//! than compute), and the suite is compiled and linked once instead of
//! once per file. `cargo test --test suite <file>::` runs one file's tests.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod backup;
mod cluster;
mod cluster_whatsapp;
mod container;
mod cost;
mod daemon;
mod deploy;
mod edge;
mod leases;
mod restart;
mod schemathesis;
mod session_store;
mod simulator_process;
mod store_contract;
mod webhooks;
mod whatsapp;
mod wire_fence;
