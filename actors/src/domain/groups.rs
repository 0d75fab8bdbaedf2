//! The operator's groups: what a paired account reports it is in, the
//! directory Herald keeps of them per account, and the labels operators
//! put on them to target many groups at once.

use super::{AccountId, GroupJid, ValidationError};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;

/// An operator's tag on a group ("clients", "kl-east"): 1–40 of
/// `a-z 0-9 _ -`, starting with a letter or digit, so it reads the same in
/// a URL query, a CSV file and a shell.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(transparent)]
#[schemars(inline)]
pub struct Label(String);

impl Label {
    pub const MAX_LEN: usize = 40;
    pub const RULE: &'static str =
        "must be 1–40 characters of a-z, 0-9, '_' or '-', starting with a letter or digit";

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        if super::ids::is_slug(s, Self::MAX_LEN) {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new("label", Self::RULE))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// At most this many labels on one group.
pub const MAX_LABELS: usize = 20;

/// A set of labels for one group: each valid, no repeats, at most
/// [`MAX_LABELS`]; kept sorted so stored and compared sets agree.
pub fn parse_labels<S: AsRef<str>>(raw: &[S]) -> Result<Vec<Label>, ValidationError> {
    if raw.len() > MAX_LABELS {
        return Err(ValidationError::new(
            "labels",
            format!("at most {MAX_LABELS} labels on a group"),
        ));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (i, s) in raw.iter().enumerate() {
        let label = Label::parse(s.as_ref())
            .map_err(|e| ValidationError::new(format!("labels[{i}]"), e.rule))?;
        if out.contains(&label) {
            return Err(ValidationError::new(
                format!("labels[{i}]"),
                format!("'{label}' is listed twice"),
            ));
        }
        out.push(label);
    }
    out.sort();
    Ok(out)
}

/// One group as the gateway reports it: what the account's membership
/// looks like right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct GroupInfo {
    pub jid: GroupJid,
    /// The group's name ("subject" in WhatsApp's terms).
    pub subject: String,
    pub participants: u32,
    /// Only admins may post.
    pub announce: bool,
    /// This account is an admin of the group.
    pub is_admin: bool,
    /// The community the group belongs to, if any.
    pub community: Option<GroupJid>,
}

impl GroupInfo {
    /// Whether this account may post: any member of an open group, only
    /// admins of an announcement group.
    pub fn can_post(&self) -> bool {
        !self.announce || self.is_admin
    }
}

/// A group in an account's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Group {
    pub account_id: AccountId,
    #[serde(flatten)]
    pub info: GroupInfo,
    pub can_post: bool,
    pub labels: Vec<Label>,
    /// `false` once a sync no longer lists it: the account left or was
    /// removed. Its labels are kept in case it comes back.
    pub member: bool,
    pub synced_at: DateTime<Utc>,
}

/// Which groups of one account to list.
#[derive(Debug, Clone)]
pub struct GroupFilter {
    pub account_id: AccountId,
    /// Case-insensitive substring of the group's name.
    pub name: Option<String>,
    pub can_post: Option<bool>,
    pub label: Option<Label>,
    /// Groups the account has left too (by default only current ones).
    pub include_left: bool,
    /// Keyset paging: groups whose JID sorts after this one.
    pub after: Option<GroupJid>,
    pub limit: u32,
}

impl GroupFilter {
    pub fn all_of(account_id: AccountId) -> Self {
        Self {
            account_id,
            name: None,
            can_post: None,
            label: None,
            include_left: false,
            after: None,
            limit: u32::MAX,
        }
    }
}

/// One page of a group listing, with the number of groups that match the
/// filter across all pages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupPage {
    pub items: Vec<Group>,
    pub total: u64,
}

/// What one sync changed in an account's directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct GroupSyncSummary {
    /// Groups seen for the first time (or again after leaving).
    pub added: u32,
    /// Groups whose name, size or posting rights changed.
    pub updated: u32,
    /// Groups the account is no longer in.
    pub left: u32,
    /// Groups the account is in now.
    pub total: u32,
}

/// The case-folded form names are matched on.
pub fn fold_name(s: &str) -> String {
    s.to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn labels_name_the_rule_and_the_offending_entry() {
        assert!(Label::parse("kl-east_2").is_ok());
        for bad in ["", "Clients", "-x", "a b", &"x".repeat(41)] {
            let e = Label::parse(bad).unwrap_err();
            assert_eq!(e.field, "label", "{bad:?}");
        }
        let e = parse_labels(&["a", "B"]).unwrap_err();
        assert_eq!(e.field, "labels[1]");
        let e = parse_labels(&["a", "b", "a"]).unwrap_err();
        assert_eq!(e.field, "labels[2]");
        assert!(e.rule.contains("twice"));
        let many: Vec<String> = (0..21).map(|i| format!("l{i}")).collect();
        assert_eq!(parse_labels(&many).unwrap_err().field, "labels");
        assert_eq!(
            parse_labels(&["b", "a"]).unwrap(),
            vec![Label::parse("a").unwrap(), Label::parse("b").unwrap()],
            "stored sorted"
        );
    }

    #[test]
    fn only_admins_post_in_announcement_groups() {
        let mut g = GroupInfo {
            jid: GroupJid::parse("120363000000000001@g.us").unwrap(),
            subject: "x".into(),
            participants: 3,
            announce: false,
            is_admin: false,
            community: None,
        };
        assert!(g.can_post());
        g.announce = true;
        assert!(!g.can_post());
        g.is_admin = true;
        assert!(g.can_post());
    }

    proptest! {
        #[test]
        fn a_parsed_label_round_trips(s in "[a-z0-9][a-z0-9_-]{0,39}") {
            let l = Label::parse(&s).unwrap();
            prop_assert_eq!(l.as_str(), s.as_str());
            let json = serde_json::to_string(&l).unwrap();
            prop_assert_eq!(serde_json::from_str::<Label>(&json).unwrap(), l);
        }
    }
}
