//! Receipts in memory: [`ReceiptStore`].

use super::MemoryStore;
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[async_trait]
impl ReceiptStore for MemoryStore {
    async fn count_receipts(&self, batch: &[Receipt]) -> StoreResult<ReceiptTally> {
        Self::injected(&self.receipt_faults)?;
        let mut g = self.lock()?;
        let g = &mut *g;
        let mut tally = ReceiptTally::default();
        let mut written = std::collections::HashSet::new();
        for r in batch {
            let key = receipt_key(&r.message_id);
            // The target whose current message this is, of this account,
            // in this group; anything else is not ours to count.
            let found = g.wire_index.get(key).and_then(|id| {
                let (run, pos) = *g.target_index.get(id)?;
                let rec = g.runs.get(&run)?;
                let t = rec.targets.get(pos)?;
                let current = t.message_id.as_deref().map(receipt_key) == Some(key);
                (current && rec.run.account_id == r.account && t.group == r.chat).then_some(t.id)
            });
            let Some(target_id) = found else {
                tally.ignored += 1;
                continue;
            };
            // The group's size is read once, when the target's tally starts.
            let groups = &g.groups;
            let entry = g.receipts.entry(target_id).or_insert_with(|| {
                let participants = groups
                    .get(&r.account)
                    .and_then(|m| m.get(&r.chat))
                    .map(|grp| grp.info.participants);
                TargetTally::new(target_id, participants)
            });
            let new = entry.add(&r.participant, r.kind, r.at);
            if new.is_empty() {
                tally.repeated += 1;
            } else {
                written.insert(target_id);
            }
            for kind in new {
                *tally.counted.entry((r.account.clone(), kind)).or_default() += 1;
            }
        }
        tally.targets_written = written.len() as u64;
        Ok(tally)
    }

    async fn run_receipts(&self, run: RunId) -> StoreResult<RunReceipts> {
        let g = self.lock()?;
        let mut out = RunReceipts::default();
        if let Some(rec) = g.runs.get(&run.0) {
            for t in &rec.targets {
                if let Some(r) = g.receipts.get(&t.id) {
                    out.add(&r.counts());
                }
            }
        }
        Ok(out)
    }

    async fn unreported_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<RunId>> {
        let g = self.lock()?;
        let mut ended: Vec<(DateTime<Utc>, RunId)> = g
            .runs
            .values()
            .filter(|r| r.run.status.is_final() && !g.receipts_reported.contains(&r.run.id.0))
            .filter_map(|r| {
                r.run
                    .finished_at
                    .filter(|f| *f < before)
                    .map(|f| (f, r.run.id))
            })
            .collect();
        ended.sort();
        Ok(ended
            .into_iter()
            .take(super::take_limit(limit))
            .map(|(_, id)| id)
            .collect())
    }

    async fn report_receipts(
        &self,
        run: RunId,
        _at: DateTime<Utc>,
        events: &[NewEvent],
    ) -> StoreResult<Vec<Event>> {
        let mut g = self.lock()?;
        if !g.runs.contains_key(&run.0) || !g.receipts_reported.insert(run.0) {
            return Ok(Vec::new());
        }
        Ok(events.iter().map(|e| g.store_event(e)).collect())
    }
}
