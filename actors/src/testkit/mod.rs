//! Contract suites shared by every implementation of a port.
//!
//! Imports: anything of the core it checks: `cluster`, `delivery`, `domain`,
//! `lifecycle`, `memstore`, `messages`, `ports`, `scheduling`, `simulator`,
//! `supervisor`, `world`.

pub mod chaos;
pub mod gateway_contract;
pub mod store_contract;
