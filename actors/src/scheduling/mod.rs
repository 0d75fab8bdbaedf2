//! Scheduling: when each reminder fires (the SchedulerActor), when each
//! run's window closes or its parked remainder reopens (the WindowActor),
//! and which groups a reminder's account cannot post to (preflight), read
//! before a run's targets are frozen.
//!
//! Imports: `domain`, `ports`, `messages`, `lifecycle`, `events`. Runs are
//! handed to delivery by message ([`crate::messages::RunDue`]), never by
//! a call into it.

pub mod preflight;
pub mod scheduler;
pub mod window;
