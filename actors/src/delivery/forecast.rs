//! Will the work fit the window? A pure estimate from the account's send
//! rate, used by the AccountActor when a run starts (the text goes on the
//! run) and by the control port's dry-run.
//!
//! The model is deliberately the rate limit alone: one token per message,
//! `per_minute` tokens a minute, the bucket starting empty (as it does after
//! a restart). Gateway latency and inter-part jitter overlap with token waits
//! under group concurrency, so at realistic rates the bucket is the ceiling;
//! an estimate that errs slightly long is the honest side to err on.

use crate::domain::TimeZone;
use chrono::{DateTime, Duration, Timelike, Utc};

/// The estimate for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forecast {
    /// Groups whose every part can be sent before the window closes.
    pub groups_fit: u32,
    /// Groups still to send.
    pub groups_total: u32,
    /// True when every remaining group fits.
    pub fits: bool,
    /// When the last message would go out at this rate (may be after close).
    pub expected_finish: DateTime<Utc>,
    /// One line for the operator, stored on the run.
    pub text: String,
}

/// Estimates how much of a run fits between `start` and `close`.
///
/// `parts_per_group` below 1 is treated as 1 (a reminder always has a
/// part); a rate of 0 sends nothing.
pub fn forecast(
    groups_remaining: u32,
    parts_per_group: u32,
    per_minute: u32,
    start: DateTime<Utc>,
    close: DateTime<Utc>,
    tz: &TimeZone,
) -> Forecast {
    let parts = u64::from(parts_per_group.max(1));
    let total_messages = u64::from(groups_remaining) * parts;
    let available_ms = (close - start).num_milliseconds().max(0) as u64;
    let rate = u64::from(per_minute);

    // Message n goes out n × 60 000 / rate ms after start; integer maths
    // keeps "fits" and "finishes before close" exactly consistent.
    let messages_fit = available_ms.saturating_mul(rate) / 60_000;
    let groups_fit = (messages_fit / parts).min(u64::from(groups_remaining)) as u32;
    let fits = groups_fit == groups_remaining;
    let expected_finish = if total_messages == 0 {
        start
    } else if rate == 0 {
        DateTime::<Utc>::MAX_UTC
    } else {
        let ms = total_messages.saturating_mul(60_000).div_ceil(rate);
        i64::try_from(ms)
            .ok()
            .and_then(Duration::try_milliseconds)
            .and_then(|d| start.checked_add_signed(d))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    };

    let close_text = local_hm(close, tz, false);
    let text = if fits {
        format!(
            "forecast: all {groups_remaining} groups fit before {close_text} ({tz}), expected to finish at {}",
            local_hm(expected_finish, tz, true)
        )
    } else {
        format!(
            "forecast: {groups_fit} of {groups_remaining} groups fit before {close_text} ({tz}) at {per_minute} messages/min"
        )
    };
    Forecast {
        groups_fit,
        groups_total: groups_remaining,
        fits,
        expected_finish,
        text,
    }
}

/// Above this rate [`paced_per_minute`] takes the limit as it is instead
/// of simulating an hour of it (ten times the API's 600 a minute).
const SIMULATED_UP_TO: u32 = 6_000;

/// Messages a minute an account really sustains: its bucket driven
/// greedily for an hour under its pacing (drawn gaps and the 60 s log both
/// bind, so jitter costs a little), and no more than `concurrency` groups
/// typing and waiting for an answer side by side. Rounded down: an
/// estimate that errs long is the honest side.
pub fn paced_per_minute(
    per_minute: u32,
    pacing: crate::delivery::bucket::Pacing,
    typing: std::time::Duration,
    concurrency: u32,
) -> u32 {
    use crate::delivery::bucket::TokenBucket;
    use std::time::Duration as Std;
    if per_minute == 0 {
        return 0;
    }
    // Each group in flight types, then waits about a round trip.
    let cycle = typing.as_secs_f64() + 0.3;
    let parallel = f64::from(concurrency.max(1)) * 60.0 / cycle;
    let bucket = if per_minute > SIMULATED_UP_TO {
        // The hour's simulation costs one step per grant; at such a rate
        // the bucket is never what binds, and it would not finish.
        f64::from(per_minute)
    } else {
        let t0 = tokio::time::Instant::now();
        let mut b = TokenBucket::new(per_minute, t0).with_pacing(pacing, t0);
        let span = Std::from_secs(3600);
        let (mut now, mut grants) = (t0, 0u64);
        while now < t0 + span {
            match b.try_take(now) {
                Ok(()) => grants += 1,
                Err(w) => now += w,
            }
        }
        // Less 3 %: another hour's draws (and the answers' latency) vary.
        let margin = if pacing.jitter > 0.0 { 0.97 } else { 1.0 };
        grants as f64 / 60.0 * margin
    };
    bucket
        .min(parallel)
        .floor()
        .clamp(1.0, f64::from(per_minute)) as u32
}

/// Local `HH:MM`. A finish time is rounded up to the minute, so "finish at
/// 10:25" never means 10:25:40.
fn local_hm(at: DateTime<Utc>, tz: &TimeZone, round_up: bool) -> String {
    let mut local = at.with_timezone(&tz.tz());
    if round_up && (local.second() > 0 || local.nanosecond() > 0) {
        local = local
            .with_nanosecond(0)
            .and_then(|t| t.with_second(0))
            .map(|t| t + Duration::minutes(1))
            .unwrap_or(local);
    }
    local.format("%H:%M").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kl() -> TimeZone {
        TimeZone::parse("Asia/Kuala_Lumpur").unwrap()
    }

    fn utc(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_morning_run_fits_and_says_when_it_finishes() {
        // 09:00 KL start, 18:00 close, 1000 groups × 1 part at 40/min = 25 min.
        let f = forecast(
            1000,
            1,
            40,
            utc("2026-05-11T01:00:00Z"),
            utc("2026-05-11T10:00:00Z"),
            &kl(),
        );
        assert!(f.fits);
        assert_eq!(f.groups_fit, 1000);
        assert_eq!(f.expected_finish, utc("2026-05-11T01:25:00Z"));
        assert_eq!(
            f.text,
            "forecast: all 1000 groups fit before 18:00 (Asia/Kuala_Lumpur), expected to finish at 09:25"
        );
    }

    #[test]
    fn a_late_start_reports_how_many_fit() {
        // 1000 groups × 2 parts at 40/min from 17:40 KL: 20 min = 800 messages = 400 groups.
        let f = forecast(
            1000,
            2,
            40,
            utc("2026-05-11T09:40:00Z"),
            utc("2026-05-11T10:00:00Z"),
            &kl(),
        );
        assert!(!f.fits);
        assert_eq!(f.groups_fit, 400);
        assert_eq!(f.groups_total, 1000);
        assert_eq!(
            f.text,
            "forecast: 400 of 1000 groups fit before 18:00 (Asia/Kuala_Lumpur) at 40 messages/min"
        );
        assert_eq!(f.expected_finish, utc("2026-05-11T10:30:00Z"));
    }

    #[test]
    fn finish_time_rounds_up_to_the_minute() {
        // 7 messages at 40/min = 10.5 s.
        let f = forecast(
            7,
            1,
            40,
            utc("2026-05-11T01:00:00Z"),
            utc("2026-05-11T10:00:00Z"),
            &kl(),
        );
        assert_eq!(f.expected_finish, utc("2026-05-11T01:00:10.500Z"));
        assert!(
            f.text.ends_with("expected to finish at 09:01"),
            "{}",
            f.text
        );
    }

    #[test]
    fn degenerate_inputs() {
        let start = utc("2026-05-11T01:00:00Z");
        // Nothing to send always fits.
        let f = forecast(0, 3, 40, start, start, &kl());
        assert!(f.fits);
        assert_eq!(f.expected_finish, start);
        // Already closed: nothing fits.
        let f = forecast(5, 1, 40, start, start - Duration::minutes(1), &kl());
        assert_eq!((f.groups_fit, f.fits), (0, false));
        // A zero rate sends nothing.
        let f = forecast(5, 1, 0, start, start + Duration::hours(9), &kl());
        assert_eq!((f.groups_fit, f.fits), (0, false));
        // Zero parts is treated as one.
        let f = forecast(40, 0, 40, start, start + Duration::minutes(1), &kl());
        assert!(f.fits);
    }

    #[test]
    fn a_cross_midnight_window_reports_the_morning_close() {
        let utc_tz = TimeZone::parse("UTC").unwrap();
        let f = forecast(
            100,
            1,
            10,
            utc("2026-05-10T23:00:00Z"),
            utc("2026-05-11T06:00:00Z"),
            &utc_tz,
        );
        assert!(f.fits);
        assert_eq!(
            f.text,
            "forecast: all 100 groups fit before 06:00 (UTC), expected to finish at 23:10"
        );
    }

    #[test]
    fn pacing_and_typing_lower_the_sustained_rate_a_little() {
        use crate::delivery::bucket::Pacing;
        use std::time::Duration as Std;
        let regular = paced_per_minute(40, Pacing::REGULAR, Std::ZERO, 3);
        assert!((39..=40).contains(&regular), "{regular}");
        let human = Pacing {
            jitter: 0.5,
            slack: 1.0,
            seed: 3,
        };
        let paced = paced_per_minute(40, human, Std::from_millis(700), 3);
        assert!((35..=38).contains(&paced), "{paced}");
        // Long typing with one group in flight: typing is the bottleneck.
        assert_eq!(
            paced_per_minute(40, Pacing::REGULAR, Std::from_millis(3700), 1),
            15
        );
    }

    /// A rate far above any WhatsApp limit (the engine benchmark's "no
    /// limit") is not simulated: it used to take a step per grant for an
    /// hour, and the run's start never finished.
    #[test]
    fn a_rate_beyond_any_limit_is_taken_as_it_is() {
        use crate::delivery::bucket::Pacing;
        use std::time::Duration as Std;
        assert_eq!(
            paced_per_minute(600_000_000, Pacing::REGULAR, Std::ZERO, 3),
            600,
            "three groups in flight at 0.3 s a round trip bind"
        );
        assert_eq!(
            paced_per_minute(600_000_000, Pacing::REGULAR, Std::ZERO, 64),
            12_800
        );
    }

    proptest! {
        #[test]
        fn estimate_is_consistent(
            groups in 0u32..20_000, parts in 1u32..10, rate in 1u32..200,
            minutes in 0i64..(25 * 60), extra_ms in 0i64..60_000,
        ) {
            let start = utc("2026-05-11T01:00:00Z");
            let close = start + Duration::minutes(minutes) + Duration::milliseconds(extra_ms);
            let f = forecast(groups, parts, rate, start, close, &kl());
            prop_assert!(f.groups_fit <= f.groups_total);
            prop_assert_eq!(f.fits, f.groups_fit == groups);
            // It fits exactly when the last message goes out by the close.
            prop_assert_eq!(f.fits, f.expected_finish <= close);
            // The groups said to fit really fit at this rate...
            let needed_ms = (u64::from(f.groups_fit) * u64::from(parts) * 60_000).div_ceil(u64::from(rate));
            prop_assert!(start + Duration::milliseconds(needed_ms as i64) <= close);
            // ...and one more group would not.
            if !f.fits {
                let more_ms = (u64::from(f.groups_fit + 1) * u64::from(parts) * 60_000).div_ceil(u64::from(rate));
                prop_assert!(start + Duration::milliseconds(more_ms as i64) > close);
            }
        }

        #[test]
        fn more_time_or_a_faster_rate_never_fits_fewer(
            groups in 0u32..5_000, parts in 1u32..5, rate in 1u32..120, minutes in 0i64..600,
        ) {
            let start = utc("2026-05-11T01:00:00Z");
            let close = start + Duration::minutes(minutes);
            let base = forecast(groups, parts, rate, start, close, &kl()).groups_fit;
            let longer = forecast(groups, parts, rate, start, close + Duration::minutes(1), &kl()).groups_fit;
            let faster = forecast(groups, parts, rate + 1, start, close, &kl()).groups_fit;
            prop_assert!(longer >= base);
            prop_assert!(faster >= base);
        }
    }
}
