//! The SchedulerActor: turns reminders into runs at the right instant.
//!
//! It is event-driven. The next due time of every active reminder lives in
//! memory in a min-heap; one timer sleeps until the earliest; a
//! [`ReminderChanged`] reloads that reminder and re-arms the timer at once;
//! a slow reconcile pass (default every 30 s) reloads what changed behind
//! our back, as a safety net only. It reads only reminders written since
//! its last pass (the store's per-reminder version), and what the
//! scheduler needs of them (no parts, no targets); every
//! [`FULL_RECONCILE_EVERY`]th pass reads every active reminder's slim row,
//! to notice what an incremental read cannot (a row deleted outright, or on
//! PostgreSQL a write that committed after a later one was read).
//!
//! The logic is split so tests can drive it by hand:
//! - [`next_due`]: pure — the next occurrence and when it may be sent;
//! - [`SchedulerState`]: synchronous — `apply` loaded reminders, `due_now`
//!   pops what is due at an instant and decides fire / missed;
//! - [`fire`], [`fire_now`], [`load_reminder`], [`load_reconcile`]: async
//!   store work that holds no scheduler state across an `.await`;
//! - [`SchedulerActor`]: the timer loop gluing the three together.
//!
//! Firing is safe to repeat: `Store::create_run` (and `create_runs`, which
//! queues a burst due together in a few transactions) is idempotent on
//! (reminder, scheduled_for), and only the call that created the run
//! dispatches it. A restarted scheduler, or a second one on the same
//! database, therefore never sends an occurrence twice.
//!
//! Decisions where the design is silent:
//! - A reminder's cursor is its newest run's `scheduled_for` (else its
//!   `created_at`); occurrences whose send time is at or before the
//!   reminder's `updated_at` are dropped silently: they fell while it was
//!   paused or before an edit, and are not "missed" by us.
//! - Several occurrences outside the window before one opening (a cron at
//!   half past every hour with a 06–18 window) coalesce into one run for
//!   the latest of them at the opening, rather than a burst of runs at
//!   06:00; where the opening is itself an occurrence (an hourly cron), it
//!   takes their place, so 06:00 sends once.
//! - After downtime the most recent `missed_cap` missed occurrences are
//!   recorded (so the cursor lands on the newest), older ones are counted
//!   in one `missed_runs_skipped` event.
//! - A one-shot reminder keeps its state after firing; it simply has no
//!   next occurrence. Archiving is the operator's call.
//! - `FireNow` outside the window creates the run as `scheduled` at once
//!   (so the caller gets its id and it survives a restart) and queues it
//!   at the opening; if the reminder is no longer active by then, the run
//!   is cancelled.
//!
//! Imports: `scheduling::preflight`, `domain`, `ports`, `messages`,
//! `lifecycle`, `events`.

mod actor;
mod config;
mod due;
mod fire;
mod reconcile;
mod state;

pub use actor::*;
pub use config::*;
pub use due::*;
pub use fire::*;
pub use reconcile::*;
pub use state::*;

#[cfg(test)]
pub(crate) mod tests;
