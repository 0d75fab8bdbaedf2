//! Stored records and the states they move through.

use super::{AccountId, GroupJid, MediaId, NewReminder, RunId, Schedule, TimeZone, WindowHours};
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Declares a string-backed state enum with `as_str`, `FromStr` and serde.
macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The wire names, in `ALL`'s order (the API document's enum).
            pub const NAMES: &'static [&'static str] = &[$($s),+];
            pub fn as_str(&self) -> &'static str {
                match self { $($name::$variant => $s),+ }
            }
        }

        impl FromStr for $name {
            type Err = super::ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($s => Ok($name::$variant),)+
                    _ => Err(super::ValidationError::new(
                        stringify!($name),
                        format!("must be one of: {}", [$($s),+].join(", ")),
                    )),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum!(
    /// Which gateway an account sends through.
    GatewayKind { Simulator = "simulator", Whatsapp = "whatsapp" }
);

string_enum!(
    /// An account's connection state. Only `Connected` accounts send.
    /// `CoolingDown`: paused by its own circuit breaker after an
    /// account-level warning (repeated rate limits, 463, 479, failing
    /// sends); resumes by itself when the cool-down ends, or when enabled.
    AccountState {
        Pairing = "pairing",
        Connected = "connected",
        Disconnected = "disconnected",
        LoggedOut = "logged_out",
        Banned = "banned",
        Disabled = "disabled",
        CoolingDown = "cooling_down",
    }
);

string_enum!(
    ReminderState { Active = "active", Paused = "paused", Archived = "archived" }
);

string_enum!(
    /// A run's lifecycle (see `crate::lifecycle`). `Success`, `Partial`,
    /// `Failed`, `Cancelled` and `Missed` are final. `Paused` is the
    /// operator's; `Parked` waits for its next window (resume_next_window).
    RunStatus {
        Scheduled = "scheduled",
        Queued = "queued",
        Running = "running",
        Paused = "paused",
        Parked = "parked",
        Success = "success",
        Partial = "partial",
        Failed = "failed",
        Cancelled = "cancelled",
        Missed = "missed",
    }
);

string_enum!(
    /// One group of one run. `Sending` means the current part's message id
    /// is durably recorded and the gateway may or may not have it.
    TargetStatus {
        Pending = "pending",
        Sending = "sending",
        Sent = "sent",
        Failed = "failed",
        Skipped = "skipped",
    }
);

impl RunStatus {
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Self::Success | Self::Partial | Self::Failed | Self::Cancelled | Self::Missed
        )
    }
}

impl TargetStatus {
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Sent | Self::Failed | Self::Skipped)
    }
}

/// Per-account limits; `None` falls back to the daemon's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AccountLimits {
    pub max_per_minute: Option<u32>,
    pub group_concurrency: Option<u32>,
    /// Messages per local day (the account's timezone), enforced: a run
    /// that reaches it is deferred to the next local day.
    pub daily_cap: Option<u32>,
    /// Messages per local hour, enforced the same way.
    #[serde(default)]
    pub hourly_cap: Option<u32>,
    /// The account's timezone, for its days and hours; `None` counts in
    /// the timezone of the reminder being sent.
    #[serde(default)]
    pub timezone: Option<TimeZone>,
    /// The number is new to sending at volume: the daemon's warm-up ramp
    /// (`delivery.warmup`) holds it to rising daily ceilings.
    #[serde(default)]
    pub new_number: bool,
}

/// A paired (or pairing) WhatsApp account, or a simulated one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Account {
    pub id: AccountId,
    pub name: String,
    pub kind: GatewayKind,
    pub state: AccountState,
    pub state_reason: Option<String>,
    /// When the state ends by itself (a temporary ban, a cool-down).
    pub state_until: Option<DateTime<Utc>>,
    pub limits: AccountLimits,
    pub created_at: DateTime<Utc>,
    /// The last account-level signal (warning, rate limit, lock, ban):
    /// the warm-up ramp starts over from it.
    pub incident_at: Option<DateTime<Utc>>,
    /// What WhatsApp last said of the account (its reach-out time-lock and
    /// new-chat quota), kept so another daemon taking it over starts from
    /// it.
    #[serde(default)]
    pub standing: super::Standing,
}

impl Account {
    /// Day 0 of the warm-up ramp: pairing, or the last incident.
    pub fn ramp_start(&self) -> DateTime<Utc> {
        self.incident_at
            .map_or(self.created_at, |i| i.max(self.created_at))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[schemars(rename = "Media")]
pub struct MediaInfo {
    pub id: MediaId,
    pub mime: String,
    pub size: u64,
    pub filename: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A gateway's handle for media uploaded by one account, reusable until it
/// expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadHandle {
    pub handle: String,
    pub expires_at: DateTime<Utc>,
}

/// A stored reminder: what the operator asked for, its state and times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Reminder {
    pub id: i64,
    pub state: ReminderState,
    #[serde(flatten)]
    pub spec: NewReminder,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What the scheduler needs of a reminder to compute its due times: no
/// parts, no targets (a reminder may have thousands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReminderSchedule {
    pub id: i64,
    pub account_id: AccountId,
    pub state: ReminderState,
    pub timezone: TimeZone,
    pub schedule: Schedule,
    pub window: WindowHours,
    /// The reminder picks its groups with a selector.
    pub selects: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Grows with every write of the reminder, in the store's commit order
    /// (exactly on SQLite's single writer): a reconcile reads what changed
    /// after the highest version it has seen.
    pub version: i64,
    /// The newest `scheduled_for` of its runs: the scheduler's cursor.
    pub last_scheduled_for: Option<DateTime<Utc>>,
}

impl ReminderSchedule {
    /// The slim view of a full reminder (tests, the memory store).
    pub fn of(r: &Reminder, version: i64, last_scheduled_for: Option<DateTime<Utc>>) -> Self {
        Self {
            id: r.id,
            account_id: r.spec.account_id.clone(),
            state: r.state,
            timezone: r.spec.timezone,
            schedule: r.spec.schedule.clone(),
            window: r.spec.window,
            selects: r.spec.select.is_some(),
            created_at: r.created_at,
            updated_at: r.updated_at,
            version,
            last_scheduled_for,
        }
    }
}

/// A reminder in a list: everything but its parts and targets, which are
/// counted (a reminder may have 10,000 targets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ReminderSummary {
    pub id: i64,
    pub state: ReminderState,
    pub account_id: AccountId,
    pub title: String,
    pub timezone: TimeZone,
    pub schedule: Schedule,
    pub window: WindowHours,
    pub resume_next_window: bool,
    pub parts: u32,
    pub targets: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl ReminderSummary {
    pub fn of(r: &Reminder) -> Self {
        Self {
            id: r.id,
            state: r.state,
            account_id: r.spec.account_id.clone(),
            title: r.spec.title.clone(),
            timezone: r.spec.timezone,
            schedule: r.spec.schedule.clone(),
            window: r.spec.window,
            resume_next_window: r.spec.resume_next_window,
            parts: r.spec.parts.len() as u32,
            targets: r.spec.targets.len() as u32,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// What one [`crate::ports::Store::prune_runs`] batch deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedRuns {
    pub runs: u64,
    pub targets: u64,
}

/// Counts of a run's targets by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TargetCounts {
    pub pending: u32,
    pub sending: u32,
    pub sent: u32,
    pub failed: u32,
    pub skipped: u32,
}

impl TargetCounts {
    pub fn total(&self) -> u32 {
        self.pending + self.sending + self.sent + self.failed + self.skipped
    }

    pub fn add(&mut self, status: TargetStatus, n: u32) {
        match status {
            TargetStatus::Pending => self.pending += n,
            TargetStatus::Sending => self.sending += n,
            TargetStatus::Sent => self.sent += n,
            TargetStatus::Failed => self.failed += n,
            TargetStatus::Skipped => self.skipped += n,
        }
    }
}

/// One firing of a reminder: its groups' progress and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Run {
    pub id: RunId,
    pub reminder_id: i64,
    pub account_id: AccountId,
    pub scheduled_for: DateTime<Utc>,
    pub window_end_at: Option<DateTime<Utc>>,
    pub status: RunStatus,
    pub forecast: Option<String>,
    pub error_summary: Option<String>,
    pub counts: TargetCounts,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// When the operator asked a sending run to stop; a run that restarts
    /// with this set ends cancelled without sending.
    pub stop_requested_at: Option<DateTime<Utc>>,
}

/// One group of a run, with its progress through the reminder's parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RunTarget {
    pub id: i64,
    pub run_id: RunId,
    pub position: u32,
    pub group: GroupJid,
    pub status: TargetStatus,
    /// Parts already accepted by the gateway; parts go strictly in order.
    pub parts_sent: u32,
    /// The message id of the part in flight (status `sending`) or of the
    /// last part sent.
    pub message_id: Option<String>,
    pub attempts: u32,
    pub error: Option<String>,
    pub sent_at: Option<DateTime<Utc>>,
    pub latency_ms: Option<u32>,
    /// How the group was chosen: `explicit`, `all`, `label:<x>`, `name:<pattern>`.
    pub chosen_by: String,
    /// Who received and read it, as receipts said.
    // Read by `RunStore::list_targets`; zero wherever else a target is loaded.
    pub receipts: super::TargetReceipts,
}

/// One durable step of a run target, applied in batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// About to send `part` with `message_id`: must be durable before the send.
    Sending {
        target_id: i64,
        part: u32,
        message_id: String,
    },
    /// The gateway accepted `part`. `last` ends the target as `sent`.
    Sent {
        target_id: i64,
        part: u32,
        last: bool,
        at: DateTime<Utc>,
        latency_ms: u32,
    },
    Failed {
        target_id: i64,
        error: String,
    },
    Skipped {
        target_id: i64,
        reason: String,
    },
    /// Back to pending for a retry (keeps `parts_sent`).
    Requeue {
        target_id: i64,
    },
}

impl Transition {
    pub fn target_id(&self) -> i64 {
        match self {
            Self::Sending { target_id, .. }
            | Self::Sent { target_id, .. }
            | Self::Failed { target_id, .. }
            | Self::Skipped { target_id, .. }
            | Self::Requeue { target_id } => *target_id,
        }
    }
}

/// Something the control port's event stream reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Event {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub account_id: Option<String>,
    pub run_id: Option<i64>,
    pub data: serde_json::Value,
}

/// An event about to be stored (the store assigns `id`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewEvent {
    pub at: DateTime<Utc>,
    pub kind: &'static str,
    pub account_id: Option<AccountId>,
    pub run_id: Option<RunId>,
    pub data: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_text() {
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>().unwrap(), *s);
        }
        for s in TargetStatus::ALL {
            assert_eq!(s.as_str().parse::<TargetStatus>().unwrap(), *s);
        }
        for s in AccountState::ALL {
            assert_eq!(s.as_str().parse::<AccountState>().unwrap(), *s);
        }
        let err = "done".parse::<RunStatus>().unwrap_err();
        assert!(err.rule.contains("success"));
    }

    #[test]
    fn final_states() {
        assert!(RunStatus::Partial.is_final());
        assert!(!RunStatus::Paused.is_final());
        assert!(TargetStatus::Skipped.is_final());
        assert!(!TargetStatus::Sending.is_final());
    }
}

/// A console sign-in as stored: the session id only as its SHA-256 (hex),
/// so a copy of the database opens no session; the CSRF token its forms
/// carry; when it ends; who signed in, with which role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    pub id_hash: String,
    pub csrf: String,
    pub expires_at: DateTime<Utc>,
    /// The API user who signed in; `None` for the daemon's own token.
    /// Revoking the user ends the session.
    pub user_id: Option<i64>,
    pub user_name: String,
    pub role: super::Role,
    /// For a session of a built-in principal (the daemon's token, the
    /// open port): a mark of the token it was opened with, bound to the
    /// session's id, so a session opened under a rotated-out token is
    /// refused. `None` for a user's session.
    pub token_mark: Option<String>,
}
