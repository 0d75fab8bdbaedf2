use super::ValidationError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// An operator-chosen account slug: 1–64 of `a-z 0-9 _ -`, starting with a
/// letter or digit. It names the account in URLs, metrics labels and logs, so
/// it is kept short and free of anything that needs escaping.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct AccountId(String);

impl AccountId {
    pub const MAX_LEN: usize = 64;
    /// The rule `parse` enforces, as a regular expression for the API
    /// document; a property test keeps the two in agreement.
    pub const PATTERN: &'static str = "^[a-z0-9][a-z0-9_-]{0,63}$";
    pub const RULE: &'static str =
        "must be 1–64 characters of a-z, 0-9, '_' or '-', starting with a letter or digit";

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let rule = Self::RULE;
        if is_slug(s, Self::MAX_LEN) {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new("account_id", rule))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AccountId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// 1–`max` of `a-z 0-9 _ -`, starting with a letter or digit: names that
/// read the same in a URL, a metrics label, a CSV file and a shell.
pub(crate) fn is_slug(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A WhatsApp group JID: `<id>@g.us`, where the id is digits, optionally
/// `creator-timestamp` as older groups have (`60123456789-1600000000@g.us`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct GroupJid(String);

impl GroupJid {
    const SUFFIX: &'static str = "@g.us";
    /// `parse`'s rule as a regular expression plus a length limit (the
    /// part before `@g.us` is at most 64 characters).
    pub const PATTERN: &'static str = "^[0-9]+(-[0-9]+)?@g[.]us$";
    pub const MAX_CHARS: usize = 64 + Self::SUFFIX.len();
    pub const RULE: &'static str =
        "must be a WhatsApp group JID: digits (optionally 'digits-digits') followed by '@g.us'";

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let rule = Self::RULE;
        let Some(local) = s.strip_suffix(Self::SUFFIX) else {
            return Err(ValidationError::new("group", rule));
        };
        let mut pieces = local.split('-');
        let ok = local.len() <= 64
            && pieces.clone().count() <= 2
            && pieces.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new("group", rule))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GroupJid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for GroupJid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Media is content-addressed: its id is the lowercase hex sha256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct MediaId(String);

impl MediaId {
    pub const PATTERN: &'static str = "^[0-9a-f]{64}$";
    pub const RULE: &'static str = "must be a sha256 in lowercase hex (64 characters)";

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        if s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new("media", Self::RULE))
        }
    }

    /// The id of these bytes.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        Self(hex::encode(Sha256::digest(bytes)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MediaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for MediaId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The database id of a run.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
#[schemars(inline)]
pub struct RunId(pub i64);

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An IANA timezone ("Asia/Kuala_Lumpur"). Fixed offsets and abbreviations
/// are refused: they do not follow DST and would drift twice a year.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimeZone(chrono_tz::Tz);

impl TimeZone {
    pub const RULE: &'static str =
        "must be an IANA timezone name such as 'Asia/Kuala_Lumpur' or 'UTC'";

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        match chrono_tz::Tz::from_str(s) {
            Ok(tz) if Self::accepted(s) => Ok(Self(tz)),
            _ => Err(ValidationError::new("timezone", Self::RULE)),
        }
    }

    /// chrono-tz accepts legacy aliases like "EST"; a name without a
    /// region is only accepted for UTC itself.
    fn accepted(name: &str) -> bool {
        name.contains('/') || name == "UTC"
    }

    /// Every name `parse` accepts, for the API document's enum.
    pub fn names() -> &'static [&'static str] {
        static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        NAMES.get_or_init(|| {
            chrono_tz::TZ_VARIANTS
                .iter()
                .map(|tz| tz.name())
                .filter(|n| Self::accepted(n))
                .collect()
        })
    }

    pub fn tz(&self) -> chrono_tz::Tz {
        self.0
    }

    pub fn name(&self) -> &'static str {
        self.0.name()
    }
}

impl fmt::Display for TimeZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name())
    }
}

impl Serialize for TimeZone {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name())
    }
}

impl<'de> Deserialize<'de> for TimeZone {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn account_id_rules() {
        assert!(AccountId::parse("sales-1").is_ok());
        assert!(AccountId::parse("0_ops").is_ok());
        for bad in ["", "-lead", "Sales", "a b", "é", &"a".repeat(65)] {
            let err = AccountId::parse(bad).unwrap_err();
            assert_eq!(err.field, "account_id", "{bad:?}");
        }
    }

    #[test]
    fn group_jid_rules() {
        assert!(GroupJid::parse("120363041234567890@g.us").is_ok());
        assert!(GroupJid::parse("60123456789-1600000000@g.us").is_ok());
        for bad in [
            "120363041234567890",
            "60123456789@s.whatsapp.net",
            "@g.us",
            "12a@g.us",
            "1-2-3@g.us",
            "-1@g.us",
            "1-@g.us",
        ] {
            let err = GroupJid::parse(bad).unwrap_err();
            assert!(err.rule.contains("@g.us"), "{bad}: {err}");
        }
    }

    #[test]
    fn media_id_is_sha256_of_bytes() {
        let id = MediaId::of_bytes(b"hello");
        assert_eq!(
            id.as_str(),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(MediaId::parse(id.as_str()).unwrap(), id);
        assert!(MediaId::parse(&id.as_str().to_uppercase()).is_err());
        assert!(MediaId::parse("abc").is_err());
    }

    #[test]
    fn timezone_names_are_exactly_the_accepted_ones() {
        let names = TimeZone::names();
        assert!(names.contains(&"Asia/Kuala_Lumpur") && names.contains(&"UTC"));
        for n in names {
            assert!(TimeZone::parse(n).is_ok(), "{n}");
        }
        for n in chrono_tz::TZ_VARIANTS.iter().map(|t| t.name()) {
            assert_eq!(TimeZone::parse(n).is_ok(), names.contains(&n), "{n}");
        }
    }

    #[test]
    fn timezone_rules() {
        assert_eq!(
            TimeZone::parse("Asia/Kuala_Lumpur").unwrap().name(),
            "Asia/Kuala_Lumpur"
        );
        assert!(TimeZone::parse("UTC").is_ok());
        for bad in ["EST", "Mars/Olympus", "", "+08:00"] {
            assert_eq!(TimeZone::parse(bad).unwrap_err().field, "timezone", "{bad}");
        }
    }

    proptest! {
        #[test]
        fn any_digit_group_parses(id in "[0-9]{1,30}", suffix in proptest::option::of("[0-9]{1,12}")) {
            let s = match suffix { Some(x) => format!("{id}-{x}@g.us"), None => format!("{id}@g.us") };
            let jid = GroupJid::parse(&s).unwrap();
            prop_assert_eq!(jid.as_str(), s.as_str());
        }

        #[test]
        fn account_id_roundtrips_through_json(s in "[a-z0-9][a-z0-9_-]{0,63}") {
            let id = AccountId::parse(&s).unwrap();
            let json = serde_json::to_string(&id).unwrap();
            prop_assert_eq!(serde_json::from_str::<AccountId>(&json).unwrap(), id);
        }

        #[test]
        fn patterns_accept_what_the_parsers_accept(s in "[a-z0-9_@.A-Z-]{0,70}|[0-9]{1,30}(-[0-9]{1,40})?@g[.]us|[0-9a-f]{63,65}") {
            let matches = |p: &str| regex_lite::Regex::new(p).unwrap().is_match(&s);
            prop_assert_eq!(AccountId::parse(&s).is_ok(), matches(AccountId::PATTERN), "{}", s);
            prop_assert_eq!(
                GroupJid::parse(&s).is_ok(),
                matches(GroupJid::PATTERN) && s.chars().count() <= GroupJid::MAX_CHARS,
                "{}", s
            );
            prop_assert_eq!(MediaId::parse(&s).is_ok(), matches(MediaId::PATTERN), "{}", s);
        }

        #[test]
        fn account_id_never_accepts_uppercase_or_space(s in ".*[A-Z ].*") {
            prop_assert!(AccountId::parse(&s).is_err());
        }
    }
}
