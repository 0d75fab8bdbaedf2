//! `herald bench scheduler`: how fast a due reminder becomes a queued run,
//! through the real store, on the real clock.
//!
//! single: one-shot reminders due one at a time (10 ms apart), latency from
//! the due instant to the run's `RunDue` reaching the dispatcher.
//! burst: `reminders` one-shots due at the same instant, time until every
//! run is queued.

use super::{percentile, ScratchDb};
use crate::store::SqlStore;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::events::EventBus;
use herald_actors::messages::RunDue;
use herald_actors::ports::*;
use herald_actors::scheduling::scheduler::{
    SchedulerActor, SchedulerConfig, SchedulerPorts, Shutdown,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Stands where the supervisor would: records when each run arrived.
struct Collector {
    seen: Arc<Mutex<HashMap<RunId, DateTime<Utc>>>>,
}

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<RunDue> for Collector {
    type Result = ();
    fn handle(&mut self, msg: RunDue, _ctx: &mut Context<Self>) {
        let now = Utc::now();
        self.seen
            .lock()
            .expect("not poisoned")
            .insert(msg.run_id, now);
    }
}

const SINGLES: usize = 1000;
const SINGLE_SPACING_MS: i64 = 10;

pub async fn run(db: &str, reminders: usize) -> anyhow::Result<String> {
    let scratch = ScratchDb::create(db).await?;
    let result = drive(&scratch.url, reminders).await;
    scratch.cleanup().await?;
    result
}

async fn create_once(
    store: &SqlStore,
    account: &AccountId,
    at: DateTime<Utc>,
    i: usize,
) -> anyhow::Result<()> {
    let spec = NewReminder::new(
        account.clone(),
        &format!("bench {i}"),
        TimeZone::parse("UTC")?,
        Schedule::Once(at.naive_utc(), Fold::Earlier),
        WindowHours::parse(0, 24)?,
        false,
        vec![MessagePart::text("Benchmark reminder")?],
        vec![GroupJid::parse("120363000000000001@g.us")?],
    )?;
    store.create_reminder(&spec, Utc::now()).await?;
    Ok(())
}

fn start_scheduler(
    store: Arc<SqlStore>,
    seen: Arc<Mutex<HashMap<RunId, DateTime<Utc>>>>,
) -> (Addr<SchedulerActor>, EventBus) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let collector = Collector { seen }.start();
    let events = EventBus::new(store.clone(), clock.clone());
    let ports = SchedulerPorts {
        store,
        clock,
        metrics: Arc::new(NoMetrics),
        events: events.clone(),
    };
    let scheduler =
        SchedulerActor::new(ports, collector.recipient(), SchedulerConfig::default()).start();
    (scheduler, events)
}

async fn wait_for(
    seen: &Mutex<HashMap<RunId, DateTime<Utc>>>,
    n: usize,
    until: DateTime<Utc>,
) -> anyhow::Result<()> {
    while seen.lock().expect("not poisoned").len() < n {
        anyhow::ensure!(
            Utc::now() < until,
            "only {} of {n} runs queued in time",
            seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn drive(url: &str, reminders: usize) -> anyhow::Result<String> {
    let store = Arc::new(SqlStore::connect(url).await?);
    let account = AccountId::parse("bench")?;
    store
        .create_account(
            &NewAccount {
                id: account.clone(),
                name: "bench".into(),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits::default(),
            },
            Utc::now(),
        )
        .await?;

    // single: due times chosen ahead, far enough for the set-up to finish.
    let setup = Utc::now();
    let t0 = setup + chrono::Duration::seconds(5);
    for i in 0..SINGLES {
        create_once(
            &store,
            &account,
            t0 + chrono::Duration::milliseconds(SINGLE_SPACING_MS * i as i64),
            i,
        )
        .await?;
    }
    let per_reminder = (Utc::now() - setup) / SINGLES as i32;
    anyhow::ensure!(
        Utc::now() < t0 - chrono::Duration::seconds(1),
        "set-up too slow for the single phase"
    );
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let (scheduler, _) = start_scheduler(store.clone(), seen.clone());
    wait_for(&seen, SINGLES, t0 + chrono::Duration::seconds(60)).await?;
    let mut lat = Vec::with_capacity(SINGLES);
    let arrivals: Vec<(RunId, DateTime<Utc>)> = seen
        .lock()
        .expect("not poisoned")
        .iter()
        .map(|(r, a)| (*r, *a))
        .collect();
    for (run, at) in &arrivals {
        let r = store.get_run(*run).await?.expect("run exists");
        lat.push(
            (*at - r.scheduled_for)
                .num_microseconds()
                .unwrap_or(i64::MAX) as f64
                / 1000.0,
        );
    }
    let (p50, p99) = (percentile(&mut lat, 0.50), percentile(&mut lat, 0.99));
    scheduler.send(Shutdown).await?;

    // burst: the due instant leaves room for creating them all (estimated
    // from the single phase) and for a fresh scheduler's start-up load.
    let create_estimate = per_reminder * reminders as i32;
    let t1 = Utc::now() + create_estimate * 2 + chrono::Duration::seconds(5);
    for i in 0..reminders {
        create_once(&store, &account, t1, SINGLES + i).await?;
    }
    anyhow::ensure!(
        Utc::now() < t1 - chrono::Duration::seconds(2),
        "set-up too slow for the burst phase"
    );
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let (burst, events) = start_scheduler(store.clone(), seen.clone());
    wait_for(&seen, reminders, t1 + chrono::Duration::seconds(120)).await?;
    let last = *seen
        .lock()
        .expect("not poisoned")
        .values()
        .max()
        .expect("runs seen");
    let burst_ms = (last - t1).num_milliseconds();
    burst.send(Shutdown).await?;
    // Events are stored behind the runs; closing the store under them
    // would drop the last ones.
    events.flush().await;
    store.close().await;
    Ok(format!(
        "scheduler: backend={} reminders={reminders} singles={SINGLES} single_p50_ms={p50:.2} single_p99_ms={p99:.2} burst_all_queued_ms={burst_ms}",
        store.backend()
    ))
}
