//! WhatsApp sessions in the shared database (`wa_session_rows`,
//! `wa_sender_key_devices`; migration 0014): rows of opaque, already-sealed
//! bytes per account, written in transactions that first check the
//! account's lease when one is given, as run marks are. What the rows
//! mean, and their sealing, is the WhatsApp gateway's business
//! (`gateway::whatsapp::backend`); the key they are sealed under is
//! recorded in `wa_session_key` ([`super::sealed`]).
//!
//! Writes are committed in groups. A login storm (a restart logs in
//! thousands of accounts, each writing pre-keys, sessions and app state)
//! used to open one transaction per write, and on SQLite every one of them
//! queued for the single writer connection: tens of thousands of waits
//! over sqlx's 2 s threshold, and the engine's run marks queued behind
//! them. Now a write joins a queue; whoever holds the commit turn takes
//! everything queued (up to [`MAX_BATCH_OPS`]) and commits it in one
//! transaction, each write under its own fence check. One connection and
//! one commit serve a whole storm's worth of writes, and the batch grows
//! with the load instead of the queue at the pool.

use super::rows::RowGet;
use super::{be, Db, SqlStore};
use super::{check_fences, fence_held, read, tx};
use herald_actors::domain::{AccountId, Fence};
use herald_actors::ports::{StoreError, StoreResult};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// The most operations one group commit takes (a write larger than this
/// is committed alone): bounds how long a batch holds the writer, so a run
/// mark waits behind at most one batch.
pub const MAX_BATCH_OPS: usize = 2000;

/// One stored item of an account's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub k: String,
    /// A second lookup key ("" when the kind has none).
    pub g: String,
    /// A number the store filters or orders by.
    pub n: i64,
    /// The sealed value.
    pub v: Vec<u8>,
}

/// One change, applied with the others of a [`WaRows::write`] in one
/// transaction.
#[derive(Debug, Clone)]
pub enum Op {
    /// Insert or replace.
    Put {
        kind: i32,
        k: String,
        g: String,
        n: i64,
        v: Vec<u8>,
    },
    Delete {
        kind: i32,
        k: String,
    },
    /// Every row of `kind` whose `g` is this.
    DeleteByG {
        kind: i32,
        g: String,
    },
    /// Every row of `kind` whose `n` is below `cutoff` (`n <= cutoff` when
    /// `inclusive`); rows with `n = 0` are kept when `keep_zero`.
    DeleteByN {
        kind: i32,
        cutoff: i64,
        inclusive: bool,
        keep_zero: bool,
    },
    /// Sets `g` on the rows of `kind` that exist (never inserts).
    SetG {
        kind: i32,
        ks: Vec<String>,
        g: String,
    },
    /// Sender-key status of member devices of a group.
    SenderKeys {
        group: String,
        entries: Vec<(String, bool)>,
    },
    /// Forgets the sender-key status in one group, or in all (`None`).
    ClearSenderKeys {
        group: Option<String>,
    },
    /// Forgets these devices' sender-key status in every group.
    DropSenderKeyDevices {
        devices: Vec<String>,
    },
}

/// The session rows of every account. Cheap to clone; clones share one
/// commit queue.
#[derive(Clone)]
pub struct WaRows {
    pub(super) db: Db,
    queue: Arc<CommitQueue>,
}

/// The writes waiting for a group commit, and the commit turn.
#[derive(Default)]
struct CommitQueue {
    waiting: Mutex<VecDeque<Pending>>,
    /// Held by the caller committing a batch; fair, so every waiter gets a
    /// turn in order and finds its write either done or at the front.
    turn: tokio::sync::Mutex<()>,
    /// Batches and writes committed, for the benchmark and tests.
    batches: std::sync::atomic::AtomicU64,
    writes: std::sync::atomic::AtomicU64,
}

impl CommitQueue {
    fn waiting(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        // Nothing panics while holding it; a poisoned queue is still whole.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Rows one multi-row `INSERT` of puts carries: 5 or 6 parameters each,
/// well under SQLite's 32,766 and PostgreSQL's 65,535. A pairing's 812
/// pre-keys are two statements instead of 812.
const PUTS_PER_STATEMENT: usize = 400;

/// The upsert of `rows` puts. PostgreSQL: the account is `$1` for all,
/// 5 numbered parameters a row. SQLite: 6 plain `?` a row, the account in
/// each; a numbered parameter there makes binding quadratic (sqlx looks
/// each parameter's name up, and SQLite finds a name by walking the list of
/// names: with 2,001 of them it was the biggest item in the SQLite
/// threads' profile of a first send to 999 devices).
fn put_sql(rows: usize, positional: bool) -> String {
    format!(
        "INSERT INTO wa_session_rows (account_id, kind, k, g, n, v) VALUES {} \
         ON CONFLICT (account_id, kind, k) \
         DO UPDATE SET g = excluded.g, n = excluded.n, v = excluded.v",
        values_sql(rows, positional, 1, 5)
    )
}

/// `rows` value lists of a multi-row insert, each `shared` values every row
/// has (the account…) then `own` of its own. PostgreSQL: the shared ones
/// are `$1…` once for all, the rows' own numbered after them; SQLite: plain
/// `?`s, every row binding the shared values again.
fn values_sql(rows: usize, positional: bool, shared: usize, own: usize) -> String {
    (0..rows)
        .map(|i| {
            let first_own = shared + 1 + own * i;
            let list = if positional {
                params(true, 1, shared + own)
            } else {
                [params(false, 1, shared), params(false, first_own, own)].join(", ")
            };
            format!("({list})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `i`th parameter (from 1): `$i` on PostgreSQL, a plain `?` on
/// SQLite (see [`put_sql`] for why not `?NNN`). Plain `?`s take their
/// values in the order of the text, so callers bind in that order.
fn param(positional: bool, i: usize) -> String {
    if positional {
        "?".to_owned()
    } else {
        format!("${i}")
    }
}

/// `n` parameters from the `from`th, joined by commas (an `IN (…)` list,
/// or a row of values).
fn params(positional: bool, from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| param(positional, i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The upsert of `rows` sender-key marks of one group. PostgreSQL: the
/// account and group are `$1` and `$2` for all, 2 numbered parameters a
/// row; SQLite: 4 plain `?` a row, the account and group in each.
fn sender_keys_sql(rows: usize, positional: bool) -> String {
    format!(
        "INSERT INTO wa_sender_key_devices (account_id, group_jid, device_jid, has_key) \
         VALUES {} ON CONFLICT (account_id, group_jid, device_jid) \
         DO UPDATE SET has_key = excluded.has_key",
        values_sql(rows, positional, 2, 2)
    )
}

/// Each device's last mark, in the order of first mention: what writing the
/// marks one by one would leave, and what one upsert can take (PostgreSQL
/// refuses a statement that changes a row twice).
fn last_per_device(entries: &[(String, bool)]) -> Vec<(&str, bool)> {
    let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut out: Vec<(&str, bool)> = Vec::with_capacity(entries.len());
    for (device, has) in entries {
        match at.get(device.as_str()) {
            Some(&i) => out[i].1 = *has,
            None => {
                at.insert(device, out.len());
                out.push((device, *has));
            }
        }
    }
    out
}

/// One put of a run, borrowed.
struct PutRow<'a> {
    kind: i32,
    k: &'a str,
    g: &'a str,
    n: i64,
    v: &'a [u8],
}

/// A write's ops as statements go: runs of puts together, the rest one by
/// one, in order.
enum Segment<'a> {
    /// Consecutive puts, each key once (the last put of a key wins, as it
    /// would one by one; PostgreSQL refuses a key twice in one upsert), and
    /// how many puts that left out.
    Puts {
        rows: Vec<PutRow<'a>>,
        repeated: usize,
    },
    One(&'a Op),
}

fn segments(ops: &[Op]) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        let run = ops[i..]
            .iter()
            .take_while(|o| matches!(o, Op::Put { .. }))
            .count();
        if run == 0 {
            out.push(Segment::One(&ops[i]));
            i += 1;
            continue;
        }
        let mut rows: Vec<PutRow<'_>> = Vec::with_capacity(run);
        let mut at = std::collections::HashMap::with_capacity(run);
        for op in &ops[i..i + run] {
            let Op::Put { kind, k, g, n, v } = op else {
                unreachable!("a run holds only puts")
            };
            let row = PutRow {
                kind: *kind,
                k,
                g,
                n: *n,
                v,
            };
            match at.entry((*kind, k.as_str())) {
                std::collections::hash_map::Entry::Occupied(e) => rows[*e.get()] = row,
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(rows.len());
                    rows.push(row);
                }
            }
        }
        out.push(Segment::Puts {
            repeated: run - rows.len(),
            rows,
        });
        i += run;
    }
    out
}

/// `variant:kind×count` of a batch's ops, for the debug log.
fn kinds_of(batch: &[Pending]) -> String {
    let mut counts = std::collections::BTreeMap::<(&str, i32), usize>::new();
    for op in batch.iter().flat_map(|p| p.ops.iter()) {
        let key = match op {
            Op::Put { kind, .. } => ("put", *kind),
            Op::Delete { kind, .. } => ("delete", *kind),
            Op::DeleteByG { kind, .. } => ("delete_by_g", *kind),
            Op::DeleteByN { kind, .. } => ("delete_by_n", *kind),
            Op::SetG { kind, .. } => ("set_g", *kind),
            Op::SenderKeys { .. } => ("sender_keys", 0),
            Op::ClearSenderKeys { .. } => ("clear_sender_keys", 0),
            Op::DropSenderKeyDevices { .. } => ("drop_sender_key_devices", 0),
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
        .iter()
        .map(|((v, k), n)| format!("{v}:{k}x{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One [`WaRows::write`] waiting in the queue.
struct Pending {
    account: AccountId,
    fence: Option<Fence>,
    ops: Arc<Vec<Op>>,
    done: oneshot::Sender<StoreResult<u64>>,
}

impl SqlStore {
    /// The WhatsApp session rows, on this store's pools.
    pub fn wa_rows(&self) -> WaRows {
        WaRows {
            db: self.db.clone(),
            queue: Arc::default(),
        }
    }
}

fn row_from(r: &impl RowGet) -> StoreResult<Row> {
    Ok(Row {
        k: r.text("k")?,
        g: r.text("g")?,
        n: r.int("n")?,
        v: r.bytes("v")?,
    })
}

/// A parameter of [`WaRows::rows`] after the account and the kind.
enum Arg<'a> {
    Text(&'a str),
    Int(i64),
}

impl WaRows {
    fn store(&self) -> SqlStore {
        SqlStore {
            db: self.db.clone(),
            secrets: None,
        }
    }

    /// The rows `sql` selects (`k, g, n, v`), its first two parameters
    /// being the account and the kind, then `more`.
    async fn rows(
        &self,
        sql: &str,
        account: &AccountId,
        kind: i32,
        more: &[Arg<'_>],
    ) -> StoreResult<Vec<Row>> {
        read!(self, p => {
            let mut q = sqlx::query(sql).bind(account.as_str()).bind(kind);
            for a in more {
                q = match a {
                    Arg::Text(t) => q.bind(*t),
                    Arg::Int(n) => q.bind(*n),
                };
            }
            q.fetch_all(p).await.map_err(be)?.iter().map(row_from).collect()
        })
    }

    pub async fn get(&self, account: &AccountId, kind: i32, k: &str) -> StoreResult<Option<Row>> {
        let sql =
            "SELECT k, g, n, v FROM wa_session_rows WHERE account_id = $1 AND kind = $2 AND k = $3";
        Ok(self.rows(sql, account, kind, &[Arg::Text(k)]).await?.pop())
    }

    /// The rows of `kind` among `ks` that exist.
    pub async fn get_many(
        &self,
        account: &AccountId,
        kind: i32,
        ks: &[String],
    ) -> StoreResult<Vec<Row>> {
        let mut out = Vec::with_capacity(ks.len());
        // Bounded statements: SQLite allows 32,766 parameters, PostgreSQL 65,535.
        for chunk in ks.chunks(500) {
            let sql = format!(
                "SELECT k, g, n, v FROM wa_session_rows WHERE account_id = $1 AND kind = $2 \
                 AND k IN ({})",
                params(false, 3, chunk.len())
            );
            read!(self, p => {
                let mut q = sqlx::query(&sql).bind(account.as_str()).bind(kind);
                for k in chunk {
                    q = q.bind(k);
                }
                for r in q.fetch_all(p).await.map_err(be)? {
                    out.push(row_from(&r)?);
                }
            });
        }
        Ok(out)
    }

    /// Every row of `kind`, in key order.
    pub async fn list(&self, account: &AccountId, kind: i32) -> StoreResult<Vec<Row>> {
        let sql =
            "SELECT k, g, n, v FROM wa_session_rows WHERE account_id = $1 AND kind = $2 ORDER BY k";
        self.rows(sql, account, kind, &[]).await
    }

    /// The keys of `kind` the account has, without their values.
    pub async fn keys(&self, account: &AccountId, kind: i32) -> StoreResult<Vec<String>> {
        let sql = "SELECT k FROM wa_session_rows WHERE account_id = $1 AND kind = $2";
        read!(self, p => {
            sqlx::query(sql)
                .bind(account.as_str())
                .bind(kind)
                .fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(|r| r.text("k"))
                .collect()
        })
    }

    /// The rows of `kind` whose `g` is this, highest `n` first.
    pub async fn by_g(
        &self,
        account: &AccountId,
        kind: i32,
        g: &str,
        limit: i64,
    ) -> StoreResult<Vec<Row>> {
        let sql = "SELECT k, g, n, v FROM wa_session_rows WHERE account_id = $1 AND kind = $2 \
                   AND g = $3 ORDER BY n DESC, k LIMIT $4";
        self.rows(sql, account, kind, &[Arg::Text(g), Arg::Int(limit)])
            .await
    }

    /// Whether a row of any of `kinds` has this `g`.
    pub async fn any_with_g(
        &self,
        account: &AccountId,
        kinds: &[i32],
        g: &str,
    ) -> StoreResult<bool> {
        let sql = format!(
            "SELECT 1 AS one FROM wa_session_rows WHERE account_id = $1 AND g = $2 AND kind IN ({}) LIMIT 1",
            params(false, 3, kinds.len())
        );
        read!(self, p => {
            let mut q = sqlx::query(&sql).bind(account.as_str()).bind(g);
            for k in kinds {
                q = q.bind(*k);
            }
            Ok(q.fetch_optional(p).await.map_err(be)?.is_some())
        })
    }

    /// The highest `n` of `kind` (0 when there is none).
    pub async fn max_n(&self, account: &AccountId, kind: i32) -> StoreResult<i64> {
        let sql = "SELECT COALESCE(MAX(n), 0) AS m FROM wa_session_rows WHERE account_id = $1 AND kind = $2";
        read!(self, p => {
            sqlx::query(sql)
                .bind(account.as_str())
                .bind(kind)
                .fetch_one(p)
                .await
                .map_err(be)?
                .int("m")
        })
    }

    /// The row with the highest `n` of `kind`.
    pub async fn newest(&self, account: &AccountId, kind: i32) -> StoreResult<Option<Row>> {
        let sql = "SELECT k, g, n, v FROM wa_session_rows WHERE account_id = $1 AND kind = $2 \
                   ORDER BY n DESC, k DESC LIMIT 1";
        Ok(self.rows(sql, account, kind, &[]).await?.pop())
    }

    /// The sender-key status of the devices of `group` this account knows.
    pub async fn sender_keys(
        &self,
        account: &AccountId,
        group: &str,
    ) -> StoreResult<Vec<(String, bool)>> {
        let sql = "SELECT device_jid, has_key FROM wa_sender_key_devices WHERE account_id = $1 \
                   AND group_jid = $2 ORDER BY device_jid";
        read!(self, p => {
            sqlx::query(sql)
                .bind(account.as_str())
                .bind(group)
                .fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(|r| Ok((r.text("device_jid")?, r.flag("has_key")?)))
                .collect()
        })
    }

    /// Applies `ops` in one transaction with other writes queued at the
    /// same time (see the module's note), under `fence` when given (the
    /// account's lease, checked first in the same transaction; nothing of
    /// this write lands when it is no longer current, whatever the others
    /// do). Returns the rows touched.
    pub async fn write(
        &self,
        account: &AccountId,
        fence: Option<&Fence>,
        ops: Vec<Op>,
    ) -> StoreResult<u64> {
        if let Some(f) = fence {
            if f.account != *account {
                return Err(StoreError::fenced(f));
            }
        }
        let (account, fence, ops) = (account.clone(), fence.cloned(), Arc::new(ops));
        loop {
            let (done, mut answer) = oneshot::channel();
            self.queue.waiting().push_back(Pending {
                account: account.clone(),
                fence: fence.clone(),
                ops: ops.clone(),
                done,
            });
            loop {
                tokio::select! {
                    biased;
                    out = &mut answer => match out {
                        Ok(out) => return out,
                        // The caller committing our batch was cancelled and
                        // its transaction rolled back (or, at worst, landed
                        // unanswered): queue the write again. Every op is
                        // idempotent, so landing twice changes nothing.
                        Err(_) => break,
                    },
                    turn = self.queue.turn.lock() => {
                        // Commits on this caller's task: no task of its own,
                        // so a commit never outlives the runtime it began on.
                        let batch = self.take_batch();
                        if !batch.is_empty() {
                            self.commit(batch).await;
                        }
                        drop(turn);
                    }
                }
            }
        }
    }

    /// Takes the queued writes for one commit: the oldest first, up to
    /// [`MAX_BATCH_OPS`] operations (always at least one write).
    fn take_batch(&self) -> Vec<Pending> {
        let mut waiting = self.queue.waiting();
        let mut batch = Vec::new();
        let mut ops = 0;
        while let Some(next) = waiting.front() {
            if !batch.is_empty() && ops + next.ops.len() > MAX_BATCH_OPS {
                break;
            }
            ops += next.ops.len();
            batch.extend(waiting.pop_front());
        }
        batch
    }

    /// Commits `batch` in one transaction and answers each write. When the
    /// transaction fails as a whole, each write is tried again alone, so an
    /// error reaches only the write that caused it.
    async fn commit(&self, batch: Vec<Pending>) {
        use std::sync::atomic::Ordering::Relaxed;
        self.queue.batches.fetch_add(1, Relaxed);
        self.queue.writes.fetch_add(batch.len() as u64, Relaxed);
        let started = std::time::Instant::now();
        let applied = self.apply(&batch).await;
        tracing::debug!(
            writes = batch.len(),
            ops = batch.iter().map(|p| p.ops.len()).sum::<usize>(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            failed = applied.is_err(),
            kinds = %kinds_of(&batch),
            "session writes committed together"
        );
        match applied {
            Ok(answers) => {
                for (p, answer) in batch.into_iter().zip(answers) {
                    let _ = p.done.send(answer);
                }
            }
            Err(e) if batch.len() == 1 => {
                for p in batch {
                    let _ = p.done.send(Err(e.clone()));
                }
            }
            Err(_) => {
                for p in batch {
                    let one = [p];
                    let answer = match self.apply(&one).await {
                        Ok(mut a) => a.pop().unwrap_or(Ok(0)),
                        Err(e) => Err(e),
                    };
                    let [p] = one;
                    let _ = p.done.send(answer);
                }
            }
        }
    }

    /// Group commits and the writes they carried so far.
    pub fn commits(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.queue.batches.load(Relaxed),
            self.queue.writes.load(Relaxed),
        )
    }

    /// One transaction for `batch`: per write, its fence check then its
    /// ops; a write whose fence is gone is answered `Fenced` and skipped.
    async fn apply(&self, batch: &[Pending]) -> StoreResult<Vec<StoreResult<u64>>> {
        let fence_sql = self.store().fence_check_sql();
        let positional = matches!(self.db, Db::Sqlite { .. });
        tx!(self, tx => {
            let mut answers = Vec::with_capacity(batch.len());
            for p in batch {
                if let Some(f) = &p.fence {
                    if !fence_held!(tx, &fence_sql, f) {
                        answers.push(Err(StoreError::fenced(f)));
                        continue;
                    }
                }
                let a = p.account.as_str();
                let mut touched = 0u64;
                for segment in segments(&p.ops) {
                    let op = match segment {
                        Segment::Puts { rows, repeated } => {
                            // A put overwritten later in the same run still
                            // counts, as it did written one by one.
                            touched += repeated as u64;
                            for chunk in rows.chunks(PUTS_PER_STATEMENT) {
                                let sql = put_sql(chunk.len(), positional);
                                let mut q = sqlx::query(&sql);
                                if !positional {
                                    q = q.bind(a);
                                }
                                for r in chunk {
                                    if positional {
                                        q = q.bind(a);
                                    }
                                    q = q.bind(r.kind).bind(r.k).bind(r.g).bind(r.n).bind(r.v);
                                }
                                touched += q.execute(&mut *tx).await.map_err(be)?.rows_affected();
                            }
                            continue;
                        }
                        Segment::One(op) => op,
                    };
                    touched += match op {
                        Op::Put { .. } => unreachable!("runs of puts are segments of their own"),
                        Op::Delete { kind, k } => sqlx::query(
                            "DELETE FROM wa_session_rows WHERE account_id = $1 AND kind = $2 AND k = $3",
                        )
                        .bind(a).bind(*kind).bind(k)
                        .execute(&mut *tx).await.map_err(be)?.rows_affected(),
                        Op::DeleteByG { kind, g } => sqlx::query(
                            "DELETE FROM wa_session_rows WHERE account_id = $1 AND kind = $2 AND g = $3",
                        )
                        .bind(a).bind(*kind).bind(g)
                        .execute(&mut *tx).await.map_err(be)?.rows_affected(),
                        Op::DeleteByN { kind, cutoff, inclusive, keep_zero } => {
                            let cmp = if *inclusive { "<=" } else { "<" };
                            let zero = if *keep_zero { " AND n <> 0" } else { "" };
                            sqlx::query(&format!(
                                "DELETE FROM wa_session_rows WHERE account_id = $1 AND kind = $2 \
                                 AND n {cmp} $3{zero}"
                            ))
                            .bind(a).bind(*kind).bind(*cutoff)
                            .execute(&mut *tx).await.map_err(be)?.rows_affected()
                        }
                        Op::SetG { kind, ks, g } => {
                            // A pairing marks its 812 pre-keys uploaded: a
                            // statement per 400, not one each.
                            let mut n = 0;
                            for chunk in ks.chunks(PUTS_PER_STATEMENT) {
                                let sql = format!(
                                    "UPDATE wa_session_rows SET g = {} WHERE account_id = {} \
                                     AND kind = {} AND k IN ({})",
                                    param(positional, 1),
                                    param(positional, 2),
                                    param(positional, 3),
                                    params(positional, 4, chunk.len())
                                );
                                let mut q = sqlx::query(&sql).bind(g).bind(a).bind(*kind);
                                for k in chunk {
                                    q = q.bind(k);
                                }
                                n += q.execute(&mut *tx).await.map_err(be)?.rows_affected();
                            }
                            n
                        }
                        Op::SenderKeys { group, entries } => {
                            // One statement per 400 devices, not one each:
                            // a first send to 1,000 devices made 1,000.
                            let entries = last_per_device(entries);
                            let mut n = 0;
                            for chunk in entries.chunks(PUTS_PER_STATEMENT) {
                                let sql = sender_keys_sql(chunk.len(), positional);
                                let mut q = sqlx::query(&sql);
                                if !positional {
                                    q = q.bind(a).bind(group);
                                }
                                for (device, has) in chunk {
                                    if positional {
                                        q = q.bind(a).bind(group);
                                    }
                                    q = q.bind(*device).bind(*has);
                                }
                                n += q.execute(&mut *tx).await.map_err(be)?.rows_affected();
                            }
                            n
                        }
                        Op::ClearSenderKeys { group: Some(g) } => sqlx::query(
                            "DELETE FROM wa_sender_key_devices WHERE account_id = $1 AND group_jid = $2",
                        )
                        .bind(a).bind(g)
                        .execute(&mut *tx).await.map_err(be)?.rows_affected(),
                        Op::ClearSenderKeys { group: None } => sqlx::query(
                            "DELETE FROM wa_sender_key_devices WHERE account_id = $1",
                        )
                        .bind(a)
                        .execute(&mut *tx).await.map_err(be)?.rows_affected(),
                        Op::DropSenderKeyDevices { devices } => {
                            let mut n = 0;
                            for chunk in devices.chunks(PUTS_PER_STATEMENT) {
                                let sql = format!(
                                    "DELETE FROM wa_sender_key_devices WHERE account_id = {} \
                                     AND device_jid IN ({})",
                                    param(positional, 1),
                                    params(positional, 2, chunk.len())
                                );
                                let mut q = sqlx::query(&sql).bind(a);
                                for d in chunk {
                                    q = q.bind(d);
                                }
                                n += q.execute(&mut *tx).await.map_err(be)?.rows_affected();
                            }
                            n
                        }
                    };
                }
                answers.push(Ok(touched));
            }
            Ok::<_, StoreError>(answers)
        })
    }

    /// Removes the row of `kind` at `k` and returns it, under `fence`.
    pub async fn take(
        &self,
        account: &AccountId,
        fence: Option<&Fence>,
        kind: i32,
        k: &str,
    ) -> StoreResult<Option<Row>> {
        let fence_sql = self.store().fence_check_sql();
        tx!(self, tx => {
            check_fences!(tx, &fence_sql, fence.as_slice());
            sqlx::query(
                "DELETE FROM wa_session_rows WHERE account_id = $1 AND kind = $2 AND k = $3 \
                 RETURNING k, g, n, v",
            )
            .bind(account.as_str())
            .bind(kind)
            .bind(k)
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?
            .map(|r| row_from(&r))
            .transpose()
        })
    }

    /// Forgets everything of an account's session (it pairs again, or was
    /// deleted), under `fence`.
    pub async fn clear(&self, account: &AccountId, fence: Option<&Fence>) -> StoreResult<()> {
        let fence_sql = self.store().fence_check_sql();
        tx!(self, tx => {
            check_fences!(tx, &fence_sql, fence.as_slice());
            for table in ["wa_session_rows", "wa_sender_key_devices"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE account_id = $1"))
                    .bind(account.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
            Ok::<(), StoreError>(())
        })
    }

    /// The accounts with a row of `kind` (those with a stored device).
    pub async fn accounts_with(&self, kind: i32) -> StoreResult<Vec<AccountId>> {
        let sql =
            "SELECT DISTINCT account_id FROM wa_session_rows WHERE kind = $1 ORDER BY account_id";
        read!(self, p => {
            sqlx::query(sql)
                .bind(kind)
                .fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(|r| {
                    AccountId::parse(&r.text("account_id")?)
                        .map_err(|e| StoreError::Backend(format!("stored account id is invalid: {e}")))
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_marked_twice_keeps_its_last_mark_in_its_first_place() {
        let marks =
            [("a", true), ("b", false), ("a", false), ("c", true)].map(|(d, h)| (d.to_owned(), h));
        assert_eq!(
            last_per_device(&marks),
            [("a", false), ("b", false), ("c", true)]
        );
    }

    #[test]
    fn statements_number_their_parameters_on_postgres_only() {
        assert_eq!(
            values_sql(2, false, 1, 5),
            "($1, $2, $3, $4, $5, $6), ($1, $7, $8, $9, $10, $11)"
        );
        assert_eq!(values_sql(2, true, 1, 2), "(?, ?, ?), (?, ?, ?)");
        assert_eq!(params(false, 4, 3), "$4, $5, $6");
        assert_eq!(params(true, 4, 3), "?, ?, ?");
        let pg = sender_keys_sql(2, false);
        assert!(
            pg.contains("VALUES ($1, $2, $3, $4), ($1, $2, $5, $6) ON CONFLICT"),
            "{pg}"
        );
        let lite = sender_keys_sql(2, true);
        assert!(
            lite.contains("VALUES (?, ?, ?, ?), (?, ?, ?, ?) ON CONFLICT"),
            "{lite}"
        );
    }
}
