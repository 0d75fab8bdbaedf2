//! Webhook subscriptions: events pushed to the operator's systems, signed.
//! A subscription's URL is held to the address rules (`webhooks::target`)
//! when it is set; its secret is made here and shown once.

use super::error::{ApiError, Kind};
use super::{Allowed, Operation};
use crate::state::AppState;
use crate::webhooks::{check_url, new_secret, resolve_allowed};
use chrono::{Duration, Utc};
use herald_actors::domain::{
    webhook_type_names, NewEvent, NewWebhook, Role, Webhook, WebhookDelivery, WebhookPatch,
    PING_TYPE,
};
use herald_actors::ports::Store;

pub static CREATE: Operation = Operation::new("createWebhook", Role::Admin);
pub static PATCH: Operation = Operation::new("patchWebhook", Role::Admin);
pub static DELETE: Operation = Operation::new("deleteWebhook", Role::Admin);
pub static ROTATE_SECRET: Operation = Operation::new("rotateWebhookSecret", Role::Admin);
pub static PING: Operation = Operation::new("pingWebhook", Role::Admin);
pub static RETRY: Operation = Operation::new("retryWebhookDelivery", Role::Admin);

/// A subscription to make, its fields checked by the request's rules.
pub struct Subscription {
    pub url: String,
    pub types: Vec<String>,
    pub description: String,
    pub enabled: bool,
}

pub struct Webhooks<'a> {
    store: &'a dyn Store,
    /// `webhooks.allow_private`: private and loopback targets allowed.
    allow_private: bool,
}

impl<'a> Webhooks<'a> {
    pub fn of(state: &'a AppState) -> Self {
        Self {
            store: state.store.as_ref(),
            allow_private: state.settings.webhooks.allow_private,
        }
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
        expect(&self.store.get_webhook(id).await?)?;
        if let Some(url) = &change.url {
            self.check_target(url).await?;
        }
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
        Ok(self
            .store
            .add_delivery(id, event.id, PING_TYPE, now)
            .await?)
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
