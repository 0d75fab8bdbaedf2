//! Recalls and edits in memory: [`AmendStore`].

use super::{AmendRecord, Inner, MemoryStore};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

fn maybe_in_flight(t: &RunTarget) -> bool {
    t.message_id.is_some() && crate::lifecycle::maybe_in_flight(t.status, t.error.as_deref())
}

/// A group the run may have delivered at least one message to.
fn amendable(t: &RunTarget) -> bool {
    t.parts_sent > 0 || maybe_in_flight(t)
}

impl Inner {
    /// The amendment with its progress read off the run's targets now.
    fn amendment_of(&self, rec: &AmendRecord) -> Amendment {
        let mut a = rec.a.clone();
        let mut p = AmendProgress::default();
        if let Some(run) = self.runs.get(&a.run_id.0) {
            for t in run.targets.iter().filter(|t| amendable(t)) {
                p.total += 1;
                p.add(rec.marks.get(&t.id).map(|(s, _)| *s), 1);
            }
        }
        a.progress = p;
        a
    }

    /// What `sent_since` adds for an account's amendments: each group
    /// amended since `since` at its mark's time, each marked before the
    /// wire and not after as just now, with one message more than its
    /// parts (the one in flight, if any).
    pub(super) fn amended_since(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> Vec<(Option<DateTime<Utc>>, u32)> {
        let mut out = Vec::new();
        for rec in self.amendments.values().filter(|r| &r.account == account) {
            let Some(run) = self.runs.get(&rec.a.run_id.0) else {
                continue;
            };
            for t in &run.targets {
                match rec.marks.get(&t.id) {
                    Some((AmendState::Sending, _)) if !rec.a.is_finished() => {
                        out.push((None, t.parts_sent + 1))
                    }
                    Some((AmendState::Done, at)) if *at >= since => {
                        out.push((Some(*at), t.parts_sent + 1))
                    }
                    _ => {}
                }
            }
        }
        out
    }
}

#[async_trait]
impl AmendStore for MemoryStore {
    async fn create_amendment(
        &self,
        a: &NewAmendment,
        fences: &[Fence],
        event: &NewEvent,
    ) -> StoreResult<(Amendment, Event)> {
        let now = self.now();
        let mut g = self.lock()?;
        g.check_fences(fences, now)?;
        let Some(run) = g.runs.get(&a.run_id.0) else {
            return Err(StoreError::NotFound(format!("run {}", a.run_id)));
        };
        let account = run.run.account_id.clone();
        if let Some(open) = g
            .amendments
            .values()
            .find(|r| r.a.run_id == a.run_id && !r.a.is_finished())
        {
            return Err(StoreError::Conflict(format!(
                "run {} has a {} under way (amendment {}); wait for it to finish",
                a.run_id, open.a.kind, open.a.id
            )));
        }
        g.last_amendment_id += 1;
        let rec = AmendRecord {
            a: Amendment {
                id: g.last_amendment_id,
                run_id: a.run_id,
                kind: a.kind,
                edits: a.edits.clone(),
                requested_at: a.requested_at,
                window_secs: a.window_secs,
                finished_at: None,
                progress: AmendProgress::default(),
                left_as_sent: Vec::new(),
            },
            account,
            marks: HashMap::new(),
        };
        let out = g.amendment_of(&rec);
        g.amendments.insert(rec.a.id, rec);
        let stored = g.store_event(event);
        Ok((out, stored))
    }

    async fn run_amendment(&self, run: RunId) -> StoreResult<Option<Amendment>> {
        let g = self.lock()?;
        Ok(g.amendments
            .values()
            .rev()
            .find(|r| r.a.run_id == run)
            .map(|r| g.amendment_of(r)))
    }

    async fn get_amendment(&self, id: i64) -> StoreResult<Option<Amendment>> {
        let g = self.lock()?;
        Ok(g.amendments.get(&id).map(|r| g.amendment_of(r)))
    }

    async fn unfinished_amendments(&self) -> StoreResult<Vec<(Amendment, AccountId)>> {
        let g = self.lock()?;
        Ok(g.amendments
            .values()
            .filter(|r| !r.a.is_finished())
            .map(|r| (g.amendment_of(r), r.account.clone()))
            .collect())
    }

    async fn amend_targets(
        &self,
        id: i64,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<AmendTarget>> {
        let g = self.lock()?;
        let Some(rec) = g.amendments.get(&id) else {
            return Ok(Vec::new());
        };
        let Some(run) = g.runs.get(&rec.a.run_id.0) else {
            return Ok(Vec::new());
        };
        Ok(run
            .targets
            .iter()
            .filter(|t| amendable(t))
            .filter(|t| after_position.is_none_or(|p| t.position > p))
            .take(super::take_limit(limit))
            .map(|t| AmendTarget {
                target_id: t.id,
                position: t.position,
                group: t.group.clone(),
                parts_sent: t.parts_sent,
                in_flight: maybe_in_flight(t),
                sent_at: t.sent_at,
                state: rec.marks.get(&t.id).map(|(s, _)| *s),
                marked_at: rec.marks.get(&t.id).map(|(_, at)| *at),
            })
            .collect())
    }

    async fn mark_amend(
        &self,
        fences: &[Fence],
        id: i64,
        target_id: i64,
        state: AmendState,
        _error: Option<&str>,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let now = self.now();
        let mut g = self.lock()?;
        g.check_fences(fences, now)?;
        let Some(rec) = g.amendments.get_mut(&id) else {
            return Err(StoreError::NotFound(format!("amendment {id}")));
        };
        let from = rec.marks.get(&target_id).map(|(s, _)| *s);
        if rec.a.is_finished() || !state.allowed_from(from) {
            return Ok(false);
        }
        rec.marks.insert(target_id, (state, at));
        Ok(true)
    }

    async fn finish_amendment(
        &self,
        fences: &[Fence],
        id: i64,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> StoreResult<Option<Event>> {
        let now = self.now();
        let mut g = self.lock()?;
        g.check_fences(fences, now)?;
        match g.amendments.get_mut(&id) {
            Some(rec) if !rec.a.is_finished() => rec.a.finished_at = Some(at),
            _ => return Ok(None),
        }
        Ok(Some(g.store_event(event)))
    }
}
