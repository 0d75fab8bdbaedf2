//! The `reminders` table family (parts, targets, versions for the
//! scheduler's incremental reads). [`ReminderStore`] on SQL.

use super::dialect::select_json;
use super::records::{
    group_children, reminder_from, schedule_from, sql_limit, summary_from, EDIT_BLOCKING,
    REMINDER_COLS, SCHEDULE_COLS, SUMMARY_COLS,
};
use super::rows::{trunc, RowGet, Ts};
use super::{be, not_found, parse_enum, SqlStore};
use super::{read, tx};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::*;
use std::collections::HashMap;

/// A reminder's next version: one more than the highest, read inside the
/// writing transaction (see migration 0008) by [`bump_version!`].
const NEXT_VERSION: &str = "(SELECT COALESCE(MAX(version), 0) + 1 FROM reminders)";

/// Inside a `tx!` body, as its last write: gives reminder `$id` the next
/// version. The scheduler reads the reminders written since the highest
/// version it has seen, so versions must become visible in order: a
/// version taken by a writer that commits after a faster writer's higher
/// one would be passed over. On PostgreSQL a transaction-scoped advisory
/// lock, held to the commit, orders the writers (`$lock` is
/// [`SqlStore::version_lock_sql`]); SQLite's write lock already does.
macro_rules! bump_version {
    ($tx:ident, $lock:expr, $id:expr) => {
        if let Some(lock) = $lock {
            ::sqlx::query(lock)
                .execute(&mut *$tx)
                .await
                .map_err($crate::store::be)?;
        }
        ::sqlx::query(&format!(
            "UPDATE reminders SET version = {} WHERE id = $1",
            $crate::store::reminders::NEXT_VERSION
        ))
        .bind($id)
        .execute(&mut *$tx)
        .await
        .map_err($crate::store::be)?;
    };
}

/// Checks, inside the writing transaction, what a reminder refers to.
macro_rules! validate_refs {
    ($tx:ident, $r:expr) => {{
        let r: &::herald_actors::domain::NewReminder = $r;
        let account = ::sqlx::query("SELECT 1 FROM accounts WHERE id = $1")
            .bind(r.account_id.as_str())
            .fetch_optional(&mut *$tx)
            .await
            .map_err($crate::store::be)?;
        if account.is_none() {
            return Err(::herald_actors::domain::ValidationError::new(
                "account_id",
                format!("account {} does not exist", r.account_id),
            )
            .into());
        }
        for (i, part) in r.parts.iter().enumerate() {
            if let Some(m) = part.media_id() {
                let found = ::sqlx::query("SELECT 1 FROM media WHERE sha256 = $1")
                    .bind(m.as_str())
                    .fetch_optional(&mut *$tx)
                    .await
                    .map_err($crate::store::be)?;
                if found.is_none() {
                    return Err(::herald_actors::domain::ValidationError::new(
                        format!("parts[{i}].media"),
                        format!("media {m} does not exist; upload it first"),
                    )
                    .into());
                }
            }
        }
    }};
}

/// Writes a reminder's parts and targets (positions from 0).
macro_rules! insert_children {
    ($tx:ident, $id:expr, $r:expr) => {{
        let (id, r): (i64, &::herald_actors::domain::NewReminder) = ($id, $r);
        for (i, part) in r.parts.iter().enumerate() {
            let (text, media, caption, poll) = $crate::store::records::part_columns(part);
            ::sqlx::query(
                "INSERT INTO reminder_parts (reminder_id, position, kind, text, media_id, caption, poll) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id)
            .bind(i as i64)
            .bind(part.kind().as_str())
            .bind(text)
            .bind(media)
            .bind(caption)
            .bind(poll)
            .execute(&mut *$tx)
            .await
            .map_err($crate::store::be)?;
        }
        $crate::store::dialect::Bulk::insert_reminder_targets(&mut *$tx, id, &r.targets).await?;
    }};
}

#[async_trait]
impl ReminderStore for SqlStore {
    // ------------------------------------------------------------ reminders

    async fn create_reminder(&self, r: &NewReminder, now: DateTime<Utc>) -> StoreResult<Reminder> {
        let now = trunc(now);
        let id = tx!(self, tx => {
            validate_refs!(tx, r);
            let row = sqlx::query(
                "INSERT INTO reminders (account_id, title, timezone, schedule_kind, schedule_expr, \
                 window_start_hour, window_end_hour, resume_next_window, state, created_at, updated_at, \
                 unique_texts, target_select, part_count, target_count) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11, $12, $13, $14) \
                 RETURNING id",
            )
            .bind(r.account_id.as_str())
            .bind(&r.title)
            .bind(r.timezone.name())
            .bind(r.schedule.kind())
            .bind(r.schedule.expr())
            .bind(i64::from(r.window.start_hour()))
            .bind(i64::from(r.window.end_hour()))
            .bind(r.resume_next_window)
            .bind(ReminderState::Active.as_str())
            .bind(Ts(now))
            .bind(r.unique_texts)
            .bind(select_json(r))
            .bind(r.parts.len() as i64)
            .bind(r.targets.len() as i64)
            .fetch_one(&mut *tx)
            .await
            .map_err(be)?;
            let id = row.int("id")?;
            insert_children!(tx, id, r);
            bump_version!(tx, self.version_lock_sql(), id);
            id
        });
        Ok(Reminder {
            id,
            state: ReminderState::Active,
            spec: r.clone(),
            created_at: now,
            updated_at: now,
        })
    }

    async fn get_reminder(&self, id: i64) -> StoreResult<Option<Reminder>> {
        let sql = format!("SELECT {REMINDER_COLS} FROM reminders WHERE id = $1");
        read!(self, p => {
            let Some(row) = sqlx::query(&sql)
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(be)?
            else {
                return Ok(None);
            };
            let parts = sqlx::query(
                "SELECT reminder_id, kind, text, media_id, caption, poll FROM reminder_parts \
                 WHERE reminder_id = $1 ORDER BY position",
            )
            .bind(id)
            .fetch_all(p)
            .await
            .map_err(be)?;
            let targets = sqlx::query(
                "SELECT reminder_id, group_jid FROM reminder_targets \
                 WHERE reminder_id = $1 ORDER BY position",
            )
            .bind(id)
            .fetch_all(p)
            .await
            .map_err(be)?;
            let (mut parts, mut targets) = group_children(&parts, &targets)?;
            reminder_from(
                &row,
                parts.remove(&id).unwrap_or_default(),
                targets.remove(&id).unwrap_or_default(),
            )
            .map(Some)
        })
    }

    async fn list_reminders(&self, f: &ReminderFilter) -> StoreResult<Vec<Reminder>> {
        let mut filter = vec!["TRUE".to_owned()];
        if f.account_id.is_some() {
            filter.push(format!("r.account_id = ${}", filter.len()));
        }
        if f.state.is_some() {
            filter.push(format!("r.state = ${}", filter.len()));
        }
        let filter = filter.join(" AND ");
        let cols = REMINDER_COLS
            .split(", ")
            .map(|c| format!("r.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let main = format!("SELECT {cols} FROM reminders r WHERE {filter} ORDER BY r.id");
        let parts = format!(
            "SELECT p.reminder_id, p.kind, p.text, p.media_id, p.caption, p.poll \
             FROM reminder_parts p JOIN reminders r ON r.id = p.reminder_id \
             WHERE {filter} ORDER BY p.reminder_id, p.position"
        );
        let targets = format!(
            "SELECT t.reminder_id, t.group_jid \
             FROM reminder_targets t JOIN reminders r ON r.id = t.reminder_id \
             WHERE {filter} ORDER BY t.reminder_id, t.position"
        );
        let account = f.account_id.as_ref().map(|a| a.as_str().to_owned());
        let state = f.state.map(|s| s.as_str());
        read!(self, p => {
            // One consistent snapshot for the three reads.
            let mut tx = p.begin().await.map_err(be)?;
            macro_rules! fetch {
                ($sql:expr) => {{
                    let mut q = sqlx::query($sql);
                    if let Some(a) = &account {
                        q = q.bind(a.as_str());
                    }
                    if let Some(s) = state {
                        q = q.bind(s);
                    }
                    q.fetch_all(&mut *tx).await.map_err(be)?
                }};
            }
            let rows = fetch!(&main);
            let part_rows = fetch!(&parts);
            let target_rows = fetch!(&targets);
            tx.commit().await.map_err(be)?;
            let (mut parts, mut targets) = group_children(&part_rows, &target_rows)?;
            rows.iter()
                .map(|row| {
                    let id = row.int("id")?;
                    reminder_from(
                        row,
                        parts.remove(&id).unwrap_or_default(),
                        targets.remove(&id).unwrap_or_default(),
                    )
                })
                .collect()
        })
    }

    async fn list_reminder_summaries(
        &self,
        page: &ReminderPage,
    ) -> StoreResult<Vec<ReminderSummary>> {
        let f = &page.filter;
        let mut filter = vec!["r.id > $1".to_owned()];
        if f.account_id.is_some() {
            filter.push(format!("r.account_id = ${}", filter.len() + 1));
        }
        if f.state.is_some() {
            filter.push(format!("r.state = ${}", filter.len() + 1));
        }
        let sql = format!(
            "SELECT {SUMMARY_COLS} FROM reminders r WHERE {} ORDER BY r.id LIMIT ${}",
            filter.join(" AND "),
            filter.len() + 1
        );
        read!(self, p => {
            let mut q = sqlx::query(&sql).bind(page.after_id.unwrap_or(0));
            if let Some(a) = &f.account_id {
                q = q.bind(a.as_str());
            }
            if let Some(s) = f.state {
                q = q.bind(s.as_str());
            }
            q.bind(sql_limit(page.limit))
                .fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(summary_from)
                .collect()
        })
    }

    async fn reminder_schedules(&self, scan: ScheduleScan) -> StoreResult<Vec<ReminderSchedule>> {
        read!(self, p => match scan {
            ScheduleScan::Active => sqlx::query(&format!(
                "SELECT {SCHEDULE_COLS} FROM reminders r WHERE r.state = 'active' ORDER BY r.id"
            ))
            .fetch_all(p)
            .await,
            ScheduleScan::ChangedAfter(v) => sqlx::query(&format!(
                "SELECT {SCHEDULE_COLS} FROM reminders r WHERE r.version > $1 ORDER BY r.version"
            ))
            .bind(v)
            .fetch_all(p)
            .await,
        }
        .map_err(be)?
        .iter()
        .map(schedule_from)
        .collect())
    }

    async fn get_reminder_schedule(&self, id: i64) -> StoreResult<Option<ReminderSchedule>> {
        let sql = format!("SELECT {SCHEDULE_COLS} FROM reminders r WHERE r.id = $1");
        read!(self, p => sqlx::query(&sql)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(schedule_from)
            .transpose())
    }

    async fn reminder_titles(&self, ids: &[i64]) -> StoreResult<HashMap<i64, String>> {
        let mut titles = HashMap::with_capacity(ids.len());
        // Chunks keep each statement under either backend's bind limit.
        for chunk in ids.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
            let sql = format!(
                "SELECT id, title FROM reminders WHERE id IN ({})",
                marks.join(", ")
            );
            let rows = read!(self, p => {
                let mut q = sqlx::query(&sql);
                for id in chunk {
                    q = q.bind(id);
                }
                q.fetch_all(p).await.map_err(be)?
                    .iter()
                    .map(|r| Ok((r.int("id")?, r.text("title")?)))
                    .collect::<StoreResult<Vec<_>>>()
            })?;
            titles.extend(rows);
        }
        Ok(titles)
    }

    async fn update_reminder(
        &self,
        id: i64,
        r: &NewReminder,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        let now = trunc(now);
        let (state, created_at) = tx!(self, tx => {
            let Some(row) = sqlx::query("SELECT state, created_at FROM reminders WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?
            else {
                return Err(not_found(format!("reminder {id}")));
            };
            let state: ReminderState = parse_enum(row.text("state")?, "reminder state")?;
            let created_at = row.ts("created_at")?;
            let active = sqlx::query(&format!(
                "SELECT id, status FROM runs WHERE reminder_id = $1 AND status IN {EDIT_BLOCKING} LIMIT 1"
            ))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            if let Some(run) = active {
                return Err(StoreError::Conflict(format!(
                    "reminder {id} has a run in progress (run {} is {}); stop it or wait for it to finish",
                    run.int("id")?,
                    run.text("status")?
                )));
            }
            validate_refs!(tx, r);
            sqlx::query(
                "UPDATE reminders SET account_id = $2, title = $3, timezone = $4, \
                 schedule_kind = $5, schedule_expr = $6, window_start_hour = $7, \
                 window_end_hour = $8, resume_next_window = $9, updated_at = $10, \
                 unique_texts = $11, target_select = $12, \
                 part_count = $13, target_count = $14 WHERE id = $1",
            )
            .bind(id)
            .bind(r.account_id.as_str())
            .bind(&r.title)
            .bind(r.timezone.name())
            .bind(r.schedule.kind())
            .bind(r.schedule.expr())
            .bind(i64::from(r.window.start_hour()))
            .bind(i64::from(r.window.end_hour()))
            .bind(r.resume_next_window)
            .bind(Ts(now))
            .bind(r.unique_texts)
            .bind(select_json(r))
            .bind(r.parts.len() as i64)
            .bind(r.targets.len() as i64)
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            for table in ["reminder_parts", "reminder_targets"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE reminder_id = $1"))
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
            insert_children!(tx, id, r);
            bump_version!(tx, self.version_lock_sql(), id);
            (state, created_at)
        });
        Ok(Reminder {
            id,
            state,
            spec: r.clone(),
            created_at,
            updated_at: now,
        })
    }

    async fn set_reminder_state(
        &self,
        id: i64,
        state: ReminderState,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        let n = tx!(self, tx => {
            let n = sqlx::query("UPDATE reminders SET state = $2, updated_at = $3 WHERE id = $1")
                .bind(id)
                .bind(state.as_str())
                .bind(Ts(trunc(now)))
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if n > 0 {
                bump_version!(tx, self.version_lock_sql(), id);
            }
            n
        });
        if n == 0 {
            return Err(not_found(format!("reminder {id}")));
        }
        self.get_reminder(id)
            .await?
            .ok_or_else(|| not_found(format!("reminder {id}")))
    }
}
