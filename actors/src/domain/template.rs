//! Message templates: a reminder's text and captions with variables
//! (`{group_name}`, `{date}`, `{time}`, `{weekday}`, `{title}`) and
//! alternatives (`{Hello|Hi|Good morning}`). Sending the same bytes to a
//! thousand groups is what WhatsApp's spam classifier bans for ("sent the
//! same message to too many people"), so each group can get its own wording.
//!
//! The choice is a pure function of (run, group, part) — never a process
//! RNG — so a part resent after a crash carries the same text as the send
//! it repeats. With `unique` the choice is a permutation of the target's
//! position instead, so no two groups of a run get the same variant.
//!
//! Syntax: `{{` and `}}` are literal braces; `{name}` is a variable;
//! `{a|b}` picks one alternative (plain text, at least two, all different;
//! an empty one is allowed: `{Hi |}`).

use super::{GroupJid, RunId, TimeZone, ValidationError};
use chrono::{DateTime, Utc};
use std::collections::HashSet;

/// Variables an operator may use, with what each becomes.
pub const VARIABLES: [(&str, &str); 5] = [
    (
        "group_name",
        "the group's subject, or \"everyone\" when Herald does not know it",
    ),
    (
        "date",
        "the run's date in the reminder's timezone, e.g. 23 Nov 2026",
    ),
    ("time", "the run's scheduled local time, e.g. 09:00"),
    ("weekday", "the run's local weekday, e.g. Monday"),
    ("title", "the reminder's title"),
];

/// What `{group_name}` becomes when the group's subject is unknown.
pub const GROUP_NAME_FALLBACK: &str = "everyone";

/// Longest value a variable may stand for, for the length check at save time.
const MAX_VAR_CHARS: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    GroupName,
    Date,
    Time,
    Weekday,
    Title,
}

impl Var {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "group_name" => Self::GroupName,
            "date" => Self::Date,
            "time" => Self::Time,
            "weekday" => Self::Weekday,
            "title" => Self::Title,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Var(Var),
    Choice(Vec<String>),
}

/// A parsed template. Parse once at save time (to refuse bad input), and
/// again at send time from the stored text (parsing is cheap and pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
}

/// The values variables take for one run (the same for all its groups but
/// `group_name`). Times come from the run's scheduled time, never "now",
/// so a resend renders the same bytes.
#[derive(Debug, Clone)]
pub struct RenderVars<'a> {
    pub scheduled_for: DateTime<Utc>,
    pub timezone: &'a TimeZone,
    pub title: &'a str,
    pub group_name: Option<&'a str>,
}

/// Which group of which run a rendering is for.
#[derive(Debug, Clone, Copy)]
pub struct Pick<'a> {
    pub run: RunId,
    pub group: &'a GroupJid,
    /// The part's index in the reminder.
    pub part: u32,
    /// The target's position in the run (its order, frozen at creation).
    pub position: u32,
    /// No two positions below the variant count get the same variant.
    pub unique: bool,
}

impl Template {
    /// Parses `text`; the error names `field` and the rule broken.
    pub fn parse(text: &str, field: &str) -> Result<Self, ValidationError> {
        let err = |rule: String| ValidationError::new(field, rule);
        let mut segments = Vec::new();
        let mut lit = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|p| p.1) == Some('{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek().map(|p| p.1) == Some('}') => {
                    chars.next();
                    lit.push('}');
                }
                '}' => {
                    return Err(err(format!(
                        "a lone }} at character {} must be written }}}}",
                        text[..at].chars().count() + 1
                    )))
                }
                '{' => {
                    let start = text[..at].chars().count() + 1;
                    let mut inner = String::new();
                    let mut closed = false;
                    for (_, c) in chars.by_ref() {
                        match c {
                            '}' => {
                                closed = true;
                                break;
                            }
                            '{' => {
                                return Err(err(format!(
                                    "the {{ at character {start} holds another {{: alternatives and variables do not nest"
                                )))
                            }
                            c => inner.push(c),
                        }
                    }
                    if !closed {
                        return Err(err(format!(
                            "the {{ at character {start} is never closed (write {{{{ for a literal brace)"
                        )));
                    }
                    if !lit.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut lit)));
                    }
                    segments.push(Self::braced(&inner, start).map_err(err)?);
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            segments.push(Segment::Literal(lit));
        }
        Ok(Self { segments })
    }

    fn braced(inner: &str, start: usize) -> Result<Segment, String> {
        if inner.contains('|') {
            let options: Vec<String> = inner.split('|').map(str::to_owned).collect();
            let mut seen = HashSet::new();
            for o in &options {
                if !seen.insert(o) {
                    return Err(format!(
                        "the alternatives at character {start} repeat {o:?}: each must differ"
                    ));
                }
            }
            return Ok(Segment::Choice(options));
        }
        let name = inner.trim();
        Var::parse(name).map(Segment::Var).ok_or_else(|| {
            let known: Vec<String> = VARIABLES.iter().map(|(n, _)| format!("{{{n}}}")).collect();
            format!(
                "unknown variable {{{name}}} at character {start}; known: {}; alternatives look like {{Hi|Hello}}",
                known.join(", ")
            )
        })
    }

    /// A template without variables or alternatives renders as itself.
    /// Whether rendering needs the group's name.
    pub fn uses_group_name(&self) -> bool {
        self.segments
            .iter()
            .any(|s| matches!(s, Segment::Var(Var::GroupName)))
    }

    pub fn is_plain(&self) -> bool {
        self.segments
            .iter()
            .all(|s| matches!(s, Segment::Literal(_)))
    }

    /// How many different choices of alternatives it has (saturating).
    pub fn variants(&self) -> u128 {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::Choice(o) => Some(o.len() as u128),
                _ => None,
            })
            .fold(1u128, u128::saturating_mul)
    }

    /// The most characters a rendering can have, variables at their longest.
    pub fn max_chars(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => l.chars().count(),
                Segment::Var(_) => MAX_VAR_CHARS,
                Segment::Choice(o) => o.iter().map(|x| x.chars().count()).max().unwrap_or(0),
            })
            .sum()
    }

    /// The variant index for `pick`, in `0..variants()` (capped at 2^64).
    pub fn variant_for(&self, pick: &Pick<'_>) -> u128 {
        let space = self.variants().min(1u128 << 64);
        if space <= 1 {
            return 0;
        }
        let run = pick.run.0.to_le_bytes();
        let part = pick.part.to_le_bytes();
        if pick.unique {
            // (a × position + b) mod space with a coprime to space is a
            // bijection on 0..space: distinct positions, distinct variants.
            let mut a = u128::from(mix(&[b"a", &run, &part])) % space;
            while gcd(a, space) != 1 {
                a = (a + 1) % space;
            }
            let b = u128::from(mix(&[b"b", &run, &part])) % space;
            (a * u128::from(pick.position) + b) % space
        } else {
            u128::from(mix(&[b"g", &run, pick.group.as_str().as_bytes(), &part])) % space
        }
    }

    /// Renders the variant `k` (mixed radix over the alternatives).
    pub fn render_variant(&self, mut k: u128, vars: &RenderVars<'_>) -> String {
        let local = vars.scheduled_for.with_timezone(&vars.timezone.tz());
        let mut out = String::new();
        for s in &self.segments {
            match s {
                Segment::Literal(l) => out.push_str(l),
                Segment::Var(v) => match v {
                    Var::GroupName => out.push_str(
                        vars.group_name
                            .filter(|n| !n.trim().is_empty())
                            .unwrap_or(GROUP_NAME_FALLBACK),
                    ),
                    Var::Date => out.push_str(&local.format("%-d %b %Y").to_string()),
                    Var::Time => out.push_str(&local.format("%H:%M").to_string()),
                    Var::Weekday => out.push_str(&local.format("%A").to_string()),
                    Var::Title => out.push_str(vars.title),
                },
                Segment::Choice(o) => {
                    let n = o.len() as u128;
                    out.push_str(&o[(k % n) as usize]);
                    k /= n;
                }
            }
        }
        out
    }

    /// The text `pick` receives.
    pub fn render(&self, pick: &Pick<'_>, vars: &RenderVars<'_>) -> String {
        self.render_variant(self.variant_for(pick), vars)
    }

    /// The texts of a run whose groups must all differ, by target
    /// position: the permutation's variant for each position, and where
    /// two variants render alike ("{a|ab}{bc|c}") the next unused one. A
    /// pure function of (run, part, count), so a resend after a crash
    /// recomputes the same text for the same position.
    pub fn unique_texts(
        &self,
        run: RunId,
        part: u32,
        groups: usize,
        vars: &RenderVars<'_>,
    ) -> Vec<String> {
        let space = self.variants().min(1u128 << 64);
        let group = GroupJid::parse("120363000000000000@g.us").expect("valid jid");
        let mut seen = HashSet::with_capacity(groups);
        let mut out = Vec::with_capacity(groups);
        for position in 0..groups as u32 {
            let pick = Pick {
                run,
                group: &group,
                part,
                position,
                unique: true,
            };
            let k = self.variant_for(&pick);
            let mut text = self.render_variant(k, vars);
            // Bounded probing: a template that passed `check_unique` needs
            // at most a few steps; beyond that a duplicate beats a stall.
            for step in 1..=UNIQUE_PROBES.min(space.saturating_sub(1)) {
                if !seen.contains(&text) {
                    break;
                }
                text = self.render_variant((k + step) % space, vars);
            }
            seen.insert(text.clone());
            out.push(text);
        }
        out
    }

    /// Refuses a template that cannot give `groups` distinct texts for a
    /// run, for the "no two groups alike" option: too few variants, or
    /// alternatives that render alike ("{a|ab}{bc|c}") too often.
    pub fn check_unique(
        &self,
        groups: usize,
        field: &str,
        vars: &RenderVars<'_>,
    ) -> Result<(), ValidationError> {
        let have = self.variants();
        if have < groups as u128 {
            return Err(ValidationError::new(
                field,
                format!(
                    "unique_texts needs at least {groups} different texts (one per group) but this template gives {have}; add alternatives such as {{Hi|Hello|Good morning}}"
                ),
            ));
        }
        let texts = self.unique_texts(RunId(1), 0, groups, vars);
        let distinct: HashSet<&String> = texts.iter().collect();
        if distinct.len() < groups {
            return Err(ValidationError::new(
                field,
                format!(
                    "unique_texts needs {groups} different texts but different alternatives of this template render alike (only {} distinct); make each alternative distinct on its own",
                    distinct.len()
                ),
            ));
        }
        Ok(())
    }
}

/// How far past a colliding variant [`Template::unique_texts`] looks.
const UNIQUE_PROBES: u128 = 256;

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A stable 64-bit hash of the pieces (FNV-1a, then a splitmix finaliser
/// to spread nearby inputs): the same on every machine and every release.
fn mix(pieces: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in pieces {
        for b in p.iter() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        // Separates ("ab","c") from ("a","bc").
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kl() -> TimeZone {
        TimeZone::parse("Asia/Kuala_Lumpur").unwrap()
    }

    fn vars(tz: &TimeZone) -> RenderVars<'_> {
        RenderVars {
            // Monday 09:00 in Kuala Lumpur.
            scheduled_for: "2026-11-23T01:00:00Z".parse().unwrap(),
            timezone: tz,
            title: "Standup",
            group_name: None,
        }
    }

    fn group(i: u32) -> GroupJid {
        GroupJid::parse(&format!("120363{i:012}@g.us")).unwrap()
    }

    fn pick(run: i64, g: &GroupJid, position: u32, unique: bool) -> Pick<'_> {
        Pick {
            run: RunId(run),
            group: g,
            part: 0,
            position,
            unique,
        }
    }

    #[test]
    fn variables_render_in_the_reminders_timezone() {
        let tz = kl();
        let t =
            Template::parse("{title}: {weekday} {date} at {time}, {group_name}!", "text").unwrap();
        let g = group(1);
        assert_eq!(
            t.render(&pick(1, &g, 0, false), &vars(&tz)),
            "Standup: Monday 23 Nov 2026 at 09:00, everyone!"
        );
        let named = RenderVars {
            group_name: Some("Sales KL"),
            ..vars(&tz)
        };
        assert!(t
            .render(&pick(1, &g, 0, false), &named)
            .ends_with("Sales KL!"));
    }

    #[test]
    fn plain_text_and_escaped_braces_render_as_written() {
        let tz = kl();
        let t = Template::parse("Room {{5}} at 9", "text").unwrap();
        assert!(t.is_plain());
        assert_eq!(t.variants(), 1);
        assert_eq!(
            t.render(&pick(1, &group(1), 0, true), &vars(&tz)),
            "Room {5} at 9"
        );
    }

    #[test]
    fn bad_templates_name_the_field_and_the_rule() {
        for (text, rule) in [
            ("Hi {name}", "unknown variable {name}"),
            ("Hi {Hello|Hi", "never closed"),
            ("Hi } there", "lone }"),
            ("{a|{b}}", "do not nest"),
            ("{Hi|Hi}", "repeat \"Hi\""),
            ("{}", "unknown variable {}"),
        ] {
            let e = Template::parse(text, "parts[2].text").unwrap_err();
            assert_eq!(e.field, "parts[2].text");
            assert!(e.rule.contains(rule), "{text}: {}", e.rule);
        }
    }

    #[test]
    fn unique_needs_enough_variants() {
        let tz = kl();
        let t = Template::parse("{Hi|Hello} {team|all}", "parts[0].text").unwrap();
        assert_eq!(t.variants(), 4);
        assert!(t.check_unique(4, "parts[0].text", &vars(&tz)).is_ok());
        let e = t.check_unique(5, "parts[0].text", &vars(&tz)).unwrap_err();
        assert_eq!(e.field, "parts[0].text");
        assert!(
            e.rule.contains("at least 5") && e.rule.contains("gives 4"),
            "{}",
            e.rule
        );
    }

    #[test]
    fn unique_refuses_alternatives_that_render_alike() {
        let tz = kl();
        // "a"+"bc" and "ab"+"c" are the same text.
        let t = Template::parse("{a|ab}{bc|c}", "text").unwrap();
        assert!(t.check_unique(4, "text", &vars(&tz)).is_err());
    }

    #[test]
    fn unique_holds_for_ten_thousand_groups() {
        let tz = kl();
        let t = Template::parse(
            "{Reminder: |Heads up: |}{Hello|Hi|Good morning|Hey|Dear all} {team|everyone|folks|all}, {the|our} {standup|daily standup|team sync|check-in} {starts|begins|is} {at|from} {time} {today|this morning}{.|!| :)}",
            "text",
        )
        .unwrap();
        assert!(t.variants() >= 10_000);
        t.check_unique(10_000, "text", &vars(&tz)).unwrap();
        for run in [1, 2, 987_654] {
            let texts: HashSet<String> = (0..10_000)
                .map(|i| t.render(&pick(run, &group(i), i, true), &vars(&tz)))
                .collect();
            assert_eq!(texts.len(), 10_000, "run {run}");
        }
    }

    /// Alternatives drawn at random: either the template gives 10,000
    /// distinct texts for 10,000 groups, or `check_unique` refuses it.
    fn choice_template() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                "[a-z ]{0,6}".prop_map(|s| s),
                proptest::collection::hash_set("[a-z]{1,4}", 2..6)
                    .prop_map(|o| format!("{{{}}}", o.into_iter().collect::<Vec<_>>().join("|"))),
            ],
            1..10,
        )
        .prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn same_run_and_group_render_the_same_text(
            text in choice_template(),
            run in any::<i64>(),
            g in 0u32..1_000_000,
            position in 0u32..10_000,
            unique in any::<bool>(),
        ) {
            let tz = kl();
            let t = Template::parse(&text, "text").unwrap();
            let jid = group(g);
            let a = t.render(&pick(run, &jid, position, unique), &vars(&tz));
            // A fresh parse, as after a crash: same bytes.
            let again = Template::parse(&text, "text").unwrap();
            prop_assert_eq!(a, again.render(&pick(run, &jid, position, unique), &vars(&tz)));
            let n = (position as usize % 300) + 1;
            prop_assert_eq!(
                t.unique_texts(RunId(run), 1, n, &vars(&tz)),
                again.unique_texts(RunId(run), 1, n, &vars(&tz))
            );
        }

        #[test]
        fn no_identical_text_for_10000_groups_or_refused(text in choice_template(), run in any::<i64>()) {
            let tz = kl();
            let t = Template::parse(&text, "text").unwrap();
            match t.check_unique(10_000, "text", &vars(&tz)) {
                Err(e) => prop_assert_eq!(e.field, "text"),
                Ok(()) => {
                    // Any run, any part: still 10,000 different texts.
                    for part in [0, 3] {
                        let texts = t.unique_texts(RunId(run), part, 10_000, &vars(&tz));
                        let distinct: HashSet<&String> = texts.iter().collect();
                        prop_assert_eq!(distinct.len(), 10_000);
                    }
                }
            }
        }
    }
}
