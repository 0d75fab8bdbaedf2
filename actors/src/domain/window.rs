use super::{TimeZone, ValidationError};
use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, NaiveTime, TimeZone as _, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// The hours of the day, in the reminder's timezone, during which a reminder
/// may be delivered. `start > end` means the window crosses midnight
/// (22 → 06 runs from 22:00 to 06:00 the next morning); `end = 24` is
/// midnight at the end of the day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct WindowHours {
    start_hour: u8,
    end_hour: u8,
}

/// One concrete opening of a window: `[open, close)` in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpan {
    pub open: DateTime<Utc>,
    pub close: DateTime<Utc>,
}

impl WindowSpan {
    pub fn contains(&self, at: DateTime<Utc>) -> bool {
        self.open <= at && at < self.close
    }
}

impl Default for WindowHours {
    /// 06–18, seed 000's default.
    fn default() -> Self {
        Self {
            start_hour: 6,
            end_hour: 18,
        }
    }
}

impl WindowHours {
    pub fn parse(start_hour: i64, end_hour: i64) -> Result<Self, ValidationError> {
        if !(0..=23).contains(&start_hour) {
            return Err(ValidationError::new("window.start_hour", "must be 0–23"));
        }
        if !(0..=24).contains(&end_hour) {
            return Err(ValidationError::new("window.end_hour", "must be 0–24"));
        }
        if start_hour == end_hour {
            return Err(ValidationError::new(
                "window.end_hour",
                "must differ from start_hour (use 0–24 for all day)",
            ));
        }
        Ok(Self {
            start_hour: start_hour as u8,
            end_hour: end_hour as u8,
        })
    }

    pub fn start_hour(&self) -> u8 {
        self.start_hour
    }

    pub fn end_hour(&self) -> u8 {
        self.end_hour
    }

    /// Hours the window is open a day (an overnight window wraps).
    pub fn hours(&self) -> u32 {
        let (s, e) = (u32::from(self.start_hour), u32::from(self.end_hour));
        if e > s {
            e - s
        } else {
            e + 24 - s
        }
    }

    /// 0–24: no window at all; a run ends only at its own horizon.
    pub fn is_all_day(&self) -> bool {
        self.start_hour == 0 && self.end_hour == 24
    }

    pub fn crosses_midnight(&self) -> bool {
        self.start_hour > self.end_hour
    }

    /// The window opening that starts on local date `day`.
    pub fn span_starting_on(&self, tz: &TimeZone, day: NaiveDate) -> WindowSpan {
        let tz = tz.tz();
        let open = resolve_local(tz, at_hour(day, self.start_hour));
        let close_day = if self.crosses_midnight() {
            day.succ_opt().unwrap_or(day)
        } else {
            day
        };
        let close = resolve_local(tz, at_hour(close_day, self.end_hour));
        WindowSpan { open, close }
    }

    /// The window that `at` falls in, or else the next one to open.
    pub fn span_at_or_after(&self, tz: &TimeZone, at: DateTime<Utc>) -> WindowSpan {
        let local_day = at.with_timezone(&tz.tz()).date_naive();
        // A cross-midnight window that contains `at` may have opened yesterday.
        let mut day = local_day.pred_opt().unwrap_or(local_day);
        loop {
            let span = self.span_starting_on(tz, day);
            if at < span.close && span.open < span.close {
                return span;
            }
            day = day.succ_opt().expect("date in range");
        }
    }

    /// The next opening strictly after `at` (for resuming a parked run).
    pub fn next_open_after(&self, tz: &TimeZone, at: DateTime<Utc>) -> WindowSpan {
        let span = self.span_at_or_after(tz, at);
        if span.open > at {
            return span;
        }
        self.span_at_or_after(tz, span.close)
    }
}

fn at_hour(day: NaiveDate, hour: u8) -> NaiveDateTime {
    if hour >= 24 {
        day.succ_opt()
            .expect("date in range")
            .and_time(NaiveTime::MIN)
    } else {
        day.and_hms_opt(hour.into(), 0, 0).expect("valid hour")
    }
}

/// Maps a local wall-clock time to an instant, the way Herald promises:
/// a time that does not exist (spring forward) becomes the first valid
/// instant after it, an ambiguous one (fall back) its first occurrence.
pub fn resolve_local(tz: Tz, local: NaiveDateTime) -> DateTime<Utc> {
    match tz.from_local_datetime(&local) {
        chrono::LocalResult::Single(t) => t.with_timezone(&Utc),
        chrono::LocalResult::Ambiguous(first, _) => first.with_timezone(&Utc),
        chrono::LocalResult::None => {
            // Transitions fall on whole minutes: walk forward to the end of the gap.
            let mut probe = local
                .with_nanosecond_zero_seconds()
                .checked_add_signed(Duration::minutes(1))
                .expect("date in range");
            for _ in 0..(48 * 60) {
                if let Some(t) = tz.from_local_datetime(&probe).earliest() {
                    return t.with_timezone(&Utc);
                }
                probe += Duration::minutes(1);
            }
            unreachable!("no timezone has a gap longer than two days")
        }
    }
}

trait TruncateToMinute {
    fn with_nanosecond_zero_seconds(self) -> Self;
}

impl TruncateToMinute for NaiveDateTime {
    fn with_nanosecond_zero_seconds(self) -> Self {
        use chrono::Timelike;
        self.with_second(0)
            .and_then(|t| t.with_nanosecond(0))
            .expect("zero is a valid second")
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    start_hour: i64,
    end_hour: i64,
}

impl<'de> Deserialize<'de> for WindowHours {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawWindow::deserialize(d)?;
        Self::parse(raw.start_hour, raw.end_hour).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_window_is_open_its_hours_a_day_overnight_too() {
        let h = |s, e| WindowHours::parse(s, e).unwrap().hours();
        assert_eq!((h(6, 18), h(0, 24), h(22, 6), h(23, 0)), (12, 24, 8, 1));
    }

    use super::*;
    use proptest::prelude::*;

    fn tz(name: &str) -> TimeZone {
        TimeZone::parse(name).unwrap()
    }

    fn utc(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn parse_rules() {
        assert!(WindowHours::parse(6, 18).is_ok());
        assert!(WindowHours::parse(22, 6).unwrap().crosses_midnight());
        assert!(WindowHours::parse(0, 24).is_ok());
        assert_eq!(
            WindowHours::parse(6, 25).unwrap_err().to_string(),
            "window.end_hour: must be 0–24"
        );
        assert_eq!(
            WindowHours::parse(-1, 6).unwrap_err().field,
            "window.start_hour"
        );
        assert_eq!(
            WindowHours::parse(24, 6).unwrap_err().field,
            "window.start_hour"
        );
        assert_eq!(
            WindowHours::parse(9, 9).unwrap_err().field,
            "window.end_hour"
        );
    }

    #[test]
    fn kuala_lumpur_day_window() {
        // KL is UTC+8 all year: 06–18 local is 22:00–10:00 UTC.
        let w = WindowHours::default();
        let span = w.span_at_or_after(&tz("Asia/Kuala_Lumpur"), utc("2026-03-02T01:00:00Z"));
        assert_eq!(span.open, utc("2026-03-01T22:00:00Z"));
        assert_eq!(span.close, utc("2026-03-02T10:00:00Z"));
        // After close, the next day's window.
        let next = w.span_at_or_after(&tz("Asia/Kuala_Lumpur"), utc("2026-03-02T10:00:00Z"));
        assert_eq!(next.open, utc("2026-03-02T22:00:00Z"));
    }

    #[test]
    fn cross_midnight_window_found_from_either_side() {
        let w = WindowHours::parse(22, 6).unwrap();
        let z = tz("UTC");
        // 02:00 is inside the window that opened yesterday at 22:00.
        let span = w.span_at_or_after(&z, utc("2026-05-10T02:00:00Z"));
        assert_eq!(span.open, utc("2026-05-09T22:00:00Z"));
        assert_eq!(span.close, utc("2026-05-10T06:00:00Z"));
        // 12:00 is outside: the next window opens at 22:00 today.
        let span = w.span_at_or_after(&z, utc("2026-05-10T12:00:00Z"));
        assert_eq!(span.open, utc("2026-05-10T22:00:00Z"));
        assert_eq!(span.close, utc("2026-05-11T06:00:00Z"));
    }

    #[test]
    fn window_on_london_spring_forward_day_is_shorter() {
        // 2026-03-29: clocks go 01:00 GMT -> 02:00 BST. A 00–06 window is 5 hours long.
        let w = WindowHours::parse(0, 6).unwrap();
        let span = w.span_starting_on(
            &tz("Europe/London"),
            NaiveDate::from_ymd_opt(2026, 3, 29).unwrap(),
        );
        assert_eq!(span.open, utc("2026-03-29T00:00:00Z"));
        assert_eq!(span.close, utc("2026-03-29T05:00:00Z"));
    }

    #[test]
    fn cross_midnight_window_over_new_york_fall_back_is_longer() {
        // 2026-11-01: 02:00 EDT -> 01:00 EST. A 22–06 window from Oct 31 lasts 9 hours.
        let w = WindowHours::parse(22, 6).unwrap();
        let span = w.span_starting_on(
            &tz("America/New_York"),
            NaiveDate::from_ymd_opt(2026, 10, 31).unwrap(),
        );
        assert_eq!(span.open, utc("2026-11-01T02:00:00Z"));
        assert_eq!(span.close, utc("2026-11-01T11:00:00Z"));
        assert_eq!(span.close - span.open, Duration::hours(9));
    }

    #[test]
    fn nonexistent_local_time_resolves_to_end_of_gap() {
        let london = tz("Europe/London").tz();
        let t = NaiveDate::from_ymd_opt(2026, 3, 29)
            .unwrap()
            .and_hms_opt(1, 30, 0)
            .unwrap();
        assert_eq!(resolve_local(london, t), utc("2026-03-29T01:00:00Z"));
        let ny = tz("America/New_York").tz();
        let t = NaiveDate::from_ymd_opt(2026, 3, 8)
            .unwrap()
            .and_hms_opt(2, 15, 0)
            .unwrap();
        // 03:00 EDT
        assert_eq!(resolve_local(ny, t), utc("2026-03-08T07:00:00Z"));
    }

    #[test]
    fn ambiguous_local_time_resolves_to_first_occurrence() {
        let ny = tz("America/New_York").tz();
        let t = NaiveDate::from_ymd_opt(2026, 11, 1)
            .unwrap()
            .and_hms_opt(1, 30, 0)
            .unwrap();
        // 01:30 EDT (UTC-4), not 01:30 EST.
        assert_eq!(resolve_local(ny, t), utc("2026-11-01T05:30:00Z"));
    }

    #[test]
    fn next_open_after_skips_current_window() {
        let w = WindowHours::default();
        let z = tz("UTC");
        let next = w.next_open_after(&z, utc("2026-05-10T12:00:00Z"));
        assert_eq!(next.open, utc("2026-05-11T06:00:00Z"));
        let next = w.next_open_after(&z, utc("2026-05-10T03:00:00Z"));
        assert_eq!(next.open, utc("2026-05-10T06:00:00Z"));
    }

    proptest! {
        #[test]
        fn span_always_ends_after_at_and_is_well_formed(
            start in 0i64..24, end in 0i64..=24, secs in 1_700_000_000i64..1_900_000_000,
            zone in prop::sample::select(vec!["UTC", "Europe/London", "America/New_York", "Asia/Kuala_Lumpur", "Australia/Lord_Howe"]),
        ) {
            prop_assume!(start != end);
            let w = WindowHours::parse(start, end).unwrap();
            let at = DateTime::from_timestamp(secs, 0).unwrap();
            let span = w.span_at_or_after(&tz(zone), at);
            prop_assert!(span.open < span.close);
            prop_assert!(at < span.close);
            // A window is never longer than a day plus a DST shift.
            prop_assert!(span.close - span.open <= Duration::hours(25));
            // And inside it the local hour is within the window hours.
            if span.contains(at) {
                use chrono::Timelike;
                let h = at.with_timezone(&tz(zone).tz()).hour() as i64;
                let inside = if start < end { h >= start && h < end } else { h >= start || h < end };
                // DST days can stretch an hour at either edge.
                prop_assert!(inside || (h - start).abs() <= 1 || (h - end).abs() <= 1 || (h + 24 - end) % 24 <= 1);
            }
        }
    }
}
