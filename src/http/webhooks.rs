//! `/v1/webhooks`: subscriptions that push events to the operator's URLs
//! (Standard Webhooks), their deliveries, retries, pings and secret
//! rotation. The secret is made by Herald and shown once, at creation and
//! at each rotation.

use super::errors::ApiError;
use super::etag;
use super::extract::{positive_id, Json, JsonBody};
use super::spec::{Array, Body, Field, Op, Param, Params, Rule, Shape, Str, Success};
use crate::service::webhooks::{
    self, DeliveryPage, DeliveryView, Subscription, WebhookList, WebhookView, Webhooks,
};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::{webhook_type_names, Webhook, WebhookPatch};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    Success::json::<NewWebhookView>(201, "Created; `secret` is shown this once").location(),
)
.describe(
    "Events of the chosen types are POSTed to `url`, signed as Standard Webhooks says. The URL \
     must be http or https, and must not resolve to a loopback, private or link-local address \
     unless `webhooks.allow_private` is set (422 naming `url`).",
)
.body(Body::Json(&NEW_WEBHOOK))
.performs(&webhooks::CREATE);

pub static LIST: Op = Op::new(
    "listWebhooks",
    "List webhook subscriptions",
    Success::json::<WebhookList>(200, "Every subscription, by id"),
)
.performs(&webhooks::LIST);

pub static GET: Op = Op::new(
    "getWebhook",
    "One webhook subscription",
    Success::json::<WebhookView>(200, "The subscription").etag(),
)
.path(&[WEBHOOK_ID])
.performs(&webhooks::GET);

pub static PATCH: Op = Op::new(
    "patchWebhook",
    "Change a webhook subscription",
    Success::json::<WebhookView>(200, "The subscription as changed").etag(),
)
.path(&[WEBHOOK_ID])
.body(Body::Json(&PATCH_WEBHOOK))
.if_match()
.performs(&webhooks::PATCH);

pub static DELETE: Op = Op::new(
    "deleteWebhook",
    "Delete a webhook subscription",
    Success::NO_CONTENT,
)
.describe("Its pending deliveries are dropped.")
.path(&[WEBHOOK_ID])
.performs(&webhooks::DELETE);

pub static ROTATE_SECRET: Op = Op::new(
    "rotateWebhookSecret",
    "Rotate a webhook's secret",
    Success::json::<NewWebhookView>(200, "The new `secret`, shown this once"),
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
.performs(&webhooks::ROTATE_SECRET);

pub static DELIVERIES: Op = Op::new(
    "listWebhookDeliveries",
    "A subscription's deliveries",
    Success::json::<DeliveryPage>(200, "A page of deliveries, newest first"),
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
.performs(&webhooks::DELIVERIES);

pub static RETRY: Op = Op::new(
    "retryWebhookDelivery",
    "Send a delivery again",
    Success::json::<DeliveryView>(202, "Due now"),
)
.describe("Delivered, failed or pending: it is sent again at once, with the same `webhook-id`.")
.path(&[WEBHOOK_ID, DELIVERY_ID])
.performs(&webhooks::RETRY);

pub static PING: Op = Op::new(
    "pingWebhook",
    "Send a test event",
    Success::json::<DeliveryView>(202, "A `webhook.ping` delivery, due now"),
)
.path(&[WEBHOOK_ID])
.performs(&webhooks::PING);

/// A subscription with its signing secret, shown this once.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "NewWebhook")]
pub struct NewWebhookView {
    #[serde(flatten)]
    pub webhook: WebhookView,
    /// `whsec_…`, shown this once.
    pub secret: String,
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

impl CreateWebhook {
    /// The subscription the body asks for.
    pub fn subscription(self) -> Subscription {
        Subscription {
            url: self.url,
            types: self.types,
            description: self.description.unwrap_or_default(),
            enabled: self.enabled.unwrap_or(true),
        }
    }
}

/// A subscription with its secret, as made or rotated.
pub fn with_secret(w: Webhook) -> NewWebhookView {
    NewWebhookView {
        secret: w.secret.clone(),
        webhook: w.into(),
    }
}

pub async fn create(
    service: web::Data<Service>,
    body: Json<CreateWebhook>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let w = Webhooks::of(&service)
        .create(allowed, body.0.subscription())
        .await?;
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/v1/webhooks/{}", w.id)))
        .json(with_secret(w)))
}

pub async fn list(service: web::Data<Service>, allowed: Allowed) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(Webhooks::of(&service).list(allowed).await?))
}

pub async fn get(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "webhook")?;
    let view = Webhooks::of(&service).get(allowed, id).await?;
    Ok(HttpResponse::Ok()
        .insert_header(("ETag", etag::of(&view)))
        .json(view))
}

pub async fn patch(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    body: Json<PatchBody>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "webhook")?;
    let what = format!("webhook {id}");
    let expect = |current: &Webhook| {
        let current = WebhookView::from(current.clone());
        etag::check(&req, &what, &etag::of(&current))
    };
    let b = body.0;
    let change = WebhookPatch {
        url: b.url,
        types: b.types,
        description: b.description,
        enabled: b.enabled,
    };
    let w = Webhooks::of(&service)
        .patch(allowed, id, expect, change)
        .await?;
    let view = WebhookView::from(w);
    Ok(HttpResponse::Ok()
        .insert_header(("ETag", etag::of(&view)))
        .json(view))
}

pub async fn delete(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "webhook")?;
    Webhooks::of(&service).delete(allowed, id).await?;
    Ok(HttpResponse::NoContent().finish())
}

pub async fn rotate(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &ROTATE_SECRET)?;
    let id = positive_id(&path, "webhook")?;
    let hours = p.int("overlap_hours").unwrap_or(24);
    let w = Webhooks::of(&service).rotate(allowed, id, hours).await?;
    Ok(HttpResponse::Ok().json(with_secret(w)))
}

pub async fn deliveries(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &DELIVERIES)?;
    let id = positive_id(&path, "webhook")?;
    let limit = p.int("limit").unwrap_or(50) as u32;
    let page = Webhooks::of(&service)
        .deliveries(allowed, id, p.int("before_id"), limit)
        .await?;
    Ok(HttpResponse::Ok().json(page))
}

pub async fn retry(
    service: web::Data<Service>,
    path: web::Path<(String, String)>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let (w, d) = path.into_inner();
    let (w, d) = (positive_id(&w, "webhook")?, positive_id(&d, "delivery")?);
    let again = Webhooks::of(&service).retry(allowed, w, d).await?;
    Ok(HttpResponse::Accepted().json(DeliveryView::from(again)))
}

pub async fn ping(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "webhook")?;
    let d = Webhooks::of(&service).ping(allowed, id).await?;
    Ok(HttpResponse::Accepted().json(DeliveryView::from(d)))
}
