//! Polls and their votes (migration 0025): [`PollStore`]. A run's polls
//! and each group's copy are written once when it starts; a batch of votes
//! is one transaction: per poll message in it, one lookup of its group's
//! copy, then per voter one upsert that keeps the newer choice. Counts are
//! summed by the database, a column per option, so reading a 1,000-group
//! run's answer reads no voter rows into Herald.

use super::rows::{trunc, RowGet, Ts};
use super::{be, corrupt, tx, Db, SqlStore};
use async_trait::async_trait;
use herald_actors::domain::{
    latest_votes, receipt_key, voter_choice, GroupJid, GroupPoll, PollCounts, PollMessage,
    PollResult, PollSent, RunId, RunPoll, Vote, VoteIgnored, VoteTally, MAX_POLL_OPTIONS,
};
use herald_actors::ports::{PollStore, StoreError, StoreResult};
use std::collections::HashMap;

/// `, SUM(…) AS o0, …`: voters per option, one column per bit of `choices`.
fn option_sums(alias: &str) -> String {
    (0..MAX_POLL_OPTIONS)
        .map(|i| {
            format!(
                ", COALESCE(SUM(CASE WHEN {alias}.choices & {} <> 0 THEN 1 ELSE 0 END), 0) AS o{i}",
                1u32 << i
            )
        })
        .collect()
}

/// Counts from a row with `voters` and [`option_sums`]' columns.
fn counts_from<R: RowGet>(r: &R, poll: &RunPoll) -> StoreResult<PollCounts> {
    let mut c = PollCounts::empty(poll);
    let per = (0..poll.options.len())
        .map(|i| Ok(r.int(&format!("o{i}"))? as u64))
        .collect::<StoreResult<Vec<u64>>>()?;
    c.add(r.int("voters")? as u64, &per);
    Ok(c)
}

fn poll_from<R: RowGet>(r: &R) -> StoreResult<RunPoll> {
    Ok(RunPoll {
        part: r.int("part")? as u32,
        question: r.text("question")?,
        options: serde_json::from_str(&r.text("options")?)
            .map_err(|e| corrupt("poll options", e))?,
        multiple: r.flag("multiple")?,
    })
}

const POLLS: &str =
    "SELECT part, question, options, multiple FROM run_polls WHERE run_id = $1 ORDER BY part";

#[async_trait]
impl PollStore for SqlStore {
    async fn open_polls(
        &self,
        run: RunId,
        polls: &[RunPoll],
        messages: &[PollMessage],
    ) -> StoreResult<()> {
        let rows: Vec<(&str, i64, u32)> = messages
            .iter()
            .map(|m| (m.key.as_str(), m.target_id, m.part))
            .collect();
        let rows = serde_json::to_string(&rows).map_err(|e| StoreError::Backend(e.to_string()))?;
        let insert_messages = match &self.db {
            // `WHERE true` settles SQLite's parse of INSERT … SELECT … ON CONFLICT.
            Db::Sqlite { .. } => {
                "INSERT INTO poll_messages (poll_key, target_id, part) \
                 SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2 FROM json_each($1) AS j \
                 WHERE true ON CONFLICT (poll_key) DO NOTHING"
            }
            Db::Postgres(_) => {
                "INSERT INTO poll_messages (poll_key, target_id, part) \
                 SELECT x ->> 0, (x ->> 1)::bigint, (x ->> 2)::bigint \
                 FROM jsonb_array_elements($1::text::jsonb) AS x \
                 ON CONFLICT (poll_key) DO NOTHING"
            }
        };
        tx!(self, tx => {
            let known = sqlx::query("SELECT 1 FROM runs WHERE id = $1")
                .bind(run.0)
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?;
            if known.is_none() {
                return Err(StoreError::NotFound(format!("run {run}")));
            }
            for p in polls {
                sqlx::query(
                    "INSERT INTO run_polls (run_id, part, question, options, multiple) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (run_id, part) DO NOTHING",
                )
                .bind(run.0)
                .bind(i64::from(p.part))
                .bind(&p.question)
                .bind(serde_json::to_string(&p.options).map_err(|e| StoreError::Backend(e.to_string()))?)
                .bind(p.multiple)
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            if !messages.is_empty() {
                sqlx::query(insert_messages)
                    .bind(&rows)
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
        });
        Ok(())
    }

    async fn count_votes(&self, batch: &[Vote]) -> StoreResult<VoteTally> {
        let mut tally = VoteTally::default();
        if batch.is_empty() {
            return Ok(tally);
        }
        let mut by_key: HashMap<&str, Vec<&Vote>> = HashMap::new();
        for v in batch {
            by_key.entry(receipt_key(&v.poll_id)).or_default().push(v);
        }
        let upsert = "INSERT INTO poll_votes (target_id, part, run_id, voter, choices, voted_at) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (target_id, part, voter) DO UPDATE \
             SET choices = excluded.choices, voted_at = excluded.voted_at \
             WHERE poll_votes.voted_at < excluded.voted_at";
        tx!(self, tx => {
            let mut polls: HashMap<i64, Vec<RunPoll>> = HashMap::new();
            let mut found = Vec::with_capacity(batch.len());
            for (key, votes) in &by_key {
                let row = sqlx::query(
                    "SELECT m.target_id, m.part, t.run_id, t.group_jid, r.account_id \
                     FROM poll_messages m JOIN run_targets t ON t.id = m.target_id \
                     JOIN runs r ON r.id = t.run_id WHERE m.poll_key = $1",
                )
                .bind(*key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?;
                let Some(row) = row else {
                    tally.ignore(VoteIgnored::UnknownPoll, votes.len() as u64);
                    continue;
                };
                let (target_id, part) = (row.int("target_id")?, row.int("part")? as u32);
                let run_id = row.int("run_id")?;
                let (group, sender) = (row.text("group_jid")?, row.text("account_id")?);
                if let std::collections::hash_map::Entry::Vacant(e) = polls.entry(run_id) {
                    let rows = sqlx::query(POLLS)
                        .bind(run_id)
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(be)?;
                    e.insert(rows.iter().map(poll_from).collect::<StoreResult<Vec<_>>>()?);
                }
                let Some(poll) = polls[&run_id].iter().find(|p| p.part == part) else {
                    tally.ignore(VoteIgnored::UnknownPoll, votes.len() as u64);
                    continue;
                };
                let sent = PollSent {
                    target_id,
                    run_id: RunId(run_id),
                    part,
                    account: &sender,
                    group: &group,
                };
                for v in votes {
                    match voter_choice(v, sent, poll) {
                        Ok((account, mut choice)) => {
                            choice.at = trunc(choice.at);
                            found.push((account, choice));
                        }
                        Err(why) => tally.ignore(why, 1),
                    }
                }
            }
            let heard = found.len();
            let mut kept = latest_votes(found);
            tally.repeated += (heard - kept.len()) as u64;
            // In one order everywhere: two daemons' batches that share
            // voters wait for each other instead of deadlocking.
            kept.sort_by(|(_, x), (_, y)| {
                (x.target_id, x.part, &x.voter).cmp(&(y.target_id, y.part, &y.voter))
            });
            for (account, v) in kept {
                let changed = sqlx::query(upsert)
                    .bind(v.target_id)
                    .bind(i64::from(v.part))
                    .bind(v.run_id.0)
                    .bind(&v.voter)
                    .bind(i64::from(v.choices))
                    .bind(Ts(v.at))
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?
                    .rows_affected();
                if changed == 0 {
                    tally.repeated += 1;
                } else {
                    *tally.counted.entry(account).or_default() += 1;
                }
            }
        });
        Ok(tally)
    }

    async fn run_polls(&self, run: RunId) -> StoreResult<Vec<PollResult>> {
        let sql = format!(
            "SELECT part, COUNT(*) AS voters, COUNT(DISTINCT target_id) AS groups_voted{} \
             FROM poll_votes v WHERE run_id = $1 AND choices <> 0 GROUP BY part",
            option_sums("v")
        );
        super::read!(self, p => {
            let polls = sqlx::query(POLLS)
                .bind(run.0)
                .fetch_all(p)
                .await
                .map_err(be)?;
            let sums = sqlx::query(&sql).bind(run.0).fetch_all(p).await.map_err(be)?;
            let mut out = Vec::with_capacity(polls.len());
            for row in &polls {
                let poll = poll_from(row)?;
                let sum = sums
                    .iter()
                    .find(|s| s.int("part").ok() == Some(i64::from(poll.part)));
                let (counts, groups_voted) = match sum {
                    Some(s) => (counts_from(s, &poll)?, s.int("groups_voted")? as u32),
                    None => (PollCounts::empty(&poll), 0),
                };
                out.push(PollResult {
                    poll,
                    counts,
                    groups_voted,
                });
            }
            Ok(out)
        })
    }

    async fn group_polls(
        &self,
        run: RunId,
        part: u32,
        after: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<GroupPoll>> {
        let sql = format!(
            "SELECT t.id, t.position, t.group_jid, COUNT(v.voter) AS voters{} \
             FROM run_targets t LEFT JOIN poll_votes v \
             ON v.target_id = t.id AND v.part = $2 AND v.choices <> 0 \
             WHERE t.run_id = $1 AND t.position > $3 \
             GROUP BY t.id, t.position, t.group_jid ORDER BY t.position LIMIT $4",
            option_sums("v")
        );
        super::read!(self, p => {
            let poll = sqlx::query(
                "SELECT part, question, options, multiple FROM run_polls \
                 WHERE run_id = $1 AND part = $2",
            )
            .bind(run.0)
            .bind(i64::from(part))
            .fetch_optional(p)
            .await
            .map_err(be)?;
            let Some(poll) = poll else {
                return Ok(Vec::new());
            };
            let poll = poll_from(&poll)?;
            sqlx::query(&sql)
                .bind(run.0)
                .bind(i64::from(part))
                .bind(after.map_or(-1, i64::from))
                .bind(i64::from(limit))
                .fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(|r| {
                    Ok(GroupPoll {
                        target_id: r.int("id")?,
                        position: r.int("position")? as u32,
                        group: GroupJid::parse(&r.text("group_jid")?)
                            .map_err(|e| corrupt("group jid", e))?,
                        counts: counts_from(r, &poll)?,
                    })
                })
                .collect()
        })
    }
}
