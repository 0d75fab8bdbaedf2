//! Herald's delivery core: the domain, the ports it needs, and the actors
//! that turn due reminders into paced WhatsApp sends.

pub mod domain;
pub mod events;
pub mod messages;
pub mod ports;
