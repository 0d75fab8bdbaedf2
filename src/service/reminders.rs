//! A reminder's switches: pause, resume, archive, and firing it now.

use super::error::ApiError;
use super::{version, Allowed, Operation};
use crate::state::AppState;
use actix::Addr;
use chrono::{DateTime, Utc};
use herald_actors::domain::{NewReminder, Reminder, ReminderState, Role, RunId, RunStatus};
use herald_actors::messages::ReminderChanged;
use herald_actors::ports::Store;
use herald_actors::scheduling::preflight::{preflight, Preflight};
use herald_actors::scheduling::scheduler::{FireNow, SchedulerActor};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub static CREATE: Operation = Operation::new("createReminder", Role::Operator);
pub static REPLACE: Operation = Operation::new("replaceReminder", Role::Operator);
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

/// A created or replaced reminder with what its account's group directory
/// says about its groups, so an operator learns before anything is sent.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "ReminderChecked")]
pub struct Checked {
    #[serde(flatten)]
    pub reminder: Reminder,
    pub preflight: Preflight,
}

/// What a reminder's operations need: the reminder in the store, the
/// scheduler, which hears of every change and fires, and the edit lock.
pub struct Reminders<'a> {
    store: &'a dyn Store,
    scheduler: &'a Addr<SchedulerActor>,
    edits: &'a tokio::sync::Mutex<()>,
}

impl<'a> Reminders<'a> {
    pub fn of(state: &'a AppState) -> Self {
        Self {
            store: state.store.as_ref(),
            scheduler: &state.scheduler,
            edits: &state.edits,
        }
    }

    /// Stores a new reminder; the scheduler picks it up.
    pub async fn create(&self, allowed: Allowed, new: NewReminder) -> Result<Checked, ApiError> {
        allowed.of(&CREATE)?;
        let reminder = self.store.create_reminder(&new, Utc::now()).await?;
        self.changed(reminder.id);
        self.checked(reminder).await
    }

    /// Replaces reminder `id` with `new`, while it is the version `expect`
    /// accepts (given the current version's tag).
    pub async fn replace(
        &self,
        allowed: Allowed,
        id: i64,
        expect: impl FnOnce(&str) -> Result<(), ApiError>,
        new: NewReminder,
    ) -> Result<Checked, ApiError> {
        allowed.of(&REPLACE)?;
        let reminder = {
            let _edit = self.edits.lock().await;
            let current = self.load(id).await?;
            expect(&version::of(&current))?;
            self.store.update_reminder(id, &new, Utc::now()).await?
        };
        self.changed(id);
        self.checked(reminder).await
    }

    async fn checked(&self, reminder: Reminder) -> Result<Checked, ApiError> {
        let preflight = preflight(self.store, &reminder.spec).await?;
        Ok(Checked {
            reminder,
            preflight,
        })
    }

    fn changed(&self, reminder_id: i64) {
        self.scheduler.do_send(ReminderChanged { reminder_id });
    }

    async fn load(&self, id: i64) -> Result<Reminder, ApiError> {
        self.store
            .get_reminder(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("reminder {id}")))
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
        let current = self.load(id).await?;
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
        self.changed(r.id);
        Ok(r)
    }
}
