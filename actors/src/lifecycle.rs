//! The run state machine: every status a run can have, the events that move
//! it, and from which statuses each event may move it. Nobody else decides
//! a run's status: actors, the scheduler, the window actor and the control
//! port name an event, and the store applies it as a compare-and-set on the
//! statuses listed here (`UPDATE … WHERE id = ? AND status IN (…)`), so two
//! racing controls can never resurrect or double-finish a run.
//!
//! ```text
//!  fire ──► scheduled ──release──► queued ──start──► running ──finish──► success|partial|failed|cancelled
//!    │          │                   ▲  │              │  ▲ │
//!    │          └─release late─► missed │  └─pause──► paused ◄─┘ │ └─park──► parked ──start──┘
//!    └─miss──► missed                  └─resume──────┘        └─halt/retry─► queued
//! ```
//!
//! Targets have their own small machine, applied the same way by
//! [`Transition::allowed_from`].

use crate::domain::{RunStatus, TargetStatus, Transition};
use crate::ports::RunUpdate;
use chrono::{DateTime, Utc};

use RunStatus::*;

/// What happens to a run. Each names the statuses it may leave from and
/// the status it leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunEvent {
    /// A deferred (`scheduled`) run's window opened: it joins its account's queue.
    Release,
    /// The account actor begins (or resumes after a crash, a park or a halt) the run.
    Start,
    /// The operator pauses a run that is queued, running or parked.
    Pause,
    /// The operator resumes a paused run: it joins its account's queue again.
    Resume,
    /// The window closed with work left and the reminder asks to resume at
    /// the next opening.
    Park,
    /// The account cannot send (logged out, banned, disabled, unreachable)
    /// or the store failed: the run goes back to its account's queue, which
    /// keeps it until the account is usable again.
    Requeue,
    /// The operator retries a finished run's unsent targets.
    Retry,
    /// Every target is final, or the run was stopped: the run ends.
    Finish(RunStatus),
    /// The operator stops a run that is not executing.
    Cancel,
    /// A deferred run's reminder was paused or archived before its opening,
    /// or it was picked up too late.
    Drop(RunStatus),
}

impl RunEvent {
    /// The statuses this event may move a run from.
    pub fn from(self) -> &'static [RunStatus] {
        match self {
            Self::Release => &[Scheduled],
            // `running` too: a run that was executing when the daemon
            // crashed is started again by its account's new actor.
            Self::Start => &[Queued, Running, Parked],
            Self::Pause => &[Queued, Running, Parked],
            Self::Resume => &[Paused],
            Self::Park => &[Running],
            Self::Requeue => &[Running],
            Self::Retry => &[Partial, Failed, Cancelled],
            // A pause that lands as the last target finishes must not keep
            // a finished run open.
            Self::Finish(_) => &[Running, Paused],
            Self::Cancel => &[Scheduled, Queued, Paused, Parked],
            Self::Drop(_) => &[Scheduled],
        }
    }

    /// The status this event leads to.
    pub fn to(self) -> RunStatus {
        match self {
            Self::Release | Self::Resume | Self::Requeue | Self::Retry => Queued,
            Self::Start => Running,
            Self::Pause => Paused,
            Self::Park => Parked,
            Self::Cancel => Cancelled,
            Self::Finish(s) | Self::Drop(s) => {
                debug_assert!(s.is_final(), "a run finishes in a final status");
                s
            }
        }
    }

    /// Whether the run ends with this event.
    pub fn is_final(self) -> bool {
        self.to().is_final()
    }

    /// The store update for this event, to extend with other fields.
    pub fn update(self) -> RunUpdate {
        RunUpdate {
            status: Some(self.to()),
            expect: self.from().to_vec(),
            ..RunUpdate::default()
        }
    }

    /// A final update: `finished_at` set, and any target still open is
    /// skipped with `reason` in the same write, so a finished run never
    /// has an unfinished target.
    pub fn finish_update(
        self,
        at: DateTime<Utc>,
        summary: Option<String>,
        reason: &str,
    ) -> RunUpdate {
        debug_assert!(self.is_final());
        RunUpdate {
            finished_at: Some(at),
            error_summary: summary,
            skip_open: Some(reason.to_owned()),
            ..self.update()
        }
    }
}

/// A retry's update: the run back to `queued` and its unsent targets back
/// to pending, in one write.
pub fn retry_update() -> RunUpdate {
    RunUpdate {
        requeue_unsent: true,
        ..RunEvent::Retry.update()
    }
}

/// Whether some event can move a run from `from` to `to`: the whole graph,
/// for tests and for the control port's "can this run be …" questions.
pub fn can_move(from: RunStatus, to: RunStatus) -> bool {
    ALL_EVENTS
        .iter()
        .any(|e| e.to() == to && e.from().contains(&from))
}

const ALL_EVENTS: &[RunEvent] = &[
    RunEvent::Release,
    RunEvent::Start,
    RunEvent::Pause,
    RunEvent::Resume,
    RunEvent::Park,
    RunEvent::Requeue,
    RunEvent::Retry,
    RunEvent::Finish(Success),
    RunEvent::Finish(Partial),
    RunEvent::Finish(Failed),
    RunEvent::Finish(Cancelled),
    RunEvent::Cancel,
    RunEvent::Drop(Cancelled),
    RunEvent::Drop(Missed),
];

/// Appended to the reason of a target skipped while `sending`: a message
/// whose answer never came may have reached the group.
pub const MAYBE_DELIVERED: &str = "; the last message sent may have been delivered";

/// Whether the part after a target's `parts_sent` may have reached its
/// group: its send was under way (`sending`), ended without a confirmed
/// refusal (`failed`, `pending` again for a retry), or was cut short with
/// its answer unknown (skipped "…may have been delivered"). A target sent,
/// or skipped before its next part went, has nothing more out there.
pub fn maybe_in_flight(status: TargetStatus, error: Option<&str>) -> bool {
    match status {
        TargetStatus::Sending | TargetStatus::Failed | TargetStatus::Pending => true,
        TargetStatus::Skipped => error.is_some_and(|e| e.ends_with(MAYBE_DELIVERED)),
        TargetStatus::Sent => false,
    }
}

/// What one target may have sent since `since`, for a new actor's limiter:
/// its parts at the time of its last one (when recent); while its next
/// part is marked `sending`, that part as just now (`None`); and a part
/// whose answer was lost before its run ended (skipped "…may have been
/// delivered", or failed after a try) at the run's end, when recent: its
/// send came before it, so counting it then errs on the side of waiting.
pub fn sends_since(
    status: TargetStatus,
    error: Option<&str>,
    sent_at: Option<chrono::DateTime<chrono::Utc>>,
    parts_sent: u32,
    run_finished_at: Option<chrono::DateTime<chrono::Utc>>,
    since: chrono::DateTime<chrono::Utc>,
) -> Vec<(Option<chrono::DateTime<chrono::Utc>>, u32)> {
    let mut out = Vec::new();
    if let Some(at) = sent_at.filter(|at| *at >= since && parts_sent > 0) {
        out.push((Some(at), parts_sent));
    }
    let lost_answer = match status {
        TargetStatus::Sending => true,
        TargetStatus::Skipped => error.is_some_and(|e| e.ends_with(MAYBE_DELIVERED)),
        TargetStatus::Failed => true,
        TargetStatus::Pending | TargetStatus::Sent => false,
    };
    if lost_answer {
        match run_finished_at {
            None => out.push((None, 1)),
            Some(end) if end >= since => out.push((Some(end), 1)),
            Some(_) => {}
        }
    }
    out
}

/// [`maybe_in_flight`] in SQL over `run_targets` aliased `t`.
pub fn maybe_in_flight_sql() -> String {
    format!(
        "(t.status IN ('sending', 'failed', 'pending') OR (t.status = 'skipped' AND t.error LIKE '%{MAYBE_DELIVERED}'))"
    )
}

/// Statuses of a run that has not ended.
pub const UNFINISHED: &[RunStatus] = &[Queued, Running, Paused, Parked];

/// Runs that some actor must be carrying forward: handed back at start-up
/// and by the supervisor's sweep.
pub fn is_owned_by_account(status: RunStatus) -> bool {
    matches!(status, Queued | Running)
}

impl Transition {
    /// The target statuses this transition may apply to; the store skips it
    /// otherwise, so a late or repeated mark cannot undo a later one.
    pub fn allowed_from(&self) -> &'static [TargetStatus] {
        use TargetStatus as T;
        match self {
            Transition::Sending { .. } => &[T::Pending, T::Sending],
            Transition::Sent { .. } => &[T::Sending],
            Transition::Failed { .. } | Transition::Skipped { .. } => &[T::Pending, T::Sending],
            Transition::Requeue { .. } => &[T::Failed, T::Skipped],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_statuses_are_left_only_by_retry() {
        for e in ALL_EVENTS {
            for from in e.from() {
                if from.is_final() {
                    assert_eq!(*e, RunEvent::Retry, "{e:?} leaves final {from}");
                }
            }
        }
        assert!(
            !can_move(Success, Queued),
            "a successful run has nothing to retry"
        );
        assert!(can_move(Partial, Queued));
        assert!(!can_move(Missed, Queued));
        assert!(!can_move(Cancelled, Running));
    }

    #[test]
    fn every_unfinished_status_can_reach_an_end() {
        for s in RunStatus::ALL.iter().filter(|s| !s.is_final()) {
            let mut seen = vec![*s];
            let mut i = 0;
            while i < seen.len() {
                for e in ALL_EVENTS {
                    if e.from().contains(&seen[i]) && !seen.contains(&e.to()) {
                        seen.push(e.to());
                    }
                }
                i += 1;
            }
            assert!(seen.iter().any(|x| x.is_final()), "{s} cannot end");
        }
    }

    #[test]
    fn status_writes_are_compare_and_set() {
        let u = RunEvent::Pause.update();
        assert_eq!(u.status, Some(Paused));
        assert_eq!(u.expect, vec![Queued, Running, Parked]);
        let f = RunEvent::Finish(Partial).finish_update(Utc::now(), None, "x");
        assert_eq!(f.skip_open.as_deref(), Some("x"));
        assert!(f.finished_at.is_some());
    }
}
