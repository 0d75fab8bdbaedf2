//! The simulator's ban-risk model: what WhatsApp's anti-spam is reported
//! to punish beyond raw speed, so Herald's ban-safety can be tested and
//! compared. Each delivery is judged on four signs of a bot:
//!
//! - the same content to many groups within an hour (temporary-ban reason
//!   104, "sent the same message to too many people");
//! - machine-regular intervals between sends;
//! - sends with no typing presence before them;
//! - more sends in a day than the account's age allows (new numbers).
//!
//! A delivery showing any sign is an offence. The first offences are
//! warnings (answered as a rate limit, nothing delivered); one past
//! `warnings_before_ban` is a temporary ban. Offences closer together than
//! `strike_grace` count once, as WhatsApp judges behaviour, not each message.

use chrono::{DateTime, Utc};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// The knobs of the risk model.
#[derive(Debug, Clone, PartialEq)]
pub struct RiskModel {
    /// Identical content to this many sends within `identical_window` is an offence.
    pub identical_limit: u32,
    pub identical_window: Duration,
    /// Over the last `regular_sample` intervals, a coefficient of variation
    /// below `regular_cv` is an offence (0.05: within ±5 % of each other).
    pub regular_sample: usize,
    pub regular_cv: f64,
    /// More than `untyped_share` of the last `regular_sample` sends without
    /// a typing presence in the group within `typing_window` before them.
    pub untyped_share: f64,
    pub typing_window: Duration,
    /// Daily allowance by account age: (from day, sends per 24 h), ascending.
    pub allowance: Vec<(u32, u32)>,
    pub warnings_before_ban: u32,
    pub strike_grace: Duration,
    /// Strikes are forgotten after this long without an offence.
    pub strike_memory: Duration,
    pub ban_duration: Duration,
    /// Retry-after a warning carries.
    pub warning_retry: Duration,
}

impl Default for RiskModel {
    fn default() -> Self {
        Self {
            identical_limit: 100,
            identical_window: Duration::from_secs(3600),
            regular_sample: 20,
            regular_cv: 0.05,
            untyped_share: 0.9,
            typing_window: Duration::from_secs(30),
            allowance: vec![(0, 50), (3, 200), (7, 500), (14, 1500), (30, 5000)],
            warnings_before_ban: 2,
            strike_grace: Duration::from_secs(300),
            strike_memory: Duration::from_secs(24 * 3600),
            ban_duration: Duration::from_secs(24 * 3600),
            warning_retry: Duration::from_secs(60),
        }
    }
}

impl RiskModel {
    /// Sends per 24 h an account `age_days` old may make.
    pub fn allowance_at(&self, age_days: u32) -> u32 {
        self.allowance
            .iter()
            .take_while(|(from, _)| *from <= age_days)
            .last()
            .map_or(u32::MAX, |(_, n)| *n)
    }
}

/// One sign of a bot, as the risk model reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sign {
    IdenticalContent,
    RegularIntervals,
    NoTyping,
    OverAllowance,
}

impl Sign {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdenticalContent => "identical content to many groups within an hour",
            Self::RegularIntervals => "machine-regular intervals",
            Self::NoTyping => "no typing before sends",
            Self::OverAllowance => "volume above the account's age allowance",
        }
    }
}

impl Sign {
    /// The answer WhatsApp gives for it, as peers' trackers record them:
    /// too many sends for a young account time-locks its reach-out (463),
    /// the same content to many chats gets messages refused (479), and the
    /// rest is a plain rate-overlimit (429).
    fn code(self) -> u16 {
        match self {
            Self::OverAllowance => 463,
            Self::IdenticalContent => 479,
            Self::RegularIntervals | Self::NoTyping => 429,
        }
    }
}

/// How a warning about `signs` is answered: the most serious sign's code
/// (463 over 479 over 429), with `retry` as WhatsApp's "try again after".
pub fn warning_answer(signs: &[Sign], retry: std::time::Duration) -> crate::ports::GatewayError {
    use crate::ports::GatewayError;
    let code = signs
        .iter()
        .map(|s| s.code())
        .max_by_key(|c| match c {
            463 => 2,
            479 => 1,
            _ => 0,
        })
        .unwrap_or(429);
    if code == 429 {
        GatewayError::RateLimited {
            retry_after: Some(retry),
        }
    } else {
        GatewayError::Restricted {
            code,
            retry_after: Some(retry),
        }
    }
}

/// What the model decided on one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Fine,
    Warning(Vec<Sign>),
    Ban {
        until: DateTime<Utc>,
        signs: Vec<Sign>,
    },
}

/// One account's history as the model sees it.
#[derive(Debug, Clone, Default)]
pub struct RiskState {
    pub age_days: u32,
    content: HashMap<String, VecDeque<DateTime<Utc>>>,
    sends: VecDeque<(DateTime<Utc>, bool)>,
    day: VecDeque<DateTime<Utc>>,
    typing: HashMap<String, DateTime<Utc>>,
    strikes: u32,
    last_strike: Option<DateTime<Utc>>,
    /// Every warning and ban, for reports.
    pub log: Vec<(DateTime<Utc>, Verdict)>,
}

impl RiskState {
    pub fn new(age_days: u32) -> Self {
        Self {
            age_days,
            ..Self::default()
        }
    }

    /// A typing presence in `group` at `at`.
    pub fn typed(&mut self, group: &str, at: DateTime<Utc>) {
        self.typing.insert(group.to_owned(), at);
    }

    /// Judges a delivery about to be accepted; with `Fine` it is recorded.
    pub fn judge(
        &mut self,
        m: &RiskModel,
        group: &str,
        content_key: &str,
        now: DateTime<Utc>,
    ) -> Verdict {
        let typed = self
            .typing
            .get(group)
            .is_some_and(|t| (now - *t).to_std().is_ok_and(|ago| ago <= m.typing_window));
        let signs = self.signs(m, content_key, now, typed);
        if self
            .last_strike
            .is_some_and(|t| (now - t).to_std().is_ok_and(|d| d >= m.strike_memory))
        {
            self.strikes = 0;
        }
        let verdict = if signs.is_empty()
            || self
                .last_strike
                .is_some_and(|t| (now - t).to_std().is_ok_and(|d| d < m.strike_grace))
        {
            Verdict::Fine
        } else {
            self.strikes += 1;
            self.last_strike = Some(now);
            if self.strikes > m.warnings_before_ban {
                self.strikes = 0;
                Verdict::Ban {
                    until: now + chrono::Duration::from_std(m.ban_duration).unwrap_or_default(),
                    signs,
                }
            } else {
                Verdict::Warning(signs)
            }
        };
        if verdict == Verdict::Fine {
            self.record(m, content_key, now, typed);
        } else {
            self.log.push((now, verdict.clone()));
        }
        verdict
    }

    fn signs(&mut self, m: &RiskModel, key: &str, now: DateTime<Utc>, typed: bool) -> Vec<Sign> {
        let mut signs = Vec::new();
        let hour = chrono::Duration::from_std(m.identical_window).unwrap_or_default();
        if let Some(q) = self.content.get_mut(key) {
            while q.front().is_some_and(|t| *t <= now - hour) {
                q.pop_front();
            }
            if q.len() + 1 >= m.identical_limit as usize {
                signs.push(Sign::IdenticalContent);
            }
        }
        let n = m.regular_sample;
        if n >= 2 && self.sends.len() >= n {
            let times: Vec<f64> = self
                .sends
                .iter()
                .skip(self.sends.len() - n)
                .map(|(t, _)| t.timestamp_micros() as f64 / 1e6)
                .chain(std::iter::once(now.timestamp_micros() as f64 / 1e6))
                .collect();
            let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            if mean > 0.0 && var.sqrt() / mean < m.regular_cv {
                signs.push(Sign::RegularIntervals);
            }
            let untyped = self
                .sends
                .iter()
                .skip(self.sends.len() - n)
                .filter(|(_, typed)| !typed)
                .count()
                + usize::from(!typed);
            if untyped as f64 / (n + 1) as f64 > m.untyped_share {
                signs.push(Sign::NoTyping);
            }
        }
        let day = now - chrono::Duration::hours(24);
        while self.day.front().is_some_and(|t| *t <= day) {
            self.day.pop_front();
        }
        if self.day.len() as u64 >= u64::from(m.allowance_at(self.age_days)) {
            signs.push(Sign::OverAllowance);
        }
        signs
    }

    fn record(&mut self, m: &RiskModel, key: &str, now: DateTime<Utc>, typed: bool) {
        self.content
            .entry(key.to_owned())
            .or_default()
            .push_back(now);
        self.sends.push_back((now, typed));
        while self.sends.len() > m.regular_sample.max(2) {
            self.sends.pop_front();
        }
        self.day.push_back(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_answered_with_its_most_serious_signs_code() {
        use crate::ports::GatewayError;
        let retry = std::time::Duration::from_secs(60);
        let code = |signs: &[Sign]| match warning_answer(signs, retry) {
            GatewayError::RateLimited { retry_after } => {
                assert_eq!(retry_after, Some(retry));
                429
            }
            GatewayError::Restricted { code, retry_after } => {
                assert_eq!(retry_after, Some(retry));
                code
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(code(&[Sign::RegularIntervals, Sign::NoTyping]), 429);
        assert_eq!(code(&[Sign::NoTyping, Sign::IdenticalContent]), 479);
        assert_eq!(
            code(&[Sign::IdenticalContent, Sign::OverAllowance, Sign::NoTyping]),
            463
        );
    }

    fn t(s: f64) -> DateTime<Utc> {
        "2026-11-23T01:00:00Z".parse::<DateTime<Utc>>().unwrap()
            + chrono::Duration::microseconds((s * 1e6) as i64)
    }

    fn run(
        state: &mut RiskState,
        m: &RiskModel,
        n: usize,
        gap: impl Fn(usize) -> f64,
        same: bool,
        typing: bool,
    ) -> Vec<Verdict> {
        let mut at = 0.0;
        let mut out = Vec::new();
        for i in 0..n {
            at += gap(i);
            let g = format!("g{i}");
            if typing {
                state.typed(&g, t(at - 1.0));
            }
            let key = if same {
                "same".to_owned()
            } else {
                format!("k{i}")
            };
            let v = state.judge(m, &g, &key, t(at));
            if v != Verdict::Fine {
                let banned = matches!(v, Verdict::Ban { .. });
                out.push(v);
                if banned {
                    break;
                }
            }
        }
        out
    }

    #[test]
    fn identical_regular_untyped_sends_are_warned_then_banned() {
        let m = RiskModel::default();
        let mut s = RiskState::new(365);
        let verdicts = run(&mut s, &m, 1000, |_| 1.5, true, false);
        assert!(
            matches!(verdicts[0], Verdict::Warning(ref signs) if signs.contains(&Sign::RegularIntervals))
        );
        assert!(
            matches!(verdicts.last(), Some(Verdict::Ban { .. })),
            "{verdicts:?}"
        );
        assert_eq!(verdicts.len(), m.warnings_before_ban as usize + 1);
    }

    #[test]
    fn varied_jittered_typed_sends_are_fine() {
        let m = RiskModel::default();
        let mut s = RiskState::new(365);
        // A cheap stable jitter: gaps between 0.8 and 2.2 s.
        let verdicts = run(
            &mut s,
            &m,
            1000,
            |i| 0.8 + ((i * 7919) % 1000) as f64 / 714.0,
            false,
            true,
        );
        assert!(verdicts.is_empty(), "{verdicts:?}");
    }

    #[test]
    fn each_sign_alone_is_an_offence() {
        let m = RiskModel::default();
        let jitter = |i: usize| 0.8 + ((i * 7919) % 1000) as f64 / 714.0;
        type Drive = Box<dyn Fn(&mut RiskState) -> Vec<Verdict>>;
        let cases: [(Sign, Drive); 4] = [
            (
                Sign::IdenticalContent,
                Box::new(move |s| run(s, &m.clone(), 200, jitter, true, true)),
            ),
            (
                Sign::RegularIntervals,
                Box::new(|s| run(s, &RiskModel::default(), 200, |_| 1.5, false, true)),
            ),
            (
                Sign::NoTyping,
                Box::new(move |s| run(s, &RiskModel::default(), 200, jitter, false, false)),
            ),
            (
                Sign::OverAllowance,
                Box::new(move |s| {
                    s.age_days = 0;
                    run(s, &RiskModel::default(), 200, jitter, false, true)
                }),
            ),
        ];
        for (sign, drive) in cases {
            let mut s = RiskState::new(365);
            let v = drive(&mut s);
            assert!(
                matches!(v.first(), Some(Verdict::Warning(signs)) if signs == &vec![sign]),
                "{sign:?}: {v:?}"
            );
        }
    }

    #[test]
    fn allowance_rises_with_age() {
        let m = RiskModel::default();
        assert_eq!(m.allowance_at(0), 50);
        assert_eq!(m.allowance_at(6), 200);
        assert_eq!(m.allowance_at(400), 5000);
    }
}
