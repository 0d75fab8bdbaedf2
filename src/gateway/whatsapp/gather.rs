//! An account's single-row session reads that arrive together, gathered
//! into one statement per kind.
//!
//! Before a first send to a group, whatsapp-rust asks whether each member
//! device has a session, sixteen at a time. Each ask alone was a statement,
//! with SQLite a hop to the pool's thread and back (the hand-offs between
//! threads were about a fifth of a first send's CPU). A read here waits one
//! turn of its task, so that the reads its task has in flight beside it
//! join the same queue; the first of them to find itself still queued then
//! reads them all with one `IN` list. For a group of 997 devices the
//! probes' 1,000 statements become about 110.
//!
//! Nothing can be stranded: a read that was taken by another is answered by
//! it, and if that other fails or is dropped mid-read, the answer's sender
//! goes with it and each read it took asks again alone.

use crate::store::whatsapp::{Row, WaRows};
use herald_actors::domain::AccountId;
use herald_actors::ports::StoreError;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// The reads waiting to be taken.
#[derive(Default)]
pub struct Gather {
    waiting: Mutex<Vec<Wanted>>,
    next: AtomicU64,
    /// Statements the gathered reads took, for the tests.
    statements: AtomicU64,
}

struct Wanted {
    id: u64,
    kind: i32,
    k: String,
    answer: oneshot::Sender<Option<Row>>,
}

impl Gather {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<Wanted>> {
        // Nothing panics while holding it; a poisoned queue is still whole.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The row `kind`/`k` of `account`, read with whatever else was asked
    /// for at the same moment.
    pub async fn get(
        &self,
        rows: &WaRows,
        account: &AccountId,
        kind: i32,
        k: &str,
    ) -> Result<Option<Row>, StoreError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (answer, mine) = oneshot::channel();
        self.waiting().push(Wanted {
            id,
            kind,
            k: k.to_owned(),
            answer,
        });
        // One turn: the other reads the caller has in flight queue meanwhile.
        tokio::task::yield_now().await;
        let taken = {
            let mut waiting = self.waiting();
            if waiting.iter().any(|w| w.id == id) {
                std::mem::take(&mut *waiting)
            } else {
                Vec::new()
            }
        };
        if !taken.is_empty() {
            self.read(rows, account, taken).await;
        }
        match mine.await {
            Ok(row) => Ok(row),
            // The read that took this one failed or was dropped: alone.
            Err(_) => {
                self.statements.fetch_add(1, Ordering::Relaxed);
                rows.get(account, kind, k).await
            }
        }
    }

    /// Reads what was taken, one statement per kind, and answers each.
    async fn read(&self, rows: &WaRows, account: &AccountId, taken: Vec<Wanted>) {
        let mut by_kind: BTreeMap<i32, Vec<Wanted>> = BTreeMap::new();
        for w in taken {
            by_kind.entry(w.kind).or_default().push(w);
        }
        for (kind, mut wanted) in by_kind {
            // In key order, so a key asked twice is asked side by side.
            wanted.sort_unstable_by(|a, b| a.k.cmp(&b.k));
            let mut ks: Vec<String> = wanted.iter().map(|w| w.k.clone()).collect();
            ks.dedup();
            self.statements
                .fetch_add(ks.len().div_ceil(500) as u64, Ordering::Relaxed);
            let found = match rows.get_many(account, kind, &ks).await {
                Ok(found) => found,
                Err(e) => {
                    // Dropping the answers sends each read to ask alone,
                    // which reports its own error.
                    tracing::debug!(account = %account, kind, error = %e, "a gathered session read failed");
                    continue;
                }
            };
            let mut found: HashMap<String, Row> =
                found.into_iter().map(|r| (r.k.clone(), r)).collect();
            let mut wanted = wanted.into_iter().peekable();
            while let Some(w) = wanted.next() {
                // The last read of a key takes its row; one before it, a copy.
                let row = if wanted.peek().is_some_and(|next| next.k == w.k) {
                    found.get(&w.k).cloned()
                } else {
                    found.remove(&w.k)
                };
                // A read dropped meanwhile no longer listens.
                let _ = w.answer.send(row);
            }
        }
    }

    /// Statements the gathered reads have taken so far.
    #[cfg(test)]
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::whatsapp::Op;
    use futures_util::future::join_all;
    use herald_actors::domain::{AccountState, GatewayKind};
    use herald_actors::ports::{AccountStore as _, NewAccount};
    use std::future::Future;
    use std::pin::pin;
    use std::task::Context;

    const SESSION: i32 = 3;
    const IDENTITY: i32 = 2;

    /// A SQLite store in `dir` whose account holds sessions s0, s2, … s14
    /// and identities i0, i2.
    async fn rows(dir: &std::path::Path) -> (WaRows, AccountId) {
        let url = format!("sqlite://{}", dir.join("herald.db").display());
        let sql = crate::store::SqlStore::connect(&url).await.unwrap();
        let account = AccountId::parse("acc-1").unwrap();
        let new = NewAccount::named_by_id(
            account.clone(),
            GatewayKind::Whatsapp,
            AccountState::Pairing,
        );
        sql.create_account(&new, chrono::Utc::now()).await.unwrap();
        let put = |kind, k: String| Op::Put {
            v: k.clone().into_bytes(),
            kind,
            k,
            g: String::new(),
            n: 0,
        };
        let mut ops: Vec<Op> = (0..16)
            .step_by(2)
            .map(|i| put(SESSION, format!("s{i}")))
            .collect();
        ops.extend([0, 2].map(|i| put(IDENTITY, format!("i{i}"))));
        let rows = sql.wa_rows();
        rows.write(&account, None, ops).await.unwrap();
        (rows, account)
    }

    fn value(row: Option<Row>) -> Option<String> {
        row.map(|r| String::from_utf8(r.v).unwrap())
    }

    /// As whatsapp-rust probes sessions before a first send: sixteen reads
    /// in flight in one task, here with four identity reads among them and
    /// one key asked twice. Each gets its own answer, present or absent,
    /// and all of them take one statement per kind.
    #[tokio::test]
    async fn reads_in_flight_together_take_one_statement_per_kind() {
        let dir = tempfile::tempdir().unwrap();
        let (rows, account) = rows(dir.path()).await;
        let gather = Gather::default();
        let mut wanted: Vec<(i32, String)> = (0..16).map(|i| (SESSION, format!("s{i}"))).collect();
        wanted.extend((0..4).map(|i| (IDENTITY, format!("i{i}"))));
        wanted.push((SESSION, "s4".to_owned()));
        let answers = join_all(
            wanted
                .iter()
                .map(|(kind, k)| gather.get(&rows, &account, *kind, k)),
        )
        .await;
        for ((_, k), answer) in wanted.iter().zip(answers) {
            let n: u32 = k[1..].parse().unwrap();
            let expected = n.is_multiple_of(2).then(|| k.clone());
            assert_eq!(value(answer.unwrap()), expected, "{k}");
        }
        assert_eq!(gather.statements(), 2, "one statement for each kind");

        // One read alone is one statement, and reads nothing it was not asked.
        assert_eq!(
            value(gather.get(&rows, &account, SESSION, "s6").await.unwrap()),
            Some("s6".to_owned())
        );
        assert_eq!(
            gather.get(&rows, &account, SESSION, "s7").await.unwrap(),
            None
        );
        assert_eq!(gather.statements(), 4);
        assert!(gather.waiting().is_empty());
    }

    /// A read whose turn came while it waited for another that took it and
    /// was then dropped mid-read (a send given up on) asks again alone,
    /// and gets its answer.
    #[tokio::test]
    async fn a_read_taken_by_one_dropped_mid_read_asks_again_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (rows, account) = rows(dir.path()).await;
        let gather = Gather::default();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut taker = Box::pin(gather.get(&rows, &account, SESSION, "s0"));
        let mut taken = pin!(gather.get(&rows, &account, SESSION, "s2"));
        // Both queue and yield; then the first takes both and reads.
        assert!(taker.as_mut().poll(&mut cx).is_pending());
        assert!(taken.as_mut().poll(&mut cx).is_pending());
        let read_at_once = taker.as_mut().poll(&mut cx).is_ready();
        drop(taker);
        assert_eq!(value(taken.await.unwrap()), Some("s2".to_owned()));
        if read_at_once {
            // The database answered within the first poll: nothing was
            // dropped mid-read, so there is no second statement to count.
            assert_eq!(gather.statements(), 1);
        } else {
            assert_eq!(gather.statements(), 2, "the taken read asked again alone");
        }
    }
}
