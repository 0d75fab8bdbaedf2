//! Polls in memory: [`PollStore`].

use super::{Inner, MemoryStore};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;

impl Inner {
    /// Forgets the polls of run `run` and the votes of its targets.
    pub(super) fn forget_polls(&mut self, run: i64, targets: impl Iterator<Item = i64>) {
        self.polls.retain(|(r, _), _| *r != run);
        let targets: Vec<i64> = targets.collect();
        self.forget_polls_of_targets(&targets);
    }

    /// Forgets the poll messages and votes of `targets` (retention).
    pub(super) fn forget_polls_of_targets(&mut self, targets: &[i64]) {
        let gone: std::collections::HashSet<i64> = targets.iter().copied().collect();
        self.poll_keys.retain(|_, (t, _)| !gone.contains(t));
        self.votes.retain(|(t, _), _| !gone.contains(t));
    }

    /// One target's counts of a poll.
    fn counts_of(&self, poll: &RunPoll, target_id: i64) -> PollCounts {
        let mut counts = PollCounts::empty(poll);
        if let Some(voters) = self.votes.get(&(target_id, poll.part)) {
            for (choices, _) in voters.values().filter(|(c, _)| *c != 0) {
                let per: Vec<u64> = (0..poll.options.len())
                    .map(|i| u64::from(choices & (1 << i) != 0))
                    .collect();
                counts.add(1, &per);
            }
        }
        counts
    }
}

#[async_trait]
impl PollStore for MemoryStore {
    async fn open_polls(
        &self,
        run: RunId,
        polls: &[RunPoll],
        messages: &[PollMessage],
    ) -> StoreResult<()> {
        let mut g = self.lock()?;
        if !g.runs.contains_key(&run.0) {
            return Err(StoreError::NotFound(format!("run {run}")));
        }
        for p in polls {
            g.polls.entry((run.0, p.part)).or_insert_with(|| p.clone());
        }
        for m in messages {
            g.poll_keys
                .entry(m.key.clone())
                .or_insert((m.target_id, m.part));
        }
        Ok(())
    }

    async fn count_votes(&self, batch: &[Vote]) -> StoreResult<VoteTally> {
        let mut g = self.lock()?;
        let g = &mut *g;
        let mut tally = VoteTally::default();
        let mut found = Vec::with_capacity(batch.len());
        for v in batch {
            let key = receipt_key(&v.poll_id);
            let hit = g.poll_keys.get(key).and_then(|&(target_id, part)| {
                let (run, pos) = *g.target_index.get(&target_id)?;
                let rec = g.runs.get(&run)?;
                let sent = PollSent {
                    target_id,
                    run_id: RunId(run),
                    part,
                    account: rec.run.account_id.as_str(),
                    group: rec.targets.get(pos)?.group.as_str(),
                };
                Some((sent, g.polls.get(&(run, part))?))
            });
            let Some((sent, poll)) = hit else {
                tally.ignore(VoteIgnored::UnknownPoll, 1);
                continue;
            };
            match voter_choice(v, sent, poll) {
                Ok(choice) => found.push(choice),
                Err(why) => tally.ignore(why, 1),
            }
        }
        let heard = found.len();
        let kept = latest_votes(found);
        tally.repeated += (heard - kept.len()) as u64;
        for (account, v) in kept {
            let voters = g.votes.entry((v.target_id, v.part)).or_default();
            match voters.get(&v.voter) {
                Some((_, at)) if *at >= v.at => tally.repeated += 1,
                _ => {
                    voters.insert(v.voter, (v.choices, v.at));
                    *tally.counted.entry(account).or_default() += 1;
                }
            }
        }
        Ok(tally)
    }

    async fn run_polls(&self, run: RunId) -> StoreResult<Vec<PollResult>> {
        let g = self.lock()?;
        let Some(rec) = g.runs.get(&run.0) else {
            return Ok(Vec::new());
        };
        Ok(g.polls
            .range((run.0, 0)..=(run.0, u32::MAX))
            .map(|(_, poll)| {
                let mut total = PollCounts::empty(poll);
                let mut groups_voted = 0;
                for t in &rec.targets {
                    let c = g.counts_of(poll, t.id);
                    groups_voted += u32::from(c.voters > 0);
                    let per: Vec<u64> = c.options.iter().map(|o| o.votes).collect();
                    total.add(c.voters, &per);
                }
                PollResult {
                    poll: poll.clone(),
                    counts: total,
                    groups_voted,
                }
            })
            .collect())
    }

    async fn group_polls(
        &self,
        run: RunId,
        part: u32,
        after: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<GroupPoll>> {
        let g = self.lock()?;
        let (Some(rec), Some(poll)) = (g.runs.get(&run.0), g.polls.get(&(run.0, part))) else {
            return Ok(Vec::new());
        };
        Ok(rec
            .targets
            .iter()
            .filter(|t| after.is_none_or(|a| t.position > a))
            .take(limit as usize)
            .map(|t| GroupPoll {
                target_id: t.id,
                position: t.position,
                group: t.group.clone(),
                counts: g.counts_of(poll, t.id),
            })
            .collect())
    }
}
