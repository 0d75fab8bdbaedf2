//! Console sign-in: a random session id in an HttpOnly, SameSite=Strict
//! cookie; the session (its expiry and CSRF token) kept in the store, so a
//! restart or another daemon on the database keeps the operator signed in.
//! The store holds only the id's SHA-256, so a copy of the database opens
//! no session. The daemon's token is only compared at sign-in, never
//! stored in the cookie, so a stolen cookie dies with its session
//! (sign-out or expiry) and never reveals the token the CLI and API use.
//!
//! A session opened with the daemon's own token (or while the port had
//! none) ends with that token: it keeps a mark of the token, derived with
//! the session's id (which the store does not have), and a daemon running
//! with another token finds the mark wrong and signs the session out. So
//! rotating `control.token` ends every console session the old one opened,
//! on every daemon sharing the database. A user's session ends when the
//! user is revoked.

use crate::http::principal::Principal;
use crate::settings::Secret;
use crate::token::random_token;
use chrono::{DateTime, Duration, Utc};
use herald_actors::domain::ConsoleSession;
use herald_actors::ports::{IdentityStore, StoreResult};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq as _;

pub const COOKIE: &str = "herald_session";
/// A session lasts this long from sign-in; the operator signs in again.
pub const LIFETIME: Duration = Duration::hours(12);
/// At most this many live sessions per user: signing in again and again
/// (a script gone wrong, or someone evicting others) ends that user's
/// oldest instead of growing without bound, and never another user's.
pub const MAX_SESSIONS_PER_USER: u32 = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub csrf: String,
    pub expires: DateTime<Utc>,
    /// Who signed in: their role decides what the console lets them do.
    pub user: Principal,
}

pub struct Sessions {
    store: Arc<dyn IdentityStore>,
    /// The daemon's token; `None` with `control.token = "none"`.
    daemon: Option<Arc<Secret>>,
}

/// What the store keeps of a session id.
fn id_hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

/// The mark of the daemon's token (or of the open port) a built-in
/// principal's session `id` keeps: a hash of both, so neither the
/// database alone (no id) nor the cookie alone (no token) makes it.
fn token_mark(id: &str, daemon: Option<&Secret>) -> String {
    let mut h = Sha256::new();
    h.update(b"herald console session\0");
    h.update(id.as_bytes());
    match daemon {
        Some(token) => {
            h.update(b"\0token\0");
            h.update(token.expose().as_bytes());
        }
        None => h.update(b"\0open"),
    }
    hex::encode(h.finalize())
}

impl Sessions {
    pub fn new(store: Arc<dyn IdentityStore>, daemon: Option<Secret>) -> Self {
        Self {
            store,
            daemon: daemon.map(Arc::new),
        }
    }

    fn mark(&self, id: &str) -> String {
        token_mark(id, self.daemon.as_deref())
    }

    /// When `user`'s token ends, if it is a user's and ends: a sign-in
    /// ends no later.
    pub async fn token_end(&self, user: &Principal) -> StoreResult<Option<DateTime<Utc>>> {
        match user.user_id {
            Some(id) => Ok(self.store.get_user(id).await?.expires_at),
            None => Ok(None),
        }
    }

    /// A new session for `user` from `now`, stored before it is handed
    /// out; it ends with the user's token if that ends sooner.
    pub async fn open(
        &self,
        now: DateTime<Utc>,
        user: Principal,
        user_expires: Option<DateTime<Utc>>,
    ) -> StoreResult<Session> {
        let end = now + LIFETIME;
        let session = Session {
            id: random_token(),
            csrf: random_token(),
            expires: user_expires.map_or(end, |t| t.min(end)),
            user,
        };
        let token_mark = session
            .user
            .user_id
            .is_none()
            .then(|| self.mark(&session.id));
        let stored = ConsoleSession {
            id_hash: id_hash(&session.id),
            csrf: session.csrf.clone(),
            expires_at: session.expires,
            user_id: session.user.user_id,
            user_name: session.user.name.clone(),
            role: session.user.role,
            token_mark,
        };
        self.store
            .put_console_session(&stored, now, MAX_SESSIONS_PER_USER)
            .await?;
        Ok(session)
    }

    /// The session `id` names, if it has not expired at `now` and, for a
    /// built-in principal, was opened with the token this daemon has. A
    /// store that cannot answer signs nobody in.
    pub async fn get(&self, id: &str, now: DateTime<Utc>) -> Option<Session> {
        let found = match self.store.get_console_session(&id_hash(id), now).await {
            Ok(found) => found?,
            Err(e) => {
                tracing::warn!(error = %e, "could not read a console session");
                return None;
            }
        };
        if found.user_id.is_none() {
            let expected = self.mark(id);
            let given = found.token_mark.as_deref().unwrap_or("");
            if !bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
                tracing::info!(
                    user = %found.user_name,
                    "a console session opened with another control token ends: signed out"
                );
                if let Err(e) = self.close(id).await {
                    tracing::warn!(error = %e, "could not delete a stale console session");
                }
                return None;
            }
        }
        Some(Session {
            id: id.to_owned(),
            csrf: found.csrf,
            expires: found.expires_at,
            user: Principal {
                user_id: found.user_id,
                name: found.user_name,
                role: found.role,
            },
        })
    }

    pub async fn close(&self, id: &str) -> StoreResult<()> {
        self.store.delete_console_session(&id_hash(id)).await
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
/// Strict (no other site's page sends it), path `/`; `Secure` when the
/// browser came over HTTPS (through a proxy in `control.trusted_proxies`
/// that says so), so the browser never sends it over plain HTTP again.
/// The port itself speaks plain HTTP, meant for loopback.
pub fn set_cookie(s: &Session, secure: bool) -> String {
    format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        s.id,
        LIFETIME.num_seconds(),
        if secure { "; Secure" } else { "" }
    )
}

pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The live session a request's cookie names. Read once per request: the
/// console guard keeps what it read in the request's extensions, where the
/// page's own extractor finds it.
pub async fn session_of(req: &actix_web::HttpRequest) -> Option<Session> {
    use actix_web::HttpMessage;
    if let Some(s) = req.extensions().get::<Session>() {
        return Some(s.clone());
    }
    let sessions = req.app_data::<actix_web::web::Data<Sessions>>()?;
    let cookie = req
        .headers()
        .get(actix_web::http::header::COOKIE)
        .and_then(|v| v.to_str().ok());
    let id = cookie_value(cookie)?.to_owned();
    sessions.get(&id, Utc::now()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn a_session_expires_after_its_lifetime_and_on_close() {
        let store = Arc::new(herald_actors::memstore::MemoryStore::new());
        let sessions = Sessions::new(store.clone(), Some(Secret::new("token-a")));
        let t0 = at("2026-05-11T08:00:00Z");
        let s = sessions.open(t0, Principal::daemon(), None).await.unwrap();
        assert_eq!(s.id.len(), 64);
        assert_ne!(s.id, s.csrf);
        assert_eq!(
            sessions.get(&s.id, t0 + Duration::hours(11)).await,
            Some(s.clone())
        );
        assert_eq!(sessions.get(&s.id, t0 + LIFETIME).await, None);
        let s2 = sessions.open(t0, Principal::daemon(), None).await.unwrap();
        sessions.close(&s2.id).await.unwrap();
        assert_eq!(sessions.get(&s2.id, t0).await, None);
        assert_eq!(sessions.get("not-a-session", t0).await, None);
        // The store has the id's hash, never the id itself.
        use herald_actors::ports::ConsoleSessionStore;
        assert!(store
            .get_console_session(&s.id, t0)
            .await
            .unwrap()
            .is_none());
        let row = store
            .get_console_session(&id_hash(&s.id), t0)
            .await
            .unwrap()
            .expect("stored by hash");
        assert_eq!(row.csrf, s.csrf);
        // Another Sessions on the same store (a restart, another daemon)
        // knows the session.
        let again = Sessions::new(store.clone(), Some(Secret::new("token-a")));
        assert_eq!(again.get(&s.id, t0).await, Some(s.clone()));
        // A user's session keeps who and which role, and ends with the
        // user's token when that ends first.
        let ana = Principal {
            user_id: Some(3),
            name: "ana".into(),
            role: herald_actors::domain::Role::Viewer,
        };
        let short = sessions
            .open(t0, ana.clone(), Some(t0 + Duration::hours(1)))
            .await
            .unwrap();
        assert_eq!(short.expires, t0 + Duration::hours(1));
        let back = sessions.get(&short.id, t0).await.unwrap();
        assert_eq!(back.user, ana);
        assert_eq!(sessions.get(&short.id, t0 + Duration::hours(1)).await, None);
    }

    #[tokio::test]
    async fn a_rotated_token_ends_the_sessions_it_opened() {
        let store = Arc::new(herald_actors::memstore::MemoryStore::new());
        let t0 = at("2026-05-11T08:00:00Z");
        let under_a = Sessions::new(store.clone(), Some(Secret::new("token-a")));
        let open_port = Sessions::new(store.clone(), None);
        let ana = Principal {
            user_id: Some(3),
            name: "ana".into(),
            role: herald_actors::domain::Role::Viewer,
        };
        let daemons = under_a.open(t0, Principal::daemon(), None).await.unwrap();
        let hers = under_a.open(t0, ana, None).await.unwrap();
        let anonymous = open_port.open(t0, Principal::daemon(), None).await.unwrap();
        // The same token keeps it; the open port keeps its own.
        assert!(under_a.get(&daemons.id, t0).await.is_some());
        assert!(open_port.get(&anonymous.id, t0).await.is_some());
        assert!(
            under_a.get(&anonymous.id, t0).await.is_none(),
            "opened while the port had no token"
        );
        // A restart with token B: the daemon token's session is over (and
        // deleted), the user's is not the token's to end.
        let under_b = Sessions::new(store.clone(), Some(Secret::new("token-b")));
        assert!(under_b.get(&daemons.id, t0).await.is_none());
        assert!(under_b.get(&hers.id, t0).await.is_some());
        assert!(
            under_a.get(&daemons.id, t0).await.is_none(),
            "refused once, deleted: going back to A does not revive it"
        );
        // The mark is not the token: neither it nor the id's hash shows it.
        use herald_actors::ports::ConsoleSessionStore;
        let another = under_b.open(t0, Principal::daemon(), None).await.unwrap();
        let row = store
            .get_console_session(&id_hash(&another.id), t0)
            .await
            .unwrap()
            .unwrap();
        let mark = row.token_mark.unwrap();
        assert_eq!(mark.len(), 64);
        assert!(!mark.contains("token-b"));
        assert_ne!(mark, token_mark(&hers.id, Some(&Secret::new("token-b"))));
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
            user: Principal::daemon(),
        };
        let c = set_cookie(&s, false);
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict") && !c.contains("Secure"),
            "{c}"
        );
        assert!(set_cookie(&s, true).ends_with("; Secure"));
        assert!(clear_cookie(true).contains("Max-Age=0; Secure"));
        assert!(
            !c.contains("csrf-secret"),
            "the CSRF token is not in the cookie: {c}"
        );
    }
}
