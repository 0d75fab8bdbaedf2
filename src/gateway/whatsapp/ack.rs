//! Server acks for sent messages.
//!
//! `send_message_with_options` resolves once the stanza is written to the
//! socket; WhatsApp's verdict arrives later as `Event::ServerAck` with the
//! same id (an `error` code when it refused). A send registers its id here
//! *before* writing, so an ack that beats the send's own return is not
//! lost, then waits for the verdict with a timeout. Ids the server accepted
//! are remembered (bounded here; kept in the database by the session for
//! every owner of the account) so a resend of the same id — the engine's
//! retry after a timeout, its resume after a crash, or another daemon's
//! after a takeover — answers "duplicate" instead of sending twice.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// What the server said about one message id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckOutcome {
    Accepted,
    /// A nack, with its code (e.g. "429", "403").
    Refused(String),
}

/// How waiting for an ack ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckWait {
    Accepted,
    Refused(String),
    TimedOut,
}

#[derive(Default)]
struct Inner {
    waiting: HashMap<String, Vec<oneshot::Sender<AckOutcome>>>,
    accepted: HashSet<String>,
    order: VecDeque<String>,
}

/// Pending acks of one account, keyed by message id. Locked only for map
/// updates, never across an await.
pub struct AckTable {
    inner: Mutex<Inner>,
    remember: usize,
}

impl AckTable {
    /// `remember`: how many accepted ids to keep for duplicate detection.
    pub fn new(remember: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            remember: remember.max(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere leaves the maps consistent (single inserts).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers interest in `id`'s ack. Call before the message is written.
    pub fn expect(self: &Arc<Self>, id: &str) -> PendingAck {
        let (tx, rx) = oneshot::channel();
        self.lock()
            .waiting
            .entry(id.to_owned())
            .or_default()
            .push(tx);
        PendingAck {
            table: self.clone(),
            id: id.to_owned(),
            rx: Some(rx),
        }
    }

    /// Applies a server ack; true when a send was waiting for it. Called
    /// inline from the event dispatch, so it only touches the maps.
    pub fn resolve(&self, id: &str, outcome: AckOutcome) -> bool {
        let mut inner = self.lock();
        if outcome == AckOutcome::Accepted {
            Self::insert_accepted(&mut inner, id, self.remember);
        }
        let Some(waiters) = inner.waiting.remove(id) else {
            return false;
        };
        drop(inner);
        let mut woke = false;
        for w in waiters {
            woke |= w.send(outcome.clone()).is_ok();
        }
        woke
    }

    fn insert_accepted(inner: &mut Inner, id: &str, cap: usize) {
        if inner.accepted.insert(id.to_owned()) {
            inner.order.push_back(id.to_owned());
            while inner.order.len() > cap {
                if let Some(old) = inner.order.pop_front() {
                    inner.accepted.remove(&old);
                }
            }
        }
    }

    /// Marks ids accepted in an earlier process or by another daemon.
    pub fn remember_accepted<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        for id in ids {
            Self::insert_accepted(&mut inner, id, self.remember);
        }
    }

    pub fn was_accepted(&self, id: &str) -> bool {
        self.lock().accepted.contains(id)
    }

    /// Sends waiting for an ack right now.
    pub fn pending(&self) -> usize {
        self.lock().waiting.values().map(Vec::len).sum()
    }
}

/// One send's interest in its ack. Dropping it (timeout, cancelled send)
/// removes it from the table.
pub struct PendingAck {
    table: Arc<AckTable>,
    id: String,
    rx: Option<oneshot::Receiver<AckOutcome>>,
}

impl PendingAck {
    /// Waits at most `timeout` for the server's verdict.
    pub async fn wait(mut self, timeout: Duration) -> AckWait {
        let Some(rx) = self.rx.as_mut() else {
            return AckWait::TimedOut;
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(AckOutcome::Accepted)) => AckWait::Accepted,
            Ok(Ok(AckOutcome::Refused(code))) => AckWait::Refused(code),
            // Sender gone without an answer: the table was dropped.
            Ok(Err(_)) | Err(_) => AckWait::TimedOut,
        }
    }
}

impl Drop for PendingAck {
    fn drop(&mut self) {
        // Close our receiver first so retain() can tell which sender was ours.
        drop(self.rx.take());
        let mut inner = self.table.lock();
        if let Some(ws) = inner.waiting.get_mut(&self.id) {
            ws.retain(|w| !w.is_closed());
            if ws.is_empty() {
                inner.waiting.remove(&self.id);
            }
        }
    }
}

/// The file of accepted ids, one per line, that Herald kept per account
/// and per daemon before they moved into the database; read once to
/// import it.
pub struct AckJournal;

impl AckJournal {
    /// Every id in the file; none when there is no file.
    pub fn load(path: &Path) -> Vec<String> {
        let Ok(text) = std::fs::read_to_string(path) else {
            return Vec::new();
        };
        text.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_ack_resolves_the_waiting_send() {
        let t = AckTable::new(10);
        let p = t.expect("3EB0AAAAAAAAAAAAAAAAAA");
        assert_eq!(t.pending(), 1);
        assert!(t.resolve("3EB0AAAAAAAAAAAAAAAAAA", AckOutcome::Accepted));
        assert_eq!(p.wait(Duration::from_secs(30)).await, AckWait::Accepted);
        assert_eq!(t.pending(), 0);
        assert!(t.was_accepted("3EB0AAAAAAAAAAAAAAAAAA"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ack_that_arrives_before_the_wait_is_kept() {
        // The server can answer before send_message returns to us.
        let t = AckTable::new(10);
        let p = t.expect("a");
        t.resolve("a", AckOutcome::Refused("429".into()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            p.wait(Duration::from_secs(30)).await,
            AckWait::Refused("429".into())
        );
        assert!(!t.was_accepted("a"), "a refused id is not a duplicate");
    }

    #[tokio::test(start_paused = true)]
    async fn no_ack_times_out_on_tokio_time_and_cleans_up() {
        let t = AckTable::new(10);
        let p = t.expect("b");
        let started = tokio::time::Instant::now();
        let got = p.wait(Duration::from_secs(30)).await;
        assert_eq!(got, AckWait::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert_eq!(t.pending(), 0, "the timed-out waiter is removed");
        // A late ack still counts: the retry with the same id is a duplicate.
        assert!(!t.resolve("b", AckOutcome::Accepted));
        assert!(t.was_accepted("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn acks_for_other_ids_do_not_resolve() {
        let t = AckTable::new(10);
        let p = t.expect("c");
        t.resolve("d", AckOutcome::Accepted);
        let waiter = tokio::spawn(p.wait(Duration::from_secs(30)));
        tokio::time::sleep(Duration::from_secs(10)).await;
        t.resolve("c", AckOutcome::Accepted);
        assert_eq!(waiter.await.unwrap(), AckWait::Accepted);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_leaves_the_others() {
        let t = AckTable::new(10);
        let first = t.expect("e");
        let second = t.expect("e");
        drop(first);
        assert_eq!(t.pending(), 1);
        t.resolve("e", AckOutcome::Accepted);
        assert_eq!(second.wait(Duration::from_secs(1)).await, AckWait::Accepted);
    }

    #[test]
    fn remembered_ids_are_bounded() {
        let t = AckTable::new(2);
        t.remember_accepted(["x", "y", "z"]);
        assert!(!t.was_accepted("x"));
        assert!(t.was_accepted("y") && t.was_accepted("z"));
    }

    #[test]
    fn an_old_journal_file_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acked-ids");
        std::fs::write(&path, "a\nb\n\nc\n").unwrap();
        assert_eq!(AckJournal::load(&path), ["a", "b", "c"]);
        assert!(AckJournal::load(&dir.path().join("none")).is_empty());
    }
}
