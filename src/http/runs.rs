//! `/v1/runs`: firings of reminders, their targets, and operator control
//! (stop, pause, resume, retry) through the run's account actor.

use super::errors::ApiError;
use super::extract::{run_id, ACCOUNT_ID, REMINDER_ID, RUN_ID};
use super::spec::{Op, Param, Params, Rule, Str, Success};
use crate::service::polls::{self, Polls, RunPollAnswer};
use crate::service::runs::{self, Action, ControlResult, RunPage, RunView, Runs, TargetPage};
use crate::service::timeline::{self, RunTimeline, Timelines};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::{AccountId, RunStatus, TargetStatus};
use herald_actors::ports::RunFilter;

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_RUNS: u32 = 500;
pub const MAX_TARGETS: u32 = 1000;

fn run_statuses() -> &'static [&'static str] {
    RunStatus::NAMES
}
fn target_statuses() -> &'static [&'static str] {
    TargetStatus::NAMES
}

pub static LIST: Op = Op::new(
    "listRuns",
    "List runs",
    Success::json::<RunPage>(200, "A page of runs"),
)
.describe(
    "Newest first. For the next page pass `before_id` = `next_before_id`; it is null on the \
         last page.",
)
.query(&[
    Param::new("reminder_id", REMINDER_ID.rule, "Only this reminder's"),
    Param::new("account_id", ACCOUNT_ID.rule, "Only this account's"),
    Param::new(
        "status",
        Rule::Str(Str::one_of(run_statuses)),
        "Only in this status",
    ),
    Param::new("before_id", RUN_ID.rule, "Only runs with a smaller id"),
    Param::new(
        "limit",
        Rule::Int {
            min: 1,
            max: MAX_RUNS as i64,
        },
        "Page size",
    )
    .default(DEFAULT_LIMIT as i64),
])
.performs(&runs::LIST);

pub static GET: Op = Op::new(
    "getRun",
    "One run",
    Success::json::<RunView>(200, "The run"),
)
.describe("Counts by status, the forecast made at its start, the summary.")
.path(&[RUN_ID])
.performs(&runs::GET);

/// Paging a run's groups by position.
const AFTER: Param = Param::new(
    "after",
    Rule::Int {
        min: 0,
        max: u32::MAX as i64,
    },
    "Only positions after this one",
);
const TARGETS_LIMIT: Param = Param::new(
    "limit",
    Rule::Int {
        min: 1,
        max: MAX_TARGETS as i64,
    },
    "Page size",
)
.default(DEFAULT_LIMIT as i64);

pub static TARGETS: Op = Op::new(
    "listRunTargets",
    "A run's groups",
    Success::json::<TargetPage>(200, "A page of targets"),
)
.describe(
    "In order of position. For the next page pass `after` = `next_after`; it is null on the last \
     page.",
)
.path(&[RUN_ID])
.query(&[
    Param::new(
        "status",
        Rule::Str(Str::one_of(target_statuses)),
        "Only in this status",
    ),
    AFTER,
    TARGETS_LIMIT,
])
.performs(&runs::TARGETS);

pub static TIMELINE: Op = Op::new(
    "getRunTimeline",
    "A run over time",
    Success::json::<RunTimeline>(200, "The run's sends per minute and its reach"),
)
.describe(
    "What the console's charts draw: messages sent in each minute from the first send to the \
     last (a group's parts count in the minute its last part went out) against the account's \
     per-minute limit, and groups sent and reached (first receipt) cumulatively since the first \
     send.",
)
.path(&[RUN_ID])
.performs(&timeline::TIMELINE);

pub static POLL: Op = Op::new(
    "getRunPoll",
    "A run's polls, answered",
    Success::json::<RunPollAnswer>(
        200,
        "Totals per option over all groups, and a page of groups",
    ),
)
.describe(
    "Each poll the run sent, with per option the voters whose current choice includes it, summed \
     over every group, the voters and the groups with at least one vote; and a page of one poll's \
     groups (the first poll unless `part` is given) with the same per group, in order of \
     position. A voter's latest vote counts (a withdrawn one is none); a vote repeated counts \
     once. For the next page pass `after` = `next_after`. 404 for a `part` that is not one of \
     the run's polls.",
)
.path(&[RUN_ID])
.query(&[
    Param::new(
        "part",
        Rule::Int {
            min: 0,
            max: herald_actors::domain::MAX_PARTS as i64,
        },
        "The poll part whose groups to list",
    ),
    AFTER,
    TARGETS_LIMIT,
])
.performs(&polls::POLL);

const ACCEPTED: Success = Success::json::<ControlResult>(202, "Accepted");

pub static STOP: Op = Op::new("stopRun", "Stop a run", ACCEPTED)
    .describe(
        "Remaining groups are skipped (\"stopped by operator\"); parts in flight finish. A queued, \
         scheduled or paused run is cancelled at once. 409 if it already ended.",
    )
    .path(&[RUN_ID])
    .errors(&[409, 503])
.performs(&runs::STOP);

pub static PAUSE: Op = Op::new("pauseRun", "Pause a run", ACCEPTED)
    .describe(
        "Parts in flight finish, nothing new is sent until resumed. 409 unless queued or running.",
    )
    .path(&[RUN_ID])
    .errors(&[409, 503])
    .performs(&runs::PAUSE);

pub static RESUME: Op = Op::new("resumeRun", "Resume a paused run", ACCEPTED)
    .describe("409 unless paused.")
    .path(&[RUN_ID])
    .errors(&[409, 503])
    .performs(&runs::RESUME);

pub static RETRY: Op = Op::new("retryRun", "Retry a run's unsent groups", ACCEPTED)
    .describe(
        "Failed and skipped groups of a partial, failed or cancelled run go again: same run, same \
         message ids, so nothing is delivered twice. `requeued` says how many.",
    )
    .path(&[RUN_ID])
    .errors(&[409, 503])
    .performs(&runs::RETRY);

/// Newest first; page with `before_id` = the previous page's `next_before_id`.
pub async fn list(
    service: web::Data<Service>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &LIST)?;
    let filter = RunFilter {
        reminder_id: p.int("reminder_id"),
        account_id: p.parsed("account_id", AccountId::parse)?,
        status: p.parsed("status", str::parse::<RunStatus>)?,
        before_id: p.int("before_id"),
        limit: p.int("limit").map_or(DEFAULT_LIMIT, |n| n as u32),
    };
    Ok(HttpResponse::Ok().json(Runs::of(&service).list(allowed, &filter).await?))
}

pub async fn get(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = run_id(&path)?;
    Ok(HttpResponse::Ok().json(Runs::of(&service).get(allowed, id).await?))
}

/// In order of position; page with `after` = the previous page's `next_after`.
pub async fn targets(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &TARGETS)?;
    let status = p.parsed("status", str::parse::<TargetStatus>)?;
    let after = p.int("after").map(|n| n as u32);
    let limit = p.int("limit").map_or(DEFAULT_LIMIT, |n| n as u32);
    let id = run_id(&path)?;
    let page = Runs::of(&service)
        .targets(allowed, id, status, after, limit)
        .await?;
    Ok(HttpResponse::Ok().json(page))
}

/// Totals per option and a page of one poll's groups.
pub async fn poll(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &POLL)?;
    let part = p.int("part").map(|n| n as u32);
    let after = p.int("after").map(|n| n as u32);
    let limit = p.int("limit").map_or(DEFAULT_LIMIT, |n| n as u32);
    let id = run_id(&path)?;
    let answer = Polls::of(&service)
        .get(allowed, id, part, after, limit)
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}

pub async fn timeline(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = run_id(&path)?;
    Ok(HttpResponse::Ok().json(Timelines::of(&service).get(allowed, id).await?))
}

/// A run action: the operation's proof from the route's authority, the
/// request's hop (another daemon forwarded it), the owner's answer relayed
/// when the account's actor is on another daemon.
macro_rules! run_actions {
    ($($name:ident => $action:expr),+ $(,)?) => {$(
        pub async fn $name(
            service: web::Data<Service>,
            path: web::Path<String>,
            req: HttpRequest,
            allowed: Allowed,
        ) -> Result<HttpResponse, ApiError> {
            let id = run_id(&path)?;
            let hop = super::forward::is_hop(&req);
            let done = Runs::of(&service).control(allowed, id, $action, hop).await?;
            super::forward::answer(&req, &service, done, StatusCode::ACCEPTED).await
        }
    )+};
}

run_actions!(
    stop => Action::Stop,
    pause => Action::Pause,
    resume => Action::Resume,
    retry => Action::Retry,
);
