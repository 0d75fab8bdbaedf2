//! Pure: a reminder's next occurrence, when it may be sent given its
//! window, and how a missed one reads to the operator.

use super::config::{MAX_COALESCE, MAX_OPENING_GAP};
use crate::domain::{Schedule, TimeZone, WindowHours};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use std::time::Duration;

/// One occurrence of a reminder and when it may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// The schedule's instant: the run's `scheduled_for` (its firing lock).
    pub occurrence: DateTime<Utc>,
    /// The occurrence itself, or the window's opening if it falls outside
    /// the window. Late-fire grace counts from here.
    pub effective: DateTime<Utc>,
}

/// The first occurrence strictly after `after`, pushed to the window's
/// opening if it falls outside the window. Occurrences that fall before
/// the same opening coalesce into the latest of them, or into the
/// opening's own occurrence where the schedule has one: an hourly reminder
/// with a 09–17 window sends once at 09:00, not twice.
pub fn next_due(
    schedule: &Schedule,
    tz: &TimeZone,
    window: &WindowHours,
    after: DateTime<Utc>,
) -> Option<Due> {
    let occurrence = schedule.next_after(tz, after)?;
    let span = window.span_at_or_after(tz, occurrence);
    if span.contains(occurrence) {
        return Some(Due {
            occurrence,
            effective: occurrence,
        });
    }
    let before_open = span.open - ChronoDuration::nanoseconds(1);
    if schedule.next_after(tz, before_open) == Some(span.open) {
        return Some(Due {
            occurrence: span.open,
            effective: span.open,
        });
    }
    let latest = schedule
        .occurrences(tz, occurrence, before_open, MAX_COALESCE)
        .last()
        .copied()
        .unwrap_or(occurrence);
    Some(Due {
        occurrence: latest,
        effective: span.open,
    })
}

/// The first due whose send time is after `floor`, looking after `cursor`.
pub(crate) fn first_due_after_floor(
    schedule: &Schedule,
    tz: &TimeZone,
    window: &WindowHours,
    cursor: DateTime<Utc>,
    floor: DateTime<Utc>,
) -> Option<Due> {
    // Occurrences this far before the floor were sendable before it.
    let mut cursor = cursor.max(floor - MAX_OPENING_GAP);
    loop {
        let due = next_due(schedule, tz, window, cursor)?;
        if due.effective > floor {
            return Some(due);
        }
        cursor = due.occurrence;
    }
}

/// "MISSED_WINDOW: due 09:00 Asia/Kuala_Lumpur, picked up 3 hours 12 minutes late; not sent"
pub fn missed_summary(due: &Due, tz: &TimeZone, now: DateTime<Utc>) -> String {
    let local = |t: DateTime<Utc>| t.with_timezone(&tz.tz());
    let when = |t: DateTime<Utc>| {
        if local(t).date_naive() == local(now).date_naive() {
            local(t).format("%H:%M").to_string()
        } else {
            local(t).format("%Y-%m-%d %H:%M").to_string()
        }
    };
    let pushed = if due.effective != due.occurrence {
        format!(" (window opening; scheduled {})", when(due.occurrence))
    } else {
        String::new()
    };
    format!(
        "MISSED_WINDOW: due {} {tz}{pushed}, picked up {} late; not sent",
        when(due.effective),
        crate::domain::duration_words((now - due.effective).num_seconds())
    )
}

pub(crate) fn to_chrono(d: Duration) -> ChronoDuration {
    ChronoDuration::from_std(d).unwrap_or(ChronoDuration::MAX)
}
