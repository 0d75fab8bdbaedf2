//! Herald's delivery core: the domain, the ports it needs, and the actors
//! that turn due reminders into paced WhatsApp sends.
//!
//! The modules are layers; each imports only from its own layer or the
//! ones listed before it (`scripts/check-architecture` enforces it):
//!
//! 1. [`domain`]: pure types, valid by construction.
//! 2. [`ports`] (what the core needs from outside: store, gateway, media,
//!    clock, metrics), [`messages`] (what the actors tell each other),
//!    [`lifecycle`] (the run state machine), [`events`] (the event bus).
//! 3. [`scheduling`] (when a reminder fires, and the window timers), and
//!    the simulated parts that implement ports without I/O: [`simulator`]
//!    (the simulated WhatsApp, the default gateway) and [`memstore`].
//! 4. [`delivery`]: the account actor and everything a run needs to send.
//! 5. [`supervisor`] (one actor per account) and [`cluster`] (leases
//!    across daemons).
//! 6. [`world`]: a whole engine on the simulated parts (`herald simulate`).
//! 7. `testkit` (feature `testkit`): the fault simulation and the contract
//!    suites, test machinery only.

pub mod domain;

pub mod events;
pub mod lifecycle;
pub mod messages;
pub mod ports;

pub mod memstore;
pub mod scheduling;
pub mod simulator;

pub mod delivery;

pub mod cluster;
pub mod supervisor;

pub mod world;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
