//! Where SQLite and PostgreSQL part ways, in one place: the bulk
//! statements (arrays through `UNNEST` on PostgreSQL, a JSON array through
//! `json_each` on SQLite) behind the `Bulk` trait, one implementation per
//! connection type, and the batch of target transitions built on them.

use super::records::{run_from, runs_sql};
use super::rows::{trunc, RowGet, Ts};
use super::{be, is_fk_violation, not_found};
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::*;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;
use std::collections::{HashMap, HashSet};

// ---------------------------------------------------------------- dialects

/// Bulk statements, where the two dialects part ways for speed: both send
/// a whole batch in a few statements, PostgreSQL as arrays it unnests,
/// SQLite as a JSON array it walks with `json_each` (a statement per row
/// would cost a hop to sqlx's SQLite worker thread each).
pub(super) trait Bulk {
    async fn insert_reminder_targets(&mut self, reminder: i64, t: &[GroupJid]) -> StoreResult<()>;
    async fn insert_run_targets(
        &mut self,
        run: i64,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()>;
    /// Applies transitions that each name a different target; NotFound if
    /// one names no target.
    async fn apply_distinct(&mut self, ts: &ByKind<'_>) -> StoreResult<()>;
    /// Inserts the runs whose occurrence is free, in one statement; returns
    /// (id, reminder, scheduled_for) of those it inserted. NotFound if one
    /// names an unknown reminder (the transaction is then unusable).
    async fn insert_runs(&mut self, runs: &[NewRun], now: DateTime<Utc>) -> StoreResult<Inserted>;
    /// The runs at these occurrences, with their counts, in any order.
    async fn runs_at(&mut self, keys: &[Occurrence]) -> StoreResult<Vec<Run>>;
    /// One of `ids` that names no reminder.
    async fn missing_reminder(&mut self, ids: &[i64]) -> StoreResult<Option<i64>>;
    /// Inserts events in order; their ids, ascending.
    async fn insert_events(&mut self, events: &[EventRow<'_>]) -> StoreResult<Vec<i64>>;
}

/// (reminder, scheduled_for): a run's firing lock.
pub(super) type Occurrence = (i64, DateTime<Utc>);

/// What `insert_runs` inserted: id by occurrence.
type Inserted = HashMap<Occurrence, i64>;

/// An event as stored: instant truncated, data serialized.
pub(super) struct EventRow<'a> {
    at: DateTime<Utc>,
    kind: &'a str,
    account_id: Option<&'a str>,
    run_id: Option<i64>,
    data: String,
}

impl<'a> EventRow<'a> {
    pub(super) fn of(e: &'a NewEvent) -> StoreResult<Self> {
        Ok(Self {
            at: trunc(e.at),
            kind: e.kind,
            account_id: e.account_id.as_ref().map(AccountId::as_str),
            run_id: e.run_id.map(|r| r.0),
            data: serde_json::to_string(&e.data).map_err(|e| StoreError::Backend(e.to_string()))?,
        })
    }

    pub(super) fn stored(&self, id: i64, e: &NewEvent) -> Event {
        Event {
            id,
            at: self.at,
            kind: self.kind.to_owned(),
            account_id: self.account_id.map(str::to_owned),
            run_id: self.run_id,
            data: e.data.clone(),
        }
    }
}

/// The run `create_run` would read back right after inserting it.
pub(super) fn fresh_run(id: i64, r: &NewRun, now: DateTime<Utc>) -> Run {
    Run {
        id: RunId(id),
        reminder_id: r.reminder_id,
        account_id: r.account_id.clone(),
        scheduled_for: r.scheduled_for,
        window_end_at: None,
        status: r.status,
        forecast: None,
        error_summary: r.error_summary.clone(),
        counts: TargetCounts::default(),
        created_at: now,
        started_at: None,
        finished_at: None,
        stop_requested_at: None,
    }
}

fn fk_to_not_found(e: sqlx::Error) -> StoreError {
    if is_fk_violation(&e) {
        not_found("reminder")
    } else {
        be(e)
    }
}

fn inserted_from<R: RowGet>(rows: &[R]) -> StoreResult<Inserted> {
    rows.iter()
        .map(|r| {
            Ok((
                (r.int("reminder_id")?, r.ts("scheduled_for")?),
                r.int("id")?,
            ))
        })
        .collect()
}

/// Applies a batch in order. Grouping by kind reorders the batch, which is
/// only harmless while each target appears once, so the batch is cut into
/// stretches of distinct targets (usually the whole batch) applied in turn.
pub(super) async fn apply_batch<C: Bulk>(conn: &mut C, ts: &[Transition]) -> StoreResult<()> {
    let mut start = 0;
    while start < ts.len() {
        let mut seen = HashSet::new();
        let mut end = start;
        while end < ts.len() && seen.insert(ts[end].target_id()) {
            end += 1;
        }
        conn.apply_distinct(&ByKind::of(&ts[start..end])).await?;
        start = end;
    }
    Ok(())
}

/// A stretch of transitions sorted by what they do to a target row.
#[derive(Default)]
pub(super) struct ByKind<'a> {
    /// (target, message id)
    sending: Vec<(i64, &'a str)>,
    /// (target, parts_sent, status, sent_at, latency_ms)
    sent: Vec<(i64, i64, &'static str, DateTime<Utc>, i64)>,
    /// (target, final status, error)
    ended: Vec<(i64, &'static str, &'a str)>,
    requeued: Vec<i64>,
}

impl<'a> ByKind<'a> {
    pub(super) fn of(ts: &'a [Transition]) -> Self {
        let mut k = Self::default();
        for t in ts {
            match t {
                Transition::Sending {
                    target_id,
                    message_id,
                    ..
                } => k.sending.push((*target_id, message_id)),
                Transition::Sent {
                    target_id,
                    part,
                    last,
                    at,
                    latency_ms,
                } => {
                    let status = if *last {
                        TargetStatus::Sent
                    } else {
                        TargetStatus::Pending
                    };
                    k.sent.push((
                        *target_id,
                        i64::from(*part) + 1,
                        status.as_str(),
                        *at,
                        i64::from(*latency_ms),
                    ));
                }
                Transition::Failed { target_id, error } => {
                    k.ended
                        .push((*target_id, TargetStatus::Failed.as_str(), error))
                }
                Transition::Skipped { target_id, reason } => {
                    k.ended
                        .push((*target_id, TargetStatus::Skipped.as_str(), reason))
                }
                Transition::Requeue { target_id } => k.requeued.push(*target_id),
            }
        }
        k
    }
}

fn json(v: serde_json::Value) -> String {
    v.to_string()
}

/// A reminder's selector as stored (NULL: explicit JIDs only).
pub(super) fn select_json(r: &NewReminder) -> Option<String> {
    r.select
        .as_ref()
        .map(|s| serde_json::to_string(s).expect("a selector serialises"))
}

fn jids_json(groups: &[GroupJid]) -> String {
    json(serde_json::Value::Array(
        groups.iter().map(|g| g.as_str().into()).collect(),
    ))
}

impl Bulk for SqliteConnection {
    async fn insert_reminder_targets(&mut self, reminder: i64, t: &[GroupJid]) -> StoreResult<()> {
        // `WHERE true` settles SQLite's parse of INSERT … SELECT … ON CONFLICT.
        sqlx::query(
            "INSERT INTO reminder_targets (reminder_id, position, group_jid) \
             SELECT $1, j.key, j.value FROM json_each($2) AS j WHERE true",
        )
        .bind(reminder)
        .bind(jids_json(t))
        .execute(&mut *self)
        .await
        .map_err(be)?;
        Ok(())
    }

    async fn insert_run_targets(
        &mut self,
        run: i64,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        let rows = json(serde_json::Value::Array(
            groups
                .iter()
                .map(|(g, how)| serde_json::json!([g.as_str(), how]))
                .collect(),
        ));
        sqlx::query(
            "INSERT INTO run_targets (run_id, position, group_jid, status, chosen_by) \
             SELECT $1, j.key, j.value ->> 0, 'pending', j.value ->> 1 FROM json_each($2) AS j \
             WHERE true ON CONFLICT (run_id, position) DO NOTHING",
        )
        .bind(run)
        .bind(rows)
        .execute(&mut *self)
        .await
        .map_err(be)?;
        Ok(())
    }

    async fn apply_distinct(&mut self, k: &ByKind<'_>) -> StoreResult<()> {
        use serde_json::json as j;
        let mut steps: Vec<(&str, serde_json::Value, Vec<i64>)> = Vec::new();
        if !k.sending.is_empty() {
            steps.push((
                "UPDATE run_targets SET status = 'sending', message_id = j.value ->> 1, \
                 attempts = attempts + 1 \
                 FROM json_each($1) AS j WHERE run_targets.id = j.value ->> 0 \
                 AND run_targets.status IN ('pending', 'sending')",
                k.sending.iter().map(|(id, m)| j!([id, m])).collect(),
                k.sending.iter().map(|r| r.0).collect(),
            ));
        }
        if !k.sent.is_empty() {
            steps.push((
                "UPDATE run_targets SET parts_sent = j.value ->> 1, status = j.value ->> 2, \
                 sent_at = j.value ->> 3, latency_ms = j.value ->> 4 \
                 FROM json_each($1) AS j WHERE run_targets.id = j.value ->> 0 \
                 AND run_targets.status = 'sending'",
                k.sent
                    .iter()
                    .map(|(id, n, st, at, lat)| j!([id, n, st, at.timestamp_micros(), lat]))
                    .collect(),
                k.sent.iter().map(|r| r.0).collect(),
            ));
        }
        if !k.ended.is_empty() {
            steps.push((
                "UPDATE run_targets SET status = j.value ->> 1, error = j.value ->> 2 \
                 FROM json_each($1) AS j WHERE run_targets.id = j.value ->> 0 \
                 AND run_targets.status IN ('pending', 'sending')",
                k.ended.iter().map(|(id, st, e)| j!([id, st, e])).collect(),
                k.ended.iter().map(|r| r.0).collect(),
            ));
        }
        if !k.requeued.is_empty() {
            steps.push((
                "UPDATE run_targets SET status = 'pending', error = NULL \
                 WHERE id IN (SELECT value FROM json_each($1)) \
                 AND status IN ('failed', 'skipped')",
                k.requeued.iter().map(|id| j!(id)).collect(),
                k.requeued.clone(),
            ));
        }
        for (sql, rows, ids) in steps {
            let n = sqlx::query(sql)
                .bind(json(rows))
                .execute(&mut *self)
                .await
                .map_err(be)?
                .rows_affected();
            if n != ids.len() as u64 {
                let missing: Option<i64> = sqlx::query_scalar(
                    "SELECT j.value FROM json_each($1) AS j \
                     WHERE NOT EXISTS (SELECT 1 FROM run_targets t WHERE t.id = j.value) LIMIT 1",
                )
                .bind(json(ids.into()))
                .fetch_optional(&mut *self)
                .await
                .map_err(be)?;
                // Every row exists: the others were skipped by their status guard.
                if let Some(id) = missing {
                    return Err(missing_target(Some(id)));
                }
            }
        }
        Ok(())
    }

    async fn insert_runs(&mut self, runs: &[NewRun], now: DateTime<Utc>) -> StoreResult<Inserted> {
        use serde_json::json as j;
        let rows: Vec<_> = runs
            .iter()
            .map(|r| {
                j!([
                    r.reminder_id,
                    r.account_id.as_str(),
                    r.scheduled_for.timestamp_micros(),
                    r.status.as_str(),
                    r.error_summary
                ])
            })
            .collect();
        let rows = sqlx::query(
            "INSERT INTO runs (reminder_id, account_id, scheduled_for, status, error_summary, \
             created_at) \
             SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4, $2 \
             FROM json_each($1) AS j WHERE true ORDER BY j.key \
             ON CONFLICT (reminder_id, scheduled_for) DO NOTHING \
             RETURNING id, reminder_id, scheduled_for",
        )
        .bind(json(rows.into()))
        .bind(Ts(now))
        .fetch_all(&mut *self)
        .await
        .map_err(fk_to_not_found)?;
        inserted_from(&rows)
    }

    async fn runs_at(&mut self, keys: &[Occurrence]) -> StoreResult<Vec<Run>> {
        let sql = runs_sql(
            "id IN (SELECT r.id FROM json_each($1) AS j JOIN runs AS r \
             ON r.reminder_id = j.value ->> 0 AND r.scheduled_for = j.value ->> 1)",
            "ASC",
            "",
        );
        let keys: Vec<_> = keys
            .iter()
            .map(|(r, at)| serde_json::json!([r, at.timestamp_micros()]))
            .collect();
        sqlx::query(&sql)
            .bind(json(keys.into()))
            .fetch_all(&mut *self)
            .await
            .map_err(be)?
            .iter()
            .map(run_from)
            .collect()
    }

    async fn missing_reminder(&mut self, ids: &[i64]) -> StoreResult<Option<i64>> {
        sqlx::query_scalar(
            "SELECT j.value FROM json_each($1) AS j \
             WHERE NOT EXISTS (SELECT 1 FROM reminders r WHERE r.id = j.value) LIMIT 1",
        )
        .bind(json(ids.into()))
        .fetch_optional(&mut *self)
        .await
        .map_err(be)
    }

    async fn insert_events(&mut self, events: &[EventRow<'_>]) -> StoreResult<Vec<i64>> {
        use serde_json::json as j;
        let rows: Vec<_> = events
            .iter()
            .map(|e| {
                j!([
                    e.at.timestamp_micros(),
                    e.kind,
                    e.account_id,
                    e.run_id,
                    e.data
                ])
            })
            .collect();
        // AUTOINCREMENT numbers rows in the order the SELECT yields them;
        // RETURNING's own order is unspecified, so sort.
        let mut ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO events (at, kind, account_id, run_id, data) \
             SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4 \
             FROM json_each($1) AS j ORDER BY j.key RETURNING id",
        )
        .bind(json(rows.into()))
        .fetch_all(&mut *self)
        .await
        .map_err(be)?;
        ids.sort_unstable();
        Ok(ids)
    }
}

fn missing_target(id: Option<i64>) -> StoreError {
    not_found(match id {
        Some(id) => format!("run target {id}"),
        None => "run target".to_owned(),
    })
}

impl Bulk for PgConnection {
    async fn insert_reminder_targets(&mut self, reminder: i64, t: &[GroupJid]) -> StoreResult<()> {
        let pos: Vec<i64> = (0..t.len() as i64).collect();
        let jids: Vec<&str> = t.iter().map(GroupJid::as_str).collect();
        sqlx::query(
            "INSERT INTO reminder_targets (reminder_id, position, group_jid) \
             SELECT $1, u.pos, u.jid FROM UNNEST($2::bigint[], $3::text[]) AS u(pos, jid)",
        )
        .bind(reminder)
        .bind(pos)
        .bind(jids)
        .execute(&mut *self)
        .await
        .map_err(be)?;
        Ok(())
    }

    async fn insert_run_targets(
        &mut self,
        run: i64,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        let pos: Vec<i64> = (0..groups.len() as i64).collect();
        let jids: Vec<&str> = groups.iter().map(|(g, _)| g.as_str()).collect();
        let how: Vec<&str> = groups.iter().map(|(_, h)| h.as_str()).collect();
        sqlx::query(
            "INSERT INTO run_targets (run_id, position, group_jid, status, chosen_by) \
             SELECT $1, u.pos, u.jid, 'pending', u.how \
             FROM UNNEST($2::bigint[], $3::text[], $4::text[]) AS u(pos, jid, how) \
             ON CONFLICT (run_id, position) DO NOTHING",
        )
        .bind(run)
        .bind(pos)
        .bind(jids)
        .bind(how)
        .execute(&mut *self)
        .await
        .map_err(be)?;
        Ok(())
    }

    async fn apply_distinct(&mut self, k: &ByKind<'_>) -> StoreResult<()> {
        if !k.sending.is_empty() {
            let (ids, mids): (Vec<i64>, Vec<&str>) = k.sending.iter().copied().unzip();
            let n = sqlx::query(
                "UPDATE run_targets AS t SET status = 'sending', message_id = u.mid, \
                 attempts = t.attempts + 1 \
                 FROM UNNEST($1::bigint[], $2::text[]) AS u(id, mid) WHERE t.id = u.id \
                 AND t.status IN ('pending', 'sending')",
            )
            .bind(&ids)
            .bind(&mids)
            .execute(&mut *self)
            .await
            .map_err(be)?
            .rows_affected();
            pg_all_found(self, n, &ids).await?;
        }
        if !k.sent.is_empty() {
            let ids: Vec<i64> = k.sent.iter().map(|r| r.0).collect();
            let n = sqlx::query(
                "UPDATE run_targets AS t SET parts_sent = u.parts_sent, status = u.status, \
                 sent_at = u.at, latency_ms = u.lat \
                 FROM UNNEST($1::bigint[], $2::bigint[], $3::text[], $4::timestamptz[], \
                             $5::bigint[]) AS u(id, parts_sent, status, at, lat) \
                 WHERE t.id = u.id AND t.status = 'sending'",
            )
            .bind(&ids)
            .bind(k.sent.iter().map(|r| r.1).collect::<Vec<i64>>())
            .bind(k.sent.iter().map(|r| r.2).collect::<Vec<&str>>())
            .bind(k.sent.iter().map(|r| r.3).collect::<Vec<DateTime<Utc>>>())
            .bind(k.sent.iter().map(|r| r.4).collect::<Vec<i64>>())
            .execute(&mut *self)
            .await
            .map_err(be)?
            .rows_affected();
            pg_all_found(self, n, &ids).await?;
        }
        if !k.ended.is_empty() {
            let ids: Vec<i64> = k.ended.iter().map(|r| r.0).collect();
            let n = sqlx::query(
                "UPDATE run_targets AS t SET status = u.status, error = u.error \
                 FROM UNNEST($1::bigint[], $2::text[], $3::text[]) AS u(id, status, error) \
                 WHERE t.id = u.id AND t.status IN ('pending', 'sending')",
            )
            .bind(&ids)
            .bind(k.ended.iter().map(|r| r.1).collect::<Vec<&str>>())
            .bind(k.ended.iter().map(|r| r.2).collect::<Vec<&str>>())
            .execute(&mut *self)
            .await
            .map_err(be)?
            .rows_affected();
            pg_all_found(self, n, &ids).await?;
        }
        if !k.requeued.is_empty() {
            let n = sqlx::query(
                "UPDATE run_targets SET status = 'pending', error = NULL \
                 WHERE id = ANY($1::bigint[]) AND status IN ('failed', 'skipped')",
            )
            .bind(&k.requeued)
            .execute(&mut *self)
            .await
            .map_err(be)?
            .rows_affected();
            pg_all_found(self, n, &k.requeued).await?;
        }
        Ok(())
    }

    async fn insert_runs(&mut self, runs: &[NewRun], now: DateTime<Utc>) -> StoreResult<Inserted> {
        // Occurrence order, not input order: two batches that overlap then
        // take the occurrences' index entries in the same order, so one
        // waits for the other instead of deadlocking.
        let rows = sqlx::query(
            "INSERT INTO runs (reminder_id, account_id, scheduled_for, status, error_summary, \
             created_at) \
             SELECT u.rid, u.acc, u.at, u.status, u.err, $6 \
             FROM UNNEST($1::bigint[], $2::text[], $3::timestamptz[], $4::text[], $5::text[]) \
                  AS u(rid, acc, at, status, err) \
             ORDER BY u.rid, u.at \
             ON CONFLICT (reminder_id, scheduled_for) DO NOTHING \
             RETURNING id, reminder_id, scheduled_for",
        )
        .bind(runs.iter().map(|r| r.reminder_id).collect::<Vec<i64>>())
        .bind(
            runs.iter()
                .map(|r| r.account_id.as_str())
                .collect::<Vec<&str>>(),
        )
        .bind(
            runs.iter()
                .map(|r| r.scheduled_for)
                .collect::<Vec<DateTime<Utc>>>(),
        )
        .bind(
            runs.iter()
                .map(|r| r.status.as_str())
                .collect::<Vec<&str>>(),
        )
        .bind(
            runs.iter()
                .map(|r| r.error_summary.as_deref())
                .collect::<Vec<Option<&str>>>(),
        )
        .bind(now)
        .fetch_all(&mut *self)
        .await
        .map_err(fk_to_not_found)?;
        inserted_from(&rows)
    }

    async fn runs_at(&mut self, keys: &[Occurrence]) -> StoreResult<Vec<Run>> {
        let sql = runs_sql(
            "id IN (SELECT r.id FROM UNNEST($1::bigint[], $2::timestamptz[]) AS u(rid, at) \
             JOIN runs AS r ON r.reminder_id = u.rid AND r.scheduled_for = u.at)",
            "ASC",
            "",
        );
        sqlx::query(&sql)
            .bind(keys.iter().map(|k| k.0).collect::<Vec<i64>>())
            .bind(keys.iter().map(|k| k.1).collect::<Vec<DateTime<Utc>>>())
            .fetch_all(&mut *self)
            .await
            .map_err(be)?
            .iter()
            .map(run_from)
            .collect()
    }

    async fn missing_reminder(&mut self, ids: &[i64]) -> StoreResult<Option<i64>> {
        sqlx::query_scalar(
            "SELECT u.id FROM UNNEST($1::bigint[]) AS u(id) \
             WHERE NOT EXISTS (SELECT 1 FROM reminders r WHERE r.id = u.id) LIMIT 1",
        )
        .bind(ids)
        .fetch_optional(&mut *self)
        .await
        .map_err(be)
    }

    async fn insert_events(&mut self, events: &[EventRow<'_>]) -> StoreResult<Vec<i64>> {
        // Identity values are drawn in the order rows are inserted, which
        // follows ORDER BY; sort rather than trust RETURNING's order.
        let mut ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO events (at, kind, account_id, run_id, data) \
             SELECT u.at, u.kind, u.acc, u.run, u.data \
             FROM UNNEST($1::timestamptz[], $2::text[], $3::text[], $4::bigint[], $5::text[]) \
                  WITH ORDINALITY AS u(at, kind, acc, run, data, n) \
             ORDER BY u.n RETURNING id",
        )
        .bind(events.iter().map(|e| e.at).collect::<Vec<DateTime<Utc>>>())
        .bind(events.iter().map(|e| e.kind).collect::<Vec<&str>>())
        .bind(
            events
                .iter()
                .map(|e| e.account_id)
                .collect::<Vec<Option<&str>>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.run_id)
                .collect::<Vec<Option<i64>>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.data.as_str())
                .collect::<Vec<&str>>(),
        )
        .fetch_all(&mut *self)
        .await
        .map_err(be)?;
        ids.sort_unstable();
        Ok(ids)
    }
}

/// An UPDATE … FROM UNNEST touches only the ids that exist; name one that
/// does not, so the caller sees which target was unknown.
async fn pg_all_found(conn: &mut PgConnection, updated: u64, ids: &[i64]) -> StoreResult<()> {
    if updated == ids.len() as u64 {
        return Ok(());
    }
    let missing: Option<i64> = sqlx::query_scalar(
        "SELECT u.id FROM UNNEST($1::bigint[]) AS u(id) \
         WHERE NOT EXISTS (SELECT 1 FROM run_targets t WHERE t.id = u.id) LIMIT 1",
    )
    .bind(ids)
    .fetch_optional(&mut *conn)
    .await
    .map_err(be)?;
    // Every row exists: the others were skipped by their status guard.
    missing.map_or(Ok(()), |id| Err(missing_target(Some(id))))
}
