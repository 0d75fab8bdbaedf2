//! Recalls and edits under chaos: the operator now and then takes a run
//! back or corrects it, while everything else fails as before, and the
//! checker holds each amendment to its promises: a revoke or an edit only
//! of a message the run sent (or may have: its answer lost) to that group,
//! each group's messages amended at most once per amendment and after they
//! were sent, every group of a finished amendment either amended whole or
//! reported too old or refused, and nothing left under way. The account's
//! limit counts the revokes and edits with its runs (the main checker's
//! 60 s windows read the whole log).

use crate::delivery::account::{AccountActor, AmendRun};
use crate::delivery::amend::AmendAsk;
use crate::delivery::outcome::{amend_message_id, message_id};
use crate::domain::SeededRng;
use crate::domain::*;
use crate::memstore::MemoryStore;
use crate::ports::*;
use crate::simulator::Delivery;
use actix::Addr;
use chrono::{DateTime, Utc};
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The seed's amendments: an own random stream (so the rest of the seed
/// draws what it drew before amendments) and what the operator asked.
pub(super) struct Amends {
    rng: SeededRng,
    /// Accepted amendments by id: the run and when it was asked.
    asked: BTreeMap<i64, (RunId, DateTime<Utc>)>,
}

/// What an accepted amendment means for the rest of the checker.
pub(super) struct Asked {
    pub(super) run: RunId,
    /// The run was still under way: the amendment stopped it.
    pub(super) stopped: bool,
}

impl Amends {
    pub(super) fn new(seed: u64) -> Self {
        Self {
            rng: SeededRng::seed_from_u64(seed ^ 0x0a3e_bd17),
            asked: BTreeMap::new(),
        }
    }

    /// Whether the operator amends a run at this step.
    pub(super) fn due(&mut self) -> bool {
        self.rng.random_bool(0.03)
    }

    /// Asks a recall (mostly) or an edit of one of `runs` of its account's
    /// actor, through the daemon that carries it.
    pub(super) async fn ask(
        &mut self,
        runs: &[Run],
        actor_of: impl Fn(&AccountId) -> Option<Addr<AccountActor>>,
        now: DateTime<Utc>,
    ) -> Option<Asked> {
        if runs.is_empty() {
            return None;
        }
        let run = &runs[self.rng.random_range(0..runs.len())];
        let addr = actor_of(&run.account_id)?;
        let ask = if self.rng.random_bool(0.7) {
            AmendAsk::recall()
        } else {
            AmendAsk {
                kind: AmendKind::Edit,
                text: Some(format!("corrected {}", self.rng.random::<u16>())),
                caption: self.rng.random_bool(0.5).then(|| "new caption".to_owned()),
            }
        };
        let kind = ask.kind;
        let answer = addr
            .send(AmendRun {
                run_id: run.id,
                ask,
            })
            .await;
        tracing::info!(target: "chaos", at = %now, run = %run.id, %kind, ok = matches!(answer, Ok(Ok(_))), "operator amends a run");
        let a = answer.ok()?.ok()?;
        self.asked.insert(a.id, (run.id, now));
        Some(Asked {
            run: run.id,
            stopped: !run.status.is_final(),
        })
    }

    /// Whether every amendment asked has finished.
    pub(super) async fn all_finished(&self, mem: &MemoryStore) -> bool {
        mem.unfinished_amendments()
            .await
            .is_ok_and(|open| open.is_empty())
    }

    /// The amendments' promises over the simulator's log, once everything
    /// settled. `retried`: runs the operator retried, and when (a retry
    /// after an amendment sends messages it never covered).
    pub(super) async fn check(
        &self,
        mem: &MemoryStore,
        log: &[Delivery],
        retried: &HashMap<RunId, Vec<DateTime<Utc>>>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(open) = mem.unfinished_amendments().await {
            for (a, _) in open {
                out.push(format!(
                    "amendment {} of run {} still under way after everything settled ({:?})",
                    a.id, a.run_id, a.progress
                ));
            }
        }
        // When each message of a run reached WhatsApp first.
        let mut sent_at: HashMap<&str, DateTime<Utc>> = HashMap::new();
        for d in log.iter().filter(|d| d.content.amends().is_none()) {
            sent_at.entry(d.message_id.as_str()).or_insert(d.at);
        }
        let amended: HashMap<&str, &Delivery> = log
            .iter()
            .filter(|d| d.content.amends().is_some())
            .map(|d| (d.message_id.as_str(), d))
            .collect();
        // Every amending message Herald sent must be one it derived.
        let mut known: HashSet<String> = HashSet::new();
        for (&id, (run, asked_at)) in &self.asked {
            let Ok(Some(a)) = mem.get_amendment(id).await else {
                out.push(format!("amendment {id} of run {run} was not stored"));
                continue;
            };
            let retried_since = retried
                .get(run)
                .is_some_and(|ts| ts.iter().any(|t| t > asked_at));
            let targets = mem.amend_targets(id, None, 0).await.unwrap_or_default();
            for t in &targets {
                for part in 0..t.messages() {
                    let mine = amend_message_id(id, &t.group, part);
                    let of = message_id(*run, &t.group, part);
                    known.insert(mine.clone());
                    let Some(d) = amended.get(mine.as_str()) else {
                        // A part a finished amendment left out must be
                        // said: too old, refused, or not edited.
                        let skipped = a.kind == AmendKind::Edit
                            && a.edits.get(part as usize).is_none_or(Option::is_none);
                        if t.state == Some(AmendState::Done) && !skipped && !retried_since {
                            out.push(format!(
                                "amendment {id} marked group {} done but never sent its {} of part {part}",
                                t.group, a.kind
                            ));
                        }
                        continue;
                    };
                    if d.group != t.group || d.content.amends() != Some(of.as_str()) {
                        out.push(format!(
                            "amendment {id} sent {} to {} about {:?}, not {of} of {}",
                            d.message_id,
                            d.group,
                            d.content.amends(),
                            t.group
                        ));
                    }
                    if matches!(t.state, Some(AmendState::TooOld)) {
                        out.push(format!(
                            "amendment {id} sent to {} yet called it too old",
                            t.group
                        ));
                    }
                    if sent_at.get(of.as_str()).is_some_and(|at| *at > d.at) {
                        out.push(format!(
                            "amendment {id} reached {} before the message it amends",
                            t.group
                        ));
                    }
                }
                if a.is_finished() && !t.state.is_some_and(AmendState::is_final) {
                    out.push(format!(
                        "amendment {id} finished with group {} {:?}",
                        t.group, t.state
                    ));
                }
            }
        }
        for d in amended.values() {
            if !known.contains(&d.message_id) {
                out.push(format!(
                    "{} {} to {} is no amendment's message of a group its run sent to",
                    d.message_id,
                    d.content.amends().unwrap_or_default(),
                    d.group
                ));
            }
        }
        out
    }

    pub(super) fn asked(&self) -> usize {
        self.asked.len()
    }
}
