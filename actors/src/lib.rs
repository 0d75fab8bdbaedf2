//! Herald's delivery core: the domain, the ports it needs, and the actors
//! that turn due reminders into paced WhatsApp sends.

pub mod account;
pub mod bucket;
pub mod caps;
pub mod chaos;
pub mod domain;
pub mod engine;
pub mod events;
pub mod forecast;
pub mod lease;
pub mod lifecycle;
pub mod memstore;
pub mod messages;
pub mod outcome;
pub mod ports;
pub mod preflight;
pub mod risk;
pub mod run;
pub mod scheduler;
pub mod signals;
pub mod sim;
pub mod simulator;
pub mod supervisor;
pub mod variation;
pub mod window_actor;
pub mod writer;

/// Contract suites any store or gateway implementation must pass.
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
