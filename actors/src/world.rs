//! A whole Herald engine on the simulated WhatsApp and the memory store:
//! what `herald simulate` plans capacity with and what the engine's own
//! tests drive. Run it inside an actix System; for virtual time, one from
//! [`virtual_time_system`] (or `tokio::time::pause()` first, where the
//! exact trace does not matter).

use crate::delivery::engine::{Engine, EngineConfig};
use crate::delivery::writer::StoreWriter;
use crate::domain::*;
use crate::memstore::MemoryStore;
use crate::messages::RunDue;
use crate::ports::*;
use crate::simulator::{SimConfig, Simulator};
use crate::supervisor::{StartAll, Supervisor};
use actix::prelude::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dashmap::DashMap;
use std::sync::Arc;
use std::time::Duration;

/// Media bytes held in memory.
#[derive(Default)]
pub struct MemoryMedia {
    bytes: DashMap<MediaId, Arc<[u8]>>,
}

impl MemoryMedia {
    pub fn insert(&self, bytes: Vec<u8>) -> MediaId {
        let id = MediaId::of_bytes(&bytes);
        self.bytes.insert(id.clone(), bytes.into());
        id
    }
}

#[async_trait]
impl MediaSource for MemoryMedia {
    async fn read(&self, media: &MediaId) -> std::io::Result<Arc<[u8]>> {
        self.bytes.get(media).map(|b| b.clone()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, format!("media {media}"))
        })
    }
}

/// Every account kind goes to the one simulator.
pub struct SimulatorOnly(pub Arc<Simulator>);

impl GatewayRegistry for SimulatorOnly {
    fn gateway(&self, kind: GatewayKind) -> Option<Arc<dyn Gateway>> {
        (kind == GatewayKind::Simulator).then(|| self.0.clone() as Arc<dyn Gateway>)
    }
}

/// An actix system whose clock is paused from the moment its runtime is
/// built, so that the same inputs wake at the same virtual instants on
/// every run. Pausing later, inside the system, freezes the clock a real,
/// sub-millisecond while after the timer wheel's origin; the wheel rounds
/// each deadline up to a whole millisecond from that origin, so one seed
/// would wake a millisecond apart from run to run and diverge from there.
pub fn virtual_time_system() -> actix_rt::SystemRunner {
    actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime for virtual time")
    })
}

pub struct SimWorld {
    pub store: Arc<MemoryStore>,
    pub sim: Arc<Simulator>,
    pub media: Arc<MemoryMedia>,
    pub clock: Arc<dyn Clock>,
    pub engine: Arc<Engine>,
    pub supervisor: Addr<Supervisor>,
    /// Counts the simulated groups' receipts, when its config plans any.
    pub receipts: Option<crate::delivery::receipts::CounterHandle>,
}

impl SimWorld {
    pub fn start(sim_config: SimConfig, engine_config: EngineConfig, start: DateTime<Utc>) -> Self {
        Self::start_with(
            sim_config,
            engine_config,
            Arc::new(crate::ports::TokioClock::starting_at(start)),
            Arc::new(NoMetrics),
        )
    }

    /// Like [`SimWorld::start`], as one daemon of several: the engine acts
    /// for an account only while `leases` holds it.
    pub fn start_leased(
        sim_config: SimConfig,
        engine_config: EngineConfig,
        start: DateTime<Utc>,
        leases: Arc<crate::delivery::leases::LeaseTable>,
    ) -> Self {
        Self::build(
            sim_config,
            engine_config,
            Arc::new(crate::ports::TokioClock::starting_at(start)),
            Arc::new(NoMetrics),
            Some(leases),
        )
    }

    pub fn start_with(
        sim_config: SimConfig,
        engine_config: EngineConfig,
        clock: Arc<dyn Clock>,
        metrics: Arc<dyn Metrics>,
    ) -> Self {
        Self::build(sim_config, engine_config, clock, metrics, None)
    }

    fn build(
        sim_config: SimConfig,
        engine_config: EngineConfig,
        clock: Arc<dyn Clock>,
        metrics: Arc<dyn Metrics>,
        leases: Option<Arc<crate::delivery::leases::LeaseTable>>,
    ) -> Self {
        let store = Arc::new(MemoryStore::new());
        let plans_receipts = sim_config.receipts.is_some() || sim_config.votes.is_some();
        let mut sim = Simulator::new(sim_config, clock.clone());
        let mut receipts = None;
        if plans_receipts {
            let (sink, inbox) = crate::ports::ReceiptSink::channel(crate::ports::RECEIPT_BACKLOG);
            sim = sim.with_receipts(sink);
            receipts = Some(crate::delivery::receipts::spawn(
                inbox,
                store.clone(),
                metrics.clone(),
                crate::delivery::receipts::CounterConfig::default(),
            ));
        }
        let sim = Arc::new(sim);
        let media = Arc::new(MemoryMedia::default());
        let ports = Ports {
            store: store.clone(),
            gateways: Arc::new(SimulatorOnly(sim.clone())),
            media: media.clone(),
            clock: clock.clone(),
            metrics,
        };
        let writer = StoreWriter::start(ports.store.clone());
        // The window actor's address exists before the actor runs: the
        // engine is built whole, the actor started after the supervisor.
        let window_ctx = actix::Context::<crate::scheduling::window::WindowActor>::new();
        let window = window_ctx.address();
        let mut engine = Engine::new(ports, engine_config, writer).with_window(
            crate::delivery::engine::WindowLinks {
                arm: window.clone().recipient(),
                disarm: window.clone().recipient(),
                park: window.recipient(),
            },
        );
        if let Some(leases) = leases {
            engine = engine.with_leases(leases);
        }
        let engine = Arc::new(engine);
        let supervisor = Supervisor::new(engine.clone(), vec![]).start();
        window_ctx.run(crate::scheduling::window::WindowActor::new(
            crate::scheduling::scheduler::SchedulerPorts::from_ports(
                &engine.ports,
                engine.events.clone(),
            ),
            supervisor.clone().recipient(),
            supervisor.clone().recipient(),
        ));
        Self {
            store,
            sim,
            media,
            clock,
            engine,
            supervisor,
            receipts,
        }
    }

    /// A connected simulator account that belongs to `groups` numbered groups.
    pub async fn add_account(
        &self,
        id: &str,
        groups: usize,
        limits: AccountLimits,
    ) -> (AccountId, Vec<GroupJid>) {
        let id = AccountId::parse(id).expect("valid account id");
        let jids = self.sim.add_numbered_groups(&id, groups);
        self.store
            .create_account(
                &NewAccount {
                    id: id.clone(),
                    name: id.to_string(),
                    kind: GatewayKind::Simulator,
                    state: AccountState::Connected,
                    limits,
                },
                self.clock.now(),
            )
            .await
            .expect("account stored");
        self.supervisor
            .do_send(crate::supervisor::AddAccount(id.clone()));
        (id, jids)
    }

    pub async fn add_media(&self, bytes: Vec<u8>, mime: &str) -> MediaId {
        let size = bytes.len() as u64;
        let id = self.media.insert(bytes);
        self.store
            .put_media(&MediaInfo {
                id: id.clone(),
                mime: mime.into(),
                size,
                filename: None,
                created_at: self.clock.now(),
            })
            .await
            .expect("media stored");
        id
    }

    /// Stores a reminder and queues a run of it scheduled for now.
    pub async fn fire(&self, reminder: &NewReminder) -> RunId {
        let now = self.clock.now();
        let r = self
            .store
            .create_reminder(reminder, now)
            .await
            .expect("reminder stored");
        let created = self
            .store
            .create_run(
                r.id,
                &reminder.account_id,
                now,
                RunStatus::Queued,
                None,
                now,
            )
            .await
            .expect("run stored");
        self.supervisor.do_send(RunDue {
            run_id: created.run.id,
            account_id: reminder.account_id.clone(),
        });
        created.run.id
    }

    /// The account's actor, from the supervisor's registry.
    pub async fn actor(&self, id: &AccountId) -> Addr<crate::delivery::account::AccountActor> {
        let registry = self
            .supervisor
            .send(crate::supervisor::GetRegistry)
            .await
            .expect("supervisor alive");
        let addr = registry
            .get(id)
            .map(|a| a.clone())
            .expect("actor registered");
        addr
    }

    /// Hands back unfinished runs, as a daemon does at start-up.
    pub async fn resume(&self) -> usize {
        self.supervisor
            .send(StartAll)
            .await
            .expect("supervisor alive")
            .expect("store")
    }

    /// Waits (virtual seconds) until the run is final or `limit` passes.
    pub async fn wait_final(&self, run: RunId, limit: Duration) -> Run {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let r = self
                .store
                .get_run(run)
                .await
                .expect("store")
                .expect("run exists");
            if r.status.is_final() || tokio::time::Instant::now() >= deadline {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until the run has `status`.
    pub async fn wait_status(&self, run: RunId, status: RunStatus, limit: Duration) -> Run {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let r = self
                .store
                .get_run(run)
                .await
                .expect("store")
                .expect("run exists");
            if r.status == status || tokio::time::Instant::now() >= deadline {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A reminder to `targets` with `parts`, in `tz`, window `window`.
pub fn reminder(
    account: &AccountId,
    tz: &str,
    window: WindowHours,
    parts: Vec<MessagePart>,
    targets: Vec<GroupJid>,
) -> NewReminder {
    NewReminder::new(
        account.clone(),
        "simulated reminder",
        TimeZone::parse(tz).expect("timezone"),
        Schedule::once("2000-01-01T00:00").expect("schedule"),
        window,
        false,
        parts,
        targets,
    )
    .expect("valid reminder")
}

/// The engine's tests that need a whole engine; here, above the delivery
/// modules they test, so that no module's tests import upward.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::bucket::TokenBucket;
    use crate::delivery::run::rebuild_bucket;
    use std::cell::RefCell;

    /// Marks `targets` sent now, as another daemon's run would have.
    async fn sent_elsewhere(
        store: &dyn crate::ports::Store,
        targets: &[RunTarget],
        now: DateTime<Utc>,
    ) {
        let mut marks = Vec::new();
        for t in targets {
            marks.push(Transition::Sending {
                target_id: t.id,
                part: 0,
                message_id: format!("elsewhere-{}", t.id),
            });
            marks.push(Transition::Sent {
                target_id: t.id,
                part: 0,
                last: true,
                at: now,
                latency_ms: 5,
            });
        }
        store.apply_transitions(&marks).await.unwrap();
    }

    /// The cluster test's overshoot: a daemon that owned an account, lost
    /// it, and took it again must not trust its own log, which never saw
    /// what the owner in between sent.
    #[actix_rt::test]
    async fn the_limiter_is_read_again_from_the_store_under_a_new_lease_epoch() {
        use crate::delivery::leases::LeaseTable;
        use crate::ports::Store;
        let table = Arc::new(LeaseTable::new("n1"));
        let world = SimWorld::start_leased(
            crate::simulator::SimConfig::instant(),
            crate::delivery::engine::EngineConfig::default(),
            Utc::now(),
            table.clone(),
        );
        let (account, groups) = world
            .add_account("acct", 10, AccountLimits::default())
            .await;
        let spec = reminder(
            &account,
            "UTC",
            WindowHours::parse(0, 24).unwrap(),
            vec![MessagePart::text("x").unwrap()],
            groups.clone(),
        );
        let store: &dyn Store = &*world.store;
        let now = world.clock.now();
        let r = store.create_reminder(&spec, now).await.unwrap();
        let run = store
            .create_run(r.id, &account, now, RunStatus::Running, None, now)
            .await
            .unwrap()
            .run;
        store.create_targets(run.id, &groups).await.unwrap();
        let targets = store.list_targets(run.id, None, None, 0).await.unwrap();
        let bucket = RefCell::new(TokenBucket::new(60, tokio::time::Instant::now()));
        let hold = |epoch| {
            let now = tokio::time::Instant::now();
            table.hold(
                &account,
                epoch,
                now,
                Duration::from_secs(60),
                Duration::ZERO,
            );
        };
        let rebuild = || rebuild_bucket(&world.engine, &account, &bucket, 60);
        let count = || bucket.borrow().in_window(tokio::time::Instant::now());

        sent_elsewhere(store, &targets[..5], now).await;
        hold(1);
        rebuild().await.unwrap();
        assert_eq!(count(), 5);
        assert_eq!(bucket.borrow().rebuilt_under(), Some(1));

        // Under the same epoch nobody else can have sent: the log is kept.
        sent_elsewhere(store, &targets[5..8], now).await;
        rebuild().await.unwrap();
        assert_eq!(count(), 5);

        // Lost and taken again: the three sends of the owner in between count.
        table.drop_lease(&account);
        hold(3);
        rebuild().await.unwrap();
        assert_eq!(count(), 8);
        assert_eq!(bucket.borrow().rebuilt_under(), Some(3));
    }
}
