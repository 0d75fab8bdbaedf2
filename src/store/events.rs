//! The `events` table: the activity log, appended in order and read by id.
//! [`EventStore`] on SQL.

use super::dialect::{Bulk, EventRow};
use super::records::{event_from, sql_limit, EVENT_COLS};
use super::rows::{trunc, RowGet, Ts};
use super::{be, SqlStore};
use super::{read, tx, writer};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::*;

#[async_trait]
impl EventStore for SqlStore {
    // ------------------------------------------------------------ events

    async fn append_event(&self, e: &NewEvent) -> StoreResult<Event> {
        let at = trunc(e.at);
        let data =
            serde_json::to_string(&e.data).map_err(|e| StoreError::Backend(e.to_string()))?;
        let id = writer!(self, p => sqlx::query(
            "INSERT INTO events (at, kind, account_id, run_id, data) VALUES ($1, $2, $3, $4, $5) \
             RETURNING id",
        )
        .bind(Ts(at))
        .bind(e.kind)
        .bind(e.account_id.as_ref().map(AccountId::as_str))
        .bind(e.run_id.map(|r| r.0))
        .bind(&data)
        .fetch_one(p)
        .await
        .map_err(be)?
        .int("id"))?;
        Ok(Event {
            id,
            at,
            kind: e.kind.to_owned(),
            account_id: e.account_id.as_ref().map(|a| a.as_str().to_owned()),
            run_id: e.run_id.map(|r| r.0),
            data: e.data.clone(),
        })
    }

    async fn append_events(&self, events: &[NewEvent]) -> StoreResult<Vec<Event>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let rows = events
            .iter()
            .map(EventRow::of)
            .collect::<StoreResult<Vec<_>>>()?;
        let ids = tx!(self, tx => {
            let ids = Bulk::insert_events(&mut *tx, &rows).await?;
            if ids.len() != rows.len() {
                return Err(StoreError::Backend(format!(
                    "inserted {} of {} events",
                    ids.len(),
                    rows.len()
                )));
            }
            ids
        });
        Ok(rows
            .iter()
            .zip(events)
            .zip(ids)
            .map(|((row, e), id)| row.stored(id, e))
            .collect())
    }

    async fn prune_events(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        let before = Ts(trunc(before));
        let limit = sql_limit(limit);
        Ok(tx!(self, tx => {
            let ids: Vec<i64> = sqlx::query(
                "DELETE FROM events WHERE id IN \
                 (SELECT id FROM events WHERE at < $1 ORDER BY id LIMIT $2) RETURNING id",
            )
            .bind(before)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(be)?
            .iter()
            .map(|r| r.int("id"))
            .collect::<StoreResult<_>>()?;
            if let Some(max) = ids.iter().max() {
                sqlx::query(
                    "INSERT INTO retention_marks (what, through) VALUES ('events', $1) \
                     ON CONFLICT (what) DO UPDATE SET through = excluded.through \
                     WHERE excluded.through > retention_marks.through",
                )
                .bind(*max)
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            ids.len() as u64
        }))
    }

    async fn events_pruned_through(&self) -> StoreResult<i64> {
        let row = read!(self, p => sqlx::query(
            "SELECT through FROM retention_marks WHERE what = 'events'",
        )
        .fetch_optional(p)
        .await
        .map_err(be)?
        .as_ref()
        .map(|r| r.int("through"))
        .transpose())?;
        Ok(row.unwrap_or(0))
    }

    async fn account_states(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<Event>> {
        // Both read the partial index events_account_state (migration 0022).
        let before = format!(
            "SELECT {EVENT_COLS} FROM events WHERE kind = 'account_state' AND account_id = $1 \
             AND at < $2 ORDER BY at DESC, id DESC LIMIT 1"
        );
        let since_sql = format!(
            "SELECT {EVENT_COLS} FROM events WHERE kind = 'account_state' AND account_id = $1 \
             AND at >= $2 ORDER BY at, id"
        );
        read!(self, p => {
            let mut out: Vec<Event> = Vec::new();
            for sql in [&before, &since_sql] {
                let rows = sqlx::query(sql)
                    .bind(account.as_str())
                    .bind(Ts(since))
                    .fetch_all(p)
                    .await
                    .map_err(be)?;
                for r in &rows {
                    out.push(event_from(r)?);
                }
            }
            Ok(out)
        })
    }

    async fn events_after(&self, after_id: i64, limit: u32) -> StoreResult<Vec<Event>> {
        // As with runs, zero means no limit.
        let sql = format!(
            "SELECT {EVENT_COLS} FROM events WHERE id > $1 ORDER BY id {}",
            if limit > 0 { "LIMIT $2" } else { "" }
        );
        read!(self, p => {
            let mut q = sqlx::query(&sql).bind(after_id);
            if limit > 0 {
                q = q.bind(i64::from(limit));
            }
            q.fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(event_from)
                .collect()
        })
    }
}

/// Stores `events` inside the caller's transaction (on `conn`), with the
/// state change they report: the webhook trigger runs in it too.
pub(super) async fn insert_in<C: Bulk + Send + ?Sized>(
    conn: &mut C,
    events: &[NewEvent],
) -> StoreResult<Vec<Event>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let rows = events
        .iter()
        .map(EventRow::of)
        .collect::<StoreResult<Vec<_>>>()?;
    let ids = conn.insert_events(&rows).await?;
    if ids.len() != rows.len() {
        return Err(StoreError::Backend(format!(
            "inserted {} of {} events",
            ids.len(),
            rows.len()
        )));
    }
    Ok(rows
        .iter()
        .zip(events)
        .zip(ids)
        .map(|((row, e), id)| row.stored(id, e))
        .collect())
}
