//! WhatsApp sessions in the shared database (`wa_session_rows`,
//! `wa_sender_key_devices`; migration 0014): rows of opaque, already-sealed
//! bytes per account, written in transactions that first check the
//! account's lease when one is given, as run marks are. What the rows
//! mean, and their sealing, is the WhatsApp gateway's business
//! (`gateway::whatsapp::backend`); the key they are sealed under is
//! recorded in `wa_session_key` ([`super::sealed`]).

use super::rows::RowGet;
use super::{be, Db, SqlStore};
use super::{check_fences, read, tx};
use herald_actors::domain::{AccountId, Fence};
use herald_actors::ports::{StoreError, StoreResult};

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

/// The session rows of every account. Cheap to clone.
#[derive(Clone)]
pub struct WaRows {
    pub(super) db: Db,
}

impl SqlStore {
    /// The WhatsApp session rows, on this store's pools.
    pub fn wa_rows(&self) -> WaRows {
        WaRows {
            db: self.db.clone(),
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

/// `$from, $from+1, …` for an `IN (…)` of `n` values.
fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
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
                placeholders(3, chunk.len())
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
            placeholders(3, kinds.len())
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

    /// Applies `ops` in one transaction, under `fence` when given (the
    /// account's lease, checked first in the same transaction; nothing is
    /// written when it is no longer current). Returns the rows touched.
    pub async fn write(
        &self,
        account: &AccountId,
        fence: Option<&Fence>,
        ops: &[Op],
    ) -> StoreResult<u64> {
        if let Some(f) = fence {
            if f.account != *account {
                return Err(StoreError::fenced(f));
            }
        }
        let fence_sql = self.store().fence_check_sql();
        let a = account.as_str();
        tx!(self, tx => {
            check_fences!(tx, &fence_sql, fence.as_slice());
            let mut touched = 0u64;
            for op in ops {
                touched += match op {
                    Op::Put { kind, k, g, n, v } => sqlx::query(
                        "INSERT INTO wa_session_rows (account_id, kind, k, g, n, v) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (account_id, kind, k) \
                         DO UPDATE SET g = excluded.g, n = excluded.n, v = excluded.v",
                    )
                    .bind(a).bind(*kind).bind(k).bind(g).bind(*n).bind(v)
                    .execute(&mut *tx).await.map_err(be)?.rows_affected(),
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
                        let mut n = 0;
                        for k in ks {
                            n += sqlx::query(
                                "UPDATE wa_session_rows SET g = $4 WHERE account_id = $1 \
                                 AND kind = $2 AND k = $3",
                            )
                            .bind(a).bind(*kind).bind(k).bind(g)
                            .execute(&mut *tx).await.map_err(be)?.rows_affected();
                        }
                        n
                    }
                    Op::SenderKeys { group, entries } => {
                        let mut n = 0;
                        for (device, has) in entries {
                            n += sqlx::query(
                                "INSERT INTO wa_sender_key_devices (account_id, group_jid, device_jid, has_key) \
                                 VALUES ($1, $2, $3, $4) ON CONFLICT (account_id, group_jid, device_jid) \
                                 DO UPDATE SET has_key = excluded.has_key",
                            )
                            .bind(a).bind(group).bind(device).bind(*has)
                            .execute(&mut *tx).await.map_err(be)?.rows_affected();
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
                        for d in devices {
                            n += sqlx::query(
                                "DELETE FROM wa_sender_key_devices WHERE account_id = $1 AND device_jid = $2",
                            )
                            .bind(a).bind(d)
                            .execute(&mut *tx).await.map_err(be)?.rows_affected();
                        }
                        n
                    }
                };
            }
            Ok::<u64, StoreError>(touched)
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
