//! Builds the whole daemon — store, actors, control port — as one
//! `Application` that `main` and the tests start the same way.

use crate::daemon;
use crate::gateway::remote_sim::RemoteSimulator;
use crate::http;
use crate::media::FileMedia;
use crate::metrics::PromMetrics;
use crate::service::Service;
use crate::settings::{Secret, Settings};
use crate::state::AppState;
use crate::store::SqlStore;
use actix::prelude::*;
use actix_web::dev::{Server, ServerHandle};
use anyhow::Context;
use herald_actors::cluster::{Keeper, KeeperConfig};
use herald_actors::delivery::engine::{Engine, EngineConfig, TypingConfig};
use herald_actors::delivery::leases::LeaseTable;
use herald_actors::delivery::receipts::{CounterConfig, CounterHandle};
use herald_actors::delivery::writer::StoreWriter;
use herald_actors::domain::{Account, GatewayKind, ReceiptKind};
use herald_actors::ports::*;
use herald_actors::scheduling::scheduler::{SchedulerActor, SchedulerConfig, SchedulerPorts};
use herald_actors::simulator::{Latency, SimConfig, SimReceipts, SimVotes, Simulator};
use herald_actors::supervisor::{Door, Supervisor};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The gateways this build has: the simulator always; WhatsApp Web with
/// the `whatsapp` feature (without it, runs of `whatsapp` accounts fail
/// saying so).
struct DaemonGateways {
    /// This daemon's simulator, or the shared one (`simulator.url`).
    simulator: Arc<dyn Gateway>,
    #[cfg(feature = "whatsapp")]
    whatsapp: crate::gateway::whatsapp::WhatsappGateway,
}

impl GatewayRegistry for DaemonGateways {
    fn gateway(&self, kind: GatewayKind) -> Option<Arc<dyn Gateway>> {
        match kind {
            GatewayKind::Simulator => Some(self.simulator.clone()),
            #[cfg(feature = "whatsapp")]
            GatewayKind::Whatsapp => Some(Arc::new(self.whatsapp.clone())),
            #[cfg(not(feature = "whatsapp"))]
            GatewayKind::Whatsapp => None,
        }
    }
}

pub struct Application {
    port: u16,
    server: Server,
    handle: ServerHandle,
    state: AppState,
    token: Option<Secret>,
    pruner: AbortOnDrop,
    /// Posts webhook deliveries, apart from the delivery engine.
    webhooks: AbortOnDrop,
    /// Counts the runs this daemon ends, for `/metrics`.
    outcomes: AbortOnDrop,
    /// Several daemons: renews this daemon's account leases.
    keeper: Option<(Arc<Keeper>, AbortOnDrop)>,
    /// Counts the receipts the gateways hear.
    receipts: CounterHandle,
    /// Reports each run's receipts once they settle.
    reporter: AbortOnDrop,
    /// Held while the daemon runs: one daemon per database (without leases).
    _db_lock: Option<crate::store::DaemonLock>,
}

/// A background task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Application {
    /// Opens (and migrates) the database, starts the actors and binds the
    /// control port. Port 0 picks a free port (tests). Call inside an actix
    /// System.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let data_dir = settings.storage.data_dir.clone();
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("creating data dir {}", data_dir.display()))?;
        // A token source that yields nothing has already stopped
        // `Settings::load`; on the first start the token is generated here.
        let token = crate::token::for_daemon(&settings)?;
        let db_lock = lock_database(&settings).await?;
        let opened = open_store(&settings).await?;
        // Several daemons: the leases this one holds, known to everything
        // that acts for an account from the moment it is built.
        let leases = settings.cluster.enabled.then(|| {
            Arc::new(LeaseTable::new(settings.node_id()).with_suspend_clock(crate::boottime::now))
        });
        let (receipt_sink, receipt_inbox) = ReceiptSink::channel(RECEIPT_BACKLOG);
        let sims = Simulators::start(&settings, &data_dir, &receipt_sink)?;
        let parts = Parts::build(
            &settings,
            &data_dir,
            opened,
            &sims,
            leases.as_ref(),
            receipt_sink,
        )?;
        let receipts = herald_actors::delivery::receipts::spawn(
            receipt_inbox,
            parts.ports.store.clone(),
            parts.ports.metrics.clone(),
            CounterConfig::default(),
        );
        let actors = Actors::start(&parts.ports, &settings, leases.clone()).await?;
        let settings = Arc::new(settings);
        let addr = settings.listen_addr()?;
        let listener =
            TcpListener::bind(addr).with_context(|| format!("binding control port {addr}"))?;
        let port = listener.local_addr()?.port();
        // Built before the state: a request that only an account's owner
        // can serve (pairing) takes a free lease through it.
        let cluster =
            leases.map(|table| keeper(&settings, &parts.ports, &actors, table, addr, port));
        let state = app_state(settings, &parts, sims, actors, &token, &cluster);
        let accounts = state.store.list_accounts().await?;
        register_simulated(&state, &accounts).await?;
        #[cfg(feature = "whatsapp")]
        start_whatsapp(&state, &accounts, &data_dir, parts, &cluster).await?;
        let keeper = match cluster {
            Some(keeper) => {
                join_cluster(&keeper, &listener).await?;
                tracing::info!(node = %keeper.table().node(), "cluster: account leases on");
                let task = AbortOnDrop(keeper.clone().spawn());
                Some((keeper, task))
            }
            None => None,
        };
        let resumed = state.door.start_all().await??;
        let (pruner, webhooks, outcomes, reporter) = background(&state)?;
        // Directories catch up with what changed while the daemon was down.
        state.groups.sync_connected_in_background();
        let server = http::server(
            Service::new(state.clone()),
            state.store.clone(),
            listener,
            token.clone(),
        )?;
        let handle = server.handle();
        tracing::info!(%addr, port, backend = state.store.backend(), resumed, "control port bound");
        Ok(Self {
            port,
            server,
            handle,
            state,
            token,
            pruner,
            webhooks,
            outcomes,
            keeper,
            receipts,
            reporter,
            _db_lock: db_lock,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The bearer token `/v1` requires (`None` only with `control.token = "none"`).
    pub fn token(&self) -> Option<&Secret> {
        self.token.as_ref()
    }

    /// Serves until SIGTERM or SIGINT, then drains and returns.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Self {
            port,
            server,
            handle,
            state,
            token: _,
            pruner,
            webhooks,
            outcomes,
            keeper,
            receipts,
            reporter,
            // Held until the last mark is flushed and the process exits.
            _db_lock: _held,
        } = self;
        let server = tokio::spawn(server);
        state.ready.store(true, Ordering::SeqCst);
        // The listener was bound in `build`, so the port answers from here.
        daemon::notify_ready(&format!("serving on port {port}"));
        let watchdog = daemon::spawn_watchdog(state.clone());
        shutdown_signal().await;
        tracing::info!("shutdown requested: draining");
        state.ready.store(false, Ordering::SeqCst);
        daemon::notify_stopping();
        state
            .scheduler
            .do_send(herald_actors::scheduling::scheduler::Shutdown);
        drop(pruner);
        drop(reporter);
        // Attempts in flight finish or lapse; their deliveries are retried.
        drop(webhooks);
        let grace = state.settings.drain_grace();
        if tokio::time::timeout(grace, state.door.drain_all())
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "parts still in flight after the grace period; they resume on restart"
            );
        }
        // Marks posted by the last parts reach the database before exit.
        if let Err(e) = state.engine.writer.flush().await {
            tracing::error!(error = %e, "final flush failed");
        }
        drop(outcomes);
        // The WhatsApp clients flush their session state while this daemon
        // still holds the leases those writes are fenced by.
        #[cfg(feature = "whatsapp")]
        state.whatsapp.shutdown().await;
        // No client hears receipts any more: count those still waiting.
        let counted = receipts.finish().await;
        tracing::info!(
            delivered = counted.counted(ReceiptKind::Delivered),
            read = counted.counted(ReceiptKind::Read),
            "receipts counted while serving"
        );
        // With every mark stored, the leases go: the other daemons take
        // the accounts over at their next round instead of after expiry.
        if let Some((keeper, task)) = keeper {
            drop(task);
            keeper.leave().await;
            tracing::info!("cluster: account leases handed over");
        }
        handle.stop(true).await;
        server.await.context("control port task")??;
        if let Some(w) = watchdog {
            w.abort();
        }
        tracing::info!("stopped cleanly");
        Ok(())
    }
}

/// Every account goes to any daemon: a WhatsApp account's session lives in
/// the shared database, so whichever daemon holds its lease logs it in.
fn placer() -> herald_actors::cluster::Placer {
    Box::new(|_| herald_actors::cluster::Placement::Floating)
}

pub fn engine_config(s: &Settings) -> EngineConfig {
    let d = &s.delivery;
    EngineConfig {
        max_per_minute: d.max_per_minute,
        group_concurrency: d.group_concurrency,
        fire_concurrency: d.fire_concurrency,
        jitter_min: Duration::from_millis(d.jitter_min_ms),
        jitter_max: Duration::from_millis(d.jitter_max_ms),
        max_attempts: d.max_attempts,
        retry_base: Duration::from_millis(d.retry_base_ms),
        rate_limit_factor: d.rate_limit_factor,
        rate_limit_cooldown: Duration::from_secs(d.rate_limit_cooldown_secs),
        pace_jitter: d.pace_jitter,
        pace_slack: d.pace_slack,
        typing: TypingConfig {
            enabled: d.typing,
            max: Duration::from_millis(d.typing_max_ms),
            ..TypingConfig::default()
        },
        // Runs fired by another daemon's scheduler reach an account's
        // owner through this sweep.
        sweep_every: if s.cluster.enabled {
            (s.lease_ttl() / 3).max(Duration::from_secs(1))
        } else {
            EngineConfig::default().sweep_every
        },
        // Checked when the settings were loaded.
        warmup: s.warmup().ok().flatten(),
        warmup_all: s.delivery.warmup_all_accounts,
        amend_windows: herald_actors::domain::AmendWindows {
            recall: Duration::from_secs(s.recall.window_secs),
            edit: Duration::from_secs(s.recall.edit_window_secs),
        },
        standing_every: Duration::from_secs(s.whatsapp.standing_every_secs),
        ..EngineConfig::default()
    }
}

pub fn scheduler_config(s: &Settings) -> SchedulerConfig {
    SchedulerConfig {
        late_fire_grace: Duration::from_secs(s.scheduler.late_fire_grace_secs),
        reconcile_every: Duration::from_secs(s.scheduler.reconcile_secs),
        missed_cap: s.scheduler.missed_cap as usize,
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The accepted WhatsApp message ids retention prunes, if this build has
/// the WhatsApp gateway.
fn accepted_rows(state: &AppState) -> Option<crate::store::whatsapp::WaRows> {
    #[cfg(feature = "whatsapp")]
    return state.whatsapp.session_rows();
    #[cfg(not(feature = "whatsapp"))]
    {
        let _ = state;
        None
    }
}

// ---------------------------------------------------------------- steps
// `Application::build`'s steps, in the order the daemon's parts depend on
// each other: the store, the simulators, the ports, the actors, the state.

/// With leases several daemons share the database; without, a second one
/// is refused.
async fn lock_database(settings: &Settings) -> anyhow::Result<Option<crate::store::DaemonLock>> {
    Ok(if settings.cluster.enabled {
        Some(crate::store::DaemonLock::for_cluster(&settings.database_url()).await?)
    } else {
        crate::store::DaemonLock::for_url(&settings.database_url()).await?
    })
}

/// The opened, migrated store with its session key.
struct Opened {
    store: Arc<dyn Store>,
    #[cfg(feature = "whatsapp")]
    wa_sessions: crate::gateway::whatsapp::store::SessionStore,
}

async fn open_store(settings: &Settings) -> anyhow::Result<Opened> {
    let sql = SqlStore::connect(&settings.database_url())
        .await
        .context("opening the database")?;
    // WhatsApp sessions and webhook secrets live in the database, sealed:
    // without the key the database records, start-up stops here (and the
    // first start records this one's).
    let key = crate::seal::key_file::open_key(&settings.session_key_path(), &sql.sealed()).await?;
    let sql = sql.with_secret_key(&key);
    let sealed = sql
        .seal_plaintext_webhook_secrets()
        .await
        .context("sealing the webhook secrets of an older version")?;
    if sealed > 0 {
        tracing::info!(
            webhooks = sealed,
            "sealed the webhook secrets an older version kept in plain text"
        );
    }
    let bound = sql
        .bind_webhook_secrets()
        .await
        .context("binding the webhook secrets of an older version to their place")?;
    if bound > 0 {
        tracing::info!(
            secrets = bound,
            "re-sealed the webhook secrets an older version sealed with their subscription id \
             alone, each bound to its place"
        );
    }
    #[cfg(feature = "whatsapp")]
    let wa_sessions = crate::gateway::whatsapp::store::SessionStore::new(sql.wa_rows(), key);
    Ok(Opened {
        store: Arc::new(sql),
        #[cfg(feature = "whatsapp")]
        wa_sessions,
    })
}

/// This daemon's simulator, and the shared one (`simulator.url`) when set.
struct Simulators {
    local: Arc<Simulator>,
    remote: Option<Arc<RemoteSimulator>>,
}

impl Simulators {
    fn start(
        settings: &Settings,
        data_dir: &std::path::Path,
        receipts: &ReceiptSink,
    ) -> anyhow::Result<Self> {
        let sim = &settings.simulator;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let config = SimConfig {
            latency: Latency::Uniform {
                min: Duration::from_millis(sim.latency_min_ms),
                max: Duration::from_millis(sim.latency_max_ms),
            },
            upload_bytes_per_sec: Some(sim.upload_bytes_per_sec),
            rate_limit_per_minute: Some(sim.rate_limit_per_minute),
            receipts: sim.receipts.then_some(SimReceipts {
                read_share: sim.read_share,
                read_after: Duration::from_secs(sim.read_after_secs),
                repeat_every: 0,
            }),
            votes: (sim.vote_share > 0.0).then_some(SimVotes {
                share: sim.vote_share,
                after: Duration::from_secs(sim.vote_after_secs),
                later: Duration::from_secs(sim.vote_again_after_secs),
                change_every: 3,
                withdraw_every: 7,
                repeat_every: 0,
            }),
            ..SimConfig::default()
        };
        // `simulator.url`: simulator accounts talk to a shared `herald
        // simulator serve`, whose journal records every daemon's
        // deliveries; this daemon's own simulator then keeps none.
        if !sim.url.is_empty() {
            let remote = RemoteSimulator::new(&sim.url)
                .map_err(|rule| anyhow::anyhow!("invalid setting simulator.url: {rule}"))?;
            return Ok(Self {
                local: Arc::new(Simulator::new(config, clock)),
                remote: Some(Arc::new(remote)),
            });
        }
        // The simulated WhatsApp keeps a journal under the data dir, so like
        // the real servers it remembers accepted message ids across a
        // restart of Herald (and tests can check exactly-once from it).
        let journal = data_dir.join("simulator").join("journal.jsonl");
        // Its members' receipts are counted like a real group's (a shared
        // simulator's are not: they would have to cross its wire).
        let local = Simulator::with_journal(config, clock, &journal)
            .context("opening the simulator's journal")?
            .with_receipts(receipts.clone());
        Ok(Self {
            local: Arc::new(local),
            remote: None,
        })
    }

    /// The gateway of `simulator` accounts.
    fn gateway(&self) -> Arc<dyn Gateway> {
        match &self.remote {
            Some(remote) => remote.clone(),
            None => self.local.clone(),
        }
    }
}

/// What the core is given: the ports, and the daemon's side of them.
struct Parts {
    ports: Ports,
    media: Arc<FileMedia>,
    metrics: Arc<PromMetrics>,
    #[cfg(feature = "whatsapp")]
    whatsapp: crate::gateway::whatsapp::WhatsappGateway,
    #[cfg(feature = "whatsapp")]
    wa_sessions: crate::gateway::whatsapp::store::SessionStore,
    /// What the WhatsApp sessions report, written once the actors they
    /// wake exist (`start_whatsapp`).
    #[cfg(feature = "whatsapp")]
    wa_changes: crate::gateway::whatsapp::Changes,
}

impl Parts {
    fn build(
        settings: &Settings,
        data_dir: &std::path::Path,
        opened: Opened,
        sims: &Simulators,
        leases: Option<&Arc<LeaseTable>>,
        receipts: ReceiptSink,
    ) -> anyhow::Result<Self> {
        let media = Arc::new(FileMedia::new(data_dir).context("creating the media dir")?);
        let metrics = Arc::new(PromMetrics::new());
        #[cfg(feature = "whatsapp")]
        let wa_sessions = match leases {
            Some(table) => opened.wa_sessions.with_leases(table.clone()),
            None => opened.wa_sessions,
        };
        #[cfg(not(feature = "whatsapp"))]
        let _ = leases;
        #[cfg(feature = "whatsapp")]
        let (recorder, wa_changes) = crate::gateway::whatsapp::Recorder::channel();
        #[cfg(feature = "whatsapp")]
        let whatsapp = crate::gateway::whatsapp::WhatsappGateway::new(
            crate::gateway::whatsapp::WhatsappConfig::from_settings(&settings.whatsapp),
            data_dir,
            wa_sessions.clone(),
        )
        .context("starting the WhatsApp gateway")?
        .with_receipts(receipts)
        .with_recorder(recorder);
        #[cfg(not(feature = "whatsapp"))]
        let _ = (settings, receipts);
        let ports = Ports {
            store: opened.store,
            gateways: Arc::new(DaemonGateways {
                simulator: sims.gateway(),
                #[cfg(feature = "whatsapp")]
                whatsapp: whatsapp.clone(),
            }),
            media: media.clone(),
            clock: Arc::new(SystemClock),
            metrics: metrics.clone(),
        };
        Ok(Self {
            ports,
            media,
            metrics,
            #[cfg(feature = "whatsapp")]
            whatsapp,
            #[cfg(feature = "whatsapp")]
            wa_sessions,
            #[cfg(feature = "whatsapp")]
            wa_changes,
        })
    }
}

/// The core's actors, started.
struct Actors {
    engine: Arc<Engine>,
    /// For the lease keeper, which adopts and releases accounts.
    supervisor: Addr<Supervisor>,
    door: Door,
    scheduler: Addr<SchedulerActor>,
}

impl Actors {
    async fn start(
        ports: &Ports,
        settings: &Settings,
        leases: Option<Arc<LeaseTable>>,
    ) -> anyhow::Result<Self> {
        use herald_actors::scheduling::window::WindowActor;
        // One arbiter per core for the account actors, one for the writer.
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let arbiters: Vec<_> = (0..cores).map(|_| Arbiter::new().handle()).collect();
        let writer = StoreWriter::start_on(ports.store.clone(), &Arbiter::new().handle());
        // The window actor's address exists before the actor runs: the
        // engine is built whole, and the actor started once the
        // supervisor it tells is there.
        let window_ctx = actix::Context::<WindowActor>::new();
        let window = window_ctx.address();
        let mut engine = Engine::new(ports.clone(), engine_config(settings), writer).with_window(
            herald_actors::delivery::engine::WindowLinks {
                arm: window.clone().recipient(),
                disarm: window.clone().recipient(),
                park: window.recipient(),
            },
        );
        if let Some(table) = leases {
            engine = engine.with_leases(table);
        }
        let engine = Arc::new(engine);
        let supervisor = Supervisor::new(engine.clone(), arbiters).start();
        let door = Door::of(supervisor.clone()).await?;
        window_ctx.run(WindowActor::new(
            SchedulerPorts::from_ports(ports, engine.events.clone()),
            supervisor.clone().recipient(),
            supervisor.clone().recipient(),
        ));
        let scheduler = SchedulerActor::new(
            SchedulerPorts::from_ports(ports, engine.events.clone()),
            supervisor.clone().recipient(),
            scheduler_config(settings),
        )
        .start();
        Ok(Self {
            engine,
            supervisor,
            door,
            scheduler,
        })
    }
}

/// Joins the cluster. A node id still registered by this daemon's previous
/// run (killed: nothing renews it) is waited out until it expires, said in
/// the log, to systemd and on the port (`/readyz`, see `http::waiting`);
/// one renewed meanwhile belongs to a second live daemon: refused
/// ([`crate::store::HeldByAnother`], exit code `daemon::EXIT_IN_USE`).
async fn join_cluster(keeper: &Keeper, listener: &TcpListener) -> anyhow::Result<()> {
    let node = keeper.table().node().to_owned();
    let mut port: Option<ServerHandle> = None;
    let joined = keeper
        .join(|until| {
            let left = (until - chrono::Utc::now()).num_seconds().max(1);
            let why = format!(
                "node id {node:?} is still registered by a previous run that no longer renews \
                 it; taken when that registration expires at {until} (in about {left} s)"
            );
            tracing::warn!(%node, %until, "waiting for this node id's previous registration to expire");
            crate::daemon::notify_status(&why);
            match http::waiting(listener, why, left.unsigned_abs()) {
                Ok(server) => {
                    port = Some(server.handle());
                    actix_rt::spawn(server);
                }
                Err(e) => tracing::warn!(error = %e, "could not answer on the port while waiting"),
            }
        })
        .await;
    if let Some(port) = port {
        port.stop(false).await;
    }
    match joined {
        Ok(()) => Ok(()),
        Err(herald_actors::ports::StoreError::Conflict(why)) => {
            Err(crate::store::HeldByAnother(why)).context("joining the cluster")
        }
        Err(e) => Err(e).context("joining the cluster"),
    }
}

/// The lease keeper, advertising where the other daemons reach this one.
fn keeper(
    settings: &Settings,
    ports: &Ports,
    actors: &Actors,
    table: Arc<LeaseTable>,
    addr: std::net::SocketAddr,
    port: u16,
) -> Arc<Keeper> {
    let c = &settings.cluster;
    let control_url = if c.advertise_url.is_empty() {
        format!("http://{}:{port}", addr.ip())
    } else {
        c.advertise_url.trim_end_matches('/').to_owned()
    };
    Arc::new(Keeper::new(
        ports.store.clone(),
        table,
        actors.supervisor.clone(),
        KeeperConfig {
            control_url: Some(control_url),
            drain_grace: settings.drain_grace(),
            ..KeeperConfig::for_ttl(settings.lease_ttl())
        },
        placer(),
    ))
}

fn app_state(
    settings: Arc<Settings>,
    parts: &Parts,
    sims: Simulators,
    actors: Actors,
    token: &Option<Secret>,
    cluster: &Option<Arc<Keeper>>,
) -> AppState {
    let group_sync_interval = Duration::from_secs(settings.groups.min_sync_interval_secs);
    AppState {
        groups: Arc::new(crate::groups::GroupDirectory::new(
            parts.ports.store.clone(),
            parts.ports.gateways.clone(),
            parts.ports.clock.clone(),
            group_sync_interval,
        )),
        settings,
        store: parts.ports.store.clone(),
        engine: actors.engine,
        door: actors.door,
        scheduler: actors.scheduler,
        simulator: sims.local,
        remote_simulator: sims.remote,
        media: parts.media.clone(),
        ready: Arc::new(AtomicBool::new(false)),
        metrics: parts.metrics.clone(),
        edits: Arc::default(),
        control_token: token.clone(),
        cluster: cluster.clone(),
        #[cfg(feature = "whatsapp")]
        whatsapp: parts.whatsapp.clone(),
    }
}

/// Before any run resumes: a shared simulator that does not know an
/// account would answer its sends "logged out".
async fn register_simulated(state: &AppState, accounts: &[Account]) -> anyhow::Result<()> {
    for account in accounts {
        if account.kind == GatewayKind::Simulator {
            state
                .register_simulated(&account.id)
                .await
                .with_context(|| {
                    format!(
                        "registering simulator account {} with the shared simulator at {}",
                        account.id, state.settings.simulator.url
                    )
                })?;
        }
    }
    Ok(())
}

/// State changes go to the store and wake the account's actor; paired
/// accounts reconnect in the background; several daemons: only the lease
/// holder connects an account.
#[cfg(feature = "whatsapp")]
async fn start_whatsapp(
    state: &AppState,
    accounts: &[Account],
    data_dir: &std::path::Path,
    parts: Parts,
    cluster: &Option<Arc<Keeper>>,
) -> anyhow::Result<()> {
    let events = state.engine.events.clone();
    let (store, actors) = (state.store.clone(), state.door.clone());
    let metrics = state.engine.ports.metrics.clone();
    // A newly connected account's directory is synced (throttled), so its
    // groups can be picked without a manual sync.
    let groups = state.groups.clone();
    let connected = Arc::new(move |id: &herald_actors::domain::AccountId| {
        let (groups, id) = (groups.clone(), id.clone());
        tokio::spawn(async move { groups.sync_quietly(&id).await });
    });
    // Session files of daemons before sessions moved into the database:
    // imported once, then deleted (or renamed, if the operator keeps them).
    let ids: Vec<_> = accounts
        .iter()
        .filter(|a| a.kind == GatewayKind::Whatsapp)
        .map(|a| a.id.clone())
        .collect();
    crate::gateway::whatsapp::import::import_all(
        &data_dir.join("whatsapp"),
        &parts.wa_sessions,
        &ids,
        state.settings.whatsapp.keep_imported_session_files,
    )
    .await
    .context("importing WhatsApp session files into the database")?;
    // The gateway reports to the actors it sits under: what it reported
    // since it was built is written now that they exist.
    state
        .whatsapp
        .record(parts.wa_changes, store, events, metrics, actors, connected);
    if let Some(keeper) = cluster {
        state.whatsapp.follow_leases(
            keeper.table().clone(),
            state.store.clone(),
            Duration::from_secs(1),
        );
    }
    state.whatsapp.resume(accounts);
    Ok(())
}

/// The pruner, the webhook sender, the run-outcome counter and the
/// receipts' reporter.
/// The node name the webhook sender claims deliveries under (it adds its
/// process id): this daemon's node id, the one its leases use, so with
/// `cluster.node_id` unset it is the host name. A fixed fallback would
/// give every daemon running as PID 1 in a container the same name.
fn webhook_node(settings: &Settings) -> String {
    settings.node_id()
}

fn background(
    state: &AppState,
) -> anyhow::Result<(AbortOnDrop, AbortOnDrop, AbortOnDrop, AbortOnDrop)> {
    let retention = &state.settings.retention;
    let pruner = AbortOnDrop(
        crate::retention::Pruner::new(
            state.store.clone(),
            state.media.clone(),
            crate::retention::RetentionConfig::from_settings(retention),
        )
        .with_accepted_ids(accepted_rows(state))
        .spawn(
            state.engine.ports.clock.clone(),
            Duration::from_secs(retention.interval_secs),
        ),
    );
    let webhooks = AbortOnDrop(
        crate::webhooks::Sender::new(
            state.store.clone(),
            state.settings.webhooks.clone(),
            &webhook_node(&state.settings),
        )?
        .with_metrics(state.metrics.clone())
        .spawn(),
    );
    let outcomes = AbortOnDrop(crate::metrics::count_run_outcomes(
        state.metrics.clone(),
        state.engine.events.subscribe(),
    ));
    let r = &state.settings.receipts;
    let receipts = AbortOnDrop(herald_actors::delivery::receipts::spawn_reporter(
        state.store.clone(),
        state.engine.events.clone(),
        state.engine.ports.clock.clone(),
        Duration::from_secs(r.settle_after_secs),
        Duration::from_secs(r.check_every_secs),
    ));
    Ok((pruner, webhooks, outcomes, receipts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhooks_claim_under_the_node_id_the_leases_use() {
        let mut settings = Settings::load_from(None, &Default::default()).unwrap();
        assert_eq!(settings.cluster.node_id, "", "the default names no node");
        // Unset, both fall back to the host name (or `herald` on a host
        // whose name is not a node id).
        assert_eq!(webhook_node(&settings), settings.node_id());
        settings.cluster.node_id = "node-b".into();
        assert_eq!(webhook_node(&settings), "node-b");
    }
}
