//! Messages that cross between Herald's actors. Each is handled by the actor
//! named in its doc comment; the supervisor routes account-bound messages.

use crate::domain::{AccountId, RunId};
use actix::Message;
use chrono::{DateTime, Utc};

/// SchedulerActor → Supervisor → AccountActor: a run is queued and should
/// join its account's run queue. Also sent for crash resume at start-up.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RunDue {
    pub run_id: RunId,
    pub account_id: AccountId,
}

/// WindowActor → Supervisor → AccountActor: the run's delivery window has
/// closed; remaining targets are skipped (or parked, with resume_next_window).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct WindowClosed {
    pub run_id: RunId,
    pub account_id: AccountId,
    pub close_at: DateTime<Utc>,
}

/// AccountActor → WindowActor: stop this run at `close_at`.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ArmWindow {
    pub run_id: RunId,
    pub account_id: AccountId,
    pub close_at: DateTime<Utc>,
}

/// AccountActor → WindowActor: the run finished before its window closed.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct DisarmWindow {
    pub run_id: RunId,
}

/// Control port → SchedulerActor: a reminder was created, changed, paused,
/// resumed or deleted; recompute its next due time now.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ReminderChanged {
    pub reminder_id: i64,
}

/// AccountActor → WindowActor: the window closed with work left and the
/// reminder asks to resume at the next opening; send `RunDue` at `at`.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ParkRun {
    pub due: RunDue,
    pub at: DateTime<Utc>,
}
