//! An account's single-row session reads that arrive together, gathered
//! into one statement per kind.
//!
//! Before a first send to a group, whatsapp-rust asks whether each member
//! device has a session, sixteen at a time. Each ask alone is a statement:
//! with SQLite a hop to the pool's thread and back, which with its siblings
//! was about a fifth of a first send's CPU (1,000 devices, 2,920 single-row
//! reads). A read here waits one turn of its task, so that the reads its
//! task has in flight beside it join the same queue; the first of them to
//! find itself still queued then reads them all with one `IN` list.
//!
//! Nothing can be stranded: a read that was taken by another is answered by
//! it, and if that other fails or is dropped mid-read, the answer's sender
//! goes with it and each read it took asks again alone.
//!
//! With the sessions comes the identity key of each device asked about
//! ([`Gather::with_read_ahead`]): a device found with no session has its
//! identity read next, while whatsapp-rust sets the sessions up one device
//! at a time (another 1,000 statements). The identity rows read ahead are
//! kept for [`AHEAD_FOR`] and taken by the first read of each; a write of
//! an identity through this backend forgets what it touched, and one that
//! lands while a read ahead is in flight makes that read ahead keep nothing.

use crate::store::whatsapp::{Op, Row, WaRows};
use herald_actors::domain::AccountId;
use herald_actors::ports::StoreError;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a row read ahead may answer a read.
pub const AHEAD_FOR: Duration = Duration::from_secs(60);
/// Rows read ahead held at most (about 400 bytes each, sealed): past it,
/// nothing more is read ahead until reads take some or they expire.
const AHEAD_MAX: usize = 10_000;

/// The reads waiting to be taken.
#[derive(Default)]
pub struct Gather {
    waiting: Mutex<Vec<Wanted>>,
    next: AtomicU64,
    /// Statements the gathered reads took, for the tests.
    statements: AtomicU64,
    /// `(with, also)`: a gathered read of kind `with` also reads the rows
    /// of kind `also` under the same keys.
    ahead_kinds: Option<(i32, i32)>,
    ahead: Mutex<Ahead>,
}

/// What a write touched of the kind read ahead.
pub enum Touched {
    Keys(Vec<String>),
    All,
}

/// Rows read ahead, by key, with when they were read (`None`: absent).
#[derive(Default)]
struct Ahead {
    /// Moves with every write of the kind read ahead.
    generation: u64,
    rows: HashMap<String, (Instant, Option<Row>)>,
}

struct Wanted {
    id: u64,
    kind: i32,
    k: String,
    answer: oneshot::Sender<Option<Row>>,
}

impl Gather {
    /// Gathered reads of kind `with` read the rows of kind `also` under the
    /// same keys, to answer the reads of `also` that follow.
    pub fn with_read_ahead(with: i32, also: i32) -> Self {
        Self {
            ahead_kinds: Some((with, also)),
            ..Self::default()
        }
    }

    fn ahead(&self) -> std::sync::MutexGuard<'_, Ahead> {
        self.ahead.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The row read ahead for `kind`/`k`, taken, if one is fresh.
    fn take_ahead(&self, kind: i32, k: &str) -> Option<Option<Row>> {
        let (_, also) = self.ahead_kinds?;
        if kind != also {
            return None;
        }
        let (at, row) = self.ahead().rows.remove(k)?;
        (at.elapsed() < AHEAD_FOR).then_some(row)
    }

    /// What a write of `ops` touches of the kind read ahead, to
    /// [`forget`](Self::forget) once it is done.
    pub fn touched(&self, ops: &[Op]) -> Option<Touched> {
        let (_, also) = self.ahead_kinds?;
        let mut keys = Vec::new();
        for op in ops {
            match op {
                Op::Put { kind, k, .. } | Op::Delete { kind, k } if *kind == also => {
                    keys.push(k.clone())
                }
                Op::DeleteByG { kind, .. } | Op::DeleteByN { kind, .. } | Op::SetG { kind, .. }
                    if *kind == also =>
                {
                    return Some(Touched::All)
                }
                _ => {}
            }
        }
        (!keys.is_empty()).then_some(Touched::Keys(keys))
    }

    /// After the write (done or not): what it touched is no answer any
    /// more, and a read ahead in flight keeps nothing.
    pub fn forget(&self, touched: Touched) {
        let mut ahead = self.ahead();
        ahead.generation += 1;
        match touched {
            Touched::Keys(keys) => {
                for k in keys {
                    ahead.rows.remove(&k);
                }
            }
            Touched::All => ahead.rows.clear(),
        }
    }

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
        if let Some(row) = self.take_ahead(kind, k) {
            return Ok(row);
        }
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
        for (kind, wanted) in by_kind {
            let mut ks: Vec<String> = wanted.iter().map(|w| w.k.clone()).collect();
            ks.sort_unstable();
            ks.dedup();
            self.statements
                .fetch_add(ks.len().div_ceil(500) as u64, Ordering::Relaxed);
            let also = self
                .ahead_kinds
                .and_then(|(with, also)| (with == kind).then_some(also));
            let kinds: &[i32] = match &also {
                Some(also) => &[kind, *also],
                None => &[kind],
            };
            let generation = self.ahead().generation;
            let found = match rows.get_many_of(account, kinds, &ks).await {
                Ok(found) => found,
                Err(e) => {
                    // Dropping the answers sends each read to ask alone,
                    // which reports its own error.
                    tracing::debug!(account = %account, kind, error = %e, "a gathered session read failed");
                    continue;
                }
            };
            let (found, read_ahead): (Vec<_>, Vec<_>) =
                found.into_iter().partition(|(k, _)| *k == kind);
            if also.is_some() {
                self.keep_ahead(generation, &ks, read_ahead);
            }
            let found: Vec<Row> = found.into_iter().map(|(_, row)| row).collect();
            let found: HashMap<&str, &Row> = found.iter().map(|r| (r.k.as_str(), r)).collect();
            for w in wanted {
                // A read dropped meanwhile no longer listens.
                let _ = w.answer.send(found.get(w.k.as_str()).map(|r| (*r).clone()));
            }
        }
    }

    /// Keeps the rows read ahead under `ks` (absent ones as absent), unless
    /// a write of their kind came since `generation` was read.
    fn keep_ahead(&self, generation: u64, ks: &[String], rows: Vec<(i32, Row)>) {
        let mut ahead = self.ahead();
        if ahead.generation != generation {
            return;
        }
        let now = Instant::now();
        ahead
            .rows
            .retain(|_, (at, _)| now.duration_since(*at) < AHEAD_FOR);
        if ahead.rows.len() + ks.len() > AHEAD_MAX {
            return;
        }
        let mut rows: HashMap<String, Row> =
            rows.into_iter().map(|(_, r)| (r.k.clone(), r)).collect();
        for k in ks {
            let row = rows.remove(k);
            ahead.rows.insert(k.clone(), (now, row));
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

    /// With read-ahead on, a gathered read of sessions brings the same
    /// keys' identities: the identity reads that follow take no statement,
    /// present or absent, each answered once; a write of an identity
    /// forgets it, and a read ahead that a write overtook keeps nothing.
    #[tokio::test]
    async fn identities_come_with_the_sessions_and_a_write_forgets_them() {
        let dir = tempfile::tempdir().unwrap();
        let (rows, account) = rows(dir.path()).await;
        let gather = Gather::with_read_ahead(SESSION, IDENTITY);
        let ks: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
        join_all(ks.iter().map(|k| gather.get(&rows, &account, SESSION, k))).await;
        assert_eq!(gather.statements(), 1);
        // The identities stored under i0 and i2 are not under s0…s3: read
        // ahead as absent, and answered so without a statement.
        for k in &ks {
            assert_eq!(
                gather.get(&rows, &account, IDENTITY, k).await.unwrap(),
                None
            );
        }
        assert_eq!(gather.statements(), 1, "the identities were read ahead");
        // Taken once: a second read asks the database.
        assert_eq!(
            gather.get(&rows, &account, IDENTITY, "s0").await.unwrap(),
            None
        );
        assert_eq!(gather.statements(), 2);

        // Identities present: read ahead with their values.
        let ks: Vec<String> = ["i0", "i1", "i2"].map(String::from).to_vec();
        join_all(ks.iter().map(|k| gather.get(&rows, &account, SESSION, k))).await;
        assert_eq!(gather.statements(), 3);
        // An identity written since is forgotten: its read goes to the database.
        let put = Op::Put {
            kind: IDENTITY,
            k: "i2".into(),
            g: String::new(),
            n: 0,
            v: b"new".to_vec(),
        };
        let touched = gather.touched(std::slice::from_ref(&put));
        rows.write(&account, None, vec![put]).await.unwrap();
        gather.forget(touched.unwrap());
        assert_eq!(
            value(gather.get(&rows, &account, IDENTITY, "i0").await.unwrap()),
            Some("i0".to_owned())
        );
        assert_eq!(
            gather.get(&rows, &account, IDENTITY, "i1").await.unwrap(),
            None
        );
        assert_eq!(gather.statements(), 3, "i0 and i1 were read ahead");
        assert_eq!(
            value(gather.get(&rows, &account, IDENTITY, "i2").await.unwrap()),
            Some("new".to_owned()),
            "the written identity is read again"
        );
        assert_eq!(gather.statements(), 4);

        // A write that lands while a read ahead is in flight: it keeps nothing.
        let generation = gather.ahead().generation;
        gather.forget(Touched::Keys(vec!["elsewhere".into()]));
        let found = rows
            .get_many_of(&account, &[SESSION, IDENTITY], &["i0".to_owned()])
            .await
            .unwrap();
        gather.keep_ahead(generation, &["i0".to_owned()], found);
        assert!(gather.ahead().rows.is_empty());
        // Other kinds' writes touch nothing read ahead.
        let other = Op::Delete {
            kind: SESSION,
            k: "s0".into(),
        };
        assert!(gather.touched(&[other]).is_none());
    }
}
