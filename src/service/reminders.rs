//! A reminder's switches: pause, resume, archive, and firing it now.

use super::error::ApiError;
use super::{Allowed, Operation};
use crate::state::AppState;
use actix::Addr;
use chrono::{DateTime, Utc};
use herald_actors::domain::{Reminder, ReminderState, Role, RunId, RunStatus};
use herald_actors::messages::ReminderChanged;
use herald_actors::ports::Store;
use herald_actors::scheduling::scheduler::{FireNow, SchedulerActor};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub static PAUSE: Operation = Operation::new("pauseReminder", Role::Operator);
pub static RESUME: Operation = Operation::new("resumeReminder", Role::Operator);
pub static ARCHIVE: Operation = Operation::new("archiveReminder", Role::Operator);
pub static FIRE: Operation = Operation::new("fireReminder", Role::Operator);

/// A fired reminder's run.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct FireResult {
    pub run_id: RunId,
    pub status: RunStatus,
    pub scheduled_for: DateTime<Utc>,
}

/// What a reminder's switches need: the reminder in the store and the
/// scheduler, which hears of every change and fires.
pub struct Reminders<'a> {
    store: &'a dyn Store,
    scheduler: &'a Addr<SchedulerActor>,
}

impl<'a> Reminders<'a> {
    pub fn of(state: &'a AppState) -> Self {
        Self {
            store: state.store.as_ref(),
            scheduler: &state.scheduler,
        }
    }

    /// Idempotent; an archived reminder stays archived (409).
    pub async fn pause(&self, allowed: Allowed, id: i64) -> Result<Reminder, ApiError> {
        allowed.of(&PAUSE)?;
        self.transition(id, ReminderState::Paused).await
    }

    /// Idempotent; an archived reminder stays archived (409).
    pub async fn resume(&self, allowed: Allowed, id: i64) -> Result<Reminder, ApiError> {
        allowed.of(&RESUME)?;
        self.transition(id, ReminderState::Active).await
    }

    /// The reminder stops firing and its history stays. Runs already queued
    /// or in flight go on; stopping them is the runs' operation.
    pub async fn archive(&self, allowed: Allowed, id: i64) -> Result<Reminder, ApiError> {
        allowed.of(&ARCHIVE)?;
        self.transition(id, ReminderState::Archived).await
    }

    /// Fires now, to the second: inside the window the run is queued at
    /// once; outside it waits (status `scheduled`) for the window to open.
    pub async fn fire(&self, allowed: Allowed, id: i64) -> Result<FireResult, ApiError> {
        allowed.of(&FIRE)?;
        let run_id = self.scheduler.send(FireNow { reminder_id: id }).await??;
        let run = self
            .store
            .get_run(run_id)
            .await?
            .ok_or_else(|| ApiError::internal("the fired run vanished", run_id))?;
        Ok(FireResult {
            run_id,
            status: run.status,
            scheduled_for: run.scheduled_for,
        })
    }

    async fn transition(&self, id: i64, to: ReminderState) -> Result<Reminder, ApiError> {
        let current = self
            .store
            .get_reminder(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("reminder {id}")))?;
        if current.state == ReminderState::Archived && to != ReminderState::Archived {
            return Err(ApiError::conflict(format!(
                "reminder {} is archived; create a new one instead",
                current.id
            )));
        }
        if current.state == to {
            return Ok(current);
        }
        let r = self
            .store
            .set_reminder_state(current.id, to, Utc::now())
            .await?;
        self.scheduler
            .do_send(ReminderChanged { reminder_id: r.id });
        Ok(r)
    }
}
