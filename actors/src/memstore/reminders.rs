//! Reminders in memory: [`ReminderStore`], with the same versions,
//! validation and conflicts as the SQL store.

use super::{blocks_edit, take_limit, MemoryStore};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[async_trait]
impl ReminderStore for MemoryStore {
    // ------------------------------------------------------------ reminders

    async fn create_reminder(&self, r: &NewReminder, now: DateTime<Utc>) -> StoreResult<Reminder> {
        let mut g = self.lock()?;
        g.validate_reminder(r)?;
        g.last_reminder_id += 1;
        let reminder = Reminder {
            id: g.last_reminder_id,
            state: ReminderState::Active,
            spec: r.clone(),
            created_at: now,
            updated_at: now,
        };
        g.reminders.insert(reminder.id, reminder.clone());
        g.touch(reminder.id);
        Ok(reminder)
    }

    async fn get_reminder(&self, id: i64) -> StoreResult<Option<Reminder>> {
        Ok(self.lock()?.reminders.get(&id).cloned())
    }

    async fn list_reminders(&self, f: &ReminderFilter) -> StoreResult<Vec<Reminder>> {
        let g = self.lock()?;
        Ok(g.reminders
            .values()
            .filter(|r| {
                f.account_id
                    .as_ref()
                    .is_none_or(|a| &r.spec.account_id == a)
            })
            .filter(|r| f.state.is_none_or(|s| r.state == s))
            .cloned()
            .collect())
    }

    async fn update_reminder(
        &self,
        id: i64,
        r: &NewReminder,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        let mut g = self.lock()?;
        if !g.reminders.contains_key(&id) {
            return Err(StoreError::NotFound(format!("reminder {id}")));
        }
        g.validate_reminder(r)?;
        let busy = g
            .run_ids_of_reminder(id)
            .find(|run| blocks_edit(g.runs[run].run.status));
        if let Some(run) = busy {
            let status = g.runs[&run].run.status;
            return Err(StoreError::Conflict(format!(
                "reminder {id} cannot change while run {run} is {status}"
            )));
        }
        g.touch(id);
        let reminder = g.reminders.get_mut(&id).expect("checked above");
        reminder.spec = r.clone();
        reminder.updated_at = now;
        Ok(reminder.clone())
    }

    async fn set_reminder_state(
        &self,
        id: i64,
        state: ReminderState,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        let mut g = self.lock()?;
        let reminder = g
            .reminders
            .get_mut(&id)
            .ok_or_else(|| StoreError::NotFound(format!("reminder {id}")))?;
        reminder.state = state;
        reminder.updated_at = now;
        let out = reminder.clone();
        g.touch(id);
        Ok(out)
    }

    async fn list_reminder_summaries(&self, p: &ReminderPage) -> StoreResult<Vec<ReminderSummary>> {
        let g = self.lock()?;
        let f = &p.filter;
        let after = p.after_id.unwrap_or(i64::MIN);
        Ok(g.reminders
            .range(after.saturating_add(1)..)
            .map(|(_, r)| r)
            .filter(|r| {
                f.account_id
                    .as_ref()
                    .is_none_or(|a| &r.spec.account_id == a)
            })
            .filter(|r| f.state.is_none_or(|s| r.state == s))
            .take(take_limit(p.limit))
            .map(ReminderSummary::of)
            .collect())
    }

    async fn reminder_schedules(&self, scan: ScheduleScan) -> StoreResult<Vec<ReminderSchedule>> {
        let g = self.lock()?;
        let mut out: Vec<ReminderSchedule> = g
            .reminders
            .values()
            .filter(|r| match scan {
                ScheduleScan::Active => r.state == ReminderState::Active,
                ScheduleScan::ChangedAfter(v) => g.versions.get(&r.id).is_some_and(|n| *n > v),
            })
            .map(|r| g.schedule_of(r))
            .collect();
        if let ScheduleScan::ChangedAfter(_) = scan {
            out.sort_by_key(|r| r.version);
        }
        Ok(out)
    }

    async fn get_reminder_schedule(&self, id: i64) -> StoreResult<Option<ReminderSchedule>> {
        let g = self.lock()?;
        Ok(g.reminders.get(&id).map(|r| g.schedule_of(r)))
    }
}
