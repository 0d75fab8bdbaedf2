//! Webhook subscriptions and deliveries in memory: [`WebhookStore`], and
//! the fan-out the SQL store's trigger does when an event is appended.

use super::{Inner, MemDelivery, MemoryStore};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// One pending delivery per enabled subscription asking for the event's
/// type.
pub(super) fn fan_out(g: &mut Inner, event: &Event) {
    let Some(t) = webhook_type_of(&event.kind) else {
        return;
    };
    let hooks: Vec<i64> = g
        .webhooks
        .values()
        .filter(|w| w.enabled && w.types.iter().any(|x| x == t))
        .map(|w| w.id)
        .collect();
    for webhook_id in hooks {
        push(g, webhook_id, event.id, t, event.at);
    }
}

fn push(
    g: &mut Inner,
    webhook_id: i64,
    event_id: i64,
    t: &str,
    at: DateTime<Utc>,
) -> WebhookDelivery {
    g.last_delivery_id += 1;
    let d = WebhookDelivery {
        id: g.last_delivery_id,
        webhook_id,
        event_id,
        event_type: t.to_owned(),
        status: DeliveryStatus::Pending,
        attempts: 0,
        next_attempt_at: at,
        last_attempt_at: None,
        last_status: None,
        last_error: None,
        created_at: at,
    };
    g.deliveries.insert(
        d.id,
        MemDelivery {
            d: d.clone(),
            claimed_by: None,
            claimed_until: None,
        },
    );
    d
}

fn missing(id: i64) -> StoreError {
    StoreError::NotFound(format!("webhook {id}"))
}

/// Holds (`true`) the pending deliveries of a subscription being disabled,
/// dropping their claims, or makes its held ones pending again.
fn hold(g: &mut Inner, webhook_id: i64, on: bool) {
    let (from, to) = if on {
        (DeliveryStatus::Pending, DeliveryStatus::Held)
    } else {
        (DeliveryStatus::Held, DeliveryStatus::Pending)
    };
    for m in g.deliveries.values_mut() {
        if m.d.webhook_id == webhook_id && m.d.status == from {
            m.d.status = to;
            m.claimed_by = None;
            m.claimed_until = None;
        }
    }
}

/// What a delivery made or retried by hand starts as.
fn initial(g: &Inner, webhook_id: i64) -> DeliveryStatus {
    match g.webhooks.get(&webhook_id) {
        Some(w) if !w.enabled => DeliveryStatus::Held,
        _ => DeliveryStatus::Pending,
    }
}

#[async_trait]
impl WebhookStore for MemoryStore {
    async fn create_webhook(&self, w: &NewWebhook) -> StoreResult<Webhook> {
        let mut g = self.lock()?;
        g.last_webhook_id += 1;
        let hook = Webhook {
            id: g.last_webhook_id,
            url: w.url.clone(),
            types: w.types.clone(),
            description: w.description.clone(),
            enabled: w.enabled,
            disabled_reason: None,
            secret: w.secret.clone(),
            previous_secrets: Vec::new(),
            failing_since: None,
            created_at: w.created_at,
        };
        g.webhooks.insert(hook.id, hook.clone());
        Ok(hook)
    }

    async fn list_webhooks(&self) -> StoreResult<Vec<Webhook>> {
        Ok(self.lock()?.webhooks.values().cloned().collect())
    }

    async fn get_webhook(&self, id: i64) -> StoreResult<Webhook> {
        self.lock()?
            .webhooks
            .get(&id)
            .cloned()
            .ok_or_else(|| missing(id))
    }

    async fn update_webhook(&self, id: i64, patch: &WebhookPatch) -> StoreResult<Webhook> {
        let mut g = self.lock()?;
        let w = g.webhooks.get_mut(&id).ok_or_else(|| missing(id))?;
        if let Some(u) = &patch.url {
            w.url = u.clone();
        }
        if let Some(t) = &patch.types {
            w.types = t.clone();
        }
        if let Some(d) = &patch.description {
            w.description = d.clone();
        }
        if let Some(e) = patch.enabled {
            w.enabled = e;
            if e {
                w.disabled_reason = None;
                w.failing_since = None;
            }
        }
        let w = w.clone();
        if let Some(e) = patch.enabled {
            hold(&mut g, id, !e);
        }
        Ok(w)
    }

    async fn rotate_webhook_secret(
        &self,
        id: i64,
        secret: &str,
        now: DateTime<Utc>,
        old_until: DateTime<Utc>,
    ) -> StoreResult<Webhook> {
        let mut g = self.lock()?;
        let w = g.webhooks.get_mut(&id).ok_or_else(|| missing(id))?;
        w.previous_secrets.retain(|p| now < p.until);
        if w.previous_secrets.len() + 1 >= MAX_SIGNING_SECRETS {
            let ends: Vec<_> = w.previous_secrets.iter().map(|p| p.until).collect();
            return Err(too_many_secrets(id, &ends));
        }
        let old = std::mem::replace(&mut w.secret, secret.to_owned());
        w.previous_secrets.insert(
            0,
            PreviousSecret {
                secret: old,
                until: old_until,
            },
        );
        Ok(w.clone())
    }

    async fn delete_webhook(&self, id: i64) -> StoreResult<()> {
        let mut g = self.lock()?;
        g.webhooks.remove(&id).ok_or_else(|| missing(id))?;
        g.deliveries.retain(|_, d| d.d.webhook_id != id);
        Ok(())
    }

    async fn add_delivery(
        &self,
        webhook_id: i64,
        event_id: i64,
        event_type: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<WebhookDelivery> {
        let mut g = self.lock()?;
        if !g.webhooks.contains_key(&webhook_id) {
            return Err(missing(webhook_id));
        }
        let status = initial(&g, webhook_id);
        let mut d = push(&mut g, webhook_id, event_id, event_type, now);
        d.status = status;
        g.deliveries.get_mut(&d.id).expect("just made").d.status = status;
        Ok(d)
    }

    async fn list_deliveries(
        &self,
        webhook_id: i64,
        before_id: Option<i64>,
        limit: u32,
    ) -> StoreResult<Vec<WebhookDelivery>> {
        let g = self.lock()?;
        Ok(g.deliveries
            .range(..before_id.unwrap_or(i64::MAX))
            .rev()
            .map(|(_, d)| &d.d)
            .filter(|d| d.webhook_id == webhook_id)
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn claim_deliveries(
        &self,
        node: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<DueDelivery>> {
        let mut g = self.lock()?;
        let mut due: Vec<(DateTime<Utc>, i64)> = g
            .deliveries
            .values()
            .filter(|m| {
                m.d.status == DeliveryStatus::Pending
                    && m.d.next_attempt_at <= now
                    && m.claimed_until.is_none_or(|c| c <= now)
                    // Never for a disabled subscription, whatever the
                    // delivery's status says.
                    && g.webhooks.get(&m.d.webhook_id).is_none_or(|w| w.enabled)
            })
            .map(|m| (m.d.next_attempt_at, m.d.id))
            .collect();
        due.sort();
        due.truncate(limit as usize);
        let mut out = Vec::new();
        for (_, id) in due {
            let m = g.deliveries.get_mut(&id).expect("listed above");
            m.claimed_by = Some(node.to_owned());
            m.claimed_until = Some(until);
            let d = m.d.clone();
            match (g.webhooks.get(&d.webhook_id), g.events.get(&d.event_id)) {
                (Some(w), Some(e)) => out.push(DueDelivery {
                    webhook: w.clone(),
                    event: e.clone(),
                    delivery: d,
                }),
                _ => {
                    let m = g.deliveries.get_mut(&id).expect("listed above");
                    m.d.status = DeliveryStatus::Failed;
                    m.d.last_error = Some("its subscription or its event no longer exists".into());
                }
            }
        }
        Ok(out)
    }

    async fn webhook_backlog(&self, now: DateTime<Utc>) -> StoreResult<WebhookBacklog> {
        let g = self.lock()?;
        let pending = g
            .deliveries
            .values()
            .filter(|m| m.d.status == DeliveryStatus::Pending);
        let mut backlog = WebhookBacklog::default();
        for m in pending {
            backlog.pending += 1;
            if m.d.next_attempt_at <= now {
                backlog.oldest_due_at = Some(
                    backlog
                        .oldest_due_at
                        .map_or(m.d.next_attempt_at, |t| t.min(m.d.next_attempt_at)),
                );
            }
        }
        Ok(backlog)
    }

    async fn finish_attempt(
        &self,
        delivery_id: i64,
        node: &str,
        outcome: &AttemptOutcome,
        now: DateTime<Utc>,
        disable_after: Duration,
    ) -> StoreResult<()> {
        let mut g = self.lock()?;
        let m = g
            .deliveries
            .get_mut(&delivery_id)
            .filter(|m| {
                m.claimed_by.as_deref() == Some(node) && m.d.status == DeliveryStatus::Pending
            })
            .ok_or_else(|| {
                StoreError::Conflict(format!("delivery {delivery_id} is not claimed by {node}"))
            })?;
        m.claimed_by = None;
        m.claimed_until = None;
        m.d.attempts += 1;
        m.d.last_attempt_at = Some(now);
        let (error, ok) = match outcome {
            AttemptOutcome::Delivered { status } => {
                m.d.status = DeliveryStatus::Delivered;
                m.d.last_status = Some(*status);
                m.d.last_error = None;
                (None, true)
            }
            AttemptOutcome::Retry {
                status,
                error,
                next_attempt_at,
            } => {
                m.d.last_status = *status;
                m.d.last_error = Some(error.clone());
                m.d.next_attempt_at = *next_attempt_at;
                (Some(error.clone()), false)
            }
            AttemptOutcome::GaveUp { status, error } => {
                m.d.status = DeliveryStatus::Failed;
                m.d.last_status = *status;
                m.d.last_error = Some(error.clone());
                (Some(error.clone()), false)
            }
        };
        let webhook_id = m.d.webhook_id;
        if let Some(w) = g.webhooks.get_mut(&webhook_id) {
            if ok {
                w.failing_since = None;
            } else {
                let since = *w.failing_since.get_or_insert(now);
                if w.enabled && (now - since).to_std().unwrap_or_default() > disable_after {
                    w.enabled = false;
                    w.disabled_reason = Some(format!(
                        "disabled by Herald: every attempt failed since {} (the last: {})",
                        since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        error.as_deref().unwrap_or("no answer")
                    ));
                    hold(&mut g, webhook_id, true);
                }
            }
        }
        Ok(())
    }

    async fn retry_delivery(
        &self,
        webhook_id: i64,
        delivery_id: i64,
        now: DateTime<Utc>,
    ) -> StoreResult<WebhookDelivery> {
        let mut g = self.lock()?;
        if g.deliveries
            .get(&delivery_id)
            .is_none_or(|m| m.d.webhook_id != webhook_id)
        {
            return Err(StoreError::NotFound(format!(
                "delivery {delivery_id} of webhook {webhook_id}"
            )));
        }
        let status = initial(&g, webhook_id);
        let m = g.deliveries.get_mut(&delivery_id).expect("found above");
        m.d.status = status;
        m.d.next_attempt_at = now;
        m.claimed_by = None;
        m.claimed_until = None;
        Ok(m.d.clone())
    }
}
