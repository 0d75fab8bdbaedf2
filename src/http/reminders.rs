//! `/v1/reminders`: what to send, to which groups, when. Every change is
//! followed by `ReminderChanged` so the scheduler recomputes at once
//! instead of at its next reconcile.

use super::errors::ApiError;
use super::etag;
use super::extract::{numeric_id, Field, Json, Params, Shape, Ty};
use crate::state::AppState;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Duration, SubsecRound, Utc};
use herald_actors::domain::{AccountId, Reminder, ReminderRequest, ReminderState};
use herald_actors::forecast::forecast as estimate;
use herald_actors::messages::ReminderChanged;
use herald_actors::ports::ReminderFilter;
use herald_actors::scheduler::{next_due, FireNow, NextDue};
use serde::Serialize;
use std::time::Duration as StdDuration;

/// How many upcoming fire times a reminder's page shows.
pub const NEXT_FIRES: usize = 5;
/// How far ahead to look for them (a Feb-29 cron needs years).
const LOOKAHEAD_DAYS: i64 = 366 * 8;
const SCHEDULER_TIMEOUT: StdDuration = StdDuration::from_secs(2);

impl Shape for ReminderRequest {
    const FIELDS: &'static [Field] = &[
        Field::req("account_id", Ty::Str),
        Field::req("title", Ty::Str),
        Field::req("timezone", Ty::Str),
        Field::req("schedule", Ty::Object),
        Field::nullable("window", Ty::Object),
        Field::opt("resume_next_window", Ty::Bool),
        Field::req("parts", Ty::Array(&Ty::Object)),
        Field::req("targets", Ty::Array(&Ty::Str)),
    ];
}

pub async fn create(
    state: web::Data<AppState>,
    body: Json<ReminderRequest>,
) -> Result<HttpResponse, ApiError> {
    let new = body.0.parse()?;
    let reminder = state.store.create_reminder(&new, Utc::now()).await?;
    changed(&state, reminder.id);
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/v1/reminders/{}", reminder.id)))
        .json(reminder))
}

pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let mut p = Params::from_request(&req)?;
    let filter = ReminderFilter {
        account_id: p.take("account_id", AccountId::parse)?,
        state: p.take("state", str::parse::<ReminderState>)?,
    };
    p.finish(&["account_id", "state"])?;
    let items = state.store.list_reminders(&filter).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "items": items })))
}

/// A reminder with where its schedule goes next.
#[derive(Serialize)]
struct ReminderView {
    #[serde(flatten)]
    reminder: Reminder,
    /// The schedule's next occurrences (none once archived).
    next_fires: Vec<FireTime>,
    /// What the scheduler holds for it: the occurrence and when it will be
    /// sent (the window's opening if it falls outside the window). `null`
    /// when paused, archived, finished, or not loaded yet.
    next_due: Option<DueView>,
}

#[derive(Serialize)]
struct FireTime {
    at: DateTime<Utc>,
    /// The same instant in the reminder's timezone, with its offset.
    local: String,
}

#[derive(Serialize)]
struct DueView {
    occurrence: DateTime<Utc>,
    sends_at: DateTime<Utc>,
}

pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let reminder = load(&state, &path).await?;
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
            })
            .collect()
    };
    // Best effort: the page is still useful without the scheduler's view.
    let next_due = state
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
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag::of(&reminder)))
        .json(ReminderView {
            reminder,
            next_fires,
            next_due,
        }))
}

pub async fn update(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    body: Json<ReminderRequest>,
) -> Result<HttpResponse, ApiError> {
    let id = numeric_id(&path, "reminder")?;
    let new = body.0.parse()?;
    let reminder = {
        let _edit = state.edits.lock().await;
        let current = load(&state, &path).await?;
        etag::check(&req, &format!("reminder {id}"), &etag::of(&current))?;
        state.store.update_reminder(id, &new, Utc::now()).await?
    };
    changed(&state, id);
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag::of(&reminder)))
        .json(reminder))
}

pub async fn pause(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    transition(&state, &path, ReminderState::Paused).await
}

pub async fn resume(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    transition(&state, &path, ReminderState::Active).await
}

/// Archives: the reminder stops firing and its history stays. Runs already
/// queued or in flight go on; stop them through `/v1/runs/{id}/stop`.
pub async fn delete(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    transition(&state, &path, ReminderState::Archived).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Pause and resume are idempotent; an archived reminder stays archived.
async fn transition(
    state: &AppState,
    raw: &str,
    to: ReminderState,
) -> Result<HttpResponse, ApiError> {
    let current = load(state, raw).await?;
    if current.state == ReminderState::Archived && to != ReminderState::Archived {
        return Err(ApiError::conflict(format!(
            "reminder {} is archived; create a new one instead",
            current.id
        )));
    }
    let reminder = if current.state == to {
        current
    } else {
        let r = state
            .store
            .set_reminder_state(current.id, to, Utc::now())
            .await?;
        changed(state, r.id);
        r
    };
    Ok(HttpResponse::Ok().json(reminder))
}

/// Fires now, to the second: inside the window the run is queued at once;
/// outside it waits (status `scheduled`) for the window to open.
pub async fn fire(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = numeric_id(&path, "reminder")?;
    let run_id = state.scheduler.send(FireNow { reminder_id: id }).await??;
    let run = state
        .store
        .get_run(run_id)
        .await?
        .ok_or_else(|| ApiError::internal("the fired run vanished", run_id))?;
    Ok(HttpResponse::Accepted()
        .insert_header(("Location", format!("/v1/runs/{run_id}")))
        .json(serde_json::json!({
            "run_id": run_id,
            "status": run.status,
            "scheduled_for": run.scheduled_for,
        })))
}

/// The dry-run: would this reminder's groups fit its window at the
/// account's rate? Nothing is written.
#[derive(Serialize)]
struct ForecastView {
    /// `now` or `next`, as asked.
    from: &'static str,
    /// When sending would start: now (or the window's opening), or the
    /// next due time.
    start: DateTime<Utc>,
    window_close: DateTime<Utc>,
    groups: u32,
    parts_per_group: u32,
    messages: u64,
    per_minute: u32,
    groups_fit: u32,
    fits: bool,
    expected_finish: DateTime<Utc>,
    text: String,
}

pub async fn forecast(
    state: web::Data<AppState>,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut p = Params::from_request(&req)?;
    let from = p.take("from", |s| match s {
        "now" => Ok("now"),
        "next" => Ok("next"),
        _ => Err("must be 'now' or 'next'"),
    })?;
    p.finish(&["from"])?;
    let from = from.unwrap_or("now");
    let reminder = load(&state, &path).await?;
    let spec = &reminder.spec;
    let account = state
        .store
        .get_account(&spec.account_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("account {}", spec.account_id)))?;
    let per_minute = account
        .limits
        .max_per_minute
        .unwrap_or(state.settings.delivery.max_per_minute);
    let (tz, window) = (spec.timezone, spec.window);
    let now = Utc::now();
    let start = if from == "next" {
        next_due(&spec.schedule, &tz, &window, now)
            .ok_or_else(|| {
                ApiError::conflict(format!(
                    "reminder {} has no occurrence after now",
                    reminder.id
                ))
            })?
            .effective
    } else {
        let span = window.span_at_or_after(&tz, now);
        if span.contains(now) {
            now
        } else {
            span.open
        }
    };
    let close = window.span_at_or_after(&tz, start).close;
    let groups = spec.targets.len() as u32;
    let parts = spec.parts.len() as u32;
    let f = estimate(groups, parts, per_minute, start, close, &tz);
    Ok(HttpResponse::Ok().json(ForecastView {
        from,
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
    }))
}

async fn load(state: &AppState, raw: &str) -> Result<Reminder, ApiError> {
    let id = numeric_id(raw, "reminder")?;
    state
        .store
        .get_reminder(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("reminder {id}")))
}

fn changed(state: &AppState, reminder_id: i64) {
    state.scheduler.do_send(ReminderChanged { reminder_id });
}
