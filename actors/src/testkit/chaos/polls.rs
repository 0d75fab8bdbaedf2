//! Polls under chaos: some reminders carry a poll, the simulated members
//! vote on every copy delivered (some change their mind, some withdraw,
//! some votes relayed twice), through crashes, takeovers and refused
//! batches; and the checker holds each group's tally to the simulator's
//! record of each voter's latest choice: never a voter counted twice,
//! never more voters than the group's other participants.

use crate::delivery::outcome::message_id;
use crate::domain::SeededRng;
use crate::domain::*;
use crate::memstore::MemoryStore;
use crate::ports::*;
use crate::simulator::{sim_participants, SimVotes, Simulator};
use rand::{RngExt, SeedableRng};
use std::time::Duration;

/// The seed's polls: the members' voting plan and its own random stream
/// (so the rest of the seed replays as it did before polls).
pub(super) struct Polls {
    pub(super) plan: SimVotes,
    rng: SeededRng,
}

impl Polls {
    pub(super) fn new(seed: u64) -> Self {
        let mut rng = SeededRng::seed_from_u64(seed ^ 0x9011_5eed);
        let plan = SimVotes {
            share: rng.random_range(0.1..=1.0),
            after: Duration::from_secs(rng.random_range(1..600)),
            later: Duration::from_secs(rng.random_range(1..1800)),
            change_every: [0, 2, 3][rng.random_range(0..3)],
            withdraw_every: [0, 4, 7][rng.random_range(0..3)],
            repeat_every: [0, 1, 5][rng.random_range(0..3)],
        };
        Self { plan, rng }
    }

    /// A poll part for some reminders (a third), single or multiple choice.
    pub(super) fn maybe_part(&mut self) -> Option<MessagePart> {
        if !self.rng.random_bool(0.3) {
            return None;
        }
        let n = self.rng.random_range(2..=5);
        let options: Vec<String> = (0..n).map(|i| format!("option {i}")).collect();
        let multiple = self.rng.random_bool(0.5);
        Some(MessagePart::poll("Coming, {group_name}?", &options, multiple).expect("valid poll"))
    }

    /// How long after the last send the last vote may still come.
    pub(super) fn settle(&self) -> Duration {
        2 * self.plan.after + self.plan.later + Duration::from_secs(5)
    }

    /// Once every vote was counted: each group's tally of each poll against
    /// the simulator's record; answers what it found broken.
    pub(super) async fn check(&self, mem: &MemoryStore, sim: &Simulator) -> Vec<String> {
        let mut broken = Vec::new();
        let runs = mem
            .list_runs(&RunFilter::default())
            .await
            .unwrap_or_default();
        let mut checked = std::collections::HashSet::new();
        for run in &runs {
            for poll in mem.run_polls(run.id).await.unwrap_or_default() {
                let groups = mem
                    .group_polls(run.id, poll.poll.part, None, u32::MAX)
                    .await
                    .unwrap_or_default();
                for g in groups {
                    let id = message_id(run.id, &g.group, poll.poll.part);
                    checked.insert((run.account_id.clone(), g.group.clone(), id.clone()));
                    let cast = sim.cast_votes(&run.account_id, &g.group, &id);
                    let mut want = vec![0u64; poll.poll.options.len()];
                    for chosen in cast.values() {
                        for o in chosen {
                            if let Some(i) = poll.poll.options.iter().position(|x| x == o) {
                                want[i] += 1;
                            }
                        }
                    }
                    let got: Vec<u64> = g.counts.options.iter().map(|o| o.votes).collect();
                    if got != want || g.counts.voters != cast.len() as u64 {
                        broken.push(format!(
                            "run {} group {} poll part {}: counted {got:?} from {} voters, \
                             the members' latest votes are {want:?} from {}",
                            run.id,
                            g.group,
                            poll.poll.part,
                            g.counts.voters,
                            cast.len()
                        ));
                    }
                    let others = u64::from(sim_participants(&g.group) - 1);
                    if g.counts.voters > others {
                        broken.push(format!(
                            "run {} group {} counts {} voters of {others} others",
                            run.id, g.group, g.counts.voters
                        ));
                    }
                }
            }
        }
        // Every poll the members voted on is one Herald knows.
        for ((account, group, id), cast) in sim.all_cast_votes() {
            if !cast.is_empty() && !checked.contains(&(account.clone(), group.clone(), id.clone()))
            {
                broken.push(format!(
                    "{} votes on poll {id} in {group} of {account}, which no run counts",
                    cast.len()
                ));
            }
        }
        broken
    }
}
