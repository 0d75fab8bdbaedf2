//! A deterministic simulation of the whole engine, with faults.
//!
//! One seed drives everything: the real supervisor, account actors,
//! scheduler, window actor and writer run on virtual time against the
//! simulated WhatsApp and the memory store, and the seed decides every
//! fault (TigerBeetle's VOPR and FoundationDB's simulation tests are the
//! model):
//!
//! - the store fails or stalls on any call;
//! - the whole engine crashes at any instant and restarts, keeping only
//!   what the store committed (the crashed generation's calls never return,
//!   so its unwritten marks are lost, as a killed process's are);
//! - the gateway fails transiently, answers rate-limited, accepts a
//!   message and loses the answer, goes unreachable for minutes, logs the
//!   account out, bans it for a while, expires its uploads;
//! - the operator pauses, resumes, stops and retries runs, pauses and
//!   resumes reminders, edits them, disables and enables accounts and
//!   changes their rate, and recalls or edits runs it sent.
//!
//! A checker that knows only the promises watches the outcome (see
//! [`Checker`]): once per group and part, never over the limit, never
//! outside the window, nothing without an owner, honest counts, every
//! accepted message marked sent and every sent mark accepted, a stop
//! obeyed, receipts counted whole and never over a group ([`receipts`]),
//! recalls and edits of each group once, only of what was sent ([`amend`]).
//! The same seed gives the same trace (its hash is reported).
//!
//! Imports: the whole engine it drives: `cluster`, `delivery`, `domain`,
//! `lifecycle`, `memstore`, `messages`, `ports`, `scheduling`, `simulator`,
//! `supervisor`, `world`.

use crate::delivery::account::{PauseRun, ResumeRun, RetryRun, Snapshot, StopRun};
use crate::delivery::engine::{Engine, EngineConfig, WindowLinks};
use crate::delivery::outcome::message_id;
use crate::delivery::writer::StoreWriter;
use crate::domain::SeededRng;
use crate::domain::*;
use crate::memstore::MemoryStore;
use crate::messages::ReminderChanged;
use crate::ports::*;
use crate::scheduling::scheduler::{SchedulerActor, SchedulerConfig, SchedulerPorts};
use crate::scheduling::window::WindowActor;
use crate::simulator::{Latency, SimConfig, Simulator};
use crate::supervisor::{AccountUpdated, Registry, StartAll, Supervisor};
use crate::world::MemoryMedia;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs one seed to the end on its own actix system and virtual time.
pub fn run_seed(opts: &ChaosOptions) -> ChaosReport {
    let opts = opts.clone();
    // Built inside the system: its clock reads the runtime's paused time.
    crate::world::virtual_time_system().block_on(async move { Chaos::new(opts).run().await })
}

mod amend;
mod faults;
mod gateway;
mod limits;
mod polls;
mod receipts;
mod report;
mod specs;
mod store;
mod timelocks;

pub use faults::Breakage;
use faults::FaultCtl;
use gateway::{ChaosGateway, OnlyChaos, Wire};
pub use report::{ChaosOptions, ChaosReport};
use store::ChaosStore;

// ---------------------------------------------------------------- the world

/// One life of a daemon's engine, from start to crash.
struct Generation {
    /// Its lease keeper's task (several daemons), aborted by a crash.
    keeper: Option<tokio::task::JoinHandle<()>>,
    /// The leases it holds (several daemons).
    table: Option<Arc<crate::delivery::leases::LeaseTable>>,
    ctl: Arc<FaultCtl>,
    store: Arc<dyn Store>,
    supervisor: Addr<Supervisor>,
    scheduler: Addr<SchedulerActor>,
    window: Addr<WindowActor>,
    registry: Registry,
}

/// What the checker needs to know of the operator's doings.
#[derive(Default)]
struct Record {
    /// Per account: (from, messages per minute) in force.
    limits: HashMap<AccountId, Vec<(DateTime<Utc>, u32)>>,
    /// Per run: when the operator's stop was accepted.
    stops: HashMap<RunId, DateTime<Utc>>,
    /// Per reminder: (from, spec) — the spec a run created then sends.
    specs: HashMap<i64, Vec<(DateTime<Utc>, NewReminder)>>,
    /// The first final status each run was seen in.
    finals: HashMap<RunId, RunStatus>,
    /// Runs seen unowned, and since when.
    unowned_since: HashMap<RunId, DateTime<Utc>>,
    /// Per run: retries the operator had accepted (each follows an end).
    retries: HashMap<RunId, u32>,
    /// Per run: when those retries were accepted.
    retried_at: HashMap<RunId, Vec<DateTime<Utc>>>,
    /// WhatsApp's time-locks: (account, from, until).
    timelocks: Vec<(AccountId, DateTime<Utc>, DateTime<Utc>)>,
    /// When a daemon crashed or was cut off (its knowledge of the
    /// account's state may be lost, and its successor learns again).
    disruptions: Vec<DateTime<Utc>>,
}

struct Chaos {
    opts: ChaosOptions,
    rng: SeededRng,
    /// Decides when one account actor stops as a bug would; its own stream
    /// so adding this fault did not change what the other draws replay.
    actor_rng: SeededRng,
    clock: Arc<dyn Clock>,
    mem: Arc<MemoryStore>,
    sim: Arc<Simulator>,
    media: Arc<MemoryMedia>,
    down: Arc<Mutex<HashMap<AccountId, DateTime<Utc>>>>,
    faults: Arc<AtomicU64>,
    /// Each daemon's running generation (`None` while it restarts).
    gens: Vec<Option<Generation>>,
    /// What every daemon's sends reach (see [`Wire`]).
    wire: Arc<Wire>,
    restarts: u32,
    accounts: Vec<AccountId>,
    reminders: Vec<i64>,
    record: Record,
    violations: Vec<String>,
    config: EngineConfig,
    /// The groups' receipts and their counter.
    receipts: receipts::Receipts,
    /// Polls in some reminders, and the members' votes.
    polls: polls::Polls,
    /// The operator's recalls and edits.
    amends: amend::Amends,
}

/// How often the supervisor sweeps for runs without an owner.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Several daemons: how long a lease lasts (the daemon's default).
const LEASE_TTL: Duration = Duration::from_secs(15);

const ZONES: &[&str] = &[
    "UTC",
    "Europe/London",
    "America/New_York",
    "Asia/Kuala_Lumpur",
];

impl Chaos {
    fn new(opts: ChaosOptions) -> Self {
        let mut rng = SeededRng::seed_from_u64(opts.seed);
        let opts_seed = opts.seed;
        // Start near a DST change now and then: London and New York move
        // their clocks on these days in 2026.
        let starts = [
            "2026-03-07T20:00:00Z",
            "2026-03-28T20:00:00Z",
            "2026-10-24T20:00:00Z",
            "2026-06-15T03:00:00Z",
        ];
        let start: DateTime<Utc> = starts[rng.random_range(0..starts.len())]
            .parse()
            .expect("start instant");
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(start));
        let receipts = receipts::Receipts::new(opts.seed);
        let polls = polls::Polls::new(opts.seed);
        let sim = Arc::new(
            Simulator::new(
                SimConfig {
                    latency: Latency::Uniform {
                        min: Duration::from_millis(50),
                        max: Duration::from_millis(400),
                    },
                    upload_bytes_per_sec: Some(2_000_000),
                    rate_limit_per_minute: None,
                    ban_after_refusals: None,
                    seed: rng.random(),
                    receipts: Some(receipts.plan),
                    votes: Some(polls.plan),
                    ..SimConfig::default()
                },
                clock.clone(),
            )
            .with_receipts(receipts.sink.clone()),
        );
        let mut sweep_every = SWEEP_EVERY;
        if opts.breakage == Some(Breakage::NoSweep) {
            sweep_every = Duration::from_secs(365 * 24 * 3600);
        }
        let config = EngineConfig {
            max_per_minute: 40,
            group_concurrency: 3,
            fire_concurrency: 2,
            retry_base: Duration::from_secs(1),
            rate_limit_cooldown: Duration::from_secs(120),
            all_day_horizon: Duration::from_secs(6 * 3600),
            sweep_every,
            health_every: Duration::from_secs(30),
            seed: rng.random(),
            ..EngineConfig::default()
        };
        let nodes = opts.nodes.max(1);
        let wire = Arc::new(Wire {
            sim: sim.clone(),
            unfenced: opts.breakage == Some(Breakage::NoFencing),
            lock_end_hidden: opts.breakage == Some(Breakage::NoTimeLockEnd),
            claims: Mutex::default(),
            stale: Mutex::default(),
            attempts: Mutex::default(),
            learned: Mutex::default(),
        });
        Self {
            actor_rng: SeededRng::seed_from_u64(opts.seed ^ 0xac70_4fa1),
            opts,
            rng,
            mem: Arc::new(MemoryStore::with_clock(clock.clone())),
            clock,
            sim,
            media: Arc::new(MemoryMedia::default()),
            down: Arc::default(),
            faults: Arc::default(),
            gens: (0..nodes).map(|_| None).collect(),
            wire,
            restarts: 0,
            accounts: Vec::new(),
            reminders: Vec::new(),
            record: Record::default(),
            violations: Vec::new(),
            config,
            receipts,
            polls,
            amends: amend::Amends::new(opts_seed),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    fn violation(&mut self, what: String) {
        if self.violations.len() < 20 && !self.violations.contains(&what) {
            self.violations.push(what);
        }
    }

    /// Starts a generation of daemon `node`'s engine over the surviving
    /// store and simulator.
    async fn start_generation(&mut self, node: usize, store_error_rate: f64) {
        let ctl = Arc::new(FaultCtl {
            dead: AtomicBool::new(false),
            stalled_until: Mutex::new(None),
            cut_at_next_send: Mutex::new(None),
            rng: Mutex::new(SeededRng::seed_from_u64(self.rng.random())),
            faults: self.faults.clone(),
            store_error_rate,
        });
        let store: Arc<dyn Store> = Arc::new(ChaosStore {
            inner: self.mem.clone(),
            ctl: ctl.clone(),
            blind_writes: self.opts.breakage == Some(Breakage::NoCompareAndSet),
            event_after_commit: self.opts.breakage == Some(Breakage::EventAfterCommit),
            unfenced: self.wire.unfenced,
        });
        let gateway = Arc::new(ChaosGateway {
            sim: self.sim.clone(),
            ctl: ctl.clone(),
            clock: self.clock.clone(),
            down: self.down.clone(),
            wire: self.wire.clone(),
        });
        let ports = Ports {
            store: store.clone(),
            gateways: Arc::new(OnlyChaos(gateway)),
            media: self.media.clone(),
            clock: self.clock.clone(),
            metrics: Arc::new(NoMetrics),
        };
        let writer = StoreWriter::start(store.clone());
        let config = EngineConfig {
            seed: self.rng.random(),
            ..self.config.clone()
        };
        // Several daemons: accounts are owned through leases.
        let table = (self.opts.nodes > 1)
            .then(|| Arc::new(crate::delivery::leases::LeaseTable::new(format!("n{node}"))));
        // The window actor's address exists before the actor runs: the
        // engine is built whole, and the actor started after the
        // supervisor it tells.
        let window_ctx = Context::<WindowActor>::new();
        let window = window_ctx.address();
        let mut engine = Engine::new(ports.clone(), config, writer).with_window(WindowLinks {
            arm: window.clone().recipient(),
            disarm: window.clone().recipient(),
            park: window.clone().recipient(),
        });
        if let Some(table) = &table {
            engine = engine.with_leases(table.clone());
        }
        let engine = Arc::new(engine);
        let supervisor = Supervisor::new(engine.clone(), vec![]).start();
        window_ctx.run(WindowActor::new(
            SchedulerPorts::from_ports(&ports, engine.events.clone()),
            supervisor.clone().recipient(),
            supervisor.clone().recipient(),
        ));
        let scheduler = SchedulerActor::new(
            SchedulerPorts::from_ports(&ports, engine.events.clone()),
            supervisor.clone().recipient(),
            SchedulerConfig {
                reconcile_every: Duration::from_secs(120),
                ..SchedulerConfig::default()
            },
        )
        .start();
        // The leases kept as the daemon keeps them (joined before the
        // actors start).
        let (keeper, table) = if let Some(table) = table {
            let keeper = Arc::new(crate::cluster::Keeper::new(
                store.clone(),
                table.clone(),
                supervisor.clone(),
                crate::cluster::KeeperConfig::for_ttl(LEASE_TTL),
                Box::new(|_| crate::cluster::Placement::Floating),
            ));
            // A restart may find its old row still live: it is waited out
            // (on virtual time) before the actors start, as the daemon
            // does.
            if let Err(e) = keeper.join(|_| {}).await {
                tracing::info!(target: "chaos", node, error = %e, "join refused");
            }
            (Some(keeper.spawn()), Some(table))
        } else {
            (None, None)
        };
        // A start-up that cannot read the store comes up without handing
        // runs back; the sweep must find them.
        let _ = supervisor.send(StartAll).await;
        let registry = supervisor
            .send(crate::supervisor::GetRegistry)
            .await
            .expect("supervisor alive");
        self.gens[node] = Some(Generation {
            keeper,
            table,
            ctl,
            store,
            supervisor,
            scheduler,
            window,
            registry,
        });
    }

    /// The running generations, by node.
    fn live(&self) -> impl Iterator<Item = &Generation> {
        self.gens.iter().flatten()
    }

    /// A running daemon, to make an operator's change through.
    fn any_gen(&self) -> &Generation {
        self.live().next().expect("a daemon runs")
    }

    /// The daemon that carries `account`: the only one, or the one holding
    /// its lease (none while it changes hands).
    fn owner_of(&self, account: &AccountId) -> Option<&Generation> {
        self.live()
            .find(|g| g.table.as_ref().is_none_or(|t| t.holds(account)))
    }

    /// The account's actor on the daemon that carries it, if any: where
    /// the control port sends an operator's run action.
    fn actor_of(
        &self,
        account: &AccountId,
    ) -> Option<Addr<crate::delivery::account::AccountActor>> {
        self.owner_of(account)
            .and_then(|g| g.registry.get(account).map(|a| a.value().clone()))
    }

    /// Tells every daemon an account changed (its owner's actor acts on it).
    fn account_changed(&self, account: &AccountId) {
        for g in self.live() {
            g.supervisor.do_send(AccountUpdated(account.clone()));
        }
    }

    /// Tells every daemon's scheduler a reminder changed.
    fn reminder_changed(&self, reminder_id: i64) {
        for g in self.live() {
            g.scheduler.do_send(ReminderChanged { reminder_id });
        }
    }

    /// Kills one daemon's running generation (the only one's, alone): its
    /// pending calls never return. It restarts after a while.
    async fn crash_and_restart(&mut self, store_error_rate: f64) {
        let node = if self.gens.len() > 1 {
            self.rng.random_range(0..self.gens.len())
        } else {
            0
        };
        if let Some(g) = self.gens[node].take() {
            // Its calls in flight never return; its actors and timers stop.
            g.ctl.dead.store(true, Ordering::SeqCst);
            if let Some(k) = &g.keeper {
                k.abort();
            }
            g.supervisor.do_send(crate::supervisor::Terminate);
            g.scheduler.do_send(crate::scheduling::scheduler::Shutdown);
            g.window.do_send(crate::scheduling::window::StopTimers);
        }
        self.restarts += 1;
        self.record.disruptions.push(self.now());
        tracing::info!(target: "chaos", at = %self.now(), node, "crash");
        // A restart takes a moment; the clock moves on.
        tokio::time::sleep(Duration::from_secs(self.rng.random_range(1..120))).await;
        self.start_generation(node, store_error_rate).await;
    }

    /// Several daemons: one is cut off from the store and WhatsApp for a
    /// while (a pause, a partition). Its leases lapse and others take its
    /// accounts; what it had under way resumes late, under a stale fence.
    fn stall_node(&mut self) {
        let node = self.rng.random_range(0..self.gens.len());
        let secs = self.rng.random_range(10..180);
        let on_a_send = self.rng.random_bool(0.5);
        if let Some(g) = &self.gens[node] {
            self.faults.fetch_add(1, Ordering::Relaxed);
            self.record.disruptions.push(self.now());
            tracing::info!(target: "chaos", at = %self.now(), node, secs, on_a_send, "daemon cut off");
            let cut = Duration::from_secs(secs);
            if on_a_send {
                // Half the time while a send of it is on the wire: the case
                // fencing at WhatsApp is for.
                *g.ctl.cut_at_next_send.lock().expect("cut") = Some(cut);
            } else {
                *g.ctl.stalled_until.lock().expect("stall") =
                    Some(tokio::time::Instant::now() + cut);
            }
        }
    }

    async fn setup(&mut self) {
        let n_accounts = self.rng.random_range(1..=3);
        let image = self.media.insert(vec![7u8; 200_000]);
        self.mem
            .put_media(&MediaInfo {
                id: image.clone(),
                mime: "image/jpeg".into(),
                size: 200_000,
                filename: None,
                created_at: self.now(),
            })
            .await
            .expect("media");
        for i in 0..n_accounts {
            let id = AccountId::parse(&format!("acct{i}")).expect("id");
            let per_minute = [6u32, 20, 40][self.rng.random_range(0..3)];
            let groups = self.sim.add_numbered_groups(&id, 80);
            self.mem
                .create_account(
                    &crate::ports::NewAccount {
                        id: id.clone(),
                        name: id.to_string(),
                        kind: GatewayKind::Simulator,
                        state: AccountState::Connected,
                        limits: AccountLimits {
                            max_per_minute: Some(per_minute),
                            ..Default::default()
                        },
                    },
                    self.now(),
                )
                .await
                .expect("account");
            self.record
                .limits
                .insert(id.clone(), vec![(self.now(), per_minute)]);
            for _ in 0..self.rng.random_range(1..=3) {
                let spec = self.random_spec(&id, &groups, &image);
                let r = self
                    .mem
                    .create_reminder(&spec, self.now())
                    .await
                    .expect("reminder");
                self.record
                    .specs
                    .insert(r.id, vec![(self.now() - chrono::Duration::days(1), spec)]);
                self.reminders.push(r.id);
            }
            self.accounts.push(id);
        }
    }

    async fn run(mut self) -> ChaosReport {
        let store_error_rate = [0.0, 0.005, 0.02][self.rng.random_range(0..3)];
        self.setup().await;
        self.receipts.start(self.mem.clone());
        for node in 0..self.gens.len() {
            self.start_generation(node, store_error_rate).await;
        }
        let end = self.now() + chrono::Duration::hours(i64::from(self.opts.hours));
        while self.now() < end {
            let step = Duration::from_secs(self.rng.random_range(5..240));
            tokio::time::sleep(step).await;
            self.check_live().await;
            if self.actor_rng.random_bool(0.01) {
                self.actor_crash();
            }
            self.receipts.maybe_fault(&self.mem);
            let roll = self.rng.random_range(0..1000);
            match roll {
                0..=6 => self.crash_and_restart(store_error_rate).await,
                7..=60 => self.operator_run_action().await,
                61..=75 => self.operator_reminder_action().await,
                76..=95 => self.operator_account_action().await,
                96..=130 => self.gateway_fault(),
                131..=140 if self.gens.len() > 1 => self.stall_node(),
                _ => {}
            }
            if self.amends.due() {
                self.operator_amend().await;
            }
        }
        self.settle().await;
        self.check_final().await;
        // The last votes come a while after the last send; the receipt
        // check then counts what is waiting.
        tokio::time::sleep(self.polls.settle()).await;
        let broken = self.receipts.check(&self.mem).await;
        broken.into_iter().for_each(|b| self.violation(b));
        let broken = self.polls.check(&self.mem, &self.sim).await;
        broken.into_iter().for_each(|b| self.violation(b));
        self.report().await
    }

    /// Heals everything and lets the engine finish what it can.
    async fn settle(&mut self) {
        // A last crash, so recovery is always exercised, then no faults.
        self.crash_and_restart(0.0).await;
        self.down.lock().expect("down").clear();
        for a in self.accounts.clone() {
            self.sim.reconnect(&a);
            if let Ok(acc) = self
                .mem
                .set_account_state(&a, AccountState::Connected, None)
                .await
            {
                let _ = acc;
            }
            self.account_changed(&a);
        }
        // Pause the reminders so no new runs start; let the rest end.
        for id in self.reminders.clone() {
            let _ = self
                .mem
                .set_reminder_state(id, ReminderState::Paused, self.now())
                .await;
            self.reminder_changed(id);
        }
        // The operator resumes what they paused, so every run ends.
        tokio::time::sleep(Duration::from_secs(5)).await;
        self.resume_paused().await;
        // Long enough for a parked run's next window and an all-day
        // run's horizon; done early once nothing is left to do.
        for _ in 0..(40 * 6) {
            tokio::time::sleep(Duration::from_secs(600)).await;
            self.check_live().await;
            let runs = self
                .mem
                .list_runs(&RunFilter::default())
                .await
                .unwrap_or_default();
            if runs
                .iter()
                .all(|r| r.status.is_final() || r.status == RunStatus::Scheduled)
                && self.amends.all_finished(&self.mem).await
            {
                break;
            }
            // A resume that found its account changing hands (the control
            // port answers "moving") is asked again, as an operator would.
            self.resume_paused().await;
        }
    }

    /// Resumes every paused run through the daemon carrying its account.
    async fn resume_paused(&self) {
        let paused = self
            .mem
            .list_runs(&RunFilter {
                status: Some(RunStatus::Paused),
                ..Default::default()
            })
            .await
            .unwrap_or_default();
        for run in paused {
            if let Some(addr) = self.actor_of(&run.account_id) {
                let _ = addr.send(ResumeRun { run_id: run.id }).await;
            }
        }
    }

    /// One account actor stops, as a bug would stop it: the supervisor
    /// restarts it and hands its runs back (or the sweep does, if the
    /// store fails it then).
    fn actor_crash(&mut self) {
        let a = self.accounts[self.actor_rng.random_range(0..self.accounts.len())].clone();
        if let Some(addr) = self.actor_of(&a) {
            tracing::info!(target: "chaos", at = %self.now(), account = %a, "actor crash");
            self.faults.fetch_add(1, Ordering::Relaxed);
            addr.do_send(crate::delivery::account::InjectFault { panic: false });
        }
    }

    fn pick_account(&mut self) -> AccountId {
        self.accounts[self.rng.random_range(0..self.accounts.len())].clone()
    }

    fn gateway_fault(&mut self) {
        let a = self.pick_account();
        self.faults.fetch_add(1, Ordering::Relaxed);
        match self.rng.random_range(0..10) {
            0..=4 => {
                let mins = self.rng.random_range(1..20);
                let until = self.now() + chrono::Duration::minutes(mins);
                self.down.lock().expect("down").insert(a, until);
            }
            5 | 6 => self.sim.expire_uploads(&a),
            7 => self.sim.log_out(&a),
            8 => self
                .sim
                .ban_for(&a, Duration::from_secs(self.rng.random_range(300..3600))),
            // WhatsApp time-locks the account's reach-out: sends are
            // refused with 463 until its end, which it says when asked.
            _ => {
                let (from, mins) = (self.now(), self.rng.random_range(1..40));
                let until = from + chrono::Duration::minutes(mins);
                self.sim.time_lock(&a, until);
                tracing::info!(target: "chaos", at = %from, account = %a, %until, "time-lock");
                self.record.timelocks.push((a, from, until));
            }
        }
    }

    /// The operator re-pairs, disables, enables or changes an account's rate.
    async fn operator_account_action(&mut self) {
        let a = self.pick_account();
        let store = self.any_gen().store.clone();
        match self.rng.random_range(0..4) {
            0 => {
                self.sim.reconnect(&a);
                let _ = store
                    .set_account_state(&a, AccountState::Connected, None)
                    .await;
            }
            1 => {
                let _ = store
                    .set_account_state(&a, AccountState::Disabled, Some("disabled by operator"))
                    .await;
            }
            2 => {
                let _ = store
                    .set_account_state(&a, AccountState::Connected, None)
                    .await;
            }
            _ => {
                let per_minute = [3u32, 10, 30, 60][self.rng.random_range(0..4)];
                let limits = AccountLimits {
                    max_per_minute: Some(per_minute),
                    ..Default::default()
                };
                if store.update_account_limits(&a, &limits).await.is_ok() {
                    let at = self.now();
                    tracing::info!(target: "chaos", %at, account = %a, per_minute, "limit changed");
                    self.record
                        .limits
                        .entry(a.clone())
                        .or_default()
                        .push((at, per_minute));
                }
            }
        }
        self.account_changed(&a);
    }

    async fn operator_reminder_action(&mut self) {
        let id = self.reminders[self.rng.random_range(0..self.reminders.len())];
        let store = self.any_gen().store.clone();
        match self.rng.random_range(0..3) {
            0 => {
                let _ = store
                    .set_reminder_state(id, ReminderState::Paused, self.now())
                    .await;
            }
            1 => {
                let _ = store
                    .set_reminder_state(id, ReminderState::Active, self.now())
                    .await;
            }
            _ => {
                // An edit: new text and groups; refused while a run of it is under way.
                let Some(r) = self.mem.get_reminder(id).await.ok().flatten() else {
                    return;
                };
                let groups = self.sim_groups(&r.spec.account_id);
                let image = self.media_id();
                let mut spec = self.random_spec(&r.spec.account_id, &groups, &image);
                spec.schedule = r.spec.schedule.clone();
                let at = self.now();
                if store.update_reminder(id, &spec, at).await.is_ok() {
                    self.record.specs.entry(id).or_default().push((at, spec));
                }
            }
        }
        self.reminder_changed(id);
    }

    fn sim_groups(&self, a: &AccountId) -> Vec<GroupJid> {
        let _ = a;
        (1..=80).map(Simulator::numbered_group).collect()
    }

    fn media_id(&self) -> MediaId {
        MediaId::of_bytes(&vec![7u8; 200_000])
    }

    async fn operator_run_action(&mut self) {
        let runs = self
            .mem
            .list_runs(&RunFilter {
                limit: 20,
                ..Default::default()
            })
            .await
            .unwrap_or_default();
        if runs.is_empty() {
            return;
        }
        let run = runs[self.rng.random_range(0..runs.len())].clone();
        // Through the daemon that carries the account (the control port
        // forwards there); none while it changes hands.
        let Some(addr) = self.actor_of(&run.account_id) else {
            return;
        };
        let roll = self.rng.random_range(0..10);
        let stopped = match roll {
            0..=3 => {
                let _ = addr.send(PauseRun { run_id: run.id }).await;
                false
            }
            4..=6 => {
                let _ = addr.send(ResumeRun { run_id: run.id }).await;
                false
            }
            7 | 8 => matches!(addr.send(StopRun { run_id: run.id }).await, Ok(Ok(()))),
            _ => {
                if let Ok(Ok(_)) = addr.send(RetryRun { run_id: run.id }).await {
                    self.record.finals.remove(&run.id);
                    self.record.stops.remove(&run.id);
                    *self.record.retries.entry(run.id).or_default() += 1;
                    let at = self.now();
                    self.record.retried_at.entry(run.id).or_default().push(at);
                }
                false
            }
        };
        tracing::info!(target: "chaos", at = %self.now(), run = %run.id, status = %run.status, roll, stopped, "operator run action");
        if stopped {
            let at = self.now();
            self.record.stops.entry(run.id).or_insert(at);
        }
    }

    /// The operator recalls or edits one of the newest runs (a run still
    /// under way is stopped by it: its stop is then held to, as any).
    async fn operator_amend(&mut self) {
        let runs = self
            .mem
            .list_runs(&RunFilter {
                limit: 20,
                ..Default::default()
            })
            .await
            .unwrap_or_default();
        let actors: HashMap<AccountId, Addr<crate::delivery::account::AccountActor>> = self
            .accounts
            .iter()
            .filter_map(|a| Some((a.clone(), self.actor_of(a)?)))
            .collect();
        let now = self.now();
        let asked = self
            .amends
            .ask(&runs, |a| actors.get(a).cloned(), now)
            .await;
        if let Some(asked) = asked.filter(|a| a.stopped) {
            self.record.stops.entry(asked.run).or_insert(now);
        }
    }

    // ------------------------------------------------------------ checks

    /// Invariants that hold at every instant.
    async fn check_live(&mut self) {
        let now = self.now();
        let runs = self
            .mem
            .list_runs(&RunFilter::default())
            .await
            .unwrap_or_default();
        // Who carries what, in the live generation.
        let mut owned: HashMap<RunId, ()> = HashMap::new();
        let addrs: Vec<_> = {
            let mut v: Vec<_> = self
                .live()
                .flat_map(|g| {
                    g.registry
                        .iter()
                        .map(|e| (e.key().clone(), e.value().clone()))
                })
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        for (_, addr) in addrs {
            if let Ok(snap) = addr.send(Snapshot).await {
                for r in snap.queued.into_iter().chain(snap.current_run) {
                    owned.insert(r, ());
                }
            }
        }
        let limit =
            // The promise is the working engine's sweep period, whatever a
            // deliberately broken one is configured with.
            chrono::Duration::from_std(SWEEP_EVERY * 3 + Duration::from_secs(300))
                .unwrap_or_default();
        for run in &runs {
            // A run ends once: only a retry (which the record forgets the
            // end for) may take it out of its final status.
            match (
                self.record.finals.get(&run.id).copied(),
                run.status.is_final(),
            ) {
                (None, true) => {
                    self.record.finals.insert(run.id, run.status);
                }
                (Some(first), true) if first != run.status => self.violation(format!(
                    "run {} finished twice: {first}, then {}",
                    run.id, run.status
                )),
                (Some(first), false) => self.violation(format!(
                    "run {} left its final status {first} for {}",
                    run.id, run.status
                )),
                _ => {}
            }
            let needs_owner = crate::lifecycle::is_owned_by_account(run.status);
            if needs_owner && !owned.contains_key(&run.id) {
                let since = *self.record.unowned_since.entry(run.id).or_insert(now);
                if now - since > limit {
                    self.violation(format!(
                        "run {} is {} with no owner since {since}",
                        run.id, run.status
                    ));
                }
            } else {
                self.record.unowned_since.remove(&run.id);
            }
        }
    }

    /// The lowest limit in force for `account` at `t` (a lowering counts
    /// from a second after the operator made it: the actor hears of it).
    fn limit_at(&self, account: &AccountId, t: DateTime<Utc>) -> u32 {
        let changes = &self.record.limits[account];
        let mut current = changes[0].1;
        for (i, (from, l)) in changes.iter().enumerate() {
            if i == 0 {
                continue;
            }
            let effective = if *l < current {
                *from + chrono::Duration::seconds(1)
            } else {
                *from
            };
            if effective <= t {
                current = *l;
            }
        }
        current
    }

    fn spec_at(&self, reminder: i64, t: DateTime<Utc>) -> Option<&NewReminder> {
        self.record
            .specs
            .get(&reminder)?
            .iter()
            .rev()
            .find(|(from, _)| *from <= t)
            .map(|(_, s)| s)
    }

    /// Invariants checked once everything has settled.
    async fn check_final(&mut self) {
        // (h) several daemons: once a new owner claimed an account at
        // WhatsApp, nothing the old owner still had under way lands.
        let stale: Vec<String> = std::mem::take(&mut *self.wire.stale.lock().expect("stale"));
        for s in stale {
            self.violation(s);
        }
        self.check_timelocks();
        let runs = self
            .mem
            .list_runs(&RunFilter::default())
            .await
            .unwrap_or_default();
        self.check_events(&runs).await;
        let log = self.sim.log();
        // message id → (run, group, part, target)
        let mut ids: HashMap<String, (Run, RunTarget, u32)> = HashMap::new();
        let mut accepted: HashMap<&str, usize> = HashMap::new();
        for d in &log {
            *accepted.entry(d.message_id.as_str()).or_default() += 1;
        }
        for run in &runs {
            let targets = self
                .mem
                .list_targets(run.id, None, None, 0)
                .await
                .unwrap_or_default();
            let spec = self.spec_at(run.reminder_id, run.created_at).cloned();
            let parts = spec.as_ref().map_or(1, |s| s.parts.len() as u32);
            // (e) honest ends: a finished run has only finished targets, counts true.
            let mut recount = TargetCounts::default();
            for t in &targets {
                recount.add(t.status, 1);
                for p in 0..parts {
                    ids.insert(message_id(run.id, &t.group, p), (run.clone(), t.clone(), p));
                }
            }
            if recount != run.counts {
                self.violation(format!(
                    "run {} counts {:?} but its targets say {:?}",
                    run.id, run.counts, recount
                ));
            }
            if run.status.is_final() && recount.pending + recount.sending > 0 {
                self.violation(format!(
                    "run {} is {} with unfinished targets {:?}",
                    run.id, run.status, recount
                ));
            }
            // (d) nothing stranded once everything settled (and resumed).
            if !run.status.is_final() && run.status != RunStatus::Scheduled {
                self.violation(format!(
                    "run {} still {} after everything settled",
                    run.id, run.status
                ));
            }
            // (f) every sent mark was accepted, every part of it.
            for t in &targets {
                if t.status == TargetStatus::Sent {
                    for p in 0..parts {
                        if !accepted.contains_key(message_id(run.id, &t.group, p).as_str()) {
                            self.violation(format!(
                                "run {} group {} part {p} marked sent but never accepted",
                                run.id, t.group
                            ));
                        }
                    }
                }
            }
        }
        let mut by_account: BTreeMap<AccountId, Vec<&crate::simulator::Delivery>> = BTreeMap::new();
        for d in &log {
            // Revokes and edits too: they count against the limit.
            by_account.entry(d.account.clone()).or_default().push(d);
            // (a) once per group and part; no id Herald did not derive.
            if accepted[d.message_id.as_str()] > 1 {
                self.violation(format!(
                    "message {} delivered {} times",
                    d.message_id,
                    accepted[d.message_id.as_str()]
                ));
            }
            // (j) an amendment's own promises are checked below.
            if d.content.amends().is_some() {
                continue;
            }
            let Some((run, target, part)) = ids.get(&d.message_id).cloned() else {
                self.violation(format!(
                    "message {} to {} belongs to no run target",
                    d.message_id, d.group
                ));
                continue;
            };
            if target.group != d.group {
                self.violation(format!(
                    "message {} went to {} not {}",
                    d.message_id, d.group, target.group
                ));
            }
            // (f) every accepted message is marked sent (or its loss is said).
            let said = target
                .error
                .as_deref()
                .is_some_and(|e| e.ends_with(crate::lifecycle::MAYBE_DELIVERED));
            let marked = target.status == TargetStatus::Sent || part < target.parts_sent;
            if !marked && !said {
                self.violation(format!(
                    "run {} group {} accepted message {} but the target is {} ({:?}); the run is {} ({:?})",
                    run.id, d.group, d.message_id, target.status, target.error, run.status, run.error_summary
                ));
            }
            // (c) never outside the run's window.
            if let Some(spec) = self.spec_at(run.reminder_id, run.created_at) {
                let end = run.window_end_at.unwrap_or(d.at);
                let inside = spec.window.is_all_day()
                    || spec
                        .window
                        .span_at_or_after(&spec.timezone, d.at)
                        .contains(d.at);
                if d.at < run.scheduled_for || d.at >= end || !inside {
                    self.violation(format!(
                        "run {} sent {} at {} outside its window (scheduled {}, ends {:?}, {}–{} {})",
                        run.id, d.message_id, d.at, run.scheduled_for, run.window_end_at,
                        spec.window.start_hour(), spec.window.end_hour(), spec.timezone
                    ));
                }
            }
            // (g) a stop is obeyed within the sends already in flight.
            if let Some(stop) = self.record.stops.get(&run.id) {
                if d.at > *stop + chrono::Duration::seconds(5) {
                    self.violation(format!(
                        "run {} sent {} at {} after its stop at {stop}",
                        run.id, d.message_id, d.at
                    ));
                }
            }
        }
        let broken = self
            .amends
            .check(&self.mem, &log, &self.record.retried_at)
            .await;
        broken.into_iter().for_each(|b| self.violation(b));
        // (b) never over the limit in force, in any 60 s window.
        let broken = limits::over_the_limit(by_account, |a, t| self.limit_at(a, t));
        broken.into_iter().for_each(|b| self.violation(b));
    }

    /// (i) nothing lost between a state change and its event: a run that
    /// ended has one `run_finished` event per end (its first, and one per
    /// retry the operator had accepted since), whatever crashed or failed
    /// right after the end committed; a missed run has one `run_missed`.
    async fn check_events(&mut self, runs: &[Run]) {
        let events = match self.mem.events_after(0, 0).await {
            Ok(e) => e,
            Err(e) => return self.violation(format!("could not read the events: {e}")),
        };
        let mut told: HashMap<(i64, &str), u32> = HashMap::new();
        for e in &events {
            if let Some(run) = e.run_id {
                *told.entry((run, e.kind.as_str())).or_default() += 1;
            }
        }
        for run in runs {
            let retries = self.record.retries.get(&run.id).copied().unwrap_or(0);
            let (kind, want) = match run.status {
                RunStatus::Missed => ("run_missed", 1),
                s if s.is_final() => ("run_finished", retries + 1),
                _ => ("run_finished", retries),
            };
            let got = told.get(&(run.id.0, kind)).copied().unwrap_or(0);
            if got != want {
                self.violation(format!(
                    "run {} is {} after {retries} retries with {got} {kind} events (expected {want})",
                    run.id, run.status
                ));
            }
        }
    }

    async fn report(&self) -> ChaosReport {
        let log = self.sim.log();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for d in &log {
            (
                d.account.as_str(),
                &d.message_id,
                d.group.as_str(),
                d.at.timestamp_micros(),
            )
                .hash(&mut h);
        }
        let runs = self
            .mem
            .list_runs(&RunFilter::default())
            .await
            .unwrap_or_default();
        for r in &runs {
            (r.id.0, r.status.as_str(), r.counts.sent).hash(&mut h);
        }
        let resends = self
            .accounts
            .iter()
            .map(|a| self.sim.stats(a).dedup_hits)
            .sum();
        ChaosReport {
            seed: self.opts.seed,
            nodes: self.gens.len(),
            violations: self.violations.clone(),
            runs: runs.len(),
            sends: log.len() as u64,
            resends,
            restarts: self.restarts,
            faults: self.faults.load(Ordering::Relaxed),
            owners: log
                .iter()
                .filter_map(|d| d.fence.as_ref())
                .collect::<std::collections::HashSet<_>>()
                .len(),
            amendments: self.amends.asked(),
            receipts_counted: self.receipts.counted(),
            receipts_uncounted: self.receipts.uncounted(),
            votes_counted: self.receipts.votes_counted(),
            trace: h.finish(),
        }
    }
}
