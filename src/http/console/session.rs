//! Console sign-in: a random session id in an HttpOnly, SameSite=Strict
//! cookie, the session (its expiry and CSRF token) kept here in memory.
//! The daemon's token is only compared at sign-in, never stored in the
//! cookie, so a stolen cookie dies with its session (sign-out, expiry or
//! a restart) and never reveals the token the CLI and API use.

use crate::token::random_token;
use chrono::{DateTime, Duration, Utc};
use std::collections::HashMap;
use std::sync::Mutex;

pub const COOKIE: &str = "herald_session";
/// A session lasts this long from sign-in; the operator signs in again.
pub const LIFETIME: Duration = Duration::hours(12);
/// At most this many live sessions: signing in again and again (a script
/// gone wrong) evicts the oldest instead of growing without bound.
const MAX_SESSIONS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub csrf: String,
    pub expires: DateTime<Utc>,
}

#[derive(Default)]
pub struct Sessions {
    live: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    pub fn new() -> Self {
        Self::default()
    }

    /// A new session from `now`.
    pub fn open(&self, now: DateTime<Utc>) -> Session {
        let session = Session {
            id: random_token(),
            csrf: random_token(),
            expires: now + LIFETIME,
        };
        let mut live = self.live.lock().expect("sessions lock");
        live.retain(|_, s| s.expires > now);
        if live.len() >= MAX_SESSIONS {
            if let Some(oldest) = live
                .values()
                .min_by_key(|s| s.expires)
                .map(|s| s.id.clone())
            {
                live.remove(&oldest);
            }
        }
        live.insert(session.id.clone(), session.clone());
        session
    }

    /// The session `id` names, if it has not expired at `now`.
    pub fn get(&self, id: &str, now: DateTime<Utc>) -> Option<Session> {
        let mut live = self.live.lock().expect("sessions lock");
        match live.get(id) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                live.remove(id);
                None
            }
            None => None,
        }
    }

    pub fn close(&self, id: &str) {
        self.live.lock().expect("sessions lock").remove(id);
    }
}

/// The session id in a `Cookie` header, if there is one.
pub fn cookie_value(header: Option<&str>) -> Option<&str> {
    header?
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// `Set-Cookie` for a session: HttpOnly (no script reads it), SameSite=
/// Strict (no other site's page sends it), path `/`. Not `Secure`: the
/// port is plain HTTP on loopback; behind TLS the proxy may add it.
pub fn set_cookie(s: &Session) -> String {
    format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        s.id,
        LIFETIME.num_seconds()
    )
}

pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The live session a request's cookie names.
pub fn session_of(req: &actix_web::HttpRequest) -> Option<Session> {
    let sessions = req.app_data::<actix_web::web::Data<Sessions>>()?;
    let cookie = req
        .headers()
        .get(actix_web::http::header::COOKIE)
        .and_then(|v| v.to_str().ok());
    sessions.get(cookie_value(cookie)?, Utc::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_session_expires_after_its_lifetime_and_on_close() {
        let sessions = Sessions::new();
        let t0 = at("2026-05-11T08:00:00Z");
        let s = sessions.open(t0);
        assert_eq!(s.id.len(), 64);
        assert_ne!(s.id, s.csrf);
        assert_eq!(
            sessions.get(&s.id, t0 + Duration::hours(11)),
            Some(s.clone())
        );
        assert_eq!(sessions.get(&s.id, t0 + LIFETIME), None);
        let s2 = sessions.open(t0);
        sessions.close(&s2.id);
        assert_eq!(sessions.get(&s2.id, t0), None);
        assert_eq!(sessions.get("not-a-session", t0), None);
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = Sessions::new();
        let t0 = at("2026-05-11T08:00:00Z");
        let first = sessions.open(t0);
        for i in 1..=MAX_SESSIONS as i64 {
            sessions.open(t0 + Duration::seconds(i));
        }
        assert_eq!(sessions.live.lock().unwrap().len(), MAX_SESSIONS);
        assert_eq!(sessions.get(&first.id, t0), None);
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        assert_eq!(
            cookie_value(Some("a=1; herald_session=abc; b=2")),
            Some("abc")
        );
        assert_eq!(cookie_value(Some("herald_session=")), None);
        assert_eq!(cookie_value(Some("xherald_session=abc")), None);
        assert_eq!(cookie_value(None), None);
        let s = Session {
            id: "abc".into(),
            csrf: "csrf-secret".into(),
            expires: at("2026-05-11T08:00:00Z"),
        };
        let c = set_cookie(&s);
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict"),
            "{c}"
        );
        assert!(
            !c.contains("csrf-secret"),
            "the CSRF token is not in the cookie: {c}"
        );
    }
}
