//! Herald's delivery core: the domain, the ports it needs, and the actors
//! that turn due reminders into paced WhatsApp sends.

pub mod domain;
pub mod events;
pub mod forecast;
pub mod memstore;
pub mod messages;
pub mod ports;
pub mod scheduler;
pub mod simulator;
pub mod window_actor;

/// Contract suites any store or gateway implementation must pass.
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
