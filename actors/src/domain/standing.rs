//! What WhatsApp says of an account: its standing. Two readings, each with
//! when it was taken:
//!
//! - the reach-out time-lock (WhatsApp Web's `FetchReachoutTimelock`):
//!   whether the account may start new chats, and until when it may not.
//!   A 463 on a send is WhatsApp applying it; its end is WhatsApp's, not a
//!   guess.
//! - the new-chat quota (`FetchNewChatMessageCappingInfo`): how many
//!   messages to new individual chats the account may send this cycle,
//!   with WhatsApp's warnings before it caps them. It counts chats with
//!   people the account never wrote to, not group messages.
//!
//! A reading the client could not take or decode (an unknown document id,
//! a malformed answer) is `Unknown`: shown, never a reason to stop sending.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One reading of a part of the standing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(tag = "reading", rename_all = "snake_case")]
#[schemars(rename = "{T}Reading")]
pub enum Reading<T> {
    /// Not read yet (or the gateway cannot read it: the simulator's
    /// accounts have no quota).
    #[default]
    Never,
    /// What WhatsApp answered.
    Known {
        #[serde(flatten)]
        value: T,
        read_at: DateTime<Utc>,
    },
    /// The question could not be asked or its answer not decoded.
    Unknown { why: String, read_at: DateTime<Utc> },
}

impl<T> Reading<T> {
    pub fn known(&self) -> Option<&T> {
        match self {
            Reading::Known { value, .. } => Some(value),
            _ => None,
        }
    }

    pub fn read_at(&self) -> Option<DateTime<Utc>> {
        match self {
            Reading::Never => None,
            Reading::Known { read_at, .. } | Reading::Unknown { read_at, .. } => Some(*read_at),
        }
    }

    /// The same reading apart from when it was taken.
    pub fn same_as(&self, other: &Self) -> bool
    where
        T: PartialEq,
    {
        match (self, other) {
            (Reading::Never, Reading::Never) => true,
            (Reading::Known { value: a, .. }, Reading::Known { value: b, .. }) => a == b,
            (Reading::Unknown { why: a, .. }, Reading::Unknown { why: b, .. }) => a == b,
            _ => false,
        }
    }
}

/// The reach-out time-lock as WhatsApp gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TimeLock {
    pub active: bool,
    /// When the lock ends, as WhatsApp gave it (`None`: no end given).
    pub until: Option<DateTime<Utc>>,
    /// WhatsApp's enforcement type (`DEFAULT`, …), as it named it.
    pub kind: Option<String>,
}

impl TimeLock {
    /// The lock holds at `now`: active, and not past the end WhatsApp gave.
    pub fn holds_at(&self, now: DateTime<Utc>) -> bool {
        self.active && self.until.is_none_or(|u| u > now)
    }
}

/// Where the account stands against its new-chat quota.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum QuotaStatus {
    None,
    FirstWarning,
    SecondWarning,
    Capped,
}

impl QuotaStatus {
    pub const ALL: [QuotaStatus; 4] = [
        Self::None,
        Self::FirstWarning,
        Self::SecondWarning,
        Self::Capped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::FirstWarning => "first_warning",
            Self::SecondWarning => "second_warning",
            Self::Capped => "capped",
        }
    }

    /// WhatsApp's spelling (`NONE`, `FIRST_WARNING`, `SECOND_WARNING`,
    /// `CAPPED`), case-insensitively.
    pub fn from_whatsapp(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|q| q.as_str().eq_ignore_ascii_case(s))
    }

    /// A warning the operator must see (the second, or the cap).
    pub fn needs_attention(self) -> bool {
        self >= Self::SecondWarning
    }
}

/// The new-chat quota of the current cycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NewChatQuota {
    pub status: QuotaStatus,
    pub used: Option<u64>,
    pub total: Option<u64>,
    pub cycle_start: Option<DateTime<Utc>>,
    pub cycle_end: Option<DateTime<Utc>>,
}

/// What WhatsApp last said of an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub struct Standing {
    pub timelock: Reading<TimeLock>,
    pub quota: Reading<NewChatQuota>,
}

impl Standing {
    /// The time-lock's end if a lock is known to hold at `now`.
    pub fn locked_until(&self, now: DateTime<Utc>) -> Option<Option<DateTime<Utc>>> {
        self.timelock
            .known()
            .filter(|l| l.holds_at(now))
            .map(|l| l.until)
    }

    /// Something an operator must look at: a lock that holds, or a quota
    /// at its second warning or capped.
    pub fn needs_attention(&self, now: DateTime<Utc>) -> bool {
        self.locked_until(now).is_some()
            || self
                .quota
                .known()
                .is_some_and(|q| q.status.needs_attention())
    }

    /// The same standing apart from when it was read: what a change
    /// (an event, a webhook) is about.
    pub fn same_as(&self, other: &Standing) -> bool {
        self.timelock.same_as(&other.timelock) && self.quota.same_as(&other.quota)
    }

    /// What an operator must look at, in a few words (`None`: nothing):
    /// a lock that holds, a quota at its second warning or capped.
    pub fn attention(&self, now: DateTime<Utc>) -> Option<String> {
        let mut out = Vec::new();
        if let Some(until) = self.locked_until(now) {
            out.push(match until {
                Some(u) => format!(
                    "time-locked by WhatsApp until {}",
                    u.format("%Y-%m-%d %H:%M UTC")
                ),
                None => "time-locked by WhatsApp".to_owned(),
            });
        }
        if let Some(q) = self.quota.known().filter(|q| q.status.needs_attention()) {
            let counts = match (q.used, q.total) {
                (Some(u), Some(t)) => format!(" ({u} of {t} used)"),
                _ => String::new(),
            };
            out.push(format!(
                "new-chat quota {}{counts}",
                q.status.as_str().replace('_', " ")
            ));
        }
        (!out.is_empty()).then(|| out.join("; "))
    }

    /// A sentence for a refusal or a forecast.
    pub fn describe_lock(until: Option<DateTime<Utc>>, tz: chrono_tz::Tz) -> String {
        match until {
            Some(u) => format!(
                "WhatsApp time-locked this account's reach-out until {}",
                u.with_timezone(&tz).format("%Y-%m-%d %H:%M %Z")
            ),
            None => "WhatsApp time-locked this account's reach-out, with no end given".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_lock_holds_until_its_end_and_attention_follows_it() {
        let lock = TimeLock {
            active: true,
            until: Some(at("2026-11-28T06:20:00Z")),
            kind: Some("DEFAULT".into()),
        };
        let s = Standing {
            timelock: Reading::Known {
                value: lock.clone(),
                read_at: at("2026-11-28T05:00:00Z"),
            },
            quota: Reading::Never,
        };
        assert_eq!(
            s.locked_until(at("2026-11-28T06:00:00Z")),
            Some(Some(at("2026-11-28T06:20:00Z")))
        );
        assert!(s.needs_attention(at("2026-11-28T06:00:00Z")));
        assert_eq!(s.locked_until(at("2026-11-28T06:20:00Z")), None);
        assert!(!s.needs_attention(at("2026-11-28T06:21:00Z")));
        let inactive = TimeLock {
            active: false,
            ..lock
        };
        assert!(!inactive.holds_at(at("2026-11-28T06:00:00Z")));
    }

    #[test]
    fn quota_statuses_read_whatsapps_spelling_and_round_trip() {
        for (w, q) in [
            ("NONE", QuotaStatus::None),
            ("FIRST_WARNING", QuotaStatus::FirstWarning),
            ("second_warning", QuotaStatus::SecondWarning),
            ("CAPPED", QuotaStatus::Capped),
        ] {
            assert_eq!(QuotaStatus::from_whatsapp(w), Some(q));
        }
        assert_eq!(QuotaStatus::from_whatsapp("SOMETHING_NEW"), None);
        assert!(QuotaStatus::SecondWarning.needs_attention());
        assert!(!QuotaStatus::FirstWarning.needs_attention());
        let s = Standing {
            timelock: Reading::Unknown {
                why: "unknown document".into(),
                read_at: at("2026-11-28T05:00:00Z"),
            },
            quota: Reading::Known {
                value: NewChatQuota {
                    status: QuotaStatus::FirstWarning,
                    used: Some(40),
                    total: Some(50),
                    cycle_start: Some(at("2026-11-27T00:00:00Z")),
                    cycle_end: Some(at("2026-11-28T00:00:00Z")),
                },
                read_at: at("2026-11-28T05:00:00Z"),
            },
        };
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains("\"reading\":\"known\""), "{text}");
        assert!(text.contains("\"status\":\"first_warning\""), "{text}");
        let back: Standing = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        let mut later = s.clone();
        later.quota = match later.quota {
            Reading::Known { value, .. } => Reading::Known {
                value,
                read_at: at("2026-11-28T06:00:00Z"),
            },
            r => r,
        };
        assert!(later.same_as(&s), "only the read time moved");
        assert_eq!(
            serde_json::to_string(&Standing::default()).unwrap(),
            r#"{"timelock":{"reading":"never"},"quota":{"reading":"never"}}"#
        );
    }
}
