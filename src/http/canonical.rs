//! Request paths in canonical form only. A path that a router, a proxy in
//! front of Herald and an access rule could each read differently is
//! refused with 400 before anything is looked up, rather than normalised:
//! Herald's CLI, console and every ordinary client only ever send the
//! canonical form, and refusing keeps a proxy's path rules (which see the
//! raw path) and Herald's router (which decodes it) from disagreeing.
//!
//! Refused: a percent-encoded letter, digit or `-._~` (it has a plain
//! spelling), an encoded `/` or `\` (one segment to the router, two to
//! many proxies), a malformed escape, an empty segment (`//`), a trailing
//! slash, a dot segment (`/./`, `/../`), a `;` parameter, a raw `\`.

use super::errors::{ApiError, Kind};

/// The rule a refusal names.
pub const RULE: &str = "must be in canonical form: no percent-encoded letter, digit or -._~, no \
encoded / or \\, no empty, '.' or '..' segment, no trailing slash, no ';' parameter";

/// Refuses `path` (as sent, not decoded) unless it is canonical.
pub fn check(path: &str) -> Result<(), ApiError> {
    match flaw(path) {
        None => Ok(()),
        Some(what) => {
            let mut e = ApiError::field_error(Kind::NonCanonicalPath, "path", RULE);
            e.detail = format!("the request path {path:?} has {what}; it {RULE}");
            Err(e)
        }
    }
}

/// What makes `path` non-canonical, if anything.
fn flaw(path: &str) -> Option<String> {
    if path == "/" {
        return None;
    }
    if !path.starts_with('/') {
        return Some("no leading slash".into());
    }
    if path.ends_with('/') {
        return Some("a trailing slash".into());
    }
    for seg in path[1..].split('/') {
        match seg {
            "" => return Some("an empty segment (//)".into()),
            "." | ".." => return Some(format!("a dot segment (/{seg}/)")),
            _ => {}
        }
    }
    if path.contains(';') {
        return Some("a ';' parameter".into());
    }
    if path.contains('\\') {
        return Some("a backslash".into());
    }
    let bytes = path.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = path
                .get(i + 1..i + 3)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
            let Some(hex) = hex else {
                return Some("a malformed percent escape".into());
            };
            let byte = u8::from_str_radix(hex, 16).expect("two hex digits");
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                return Some(format!(
                    "%{hex}, an encoded '{}' (write it as itself)",
                    byte as char
                ));
            }
            if byte == b'/' || byte == b'\\' {
                return Some(format!("%{hex}, an encoded '{}'", byte as char));
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_paths_pass() {
        for p in [
            "/",
            "/v1/users",
            "/v1/accounts/a-1/groups/120363000000000001%40g.us/labels",
            "/v1/accounts/a_b.c~d",
            "/accounts/x/pair/qr.png",
            "/v1/audit",
            "/media/%25",
        ] {
            assert!(check(p).is_ok(), "{p}");
        }
    }

    #[test]
    fn every_other_spelling_is_refused_naming_why() {
        for (p, why) in [
            ("/v1/user%73", "encoded 's'"),
            ("/v1/%61udit", "encoded 'a'"),
            ("/v1/qr%2Epng", "encoded '.'"),
            ("/v1/qr%2epng", "encoded '.'"),
            ("/v%31/users", "encoded '1'"),
            ("/v1/a%2Fb", "encoded '/'"),
            ("/v1/a%2fb", "encoded '/'"),
            ("/v1/a%5Cb", "encoded '\\'"),
            ("/v1/a%zz", "malformed"),
            ("/v1/a%4", "malformed"),
            ("/v1//users", "empty segment"),
            ("//v1/users", "empty segment"),
            ("/v1/users/", "trailing slash"),
            ("/v1/./users", "dot segment"),
            ("/v1/x/../users", "dot segment"),
            ("/v1/users;x=y", "';' parameter"),
            ("/v1\\users", "backslash"),
        ] {
            let e = check(p).unwrap_err();
            assert_eq!(e.kind, Kind::NonCanonicalPath, "{p}");
            assert_eq!(e.field.as_deref(), Some("path"));
            assert!(e.detail.contains(why), "{p}: {}", e.detail);
        }
    }
}
