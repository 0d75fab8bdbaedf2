//! Delivery: the AccountActor and everything one run needs to send, paced
//! and exactly once. The actor owns its account's token bucket, run queue
//! and upload cache; a run executes as named steps inside it.
//!
//! Imports: `domain`, `ports`, `messages`, `lifecycle`, `events`, and
//! `scheduling` (a run asks for its preflight). Nothing here
//! knows the supervisor, the cluster or the simulator.

pub mod account;
pub mod amend;
pub mod bucket;
pub mod caps;
pub mod engine;
pub mod forecast;
pub mod leases;
pub mod outcome;
pub mod receipts;
pub mod run;
pub mod signals;
pub mod standing;
pub mod variation;
pub mod writer;
