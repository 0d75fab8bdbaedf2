//! `/v1/runs`: firings of reminders, their targets, and operator control
//! (stop, pause, resume, retry) through the run's account actor.

use super::errors::{ApiError, Kind};
use super::extract::{run_id, Params};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::account::{PauseRun, ResumeRun, RetryRun, StopRun};
use herald_actors::domain::{AccountId, Run, RunId, RunStatus, TargetStatus};
use herald_actors::outcome::delivered_line;
use herald_actors::ports::RunFilter;
use serde::Serialize;

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_RUNS: u32 = 500;
pub const MAX_TARGETS: u32 = 1000;

/// Newest first; page with `before_id` = the previous page's `next_before_id`.
pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let mut p = Params::from_request(&req)?;
    let reminder_id = p.take_num("reminder_id", 1i64, i64::MAX)?;
    let account_id = p.take("account_id", AccountId::parse)?;
    let status = p.take("status", str::parse::<RunStatus>)?;
    let before_id = p.take_num("before_id", 1i64, i64::MAX)?;
    let limit = p
        .take_num("limit", 1u32, MAX_RUNS)?
        .unwrap_or(DEFAULT_LIMIT);
    p.finish(&["reminder_id", "account_id", "status", "before_id", "limit"])?;
    let items = state
        .store
        .list_runs(&RunFilter {
            reminder_id,
            account_id,
            status,
            before_id,
            limit,
        })
        .await?;
    // A full page may have more behind it.
    let next_before_id = (items.len() as u32 == limit)
        .then(|| items.last().map(|r| r.id))
        .flatten();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "items": items,
        "next_before_id": next_before_id,
    })))
}

#[derive(Serialize)]
struct RunView {
    #[serde(flatten)]
    run: Run,
    /// "X of Y delivered", as the events and the summary say it.
    delivered: String,
}

pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let run = load(&state, &path).await?;
    Ok(HttpResponse::Ok().json(RunView {
        delivered: delivered_line(&run.counts),
        run,
    }))
}

/// In order of position; page with `after` = the previous page's `next_after`.
pub async fn targets(
    state: web::Data<AppState>,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut p = Params::from_request(&req)?;
    let status = p.take("status", str::parse::<TargetStatus>)?;
    let after = p.take_num("after", 0u32, u32::MAX)?;
    let limit = p
        .take_num("limit", 1u32, MAX_TARGETS)?
        .unwrap_or(DEFAULT_LIMIT);
    p.finish(&["status", "after", "limit"])?;
    let run = load(&state, &path).await?;
    let items = state
        .store
        .list_targets(run.id, status, after, limit)
        .await?;
    let next_after = (items.len() as u32 == limit)
        .then(|| items.last().map(|t| t.position))
        .flatten();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "items": items,
        "next_after": next_after,
    })))
}

pub async fn stop(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    control(&state, &path, Action::Stop).await
}

pub async fn pause(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    control(&state, &path, Action::Pause).await
}

pub async fn resume(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    control(&state, &path, Action::Resume).await
}

pub async fn retry(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    control(&state, &path, Action::Retry).await
}

/// What an operator asks of a run.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
enum Action {
    Stop,
    Pause,
    Resume,
    Retry,
}

/// Sends the control message to the run's account actor. A run in flight
/// changes status asynchronously (parts in flight finish first), so the
/// answer is 202 with the status as it stands; the event stream reports
/// the end.
async fn control(state: &AppState, raw: &str, action: Action) -> Result<HttpResponse, ApiError> {
    let run = load(state, raw).await?;
    let actor = state.account_actor(&run.account_id).ok_or_else(|| {
        ApiError::new(
            Kind::Unavailable,
            format!("account {} has no running actor", run.account_id),
        )
    })?;
    let id = run.id;
    let requeued = match action {
        Action::Stop => actor.send(StopRun { run_id: id }).await?.map(|()| None),
        Action::Pause => actor.send(PauseRun { run_id: id }).await?.map(|()| None),
        Action::Resume => actor.send(ResumeRun { run_id: id }).await?.map(|()| None),
        Action::Retry => actor.send(RetryRun { run_id: id }).await?.map(Some),
    }?;
    let now = state
        .store
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {id}")))?;
    let mut body = serde_json::json!({
        "run_id": id,
        "action": action,
        "status": now.status,
    });
    if let Some(n) = requeued {
        body["requeued"] = n.into();
    }
    Ok(HttpResponse::Accepted().json(body))
}

async fn load(state: &AppState, raw: &str) -> Result<Run, ApiError> {
    let id: RunId = run_id(raw)?;
    state
        .store
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {id}")))
}
