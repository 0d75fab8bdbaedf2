//! Daily and hourly caps and the warm-up ramp: how many messages an
//! account may send today and this hour, counted in the account's own
//! timezone (a "day" is its local calendar day, so a DST change makes one
//! 23 or 25 hours long).
//!
//! The ramp is a schedule of daily ceilings by ramp day (days since the
//! account was paired, or since its last incident — a warning, rate limit
//! or ban puts it back to the start: a number that was just flagged is
//! treated as new). The ceiling in force is the least of the daily cap and
//! the ramp's; the hourly cap is counted on its own.

use crate::domain::{resolve_local, TimeZone, ValidationError};
use chrono::{DateTime, Duration, NaiveTime, Timelike, Utc};
use std::collections::VecDeque;

/// Daily ceilings by ramp day: `(from_day, ceiling)`, ascending from day 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warmup(Vec<(u32, u32)>);

impl Default for Warmup {
    /// A cautious ramp in the spirit of WarmySender's: 50 a day for a new
    /// number, doubling roughly weekly, no ceiling from day 30.
    fn default() -> Self {
        Self(vec![
            (0, 50),
            (3, 100),
            (7, 250),
            (14, 500),
            (21, 1000),
            (30, u32::MAX),
        ])
    }
}

impl Warmup {
    /// Parses "DAY:CEILING,..." (e.g. "0:50,3:100,30:unlimited").
    pub fn parse(s: &str, field: &str) -> Result<Self, ValidationError> {
        let err = |rule: String| ValidationError::new(field, rule);
        let mut steps = Vec::new();
        for step in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (day, ceiling) = step
                .split_once(':')
                .ok_or_else(|| err(format!("{step:?} must look like DAY:CEILING")))?;
            let day: u32 = day
                .trim()
                .parse()
                .map_err(|_| err(format!("{day:?} is not a day number")))?;
            let ceiling = match ceiling.trim() {
                "unlimited" => u32::MAX,
                c => c
                    .parse()
                    .map_err(|_| err(format!("{c:?} is not a number or \"unlimited\"")))?,
            };
            steps.push((day, ceiling));
        }
        Self::new(steps).map_err(err)
    }

    pub fn new(steps: Vec<(u32, u32)>) -> Result<Self, String> {
        if steps.first().map(|s| s.0) != Some(0) {
            return Err("the ramp must start at day 0".into());
        }
        if steps
            .windows(2)
            .any(|w| w[0].0 >= w[1].0 || w[0].1 > w[1].1)
        {
            return Err("days must ascend and ceilings must not fall".into());
        }
        if steps.iter().any(|s| s.1 == 0) {
            return Err("a ceiling of 0 would never send".into());
        }
        Ok(Self(steps))
    }

    /// The daily ceiling on ramp day `day` (`None`: no ceiling).
    pub fn ceiling(&self, day: u32) -> Option<u32> {
        self.0
            .iter()
            .take_while(|(from, _)| *from <= day)
            .last()
            .map(|(_, c)| *c)
            .filter(|c| *c != u32::MAX)
    }
}

/// Which cap stopped the sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapKind {
    Daily,
    Hourly,
    Warmup { day: u32 },
}

/// A cap was reached: nothing more until `resets_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapReached {
    pub kind: CapKind,
    pub sent: u32,
    pub cap: u32,
    pub resets_at: DateTime<Utc>,
}

impl CapReached {
    /// "daily cap reached: 500 sent today" — the run adds when it resumes.
    pub fn reason(&self) -> String {
        match self.kind {
            CapKind::Daily => format!("daily cap reached: {} sent today", self.sent),
            CapKind::Hourly => format!("hourly cap reached: {} sent this hour", self.sent),
            CapKind::Warmup { day } => format!(
                "warm-up ceiling reached: {} of {} sent today (warm-up day {day})",
                self.sent, self.cap
            ),
        }
    }
}

/// Whether a run's summary is a cap's deferral (see [`CapReached::reason`]).
pub fn is_cap_reason(s: &str) -> bool {
    [
        "daily cap reached",
        "hourly cap reached",
        "warm-up ceiling reached",
    ]
    .iter()
    .any(|p| s.starts_with(p))
}

/// An account's caps as the engine enforces them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapPolicy {
    pub tz: TimeZone,
    pub daily: Option<u32>,
    pub hourly: Option<u32>,
    pub warmup: Option<Warmup>,
    /// Ramp day 0: pairing, or the last incident.
    pub ramp_start: DateTime<Utc>,
}

impl CapPolicy {
    pub fn is_unlimited(&self) -> bool {
        self.daily.is_none() && self.hourly.is_none() && self.warmup.is_none()
    }

    /// Local calendar days from the ramp start to `now`.
    pub fn ramp_day(&self, now: DateTime<Utc>) -> u32 {
        let tz = self.tz.tz();
        let start = self.ramp_start.with_timezone(&tz).date_naive();
        let today = now.with_timezone(&tz).date_naive();
        u32::try_from((today - start).num_days().max(0)).unwrap_or(u32::MAX)
    }

    /// The ceiling for today and what sets it.
    pub fn daily_ceiling(&self, now: DateTime<Utc>) -> Option<(u32, CapKind)> {
        let day = self.ramp_day(now);
        let ramp = self
            .warmup
            .as_ref()
            .and_then(|w| w.ceiling(day))
            .map(|c| (c, CapKind::Warmup { day }));
        let daily = self.daily.map(|c| (c, CapKind::Daily));
        match (daily, ramp) {
            (Some(d), Some(r)) => Some(if r.0 < d.0 { r } else { d }),
            (d, r) => d.or(r),
        }
    }

    /// Local midnight starting the day of `now`.
    pub fn day_start(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let local = now.with_timezone(&self.tz.tz()).date_naive();
        resolve_local(self.tz.tz(), local.and_time(NaiveTime::MIN))
    }

    /// The next local midnight (23 or 25 hours away across a DST change).
    pub fn next_day(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let local = now.with_timezone(&self.tz.tz()).date_naive();
        let next = local.succ_opt().unwrap_or(local);
        resolve_local(self.tz.tz(), next.and_time(NaiveTime::MIN))
    }

    /// The start of the hour of `now` (hours are UTC-aligned everywhere
    /// but in a few half-hour zones; counted in local time all the same).
    pub fn hour_start(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let local = now.with_timezone(&self.tz.tz());
        let start = local
            .with_minute(0)
            .and_then(|t| t.with_second(0))
            .and_then(|t| t.with_nanosecond(0))
            .unwrap_or(local);
        start.with_timezone(&Utc)
    }

    /// Whether one more message may go now, given the account's send times
    /// (at least those since the local day's start).
    pub fn check(&self, sends: &SendLedger, now: DateTime<Utc>) -> Result<(), CapReached> {
        if let Some((cap, kind)) = self.daily_ceiling(now) {
            let sent = sends.since(self.day_start(now));
            if sent >= cap {
                return Err(CapReached {
                    kind,
                    sent,
                    cap,
                    resets_at: self.next_day(now),
                });
            }
        }
        if let Some(cap) = self.hourly {
            let start = self.hour_start(now);
            let sent = sends.since(start);
            if sent >= cap {
                return Err(CapReached {
                    kind: CapKind::Hourly,
                    sent,
                    cap,
                    resets_at: start + Duration::hours(1),
                });
            }
        }
        Ok(())
    }
}

/// What the delivery window lets through, for [`CapPolicy::forecast`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowFit {
    /// Groups that fit before today's window closes.
    pub today: u32,
    /// Messages one day's window carries at the account's pace.
    pub per_day: u64,
}

impl WindowFit {
    /// No window binds: every day carries everything.
    pub const OPEN: WindowFit = WindowFit {
        today: u32::MAX,
        per_day: u64::MAX,
    };

    /// `hours` a day at `per_minute` messages, and `today` groups today.
    pub fn new(today: u32, hours: u32, per_minute: u32) -> Self {
        Self {
            today,
            per_day: (u64::from(hours) * 60 * u64::from(per_minute)).max(1),
        }
    }
}

impl CapPolicy {
    /// What the caps do to a run of `groups` starting now: `None` when
    /// they do not bind today; else "warm-up day 3: 300 of 1000 groups
    /// today; all by Thursday". Each day carries the lesser of its ceiling
    /// and what its delivery window lets through (`fit`).
    pub fn forecast(
        &self,
        sends: &SendLedger,
        now: DateTime<Utc>,
        groups: u32,
        parts: u32,
        fit: WindowFit,
    ) -> Option<String> {
        let parts = parts.max(1);
        let (cap, kind) = self.daily_ceiling(now)?;
        let left = cap.saturating_sub(sends.since(self.day_start(now)));
        if left / parts >= groups.min(fit.today) {
            // The cap does not bind today (the window may: the run's own
            // forecast says so).
            return None;
        }
        let today = (left / parts).min(groups);
        let what = match kind {
            CapKind::Warmup { day } => format!("at this account's warm-up day {day}"),
            _ => format!("at its daily cap of {cap}"),
        };
        let mut rest = u64::from(groups - today) * u64::from(parts);
        let mut day = now;
        let mut by = None;
        for _ in 0..366 {
            day = self.next_day(day);
            let carries = self
                .daily_ceiling(day)
                .map_or(fit.per_day, |(c, _)| u64::from(c).min(fit.per_day));
            rest = rest.saturating_sub(carries);
            if rest == 0 {
                by = Some(day);
                break;
            }
        }
        let by = by.map_or_else(
            || "not within a year".to_owned(),
            |d| {
                let local = d.with_timezone(&self.tz.tz());
                format!("all by {}", local.format("%A %-d %b"))
            },
        );
        Some(format!(
            "{what}, {today} of {groups} groups today; {by} ({})",
            self.tz
        ))
    }
}

/// The account's send times of the last day or so, oldest first.
#[derive(Debug, Clone, Default)]
pub struct SendLedger {
    times: VecDeque<DateTime<Utc>>,
}

impl SendLedger {
    pub fn from_times(mut times: Vec<DateTime<Utc>>) -> Self {
        times.sort();
        Self {
            times: times.into(),
        }
    }

    pub fn record(&mut self, at: DateTime<Utc>) {
        // Keeps the order even if a mark is dated a hair earlier.
        let pos = self.times.partition_point(|t| *t <= at);
        self.times.insert(pos, at);
        // A local day is at most 25 hours: older sends count for nothing.
        let horizon = at - Duration::hours(26);
        while self.times.front().is_some_and(|t| *t < horizon) {
            self.times.pop_front();
        }
    }

    /// Sends at or after `start`.
    pub fn since(&self, start: DateTime<Utc>) -> u32 {
        let first = self.times.partition_point(|t| *t < start);
        u32::try_from(self.times.len() - first).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn policy(tz: &str, daily: Option<u32>, hourly: Option<u32>) -> CapPolicy {
        CapPolicy {
            tz: TimeZone::parse(tz).unwrap(),
            daily,
            hourly,
            warmup: None,
            ramp_start: at("2026-01-01T00:00:00Z"),
        }
    }

    #[test]
    fn the_daily_cap_resets_at_local_midnight() {
        let p = policy("Asia/Kuala_Lumpur", Some(3), None);
        let mut l = SendLedger::default();
        // 23:00 KL on the 10th (15:00 UTC).
        for m in 0..3 {
            l.record(at("2026-03-10T15:00:00Z") + Duration::minutes(m));
        }
        let e = p.check(&l, at("2026-03-10T15:10:00Z")).unwrap_err();
        assert_eq!(e.kind, CapKind::Daily);
        assert_eq!(e.sent, 3);
        assert_eq!(e.resets_at, at("2026-03-10T16:00:00Z"), "KL midnight");
        assert_eq!(e.reason(), "daily cap reached: 3 sent today");
        // After local midnight: a new day, a fresh count.
        assert!(p.check(&l, at("2026-03-10T16:00:00Z")).is_ok());
    }

    #[test]
    fn a_dst_day_is_23_hours_long() {
        // New York springs forward on 8 March 2026.
        let p = policy("America/New_York", Some(1), None);
        let mut l = SendLedger::default();
        l.record(at("2026-03-08T05:30:00Z")); // 00:30 EST
        let e = p.check(&l, at("2026-03-08T12:00:00Z")).unwrap_err();
        // Next midnight is EDT (UTC-4): 23 hours after the last one.
        assert_eq!(e.resets_at, at("2026-03-09T04:00:00Z"));
        assert_eq!(
            e.resets_at - p.day_start(at("2026-03-08T12:00:00Z")),
            Duration::hours(23)
        );
        // The fall-back day is 25 hours.
        let fall = at("2026-11-01T12:00:00Z");
        assert_eq!(p.next_day(fall) - p.day_start(fall), Duration::hours(25));
    }

    #[test]
    fn the_hourly_cap_counts_the_local_hour() {
        let p = policy("Asia/Kolkata", None, Some(2));
        let mut l = SendLedger::default();
        // 10:30–10:40 IST is 05:00–05:10 UTC; the IST hour began at 04:30 UTC.
        l.record(at("2026-03-10T05:00:00Z"));
        l.record(at("2026-03-10T05:10:00Z"));
        let e = p.check(&l, at("2026-03-10T05:20:00Z")).unwrap_err();
        assert_eq!(e.kind, CapKind::Hourly);
        assert_eq!(e.resets_at, at("2026-03-10T05:30:00Z"));
        assert!(p.check(&l, at("2026-03-10T05:30:00Z")).is_ok());
    }

    #[test]
    fn the_warmup_ramp_rises_with_age_and_restarts_after_an_incident() {
        let mut p = policy("Asia/Kuala_Lumpur", Some(400), None);
        p.warmup = Some(Warmup::default());
        p.ramp_start = at("2026-03-01T02:00:00Z");
        let day = |d: i64| at("2026-03-01T04:00:00Z") + Duration::days(d);
        assert_eq!(
            p.daily_ceiling(day(0)),
            Some((50, CapKind::Warmup { day: 0 }))
        );
        assert_eq!(
            p.daily_ceiling(day(3)),
            Some((100, CapKind::Warmup { day: 3 }))
        );
        assert_eq!(p.daily_ceiling(day(14)), Some((400, CapKind::Daily)));
        p.warmup = Some(Warmup::default());
        p.ramp_start = day(14);
        assert_eq!(
            p.daily_ceiling(day(15)),
            Some((50, CapKind::Warmup { day: 1 }))
        );
    }

    #[test]
    fn the_forecast_says_how_the_ramp_spreads_a_run() {
        let mut p = policy("Asia/Kuala_Lumpur", None, None);
        p.warmup = Some(Warmup::default());
        // Day 3 of the ramp (100 a day), Monday 09:00 KL, nothing sent yet.
        p.ramp_start = at("2026-11-20T01:00:00Z");
        let now = at("2026-11-23T01:00:00Z");
        let l = SendLedger::default();
        // 300 groups: 100 today, then 100 a day until day 7 (250 a day).
        assert_eq!(
            p.forecast(&l, now, 300, 1, WindowFit::OPEN).unwrap(),
            "at this account's warm-up day 3, 100 of 300 groups today; all by Wednesday 25 Nov (Asia/Kuala_Lumpur)"
        );
        assert_eq!(
            p.forecast(&l, now, 80, 1, WindowFit::OPEN),
            None,
            "fits today"
        );
        let mut capped = policy("Asia/Kuala_Lumpur", Some(500), None);
        capped.ramp_start = p.ramp_start;
        assert_eq!(
            capped.forecast(&l, now, 1000, 1, WindowFit::OPEN).unwrap(),
            "at its daily cap of 500, 500 of 1000 groups today; all by Tuesday 24 Nov (Asia/Kuala_Lumpur)"
        );
        // Where the window binds today and the cap does not, the cap says
        // nothing (the run's forecast tells of the window).
        assert_eq!(
            capped.forecast(&l, now, 1000, 1, WindowFit::new(400, 2, 4)),
            None
        );
        // Later days carry the lesser of their ceiling and their window:
        // from day 7 the ramp allows 250, the window 150.
        let open = p.forecast(&l, now, 1000, 1, WindowFit::OPEN).unwrap();
        assert!(
            open.ends_with("all by Sunday 29 Nov (Asia/Kuala_Lumpur)"),
            "{open}"
        );
        let windowed = WindowFit {
            today: 150,
            per_day: 150,
        };
        assert_eq!(
            p.forecast(&l, now, 1000, 1, windowed).unwrap(),
            "at this account's warm-up day 3, 100 of 1000 groups today; all by Monday 30 Nov (Asia/Kuala_Lumpur)"
        );
    }

    #[test]
    fn a_ramp_is_parsed_and_checked() {
        let w = Warmup::parse("0:20, 5:80, 10:unlimited", "warmup").unwrap();
        assert_eq!(w.ceiling(4), Some(20));
        assert_eq!(w.ceiling(12), None);
        for bad in ["1:20", "0:20,0:30", "0:50,3:10", "0:x", "0:0"] {
            assert_eq!(
                Warmup::parse(bad, "warmup").unwrap_err().field,
                "warmup",
                "{bad}"
            );
        }
    }
}
