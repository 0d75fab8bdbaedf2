//! `POST /v1/reminders/{id}/preview`: what a run of the reminder would send
//! to its first groups, rendered by the same code the run uses, and how
//! many different texts each part gives over all its groups.

use super::errors::ApiError;
use super::extract::{numeric_id, REMINDER_ID};
use super::spec::{Op, Param, Params, Rule, Success};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, SubsecRound, Utc};
use herald_actors::delivery::variation::{directory_names, preview as render, Preview};
use herald_actors::domain::Role;
use herald_actors::domain::RunId;
use serde::Serialize;

pub const MAX_SAMPLES: i64 = 50;
pub const DEFAULT_SAMPLES: i64 = 5;

pub static PREVIEW: Op = Op::new(
    "previewReminder",
    "Preview the texts",
    Success::json::<PreviewView>(200, "The rendered samples"),
)
.describe(
    "What a run would send to the reminder's first groups (its templates rendered with the next \
     occurrence's date and time), and how many different texts each part gives over all its \
     groups. Each run words it differently; the variety is the same. Nothing is written; no body.",
)
.path(&[REMINDER_ID])
.query(&[Param::new(
    "samples",
    Rule::Int {
        min: 1,
        max: MAX_SAMPLES,
    },
    "Groups to render",
)
.default(DEFAULT_SAMPLES)])
.needs(Role::Viewer);

#[derive(Serialize, schemars::JsonSchema)]
#[schemars(rename = "Preview")]
struct PreviewView {
    /// The time the variables were filled from: the next occurrence, or now.
    scheduled_for: DateTime<Utc>,
    #[serde(flatten)]
    preview: Preview,
}

pub async fn preview(
    state: web::Data<AppState>,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &PREVIEW)?;
    let samples = p.int("samples").unwrap_or(DEFAULT_SAMPLES) as usize;
    let id = numeric_id(&path, "reminder")?;
    let reminder = state
        .store
        .get_reminder(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("reminder {id}")))?;
    let spec = &reminder.spec;
    let now = Utc::now().trunc_subsecs(0);
    let at = spec
        .schedule
        .occurrences(&spec.timezone, now, now + chrono::Duration::days(366), 1)
        .into_iter()
        .next()
        .unwrap_or(now);
    // Run 0 stands for "a run": each real run words it differently.
    let names = directory_names(&*state.store, &spec.account_id).await?;
    let preview = render(spec, RunId(0), at, samples, names);
    Ok(HttpResponse::Ok().json(PreviewView {
        scheduled_for: at,
        preview,
    }))
}
