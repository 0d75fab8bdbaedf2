//! `herald bench …`: benchmarks that print figures, one machine-readable
//! last line each.

pub mod store;
