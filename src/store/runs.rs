//! The `runs` and `run_targets` tables: firing (idempotent on reminder and
//! occurrence), marks, transitions under fences, and pruning. [`RunStore`]
//! on SQL.

use super::dialect::{apply_batch, fresh_run, Bulk, Occurrence};
use super::receipts::{target_receipts_from, TARGET_RECEIPT_COLS};
use super::records::{
    run_from, runs_sql, sql_limit, target_from, PRUNABLE_RUN, TARGET_COLS, UNFINISHED,
};
use super::rows::{trunc, RowGet, Ts};
use super::{be, is_fk_violation, not_found, parse_enum, SqlStore};
use super::{check_fences, read, tx};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::lifecycle::{sends_since, MAYBE_DELIVERED};
use herald_actors::ports::*;
use std::collections::{HashMap, HashSet};

#[async_trait]
impl RunStore for SqlStore {
    // ------------------------------------------------------------ runs

    async fn create_run(
        &self,
        reminder_id: i64,
        account: &AccountId,
        scheduled_for: DateTime<Utc>,
        status: RunStatus,
        error_summary: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<RunCreated> {
        let scheduled_for = trunc(scheduled_for);
        let select = runs_sql("reminder_id = $1 AND scheduled_for = $2", "ASC", "");
        let created = tx!(self, tx => {
            // ON CONFLICT waits for a concurrent inserter of the same
            // occurrence and then does nothing: exactly one caller wins.
            let n = sqlx::query(
                "INSERT INTO runs (reminder_id, account_id, scheduled_for, status, error_summary, \
                 created_at) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (reminder_id, scheduled_for) DO NOTHING",
            )
            .bind(reminder_id)
            .bind(account.as_str())
            .bind(Ts(scheduled_for))
            .bind(status.as_str())
            .bind(error_summary)
            .bind(Ts(trunc(now)))
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                if is_fk_violation(&e) {
                    not_found(format!("reminder {reminder_id}"))
                } else {
                    be(e)
                }
            })?
            .rows_affected();
            let row = sqlx::query(&select)
                .bind(reminder_id)
                .bind(Ts(scheduled_for))
                .fetch_one(&mut *tx)
                .await
                .map_err(be)?;
            RunCreated {
                run: run_from(&row)?,
                created: n == 1,
                event: None,
            }
        });
        Ok(created)
    }

    async fn create_runs(
        &self,
        runs: &[NewRun],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<RunCreated>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let now = trunc(now);
        let runs: Vec<NewRun> = runs
            .iter()
            .map(|r| NewRun {
                scheduled_for: trunc(r.scheduled_for),
                ..r.clone()
            })
            .collect();
        // Only the first element of an occurrence repeated in the batch is
        // offered for inserting, so it is the one stored, as with create_run.
        let mut seen = HashSet::new();
        let firsts: Vec<NewRun> = runs
            .iter()
            .filter(|r| seen.insert((r.reminder_id, r.scheduled_for)))
            .cloned()
            .collect();
        let attempt = async {
            Ok(tx!(self, tx => {
                // Each occurrence inserted is claimed by its first element;
                // the rest (there before, or repeated) are read back.
                let mut inserted = Bulk::insert_runs(&mut *tx, &firsts, now).await?;
                let mut out: Vec<Option<RunCreated>> = runs
                    .iter()
                    .map(|r| {
                        inserted
                            .remove(&(r.reminder_id, r.scheduled_for))
                            .map(|id| RunCreated {
                                run: fresh_run(id, r, now),
                                created: true,
                                event: None,
                            })
                    })
                    .collect();
                // Each new run's event, with its id, in the same transaction.
                let told: Vec<(usize, NewEvent)> = runs
                    .iter()
                    .zip(&out)
                    .enumerate()
                    .filter_map(|(i, (r, c))| {
                        let (c, e) = (c.as_ref()?, r.event.as_ref()?);
                        Some((i, NewEvent { run_id: Some(c.run.id), ..e.clone() }))
                    })
                    .collect();
                let events: Vec<NewEvent> = told.iter().map(|(_, e)| e.clone()).collect();
                let stored = super::events::insert_in(&mut *tx, &events).await?;
                for ((i, _), e) in told.iter().zip(stored) {
                    if let Some(c) = out[*i].as_mut() {
                        c.event = Some(e);
                    }
                }
                let rest: Vec<Occurrence> = runs
                    .iter()
                    .zip(&out)
                    .filter(|(_, c)| c.is_none())
                    .map(|(r, _)| (r.reminder_id, r.scheduled_for))
                    .collect();
                if !rest.is_empty() {
                    let found: HashMap<Occurrence, Run> = Bulk::runs_at(&mut *tx, &rest)
                        .await?
                        .into_iter()
                        .map(|run| ((run.reminder_id, run.scheduled_for), run))
                        .collect();
                    for (r, c) in runs.iter().zip(&mut out) {
                        if c.is_some() {
                            continue;
                        }
                        let key = (r.reminder_id, r.scheduled_for);
                        let run = found.get(&key).ok_or_else(|| {
                            StoreError::Backend(format!(
                                "run of reminder {} at {} neither inserted nor found",
                                key.0, key.1
                            ))
                        })?;
                        *c = Some(RunCreated {
                            run: run.clone(),
                            created: false,
                            event: None,
                        });
                    }
                }
                out.into_iter().flatten().collect::<Vec<_>>()
            }))
        };
        match attempt.await {
            // Only the insert's FK check says NotFound; name the reminder,
            // as create_run does, on a fresh connection (PostgreSQL has
            // given up on the failed transaction).
            Err(StoreError::NotFound(_)) => {
                let ids: Vec<i64> = runs.iter().map(|r| r.reminder_id).collect();
                let missing = read!(self, p => {
                    let mut c = p.acquire().await.map_err(be)?;
                    Bulk::missing_reminder(&mut *c, &ids).await?
                });
                Err(not_found(match missing {
                    Some(id) => format!("reminder {id}"),
                    None => "reminder".to_owned(),
                }))
            }
            other => other,
        }
    }

    async fn create_chosen_targets(
        &self,
        run: RunId,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        tx!(self, tx => {
            // The no-op update locks the run's row on PostgreSQL (SQLite's
            // IMMEDIATE transaction is already alone), so of two callers
            // freezing the same run, the second sees the first's targets.
            let locked = sqlx::query("UPDATE runs SET status = status WHERE id = $1")
                .bind(run.0)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if locked == 0 {
                return Err(not_found(format!("run {run}")));
            }
            let has = sqlx::query("SELECT 1 AS one FROM run_targets WHERE run_id = $1 LIMIT 1")
                .bind(run.0)
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?;
            if has.is_none() {
                Bulk::insert_run_targets(&mut *tx, run.0, groups).await?;
            }
        });
        Ok(())
    }

    async fn get_run(&self, id: RunId) -> StoreResult<Option<Run>> {
        let sql = runs_sql("id = $1", "ASC", "");
        read!(self, p => sqlx::query(&sql)
            .bind(id.0)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(run_from)
            .transpose())
    }

    async fn list_runs(&self, f: &RunFilter) -> StoreResult<Vec<Run>> {
        let mut filter = vec!["TRUE".to_owned()];
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        if f.reminder_id.is_some() {
            filter.push(format!("reminder_id = ${}", next()));
        }
        if f.account_id.is_some() {
            filter.push(format!("account_id = ${}", next()));
        }
        if f.status.is_some() {
            filter.push(format!("status = ${}", next()));
        }
        if f.before_id.is_some() {
            filter.push(format!("id < ${}", next()));
        }
        // A zero limit means no limit (RunFilter::default() lists everything).
        let limit = if f.limit > 0 {
            format!("LIMIT ${}", next())
        } else {
            String::new()
        };
        let sql = runs_sql(&filter.join(" AND "), "DESC", &limit);
        read!(self, p => {
            let mut q = sqlx::query(&sql);
            if let Some(r) = f.reminder_id {
                q = q.bind(r);
            }
            if let Some(a) = &f.account_id {
                q = q.bind(a.as_str());
            }
            if let Some(s) = f.status {
                q = q.bind(s.as_str());
            }
            if let Some(b) = f.before_id {
                q = q.bind(b);
            }
            if f.limit > 0 {
                q = q.bind(i64::from(f.limit));
            }
            q.fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(run_from)
                .collect()
        })
    }

    async fn update_run(&self, id: RunId, u: &RunUpdate) -> StoreResult<Option<Event>> {
        check_update(u)?;
        // The compare-and-set: statuses are a fixed vocabulary, bound as
        // parameters all the same.
        let mut sql = "UPDATE runs SET status = COALESCE($2, status), \
             window_end_at = COALESCE($3, window_end_at), \
             started_at = COALESCE($4, started_at), \
             finished_at = COALESCE($5, finished_at), \
             forecast = COALESCE($6, forecast), \
             error_summary = COALESCE($7, error_summary), \
             stop_requested_at = CASE WHEN $8 THEN NULL \
                                 ELSE COALESCE($9, stop_requested_at) END WHERE id = $1"
            .to_owned();
        if !u.expect.is_empty() {
            let marks: Vec<String> = (0..u.expect.len())
                .map(|i| format!("${}", i + 10))
                .collect();
            sql.push_str(&format!(" AND status IN ({})", marks.join(", ")));
        }
        let fence_sql = self.fence_check_sql();
        // One transaction: the fence, the compare-and-set, the skipping of
        // open targets and the event that reports it land together or not
        // at all.
        let told = tx!(self, tx => {
            check_fences!(tx, &fence_sql, u.fence.as_slice());
            let mut q = sqlx::query(&sql)
            .bind(id.0)
            .bind(u.status.map(|s| s.as_str()))
            .bind(u.window_end_at.map(Ts))
            .bind(u.started_at.map(Ts))
            .bind(u.finished_at.map(Ts))
            .bind(u.forecast.as_deref())
            .bind(u.error_summary.as_deref())
            // A retry forgets an earlier stop.
            .bind(u.requeue_unsent)
            .bind(u.stop_requested_at.map(Ts));
            for s in &u.expect {
                q = q.bind(s.as_str());
            }
            let n = q.execute(&mut *tx).await.map_err(be)?.rows_affected();
            if n == 0 {
                let actual: Option<String> =
                    sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
                        .bind(id.0)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(be)?;
                return Err(match actual {
                    None => not_found(format!("run {id}")),
                    Some(s) => cas_conflict(id, parse_enum(s, "run status")?),
                });
            }
            if u.requeue_unsent {
                sqlx::query(
                    // A group whose last message may have arrived goes back
                    // as `sending`, so a second skip still says so.
                    "UPDATE run_targets SET error = NULL, status = CASE \
                       WHEN error LIKE $2 THEN 'sending' ELSE 'pending' END \
                     WHERE run_id = $1 AND status IN ('failed', 'skipped')",
                )
                .bind(id.0)
                .bind(format!("%{MAYBE_DELIVERED}"))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            if let Some(reason) = &u.skip_open {
                sqlx::query(
                    "UPDATE run_targets SET status = 'skipped', \
                     error = CASE WHEN status = 'sending' THEN $3 ELSE $2 END \
                     WHERE run_id = $1 AND status IN ('pending', 'sending')",
                )
                .bind(id.0)
                .bind(reason.as_str())
                .bind(format!("{reason}{MAYBE_DELIVERED}"))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            super::events::insert_in(&mut *tx, u.event.as_slice())
                .await?
                .pop()
        });
        Ok(told)
    }

    async fn list_targets(
        &self,
        run: RunId,
        status: Option<TargetStatus>,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<RunTarget>> {
        let cols: Vec<String> = TARGET_COLS
            .split(',')
            .map(|c| format!("t.{}", c.trim()))
            .collect();
        let mut sql = format!(
            "SELECT {}, {TARGET_RECEIPT_COLS} FROM run_targets t \
             LEFT JOIN run_receipts rr ON rr.target_id = t.id WHERE t.run_id = $1",
            cols.join(", ")
        );
        let mut n = 1;
        if status.is_some() {
            n += 1;
            sql.push_str(&format!(" AND t.status = ${n}"));
        }
        if after_position.is_some() {
            n += 1;
            sql.push_str(&format!(" AND t.position > ${n}"));
        }
        sql.push_str(" ORDER BY t.position");
        // As with runs, zero means no limit.
        if limit > 0 {
            n += 1;
            sql.push_str(&format!(" LIMIT ${n}"));
        }
        read!(self, p => {
            let mut q = sqlx::query(&sql).bind(run.0);
            if let Some(s) = status {
                q = q.bind(s.as_str());
            }
            if let Some(a) = after_position {
                q = q.bind(i64::from(a));
            }
            if limit > 0 {
                q = q.bind(i64::from(limit));
            }
            q.fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(|r| {
                    Ok(RunTarget {
                        receipts: target_receipts_from(r)?,
                        ..target_from(r)?
                    })
                })
                .collect()
        })
    }

    async fn apply_transitions(&self, ts: &[Transition]) -> StoreResult<()> {
        if ts.is_empty() {
            return Ok(());
        }
        tx!(self, tx => apply_batch(&mut *tx, ts).await?);
        Ok(())
    }

    async fn apply_transitions_fenced(
        &self,
        fences: &[herald_actors::domain::Fence],
        ts: &[Transition],
    ) -> StoreResult<()> {
        if ts.is_empty() {
            return Ok(());
        }
        let fence_sql = self.fence_check_sql();
        tx!(self, tx => {
            check_fences!(tx, &fence_sql, fences);
            apply_batch(&mut *tx, ts).await?
        });
        Ok(())
    }

    async fn unfinished_runs(&self) -> StoreResult<Vec<Run>> {
        let sql = runs_sql(&format!("status IN {UNFINISHED}"), "ASC", "");
        read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(run_from)
            .collect())
    }

    async fn sent_since(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<(Option<DateTime<Utc>>, u32)>> {
        // Only runs that were still going at `since` can hold such sends:
        // the account index narrows to those, not the account's history.
        let mut rows = Vec::new();
        let runs = read!(self, p => sqlx::query(
            &format!(
                "SELECT t.status, t.error, t.sent_at, t.parts_sent, r.status AS run_status, \
                 r.finished_at FROM runs r JOIN run_targets t ON t.run_id = r.id \
                 WHERE r.account_id = $1 \
                 AND (r.finished_at IS NULL OR r.finished_at >= $2 OR r.status IN {UNFINISHED}) \
                 AND (t.sent_at >= $2 OR t.status IN ('sending', 'skipped', 'failed'))"
            ),
        )
        .bind(account.as_str())
        .bind(Ts(since))
        .fetch_all(p)
        .await
        .map_err(be)?
        .iter()
        .map(|r| {
            let status: TargetStatus = parse_enum(r.text("status")?, "target status")?;
            let run: RunStatus = parse_enum(r.text("run_status")?, "run status")?;
            // A retried run keeps its earlier end until it ends again.
            let end = r.opt_ts("finished_at")?.filter(|_| run.is_final());
            Ok(sends_since(
                status,
                r.opt_text("error")?.as_deref(),
                r.opt_ts("sent_at")?,
                r.int("parts_sent")? as u32,
                end,
                since,
            ))
        })
        .collect::<StoreResult<Vec<_>>>()?);
        rows.extend(runs.into_iter().flatten());
        // Then its recalls and edits: a group amended since `since` at its
        // mark's time, one marked before the wire and not after as just
        // now, each with one message more than its parts (the one that was
        // in flight, if any): erring on the side of waiting longer.
        rows.extend(read!(self, p => sqlx::query(
            "SELECT CASE WHEN m.state = 'sending' THEN NULL ELSE m.at END AS sent_at, \
             t.parts_sent + 1 AS parts_sent \
             FROM amend_marks m JOIN run_targets t ON t.id = m.target_id \
             JOIN run_amendments a ON a.id = m.amendment_id \
             WHERE m.account_id = $1 AND ((m.state = 'done' AND m.at >= $2) \
             OR (m.state = 'sending' AND a.finished_at IS NULL))",
        )
        .bind(account.as_str())
        .bind(Ts(since))
        .fetch_all(p)
        .await
        .map_err(be)?
        .iter()
        .map(|r| Ok((r.opt_ts("sent_at")?, r.int("parts_sent")? as u32)))
        .collect::<StoreResult<Vec<_>>>()?));
        Ok(rows)
    }

    async fn last_scheduled_for(&self, reminder_id: i64) -> StoreResult<Option<DateTime<Utc>>> {
        read!(self, p => sqlx::query(
            "SELECT MAX(scheduled_for) AS last FROM runs WHERE reminder_id = $1",
        )
        .bind(reminder_id)
        .fetch_one(p)
        .await
        .map_err(be)?
        .opt_ts("last"))
    }

    // ------------------------------------------------------------ retention

    async fn prune_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<PrunedRuns> {
        let limit = sql_limit(limit);
        // Targets first, a batch at a time, so no transaction deletes a
        // whole 10,000-group run at once; then the runs left empty.
        let targets = format!(
            "DELETE FROM run_targets WHERE id IN (SELECT t.id FROM run_targets t \
             WHERE t.run_id IN (SELECT p.id FROM runs p WHERE {PRUNABLE_RUN} ORDER BY p.id LIMIT $2) \
             LIMIT $2)"
        );
        let runs = format!(
            "DELETE FROM runs WHERE id IN (SELECT p.id FROM runs p WHERE {PRUNABLE_RUN} \
             AND NOT EXISTS (SELECT 1 FROM run_targets t WHERE t.run_id = p.id) \
             ORDER BY p.id LIMIT $2)"
        );
        let before = Ts(trunc(before));
        Ok(tx!(self, tx => {
            let targets = sqlx::query(&targets)
                .bind(before)
                .bind(limit)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            let runs = sqlx::query(&runs)
                .bind(before)
                .bind(limit)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            PrunedRuns { runs, targets }
        }))
    }
}
