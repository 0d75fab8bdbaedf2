//! Account-level signals and the circuit breaker that makes an account
//! protect itself. WhatsApp warns before it bans (429 rate-overlimit, 463
//! reach-out time-lock, 479, a lock, a temporary ban); carrying on after
//! the first warning is what turns a warning into a ban. So each signal is
//! classified, counted (`herald_account_signals_total{account,signal}`),
//! and the serious ones pause the account's queue for a cool-down that
//! doubles while they repeat.

use crate::domain::AccountState;
use crate::ports::GatewayError;
use chrono::{DateTime, Utc};
use std::collections::VecDeque;
use std::time::Duration;

/// One account-level signal. `label` is the metric's bounded label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccountSignal {
    /// A single 429: the bucket backs off; no pause.
    RateLimit,
    /// Rate limits that keep coming despite the back-off.
    RateLimitRepeated,
    /// 463: WhatsApp's reach-out time-lock (new chats refused for a while);
    /// like 429 and 479, only repeats pause the account.
    ReachOutLocked,
    /// 479: the server refuses the account's messages; it also comes back
    /// on a single message, so only repeats (as for 429) pause the account.
    Refused479,
    /// Another account-level refusal code.
    Restricted,
    /// A temporary ban, with WhatsApp's expiry.
    TemporaryBan,
    /// The session ended: pair again.
    LoggedOut,
    /// WhatsApp locked the account (403, AccountLocked): logged out too,
    /// and an incident, since it follows how the account was used.
    AccountLocked,
    /// Sends keep failing without an answer that names the group.
    RepeatedFailures,
}

impl AccountSignal {
    pub const ALL: [AccountSignal; 9] = [
        Self::RateLimit,
        Self::RateLimitRepeated,
        Self::ReachOutLocked,
        Self::Refused479,
        Self::Restricted,
        Self::TemporaryBan,
        Self::LoggedOut,
        Self::AccountLocked,
        Self::RepeatedFailures,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::RateLimit => "rate_limit",
            Self::RateLimitRepeated => "rate_limit_repeated",
            Self::ReachOutLocked => "reach_out_locked_463",
            Self::Refused479 => "refused_479",
            Self::Restricted => "restricted",
            Self::TemporaryBan => "temporary_ban",
            Self::LoggedOut => "logged_out",
            Self::AccountLocked => "account_locked",
            Self::RepeatedFailures => "repeated_failures",
        }
    }

    /// What an operator reads.
    pub fn describe(self) -> &'static str {
        match self {
            Self::RateLimit => "WhatsApp answered rate-overlimit (429)",
            Self::RateLimitRepeated => {
                "WhatsApp kept answering rate-overlimit (429) despite the back-off"
            }
            Self::ReachOutLocked => "WhatsApp kept time-locking the account's reach-out (463)",
            Self::Refused479 => "WhatsApp kept refusing the account's messages (479)",
            Self::Restricted => "WhatsApp restricted the account",
            Self::TemporaryBan => "WhatsApp temporarily banned the account",
            Self::LoggedOut => "WhatsApp logged the account out",
            Self::AccountLocked => "WhatsApp locked the account (403)",
            Self::RepeatedFailures => "sends kept failing",
        }
    }

    /// The signal a gateway answer carries, if it is about the account.
    pub fn of(e: &GatewayError) -> Option<Self> {
        Some(match e {
            GatewayError::RateLimited { .. } => Self::RateLimit,
            GatewayError::Restricted { code: 463, .. } => Self::ReachOutLocked,
            GatewayError::Restricted { code: 479, .. } => Self::Refused479,
            GatewayError::Restricted { .. } => Self::Restricted,
            GatewayError::Banned { .. } => Self::TemporaryBan,
            GatewayError::LoggedOut => Self::LoggedOut,
            _ => return None,
        })
    }

    /// The first cool-down of a signal that pauses the account (`None`:
    /// no pause of our own — a single rate limit only slows the bucket; a
    /// ban carries WhatsApp's expiry; a logout waits for pairing).
    pub fn base_cooldown(self) -> Option<Duration> {
        let min = |m: u64| Some(Duration::from_secs(m * 60));
        match self {
            Self::RateLimitRepeated => min(15),
            Self::ReachOutLocked => min(60),
            Self::Refused479 => min(30),
            Self::Restricted => min(30),
            Self::RepeatedFailures => min(5),
            Self::RateLimit | Self::TemporaryBan | Self::LoggedOut | Self::AccountLocked => None,
        }
    }
}

/// The breaker's thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// This many rate limits, 463s or 479s within `rate_limit_window` trip
    /// a cool-down.
    pub rate_limit_trip: u32,
    pub rate_limit_window: Duration,
    /// This many failed sends in a row (no success between) trip one.
    pub failure_trip: u32,
    /// A cool-down doubles for each earlier one within this memory.
    pub memory: Duration,
    pub max_cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            rate_limit_trip: 3,
            rate_limit_window: Duration::from_secs(600),
            failure_trip: 10,
            memory: Duration::from_secs(24 * 3600),
            max_cooldown: Duration::from_secs(24 * 3600),
        }
    }
}

/// One account's breaker: lives with its actor, across runs.
#[derive(Debug, Clone, Default)]
pub struct Breaker {
    rate_limits: VecDeque<DateTime<Utc>>,
    failures_in_row: u32,
    /// When earlier cool-downs began, for the escalation.
    trips: VecDeque<DateTime<Utc>>,
}

impl Breaker {
    /// A rate limit: whether it trips a cool-down.
    pub fn rate_limited(&mut self, cfg: &BreakerConfig, now: DateTime<Utc>) -> bool {
        let window = chrono::Duration::from_std(cfg.rate_limit_window).unwrap_or_default();
        while self.rate_limits.front().is_some_and(|t| *t <= now - window) {
            self.rate_limits.pop_front();
        }
        self.rate_limits.push_back(now);
        self.rate_limits.len() >= cfg.rate_limit_trip as usize
    }

    /// A failed send (not about the group): whether it trips a cool-down.
    pub fn failed(&mut self, cfg: &BreakerConfig) -> bool {
        self.failures_in_row += 1;
        self.failures_in_row >= cfg.failure_trip
    }

    pub fn succeeded(&mut self) {
        self.failures_in_row = 0;
    }

    /// Opens the breaker for `signal`: the cool-down, doubled for each
    /// cool-down of the last `memory`, capped; and which strike this is.
    pub fn trip(
        &mut self,
        cfg: &BreakerConfig,
        signal: AccountSignal,
        now: DateTime<Utc>,
    ) -> (Duration, u32) {
        let memory = chrono::Duration::from_std(cfg.memory).unwrap_or_default();
        while self.trips.front().is_some_and(|t| *t <= now - memory) {
            self.trips.pop_front();
        }
        let earlier = self.trips.len() as u32;
        self.trips.push_back(now);
        self.rate_limits.clear();
        self.failures_in_row = 0;
        let base = signal
            .base_cooldown()
            .unwrap_or(Duration::from_secs(15 * 60));
        let d = base
            .saturating_mul(1u32 << earlier.min(16))
            .min(cfg.max_cooldown);
        (d, earlier + 1)
    }
}

/// The account state a cool-down puts the account in.
pub const COOLING_DOWN: AccountState = AccountState::CoolingDown;

#[cfg(test)]
mod tests {
    use super::*;

    fn t(min: i64) -> DateTime<Utc> {
        "2026-11-23T01:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::Duration::minutes(min)
    }

    #[test]
    fn every_account_answer_is_classified() {
        let cases = [
            (
                GatewayError::RateLimited { retry_after: None },
                AccountSignal::RateLimit,
            ),
            (
                GatewayError::Restricted {
                    code: 463,
                    retry_after: None,
                },
                AccountSignal::ReachOutLocked,
            ),
            (
                GatewayError::Restricted {
                    code: 479,
                    retry_after: None,
                },
                AccountSignal::Refused479,
            ),
            (
                GatewayError::Restricted {
                    code: 500,
                    retry_after: None,
                },
                AccountSignal::Restricted,
            ),
            (
                GatewayError::Banned { until: None },
                AccountSignal::TemporaryBan,
            ),
            (GatewayError::LoggedOut, AccountSignal::LoggedOut),
        ];
        for (e, s) in cases {
            assert_eq!(AccountSignal::of(&e), Some(s), "{e}");
        }
        assert_eq!(AccountSignal::of(&GatewayError::GroupNotFound), None);
        assert_eq!(
            AccountSignal::of(&GatewayError::Transient("x".into())),
            None
        );
        let labels: std::collections::HashSet<_> =
            AccountSignal::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(
            labels.len(),
            AccountSignal::ALL.len(),
            "labels are distinct"
        );
    }

    #[test]
    fn rate_limits_trip_only_when_they_repeat() {
        let cfg = BreakerConfig::default();
        let mut b = Breaker::default();
        assert!(!b.rate_limited(&cfg, t(0)));
        assert!(!b.rate_limited(&cfg, t(1)));
        // Both have left the ten-minute window by then.
        assert!(!b.rate_limited(&cfg, t(11)));
        assert!(!b.rate_limited(&cfg, t(12)));
        assert!(b.rate_limited(&cfg, t(13)));
    }

    #[test]
    fn failures_trip_in_a_row_only() {
        let cfg = BreakerConfig::default();
        let mut b = Breaker::default();
        for _ in 0..9 {
            assert!(!b.failed(&cfg));
        }
        b.succeeded();
        for _ in 0..9 {
            assert!(!b.failed(&cfg));
        }
        assert!(b.failed(&cfg));
    }

    #[test]
    fn cool_downs_escalate_while_they_repeat_and_reset_after_a_quiet_day() {
        let cfg = BreakerConfig::default();
        let mut b = Breaker::default();
        let s = AccountSignal::Refused479;
        assert_eq!(b.trip(&cfg, s, t(0)), (Duration::from_secs(1800), 1));
        assert_eq!(b.trip(&cfg, s, t(60)), (Duration::from_secs(3600), 2));
        assert_eq!(b.trip(&cfg, s, t(180)), (Duration::from_secs(7200), 3));
        for i in 0..10 {
            b.trip(&cfg, s, t(200 + i));
        }
        assert_eq!(b.trip(&cfg, s, t(300)).0, cfg.max_cooldown);
        // A day and more later: back to the first step.
        assert_eq!(b.trip(&cfg, s, t(300 + 24 * 60 + 1)).1, 1);
    }
}
