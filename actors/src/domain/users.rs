//! Who may drive the control port: named API users, each with one token
//! and one role, and the audit trail of what they wrote.

use super::error::ValidationError;
use chrono::{DateTime, Utc};
use std::fmt;
use std::str::FromStr;

/// What a token may do. Each role can do all the lower ones can:
/// `viewer` reads everything and fires nothing; `operator` also writes
/// reminders, runs, groups and media; `admin` also manages accounts,
/// pairing, users and the audit log.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl Role {
    pub const NAMES: &'static [&'static str] = &["viewer", "operator", "admin"];
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// This role may do what `needed` allows.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            _ => Err(ValidationError::new(
                "role",
                "must be one of viewer, operator, admin",
            )),
        }
    }
}

pub const MAX_USER_NAME_CHARS: usize = 64;

/// The names the control port's built-in principals act under: the
/// daemon's own token and the open port's anonymous caller. No user may
/// take one, so the audit log's actor and the console's per-identity
/// session cap never mix a user with either.
pub const BUILT_IN_PRINCIPALS: [&str; 2] = ["control.token", "anonymous"];

/// A user's name: 1 to 64 characters, ASCII letters, digits and `._@-`, so it
/// reads the same in a log line, a table column and a URL.
pub fn check_user_name(name: &str) -> Result<(), ValidationError> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'));
    if name.is_empty() || name.chars().count() > MAX_USER_NAME_CHARS || !ok_chars {
        return Err(ValidationError::new(
            "name",
            "must be 1 to 64 ASCII letters, digits or . _ @ -",
        ));
    }
    if BUILT_IN_PRINCIPALS
        .iter()
        .any(|b| b.eq_ignore_ascii_case(name))
    {
        return Err(ValidationError::new(
            "name",
            "must not be control.token or anonymous: the daemon's own token and the open port's \
             caller act under those names",
        ));
    }
    Ok(())
}

/// A named API user as stored. The token itself is never kept: only its
/// SHA-256, so a copy of the database opens nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiUser {
    pub id: i64,
    pub name: String,
    pub role: Role,
    pub token_hash: String,
    pub created_at: DateTime<Utc>,
    /// `None`: until revoked.
    pub expires_at: Option<DateTime<Utc>>,
    /// The name of whoever created it.
    pub created_by: String,
}

impl ApiUser {
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_none_or(|end| end > now)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiUser {
    pub name: String,
    pub role: Role,
    pub token_hash: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_by: String,
}

/// One write through the control port, as the audit log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub id: i64,
    pub entry: NewAuditEntry,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditEntry {
    pub at: DateTime<Utc>,
    /// The user's name (`control.token` for the daemon's own token).
    pub actor: String,
    /// The user's id; `None` for the daemon's own token.
    pub actor_id: Option<i64>,
    /// The actor's role; `None` for an attempt that proved no identity
    /// (a wrong token, a failed sign-in).
    pub role: Option<Role>,
    /// `api` or `console`.
    pub via: String,
    /// The operation id of the OpenAPI document (`createReminder`, …).
    pub operation: String,
    pub method: String,
    pub path: String,
    /// The id of what was written, when there is one.
    pub resource: Option<String>,
    /// A compact, bounded summary of the request.
    pub summary: String,
    /// The HTTP status the write answered.
    pub status: u16,
    /// Where it came from: the peer address, or `unix` for the socket.
    pub remote: String,
    /// How many attempts the entry stands for: 1 for a write; failed
    /// authentications and sign-ins are counted per address and minute
    /// into one entry, so a flood cannot fill the disk.
    pub count: u32,
    /// The daemon of the cluster that forwarded the write here (it was
    /// performed here for `actor`); `None` for a write made here.
    pub forwarded_by: Option<String>,
}

/// Which audit entries [`crate::ports::AuditStore::list_audit`] reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub actor: Option<String>,
    pub operation: Option<String>,
    pub resource: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

impl AuditFilter {
    pub fn matches(&self, e: &NewAuditEntry) -> bool {
        self.actor.as_ref().is_none_or(|a| *a == e.actor)
            && self.operation.as_ref().is_none_or(|o| *o == e.operation)
            && self
                .resource
                .as_ref()
                .is_none_or(|r| e.resource.as_ref() == Some(r))
            && self.since.is_none_or(|t| e.at >= t)
            && self.until.is_none_or(|t| e.at < t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_named() {
        assert!(Role::Admin.allows(Role::Operator));
        assert!(Role::Operator.allows(Role::Viewer));
        assert!(!Role::Viewer.allows(Role::Operator));
        assert!(!Role::Operator.allows(Role::Admin));
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>().unwrap(), r);
        }
        assert_eq!("root".parse::<Role>().unwrap_err().field, "role");
    }

    #[test]
    fn user_names_are_checked() {
        for ok in ["ana", "ops.bot", "x@y.example", "a_b-c", "Z9"] {
            check_user_name(ok).unwrap();
        }
        for bad in [
            "",
            "a b",
            "a/b",
            "Zoë",
            &"x".repeat(65),
            "control.token",
            "anonymous",
            "Anonymous",
            "CONTROL.TOKEN",
        ] {
            assert_eq!(check_user_name(bad).unwrap_err().field, "name", "{bad:?}");
        }
    }
}
