//! What crosses the wire between `herald simulator serve`
//! ([`super::sim_server`]) and its client [`super::remote_sim::RemoteSimulator`]:
//! the JSON bodies of the shared simulator's API, and [`WireError`], every
//! [`GatewayError`] as JSON, converted both ways without loss.

use chrono::{DateTime, Utc};
use herald_actors::domain::Fence;
use herald_actors::domain::{AccountId, GroupInfo, GroupJid, UploadHandle};
use herald_actors::ports::{GatewayError, OutgoingMessage};
use herald_actors::simulator::{AccountStats, Delivery};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A [`GatewayError`] on the wire, tagged by `kind`. Durations are serde's
/// `{"secs", "nanos"}`, times RFC 3339 with nanoseconds: nothing is rounded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WireError {
    RateLimited {
        retry_after: Option<Duration>,
    },
    Transient {
        reason: String,
    },
    GroupNotFound,
    NotParticipant,
    NotAllowed,
    LoggedOut,
    Banned {
        until: Option<DateTime<Utc>>,
    },
    Restricted {
        code: u16,
        retry_after: Option<Duration>,
    },
    MediaExpired,
    Unreachable {
        reason: String,
    },
    Unsupported {
        reason: String,
    },
    Fenced {
        sent: i64,
        seen: i64,
    },
    LeaseEnded {
        reason: String,
    },
}

impl From<GatewayError> for WireError {
    fn from(e: GatewayError) -> Self {
        match e {
            GatewayError::RateLimited { retry_after } => Self::RateLimited { retry_after },
            GatewayError::Transient(reason) => Self::Transient { reason },
            GatewayError::GroupNotFound => Self::GroupNotFound,
            GatewayError::NotParticipant => Self::NotParticipant,
            GatewayError::NotAllowed => Self::NotAllowed,
            GatewayError::LoggedOut => Self::LoggedOut,
            GatewayError::Banned { until } => Self::Banned { until },
            GatewayError::Restricted { code, retry_after } => {
                Self::Restricted { code, retry_after }
            }
            GatewayError::MediaExpired => Self::MediaExpired,
            GatewayError::Unreachable(reason) => Self::Unreachable { reason },
            GatewayError::Unsupported(reason) => Self::Unsupported {
                reason: reason.to_owned(),
            },
            GatewayError::Fenced { sent, seen } => Self::Fenced { sent, seen },
            GatewayError::LeaseEnded(reason) => Self::LeaseEnded { reason },
        }
    }
}

impl From<WireError> for GatewayError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::RateLimited { retry_after } => Self::RateLimited { retry_after },
            WireError::Transient { reason } => Self::Transient(reason),
            WireError::GroupNotFound => Self::GroupNotFound,
            WireError::NotParticipant => Self::NotParticipant,
            WireError::NotAllowed => Self::NotAllowed,
            WireError::LoggedOut => Self::LoggedOut,
            WireError::Banned { until } => Self::Banned { until },
            WireError::Restricted { code, retry_after } => Self::Restricted { code, retry_after },
            WireError::MediaExpired => Self::MediaExpired,
            WireError::Unreachable { reason } => Self::Unreachable(reason),
            WireError::Unsupported { reason } => Self::Unsupported(intern(reason)),
            WireError::Fenced { sent, seen } => Self::Fenced { sent, seen },
            WireError::LeaseEnded { reason } => Self::LeaseEnded(reason),
        }
    }
}

/// `GatewayError::Unsupported` carries a `&'static str`. Each distinct
/// reason is leaked once and reused, so a server repeating a reason costs
/// nothing more (there are a handful of such texts in Herald).
fn intern(s: String) -> &'static str {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(known) = seen.get(s.as_str()) {
        return known;
    }
    let leaked: &'static str = Box::leak(s.into_boxed_str());
    seen.insert(leaked);
    leaked
}

/// The body of every refusal: the error, and its text for people.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: WireError,
    #[serde(default)]
    pub message: String,
}

impl ErrorBody {
    pub fn of(e: GatewayError) -> Self {
        Self {
            message: e.to_string(),
            error: e.into(),
        }
    }
}

/// `PUT /accounts/{account}`: pair the account as a member of `groups`
/// numbered groups (the server's `--groups-per-account` when absent).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    #[serde(default)]
    pub groups: Option<usize>,
}

/// The answer to a registration: how many groups the account has, and
/// whether this request paired it (`false`: it was known and left as it was).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub account: AccountId,
    pub groups: usize,
    pub created: bool,
}

/// A message as [`OutgoingMessage`], tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WireMessage {
    Text {
        text: String,
    },
    Media {
        upload: UploadHandle,
        mime: String,
        caption: Option<String>,
    },
    Poll {
        question: String,
        options: Vec<String>,
        multiple: bool,
    },
    Revoke {
        of: String,
    },
    Edit {
        of: String,
        text: String,
    },
}

impl From<&OutgoingMessage> for WireMessage {
    fn from(m: &OutgoingMessage) -> Self {
        match m {
            OutgoingMessage::Text(text) => Self::Text { text: text.clone() },
            OutgoingMessage::Media {
                upload,
                mime,
                caption,
            } => Self::Media {
                upload: upload.clone(),
                mime: mime.clone(),
                caption: caption.clone(),
            },
            OutgoingMessage::Poll {
                question,
                options,
                multiple,
            } => Self::Poll {
                question: question.clone(),
                options: options.clone(),
                multiple: *multiple,
            },
            OutgoingMessage::Revoke { of } => Self::Revoke { of: of.clone() },
            OutgoingMessage::Edit { of, text } => Self::Edit {
                of: of.clone(),
                text: text.clone(),
            },
        }
    }
}

impl From<WireMessage> for OutgoingMessage {
    fn from(m: WireMessage) -> Self {
        match m {
            WireMessage::Text { text } => Self::Text(text),
            WireMessage::Media {
                upload,
                mime,
                caption,
            } => Self::Media {
                upload,
                mime,
                caption,
            },
            WireMessage::Poll {
                question,
                options,
                multiple,
            } => Self::Poll {
                question,
                options,
                multiple,
            },
            WireMessage::Revoke { of } => Self::Revoke { of },
            WireMessage::Edit { of, text } => Self::Edit { of, text },
        }
    }
}

/// `POST /accounts/{account}/send`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    pub group: GroupJid,
    pub message_id: String,
    pub message: WireMessage,
    /// The sender's lease (several daemons); `null` for a single daemon.
    #[serde(default)]
    pub fence: Option<Fence>,
}

/// The answer to a send WhatsApp accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendAnswer {
    /// The message id had been accepted before: not delivered again.
    pub duplicate: bool,
}

/// `POST /accounts/{account}/typing`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypingRequest {
    pub group: GroupJid,
    /// How long the presence is shown, in milliseconds.
    pub for_ms: u64,
}

/// One group of `GET /accounts/{account}/groups`, as [`GroupInfo`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGroup {
    pub jid: GroupJid,
    pub subject: String,
    pub participants: u32,
    pub announce: bool,
    pub is_admin: bool,
    pub community: Option<GroupJid>,
}

impl From<GroupInfo> for WireGroup {
    fn from(g: GroupInfo) -> Self {
        Self {
            jid: g.jid,
            subject: g.subject,
            participants: g.participants,
            announce: g.announce,
            is_admin: g.is_admin,
            community: g.community,
        }
    }
}

impl From<WireGroup> for GroupInfo {
    fn from(g: WireGroup) -> Self {
        Self {
            jid: g.jid,
            subject: g.subject,
            participants: g.participants,
            announce: g.announce,
            is_admin: g.is_admin,
            community: g.community,
        }
    }
}

/// `GET /deliveries`: a page in acceptance order; pass `next_after` back
/// as `after` for the next one (`null` on the last page).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryPage {
    /// Each as a line of the simulator's journal ([`herald_actors::simulator::DeliveryRecord`]).
    pub items: Vec<Delivery>,
    pub next_after: Option<u64>,
}

/// `GET /accounts/{account}`: what the simulator knows of one account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountReport {
    pub account: AccountId,
    /// Registered with this server process (and so a member of its groups).
    pub registered: bool,
    pub groups: usize,
    pub delivered: u64,
    pub dedup_hits: u64,
    pub duplicate_deliveries: u64,
    pub rate_limited: u64,
    pub bans: u64,
    pub transient_failures: u64,
    pub uploads: u64,
    pub upload_bytes: u64,
    pub typing: u64,
    pub warnings: u64,
    pub fenced: u64,
    /// The newest lease epoch a fenced send has carried.
    pub fence_epoch: Option<i64>,
    /// The most deliveries in any 60-second window.
    pub max_in_any_60s: usize,
}

impl AccountReport {
    pub fn new(account: AccountId, registered: Option<usize>, s: AccountStats) -> Self {
        Self {
            account,
            registered: registered.is_some(),
            groups: registered.unwrap_or(0),
            delivered: s.delivered,
            dedup_hits: s.dedup_hits,
            duplicate_deliveries: s.duplicate_deliveries,
            rate_limited: s.rate_limited,
            bans: s.bans,
            transient_failures: s.transient_failures,
            uploads: s.uploads,
            upload_bytes: s.upload_bytes,
            typing: s.typing,
            warnings: s.warnings,
            fenced: s.fenced,
            fence_epoch: None,
            max_in_any_60s: 0,
        }
    }
}

/// `GET /health`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub accounts: usize,
    pub delivered: u64,
    pub duplicate_deliveries: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each variant; `variant` below fails to compile when a new
    /// one is added, so this list cannot silently fall behind.
    fn every_variant() -> Vec<GatewayError> {
        let until: DateTime<Utc> = "2026-05-11T01:02:03.123456789Z".parse().unwrap();
        vec![
            GatewayError::RateLimited {
                retry_after: Some(Duration::new(7, 123_456_789)),
            },
            GatewayError::RateLimited { retry_after: None },
            GatewayError::Transient("socket closed".into()),
            GatewayError::GroupNotFound,
            GatewayError::NotParticipant,
            GatewayError::NotAllowed,
            GatewayError::LoggedOut,
            GatewayError::Banned { until: Some(until) },
            GatewayError::Banned { until: None },
            GatewayError::Restricted {
                code: 463,
                retry_after: Some(Duration::from_nanos(1)),
            },
            GatewayError::Restricted {
                code: 479,
                retry_after: None,
            },
            GatewayError::MediaExpired,
            GatewayError::Unreachable("connection refused".into()),
            GatewayError::Unsupported("this gateway cannot list an account's groups"),
            GatewayError::Fenced { sent: 4, seen: 5 },
            GatewayError::LeaseEnded("daemon n1 no longer holds the lease".into()),
        ]
    }

    fn variant(e: &GatewayError) -> usize {
        match e {
            GatewayError::RateLimited { .. } => 0,
            GatewayError::Transient(_) => 1,
            GatewayError::GroupNotFound => 2,
            GatewayError::NotParticipant => 3,
            GatewayError::NotAllowed => 4,
            GatewayError::LoggedOut => 5,
            GatewayError::Banned { .. } => 6,
            GatewayError::Restricted { .. } => 7,
            GatewayError::MediaExpired => 8,
            GatewayError::Unreachable(_) => 9,
            GatewayError::Unsupported(_) => 10,
            GatewayError::Fenced { .. } => 11,
            GatewayError::LeaseEnded(_) => 12,
        }
    }

    #[test]
    fn every_gateway_error_round_trips_through_json_unchanged() {
        let all = every_variant();
        let covered: std::collections::BTreeSet<usize> = all.iter().map(variant).collect();
        assert_eq!(covered.len(), 13, "every variant is in the list");
        let mut kinds = std::collections::HashSet::new();
        for e in all {
            let text = serde_json::to_string(&ErrorBody::of(e.clone())).unwrap();
            let body: ErrorBody = serde_json::from_str(&text).unwrap();
            assert_eq!(body.message, e.to_string(), "{text}");
            let back = GatewayError::from(body.error);
            assert_eq!(back, e, "{text}");
            assert_eq!(back.to_string(), e.to_string());
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            kinds.insert(v["error"]["kind"].as_str().unwrap().to_owned());
        }
        assert_eq!(kinds.len(), 13, "one kind tag per variant: {kinds:?}");
    }

    #[test]
    fn an_unsupported_reason_is_interned_not_leaked_again() {
        let a = GatewayError::from(WireError::Unsupported {
            reason: "no presences here".into(),
        });
        let b = GatewayError::from(WireError::Unsupported {
            reason: "no presences here".into(),
        });
        let (GatewayError::Unsupported(a), GatewayError::Unsupported(b)) = (a, b) else {
            panic!("not Unsupported");
        };
        assert_eq!(a.as_ptr(), b.as_ptr(), "the same leaked text");
    }

    #[test]
    fn the_wire_names_are_stable() {
        let e = WireError::from(GatewayError::RateLimited {
            retry_after: Some(Duration::from_secs(10)),
        });
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"kind": "rate_limited", "retry_after": {"secs": 10, "nanos": 0}})
        );
        let m = WireMessage::from(&OutgoingMessage::Text("hi".into()));
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({"kind": "text", "text": "hi"})
        );
    }
}
