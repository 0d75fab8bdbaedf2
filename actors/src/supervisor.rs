//! The Supervisor: spawns one AccountActor per account (spread over the
//! arbiters, one per core), routes messages to them, and restarts one that
//! stops or panics — with fresh state (empty bucket, empty queue) and its
//! unfinished runs handed back from the database.

use crate::delivery::account::{AccountActor, AccountChanged, AccountStopped, AmendDue, Drain};
use crate::delivery::engine::Engine;
use crate::domain::{AccountId, RunStatus};
use crate::messages::{RunDue, WindowClosed};
use crate::ports::StoreError;
use actix::prelude::*;
use actix_rt::ArbiterHandle;
use dashmap::DashMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Account id → its actor. Readers clone the address out; no guard is held
/// across an `.await`.
pub type Registry = Arc<DashMap<AccountId, Addr<AccountActor>>>;

pub struct Supervisor {
    engine: Arc<Engine>,
    registry: Registry,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: usize,
    generation: HashMap<AccountId, u64>,
    health_every: Duration,
}

impl Supervisor {
    /// `arbiters` empty: every account actor runs on the supervisor's own
    /// arbiter (simulation and tests on paused time need one thread).
    pub fn new(engine: Arc<Engine>, arbiters: Vec<ArbiterHandle>) -> Self {
        Self {
            health_every: engine.config.health_every,
            engine,
            registry: Arc::new(DashMap::new()),
            arbiters,
            next_arbiter: 0,
            generation: HashMap::new(),
        }
    }

    fn spawn(&mut self, id: AccountId, ctx: &mut Context<Self>) -> Addr<AccountActor> {
        let generation = self.generation.entry(id.clone()).or_default();
        *generation += 1;
        let generation = *generation;
        let engine = self.engine.clone();
        let on_stop = ctx.address().recipient();
        let make = {
            let id = id.clone();
            move |_: &mut Context<AccountActor>| {
                AccountActor::new(id, generation, engine, Some(on_stop))
            }
        };
        let addr = if self.arbiters.is_empty() {
            AccountActor::create(make)
        } else {
            let arbiter = &self.arbiters[self.next_arbiter % self.arbiters.len()];
            self.next_arbiter += 1;
            AccountActor::start_in_arbiter(arbiter, make)
        };
        self.registry.insert(id, addr.clone());
        addr
    }

    fn route<M>(&self, account: &AccountId, msg: M)
    where
        M: Message<Result = ()> + Send + 'static,
        AccountActor: Handler<M>,
    {
        let addr = self.registry.get(account).map(|a| a.clone());
        match addr {
            Some(addr) => addr.do_send(msg),
            // Another daemon owns it: its owner's sweep picks the run up
            // from the store.
            None if self.leased() => {
                tracing::debug!(%account, "message for an account another daemon owns: left to its owner")
            }
            None => tracing::warn!(%account, "message for an account with no actor dropped"),
        }
    }

    /// Several daemons: accounts are this daemon's only while it holds their lease.
    fn leased(&self) -> bool {
        self.engine.leases.as_ref().is_some()
    }

    /// Whether this daemon carries `account` forward (always, alone).
    fn owns(&self, account: &AccountId) -> bool {
        self.engine.leases.as_ref().is_none_or(|t| t.holds(account))
    }

    /// Restarts an account's actor and hands it its unfinished runs.
    fn restart(&mut self, id: AccountId, ctx: &mut Context<Self>) {
        tracing::warn!(account = %id, "account actor stopped unexpectedly: restarting");
        self.engine.ports.metrics.actor_restarted("account");
        self.adopt(id, ctx);
    }

    /// Gives an account an actor and hands it its queued and running runs.
    fn adopt(&mut self, id: AccountId, ctx: &mut Context<Self>) {
        let addr = self.spawn(id.clone(), ctx);
        let store = self.engine.ports.store.clone();
        ctx.spawn(
            async move {
                match store.unfinished_runs().await {
                    Ok(runs) => {
                        for run in runs.into_iter().filter(|r| r.account_id == id && resumable(r.status)) {
                            addr.do_send(RunDue { run_id: run.id, account_id: id.clone() });
                        }
                    }
                    Err(e) => tracing::error!(account = %id, error = %e, "could not reload runs after restart"),
                }
                // The sweep hands back what this read misses.
                if let Ok(amends) = store.unfinished_amendments().await {
                    for (a, _) in amends.into_iter().filter(|(_, acct)| *acct == id) {
                        addr.do_send(AmendDue { amendment_id: a.id });
                    }
                }
            }
            .into_actor(self),
        );
    }
}

/// Runs handed back at start-up, restart and sweep. Paused runs wait for
/// the operator; parked ones for the WindowActor (or the sweep, once their
/// opening has passed).
fn resumable(status: RunStatus) -> bool {
    crate::lifecycle::is_owned_by_account(status)
}

/// The unfinished runs that some account actor should be carrying forward
/// at `now`: queued and running ones, and parked ones whose next opening
/// passed more than `grace` ago (their timer should have fired).
pub async fn runs_to_hand_back(
    store: &dyn crate::ports::Store,
    now: chrono::DateTime<chrono::Utc>,
    grace: Duration,
) -> Result<Vec<crate::domain::Run>, StoreError> {
    let grace = chrono::Duration::from_std(grace).unwrap_or_default();
    let mut out = Vec::new();
    for run in store.unfinished_runs().await? {
        if resumable(run.status) {
            out.push(run);
        } else if run.status == RunStatus::Parked {
            let (Some(end), Some(r)) = (
                run.window_end_at,
                store.get_reminder(run.reminder_id).await?,
            ) else {
                continue;
            };
            // A parked run is held to its next window: it opens before `end`.
            let opens = r
                .spec
                .window
                .span_at_or_after(&r.spec.timezone, end - chrono::Duration::seconds(1))
                .open;
            if opens + grace <= now {
                out.push(run);
            }
        }
    }
    Ok(out)
}

impl Supervisor {
    /// Hands every run that should be under way to its account's actor;
    /// an actor that already carries a run ignores it.
    fn sweep(&mut self, ctx: &mut Context<Self>) {
        let store = self.engine.ports.store.clone();
        let now = self.engine.ports.clock.now();
        let grace = self.engine.config.sweep_every;
        ctx.spawn(
            async move {
                let runs = runs_to_hand_back(&*store, now, grace).await?;
                Ok::<_, StoreError>((runs, store.unfinished_amendments().await?))
            }
                .into_actor(self)
                .map(|res, act, ctx| match res {
                    Ok((runs, amends)) => {
                        act.hand_back_amendments(amends, ctx);
                        // Another daemon's accounts are left to it: an
                        // actor here could not act for them, and would stay
                        // in the registry past a later takeover.
                        let runs: Vec<_> =
                            runs.into_iter().filter(|r| act.owns(&r.account_id)).collect();
                        for run in runs {
                            // An account without an actor (a start-up that
                            // could not read the store) gets one now.
                            if !act.registry.contains_key(&run.account_id) {
                                act.spawn(run.account_id.clone(), ctx);
                            }
                            act.route(
                                &run.account_id.clone(),
                                RunDue {
                                    run_id: run.id,
                                    account_id: run.account_id,
                                },
                            );
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "ownership sweep could not read runs; next pass retries"),
                }),
        );
    }
}

impl Supervisor {
    /// Hands each unfinished recall or edit to its account's actor, for
    /// the accounts this daemon carries.
    fn hand_back_amendments(
        &mut self,
        amends: Vec<(crate::domain::Amendment, AccountId)>,
        ctx: &mut Context<Self>,
    ) {
        for (a, account) in amends {
            if !self.owns(&account) {
                continue;
            }
            if !self.registry.contains_key(&account) {
                self.spawn(account.clone(), ctx);
            }
            self.route(&account, AmendDue { amendment_id: a.id });
        }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(4096);
        // A panic inside an account actor ends its task without `stopped`:
        // a cheap periodic liveness check catches that case.
        // Every unfinished run has an owner; a run that lost its owner (a
        // message dropped with a dead actor, a timer lost) is handed back.
        ctx.run_interval(self.engine.config.sweep_every, |act, ctx| act.sweep(ctx));
        ctx.run_interval(self.health_every, |act, ctx| {
            let dead: Vec<AccountId> = act
                .registry
                .iter()
                .filter(|e| !e.value().connected())
                .map(|e| e.key().clone())
                .collect();
            for id in dead {
                act.restart(id, ctx);
            }
        });
    }
}

/// Spawn an actor for every account and hand back the runs a crash or
/// shutdown left queued or running. Answers how many runs were resumed.
#[derive(Debug, Message)]
#[rtype(result = "Result<usize, StoreError>")]
pub struct StartAll;

impl Handler<StartAll> for Supervisor {
    type Result = ResponseActFuture<Self, Result<usize, StoreError>>;
    fn handle(&mut self, _: StartAll, _ctx: &mut Context<Self>) -> Self::Result {
        let store = self.engine.ports.store.clone();
        Box::pin(
            async move {
                let accounts = store.list_accounts().await?;
                let runs = store.unfinished_runs().await?;
                let amends = store.unfinished_amendments().await?;
                Ok::<_, StoreError>((accounts, runs, amends))
            }
            .into_actor(self)
            .map(|res, act, ctx| {
                let (accounts, runs, amends) = res?;
                // With leases, the lease keeper adopts accounts as it takes them.
                for a in accounts {
                    if act.owns(&a.id) && !act.registry.contains_key(&a.id) {
                        act.spawn(a.id, ctx);
                    }
                }
                let mut resumed = 0;
                for run in runs {
                    if !resumable(run.status) || !act.owns(&run.account_id) {
                        continue;
                    }
                    act.route(
                        &run.account_id.clone(),
                        RunDue {
                            run_id: run.id,
                            account_id: run.account_id,
                        },
                    );
                    resumed += 1;
                }
                act.hand_back_amendments(amends, ctx);
                tracing::info!(
                    accounts = act.registry.len(),
                    resumed,
                    "account actors started"
                );
                Ok(resumed)
            }),
        )
    }
}

/// An account was added: give it an actor.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct AddAccount(pub AccountId);

impl Handler<AddAccount> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: AddAccount, ctx: &mut Context<Self>) {
        // With leases, the keeper adopts it once a daemon takes its lease.
        if self.owns(&msg.0) && !self.registry.contains_key(&msg.0) {
            self.spawn(msg.0, ctx);
        }
    }
}

/// Several daemons: this daemon took the account's lease. Gives it an
/// actor and hands it the account's unfinished runs (an actor that already
/// carries one ignores it).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Adopt(pub AccountId);

impl Handler<Adopt> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: Adopt, ctx: &mut Context<Self>) {
        if self.registry.contains_key(&msg.0) {
            return;
        }
        self.adopt(msg.0, ctx);
    }
}

/// Several daemons: the account's lease is lost or being handed over.
/// Resolves once its actor has stopped starting parts and every part in
/// flight has ended (or after `grace`), with the actor gone.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Release {
    pub account: AccountId,
    pub grace: Duration,
}

impl Handler<Release> for Supervisor {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, msg: Release, _ctx: &mut Context<Self>) -> Self::Result {
        // Out of the registry first, so its stop is not taken for a crash.
        let addr = self.registry.remove(&msg.account).map(|(_, a)| a);
        Box::pin(async move {
            let Some(addr) = addr else { return };
            if tokio::time::timeout(msg.grace, addr.send(Drain))
                .await
                .is_err()
            {
                tracing::warn!(account = %msg.account, "parts still in flight when the account was released");
            }
            addr.do_send(crate::delivery::account::StopActor);
        })
    }
}

/// An account was removed: stop its actor for good.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RemoveAccount(pub AccountId);

impl Handler<RemoveAccount> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: RemoveAccount, _ctx: &mut Context<Self>) {
        // Out of the registry first, so its stop is not taken for a crash.
        if let Some((_, addr)) = self.registry.remove(&msg.0) {
            addr.do_send(crate::delivery::account::StopActor);
        }
    }
}

/// An account's row changed (limits, state): tell its actor.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct AccountUpdated(pub AccountId);

impl Handler<AccountUpdated> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: AccountUpdated, _ctx: &mut Context<Self>) {
        self.route(&msg.0, AccountChanged);
    }
}

impl Handler<RunDue> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: RunDue, _ctx: &mut Context<Self>) {
        let account = msg.account_id.clone();
        self.route(&account, msg);
    }
}

impl Handler<WindowClosed> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: WindowClosed, _ctx: &mut Context<Self>) {
        let account = msg.account_id.clone();
        self.route(&account, msg);
    }
}

impl Handler<AccountStopped> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: AccountStopped, ctx: &mut Context<Self>) {
        let current = self.generation.get(&msg.account_id).copied();
        let registered = self.registry.contains_key(&msg.account_id);
        // Only the live generation of a still-registered account restarts.
        if registered && current == Some(msg.generation) {
            self.restart(msg.account_id, ctx);
        }
    }
}

/// SIGTERM: every account stops starting parts; resolves when all are idle.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct DrainAll;

impl Handler<DrainAll> for Supervisor {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, _: DrainAll, _ctx: &mut Context<Self>) -> Self::Result {
        let addrs: Vec<_> = self.registry.iter().map(|e| e.value().clone()).collect();
        Box::pin(async move {
            let waits = addrs.iter().map(|a| a.send(Drain));
            futures_util::future::join_all(waits).await;
        })
    }
}

/// Stops the supervisor and every account actor at once, leaving the store
/// as it is: what a killed process leaves behind (the simulation's crash).
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Terminate;

#[cfg(any(test, feature = "testkit"))]
impl Handler<Terminate> for Supervisor {
    type Result = ();
    fn handle(&mut self, _: Terminate, ctx: &mut Context<Self>) {
        // Out of the registry first, so their stops are not taken for crashes.
        let addrs: Vec<_> = self.registry.iter().map(|e| e.value().clone()).collect();
        self.registry.clear();
        for a in addrs {
            a.do_send(crate::delivery::account::StopActor);
        }
        ctx.stop();
    }
}

/// The registry: what a [`Door`] opens onto.
#[derive(Debug, Message)]
#[rtype(result = "Registry")]
pub struct GetRegistry;

impl Handler<GetRegistry> for Supervisor {
    type Result = MessageResult<GetRegistry>;
    fn handle(&mut self, _: GetRegistry, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.registry.clone())
    }
}

/// The daemon's one way into its account actors (the service layer,
/// start-up, the WhatsApp gateway's reports).
/// An account's life (added, changed, removed, everything started or
/// drained) goes through the supervisor, which owns the actors; a
/// question or a control for one run goes straight to its actor, so a busy
/// supervisor does not hold it up. The scheduler, the window actor and
/// the lease keeper are the core's own wiring and hold the supervisor.
#[derive(Clone)]
pub struct Door {
    supervisor: Addr<Supervisor>,
    actors: Registry,
}

impl Door {
    /// The door of a started supervisor.
    pub async fn of(supervisor: Addr<Supervisor>) -> Result<Self, MailboxError> {
        let actors = supervisor.send(GetRegistry).await?;
        Ok(Self { supervisor, actors })
    }

    /// The account's actor, if this daemon carries the account.
    pub fn actor(&self, account: &AccountId) -> Option<Addr<AccountActor>> {
        self.actors.get(account).map(|a| a.clone())
    }

    /// Whether this daemon carries `account`.
    pub fn carries(&self, account: &AccountId) -> bool {
        self.actors.contains_key(account)
    }

    /// How many accounts this daemon carries.
    pub fn carried(&self) -> usize {
        self.actors.len()
    }

    /// Every account gets its actor and its unfinished runs back; answers
    /// how many runs were resumed.
    pub async fn start_all(&self) -> Result<Result<usize, StoreError>, MailboxError> {
        self.supervisor.send(StartAll).await
    }

    /// Every actor stops starting parts; resolves once all are idle.
    pub async fn drain_all(&self) -> Result<(), MailboxError> {
        self.supervisor.send(DrainAll).await
    }

    /// A new account: resolves once its actor exists (here, or on the
    /// daemon that takes its lease).
    pub async fn added(&self, account: AccountId) -> Result<(), MailboxError> {
        self.supervisor.send(AddAccount(account)).await
    }

    /// The account's row changed: its actor reads it again.
    pub async fn changed(&self, account: AccountId) -> Result<(), MailboxError> {
        self.supervisor.send(AccountUpdated(account)).await
    }

    /// The account is gone: its actor stops for good.
    pub async fn removed(&self, account: AccountId) -> Result<(), MailboxError> {
        self.supervisor.send(RemoveAccount(account)).await
    }
}

/// Blocks the supervisor's thread for a while, as a stalled arbiter on a
/// loaded machine would: for tests of what must not wait on it.
#[cfg(feature = "testkit")]
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Stall(pub Duration);

#[cfg(feature = "testkit")]
impl Handler<Stall> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: Stall, _ctx: &mut Context<Self>) {
        std::thread::sleep(msg.0);
    }
}
