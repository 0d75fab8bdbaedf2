//! `POST /v1/reminders/{id}/preview`: what a run of the reminder would send
//! to its first groups, rendered by the same code the run uses, and how
//! many different texts each part gives over all its groups.

use super::errors::ApiError;
use super::extract::{numeric_id, REMINDER_ID};
use super::spec::{Op, Param, Params, Rule, Success};
use crate::service::reminders::{self, PreviewView, Reminders};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::{web, HttpRequest, HttpResponse};

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
.performs(&reminders::PREVIEW);

pub async fn preview(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &PREVIEW)?;
    let samples = p.int("samples").unwrap_or(DEFAULT_SAMPLES) as usize;
    let id = numeric_id(&path, "reminder")?;
    let preview = Reminders::of(&service)
        .preview(allowed, id, samples)
        .await?;
    Ok(HttpResponse::Ok().json(preview))
}
