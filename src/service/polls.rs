//! A run's polls, answered across its whole fan-out: per option the voters
//! whose current choice includes it, summed over every group, and per group
//! the same, paged like the run's targets. Read from the store's counts of
//! each voter's latest choice, so the answer is the same on every daemon.

use super::error::ApiError;
use super::{Allowed, Operation, Service};
use herald_actors::domain::{GroupPoll, PollResult, Role, RunId};
use herald_actors::ports::Store;
use schemars::JsonSchema;
use serde::Serialize;

pub static POLL: Operation = Operation::read("getRunPoll", Role::Viewer);

/// One group's answer, with the group's name where the directory knows it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NamedGroupPoll {
    #[serde(flatten)]
    pub group: GroupPoll,
    pub group_name: Option<String>,
}

/// A run's answer: every poll it sent, and one poll's groups, a page.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunPollAnswer {
    pub run_id: RunId,
    /// Every poll part of the run, each counted over all its groups (empty
    /// for a run that sent no poll, or has not started sending).
    pub polls: Vec<PollResult>,
    /// The part `groups` counts (the first poll unless `part` was given).
    pub part: Option<u32>,
    /// A page of groups in order of position, voted or not.
    pub groups: Vec<NamedGroupPoll>,
    /// Pass as `after` for the next page; null on the last one.
    pub next_after: Option<u32>,
}

/// Reading runs' polls.
pub struct Polls<'a> {
    store: &'a dyn Store,
}

impl<'a> Polls<'a> {
    pub fn of(service: &'a Service) -> Self {
        Self {
            store: service.state.store.as_ref(),
        }
    }

    /// Run `id`'s polls and a page of one poll's groups. NotFound for an
    /// unknown run, or a part that is not one of its polls.
    pub async fn get(
        &self,
        allowed: Allowed,
        id: RunId,
        part: Option<u32>,
        after: Option<u32>,
        limit: u32,
    ) -> Result<RunPollAnswer, ApiError> {
        allowed.of(&POLL)?;
        let run = self
            .store
            .get_run(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("run {id}")))?;
        let polls = self.store.run_polls(run.id).await?;
        let part = match part {
            Some(p) if polls.iter().any(|x| x.poll.part == p) => Some(p),
            Some(p) => {
                let parts: Vec<String> = polls.iter().map(|x| x.poll.part.to_string()).collect();
                // Not a 422: `part` is well formed; the run has no such poll.
                let parts = if parts.is_empty() {
                    "none".to_owned()
                } else {
                    parts.join(", ")
                };
                return Err(ApiError::not_found(format!(
                    "poll part {p} of run {id} (its poll parts: {parts})"
                )));
            }
            None => polls.first().map(|x| x.poll.part),
        };
        let groups = match part {
            Some(p) => self.store.group_polls(run.id, p, after, limit).await?,
            None => Vec::new(),
        };
        // A full page may have more behind it.
        let next_after = (groups.len() as u32 == limit)
            .then(|| groups.last().map(|g| g.position))
            .flatten();
        let jids: Vec<_> = groups.iter().map(|g| g.group.clone()).collect();
        let mut names = self.store.group_names(&run.account_id, &jids).await?;
        let groups = groups
            .into_iter()
            .map(|g| NamedGroupPoll {
                group_name: names.remove(&g.group),
                group: g,
            })
            .collect();
        Ok(RunPollAnswer {
            run_id: run.id,
            polls,
            part,
            groups,
            next_after,
        })
    }
}
