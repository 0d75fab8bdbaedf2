//! Attempts that prove no identity (a wrong or missing bearer token: 401;
//! a failed console sign-in) and console sign-ins, on the audit trail
//! without letting a flood fill the disk: the first attempt of a kind from
//! an address in a minute writes an entry, the rest of that minute count
//! into it (`count`). Past [`MAX_ADDRESSES`] addresses in one minute the
//! rest share one entry.

use super::principal::Principal;
use chrono::{DateTime, Utc};
use herald_actors::domain::NewAuditEntry;
use herald_actors::ports::IdentityStore;
use std::collections::HashMap;
use std::sync::Arc;

/// Distinct (address, kind, actor) entries written in one minute, at most.
pub const MAX_ADDRESSES: usize = 256;
/// The remote named on the entry that counts the addresses past the cap.
pub const MANY: &str = "(more addresses)";
/// The actor of an attempt that proved no identity.
pub const NOBODY: &str = "(unauthenticated)";

/// What happened.
pub enum Attempt {
    /// `/v1` refused a missing or wrong bearer token (401).
    BadToken,
    /// A console sign-in with a token that is nobody's.
    SignInFailed,
    /// A console sign-in that opened a session for this principal.
    SignedIn(Principal),
}

/// Where and how the attempt came.
pub struct Origin<'a> {
    pub remote: String,
    pub via: &'a str,
    pub method: &'a str,
    pub path: &'a str,
}

type Key = (String, &'static str, String);

#[derive(Default)]
struct Minute {
    at: i64,
    entries: HashMap<Key, (i64, u32)>,
}

/// The per-minute counts, one set per daemon.
pub struct Attempts {
    store: Arc<dyn IdentityStore>,
    // Held across the store write, so two attempts of one key cannot both
    // write a first entry; a flood waits its turn here.
    minute: tokio::sync::Mutex<Minute>,
}

impl Attempts {
    pub fn new(store: Arc<dyn IdentityStore>) -> Self {
        Self {
            store,
            minute: Default::default(),
        }
    }

    /// Puts `attempt` on the trail: a new entry, or one more on this
    /// minute's entry for the same address, kind and actor.
    pub async fn note(&self, now: DateTime<Utc>, from: Origin<'_>, attempt: Attempt) {
        let (operation, status, who) = match attempt {
            Attempt::BadToken => ("failedAuthentication", 401, None),
            Attempt::SignInFailed => ("signInFailed", 401, None),
            Attempt::SignedIn(p) => ("signIn", 303, Some(p)),
        };
        let actor = who.as_ref().map_or(NOBODY.to_owned(), |p| p.name.clone());
        let mut m = self.minute.lock().await;
        let minute = now.timestamp().div_euclid(60);
        if m.at != minute {
            *m = Minute {
                at: minute,
                entries: HashMap::new(),
            };
        }
        let mut key = (from.remote.clone(), operation, actor.clone());
        if !m.entries.contains_key(&key) && m.entries.len() >= MAX_ADDRESSES {
            key.0 = MANY.to_owned();
        }
        let result = match m.entries.get_mut(&key) {
            Some((id, count)) => {
                *count += 1;
                self.store.set_audit_count(*id, *count).await
            }
            None => {
                let entry = NewAuditEntry {
                    at: now,
                    actor,
                    actor_id: who.as_ref().and_then(|p| p.user_id),
                    role: who.as_ref().map(|p| p.role),
                    via: from.via.into(),
                    operation: operation.into(),
                    method: from.method.into(),
                    path: from.path.into(),
                    resource: None,
                    summary: String::new(),
                    status,
                    remote: key.0.clone(),
                    count: 1,
                };
                self.store.append_audit(&entry).await.map(|id| {
                    m.entries.insert(key, (id, 1));
                })
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, operation, remote = %from.remote, "could not audit an attempt");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_actors::domain::{AuditFilter, Role};
    use herald_actors::memstore::MemoryStore;
    use herald_actors::ports::AuditStore;

    fn from(remote: &str) -> Origin<'static> {
        Origin {
            remote: remote.into(),
            via: "api",
            method: "GET",
            path: "/v1/runs",
        }
    }

    #[tokio::test]
    async fn a_flood_is_one_entry_per_address_and_minute() {
        let store = Arc::new(MemoryStore::new());
        let a = Attempts::new(store.clone());
        let t0: DateTime<Utc> = "2026-11-26T10:00:05Z".parse().unwrap();
        for i in 0..1000 {
            a.note(
                t0 + chrono::Duration::milliseconds(i * 50),
                from("10.0.0.1"),
                Attempt::BadToken,
            )
            .await;
        }
        a.note(t0, from("10.0.0.2"), Attempt::BadToken).await;
        // The next minute starts a new entry.
        a.note(
            t0 + chrono::Duration::seconds(60),
            from("10.0.0.1"),
            Attempt::BadToken,
        )
        .await;
        let all = store
            .list_audit(&AuditFilter::default(), None, 100)
            .await
            .unwrap();
        let got: Vec<(String, u32)> = all
            .iter()
            .rev()
            .map(|e| (e.entry.remote.clone(), e.entry.count))
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.1".into(), 1000),
                ("10.0.0.2".into(), 1),
                ("10.0.0.1".into(), 1)
            ]
        );
        assert!(all
            .iter()
            .all(|e| e.entry.role.is_none() && e.entry.actor == NOBODY));
        assert!(all.iter().all(|e| e.entry.status == 401));
    }

    #[tokio::test]
    async fn addresses_past_the_cap_share_an_entry_and_sign_ins_name_the_user() {
        let store = Arc::new(MemoryStore::new());
        let a = Attempts::new(store.clone());
        let t0: DateTime<Utc> = "2026-11-26T10:00:05Z".parse().unwrap();
        for i in 0..(MAX_ADDRESSES + 50) {
            a.note(
                t0,
                from(&format!("10.1.{}.{}", i / 250, i % 250)),
                Attempt::SignInFailed,
            )
            .await;
        }
        let ana = Principal {
            user_id: Some(3),
            name: "ana".into(),
            role: Role::Operator,
        };
        a.note(t0, from("10.9.9.9"), Attempt::SignedIn(ana.clone()))
            .await;
        a.note(t0, from("10.9.9.9"), Attempt::SignedIn(ana)).await;
        let all = store
            .list_audit(&AuditFilter::default(), None, 1000)
            .await
            .unwrap();
        assert_eq!(all.len(), MAX_ADDRESSES + 1 + 1);
        let many = all
            .iter()
            .find(|e| e.entry.remote == MANY && e.entry.operation == "signInFailed")
            .unwrap();
        assert_eq!(many.entry.count, 50);
        let signed = &all[0].entry;
        assert_eq!(
            (
                signed.actor.as_str(),
                signed.actor_id,
                signed.role,
                signed.count,
                signed.operation.as_str()
            ),
            ("ana", Some(3), Some(Role::Operator), 2, "signIn")
        );
    }
}
