use super::window::resolve_local;
use super::{TimeZone, ValidationError};
use chrono::{
    DateTime, FixedOffset, LocalResult, NaiveDateTime, Offset, TimeZone as _, Timelike, Utc,
};
use croner::parser::{CronParser, Seconds};
use croner::Cron;
use serde::{Deserialize, Serialize};

/// When a reminder fires, in its own timezone.
///
/// Local times are mapped to instants with [`resolve_local`]: a time that
/// does not exist fires at the first valid instant after it, an ambiguous
/// one fires once, at its first occurrence, unless a one-shot time's
/// [`Fold`] picks the second.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// Fires once at this local date-time.
    Once(NaiveDateTime, Fold),
    /// Fires on every local time matching a 5-field cron expression
    /// (minute hour day-of-month month day-of-week).
    Cron(Box<CronExpr>),
}

#[derive(Debug, Clone)]
pub struct CronExpr {
    source: String,
    cron: Cron,
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Once(a, f), Self::Once(b, g)) => a == b && f == g,
            (Self::Cron(a), Self::Cron(b)) => a.source == b.source,
            _ => false,
        }
    }
}
impl Eq for Schedule {}

/// Which instant a one-shot local time names when clocks go back and the
/// time happens twice. Elsewhere it changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fold {
    /// The first occurrence, still on summer time (the default).
    #[default]
    Earlier,
    /// The second occurrence, after the clocks went back.
    Later,
    /// An explicit UTC offset given with `at` (seconds east of UTC), not
    /// checked yet: [`Schedule::settle`] turns it into `Earlier` or `Later`
    /// against the reminder's timezone, or refuses it.
    Offset(i32),
}

impl Fold {
    pub const NAMES: &'static [&'static str] = &["earlier", "later"];

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        match s {
            "earlier" => Ok(Self::Earlier),
            "later" => Ok(Self::Later),
            _ => Err(ValidationError::new(
                "schedule.fold",
                "must be 'earlier' or 'later'",
            )),
        }
    }
}

/// What the local time `at` can mean in `tz`: the instants it names, with
/// their offsets (two in an overlap, none in a gap).
pub fn candidates(tz: &TimeZone, at: NaiveDateTime) -> Vec<DateTime<FixedOffset>> {
    let z = tz.tz();
    let fixed = |t: DateTime<chrono_tz::Tz>| t.with_timezone(&t.offset().fix());
    match z.from_local_datetime(&at) {
        LocalResult::Single(t) => vec![fixed(t)],
        LocalResult::Ambiguous(a, b) => vec![fixed(a), fixed(b)],
        LocalResult::None => Vec::new(),
    }
}

impl Schedule {
    /// The shape of `at` the API accepts (a date that does not exist, such
    /// as 2026-02-30, is still refused by `once`).
    pub const AT_PATTERN: &'static str = "^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.][0-9]{1,9})?)?(Z|[+-][0-9]{2}:[0-9]{2})?$";
    /// What `at` must look like, in words.
    pub const AT_RULE: &'static str = "must be a local date-time like 2026-12-01T09:00 (the reminder's timezone applies; an offset such as +01:00 may follow, to pick one of a time that happens twice)";
    /// Five fields of cron characters separated by spaces (whether they
    /// make a valid expression that matches some date is `cron`'s call).
    pub const CRON_PATTERN: &'static str = "^ *[0-9A-Za-z*,/?#-]+( +[0-9A-Za-z*,/?#-]+){4} *$";

    /// Accepts `2026-12-01T09:00`, `2026-12-01 09:00` or with `:SS`, each
    /// optionally followed by `Z` or an offset such as `+01:00`, which
    /// [`Schedule::settle`] checks against the reminder's timezone.
    pub fn once(local: &str) -> Result<Self, ValidationError> {
        let s = local.trim();
        let (s, offset) = split_offset(s);
        let fold = offset.map_or(Fold::Earlier, Fold::Offset);
        for fmt in [
            "%Y-%m-%dT%H:%M",
            "%Y-%m-%dT%H:%M:%S%.f",
            "%Y-%m-%d %H:%M",
            "%Y-%m-%d %H:%M:%S%.f",
        ] {
            if let Ok(t) = NaiveDateTime::parse_from_str(s, fmt) {
                return Ok(Self::Once(t, fold));
            }
        }
        Err(ValidationError::new("schedule.at", Self::AT_RULE))
    }

    /// Settles an explicit offset against `tz`: it must be the offset of
    /// one of the instants the local time names there; it becomes the fold
    /// that picks that instant.
    pub fn settle(&mut self, tz: &TimeZone) -> Result<(), ValidationError> {
        let Self::Once(at, fold) = self else {
            return Ok(());
        };
        let Fold::Offset(secs) = *fold else {
            return Ok(());
        };
        let found = candidates(tz, *at);
        let offsets: Vec<String> = found.iter().map(|t| t.offset().to_string()).collect();
        match offset_index(&found, secs) {
            Some(i) => {
                *fold = if i == 0 { Fold::Earlier } else { Fold::Later };
                Ok(())
            }
            None if found.is_empty() => Err(ValidationError::new(
                "schedule.at",
                format!(
                    "{} does not exist in {tz}: the clocks go forward over it; leave the offset out \
                     to fire at the end of the gap",
                    at.format("%Y-%m-%dT%H:%M")
                ),
            )),
            None => Err(ValidationError::new(
                "schedule.at",
                format!(
                    "offset {} is not {tz}'s at {}: it is {}",
                    fmt_offset(secs),
                    at.format("%Y-%m-%dT%H:%M"),
                    offsets.join(" or ")
                ),
            )),
        }
    }

    /// With `fold` for a one-shot time; a cron schedule takes none.
    pub fn with_fold(self, fold: Fold) -> Result<Self, ValidationError> {
        match self {
            Self::Once(_, Fold::Offset(_)) => Err(ValidationError::new(
                "schedule.fold",
                "give either a fold or an offset in 'at', not both",
            )),
            Self::Once(at, _) => Ok(Self::Once(at, fold)),
            Self::Cron(_) => Err(ValidationError::new(
                "schedule.fold",
                "only a one-shot 'at' takes a fold: a cron schedule fires at the first of a time \
                 that happens twice",
            )),
        }
    }

    pub fn cron(expr: &str) -> Result<Self, ValidationError> {
        let expr = expr.split_whitespace().collect::<Vec<_>>().join(" ");
        let fields = expr.split(' ').filter(|f| !f.is_empty()).count();
        if fields != 5 {
            return Err(ValidationError::new(
                "schedule.cron",
                format!(
                    "must have 5 fields (minute hour day-of-month month day-of-week), got {fields}"
                ),
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .build()
            .parse(&expr)
            .map_err(|e| {
                ValidationError::new(
                    "schedule.cron",
                    format!("is not a valid cron expression: {e}"),
                )
            })?;
        // A pattern like "0 0 31 2 *" parses but never matches.
        let probe = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).unwrap();
        if cron.find_next_occurrence(&probe, false).is_err() {
            return Err(ValidationError::new(
                "schedule.cron",
                "never matches any date",
            ));
        }
        Ok(Self::Cron(Box::new(CronExpr { source: expr, cron })))
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Once(..) => "once",
            Self::Cron(_) => "cron",
        }
    }

    /// The stored text: the local date-time (with ` fold=later` when it
    /// names the second of a repeated time) or the cron expression.
    pub fn expr(&self) -> String {
        match self {
            Self::Once(_, fold) => {
                let at = self.at().unwrap_or_default();
                match fold {
                    Fold::Later => format!("{at}{LATER_SUFFIX}"),
                    _ => at,
                }
            }
            Self::Cron(c) => c.source.clone(),
        }
    }

    /// A one-shot time's local date-time, as the API writes it.
    pub fn at(&self) -> Option<String> {
        match self {
            // %.f prints nothing for whole seconds, the digits otherwise.
            Self::Once(t, _) => Some(t.format("%Y-%m-%dT%H:%M:%S%.f").to_string()),
            Self::Cron(_) => None,
        }
    }

    /// A one-shot time's fold.
    pub fn fold(&self) -> Option<Fold> {
        match self {
            Self::Once(_, f) => Some(*f),
            Self::Cron(_) => None,
        }
    }

    /// Rebuilds a schedule from its stored `kind` and `expr`.
    pub fn from_parts(kind: &str, expr: &str) -> Result<Self, ValidationError> {
        match kind {
            "once" => match expr.strip_suffix(LATER_SUFFIX) {
                Some(at) => Self::once(at)?.with_fold(Fold::Later),
                None => Self::once(expr),
            },
            "cron" => Self::cron(expr),
            _ => Err(ValidationError::new(
                "schedule.kind",
                "must be 'once' or 'cron'",
            )),
        }
    }

    pub fn is_recurring(&self) -> bool {
        matches!(self, Self::Cron(_))
    }

    /// The first firing instant strictly after `after`.
    pub fn next_after(&self, tz: &TimeZone, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Self::Once(local, fold) => Some(resolve_once(tz, *local, *fold)).filter(|t| *t > after),
            Self::Cron(c) => {
                // Walk local wall-clock matches (cron is evaluated on a naive
                // clock, carried as UTC so croner sees no DST), mapping each to
                // an instant; the first one past `after` wins. Each wall time is
                // visited once, so a fall-back hour fires once.
                // Cron has minute resolution: start from a whole second so
                // a fraction of `after` is not carried into the occurrences.
                let mut cursor = after
                    .with_timezone(&tz.tz())
                    .naive_local()
                    .with_nanosecond(0)
                    .expect("zero nanoseconds is valid");
                for _ in 0..10_000 {
                    let naive = c
                        .cron
                        .find_next_occurrence(&Utc.from_utc_datetime(&cursor), false)
                        .ok()?
                        .naive_utc();
                    let at = resolve_local(tz.tz(), naive);
                    if at > after {
                        return Some(at);
                    }
                    cursor = naive;
                }
                None
            }
        }
    }

    /// The firing instants in `(after, until]`, oldest first, at most `limit`.
    pub fn occurrences(
        &self,
        tz: &TimeZone,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut cursor = after;
        while out.len() < limit {
            match self.next_after(tz, cursor) {
                Some(t) if t <= until => {
                    out.push(t);
                    cursor = t;
                }
                _ => break,
            }
        }
        out
    }
}

/// How a stored one-shot time says it names the second of a repeated time.
const LATER_SUFFIX: &str = " fold=later";

/// `2027-10-31T01:30+01:00` → (`2027-10-31T01:30`, Some(3600)).
fn split_offset(s: &str) -> (&str, Option<i32>) {
    if let Some(rest) = s.strip_suffix('Z') {
        return (rest, Some(0));
    }
    // The date's own dashes come before position 10; an offset is the
    // last six characters, after the time.
    if s.len() > 16 {
        let (head, tail) = s.split_at(s.len() - 6);
        let b = tail.as_bytes();
        if (b[0] == b'+' || b[0] == b'-') && b[3] == b':' {
            if let (Ok(h), Ok(m)) = (tail[1..3].parse::<i32>(), tail[4..6].parse::<i32>()) {
                let secs = h * 3600 + m * 60;
                return (head, Some(if b[0] == b'-' { -secs } else { secs }));
            }
        }
    }
    (s, None)
}

/// Which of a local time's `candidates` has the offset `secs`.
fn offset_index(found: &[DateTime<FixedOffset>], secs: i32) -> Option<usize> {
    found
        .iter()
        .position(|t| t.offset().local_minus_utc() == secs)
}

fn fmt_offset(secs: i32) -> String {
    FixedOffset::east_opt(secs).map_or_else(|| format!("{secs}s"), |o| o.to_string())
}

/// The instant a one-shot local time names: as [`resolve_local`], but the
/// second of a repeated time when the fold says so.
fn resolve_once(tz: &TimeZone, at: NaiveDateTime, fold: Fold) -> DateTime<Utc> {
    let found = candidates(tz, at);
    let pick = match fold {
        Fold::Earlier => None,
        Fold::Later => found.get(1),
        Fold::Offset(secs) => offset_index(&found, secs).map(|i| &found[i]),
    };
    pick.map_or_else(|| resolve_local(tz.tz(), at), |t| t.with_timezone(&Utc))
}

/// What a daylight-saving change does to an occurrence at `t` in `tz`, in
/// words an operator reads beside it; `None` on an ordinary day. A wall
/// time that falls in the spring-forward gap fires at the gap's end; one
/// in the autumn overlap fires once, and the note says at which of the
/// two, with both offsets.
pub fn dst_note(tz: &TimeZone, t: DateTime<Utc>) -> Option<String> {
    let z = tz.tz();
    let local = t.with_timezone(&z);
    if let [a, b] = candidates(tz, local.naive_local())[..] {
        let (first, second) = (a.offset(), b.offset());
        let which = if t == a {
            format!("at the first ({first}; \"fold\": \"later\" picks the second, {second})")
        } else {
            format!("at the second ({second}; the first is {first})")
        };
        return Some(format!(
            "clocks go back that night: {} happens twice, and it fires once, {which}",
            local.format("%H:%M")
        ));
    }
    let before = (t - chrono::Duration::minutes(1)).with_timezone(&z);
    let jumped = local.naive_local() - before.naive_local() > chrono::Duration::minutes(1);
    if before.offset().fix() != local.offset().fix() && jumped {
        return Some(format!(
            "clocks go forward at {}: a time in the skipped hour fires at {}",
            (before.naive_local() + chrono::Duration::minutes(1)).format("%H:%M"),
            local.format("%H:%M")
        ));
    }
    None
}

impl Serialize for Schedule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        match self {
            Self::Once(_, fold) => {
                m.serialize_entry("at", &self.at())?;
                if *fold == Fold::Later {
                    m.serialize_entry("fold", "later")?;
                }
            }
            Self::Cron(c) => m.serialize_entry("cron", &c.source)?,
        }
        m.end()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule {
    at: Option<String>,
    cron: Option<String>,
    fold: Option<String>,
}

impl<'de> Deserialize<'de> for Schedule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawSchedule::deserialize(d)?;
        let parsed = match (raw.at, raw.cron) {
            (Some(at), None) => Self::once(&at),
            (None, Some(c)) => Self::cron(&c),
            _ => Err(ValidationError::new(
                "schedule",
                "must have exactly one of 'at' (one-shot local date-time) or 'cron'",
            )),
        };
        let parsed = match raw.fold {
            Some(f) => parsed.and_then(|s| Fold::parse(&f).and_then(|f| s.with_fold(f))),
            None => parsed,
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tz(name: &str) -> TimeZone {
        TimeZone::parse(name).unwrap()
    }

    fn utc(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn cron_needs_five_fields() {
        assert!(Schedule::cron("0 9 * * 1-5").is_ok());
        assert_eq!(
            Schedule::cron("0 0 9 * * 1").unwrap_err().field,
            "schedule.cron"
        );
        assert!(Schedule::cron("0 9 * *")
            .unwrap_err()
            .rule
            .contains("got 4"));
        assert!(Schedule::cron("61 9 * * *").is_err());
        assert!(Schedule::cron("0 0 31 2 *")
            .unwrap_err()
            .rule
            .contains("never"));
    }

    #[test]
    fn once_formats() {
        for s in [
            "2026-12-01T09:00",
            "2026-12-01 09:00",
            "2026-12-01T09:00:00",
        ] {
            assert!(matches!(Schedule::once(s), Ok(Schedule::Once(..))), "{s}");
        }
        // An offset is kept for `settle` to check against the timezone.
        assert_eq!(
            Schedule::once("2026-12-01T09:00+08:00").unwrap().fold(),
            Some(Fold::Offset(8 * 3600))
        );
        assert_eq!(
            Schedule::once("2026-12-01T09:00:00-03:30").unwrap().fold(),
            Some(Fold::Offset(-(3 * 3600 + 1800)))
        );
        assert_eq!(Schedule::once("tomorrow").unwrap_err().field, "schedule.at");
        assert!(Schedule::once("2026-12-01T09:00+8").is_err());
    }

    #[test]
    fn once_in_kuala_lumpur() {
        let s = Schedule::once("2026-12-01T09:00").unwrap();
        let z = tz("Asia/Kuala_Lumpur");
        assert_eq!(
            s.next_after(&z, utc("2026-11-30T00:00:00Z")),
            Some(utc("2026-12-01T01:00:00Z"))
        );
        // Once it has passed there is no next.
        assert_eq!(s.next_after(&z, utc("2026-12-01T01:00:00Z")), None);
    }

    #[test]
    fn weekly_cron_in_kuala_lumpur() {
        // Every Monday 09:00 KL = 01:00 UTC. 2026-11-23 is a Monday.
        let s = Schedule::cron("0 9 * * 1").unwrap();
        let z = tz("Asia/Kuala_Lumpur");
        let got = s.occurrences(
            &z,
            utc("2026-11-21T00:00:00Z"),
            utc("2026-12-08T00:00:00Z"),
            10,
        );
        assert_eq!(
            got,
            vec![
                utc("2026-11-23T01:00:00Z"),
                utc("2026-11-30T01:00:00Z"),
                utc("2026-12-07T01:00:00Z")
            ]
        );
    }

    #[test]
    fn cron_occurrences_are_whole_minutes_whatever_the_start() {
        let s = Schedule::cron("0 9 * * *").unwrap();
        let z = tz("UTC");
        let after: DateTime<Utc> = "2026-11-21T09:00:00.744Z".parse().unwrap();
        assert_eq!(s.next_after(&z, after), Some(utc("2026-11-22T09:00:00Z")));
        let before: DateTime<Utc> = "2026-11-21T08:59:59.500Z".parse().unwrap();
        assert_eq!(s.next_after(&z, before), Some(utc("2026-11-21T09:00:00Z")));
    }

    #[test]
    fn london_spring_forward_skipped_time_fires_at_end_of_gap() {
        // 2026-03-29 01:00 GMT -> 02:00 BST; 01:30 does not exist that day.
        let s = Schedule::cron("30 1 * * *").unwrap();
        let z = tz("Europe/London");
        let got = s.occurrences(
            &z,
            utc("2026-03-28T00:00:00Z"),
            utc("2026-03-30T12:00:00Z"),
            10,
        );
        assert_eq!(
            got,
            vec![
                utc("2026-03-28T01:30:00Z"),
                utc("2026-03-29T01:00:00Z"),
                utc("2026-03-30T00:30:00Z")
            ]
        );
    }

    #[test]
    fn dst_notes_name_the_gap_and_the_overlap() {
        let z = tz("Europe/London");
        let gap = Schedule::once("2027-03-28T01:30").unwrap();
        let at = gap.next_after(&z, utc("2027-03-01T00:00:00Z")).unwrap();
        assert_eq!(
            dst_note(&z, at).as_deref(),
            Some("clocks go forward at 01:00: a time in the skipped hour fires at 02:00")
        );
        let overlap = Schedule::once("2027-10-31T01:30").unwrap();
        let at = overlap.next_after(&z, utc("2027-10-01T00:00:00Z")).unwrap();
        assert_eq!(
            dst_note(&z, at).as_deref(),
            Some(
                "clocks go back that night: 01:30 happens twice, and it fires once, at the first \
                 (+01:00; \"fold\": \"later\" picks the second, +00:00)"
            )
        );
        let later = overlap.clone().with_fold(Fold::Later).unwrap();
        let at = later.next_after(&z, utc("2027-10-01T00:00:00Z")).unwrap();
        assert_eq!(
            dst_note(&z, at).as_deref(),
            Some(
                "clocks go back that night: 01:30 happens twice, and it fires once, at the second \
                 (+00:00; the first is +01:00)"
            )
        );
        let plain = Schedule::once("2027-06-01T01:30").unwrap();
        let at = plain.next_after(&z, utc("2027-05-01T00:00:00Z")).unwrap();
        assert_eq!(dst_note(&z, at), None);
        assert_eq!(dst_note(&tz("UTC"), at), None);
    }

    #[test]
    fn london_fall_back_ambiguous_time_fires_once() {
        // 2026-10-25 02:00 BST -> 01:00 GMT; 01:30 happens twice, fire the first.
        let s = Schedule::cron("30 1 * * *").unwrap();
        let z = tz("Europe/London");
        let got = s.occurrences(
            &z,
            utc("2026-10-24T12:00:00Z"),
            utc("2026-10-26T12:00:00Z"),
            10,
        );
        assert_eq!(
            got,
            vec![utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")]
        );
    }

    #[test]
    fn new_york_every_15_minutes_across_both_transitions() {
        let s = Schedule::cron("*/15 * * * *").unwrap();
        let z = tz("America/New_York");
        // Spring forward 2026-03-08 02:00 EST -> 03:00 EDT: 02:00–02:45 all
        // collapse to 03:00 EDT (07:00 UTC), which fires once.
        let got = s.occurrences(
            &z,
            utc("2026-03-08T06:40:00Z"),
            utc("2026-03-08T07:20:00Z"),
            20,
        );
        assert_eq!(
            got,
            vec![
                utc("2026-03-08T06:45:00Z"),
                utc("2026-03-08T07:00:00Z"),
                utc("2026-03-08T07:15:00Z")
            ]
        );
        // Fall back 2026-11-01 02:00 EDT -> 01:00 EST: the repeated hour fires once.
        let got = s.occurrences(
            &z,
            utc("2026-11-01T04:50:00Z"),
            utc("2026-11-01T07:20:00Z"),
            20,
        );
        let expect: Vec<_> = [
            "05:00", "05:15", "05:30", "05:45", // 01:xx EDT
            "07:00", "07:15", // 02:00 EST onwards; 01:xx EST (06:xx UTC) skipped
        ]
        .iter()
        .map(|hm| utc(&format!("2026-11-01T{hm}:00Z")))
        .collect();
        assert_eq!(got, expect);
    }

    #[test]
    fn one_shot_in_gap_and_overlap() {
        let z = tz("America/New_York");
        let gap = Schedule::once("2026-03-08T02:30").unwrap();
        assert_eq!(
            gap.next_after(&z, utc("2026-03-01T00:00:00Z")),
            Some(utc("2026-03-08T07:00:00Z"))
        );
        let overlap = Schedule::once("2026-11-01T01:30").unwrap();
        assert_eq!(
            overlap.next_after(&z, utc("2026-10-01T00:00:00Z")),
            Some(utc("2026-11-01T05:30:00Z"))
        );
    }

    #[test]
    fn a_fold_or_an_offset_picks_either_instant_of_a_repeated_time() {
        // 2027-10-31 02:00 BST -> 01:00 GMT in London: 01:30 happens twice.
        let z = tz("Europe/London");
        let from = utc("2027-10-01T00:00:00Z");
        let fires = |json: &str| {
            let mut s: Schedule = serde_json::from_str(json).unwrap();
            s.settle(&z).unwrap();
            s.next_after(&z, from).unwrap()
        };
        let earlier = utc("2027-10-31T00:30:00Z");
        let later = utc("2027-10-31T01:30:00Z");
        assert_eq!(fires(r#"{"at":"2027-10-31T01:30"}"#), earlier);
        assert_eq!(
            fires(r#"{"at":"2027-10-31T01:30","fold":"earlier"}"#),
            earlier
        );
        assert_eq!(fires(r#"{"at":"2027-10-31T01:30","fold":"later"}"#), later);
        assert_eq!(fires(r#"{"at":"2027-10-31T01:30+01:00"}"#), earlier);
        assert_eq!(fires(r#"{"at":"2027-10-31T01:30+00:00"}"#), later);
        assert_eq!(fires(r#"{"at":"2027-10-31T01:30Z"}"#), later);
        // An offset settles into a fold, which is what is stored and shown.
        let mut s = Schedule::once("2027-10-31T01:30:00+00:00").unwrap();
        s.settle(&z).unwrap();
        assert_eq!(s.fold(), Some(Fold::Later));
        assert_eq!(s.expr(), "2027-10-31T01:30:00 fold=later");
        assert_eq!(Schedule::from_parts("once", &s.expr()).unwrap(), s);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"at":"2027-10-31T01:30:00","fold":"later"}"#
        );
        // On an ordinary day the fold changes nothing.
        let june = |json: &str| {
            let s: Schedule = serde_json::from_str(json).unwrap();
            s.next_after(&z, utc("2027-05-01T00:00:00Z")).unwrap()
        };
        assert_eq!(
            june(r#"{"at":"2027-06-01T09:00","fold":"later"}"#),
            june(r#"{"at":"2027-06-01T09:00"}"#)
        );
    }

    #[test]
    fn a_wrong_offset_or_fold_is_refused_naming_the_field() {
        let z = tz("Europe/London");
        let settle = |at: &str| {
            let mut s = Schedule::once(at).unwrap();
            s.settle(&z).map_err(|e| (e.field, e.rule))
        };
        let (field, rule) = settle("2027-10-31T01:30+05:00").unwrap_err();
        assert_eq!(field, "schedule.at");
        assert_eq!(
            rule,
            "offset +05:00 is not Europe/London's at 2027-10-31T01:30: it is +01:00 or +00:00"
        );
        let (_, rule) = settle("2027-06-01T09:00+00:00").unwrap_err();
        assert!(rule.ends_with("it is +01:00"), "{rule}");
        assert!(settle("2027-06-01T09:00+01:00").is_ok());
        let (field, rule) = settle("2027-03-28T01:30+00:00").unwrap_err();
        assert_eq!(field, "schedule.at");
        assert!(rule.contains("does not exist in Europe/London"), "{rule}");
        let err = |json: &str| {
            serde_json::from_str::<Schedule>(json)
                .unwrap_err()
                .to_string()
        };
        assert!(err(r#"{"cron":"30 1 * * *","fold":"later"}"#).contains("schedule.fold"));
        assert!(err(r#"{"at":"2027-10-31T01:30","fold":"second"}"#)
            .contains("must be 'earlier' or 'later'"));
        assert!(err(r#"{"at":"2027-10-31T01:30+00:00","fold":"later"}"#).contains("not both"));
    }

    #[test]
    fn json_forms() {
        let s: Schedule = serde_json::from_str(r#"{"cron":"0 9 * * 1"}"#).unwrap();
        assert_eq!(s.expr(), "0 9 * * 1");
        let s: Schedule = serde_json::from_str(r#"{"at":"2026-12-01T09:00"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"at":"2026-12-01T09:00:00"}"#
        );
        // Sub-second one-shot times keep their precision through the stored form.
        let s = Schedule::once("2026-12-01T09:00:00.250").unwrap();
        assert_eq!(s.expr(), "2026-12-01T09:00:00.250");
        assert_eq!(Schedule::from_parts("once", &s.expr()).unwrap(), s);
        assert!(serde_json::from_str::<Schedule>(r#"{}"#).is_err());
        assert!(serde_json::from_str::<Schedule>(
            r#"{"at":"2026-12-01T09:00","cron":"* * * * *"}"#
        )
        .is_err());
    }

    proptest! {
        #[test]
        fn next_after_is_strictly_later_and_matches_local_minute(
            minute in 0u32..60, hour in 0u32..24, secs in 1_700_000_000i64..1_850_000_000,
            zone in prop::sample::select(vec!["UTC", "Europe/London", "America/New_York", "Asia/Kuala_Lumpur"]),
        ) {
            let s = Schedule::cron(&format!("{minute} {hour} * * *")).unwrap();
            let z = tz(zone);
            let after = DateTime::from_timestamp(secs, 0).unwrap();
            let next = s.next_after(&z, after).unwrap();
            prop_assert!(next > after);
            // Daily schedules fire within about a day (DST can add an hour).
            prop_assert!(next - after <= chrono::Duration::hours(25));
            use chrono::Timelike;
            let local = next.with_timezone(&z.tz());
            // Either the exact wall time, or the end of a DST gap.
            prop_assert!((local.hour(), local.minute()) == (hour, minute) || local.minute() == 0);
        }
    }
}
