//! Runs as operators read them (the list, one run with its receipts and
//! amendment, its groups named from the directory) and what an operator
//! asks of a run in flight: stop, pause, resume, retry. Each ask goes to
//! the run's account actor on whichever daemon holds the account. A run in
//! flight changes status asynchronously (parts in flight finish first), so
//! the answer is the status as it stands; the event stream reports the end.

use super::error::{ApiError, Kind};
use super::owner::{Owner, Owners};
use super::Service;
use super::{Allowed, Done, Operation};
use actix::Addr;
use herald_actors::delivery::account::{
    AccountActor, AmendRun, PauseRun, ResumeRun, RetryRun, StopRun,
};
use herald_actors::delivery::amend::AmendAsk;
use herald_actors::delivery::outcome::delivered_line;
use herald_actors::domain::{
    AccountId, AmendKind, Amendment, GroupJid, Role, Run, RunId, RunReceipts, RunStatus, RunTarget,
    TargetStatus, TimeZone,
};
use herald_actors::ports::{RunFilter, Store};
use herald_actors::supervisor::Door;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

pub static STOP: Operation = Operation::new("stopRun", Role::Operator).forwarded();
pub static PAUSE: Operation = Operation::new("pauseRun", Role::Operator).forwarded();
pub static RESUME: Operation = Operation::new("resumeRun", Role::Operator).forwarded();
pub static RETRY: Operation = Operation::new("retryRun", Role::Operator).forwarded();
pub static RECALL: Operation = Operation::new("recallRun", Role::Operator).forwarded();
pub static EDIT: Operation = Operation::new("editRun", Role::Operator).forwarded();
pub static LIST: Operation = Operation::read("listRuns", Role::Viewer);
pub static GET: Operation = Operation::read("getRun", Role::Viewer);
pub static TARGETS: Operation = Operation::read("listRunTargets", Role::Viewer);

/// A page of runs, newest first.
#[derive(Serialize, JsonSchema)]
pub struct RunPage {
    pub items: Vec<NamedRun>,
    pub next_before_id: Option<RunId>,
}

/// What people call a run: its reminder's title and its account's name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RunNames {
    /// Null once the reminder is no longer stored.
    pub reminder_title: Option<String>,
    /// Null once the account is deleted.
    pub account_name: Option<String>,
}

impl RunNames {
    /// "Monday standup · run 12": the title first, the id second.
    pub fn label(&self, run: RunId) -> String {
        match &self.reminder_title {
            Some(title) => format!("{title} · run {run}"),
            None => format!("Run {run}"),
        }
    }
}

/// A run with the names people know it by.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Run")]
pub struct NamedRun {
    #[serde(flatten)]
    pub run: Run,
    #[serde(flatten)]
    pub names: RunNames,
}

#[derive(Serialize, JsonSchema)]
#[schemars(rename = "RunDetail")]
pub struct RunView {
    #[serde(flatten)]
    pub run: Run,
    #[serde(flatten)]
    pub names: RunNames,
    /// "X of Y delivered", as the events and the summary say it.
    pub delivered: String,
    /// Who received and read it, over its groups.
    pub receipts: RunReceipts,
    /// Its newest recall or edit, with its progress.
    pub amendment: Option<Amendment>,
}

/// A run target with its group's name, as the operator picked it by.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "RunTarget")]
pub struct NamedTarget {
    #[serde(flatten)]
    pub target: RunTarget,
    /// From the account's group directory; null for a group it never
    /// listed (a JID typed by hand, or a directory not synced yet).
    pub group_name: Option<String>,
}

/// A page of a run's groups, in order of position.
#[derive(Serialize, JsonSchema)]
pub struct TargetPage {
    pub items: Vec<NamedTarget>,
    pub next_after: Option<u32>,
}

/// A recall or an edit, accepted.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AmendmentResult {
    pub run_id: RunId,
    pub amendment: Amendment,
}

/// What an operator asks of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "RunAction")]
pub enum Action {
    Stop,
    Pause,
    Resume,
    Retry,
}

impl Action {
    pub fn verb(self) -> &'static str {
        match self {
            Action::Stop => "stop",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Retry => "retry",
        }
    }

    /// The operation this action is.
    pub fn operation(self) -> &'static Operation {
        match self {
            Action::Stop => &STOP,
            Action::Pause => &PAUSE,
            Action::Resume => &RESUME,
            Action::Retry => &RETRY,
        }
    }
}

/// What a run action did.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ControlResult {
    pub run_id: RunId,
    pub action: Action,
    /// The status right after the request; a run in flight reaches its
    /// new status shortly after.
    pub status: RunStatus,
    /// retry only: groups queued again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeued: Option<u32>,
}

/// What reading runs and acting on them need: the runs in the store, the
/// account actors here, and who holds each account.
pub struct Runs<'a> {
    store: &'a dyn Store,
    actors: &'a Door,
    owners: Owners<'a>,
}

impl<'a> Runs<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
            actors: &state.door,
            owners: Owners::of(service),
        }
    }

    /// A page of the runs `filter` selects, newest first; a full page may
    /// have more behind it.
    pub async fn list(&self, allowed: Allowed, filter: &RunFilter) -> Result<RunPage, ApiError> {
        allowed.of(&LIST)?;
        let runs = self.store.list_runs(filter).await?;
        let next_before_id = (runs.len() as u32 == filter.limit)
            .then(|| runs.last().map(|r| r.id))
            .flatten();
        let mut names = self.names(&runs).await?;
        let items = runs
            .into_iter()
            .map(|run| NamedRun {
                names: names.remove(&run.id).unwrap_or_default(),
                run,
            })
            .collect();
        Ok(RunPage {
            items,
            next_before_id,
        })
    }

    /// Run `id` with its receipts and its newest recall or edit.
    pub async fn get(&self, allowed: Allowed, id: RunId) -> Result<RunView, ApiError> {
        allowed.of(&GET)?;
        let run = self.load(id).await?;
        let receipts = self.store.run_receipts(run.id).await?;
        let amendment = self.store.run_amendment(run.id).await?;
        let names = self
            .names(std::slice::from_ref(&run))
            .await?
            .remove(&run.id)
            .unwrap_or_default();
        Ok(RunView {
            delivered: delivered_line(&run.counts),
            names,
            run,
            receipts,
            amendment,
        })
    }

    /// The timezone of `run`'s reminder, which its times are shown in;
    /// UTC once the reminder is gone.
    pub async fn zone(&self, allowed: Allowed, run: &Run) -> Result<TimeZone, ApiError> {
        allowed.of(&GET)?;
        Ok(match self.store.get_reminder(run.reminder_id).await? {
            Some(r) => r.spec.timezone,
            None => TimeZone::parse("UTC")?,
        })
    }

    /// A page of run `id`'s groups in `status` (any, if `None`), by
    /// position after `after`, each named from the account's directory.
    pub async fn targets(
        &self,
        allowed: Allowed,
        id: RunId,
        status: Option<TargetStatus>,
        after: Option<u32>,
        limit: u32,
    ) -> Result<TargetPage, ApiError> {
        allowed.of(&TARGETS)?;
        let run = self.load(id).await?;
        let items = self
            .store
            .list_targets(run.id, status, after, limit)
            .await?;
        // A full page may have more behind it.
        let next_after = (items.len() as u32 == limit)
            .then(|| items.last().map(|t| t.position))
            .flatten();
        let items = self.named(&run, items).await?;
        Ok(TargetPage { items, next_after })
    }

    /// The names of `runs`, read once per reminder and account among them.
    async fn names(&self, runs: &[Run]) -> Result<HashMap<RunId, RunNames>, ApiError> {
        let reminders: BTreeSet<i64> = runs.iter().map(|r| r.reminder_id).collect();
        let reminders: Vec<i64> = reminders.into_iter().collect();
        let titles = self.store.reminder_titles(&reminders).await?;
        let mut accounts: HashMap<&AccountId, Option<String>> = HashMap::new();
        for run in runs {
            if !accounts.contains_key(&run.account_id) {
                let name = self
                    .store
                    .get_account(&run.account_id)
                    .await?
                    .map(|a| a.name);
                accounts.insert(&run.account_id, name);
            }
        }
        Ok(runs
            .iter()
            .map(|r| {
                let names = RunNames {
                    reminder_title: titles.get(&r.reminder_id).cloned(),
                    account_name: accounts.get(&r.account_id).cloned().flatten(),
                };
                (r.id, names)
            })
            .collect())
    }

    /// Names `targets` of `run` from its account's group directory.
    async fn named(
        &self,
        run: &Run,
        targets: Vec<RunTarget>,
    ) -> Result<Vec<NamedTarget>, ApiError> {
        let jids: Vec<GroupJid> = targets.iter().map(|t| t.group.clone()).collect();
        let mut names = self.store.group_names(&run.account_id, &jids).await?;
        Ok(targets
            .into_iter()
            .map(|t| NamedTarget {
                group_name: names.remove(&t.group),
                target: t,
            })
            .collect())
    }

    /// Performs `action` on run `id`, or says which daemon must. `hop`:
    /// another daemon forwarded it here.
    pub async fn control(
        &self,
        allowed: Allowed,
        id: RunId,
        action: Action,
        hop: bool,
    ) -> Result<Done<ControlResult>, ApiError> {
        allowed.of(action.operation())?;
        let run = self.load(id).await?;
        if let Owner::Elsewhere { node, url } = self.owners.owner(&run.account_id, hop).await? {
            let path = format!("/v1/runs/{id}/{}", action.verb());
            return Ok(Done::Elsewhere {
                node,
                url,
                path,
                body: None,
                read: false,
            });
        }
        let actor = self.actor(&run.account_id)?;
        let requeued = match action {
            Action::Stop => actor.send(StopRun { run_id: id }).await?.map(|()| None),
            Action::Pause => actor.send(PauseRun { run_id: id }).await?.map(|()| None),
            Action::Resume => actor.send(ResumeRun { run_id: id }).await?.map(|()| None),
            Action::Retry => actor.send(RetryRun { run_id: id }).await?.map(Some),
        }?;
        let now = self
            .store
            .get_run(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("run {id}")))?;
        Ok(Done::Here(ControlResult {
            run_id: id,
            action,
            status: now.status,
            requeued,
        }))
    }

    /// Recalls (deletes for everyone) or edits what run `id` sent, here
    /// or on the daemon that carries the account; the account's actor
    /// paces it like a run.
    pub async fn amend(
        &self,
        allowed: Allowed,
        id: RunId,
        ask: AmendAsk,
        hop: bool,
    ) -> Result<Done<AmendmentResult>, ApiError> {
        allowed.of(match ask.kind {
            AmendKind::Recall => &RECALL,
            AmendKind::Edit => &EDIT,
        })?;
        let run = self.load(id).await?;
        if let Owner::Elsewhere { node, url } = self.owners.owner(&run.account_id, hop).await? {
            // An edit's body as the API takes it: only what it changes.
            let body = (ask.kind == AmendKind::Edit).then(|| {
                let given = [("text", ask.text), ("caption", ask.caption)];
                given
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.to_owned(), v?.into())))
                    .collect::<serde_json::Map<_, _>>()
                    .into()
            });
            let path = format!("/v1/runs/{id}/{}", ask.kind);
            return Ok(Done::Elsewhere {
                node,
                url,
                path,
                body,
                read: false,
            });
        }
        let amendment = self
            .actor(&run.account_id)?
            .send(AmendRun { run_id: id, ask })
            .await??;
        Ok(Done::Here(AmendmentResult {
            run_id: id,
            amendment,
        }))
    }

    /// Deletes for everyone what run `id` sent ([`Runs::amend`]).
    pub async fn recall(
        &self,
        allowed: Allowed,
        id: RunId,
        hop: bool,
    ) -> Result<Done<AmendmentResult>, ApiError> {
        self.amend(allowed, id, AmendAsk::recall(), hop).await
    }

    async fn load(&self, id: RunId) -> Result<Run, ApiError> {
        self.store
            .get_run(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("run {id}")))
    }

    fn actor(&self, account: &AccountId) -> Result<Addr<AccountActor>, ApiError> {
        self.actors.actor(account).ok_or_else(|| {
            ApiError::new(
                Kind::Unavailable,
                format!("account {account} has no running actor"),
            )
        })
    }
}
