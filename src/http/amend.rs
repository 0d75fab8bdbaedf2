//! `/v1/runs/{id}/recall` and `/v1/runs/{id}/edit`: taking back a sent
//! run, or correcting its text, in every group it reached, through the
//! run's account actor (on whichever daemon carries the account).

use super::errors::ApiError;
use super::extract::{run_id, Json, JsonBody, RUN_ID};
use super::spec::{self, Body, Field, Op, Pattern, Rule, Shape, Str, Success};
use crate::service::runs::{self, AmendmentResult, Runs};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::delivery::amend::AmendAsk;
use herald_actors::domain::{AmendKind, MAX_CAPTION_CHARS, MAX_TEXT_CHARS};
use serde::{Deserialize, Serialize};

const ACCEPTED: Success = Success::json::<AmendmentResult>(202, "Accepted: under way");

pub static RECALL: Op = Op::new(
    "recallRun",
    "Delete a run's messages for everyone",
    ACCEPTED,
)
.describe(
    "Every message the run sent, in every group it reached, is deleted for everyone: paced \
         by the account's limit like a run, resumed after a restart or a takeover, each group \
         once. A run still sending is stopped first. WhatsApp allows it for `recall.window_secs` \
         (two days) after a message was sent: past that for the whole run, 409 naming the \
         deadline; groups that pass it midway are reported too old. 409 too while another \
         recall or edit of the run is under way. Progress in `GET /v1/runs/{id}` (`amendment`) \
         and the `run_recall_*` events.",
)
.path(&[RUN_ID])
.errors(&[409, 503])
.performs(&runs::RECALL);

pub static EDIT: Op = Op::new("editRun", "Correct the text of a run's messages", ACCEPTED)
    .describe(
        "Every text part the run sent gets `text`, every picture it sent gets `caption` as its \
         new caption, in every group it reached, paced and resumable like a recall. WhatsApp \
         allows it for `recall.edit_window_secs` (15 minutes) after a message was sent: later, \
         409 naming the deadline. 409 naming the field too when the run sent no part it could \
         apply to (or neither is given), and when the reminder was changed after the run \
         fired.",
    )
    .path(&[RUN_ID])
    .body(Body::Json(&EDIT_BODY))
    .errors(&[409, 503])
    .performs(&runs::EDIT);

pub static EDIT_BODY: Shape = Shape {
    name: "RunEdit",
    description: "The new text of a run's text parts and the new caption of its pictures; at \
                  least one",
    fields: &[
        Field::opt(
            "text",
            Rule::Str(Str {
                min: 1,
                max: MAX_TEXT_CHARS,
                pattern: Some(Pattern {
                    regex: spec::NOT_BLANK,
                    rule: "must not be blank",
                }),
                ..Str::ANY
            }),
            "New text of every text part",
        ),
        Field::opt(
            "caption",
            Rule::Str(Str {
                min: 1,
                max: MAX_CAPTION_CHARS,
                pattern: Some(Pattern {
                    regex: spec::NOT_BLANK,
                    rule: "must not be blank",
                }),
                ..Str::ANY
            }),
            "New caption of every picture",
        ),
    ],
    example: Some(r#"{"text": "Stand-up moved to 10:30 today."}"#),
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EditBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    caption: Option<String>,
}

impl JsonBody for EditBody {
    const SHAPE: &'static Shape = &EDIT_BODY;
}

pub async fn recall(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    amend(&service, &path, AmendAsk::recall(), &req, allowed).await
}

pub async fn edit(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    body: Json<EditBody>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let ask = AmendAsk {
        kind: AmendKind::Edit,
        text: body.0.text,
        caption: body.0.caption,
    };
    amend(&service, &path, ask, &req, allowed).await
}

/// The run's amendment, here or relayed to the daemon that carries the
/// account.
async fn amend(
    service: &Service,
    raw: &str,
    ask: AmendAsk,
    req: &HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = run_id(raw)?;
    let hop = super::forward::is_hop(req);
    let done = Runs::of(service).amend(allowed, id, ask, hop).await?;
    super::forward::answer(req, service, done, StatusCode::ACCEPTED).await
}
