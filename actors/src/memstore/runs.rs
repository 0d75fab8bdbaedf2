//! Runs and their targets in memory: [`RunStore`]; `create_run` is the
//! firing lock, and transitions check fences as the SQL store does.

use super::{take_limit, unfinished, Inner, MemoryStore};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashSet;

#[async_trait]
impl RunStore for MemoryStore {
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
        Self::injected(&self.run_create_faults)?;
        let mut g = self.lock()?;
        g.check_new_run(reminder_id, account, scheduled_for)?;
        Ok(g.insert_run(
            reminder_id,
            account,
            scheduled_for,
            status,
            error_summary,
            now,
        ))
    }

    async fn create_runs(
        &self,
        runs: &[NewRun],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<RunCreated>> {
        Self::injected(&self.run_create_faults)?;
        let mut g = self.lock()?;
        // Every check before the first insert: a refused batch writes nothing.
        for r in runs {
            g.check_new_run(r.reminder_id, &r.account_id, r.scheduled_for)?;
        }
        Ok(runs
            .iter()
            .map(|r| {
                let mut c = g.insert_run(
                    r.reminder_id,
                    &r.account_id,
                    r.scheduled_for,
                    r.status,
                    r.error_summary.as_deref(),
                    now,
                );
                if let (true, Some(e)) = (c.created, &r.event) {
                    c.event = Some(g.store_event(&NewEvent {
                        run_id: Some(c.run.id),
                        ..e.clone()
                    }));
                }
                c
            })
            .collect())
    }

    async fn create_chosen_targets(
        &self,
        run: RunId,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        let mut g = self.lock()?;
        let Inner {
            runs,
            target_index,
            last_target_id,
            ..
        } = &mut *g;
        let rec = runs
            .get_mut(&run.0)
            .ok_or_else(|| StoreError::NotFound(format!("run {run}")))?;
        // A run's groups are written once: a later call changes nothing.
        if !rec.targets.is_empty() {
            return Ok(());
        }
        let mut seen: HashSet<GroupJid> = HashSet::new();
        for (group, chosen_by) in groups {
            if !seen.insert(group.clone()) {
                continue;
            }
            *last_target_id += 1;
            let position = rec.targets.len();
            target_index.insert(*last_target_id, (run.0, position));
            rec.targets.push(RunTarget {
                id: *last_target_id,
                run_id: run,
                position: position as u32,
                group: group.clone(),
                status: TargetStatus::Pending,
                parts_sent: 0,
                message_id: None,
                attempts: 0,
                error: None,
                sent_at: None,
                latency_ms: None,
                chosen_by: chosen_by.clone(),
                receipts: TargetReceipts::default(),
            });
            rec.run.counts.pending += 1;
        }
        Ok(())
    }

    async fn get_run(&self, id: RunId) -> StoreResult<Option<Run>> {
        Ok(self.lock()?.runs.get(&id.0).map(|r| r.run.clone()))
    }

    async fn list_runs(&self, f: &RunFilter) -> StoreResult<Vec<Run>> {
        let g = self.lock()?;
        let upper = f.before_id.unwrap_or(i64::MAX);
        Ok(g.runs
            .range(..upper)
            .rev()
            .map(|(_, r)| &r.run)
            .filter(|r| f.reminder_id.is_none_or(|id| r.reminder_id == id))
            .filter(|r| f.account_id.as_ref().is_none_or(|a| &r.account_id == a))
            .filter(|r| f.status.is_none_or(|s| r.status == s))
            .take(take_limit(f.limit))
            .cloned()
            .collect())
    }

    async fn update_run(&self, id: RunId, u: &RunUpdate) -> StoreResult<Option<Event>> {
        check_update(u)?;
        let now = self.now();
        let mut g = self.lock()?;
        if let Some(f) = &u.fence {
            g.check_fences(std::slice::from_ref(f), now)?;
        }
        let rec = g
            .runs
            .get_mut(&id.0)
            .ok_or_else(|| StoreError::NotFound(format!("run {id}")))?;
        if !u.expect.is_empty() && !u.expect.contains(&rec.run.status) {
            return Err(cas_conflict(id, rec.run.status));
        }
        if u.requeue_unsent {
            for pos in 0..rec.targets.len() {
                let target_id = rec.targets[pos].id;
                rec.apply(pos, &Transition::Requeue { target_id });
            }
        }
        if let Some(reason) = &u.skip_open {
            for pos in 0..rec.targets.len() {
                let target_id = rec.targets[pos].id;
                let mut reason = reason.clone();
                if rec.targets[pos].status == TargetStatus::Sending {
                    reason.push_str(crate::lifecycle::MAYBE_DELIVERED);
                }
                rec.apply(pos, &Transition::Skipped { target_id, reason });
            }
        }
        let run = &mut rec.run;
        if let Some(s) = u.status {
            run.status = s;
        }
        if let Some(t) = u.window_end_at {
            run.window_end_at = Some(t);
        }
        if let Some(t) = u.started_at {
            run.started_at = Some(t);
        }
        if let Some(t) = u.finished_at {
            run.finished_at = Some(t);
        }
        if let Some(f) = &u.forecast {
            run.forecast = Some(f.clone());
        }
        if let Some(e) = &u.error_summary {
            run.error_summary = Some(e.clone());
        }
        if let Some(t) = u.stop_requested_at {
            run.stop_requested_at = Some(t);
        }
        if u.requeue_unsent {
            run.stop_requested_at = None;
        }
        Ok(u.event.as_ref().map(|e| g.store_event(e)))
    }

    async fn list_targets(
        &self,
        run: RunId,
        status: Option<TargetStatus>,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<RunTarget>> {
        let g = self.lock()?;
        let Some(rec) = g.runs.get(&run.0) else {
            return Ok(Vec::new());
        };
        let start = after_position.map_or(0, |p| p as usize + 1);
        Ok(rec
            .targets
            .get(start..)
            .unwrap_or_default()
            .iter()
            .filter(|t| status.is_none_or(|s| t.status == s))
            .take(take_limit(limit))
            .map(|t| RunTarget {
                receipts: g
                    .receipts
                    .get(&t.id)
                    .map(|r| r.counts())
                    .unwrap_or_default(),
                ..t.clone()
            })
            .collect())
    }

    async fn apply_transitions(&self, ts: &[Transition]) -> StoreResult<()> {
        self.apply_transitions_fenced(&[], ts).await
    }

    async fn apply_transitions_fenced(
        &self,
        fences: &[crate::domain::Fence],
        ts: &[Transition],
    ) -> StoreResult<()> {
        Self::injected(&self.transition_faults)?;
        let now = self.now();
        let mut g = self.lock()?;
        g.check_fences(fences, now)?;
        // Check every row first so a bad id writes nothing.
        if let Some(t) = ts
            .iter()
            .find(|t| !g.target_index.contains_key(&t.target_id()))
        {
            return Err(StoreError::NotFound(format!(
                "run target {}",
                t.target_id()
            )));
        }
        let Inner {
            runs,
            target_index,
            wire_index,
            ..
        } = &mut *g;
        for t in ts {
            if let Transition::Sending {
                target_id,
                message_id,
                ..
            } = t
            {
                wire_index.insert(receipt_key(message_id).to_owned(), *target_id);
            }
            let (run, pos) = target_index[&t.target_id()];
            runs.get_mut(&run)
                .expect("indexed targets belong to a stored run")
                .apply(pos, t);
        }
        Ok(())
    }

    async fn unfinished_runs(&self) -> StoreResult<Vec<Run>> {
        let g = self.lock()?;
        Ok(g.runs
            .values()
            .map(|r| &r.run)
            .filter(|r| unfinished(r.status))
            .cloned()
            .collect())
    }

    async fn sent_since(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<(Option<DateTime<Utc>>, u32)>> {
        let g = self.lock()?;
        Ok(g.runs
            .values()
            .filter(|r| &r.run.account_id == account)
            // A retried run keeps its earlier end until it ends again.
            .filter(|r| !r.run.status.is_final() || r.run.finished_at.is_none_or(|f| f >= since))
            .flat_map(|r| {
                let end = r.run.finished_at.filter(|_| r.run.status.is_final());
                r.targets.iter().map(move |t| (t, end))
            })
            .flat_map(|(t, end)| {
                crate::lifecycle::sends_since(
                    t.status,
                    t.error.as_deref(),
                    t.sent_at,
                    t.parts_sent,
                    end,
                    since,
                )
            })
            .chain(g.amended_since(account, since))
            .collect())
    }

    async fn last_scheduled_for(&self, reminder_id: i64) -> StoreResult<Option<DateTime<Utc>>> {
        let g = self.lock()?;
        Ok(g.runs_by_reminder
            .get(&reminder_id)
            .and_then(|m| m.keys().next_back().copied()))
    }

    // ------------------------------------------------------------ retention

    async fn prune_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<PrunedRuns> {
        let mut g = self.lock()?;
        let limit = take_limit(limit) as u64;
        let newest: HashSet<i64> = g
            .runs_by_reminder
            .values()
            .filter_map(|m| m.values().next_back().copied())
            .collect();
        let prunable: Vec<i64> = g
            .runs
            .values()
            .filter(|r| {
                r.run.status.is_final()
                    && r.run.finished_at.unwrap_or(r.run.created_at) < before
                    && !newest.contains(&r.run.id.0)
            })
            .map(|r| r.run.id.0)
            .collect();
        let mut out = PrunedRuns::default();
        // Targets first, up to the limit, as the SQL store's batches go.
        for id in &prunable {
            if out.targets >= limit {
                break;
            }
            let rec = g.runs.get_mut(id).expect("listed above");
            let n = (rec.targets.len() as u64).min(limit - out.targets) as usize;
            let cut = rec.targets.len() - n;
            let gone: Vec<i64> = rec.targets.drain(cut..).map(|t| t.id).collect();
            out.targets += gone.len() as u64;
            for t in &gone {
                g.target_index.remove(t);
                g.receipts.remove(t);
            }
            g.forget_polls_of_targets(&gone);
        }
        for id in prunable {
            if out.runs >= limit {
                break;
            }
            if g.runs[&id].targets.is_empty() {
                g.remove_run(id);
                out.runs += 1;
            }
        }
        Ok(out)
    }
}
