//! Attempts that prove no identity (a wrong or missing bearer token: 401;
//! a failed console sign-in) and console sign-ins, on the audit trail
//! without letting a flood fill the disk or hold anything up: the first
//! attempt of a kind from an address in a minute writes an entry, the rest
//! of that minute count into it (`count`) in memory, written at most every
//! [`FLUSH_EVERY`] and when the minute turns (so a daemon that stops loses
//! at most that much of a flood's count, never an entry). Past [`MAX_ADDRESSES`]
//! addresses in one minute the rest share one entry. An IPv6 client counts
//! by its /64 (one host holds a whole /64), and the path an entry keeps is
//! cut to [`MAX_PATH_CHARS`]. No lock is held across a store write, so a
//! flood never queues a sign-in behind it.
//!
//! Failed console sign-ins also lock their network out of signing in for
//! a while ([`LOCKOUT`]) after [`LOCKOUT_AFTER`] of them, so the port's
//! rate limit is not the only bound on guessing the token.

use super::peer::network_key;
use super::principal::Principal;
use chrono::{DateTime, Duration, Utc};
use herald_actors::domain::NewAuditEntry;
use herald_actors::ports::IdentityStore;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Distinct (address, kind, actor) entries written in one minute, at most.
pub const MAX_ADDRESSES: usize = 256;
/// The remote named on the entry that counts the addresses past the cap.
pub const MANY: &str = "(more addresses)";
/// The actor of an attempt that proved no identity.
pub const NOBODY: &str = "(unauthenticated)";
/// A path longer than this many characters is cut on the trail.
pub const MAX_PATH_CHARS: usize = 200;
/// Counts of this minute's entries are written at most this often.
pub const FLUSH_EVERY: Duration = Duration::seconds(15);
/// Failed sign-ins from one network within [`LOCKOUT`] that lock it out.
pub const LOCKOUT_AFTER: u32 = 10;
/// How long a network is locked out after its last failed sign-in, and
/// the span its failures are counted over.
pub const LOCKOUT: Duration = Duration::minutes(15);
/// Networks whose failed sign-ins are remembered, at most.
const MAX_LOCKOUT_NETWORKS: usize = 4096;

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
    pub client: Option<IpAddr>,
    pub via: &'a str,
    pub method: &'a str,
    pub path: &'a str,
}

type Key = (String, &'static str, String);

/// One entry of this minute: its id once written, the attempts it
/// stands for, and how many of them the store has.
#[derive(Clone, Copy)]
struct Slot {
    id: Option<i64>,
    count: u32,
    stored: u32,
}

#[derive(Default)]
struct Minute {
    at: i64,
    entries: HashMap<Key, Slot>,
    flushed_at: Option<DateTime<Utc>>,
}

/// A network's failed sign-ins: how many since `since`, the last at `last`.
#[derive(Clone, Copy)]
struct Failures {
    count: u32,
    since: DateTime<Utc>,
    last: DateTime<Utc>,
}

/// The per-minute counts, one set per daemon.
pub struct Attempts {
    store: Arc<dyn IdentityStore>,
    minute: Mutex<Minute>,
    failures: Mutex<HashMap<String, Failures>>,
    /// Store writes made (entries and count updates), for the figures.
    writes: AtomicU64,
}

/// A path as the trail keeps it: at most [`MAX_PATH_CHARS`] characters.
pub fn bounded_path(path: &str) -> String {
    match path.char_indices().nth(MAX_PATH_CHARS) {
        None => path.to_owned(),
        Some((cut, _)) => format!("{}…", &path[..cut]),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Attempts {
    pub fn new(store: Arc<dyn IdentityStore>) -> Self {
        Self {
            store,
            minute: Default::default(),
            failures: Default::default(),
            writes: AtomicU64::new(0),
        }
    }

    /// Store writes made so far (entries written and counts updated).
    #[cfg(test)]
    pub fn store_writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Puts `attempt` on the trail: a new entry, or one more on this
    /// minute's entry for the same address, kind and actor.
    pub async fn note(&self, now: DateTime<Utc>, from: Origin<'_>, attempt: Attempt) {
        let (operation, status, who) = match attempt {
            Attempt::BadToken => ("failedAuthentication", 401, None),
            Attempt::SignInFailed => ("signInFailed", 401, None),
            Attempt::SignedIn(p) => ("signIn", 303, Some(p)),
        };
        let remote = network_key(from.client);
        match &who {
            None if operation == "signInFailed" => self.failed_sign_in(&remote, now),
            Some(_) => {
                lock(&self.failures).remove(&remote);
            }
            None => {}
        }
        let actor = who.as_ref().map_or(NOBODY.to_owned(), |p| p.name.clone());
        let minute = now.timestamp().div_euclid(60);
        let (key, first, due) = {
            let mut m = lock(&self.minute);
            let mut due = Vec::new();
            if m.at != minute {
                due = take_pending(&mut m.entries);
                *m = Minute {
                    at: minute,
                    entries: HashMap::new(),
                    flushed_at: Some(now),
                };
            } else if m.flushed_at.is_none_or(|t| now - t >= FLUSH_EVERY) {
                due = take_pending(&mut m.entries);
                m.flushed_at = Some(now);
            }
            let mut key = (remote.clone(), operation, actor.clone());
            if !m.entries.contains_key(&key) && m.entries.len() >= MAX_ADDRESSES {
                key.0 = MANY.to_owned();
            }
            let first = match m.entries.get_mut(&key) {
                Some(slot) => {
                    slot.count += 1;
                    false
                }
                None => {
                    // Taken before the write, so an attempt of the same
                    // key meanwhile counts into it instead of writing a
                    // second entry.
                    m.entries.insert(
                        key.clone(),
                        Slot {
                            id: None,
                            count: 1,
                            stored: 0,
                        },
                    );
                    true
                }
            };
            (key, first, due)
        };
        for (id, count) in due {
            self.store_count(id, count).await;
        }
        if !first {
            return;
        }
        let entry = NewAuditEntry {
            at: now,
            actor,
            actor_id: who.as_ref().and_then(|p| p.user_id),
            role: who.as_ref().map(|p| p.role),
            via: from.via.into(),
            operation: operation.into(),
            method: from.method.into(),
            path: bounded_path(from.path),
            resource: None,
            summary: String::new(),
            status,
            remote: key.0.clone(),
            count: 1,
            forwarded_by: None,
        };
        self.writes.fetch_add(1, Ordering::Relaxed);
        let written = self.store.append_audit(&entry).await;
        let mut m = lock(&self.minute);
        match written {
            Ok(id) => {
                // (If the minute turned meanwhile, later attempts counted
                // into the new minute's entries.)
                if m.at == minute {
                    if let Some(slot) = m.entries.get_mut(&key) {
                        slot.id = Some(id);
                        slot.stored = 1;
                    }
                }
            }
            Err(e) => {
                // Let a later attempt write the entry.
                if m.at == minute {
                    m.entries.remove(&key);
                }
                tracing::error!(error = %e, operation, remote = %remote, "could not audit an attempt");
            }
        }
    }

    /// Writes every count the store does not have yet, now: reading the
    /// audit log does first, so it shows every attempt counted here (counts
    /// are otherwise written as attempts come, at most every
    /// [`FLUSH_EVERY`]; a daemon that stops loses at most that much of a
    /// flood's count).
    pub async fn flush(&self) {
        let due = take_pending(&mut lock(&self.minute).entries);
        for (id, count) in due {
            self.store_count(id, count).await;
        }
    }

    async fn store_count(&self, id: i64, count: u32) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.store.set_audit_count(id, count).await {
            tracing::error!(error = %e, id, count, "could not count attempts on the audit trail");
        }
    }

    fn failed_sign_in(&self, network: &str, now: DateTime<Utc>) {
        let mut f = lock(&self.failures);
        if f.len() >= MAX_LOCKOUT_NETWORKS && !f.contains_key(network) {
            f.retain(|_, x| now - x.last < LOCKOUT);
            if f.len() >= MAX_LOCKOUT_NETWORKS {
                // Every slot is a live lockout: forget the oldest.
                if let Some(oldest) = f.iter().min_by_key(|(_, x)| x.last).map(|(k, _)| k.clone()) {
                    f.remove(&oldest);
                }
            }
        }
        let x = f.entry(network.to_owned()).or_insert(Failures {
            count: 0,
            since: now,
            last: now,
        });
        if now - x.since >= LOCKOUT {
            *x = Failures {
                count: 0,
                since: now,
                last: now,
            };
        }
        x.count += 1;
        x.last = now;
    }

    /// Whole seconds until `client` may try to sign in again, if its
    /// network is locked out at `now`.
    pub fn sign_in_locked(&self, client: Option<IpAddr>, now: DateTime<Utc>) -> Option<u64> {
        let f = lock(&self.failures);
        let x = f.get(&network_key(client))?;
        let until = x.last + LOCKOUT;
        (x.count >= LOCKOUT_AFTER && now < until).then(|| {
            u64::try_from((until - now).num_seconds())
                .unwrap_or(0)
                .max(1)
        })
    }
}

/// The (id, count) of every written entry whose count the store lags,
/// taken as written.
fn take_pending(entries: &mut HashMap<Key, Slot>) -> Vec<(i64, u32)> {
    let mut due = Vec::new();
    for slot in entries.values_mut() {
        if let Some(id) = slot.id.filter(|_| slot.count > slot.stored) {
            due.push((id, slot.count));
            slot.stored = slot.count;
        }
    }
    due
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_actors::domain::{AuditFilter, Role};
    use herald_actors::memstore::MemoryStore;
    use herald_actors::ports::AuditStore;

    fn from(remote: &str) -> Origin<'static> {
        Origin {
            client: Some(remote.parse().unwrap()),
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
        // The next minute starts a new entry, and writes the last count
        // of the one before.
        a.note(
            t0 + chrono::Duration::seconds(60),
            from("10.0.0.1"),
            Attempt::BadToken,
        )
        .await;
        // Counts are written as they come, at most every FLUSH_EVERY: not
        // an UPDATE per attempt.
        assert!(a.store_writes() < 10, "{} store writes", a.store_writes());
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
        a.flush().await;
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

    /// Item 4's figures: 10,000 unauthenticated requests from 300
    /// addresses (half of them IPv6 hosts of one /64) with 100 KiB paths
    /// write a bounded number of rows and bytes, and few store writes.
    #[tokio::test]
    async fn a_flood_with_long_paths_writes_bounded_rows_and_bytes() {
        let store = Arc::new(MemoryStore::new());
        let a = Attempts::new(store.clone());
        let t0: DateTime<Utc> = "2026-11-26T10:00:00Z".parse().unwrap();
        let long = format!("/v1/{}", "a".repeat(100 * 1024));
        for i in 0..10_000u32 {
            let n = i % 300;
            let client = if n < 150 {
                format!("10.7.{}.{}", n / 100, n % 100)
            } else {
                format!("2001:db8:7:1:{:x}::1", n)
            };
            let from = Origin {
                client: Some(client.parse().unwrap()),
                via: "api",
                method: "GET",
                path: &long,
            };
            // Spread over one minute, as a flood would come.
            let at = t0 + chrono::Duration::milliseconds(i64::from(i) * 6);
            a.note(at, from, Attempt::BadToken).await;
        }
        a.flush().await;
        let all = store
            .list_audit(&AuditFilter::default(), None, 10_000)
            .await
            .unwrap();
        let rows = all.len();
        let bytes: usize = all
            .iter()
            .map(|e| e.entry.path.len() + e.entry.remote.len() + e.entry.actor.len())
            .sum();
        let counted: u64 = all.iter().map(|e| u64::from(e.entry.count)).sum();
        println!(
            "attempts: requests=10000 addresses=300 path_bytes={} rows={rows} bytes={bytes} store_writes={}",
            long.len(),
            a.store_writes()
        );
        // 150 IPv4 addresses and one IPv6 /64.
        assert_eq!(rows, 151, "one entry per network and minute");
        assert_eq!(counted, 10_000, "every attempt counted");
        assert!(all
            .iter()
            .all(|e| e.entry.path.chars().count() <= MAX_PATH_CHARS + 1));
        assert!(bytes < 151 * 260, "{bytes} bytes");
        assert!(
            a.store_writes() < 151 * 6,
            "{} store writes",
            a.store_writes()
        );
    }

    #[tokio::test]
    async fn failed_sign_ins_lock_their_network_out() {
        let store = Arc::new(MemoryStore::new());
        let a = Attempts::new(store);
        let t0: DateTime<Utc> = "2026-11-26T10:00:00Z".parse().unwrap();
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let fail = |host: &'static str, at| {
            let a = &a;
            async move {
                let from = Origin {
                    client: ip(host),
                    via: "console",
                    method: "POST",
                    path: "/sign-in",
                };
                a.note(at, from, Attempt::SignInFailed).await
            }
        };
        for i in 0..LOCKOUT_AFTER - 1 {
            fail("2001:db8::1", t0 + Duration::seconds(i64::from(i))).await;
        }
        assert_eq!(a.sign_in_locked(ip("2001:db8::1"), t0), None);
        // The tenth, from another host of the same /64.
        fail("2001:db8::2", t0 + Duration::seconds(30)).await;
        let wait = a
            .sign_in_locked(ip("2001:db8::99"), t0 + Duration::seconds(31))
            .expect("the /64 is locked out");
        assert_eq!(wait, LOCKOUT.num_seconds() as u64 - 1);
        assert_eq!(
            a.sign_in_locked(ip("2001:db8:0:1::1"), t0),
            None,
            "another /64"
        );
        assert_eq!(a.sign_in_locked(ip("10.0.0.1"), t0), None);
        assert_eq!(
            a.sign_in_locked(ip("2001:db8::1"), t0 + Duration::seconds(30) + LOCKOUT),
            None,
            "over after LOCKOUT from the last failure"
        );
        // A success from the network clears it.
        fail("10.0.0.1", t0).await;
        let ana = Principal {
            user_id: Some(3),
            name: "ana".into(),
            role: Role::Operator,
        };
        for _ in 0..LOCKOUT_AFTER {
            fail("10.0.0.2", t0).await;
        }
        assert!(a.sign_in_locked(ip("10.0.0.2"), t0).is_some());
        a.note(t0, from("10.0.0.2"), Attempt::SignedIn(ana)).await;
        assert_eq!(a.sign_in_locked(ip("10.0.0.2"), t0), None);
    }
}
