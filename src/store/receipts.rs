//! Receipts counted per run target (`run_receipts`, migration 0018):
//! [`ReceiptStore`]. A batch is one transaction: per group and message id
//! in it, one lookup of the target among the group's (indexed by group),
//! one read of what the target has counted
//! (locked on PostgreSQL, so two daemons hearing the same account in the
//! moment it moves do not overwrite each other), and one write if anything
//! was new. The counting rules are the core's (`TargetTally`).

use super::rows::{trunc, RowGet, Ts};
use super::{be, tx, Db, SqlStore};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::{
    receipt_key, Event, NewEvent, Receipt, ReceiptTally, RunId, RunReceipts, SeenSet,
    TargetReceipts, TargetTally,
};
use herald_actors::ports::{ReceiptStore, StoreResult};
use std::collections::BTreeMap;

/// The target a receipt key names, with what the account's directory
/// knows of its group's size.
const FIND: &str = "SELECT t.id, t.run_id, t.group_jid, r.account_id, g.participants \
     FROM run_targets t JOIN runs r ON r.id = t.run_id \
     LEFT JOIN account_groups g ON g.account_id = r.account_id AND g.jid = t.group_jid \
     WHERE t.group_jid = $1 AND t.message_id IS NOT NULL AND substr(t.message_id, 1, 22) = $2";

/// The receipt columns `list_targets` joins in (alias `rr`).
pub(super) const TARGET_RECEIPT_COLS: &str = "rr.delivered_count AS rc_delivered, \
     rr.read_count AS rc_read, rr.first_at AS rc_first, rr.last_at AS rc_last, \
     rr.first_read_at AS rc_first_read";

/// A target's counts from a row with [`TARGET_RECEIPT_COLS`] (zero where
/// the join found no row).
pub(super) fn target_receipts_from<R: RowGet>(r: &R) -> StoreResult<TargetReceipts> {
    Ok(TargetReceipts {
        delivered: r.opt_int("rc_delivered")?.unwrap_or(0) as u32,
        read: r.opt_int("rc_read")?.unwrap_or(0) as u32,
        first_receipt_at: r.opt_ts("rc_first")?,
        last_receipt_at: r.opt_ts("rc_last")?,
        first_read_at: r.opt_ts("rc_first_read")?,
    })
}

#[async_trait]
impl ReceiptStore for SqlStore {
    async fn count_receipts(&self, batch: &[Receipt]) -> StoreResult<ReceiptTally> {
        let mut tally = ReceiptTally::default();
        // By group and message: a batch is mostly a few messages' bursts.
        let mut by_key: BTreeMap<(&str, &str), Vec<&Receipt>> = BTreeMap::new();
        for r in batch {
            by_key
                .entry((r.chat.as_str(), receipt_key(&r.message_id)))
                .or_default()
                .push(r);
        }
        if by_key.is_empty() {
            return Ok(tally);
        }
        let seen_sql = match &self.db {
            Db::Postgres(_) => {
                "SELECT delivered_by, read_by, first_at, last_at, first_read_at FROM run_receipts \
                 WHERE target_id = $1 FOR UPDATE"
            }
            Db::Sqlite { .. } => {
                "SELECT delivered_by, read_by, first_at, last_at, first_read_at FROM run_receipts \
                 WHERE target_id = $1"
            }
        };
        tx!(self, tx => {
            for ((chat, key), receipts) in &by_key {
                let rows = sqlx::query(FIND)
                    .bind(*chat)
                    .bind(*key)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(be)?;
                // The target whose current message this is, in this group
                // (ids are derived from the run: one at most); each receipt
                // must come to the account that sent it.
                let Some(row) = rows.first() else {
                    tally.ignored += receipts.len() as u64;
                    continue;
                };
                let (target_id, run_id) = (row.int("id")?, RunId(row.int("run_id")?));
                let sender = row.text("account_id")?;
                let participants = row.opt_int("participants")?;
                let participants = participants.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
                let mut t = TargetTally::new(target_id, participants);
                // The row first, then read under its lock: two daemons
                // counting one target queue here instead of overwriting.
                sqlx::query(
                    "INSERT INTO run_receipts (target_id, run_id, delivered_count, read_count, \
                     delivered_by, read_by) VALUES ($1, $2, 0, 0, '', '') \
                     ON CONFLICT (target_id) DO NOTHING",
                )
                .bind(target_id)
                .bind(run_id.0)
                .execute(&mut *tx)
                .await
                .map_err(be)?;
                let row = sqlx::query(seen_sql)
                    .bind(target_id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(be)?;
                t.delivered = SeenSet::parse(&row.text("delivered_by")?);
                t.read = SeenSet::parse(&row.text("read_by")?);
                t.first_at = row.opt_ts("first_at")?;
                t.last_at = row.opt_ts("last_at")?;
                t.first_read_at = row.opt_ts("first_read_at")?;
                for r in receipts {
                    if r.account.as_str() != sender {
                        tally.ignored += 1;
                        continue;
                    }
                    let new = t.add(&r.participant, r.kind, r.at);
                    if new.is_empty() {
                        tally.repeated += 1;
                    }
                    for kind in new {
                        *tally.counted.entry((r.account.clone(), kind)).or_default() += 1;
                    }
                }
                if !t.changed {
                    continue;
                }
                tally.targets_written += 1;
                let c = t.counts();
                let sql = "UPDATE run_receipts SET delivered_count = $2, read_count = $3, \
                     first_at = $4, last_at = $5, delivered_by = $6, read_by = $7, \
                     first_read_at = $8 WHERE target_id = $1";
                sqlx::query(sql)
                    .bind(target_id)
                    .bind(i64::from(c.delivered))
                    .bind(i64::from(c.read))
                    .bind(c.first_receipt_at.map(|t| Ts(trunc(t))))
                    .bind(c.last_receipt_at.map(|t| Ts(trunc(t))))
                    .bind(t.delivered.encode())
                    .bind(t.read.encode())
                    .bind(c.first_read_at.map(|t| Ts(trunc(t))))
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
        });
        Ok(tally)
    }

    async fn run_receipts(&self, run: RunId) -> StoreResult<RunReceipts> {
        let sql = "SELECT delivered_count AS rc_delivered, read_count AS rc_read, \
                   first_at AS rc_first, last_at AS rc_last, first_read_at AS rc_first_read \
                   FROM run_receipts WHERE run_id = $1";
        let rows = super::read!(self, p => sqlx::query(sql)
            .bind(run.0)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(target_receipts_from)
            .collect::<StoreResult<Vec<_>>>())?;
        let mut out = RunReceipts::default();
        for t in &rows {
            out.add(t);
        }
        Ok(out)
    }

    async fn unreported_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<RunId>> {
        let sql = "SELECT id FROM runs WHERE receipts_reported_at IS NULL \
                   AND finished_at IS NOT NULL AND finished_at < $1 \
                   AND status IN ('success', 'partial', 'failed', 'cancelled', 'missed') \
                   ORDER BY finished_at, id LIMIT $2";
        super::read!(self, p => sqlx::query(sql)
            .bind(Ts(trunc(before)))
            .bind(i64::from(limit.max(1)))
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(|r| r.int("id").map(RunId))
            .collect())
    }

    async fn report_receipts(
        &self,
        run: RunId,
        at: DateTime<Utc>,
        events: &[NewEvent],
    ) -> StoreResult<Vec<Event>> {
        Ok(tx!(self, tx => {
            let marked = sqlx::query(
                "UPDATE runs SET receipts_reported_at = $2 \
                 WHERE id = $1 AND receipts_reported_at IS NULL",
            )
            .bind(run.0)
            .bind(Ts(trunc(at)))
            .execute(&mut *tx)
            .await
            .map_err(be)?
            .rows_affected()
                == 1;
            if marked && !events.is_empty() {
                super::events::insert_in(&mut *tx, events).await?
            } else {
                Vec::new()
            }
        }))
    }
}
