//! Webhook subscriptions: events pushed to the operator's systems, signed.
//! A subscription's URL is held to the address rules (`webhooks::target`)
//! when it is set; its secret is made here and shown once.

use super::error::{ApiError, Kind};
use super::Service;
use super::{Allowed, Operation};
use crate::webhooks::{check_url, message_id, new_secret, resolve_allowed};
use chrono::{DateTime, Duration, Utc};
use herald_actors::domain::{
    webhook_type_names, DeliveryStatus, NewEvent, NewWebhook, Role, Webhook, WebhookDelivery,
    WebhookPatch, PING_TYPE,
};
use herald_actors::events::EventBus;
use herald_actors::ports::Store;
use schemars::JsonSchema;
use serde::Serialize;

pub static CREATE: Operation = Operation::new("createWebhook", Role::Admin);
pub static PATCH: Operation = Operation::new("patchWebhook", Role::Admin);
pub static DELETE: Operation = Operation::new("deleteWebhook", Role::Admin);
pub static ROTATE_SECRET: Operation = Operation::new("rotateWebhookSecret", Role::Admin);
pub static PING: Operation = Operation::new("pingWebhook", Role::Admin);
pub static RETRY: Operation = Operation::new("retryWebhookDelivery", Role::Admin);
pub static LIST: Operation = Operation::read("listWebhooks", Role::Admin);
pub static GET: Operation = Operation::read("getWebhook", Role::Admin);
pub static DELIVERIES: Operation = Operation::read("listWebhookDeliveries", Role::Admin);

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Webhook")]
pub struct WebhookView {
    pub id: i64,
    pub url: String,
    #[schemars(schema_with = "event_types")]
    pub types: Vec<String>,
    pub description: String,
    pub enabled: bool,
    /// Why Herald disabled it: its receiver failed for too long.
    pub disabled_reason: Option<String>,
    pub failing_since: Option<DateTime<Utc>>,
    /// While an earlier secret still signs beside the current one (the
    /// latest end, when several do).
    pub old_secret_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

fn event_types(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "string", "enum": webhook_type_names() },
    })
}

/// Every subscription, by id.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WebhookList {
    pub items: Vec<WebhookView>,
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
        }
    }
}

/// One delivery of an event to a subscription, as the API shows it.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Delivery")]
pub struct DeliveryView {
    pub id: i64,
    pub webhook_id: i64,
    pub event_id: i64,
    #[serde(rename = "type")]
    pub event_type: String,
    /// The `webhook-id` header: the same on every retry.
    pub webhook_message_id: String,
    /// held: waiting while the subscription is disabled.
    pub status: DeliveryStatus,
    pub attempts: u32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl From<WebhookDelivery> for DeliveryView {
    fn from(d: WebhookDelivery) -> Self {
        Self {
            id: d.id,
            webhook_id: d.webhook_id,
            event_id: d.event_id,
            event_type: d.event_type,
            webhook_message_id: message_id(d.id),
            status: d.status,
            attempts: d.attempts,
            next_attempt_at: d.next_attempt_at,
            last_attempt_at: d.last_attempt_at,
            last_status: d.last_status,
            last_error: d.last_error,
            created_at: d.created_at,
        }
    }
}

/// A page of a subscription's deliveries, newest first.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DeliveryPage {
    pub items: Vec<DeliveryView>,
    pub next_before_id: Option<i64>,
}

/// A subscription to make, its fields checked by the request's rules.
pub struct Subscription {
    pub url: String,
    pub types: Vec<String>,
    pub description: String,
    pub enabled: bool,
}

pub struct Webhooks<'a> {
    store: &'a dyn Store,
    /// Where a ping's event is told to live followers.
    events: &'a EventBus,
    /// Serialises an edit's `If-Match` check with its write.
    edits: &'a tokio::sync::Mutex<()>,
    /// `webhooks.allow_private`: private and loopback targets allowed.
    allow_private: bool,
}

impl<'a> Webhooks<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
            events: &state.engine.events,
            edits: &state.edits,
            allow_private: state.settings.webhooks.allow_private,
        }
    }

    /// Every subscription, by id.
    pub async fn list(&self, allowed: Allowed) -> Result<WebhookList, ApiError> {
        allowed.of(&LIST)?;
        let items: Vec<WebhookView> = self
            .store
            .list_webhooks()
            .await?
            .into_iter()
            .map(Into::into)
            .collect();
        Ok(WebhookList { items })
    }

    pub async fn get(&self, allowed: Allowed, id: i64) -> Result<WebhookView, ApiError> {
        allowed.of(&GET)?;
        Ok(self.store.get_webhook(id).await?.into())
    }

    /// At most `limit` of subscription `id`'s deliveries with ids below
    /// `before_id`, newest first; a full page may have more behind it.
    pub async fn deliveries(
        &self,
        allowed: Allowed,
        id: i64,
        before_id: Option<i64>,
        limit: u32,
    ) -> Result<DeliveryPage, ApiError> {
        allowed.of(&DELIVERIES)?;
        self.store.get_webhook(id).await?;
        let items = self.store.list_deliveries(id, before_id, limit).await?;
        let next_before_id = (items.len() as u32 == limit)
            .then(|| items.last().map(|d| d.id))
            .flatten();
        Ok(DeliveryPage {
            items: items.into_iter().map(DeliveryView::from).collect(),
            next_before_id,
        })
    }

    /// The subscription with its latest `n` deliveries, newest first: what
    /// its page shows.
    pub async fn with_recent(
        &self,
        allowed: Allowed,
        id: i64,
        n: u32,
    ) -> Result<(WebhookView, Vec<DeliveryView>), ApiError> {
        allowed.of(&DELIVERIES)?;
        let webhook = self.get(allowed, id).await?;
        let recent = self.store.list_deliveries(id, None, n).await?;
        Ok((
            webhook,
            recent.into_iter().map(DeliveryView::from).collect(),
        ))
    }

    /// Makes a subscription with a new secret. The types are checked here
    /// as well, for callers that did not come through the request's rules.
    pub async fn create(&self, allowed: Allowed, s: Subscription) -> Result<Webhook, ApiError> {
        allowed.of(&CREATE)?;
        if s.types.is_empty() {
            return Err(ApiError::invalid("types", "must have 1–16 event types"));
        }
        if let Some(t) = s
            .types
            .iter()
            .find(|t| !webhook_type_names().contains(&t.as_str()))
        {
            return Err(ApiError::invalid(
                "types",
                format!(
                    "{t} is not an event type; one of {}",
                    webhook_type_names().join(", ")
                ),
            ));
        }
        self.check_target(&s.url).await?;
        let w = self
            .store
            .create_webhook(&NewWebhook {
                url: s.url,
                types: s.types,
                description: s.description,
                enabled: s.enabled,
                secret: new_secret(),
                created_at: Utc::now(),
            })
            .await?;
        Ok(w)
    }

    /// Changes subscription `id` while it is the version `expect` accepts.
    pub async fn patch(
        &self,
        allowed: Allowed,
        id: i64,
        expect: impl FnOnce(&Webhook) -> Result<(), ApiError>,
        change: WebhookPatch,
    ) -> Result<Webhook, ApiError> {
        allowed.of(&PATCH)?;
        if let Some(url) = &change.url {
            self.check_target(url).await?;
        }
        // Two operators editing one subscription cannot both win.
        let _edit = self.edits.lock().await;
        expect(&self.store.get_webhook(id).await?)?;
        Ok(self.store.update_webhook(id, &change).await?)
    }

    /// Its pending deliveries are dropped.
    pub async fn delete(&self, allowed: Allowed, id: i64) -> Result<(), ApiError> {
        allowed.of(&DELETE)?;
        Ok(self.store.delete_webhook(id).await?)
    }

    /// A new secret; the old one still signs beside it for `overlap_hours`.
    pub async fn rotate(
        &self,
        allowed: Allowed,
        id: i64,
        overlap_hours: i64,
    ) -> Result<Webhook, ApiError> {
        allowed.of(&ROTATE_SECRET)?;
        let now = Utc::now();
        let until = now + Duration::hours(overlap_hours);
        Ok(self
            .store
            .rotate_webhook_secret(id, &new_secret(), now, until)
            .await?)
    }

    /// A `webhook.ping` event for this subscription alone, due now.
    pub async fn ping(&self, allowed: Allowed, id: i64) -> Result<WebhookDelivery, ApiError> {
        allowed.of(&PING)?;
        self.store.get_webhook(id).await?;
        let now = Utc::now();
        let event = self
            .store
            .append_event(&NewEvent {
                at: now,
                kind: "webhook_ping",
                account_id: None,
                run_id: None,
                data: serde_json::json!({ "webhook_id": id, "message": "a test event from Herald" }),
            })
            .await?;
        let delivery = self
            .store
            .add_delivery(id, event.id, PING_TYPE, now)
            .await?;
        // Live followers of the log see the ping as they see every event.
        self.events.published(Some(event));
        Ok(delivery)
    }

    /// A failed or held delivery, due again now.
    pub async fn retry(
        &self,
        allowed: Allowed,
        webhook: i64,
        delivery: i64,
    ) -> Result<WebhookDelivery, ApiError> {
        allowed.of(&RETRY)?;
        Ok(self
            .store
            .retry_delivery(webhook, delivery, Utc::now())
            .await?)
    }

    /// The URL's shape, then where it points (resolved off the runtime).
    async fn check_target(&self, url: &str) -> Result<(), ApiError> {
        check_url(url).map_err(|rule| ApiError::field_error(Kind::Validation, "url", rule))?;
        let (url, allow) = (url.to_owned(), self.allow_private);
        tokio::task::spawn_blocking(move || resolve_allowed(&url, allow))
            .await
            .map_err(|e| ApiError::internal("checking a webhook URL", e))?
            .map_err(|rule| ApiError::field_error(Kind::Validation, "url", rule))
    }
}
