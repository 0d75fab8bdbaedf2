//! Webhooks: every matching event pushed to the operator's URLs in the
//! Standard Webhooks format (standardwebhooks.com), durable and at least
//! once.
//!
//! - Deliveries are rows the store makes in the event's own transaction
//!   ([`herald_actors::ports::WebhookStore`]), so a crash loses none.
//! - [`Sender`] claims due deliveries (a claim with an expiry, so several
//!   daemons never post one delivery at once and a dead daemon's claims
//!   lapse), posts them apart from the delivery engine with a timeout and a
//!   cap on attempts in flight, and records each outcome: delivered, retry
//!   later (backoff with jitter), or given up. A subscription that keeps
//!   failing is disabled with a reason; a disabled subscription's
//!   deliveries are held, never claimed, until it is enabled again.
//! - Its HTTP client ([`client`]) takes no proxy from the environment, and
//!   checks the addresses it connects to ([`target`]).
//! - A receiver dedupes on `webhook-id`, which is the delivery's and so
//!   the same on every retry.
//!
//! Imports: `settings`, `metrics`, and of the core `herald_actors::domain`
//! and `herald_actors::ports::store`.

mod client;
mod sign;
mod target;

pub use client::proxy_of;
pub use sign::{new_secret, sign, signature_header, SECRET_PREFIX};
pub use target::{check_url, is_public, resolve_allowed};

use crate::settings::WebhookSettings;
use chrono::{DateTime, Utc};
use herald_actors::domain::{AccountId, AttemptOutcome, DueDelivery, Event, RunId};
use herald_actors::ports::Store;
use rand::RngExt;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

/// The retry schedule after a failed attempt (Svix's, which the standard's
/// authors use): then the delivery is given up, about 28 hours after the
/// first attempt.
pub const RETRY_SCHEDULE_SECS: [u64; 7] = [5, 300, 1800, 7200, 18_000, 36_000, 36_000];
/// At most this much of a receiver's answer is kept.
const EXCERPT_BYTES: u64 = 256;

/// The names of what an event is about, as people know them: a run's
/// reminder title and its account's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    pub reminder_title: Option<String>,
    pub account_name: Option<String>,
}

/// The body of a delivery: `{type, timestamp, data}`. `data` is the event's
/// own data with the ids it is about and, where known, their `names`.
pub fn payload(event_type: &str, event: &Event, names: &Names) -> Vec<u8> {
    let mut data = match &event.data {
        serde_json::Value::Object(m) => m.clone(),
        other => {
            let mut m = serde_json::Map::new();
            m.insert("value".into(), other.clone());
            m
        }
    };
    data.insert("event_id".into(), event.id.into());
    if let Some(a) = &event.account_id {
        data.entry("account_id").or_insert_with(|| a.clone().into());
    }
    if let Some(r) = event.run_id {
        data.entry("run_id").or_insert_with(|| r.into());
    }
    if let Some(t) = &names.reminder_title {
        data.entry("reminder_title")
            .or_insert_with(|| t.clone().into());
    }
    if let Some(n) = &names.account_name {
        data.entry("account_name")
            .or_insert_with(|| n.clone().into());
    }
    let body = serde_json::json!({
        "type": event_type,
        "timestamp": event.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": data,
    });
    serde_json::to_vec(&body).expect("JSON values serialize")
}

/// The `webhook-id` of a delivery: the same on every retry.
pub fn message_id(delivery_id: i64) -> String {
    format!("msg_herald_{delivery_id}")
}

/// When to try again after `attempts` attempts (counting this one), with
/// ±20 % jitter so a receiver coming back is not hit by every retry at
/// once; `None`: give up.
pub fn next_attempt(
    attempts: u32,
    now: DateTime<Utc>,
    scale: f64,
    rng: &mut impl RngExt,
) -> Option<DateTime<Utc>> {
    let base = *RETRY_SCHEDULE_SECS.get(attempts.checked_sub(1)? as usize)? as f64 * scale;
    let secs = base * rng.random_range(0.8..1.2);
    Some(now + chrono::Duration::milliseconds((secs * 1000.0) as i64))
}

/// Posts claimed deliveries and records how each went.
pub struct Sender {
    store: Arc<dyn Store>,
    settings: WebhookSettings,
    /// Claims are taken under this name: unique per process, so a
    /// restarted daemon waits for its predecessor's claims to lapse
    /// rather than taking them for its own.
    node: String,
    agent: ureq::Agent,
    /// Counts attempts by outcome for `/metrics`, when set.
    metrics: Option<Arc<crate::metrics::PromMetrics>>,
}

impl Sender {
    /// Fails only on a `webhooks.proxy` that `Settings::validate` would
    /// have refused.
    pub fn new(
        store: Arc<dyn Store>,
        settings: WebhookSettings,
        node: &str,
    ) -> anyhow::Result<Self> {
        let agent = client::agent(&settings).map_err(anyhow::Error::msg)?;
        Ok(Self {
            store,
            settings,
            node: format!("{node}-{}", std::process::id()),
            agent,
            metrics: None,
        })
    }

    /// Counts every attempt in `herald_webhook_attempts_total`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::PromMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Claims and sends until aborted: every `poll_ms`, as many due
    /// deliveries as there is room for in flight.
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        let me = Arc::new(self);
        tokio::spawn(async move {
            let room = Arc::new(tokio::sync::Semaphore::new(
                me.settings.max_in_flight.max(1),
            ));
            let mut tick =
                tokio::time::interval(Duration::from_millis(me.settings.poll_ms.max(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // After a full batch, claim again at once: the backlog is
            // worked off as fast as attempts end, not one batch a tick.
            let mut full = false;
            loop {
                if !full {
                    tick.tick().await;
                }
                // Room for one attempt at least.
                match room.clone().acquire_owned().await {
                    Ok(p) => drop(p),
                    Err(_) => return,
                }
                let free = room.available_permits() as u32;
                // The database's clock, as every daemon's sender reads it:
                // a claim one daemon made is judged lapsed by the others
                // on the same clock, so a skewed machine cannot claim a
                // delivery another is still posting.
                let now = match me.store.database_now().await {
                    Ok(now) => now,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not read the database's clock to claim webhook deliveries");
                        full = false;
                        continue;
                    }
                };
                // Long enough for an attempt (its timeout, twice: the
                // address check and the post) and its recording.
                let until =
                    now + chrono::Duration::seconds(me.settings.timeout_secs as i64 * 2 + 5);
                let due = match me.store.claim_deliveries(&me.node, now, until, free).await {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not claim webhook deliveries");
                        full = false;
                        continue;
                    }
                };
                full = due.len() as u32 == free;
                for d in due {
                    let Ok(permit) = room.clone().acquire_owned().await else {
                        return;
                    };
                    let me = me.clone();
                    tokio::spawn(async move {
                        me.attempt(d).await;
                        drop(permit);
                    });
                }
            }
        })
    }

    /// The database's clock, or this machine's when it cannot be read
    /// (the time an attempt is recorded at and its retry counted from).
    async fn clock(&self) -> DateTime<Utc> {
        self.store
            .database_now()
            .await
            .unwrap_or_else(|_| Utc::now())
    }

    /// One attempt, recorded. The store refuses the record if the claim
    /// lapsed meanwhile (another daemon has the delivery now).
    pub async fn attempt(&self, due: DueDelivery) {
        let id = due.delivery.id;
        let outcome = self.post(&due).await;
        if let Some(m) = &self.metrics {
            m.webhook_attempt(match outcome {
                AttemptOutcome::Delivered { .. } => "delivered",
                AttemptOutcome::Retry { .. } => "retry",
                AttemptOutcome::GaveUp { .. } => "gave_up",
            });
        }
        let disable_after = Duration::from_secs(self.settings.disable_after_hours * 3600);
        if let Err(e) = self
            .store
            .finish_attempt(id, &self.node, &outcome, self.clock().await, disable_after)
            .await
        {
            tracing::warn!(delivery = id, error = %e, "could not record a webhook attempt");
        }
        if let AttemptOutcome::GaveUp { error, .. } = &outcome {
            tracing::warn!(delivery = id, webhook = due.webhook.id, error = %error, "webhook delivery given up");
        }
    }

    /// What `event` is about, named: read at each attempt, and left out
    /// (never a reason to hold a delivery) when the store cannot say.
    async fn names(&self, event: &Event) -> Names {
        let mut names = Names::default();
        let account = match event.run_id {
            Some(run) => match self.store.get_run(RunId(run)).await {
                Ok(Some(run)) => {
                    names.reminder_title = self
                        .store
                        .reminder_titles(&[run.reminder_id])
                        .await
                        .ok()
                        .and_then(|mut t| t.remove(&run.reminder_id));
                    Some(run.account_id)
                }
                _ => None,
            },
            None => None,
        };
        let account = account.or_else(|| {
            event
                .account_id
                .as_deref()
                .and_then(|a| AccountId::parse(a).ok())
        });
        if let Some(a) = account {
            names.account_name = self
                .store
                .get_account(&a)
                .await
                .ok()
                .flatten()
                .map(|a| a.name);
        }
        names
    }

    async fn post(&self, due: &DueDelivery) -> AttemptOutcome {
        let now = Utc::now();
        let attempts = due.delivery.attempts + 1;
        let failed = |status: Option<u16>, error: String| match next_attempt(
            attempts,
            now,
            self.settings.retry_scale,
            &mut rand::rng(),
        ) {
            Some(next_attempt_at) => AttemptOutcome::Retry {
                status,
                error,
                next_attempt_at,
            },
            None => AttemptOutcome::GaveUp { status, error },
        };
        let url = due.webhook.url.clone();
        let names = self.names(&due.event).await;
        let body = payload(&due.delivery.event_type, &due.event, &names);
        let msg_id = message_id(due.delivery.id);
        let ts = now.timestamp();
        let signature = signature_header(&due.webhook.signing_secrets(now), &msg_id, ts, &body);
        let agent = self.agent.clone();
        let sent = tokio::task::spawn_blocking(move || {
            let mut res = agent
                .post(&url)
                .header("content-type", "application/json")
                .header("webhook-id", &msg_id)
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", &signature)
                .send(&body[..])
                .map_err(|e| e.to_string())?;
            let status = res.status().as_u16();
            let mut excerpt = String::new();
            let _ = res
                .body_mut()
                .as_reader()
                .take(EXCERPT_BYTES)
                .read_to_string(&mut excerpt);
            Ok::<_, String>((status, excerpt))
        })
        .await;
        match sent {
            Ok(Ok((status, _))) if (200..300).contains(&status) => {
                AttemptOutcome::Delivered { status }
            }
            Ok(Ok((status, excerpt))) => failed(
                Some(status),
                format!("answered {status}: {}", excerpt.trim()),
            ),
            Ok(Err(e)) => failed(None, e),
            Err(e) => failed(None, format!("the attempt did not finish: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_schedule_backs_off_with_jitter_and_ends() {
        let t0: DateTime<Utc> = "2026-11-25T00:00:00Z".parse().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for (i, base) in RETRY_SCHEDULE_SECS.iter().enumerate() {
            let next = next_attempt(i as u32 + 1, t0, 1.0, &mut rng).unwrap();
            let secs = (next - t0).num_milliseconds() as f64 / 1000.0;
            assert!(
                secs >= *base as f64 * 0.8 && secs <= *base as f64 * 1.2,
                "attempt {}: {secs}",
                i + 1
            );
        }
        assert_eq!(next_attempt(8, t0, 1.0, &mut rng), None, "given up");
        assert_eq!(next_attempt(0, t0, 1.0, &mut rng), None);
        let fast = next_attempt(1, t0, 0.001, &mut rng).unwrap();
        assert!((fast - t0).num_milliseconds() <= 6);
    }

    #[test]
    fn the_payload_is_type_timestamp_and_data() {
        let e = Event {
            id: 42,
            at: "2026-11-25T08:00:00.123456Z".parse().unwrap(),
            kind: "run_finished".into(),
            account_id: Some("sales-1".into()),
            run_id: Some(7),
            data: serde_json::json!({"status": "partial", "delivered": "3 of 4 delivered"}),
        };
        let v: serde_json::Value =
            serde_json::from_slice(&payload("run.finished", &e, &Names::default())).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "type": "run.finished",
                "timestamp": "2026-11-25T08:00:00.123Z",
                "data": {"status": "partial", "delivered": "3 of 4 delivered",
                         "event_id": 42, "account_id": "sales-1", "run_id": 7},
            })
        );
        // Names, where known, ride beside the ids.
        let names = Names {
            reminder_title: Some("Rent, due Friday".into()),
            account_name: Some("Sales line 1".into()),
        };
        let v: serde_json::Value =
            serde_json::from_slice(&payload("run.finished", &e, &names)).unwrap();
        assert_eq!(v["data"]["reminder_title"], "Rent, due Friday");
        assert_eq!(v["data"]["account_name"], "Sales line 1");
        assert_eq!(v["data"]["run_id"], 7);
    }
}
