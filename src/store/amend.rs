//! Recalls and edits of sent runs (`run_amendments`, `amend_marks`,
//! migration 0019): [`AmendStore`] on SQL. Every write is one transaction
//! under the account's lease; a mark is a compare-and-set on the group's
//! state, so no group is amended twice whichever daemon carries the
//! account.

use super::rows::{trunc, RowGet, Ts};
use super::{be, check_fences, corrupt, read, tx, SqlStore};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::lifecycle::maybe_in_flight_sql;
use herald_actors::ports::{AmendStore, StoreError, StoreResult};

const AMEND_COLS: &str =
    "id, run_id, account_id, kind, edits, requested_at, window_secs, finished_at";

/// A group's progress in amendment `$2` of run `$1`, over the run's groups
/// that may have received a message.
fn progress_sql() -> String {
    format!(
        "SELECT COUNT(*) AS total, \
     COALESCE(SUM(CASE WHEN m.state = 'done' THEN 1 ELSE 0 END), 0) AS done, \
     COALESCE(SUM(CASE WHEN m.state = 'too_old' THEN 1 ELSE 0 END), 0) AS too_old, \
     COALESCE(SUM(CASE WHEN m.state = 'failed' THEN 1 ELSE 0 END), 0) AS failed, \
     COALESCE(SUM(CASE WHEN m.state = 'sending' THEN 1 ELSE 0 END), 0) AS sending \
     FROM run_targets t LEFT JOIN amend_marks m ON m.target_id = t.id AND m.amendment_id = $2 \
     WHERE t.run_id = $1 AND {}",
        amendable_sql()
    )
}

/// The run's groups with a message that may have arrived.
fn amendable_sql() -> String {
    format!(
        "t.message_id IS NOT NULL AND (t.parts_sent > 0 OR {})",
        maybe_in_flight_sql()
    )
}

fn amendment_from<R: RowGet>(r: &R) -> StoreResult<(Amendment, AccountId)> {
    let kind = r.text("kind")?;
    let edits: Vec<Option<String>> =
        serde_json::from_str(&r.text("edits")?).map_err(|e| corrupt("amendment edits", e))?;
    let account = AccountId::parse(&r.text("account_id")?).map_err(|e| corrupt("account", e))?;
    Ok((
        Amendment {
            id: r.int("id")?,
            run_id: RunId(r.int("run_id")?),
            kind: AmendKind::parse(&kind).ok_or_else(|| corrupt("amendment kind", &kind))?,
            edits,
            requested_at: r.ts("requested_at")?,
            window_secs: r.int("window_secs")?,
            finished_at: r.opt_ts("finished_at")?,
            progress: AmendProgress::default(),
            left_as_sent: Vec::new(),
        },
        account,
    ))
}

fn amend_target_from<R: RowGet>(r: &R) -> StoreResult<AmendTarget> {
    let state = match r.opt_text("state")? {
        Some(s) => Some(AmendState::parse(&s).ok_or_else(|| corrupt("amend state", &s))?),
        None => None,
    };
    Ok(AmendTarget {
        target_id: r.int("id")?,
        position: r.int("position")? as u32,
        group: GroupJid::parse(&r.text("group_jid")?).map_err(|e| corrupt("group", e))?,
        parts_sent: r.int("parts_sent")? as u32,
        in_flight: r.int("in_flight")? != 0,
        sent_at: r.opt_ts("sent_at")?,
        state,
        marked_at: r.opt_ts("marked_at")?,
    })
}

fn progress_from<R: RowGet>(r: &R) -> StoreResult<AmendProgress> {
    Ok(AmendProgress {
        total: r.int("total")? as u32,
        done: r.int("done")? as u32,
        too_old: r.int("too_old")? as u32,
        failed: r.int("failed")? as u32,
        sending: r.int("sending")? as u32,
    })
}

impl SqlStore {
    /// Locks the amendment's row on PostgreSQL, so two daemons marking the
    /// same group in the moment the account moves take turns (SQLite's
    /// write transactions take turns already).
    fn row_lock(&self) -> &'static str {
        match &self.db {
            super::Db::Postgres(_) => " FOR UPDATE",
            super::Db::Sqlite { .. } => "",
        }
    }

    /// Amendments a `WHERE` clause picks, with their progress.
    async fn amendments_where(
        &self,
        cond: &str,
        order: &str,
        bind: Option<i64>,
    ) -> StoreResult<Vec<(Amendment, AccountId)>> {
        let sql = format!("SELECT {AMEND_COLS} FROM run_amendments WHERE {cond} ORDER BY {order}");
        let rows = read!(self, p => {
            let q = sqlx::query(&sql);
            let q = match bind {
                Some(b) => q.bind(b),
                None => q,
            };
            q.fetch_all(p).await.map_err(be)?.iter().map(amendment_from).collect::<StoreResult<Vec<_>>>()?
        });
        let mut out = Vec::with_capacity(rows.len());
        for (mut a, account) in rows {
            let progress = progress_sql();
            a.progress = read!(self, p => progress_from(
                &sqlx::query(&progress).bind(a.run_id.0).bind(a.id).fetch_one(p).await.map_err(be)?
            )?);
            out.push((a, account));
        }
        Ok(out)
    }
}

#[async_trait]
impl AmendStore for SqlStore {
    async fn create_amendment(
        &self,
        a: &NewAmendment,
        fences: &[Fence],
        event: &NewEvent,
    ) -> StoreResult<(Amendment, Event)> {
        let fence_sql = self.fence_check_sql();
        let edits = serde_json::to_string(&a.edits).map_err(|e| corrupt("amendment edits", e))?;
        let (id, stored) = tx!(self, tx => {
            check_fences!(tx, &fence_sql, fences);
            let account: Option<String> =
                sqlx::query_scalar("SELECT account_id FROM runs WHERE id = $1")
                    .bind(a.run_id.0)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(be)?;
            let account = account.ok_or_else(|| StoreError::NotFound(format!("run {}", a.run_id)))?;
            let open = sqlx::query(
                "SELECT id, kind FROM run_amendments WHERE run_id = $1 AND finished_at IS NULL",
            )
            .bind(a.run_id.0)
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            if let Some(open) = open {
                return Err(StoreError::Conflict(format!(
                    "run {} has a {} under way (amendment {}); wait for it to finish",
                    a.run_id,
                    open.text("kind")?,
                    open.int("id")?
                )));
            }
            // Two daemons racing: the partial unique index refuses the second.
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO run_amendments (run_id, account_id, kind, edits, requested_at, \
                 window_secs) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
            )
            .bind(a.run_id.0)
            .bind(&account)
            .bind(a.kind.as_str())
            .bind(&edits)
            .bind(Ts(trunc(a.requested_at)))
            .bind(a.window_secs)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| match &e {
                sqlx::Error::Database(d) if d.is_unique_violation() => StoreError::Conflict(
                    format!("run {} has a recall or an edit under way", a.run_id),
                ),
                _ => be(e),
            })?;
            let stored = super::events::insert_in(&mut *tx, std::slice::from_ref(event))
                .await?
                .pop()
                .ok_or_else(|| StoreError::Backend("event not stored".into()))?;
            (id, stored)
        });
        let a = self
            .get_amendment(id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("amendment {id}")))?;
        Ok((a, stored))
    }

    async fn run_amendment(&self, run: RunId) -> StoreResult<Option<Amendment>> {
        Ok(self
            .amendments_where("run_id = $1", "id DESC LIMIT 1", Some(run.0))
            .await?
            .pop()
            .map(|(a, _)| a))
    }

    async fn get_amendment(&self, id: i64) -> StoreResult<Option<Amendment>> {
        Ok(self
            .amendments_where("id = $1", "id", Some(id))
            .await?
            .pop()
            .map(|(a, _)| a))
    }

    async fn unfinished_amendments(&self) -> StoreResult<Vec<(Amendment, AccountId)>> {
        self.amendments_where("finished_at IS NULL", "id", None)
            .await
    }

    async fn amend_targets(
        &self,
        id: i64,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<AmendTarget>> {
        let sql = format!(
            "SELECT t.id, t.position, t.group_jid, t.parts_sent, t.sent_at, m.state, m.at AS marked_at, \
             CASE WHEN {} THEN CAST(1 AS BIGINT) ELSE CAST(0 AS BIGINT) END AS in_flight \
             FROM run_amendments a JOIN run_targets t ON t.run_id = a.run_id \
             LEFT JOIN amend_marks m ON m.target_id = t.id AND m.amendment_id = a.id \
             WHERE a.id = $1 AND {} AND t.position > $2 \
             ORDER BY t.position LIMIT $3",
            maybe_in_flight_sql(),
            amendable_sql()
        );
        read!(self, p => sqlx::query(&sql)
        .bind(id)
        .bind(after_position.map_or(-1, i64::from))
        .bind(super::records::sql_limit(limit))
        .fetch_all(p)
        .await
        .map_err(be)?
        .iter()
        .map(amend_target_from)
        .collect())
    }

    async fn mark_amend(
        &self,
        fences: &[Fence],
        id: i64,
        target_id: i64,
        state: AmendState,
        error: Option<&str>,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let fence_sql = self.fence_check_sql();
        let lock = self.row_lock();
        Ok(tx!(self, tx => {
            check_fences!(tx, &fence_sql, fences);
            let open = sqlx::query(&format!(
                "SELECT account_id, finished_at FROM run_amendments WHERE id = $1{lock}"
            ))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?
            .ok_or_else(|| StoreError::NotFound(format!("amendment {id}")))?;
            if open.opt_ts("finished_at")?.is_some() {
                return Ok(false);
            }
            let from: Option<String> = sqlx::query_scalar(
                "SELECT state FROM amend_marks WHERE amendment_id = $1 AND target_id = $2",
            )
            .bind(id)
            .bind(target_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            let from = from.as_deref().and_then(AmendState::parse);
            if !state.allowed_from(from) {
                false
            } else {
                sqlx::query(
                    "INSERT INTO amend_marks (amendment_id, target_id, account_id, state, error, at) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (amendment_id, target_id) \
                     DO UPDATE SET state = excluded.state, error = excluded.error, at = excluded.at",
                )
                .bind(id)
                .bind(target_id)
                .bind(open.text("account_id")?)
                .bind(state.as_str())
                .bind(error)
                .bind(Ts(trunc(at)))
                .execute(&mut *tx)
                .await
                .map_err(|e| {
                    if super::is_fk_violation(&e) {
                        StoreError::NotFound(format!("run target {target_id}"))
                    } else {
                        be(e)
                    }
                })?;
                true
            }
        }))
    }

    async fn finish_amendment(
        &self,
        fences: &[Fence],
        id: i64,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> StoreResult<Option<Event>> {
        let fence_sql = self.fence_check_sql();
        Ok(tx!(self, tx => {
            check_fences!(tx, &fence_sql, fences);
            let closed = sqlx::query(
                "UPDATE run_amendments SET finished_at = $2 WHERE id = $1 AND finished_at IS NULL",
            )
            .bind(id)
            .bind(Ts(trunc(at)))
            .execute(&mut *tx)
            .await
            .map_err(be)?
            .rows_affected()
                == 1;
            if closed {
                super::events::insert_in(&mut *tx, std::slice::from_ref(event)).await?.pop()
            } else {
                None
            }
        }))
    }
}
