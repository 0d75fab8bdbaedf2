//! `/v1/webhooks`: subscriptions that push events to the operator's URLs
//! (Standard Webhooks), their deliveries, retries, pings and secret
//! rotation. The secret is made by Herald and shown once, at creation and
//! at each rotation.

use super::errors::{ApiError, Kind};
use super::etag;
use super::extract::{positive_id, Json, JsonBody};
use super::spec::{Array, Body, Field, Op, Param, Params, Rule, Shape, Str, Success};
use crate::state::AppState;
use crate::webhooks::{check_url, new_secret, resolve_allowed};
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use herald_actors::domain::Role;
use herald_actors::domain::{
    webhook_type_names, NewWebhook, Webhook, WebhookDelivery, WebhookPatch, PING_TYPE,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const WEBHOOK_ID: Param = Param::new(
    "id",
    Rule::Int {
        min: 1,
        max: i64::MAX,
    },
    "Webhook id",
);
pub const DELIVERY_ID: Param = Param::new(
    "delivery_id",
    Rule::Int {
        min: 1,
        max: i64::MAX,
    },
    "Delivery id",
);
const URL_RULE: Rule = Rule::Str(Str::pattern(
    "^https?://[^\\s]{1,2040}$",
    "must be an http or https URL",
));
static TYPES: Array = Array {
    items: Rule::Str(Str::one_of(webhook_type_names)),
    min: 1,
    max: 16,
    unique: true,
    noun: "event types",
};
const DESCRIPTION: Rule = Rule::Str(Str::len(0, 200));

pub static NEW_WEBHOOK: Shape = Shape {
    name: "CreateWebhook",
    description: "A new webhook subscription",
    fields: &[
        Field::req("url", URL_RULE, "Where events are POSTed"),
        Field::req("types", Rule::Array(&TYPES), "The event types to send"),
        Field::opt("description", DESCRIPTION, ""),
        Field::opt("enabled", Rule::Bool, "Default true"),
    ],
    example: Some(
        r#"{"url": "https://ops.example.com/herald", "types": ["run.finished", "account.state_changed"], "description": "ops chat"}"#,
    ),
};

pub static PATCH_WEBHOOK: Shape = Shape {
    name: "PatchWebhook",
    description: "Changes to a webhook subscription; absent fields stay",
    fields: &[
        Field::opt("url", URL_RULE, ""),
        Field::opt("types", Rule::Array(&TYPES), ""),
        Field::opt("description", DESCRIPTION, ""),
        Field::opt(
            "enabled",
            Rule::Bool,
            "Enabling clears the reason Herald disabled it for",
        ),
    ],
    example: Some(r#"{"enabled": true}"#),
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    url: String,
    types: Vec<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
}

impl JsonBody for CreateWebhook {
    const SHAPE: &'static Shape = &NEW_WEBHOOK;
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchBody {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    types: Option<Vec<String>>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
}

impl JsonBody for PatchBody {
    const SHAPE: &'static Shape = &PATCH_WEBHOOK;
}

pub static CREATE: Op = Op::new(
    "createWebhook",
    "Add a webhook subscription",
    Success::json(201, "Created; `secret` is shown this once", "NewWebhook").location(),
)
.describe(
    "Events of the chosen types are POSTed to `url`, signed as Standard Webhooks says. The URL \
     must be http or https, and must not resolve to a loopback, private or link-local address \
     unless `webhooks.allow_private` is set (422 naming `url`).",
)
.body(Body::Json(&NEW_WEBHOOK))
.needs(Role::Admin);

pub static LIST: Op = Op::new(
    "listWebhooks",
    "List webhook subscriptions",
    Success::json(200, "Every subscription, by id", "WebhookList"),
)
.needs(Role::Admin);

pub static GET: Op = Op::new(
    "getWebhook",
    "One webhook subscription",
    Success::json(200, "The subscription", "Webhook").etag(),
)
.path(&[WEBHOOK_ID])
.needs(Role::Admin);

pub static PATCH: Op = Op::new(
    "patchWebhook",
    "Change a webhook subscription",
    Success::json(200, "The subscription as changed", "Webhook").etag(),
)
.path(&[WEBHOOK_ID])
.body(Body::Json(&PATCH_WEBHOOK))
.if_match()
.needs(Role::Admin);

pub static DELETE: Op = Op::new(
    "deleteWebhook",
    "Delete a webhook subscription",
    Success::NO_CONTENT,
)
.describe("Its pending deliveries are dropped.")
.path(&[WEBHOOK_ID])
.needs(Role::Admin);

pub static ROTATE_SECRET: Op = Op::new(
    "rotateWebhookSecret",
    "Rotate a webhook's secret",
    Success::json(200, "The new `secret`, shown this once", "NewWebhook"),
)
.describe(
    "Deliveries are signed with the new secret and, for `overlap_hours`, with the old one too \
     (two signatures in `webhook-signature`), so the receiver can switch without losing one. \
     A rotation inside an overlap keeps every earlier secret signing until its own end; 409 \
     when 8 secrets would sign at once.",
)
.errors(&[409])
.path(&[WEBHOOK_ID])
.query(&[Param::new(
    "overlap_hours",
    Rule::Int { min: 0, max: 168 },
    "How long the old secret goes on signing beside the new one",
)
.default(24)])
.needs(Role::Admin);

pub static DELIVERIES: Op = Op::new(
    "listWebhookDeliveries",
    "A subscription's deliveries",
    Success::json(200, "A page of deliveries, newest first", "DeliveryPage"),
)
.describe("For the next page pass `before_id` = `next_before_id`; it is null on the last page.")
.path(&[WEBHOOK_ID])
.query(&[
    Param::new(
        "before_id",
        Rule::Int {
            min: 1,
            max: i64::MAX,
        },
        "Only deliveries with a smaller id",
    ),
    Param::new("limit", Rule::Int { min: 1, max: 500 }, "Page size").default(50),
])
.needs(Role::Admin);

pub static RETRY: Op = Op::new(
    "retryWebhookDelivery",
    "Send a delivery again",
    Success::json(202, "Due now", "Delivery"),
)
.describe("Delivered, failed or pending: it is sent again at once, with the same `webhook-id`.")
.path(&[WEBHOOK_ID, DELIVERY_ID])
.needs(Role::Admin);

pub static PING: Op = Op::new(
    "pingWebhook",
    "Send a test event",
    Success::json(202, "A `webhook.ping` delivery, due now", "Delivery"),
)
.path(&[WEBHOOK_ID])
.needs(Role::Admin);

#[derive(Debug, Serialize)]
pub struct WebhookView {
    pub id: i64,
    pub url: String,
    pub types: Vec<String>,
    pub description: String,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub failing_since: Option<DateTime<Utc>>,
    /// While an old secret still signs.
    pub old_secret_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl From<Webhook> for WebhookView {
    fn from(w: Webhook) -> Self {
        let old_secret_until = w.overlap_until(Utc::now());
        Self {
            id: w.id,
            url: w.url,
            types: w.types,
            description: w.description,
            enabled: w.enabled,
            disabled_reason: w.disabled_reason,
            failing_since: w.failing_since,
            old_secret_until,
            created_at: w.created_at,
            secret: None,
        }
    }
}

pub fn delivery_view(d: &WebhookDelivery) -> serde_json::Value {
    json!({
        "id": d.id,
        "webhook_id": d.webhook_id,
        "event_id": d.event_id,
        "type": d.event_type,
        "webhook_message_id": crate::webhooks::message_id(d.id),
        "status": d.status.as_str(),
        "attempts": d.attempts,
        "next_attempt_at": d.next_attempt_at,
        "last_attempt_at": d.last_attempt_at,
        "last_status": d.last_status,
        "last_error": d.last_error,
        "created_at": d.created_at,
    })
}

/// The URL's shape, then where it points (resolved off the runtime).
async fn check_target(state: &AppState, url: &str) -> Result<(), ApiError> {
    check_url(url).map_err(|rule| ApiError::field_error(Kind::Validation, "url", rule))?;
    let (url, allow) = (url.to_owned(), state.settings.webhooks.allow_private);
    tokio::task::spawn_blocking(move || resolve_allowed(&url, allow))
        .await
        .map_err(|e| ApiError::internal("checking a webhook URL", e))?
        .map_err(|rule| ApiError::field_error(Kind::Validation, "url", rule))
}

impl CreateWebhook {
    /// The console's form, as the API's body.
    pub fn from_form(url: &str, types: Vec<String>, description: &str) -> Self {
        Self {
            url: url.to_owned(),
            types,
            description: Some(description.to_owned()),
            enabled: Some(true),
        }
    }
}

/// Makes a subscription; the console's form calls it too. The types are
/// checked here as well, for callers that did not come through the
/// document's rules.
pub async fn make(state: &AppState, b: CreateWebhook) -> Result<WebhookView, ApiError> {
    if b.types.is_empty() {
        return Err(ApiError::field_error(
            Kind::Validation,
            "types",
            "must have 1–16 event types",
        ));
    }
    if let Some(t) = b
        .types
        .iter()
        .find(|t| !webhook_type_names().contains(&t.as_str()))
    {
        return Err(ApiError::field_error(
            Kind::Validation,
            "types",
            format!(
                "{t} is not an event type; one of {}",
                webhook_type_names().join(", ")
            ),
        ));
    }
    check_target(state, &b.url).await?;
    let w = state
        .store
        .create_webhook(&NewWebhook {
            url: b.url,
            types: b.types,
            description: b.description.unwrap_or_default(),
            enabled: b.enabled.unwrap_or(true),
            secret: new_secret(),
            created_at: Utc::now(),
        })
        .await?;
    let secret = w.secret.clone();
    Ok(WebhookView {
        secret: Some(secret),
        ..w.into()
    })
}

pub async fn create(
    state: web::Data<AppState>,
    body: Json<CreateWebhook>,
) -> Result<HttpResponse, ApiError> {
    let view = make(&state, body.0).await?;
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/v1/webhooks/{}", view.id)))
        .json(view))
}

pub async fn list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let items: Vec<WebhookView> = state
        .store
        .list_webhooks()
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "items": items })))
}

pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let view = WebhookView::from(
        state
            .store
            .get_webhook(positive_id(&path, "webhook")?)
            .await?,
    );
    Ok(HttpResponse::Ok()
        .insert_header(("ETag", etag::of(&view)))
        .json(view))
}

pub async fn patch(
    state: web::Data<AppState>,
    path: web::Path<String>,
    req: HttpRequest,
    body: Json<PatchBody>,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "webhook")?;
    let current = WebhookView::from(state.store.get_webhook(id).await?);
    etag::check(&req, &format!("webhook {id}"), &etag::of(&current))?;
    let b = body.0;
    if let Some(url) = &b.url {
        check_target(&state, url).await?;
    }
    let w = state
        .store
        .update_webhook(
            id,
            &WebhookPatch {
                url: b.url,
                types: b.types,
                description: b.description,
                enabled: b.enabled,
            },
        )
        .await?;
    let view = WebhookView::from(w);
    Ok(HttpResponse::Ok()
        .insert_header(("ETag", etag::of(&view)))
        .json(view))
}

pub async fn delete(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    state
        .store
        .delete_webhook(positive_id(&path, "webhook")?)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

pub async fn rotate(
    state: web::Data<AppState>,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &ROTATE_SECRET)?;
    let id = positive_id(&path, "webhook")?;
    let hours = p.int("overlap_hours").unwrap_or(24);
    let now = Utc::now();
    let until = now + chrono::Duration::hours(hours);
    let w = state
        .store
        .rotate_webhook_secret(id, &new_secret(), now, until)
        .await?;
    let secret = w.secret.clone();
    Ok(HttpResponse::Ok().json(WebhookView {
        secret: Some(secret),
        ..w.into()
    }))
}

pub async fn deliveries(
    state: web::Data<AppState>,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &DELIVERIES)?;
    let id = positive_id(&path, "webhook")?;
    state.store.get_webhook(id).await?;
    let limit = p.int("limit").unwrap_or(50) as u32;
    let items = state
        .store
        .list_deliveries(id, p.int("before_id"), limit)
        .await?;
    let next = (items.len() as u32 == limit)
        .then(|| items.last().map(|d| d.id))
        .flatten();
    Ok(HttpResponse::Ok().json(json!({
        "items": items.iter().map(delivery_view).collect::<Vec<_>>(),
        "next_before_id": next,
    })))
}

pub async fn retry(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (w, d) = path.into_inner();
    let (w, d) = (positive_id(&w, "webhook")?, positive_id(&d, "delivery")?);
    let again = state.store.retry_delivery(w, d, Utc::now()).await?;
    Ok(HttpResponse::Accepted().json(delivery_view(&again)))
}

pub async fn ping(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "webhook")?;
    state.store.get_webhook(id).await?;
    let now = Utc::now();
    let event = state
        .store
        .append_event(&herald_actors::domain::NewEvent {
            at: now,
            kind: "webhook_ping",
            account_id: None,
            run_id: None,
            data: json!({ "webhook_id": id, "message": "a test event from Herald" }),
        })
        .await?;
    let d = state
        .store
        .add_delivery(id, event.id, PING_TYPE, now)
        .await?;
    Ok(HttpResponse::Accepted().json(delivery_view(&d)))
}
