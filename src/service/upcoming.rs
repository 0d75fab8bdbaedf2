//! What will send when: every fire of the active reminders in the next 24
//! hours, each with its account and how many groups it names, as the
//! overview's chart draws them. Computed with the scheduler's own
//! `next_due` (a fire outside its window moves to the window's opening,
//! as the scheduler moves it).

use super::error::ApiError;
use super::reminders::Reminders;
use super::{Allowed, Operation, Service};
use chrono::{DateTime, Duration, Utc};
use herald_actors::domain::{AccountId, Reminder, ReminderState, Role};
use herald_actors::ports::ReminderFilter;
use herald_actors::scheduling::scheduler::next_due;
use schemars::JsonSchema;
use serde::Serialize;

pub static UPCOMING: Operation = Operation::read("listUpcomingFires", Role::Viewer);

/// Hours ahead the forecast covers.
pub const HOURS: i64 = 24;
/// Fires of one reminder counted at most: a reminder every minute fires
/// 1,440 times a day.
const PER_REMINDER: usize = 1440;

/// One fire ahead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Fire {
    /// When it starts sending: the occurrence, or its window's opening.
    pub at: DateTime<Utc>,
    pub reminder_id: i64,
    pub title: String,
    pub account_id: AccountId,
    /// Groups the reminder names; one that picks groups with a selector
    /// picks them when the run starts (`selects`), on top of these.
    pub groups: u32,
    pub selects: bool,
}

/// The fires of the next 24 hours, soonest first.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Upcoming {
    pub from: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub fires: Vec<Fire>,
}

impl Upcoming {
    /// The fires of `reminders` (active ones) in `[from, from + 24 h)`.
    pub fn of(reminders: &[Reminder], from: DateTime<Utc>) -> Self {
        let until = from + Duration::hours(HOURS);
        let mut fires = Vec::new();
        for r in reminders
            .iter()
            .filter(|r| r.state == ReminderState::Active)
        {
            let s = &r.spec;
            // `next_due` looks strictly after its instant: start a moment
            // before `from` so a fire at `from` itself counts.
            let mut after = from - Duration::nanoseconds(1);
            for _ in 0..PER_REMINDER {
                let Some(due) = next_due(&s.schedule, &s.timezone, &s.window, after) else {
                    break;
                };
                if due.effective >= until {
                    break;
                }
                fires.push(Fire {
                    at: due.effective,
                    reminder_id: r.id,
                    title: s.title.clone(),
                    account_id: s.account_id.clone(),
                    groups: s.targets.len() as u32,
                    selects: s.select.is_some(),
                });
                after = due.occurrence;
            }
        }
        fires.sort_by_key(|f| (f.at, f.reminder_id));
        Self { from, until, fires }
    }
}

/// Reading what will send when.
pub struct Upcomings<'a> {
    reminders: Reminders<'a>,
}

impl<'a> Upcomings<'a> {
    pub fn of(service: &'a Service) -> Self {
        Self {
            reminders: Reminders::of(service),
        }
    }

    /// The next 24 hours from now.
    pub async fn get(&self, allowed: Allowed) -> Result<Upcoming, ApiError> {
        allowed.of(&UPCOMING)?;
        let active = ReminderFilter {
            state: Some(ReminderState::Active),
            ..ReminderFilter::default()
        };
        let reminders = self.reminders.all(allowed, &active).await?;
        Ok(Upcoming::of(&reminders, Utc::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use herald_actors::domain::{
        GroupJid, MessagePart, NewReminder, Schedule, TimeZone, WindowHours,
    };

    fn reminder(id: i64, cron: &str, window: (i64, i64), groups: usize) -> Reminder {
        let at = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
        Reminder {
            id,
            state: ReminderState::Active,
            spec: NewReminder {
                account_id: AccountId::parse("a").unwrap(),
                title: format!("r{id}"),
                timezone: TimeZone::parse("Asia/Kuala_Lumpur").unwrap(),
                schedule: Schedule::cron(cron).unwrap(),
                window: WindowHours::parse(window.0, window.1).unwrap(),
                resume_next_window: false,
                parts: vec![MessagePart::text("hi").unwrap()],
                targets: (0..groups)
                    .map(|i| GroupJid::parse(&format!("120363{i:012}@g.us")).unwrap())
                    .collect(),
                select: None,
                unique_texts: false,
            },
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn fires_of_the_next_day_move_to_their_window_and_stop_at_24_hours() {
        // 00:00 UTC is 08:00 in Kuala Lumpur.
        let from = Utc.with_ymd_and_hms(2026, 11, 23, 0, 0, 0).unwrap();
        let hourly = reminder(1, "0 * * * *", (9, 17), 3);
        let daily = reminder(2, "30 8 * * *", (0, 24), 5);
        let mut paused = reminder(3, "* * * * *", (0, 24), 1);
        paused.state = ReminderState::Paused;
        let u = Upcoming::of(&[hourly, daily, paused], from);
        let at = |h: u32, m: u32| Utc.with_ymd_and_hms(2026, 11, 23, h, m, 0).unwrap();
        let of = |id: i64| -> Vec<DateTime<Utc>> {
            u.fires
                .iter()
                .filter(|f| f.reminder_id == id)
                .map(|f| f.at)
                .collect()
        };
        // 08:00 local is outside 09–17: 09:00's own occurrence (01:00 UTC)
        // takes the night's place; then every hour to 16:00 local; the next
        // day's 08:00 is past 24 h away.
        let expected: Vec<_> = (1..=8).map(|h| at(h, 0)).collect();
        assert_eq!(of(1), expected);
        assert_eq!(of(2), vec![at(0, 30)]);
        assert!(of(3).is_empty(), "a paused reminder does not fire");
        assert!(u.fires.windows(2).all(|w| w[0].at <= w[1].at));
        assert_eq!(u.fires[0].groups, 5);
        assert_eq!(u.until, from + Duration::hours(24));
    }

    #[test]
    fn a_reminder_every_minute_is_counted_to_its_cap() {
        let from = Utc.with_ymd_and_hms(2026, 11, 23, 0, 0, 0).unwrap();
        let u = Upcoming::of(&[reminder(1, "* * * * *", (0, 24), 1)], from);
        assert_eq!(u.fires.len(), PER_REMINDER);
        assert_eq!(u.fires[0].at, from, "a fire at `from` itself counts");
    }
}
