//! Reminders as operators see and change them: the list, one with where
//! its schedule goes next, the dry-run forecast and the texts' preview;
//! creating, replacing, the switches (pause, resume, archive), and firing
//! one now.

use super::error::ApiError;
use super::Service;
use super::{version, Allowed, Operation};
use actix::Addr;
use chrono::{DateTime, Duration, SubsecRound, Utc};
use herald_actors::delivery::engine::Engine;
use herald_actors::delivery::run::{account_caps, forecast_for, standing_note};
use herald_actors::delivery::variation::{directory_names, preview as render, Preview};
use herald_actors::domain::{
    dst_note, NewReminder, Reminder, ReminderState, ReminderSummary, Role, RunId, RunStatus,
};
use herald_actors::messages::ReminderChanged;
use herald_actors::ports::{ReminderFilter, ReminderPage, Store};
use herald_actors::scheduling::preflight::{preflight, Preflight};
use herald_actors::scheduling::scheduler::{next_due, FireNow, NextDue, SchedulerActor};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration as StdDuration;

pub static CREATE: Operation = Operation::new("createReminder", Role::Operator);
pub static REPLACE: Operation = Operation::new("replaceReminder", Role::Operator);
pub static PAUSE: Operation = Operation::new("pauseReminder", Role::Operator);
pub static RESUME: Operation = Operation::new("resumeReminder", Role::Operator);
pub static ARCHIVE: Operation = Operation::new("archiveReminder", Role::Operator);
pub static FIRE: Operation = Operation::new("fireReminder", Role::Operator);
pub static LIST: Operation = Operation::read("listReminders", Role::Viewer);
pub static GET: Operation = Operation::read("getReminder", Role::Viewer);
pub static FORECAST: Operation = Operation::read("forecastReminder", Role::Viewer);
pub static PREVIEW: Operation = Operation::read("previewReminder", Role::Viewer);

/// How many upcoming fire times a reminder's page shows.
pub const NEXT_FIRES: usize = 5;
/// How far ahead to look for them (a Feb-29 cron needs years).
const LOOKAHEAD_DAYS: i64 = 366 * 8;
const SCHEDULER_TIMEOUT: StdDuration = StdDuration::from_secs(2);

/// A page of reminders, in id order.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "ReminderPage")]
pub struct RemindersPage {
    pub items: Vec<ReminderSummary>,
    /// Pass as `after` for the next page; null on the last.
    pub next_after: Option<i64>,
}

/// A reminder with where its schedule goes next.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "ReminderDetail")]
pub struct ReminderView {
    #[serde(flatten)]
    pub reminder: Reminder,
    /// The schedule's next occurrences (none once archived).
    pub next_fires: Vec<FireTime>,
    /// What the scheduler holds for it: the occurrence and when it will be
    /// sent (the window's opening if it falls outside the window). `null`
    /// when paused, archived, finished, or not loaded yet.
    pub next_due: Option<DueView>,
}

#[derive(Serialize, JsonSchema)]
pub struct FireTime {
    pub at: DateTime<Utc>,
    /// The same instant in the reminder's timezone, with its offset.
    pub local: String,
    /// What a daylight-saving change does to it, if anything.
    pub dst_note: Option<String>,
}

#[derive(Serialize, JsonSchema)]
#[schemars(rename = "NextDue")]
pub struct DueView {
    pub occurrence: DateTime<Utc>,
    pub sends_at: DateTime<Utc>,
}

/// Where a forecast starts sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// Now, or the window's opening.
    Now,
    /// The schedule's next due time.
    Next,
}

impl From {
    fn as_str(self) -> &'static str {
        match self {
            From::Now => "now",
            From::Next => "next",
        }
    }
}

/// The dry-run: would this reminder's groups fit its window at the
/// account's rate? Nothing is written.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "Forecast")]
pub struct ForecastView {
    /// `now` or `next`, as asked.
    #[schemars(extend("enum" = ["now", "next"]))]
    pub from: &'static str,
    /// When sending would start: now (or the window's opening), or the
    /// next due time.
    pub start: DateTime<Utc>,
    pub window_close: DateTime<Utc>,
    pub groups: u32,
    pub parts_per_group: u32,
    pub messages: u64,
    pub per_minute: u32,
    pub groups_fit: u32,
    pub fits: bool,
    pub expected_finish: DateTime<Utc>,
    pub text: String,
    /// The groups the account is not in or may not post to: a run fails
    /// them up front, so they are not counted in `groups`.
    pub preflight: Preflight,
}

/// What a run would send to a reminder's first groups.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "Preview")]
pub struct PreviewView {
    /// The time the variables were filled from: the next occurrence, or now.
    pub scheduled_for: DateTime<Utc>,
    /// What WhatsApp's word on the account means for that run, when it
    /// holds it back: a time-lock (or the pause it put the account in)
    /// until when, and whether it ends after the window closes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back: Option<String>,
    #[serde(flatten)]
    pub preview: Preview,
}

/// A fired reminder's run.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct FireResult {
    pub run_id: RunId,
    pub status: RunStatus,
    pub scheduled_for: DateTime<Utc>,
    /// What WhatsApp's word on the account means for this run, when it
    /// holds it back (a time-lock until when; "nothing will be sent" when
    /// it ends after the window closes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back: Option<String>,
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
/// scheduler, which hears of every change and fires, the engine whose
/// pacing a forecast estimates, and the edit lock.
pub struct Reminders<'a> {
    store: &'a dyn Store,
    scheduler: &'a Addr<SchedulerActor>,
    engine: &'a Engine,
    edits: &'a tokio::sync::Mutex<()>,
}

impl<'a> Reminders<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
            scheduler: &state.scheduler,
            engine: &state.engine,
            edits: &state.edits,
        }
    }

    /// A page of at most `limit` summaries in id order, after the id
    /// `after`: parts and targets counted, not loaded.
    pub async fn list(
        &self,
        allowed: Allowed,
        filter: ReminderFilter,
        after: Option<i64>,
        limit: u32,
    ) -> Result<RemindersPage, ApiError> {
        allowed.of(&LIST)?;
        // One more than asked says whether another page follows.
        let mut items = self
            .store
            .list_reminder_summaries(&ReminderPage {
                filter,
                after_id: after,
                limit: limit + 1,
            })
            .await?;
        let more = items.len() > limit as usize;
        items.truncate(limit as usize);
        let next_after = more.then(|| items.last().map(|r| r.id)).flatten();
        Ok(RemindersPage { items, next_after })
    }

    /// Every reminder `filter` selects, whole, for a page that shows them
    /// all.
    pub async fn all(
        &self,
        allowed: Allowed,
        filter: &ReminderFilter,
    ) -> Result<Vec<Reminder>, ApiError> {
        allowed.of(&LIST)?;
        Ok(self.store.list_reminders(filter).await?)
    }

    /// Reminder `id` with its next occurrences and what the scheduler holds
    /// for it.
    pub async fn get(&self, allowed: Allowed, id: i64) -> Result<ReminderView, ApiError> {
        allowed.of(&GET)?;
        let reminder = self.load(id).await?;
        // Whole seconds: cron matching carries the cursor's fraction of a
        // second into every occurrence (09:00:00.74), which no operator means.
        let now = Utc::now().trunc_subsecs(0);
        let tz = reminder.spec.timezone;
        let next_fires = if reminder.state == ReminderState::Archived {
            Vec::new()
        } else {
            reminder
                .spec
                .schedule
                .occurrences(&tz, now, now + Duration::days(LOOKAHEAD_DAYS), NEXT_FIRES)
                .into_iter()
                .map(|at| FireTime {
                    at,
                    local: at.with_timezone(&tz.tz()).to_rfc3339(),
                    dst_note: dst_note(&tz, at),
                })
                .collect()
        };
        // Best effort: the page is still useful without the scheduler's view.
        let next_due = self
            .scheduler
            .send(NextDue {
                reminder_id: reminder.id,
            })
            .timeout(SCHEDULER_TIMEOUT)
            .await
            .ok()
            .flatten()
            .map(|d| DueView {
                occurrence: d.occurrence,
                sends_at: d.effective,
            });
        Ok(ReminderView {
            reminder,
            next_fires,
            next_due,
        })
    }

    /// The forecast of saved reminder `id` from now or its next due time;
    /// 409 when it has none.
    pub async fn forecast(
        &self,
        allowed: Allowed,
        id: i64,
        from: From,
    ) -> Result<ForecastView, ApiError> {
        allowed.of(&FORECAST)?;
        let reminder = self.load(id).await?;
        self.forecast_of(allowed, &reminder.spec, from, Utc::now())
            .await?
            .ok_or_else(|| {
                ApiError::conflict(format!(
                    "reminder {} has no occurrence after now",
                    reminder.id
                ))
            })
    }

    /// The forecast of `spec`, saved or not, sending from `now` (or the
    /// window's opening) or from its next due time (`None` when it has
    /// none).
    pub async fn forecast_of(
        &self,
        allowed: Allowed,
        spec: &NewReminder,
        from: From,
        now: DateTime<Utc>,
    ) -> Result<Option<ForecastView>, ApiError> {
        allowed.of(&FORECAST)?;
        let account = self
            .store
            .get_account(&spec.account_id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("account {}", spec.account_id)))?;
        let per_minute = self.engine.per_minute(&account.limits);
        let (tz, window) = (spec.timezone, spec.window);
        let start = match from {
            From::Next => match next_due(&spec.schedule, &tz, &window, now) {
                Some(d) => d.effective,
                None => return Ok(None),
            },
            From::Now => {
                let span = window.span_at_or_after(&tz, now);
                if span.contains(now) {
                    now
                } else {
                    span.open
                }
            }
        };
        let close = window.span_at_or_after(&tz, start).close;
        let pre = preflight(self.store, spec).await?;
        let groups = (pre.groups - pre.refused.len()) as u32;
        let parts = spec.parts.len() as u32;
        // The engine's own estimate: pacing, typing, groups in flight, caps.
        let (caps, ledger) = account_caps(self.engine, &account, spec, start).await?;
        let f = forecast_for(
            self.engine,
            &account,
            spec,
            caps.as_ref(),
            &ledger,
            groups,
            start,
            close,
        );
        Ok(Some(ForecastView {
            from: from.as_str(),
            start,
            window_close: close,
            groups,
            parts_per_group: parts,
            messages: u64::from(groups) * u64::from(parts),
            per_minute,
            groups_fit: f.groups_fit,
            fits: f.fits,
            expected_finish: f.expected_finish,
            text: f.text,
            preflight: pre,
        }))
    }

    /// What a run of reminder `id` would send to its first `samples`
    /// groups, rendered by the code the run uses, with the next
    /// occurrence's date and time.
    pub async fn preview(
        &self,
        allowed: Allowed,
        id: i64,
        samples: usize,
    ) -> Result<PreviewView, ApiError> {
        allowed.of(&PREVIEW)?;
        let reminder = self.load(id).await?;
        let spec = &reminder.spec;
        let now = Utc::now().trunc_subsecs(0);
        let at = spec
            .schedule
            .occurrences(&spec.timezone, now, now + Duration::days(366), 1)
            .into_iter()
            .next()
            .unwrap_or(now);
        // Run 0 stands for "a run": each real run words it differently.
        let names = directory_names(self.store, &spec.account_id).await?;
        let preview = render(spec, RunId(0), at, samples, names);
        let close = spec.window.span_at_or_after(&spec.timezone, at).close;
        Ok(PreviewView {
            scheduled_for: at,
            held_back: self
                .held_back(&spec.account_id, at, close, &spec.timezone)
                .await?,
            preview,
        })
    }

    /// What the account's standing means for a run sending from `start`
    /// until `close`, if it holds it back.
    async fn held_back(
        &self,
        account: &herald_actors::domain::AccountId,
        start: DateTime<Utc>,
        close: DateTime<Utc>,
        tz: &herald_actors::domain::TimeZone,
    ) -> Result<Option<String>, ApiError> {
        Ok(self
            .store
            .get_account(account)
            .await?
            .and_then(|a| standing_note(&a, start, close, tz)))
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
        let spec = self.load(id).await?.spec;
        let start = run.scheduled_for.max(Utc::now());
        // An all-day window has no end of its own: the day's span closes it.
        let close = run
            .window_end_at
            .unwrap_or_else(|| spec.window.span_at_or_after(&spec.timezone, start).close);
        let tz = spec.timezone;
        Ok(FireResult {
            run_id,
            status: run.status,
            scheduled_for: run.scheduled_for,
            held_back: self.held_back(&run.account_id, start, close, &tz).await?,
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
