//! Target selectors: a reminder may name its groups by JID, or pick them
//! from its account's group directory (`all`, by label, by name), with
//! excludes. A selector is resolved when its run starts for the first time
//! and the result is stored with the run, each target saying how it was
//! chosen.

use super::{fold_name, Group, GroupJid, Label, ValidationError};
use serde::{Deserialize, Serialize};

/// Longest name pattern accepted.
pub const MAX_PATTERN_CHARS: usize = 100;
/// At most this many labels in one selector (as on one group).
pub const MAX_SELECT_LABELS: usize = super::MAX_LABELS;

/// A name pattern, matched case-insensitively on the whole group name:
/// without a wildcard it is a substring ("standup" matches "Daily Standup");
/// with `*` or `?` it is a glob where `*` stands for any run of characters,
/// `?` for exactly one, and the rest must match exactly ("kl-*" matches
/// "KL-East" but not "Team KL-East"; "group 00?" matches "Group 007").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct NamePattern(String);

impl NamePattern {
    pub const RULE: &'static str = "must be 1–100 characters, not only '*' and spaces";
    /// What [`NamePattern::RULE`] asks beyond the length, for the rule tables.
    pub const PATTERN: &'static str = "[^* ]";

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let n = s.chars().count();
        if n == 0 || n > MAX_PATTERN_CHARS || s.chars().all(|c| c == '*' || c == ' ') {
            return Err(ValidationError::new("name", Self::RULE));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a group's name matches.
    pub fn matches(&self, name: &str) -> bool {
        let name = fold_name(name);
        let pat = fold_name(&self.0);
        if !pat.contains(['*', '?']) {
            return name.contains(&pat);
        }
        glob(&pat, &name)
    }
}

/// Glob over the whole string (`*` any run, `?` one character), iterative
/// with backtracking to the last star (linear in practice, no regex engine
/// needed).
fn glob(pat: &str, s: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let s: Vec<char> = s.chars().collect();
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

impl<'de> Deserialize<'de> for NamePattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Which directory groups a reminder targets besides its explicit JIDs:
/// the union of `all`, any of `labels` and `name`, minus `exclude`. Only
/// groups the account is still in count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetSelector {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<Label>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<NamePattern>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<GroupJid>,
}

/// The JSON body of `select`, parsed field by field so an error names its
/// path (`select.labels[1]`, `select.exclude[0]`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectorRequest {
    #[serde(default)]
    pub all: bool,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
}

impl SelectorRequest {
    /// Parses under `select`; `explicit` are the reminder's JID targets,
    /// which may not also be excluded.
    pub fn parse(self, explicit: &[GroupJid]) -> Result<TargetSelector, ValidationError> {
        let labels = if self.labels.len() > MAX_SELECT_LABELS {
            return Err(ValidationError::new(
                "select.labels",
                format!("at most {MAX_SELECT_LABELS} labels"),
            ));
        } else {
            super::parse_labels(&self.labels).map_err(|e| e.under("select"))?
        };
        let name = self
            .name
            .as_deref()
            .map(NamePattern::parse)
            .transpose()
            .map_err(|e| ValidationError::new("select.name", e.rule))?;
        let mut exclude = Vec::with_capacity(self.exclude.len());
        for (i, s) in self.exclude.iter().enumerate() {
            let field = format!("select.exclude[{i}]");
            let jid = GroupJid::parse(s).map_err(|e| ValidationError::new(&field, e.rule))?;
            if exclude.contains(&jid) {
                return Err(ValidationError::new(
                    field,
                    format!("{jid} is listed twice"),
                ));
            }
            if explicit.contains(&jid) {
                return Err(ValidationError::new(
                    field,
                    format!(
                        "{jid} is also in targets; a group cannot be both targeted and excluded"
                    ),
                ));
            }
            exclude.push(jid);
        }
        if !self.all && labels.is_empty() && name.is_none() {
            return Err(ValidationError::new(
                "select",
                "must choose groups: all, labels or name",
            ));
        }
        Ok(TargetSelector {
            all: self.all,
            labels,
            name,
            exclude,
        })
    }
}

/// How a run target was chosen: `explicit`, `all`, `label:<label>` or
/// `name:<pattern>`; stored with the target.
pub fn chosen_by(sel: &TargetSelector, g: &Group) -> Option<String> {
    if sel.exclude.contains(&g.info.jid) {
        return None;
    }
    if sel.all {
        return Some("all".into());
    }
    if let Some(l) = sel.labels.iter().find(|l| g.labels.contains(l)) {
        return Some(format!("label:{l}"));
    }
    match &sel.name {
        Some(p) if p.matches(&g.info.subject) => Some(format!("name:{}", p.as_str())),
        _ => None,
    }
}

pub const CHOSEN_EXPLICIT: &str = "explicit";

/// A run's targets: the explicit JIDs in order, then the directory's
/// current groups the selector picks, in JID order, each once. `directory`
/// holds the account's groups; left ones are ignored. At most `cap`.
pub fn resolve_targets(
    explicit: &[GroupJid],
    sel: Option<&TargetSelector>,
    directory: &[Group],
    cap: usize,
) -> Vec<(GroupJid, String)> {
    let mut out: Vec<(GroupJid, String)> = explicit
        .iter()
        .map(|g| (g.clone(), CHOSEN_EXPLICIT.to_owned()))
        .collect();
    if let Some(sel) = sel {
        let seen: std::collections::HashSet<&GroupJid> = explicit.iter().collect();
        let mut picked: Vec<&Group> = directory
            .iter()
            .filter(|g| g.member && !seen.contains(&g.info.jid))
            .collect();
        picked.sort_by(|a, b| a.info.jid.cmp(&b.info.jid));
        for g in picked {
            if let Some(how) = chosen_by(sel, g) {
                out.push((g.info.jid.clone(), how));
            }
        }
    }
    out.truncate(cap);
    out
}

/// Longest import entry (a JID or a group name).
pub const MAX_ENTRY_CHARS: usize = 200;

/// An import entry that names no group the account is in, or several.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct Offender {
    /// Its index in the entries.
    pub index: usize,
    pub entry: String,
    /// How many groups the name matches: 0, or 2 and more.
    pub matches: usize,
}

/// Why an import was refused: every offender, none stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportRefused {
    pub offenders: Vec<Offender>,
}

impl From<ImportRefused> for ValidationError {
    /// The refusal as one rule naming the first 50 offenders.
    fn from(r: ImportRefused) -> Self {
        let n = r.offenders.len();
        let mut listed: Vec<String> = r
            .offenders
            .iter()
            .take(50)
            .map(|o| match o.matches {
                0 => format!("entries[{}] {:?} names no group", o.index, o.entry),
                m => format!("entries[{}] {:?} names {m} groups", o.index, o.entry),
            })
            .collect();
        if n > 50 {
            listed.push(format!("and {} more", n - 50));
        }
        ValidationError::new(
            "entries",
            format!(
                "each name must match exactly one group the account is in; {n} do not: {}",
                listed.join("; ")
            ),
        )
    }
}

/// Import: each entry is a group JID (taken as it is) or a group's name,
/// matched exactly but case-insensitively against the groups the account
/// is in. Answers the JIDs in entry order, each once; refused, naming
/// every offender, if a name matches no group or more than one.
pub fn resolve_entries(
    entries: &[String],
    directory: &[Group],
) -> Result<Vec<GroupJid>, ImportRefused> {
    let mut by_name: std::collections::HashMap<String, Vec<&GroupJid>> =
        std::collections::HashMap::new();
    for g in directory.iter().filter(|g| g.member) {
        by_name
            .entry(fold_name(g.info.subject.trim()))
            .or_default()
            .push(&g.info.jid);
    }
    let mut out: Vec<GroupJid> = Vec::with_capacity(entries.len());
    let mut offenders = Vec::new();
    for (i, raw) in entries.iter().enumerate() {
        let entry = raw.trim();
        let jid = match GroupJid::parse(entry) {
            Ok(jid) => jid,
            Err(_) => match by_name.get(&fold_name(entry)).map(Vec::as_slice) {
                Some([one]) => (*one).clone(),
                found => {
                    offenders.push(Offender {
                        index: i,
                        entry: entry.to_owned(),
                        matches: found.map_or(0, <[_]>::len),
                    });
                    continue;
                }
            },
        };
        if !out.contains(&jid) {
            out.push(jid);
        }
    }
    if !offenders.is_empty() {
        return Err(ImportRefused { offenders });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AccountId, GroupInfo};
    use proptest::prelude::*;

    fn group(n: u32, subject: &str, labels: &[&str], member: bool) -> Group {
        Group {
            account_id: AccountId::parse("acc").unwrap(),
            info: GroupInfo {
                jid: GroupJid::parse(&format!("1203630000{n:08}@g.us")).unwrap(),
                subject: subject.into(),
                participants: 3,
                announce: false,
                is_admin: false,
                community: None,
            },
            can_post: true,
            labels: labels.iter().map(|l| Label::parse(l).unwrap()).collect(),
            member,
            synced_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    fn sel(json: serde_json::Value) -> Result<TargetSelector, ValidationError> {
        serde_json::from_value::<SelectorRequest>(json)
            .unwrap()
            .parse(&[])
    }

    #[test]
    fn patterns_are_substrings_or_whole_name_globs() {
        let p = NamePattern::parse("standup").unwrap();
        assert!(p.matches("Daily STANDUP notes"));
        assert!(!p.matches("Stand up"));
        let g = NamePattern::parse("kl-*").unwrap();
        assert!(g.matches("KL-East"));
        assert!(g.matches("kl-"));
        assert!(!g.matches("Team KL-East"), "a glob matches the whole name");
        let g = NamePattern::parse("*east*2").unwrap();
        assert!(g.matches("KL east team 2"));
        assert!(!g.matches("KL east team 3"));
        for bad in ["", "*", " * ", &"x".repeat(101)] {
            assert!(NamePattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_question_mark_stands_for_exactly_one_character() {
        let q = NamePattern::parse("group 00?").unwrap();
        assert!(q.matches("Group 007"));
        assert!(q.matches("GROUP 00é"), "one character, not one byte");
        assert!(!q.matches("Group 00"), "not zero characters");
        assert!(!q.matches("Group 0071"), "not two");
        assert!(!q.matches("My group 007"), "a glob matches the whole name");
        let mixed = NamePattern::parse("kl-?*-2").unwrap();
        assert!(mixed.matches("KL-East-2"));
        assert!(mixed.matches("kl-e-2"));
        assert!(!mixed.matches("kl--2"));
    }

    #[test]
    fn each_rule_names_its_field() {
        let cases = [
            (serde_json::json!({}), "select"),
            (serde_json::json!({"all": false}), "select"),
            (
                serde_json::json!({"labels": ["ok", "Bad"]}),
                "select.labels[1]",
            ),
            (serde_json::json!({"name": "*"}), "select.name"),
            (
                serde_json::json!({"all": true, "exclude": ["x"]}),
                "select.exclude[0]",
            ),
            (
                serde_json::json!({"all": true, "exclude": ["120363000000000001@g.us", "120363000000000001@g.us"]}),
                "select.exclude[1]",
            ),
        ];
        for (json, field) in cases {
            assert_eq!(sel(json.clone()).unwrap_err().field, field, "{json}");
        }
        let explicit = [GroupJid::parse("120363000000000001@g.us").unwrap()];
        let e = serde_json::from_value::<SelectorRequest>(
            serde_json::json!({"all": true, "exclude": ["120363000000000001@g.us"]}),
        )
        .unwrap()
        .parse(&explicit)
        .unwrap_err();
        assert_eq!(e.field, "select.exclude[0]");
        assert!(e.rule.contains("also in targets"), "{}", e.rule);
    }

    #[test]
    fn every_selector_kind_and_their_union() {
        let dir = vec![
            group(3, "KL East", &["clients"], true),
            group(1, "Penang", &["staff"], true),
            group(2, "KL West", &[], true),
            group(4, "KL Old", &["clients"], false),
            group(5, "Ipoh", &[], true),
        ];
        let jids = |r: &[(GroupJid, String)]| {
            r.iter()
                .map(|(g, how)| format!("{}={how}", &g.as_str()[12..18]))
                .collect::<Vec<_>>()
        };
        let all =
            sel(serde_json::json!({"all": true, "exclude": ["120363000000000005@g.us"]})).unwrap();
        assert_eq!(
            jids(&resolve_targets(&[], Some(&all), &dir, 100)),
            ["000001=all", "000002=all", "000003=all"],
            "members only, excludes out, JID order"
        );
        let by_label = sel(serde_json::json!({"labels": ["clients", "staff"]})).unwrap();
        assert_eq!(
            jids(&resolve_targets(&[], Some(&by_label), &dir, 100)),
            ["000001=label:staff", "000003=label:clients"]
        );
        let by_name = sel(serde_json::json!({"name": "kl *"})).unwrap();
        assert_eq!(
            jids(&resolve_targets(&[], Some(&by_name), &dir, 100)),
            ["000002=name:kl *", "000003=name:kl *"]
        );
        let both = sel(serde_json::json!({"labels": ["staff"], "name": "kl", "exclude": ["120363000000000003@g.us"]}))
            .unwrap();
        let explicit = [group(5, "", &[], true).info.jid];
        assert_eq!(
            jids(&resolve_targets(&explicit, Some(&both), &dir, 100)),
            ["000005=explicit", "000001=label:staff", "000002=name:kl"],
            "explicit first, then the union of the selector's picks"
        );
        assert_eq!(resolve_targets(&explicit, Some(&all), &dir, 2).len(), 2);
    }

    #[test]
    fn import_takes_jids_and_exact_names_and_names_every_offender() {
        let dir = vec![
            group(1, "Sales KL", &[], true),
            group(2, "Dup", &[], true),
            group(3, "dup", &[], true),
            group(4, "Gone", &[], false),
        ];
        let e = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ok = resolve_entries(
            &e(&[" sales kl ", "120363000000000009@g.us", "SALES KL"]),
            &dir,
        )
        .unwrap();
        assert_eq!(
            ok,
            vec![
                dir[0].info.jid.clone(),
                GroupJid::parse("120363000000000009@g.us").unwrap()
            ]
        );
        let refused = resolve_entries(&e(&["Sales", "dup", "Gone", "Sales KL"]), &dir).unwrap_err();
        let o = |index: usize, entry: &str, matches: usize| Offender {
            index,
            entry: entry.to_owned(),
            matches,
        };
        assert_eq!(
            refused.offenders,
            vec![o(0, "Sales", 0), o(1, "dup", 2), o(2, "Gone", 0)]
        );
        let err = ValidationError::from(refused);
        assert_eq!(err.field, "entries");
        assert!(err.rule.contains("3 do not"), "{}", err.rule);
        assert!(
            err.rule.contains(r#"entries[0] "Sales" names no group"#),
            "{}",
            err.rule
        );
        assert!(
            err.rule.contains(r#"entries[1] "dup" names 2 groups"#),
            "{}",
            err.rule
        );
        assert!(
            err.rule.contains(r#"entries[2] "Gone" names no group"#),
            "{}",
            err.rule
        );
    }

    proptest! {
        #[test]
        fn a_pattern_without_star_is_a_substring(name in "[a-zA-Z ]{0,20}", pat in "[a-zA-Z]{1,5}") {
            let p = NamePattern::parse(&pat).unwrap();
            prop_assert_eq!(p.matches(&name), name.to_lowercase().contains(&pat.to_lowercase()));
            let star = NamePattern::parse(&format!("*{pat}*")).unwrap();
            prop_assert_eq!(star.matches(&name), p.matches(&name));
        }
    }
}
