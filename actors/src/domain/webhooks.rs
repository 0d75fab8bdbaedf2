//! Webhook subscriptions and their deliveries: every matching event pushed
//! to an operator's URL in the Standard Webhooks format, durable and at
//! least once.

use chrono::{DateTime, Utc};

/// The event types a subscription may ask for, each with the stored event
/// kind it carries. The database's trigger reads the same pairs (see the
/// webhooks migration); a contract test holds the two together.
pub const WEBHOOK_TYPES: &[(&str, &str)] = &[
    ("run.started", "run_started"),
    ("run.progress", "run_progress"),
    ("run.finished", "run_finished"),
    ("run.missed", "run_missed"),
    ("run.receipts", "run_receipts"),
    ("run.poll", "run_poll"),
    ("run.recall_started", "run_recall_started"),
    ("run.recall_finished", "run_recall_finished"),
    ("run.edit_started", "run_edit_started"),
    ("run.edit_finished", "run_edit_finished"),
    ("account.state_changed", "account_state"),
    ("account.standing", "account_standing"),
    ("reminder.failed_to_fire", "reminder_failed_to_fire"),
];

/// The type a test delivery carries (`POST /v1/webhooks/{id}/ping`).
pub const PING_TYPE: &str = "webhook.ping";

pub fn webhook_type_names() -> &'static [&'static str] {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| WEBHOOK_TYPES.iter().map(|(t, _)| *t).collect())
}

/// The webhook type of a stored event kind, if subscriptions can ask for it.
pub fn webhook_type_of(kind: &str) -> Option<&'static str> {
    WEBHOOK_TYPES
        .iter()
        .find(|(_, k)| *k == kind)
        .map(|(t, _)| *t)
}

/// At most this many secrets sign a delivery at once (the current one and
/// the previous ones still in their overlap): each is a signature in
/// `webhook-signature`, and a receiver's header limit is finite.
pub const MAX_SIGNING_SECRETS: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub id: i64,
    pub url: String,
    pub types: Vec<String>,
    pub description: String,
    pub enabled: bool,
    /// Why Herald disabled it (a receiver failing for too long).
    pub disabled_reason: Option<String>,
    /// `whsec_…`: signs every delivery.
    pub secret: String,
    /// Earlier secrets, newest first, each of which also signs until its
    /// own end (a rotation's overlap): a second rotation inside an overlap
    /// does not cut the first one's short.
    pub previous_secrets: Vec<PreviousSecret>,
    /// The first failed attempt since the last success.
    pub failing_since: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// A secret replaced by a rotation, still signing until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousSecret {
    pub secret: String,
    pub until: DateTime<Utc>,
}

impl Webhook {
    /// The secrets that sign at `now`: the current one, then each previous
    /// one whose overlap has not ended, newest first.
    pub fn signing_secrets(&self, now: DateTime<Utc>) -> Vec<&str> {
        let mut out = vec![self.secret.as_str()];
        out.extend(
            self.previous_secrets
                .iter()
                .filter(|p| now < p.until)
                .map(|p| p.secret.as_str()),
        );
        out
    }

    /// When the last previous secret still signing at `now` stops.
    pub fn overlap_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.previous_secrets
            .iter()
            .map(|p| p.until)
            .filter(|u| now < *u)
            .max()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWebhook {
    pub url: String,
    pub types: Vec<String>,
    pub description: String,
    pub enabled: bool,
    pub secret: String,
    pub created_at: DateTime<Utc>,
}

/// A change to a subscription; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookPatch {
    pub url: Option<String>,
    pub types: Option<Vec<String>>,
    pub description: Option<String>,
    /// Enabling clears the disabled reason and the failure streak.
    pub enabled: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    Pending,
    /// Waiting while its subscription is disabled: neither claimed nor
    /// sent; pending again when the subscription is enabled.
    Held,
    Delivered,
    Failed,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Held => "held",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => DeliveryStatus::Pending,
            "held" => DeliveryStatus::Held,
            "delivered" => DeliveryStatus::Delivered,
            "failed" => DeliveryStatus::Failed,
            _ => return None,
        })
    }
}

/// One event for one subscription, and how its attempts went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookDelivery {
    pub id: i64,
    pub webhook_id: i64,
    pub event_id: i64,
    pub event_type: String,
    pub status: DeliveryStatus,
    pub attempts: u32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// The receiver's HTTP status, when it answered.
    pub last_status: Option<u16>,
    /// A short excerpt of the answer, or why there was none.
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A delivery claimed for sending, with what it needs: the subscription
/// and the event it carries.
#[derive(Debug, Clone, PartialEq)]
pub struct DueDelivery {
    pub delivery: WebhookDelivery,
    pub webhook: Webhook,
    pub event: super::Event,
}

/// The deliveries waiting: what an operator's dashboard shows as the
/// webhook backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WebhookBacklog {
    /// Pending deliveries (due now or retrying later).
    pub pending: u64,
    /// When the oldest pending delivery that is due by now became due.
    pub oldest_due_at: Option<DateTime<Utc>>,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// A 2xx answer.
    Delivered { status: u16 },
    /// Failed; try again at `next_attempt_at`.
    Retry {
        status: Option<u16>,
        error: String,
        next_attempt_at: DateTime<Utc>,
    },
    /// Failed for the last time.
    GaveUp { status: Option<u16>, error: String },
}
