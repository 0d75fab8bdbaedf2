//! Contract suites shared by every implementation of a port.

pub mod chaos;
pub mod gateway_contract;
pub mod store_contract;
