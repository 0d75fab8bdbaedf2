//! `herald bench scale`: a large install on one node, idle.
//!
//! Builds the install through the real store (one simulated account,
//! `reminders` daily reminders of `groups` groups each, none due during
//! the bench), then starts the whole daemon on it in this process (port
//! 0) and measures:
//! - `ready_s`: from `Application::build` until the scheduler holds every
//!   reminder (its start-up load);
//! - `fire_lag_p99_ms`: one-shot reminders created over the control port,
//!   due a few seconds later: run creation time minus due time;
//! - `list_p99_ms`: `GET /v1/reminders` (first page, default size);
//! - `idle_cpu_pct`, `rss_mb`: this process's CPU over an idle stretch
//!   that spans at least two reconcile passes, and its resident memory
//!   after it (from /proc/self).
//!
//! Client and daemon share the process, so RSS includes the bench's own
//! few megabytes.

use super::control::post;
use super::{percentile, ScratchDb};
use crate::settings::Settings;
use crate::startup::Application;
use crate::store::SqlStore;
use anyhow::Context;
use chrono::{Timelike, Utc};
use herald_actors::domain::*;
use herald_actors::ports::{AccountStore, NewAccount, ReminderStore, RunFilter, StoreBase};
use herald_actors::scheduling::scheduler::NextDue;
use herald_actors::simulator::Simulator;
use serde_json::json;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What `herald bench scale` was asked for.
#[derive(Debug, Clone)]
pub struct ScaleArgs {
    pub reminders: usize,
    pub groups: usize,
    /// PostgreSQL base URL for a scratch database; SQLite otherwise.
    pub postgres: Option<String>,
    /// Idle stretch measured for CPU.
    pub idle: Duration,
    /// One-shot reminders timed for the fire lag.
    pub fires: usize,
    /// List requests timed.
    pub lists: usize,
}

impl ScaleArgs {
    pub fn new(reminders: usize, groups: usize) -> Self {
        Self {
            reminders,
            groups,
            postgres: None,
            // Two reconcile passes at the default 30 s, and a margin.
            idle: Duration::from_secs(65),
            fires: 20,
            lists: 200,
        }
    }
}

const ACCOUNT: &str = "scale";

pub async fn run(args: &ScaleArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        args.reminders > 0 && args.groups > 0 && args.fires > 0 && args.lists > 0,
        "reminders, groups, fires and lists must be positive"
    );
    let dir = std::env::temp_dir().join(format!(
        "herald-bench-scale-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir)?;
    let scratch = match &args.postgres {
        Some(url) => ScratchDb::create(url).await?,
        None => ScratchDb::create(&format!("sqlite://{}", dir.join("herald.db").display())).await?,
    };
    let out = drive(args, &dir, &scratch.url).await;
    scratch.cleanup().await?;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Creates the install: one account, `reminders` reminders of `groups`
/// groups, daily twelve hours from now (never due while the bench runs).
async fn build_install(url: &str, args: &ScaleArgs) -> anyhow::Result<(String, i64)> {
    let store = SqlStore::connect(url).await?;
    let account = AccountId::parse(ACCOUNT)?;
    store
        .create_account(
            &NewAccount {
                id: account.clone(),
                name: "scale".into(),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits::default(),
            },
            Utc::now(),
        )
        .await?;
    let targets: Vec<GroupJid> = (0..args.groups).map(Simulator::numbered_group).collect();
    let hour = (Utc::now().hour() + 12) % 24;
    let mut last = 0;
    for i in 0..args.reminders {
        let spec = NewReminder::new(
            account.clone(),
            &format!("scale {i}"),
            TimeZone::parse("UTC")?,
            Schedule::cron(&format!("0 {hour} * * *"))?,
            WindowHours::parse(0, 24)?,
            false,
            vec![MessagePart::text("Daily reminder at scale")?],
            targets.clone(),
        )?;
        last = store.create_reminder(&spec, Utc::now()).await?.id;
    }
    let backend = store.backend().to_owned();
    store.close().await;
    Ok((backend, last))
}

async fn drive(args: &ScaleArgs, dir: &std::path::Path, url: &str) -> anyhow::Result<String> {
    let built = Instant::now();
    let (backend, last_id) = build_install(url, args).await?;
    tracing::warn!(
        seconds = built.elapsed().as_secs_f64(),
        "install built; starting the daemon"
    );
    let env: HashMap<String, String> = [
        ("HERALD_CONTROL__LISTEN", "127.0.0.1:0".to_owned()),
        ("HERALD_STORAGE__DATA_DIR", dir.display().to_string()),
        ("HERALD_STORAGE__DATABASE_URL", url.to_owned()),
        ("HERALD_LOG__FILTER", "warn".to_owned()),
        ("HERALD_CONTROL__RATE_LIMIT_PER_SECOND", "0".to_owned()),
        // The fire-lag runs finish in seconds and leave the daemon idle.
        ("HERALD_DELIVERY__MAX_PER_MINUTE", "600".to_owned()),
        ("HERALD_SIMULATOR__LATENCY_MIN_MS", "0".to_owned()),
        ("HERALD_SIMULATOR__LATENCY_MAX_MS", "1".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let settings = Settings::load_from(None, &env)?;

    let started = Instant::now();
    let app = Application::build(settings).await?;
    let scheduler = app.state().scheduler.clone();
    let store = app.state().store.clone();
    let base = format!("http://127.0.0.1:{}", app.port());
    let token = app
        .token()
        .context("the daemon has a token")?
        .expose()
        .to_owned();
    actix_rt::spawn(app.run_until_stopped());
    // Ready when the scheduler holds the newest reminder of the install:
    // its start-up load reads them all in one pass.
    loop {
        if scheduler
            .send(NextDue {
                reminder_id: last_id,
            })
            .await?
            .is_some()
        {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "the scheduler did not load the install in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ready_s = started.elapsed().as_secs_f64();

    let http = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .add_default_header(("Authorization", format!("Bearer {token}")))
        .finish();

    // Fire lag: one-shots due from 3 s on, 200 ms apart.
    let first_due = Utc::now() + chrono::Duration::seconds(3);
    let mut fire_ids = Vec::with_capacity(args.fires);
    for i in 0..args.fires {
        let at = (first_due + chrono::Duration::milliseconds(200 * i as i64))
            .with_nanosecond(0)
            .expect("zero nanoseconds is valid");
        let created = post(
            &http,
            &format!("{base}/v1/reminders"),
            json!({
                "account_id": ACCOUNT,
                "title": format!("fire lag {i}"),
                "timezone": "UTC",
                "schedule": {"at": at.naive_utc().format("%Y-%m-%dT%H:%M:%S").to_string()},
                "window": {"start_hour": 0, "end_hour": 24},
                "parts": [{"kind": "text", "text": "Fire-lag probe"}],
                "targets": [Simulator::numbered_group(i % args.groups.max(1)).as_str()],
            }),
        )
        .await?;
        fire_ids.push(created["id"].as_i64().context("reminder id")?);
    }
    let mut lags = Vec::with_capacity(args.fires);
    let deadline = Instant::now() + Duration::from_secs(120);
    for id in &fire_ids {
        loop {
            let runs = store
                .list_runs(&RunFilter {
                    reminder_id: Some(*id),
                    limit: 1,
                    ..RunFilter::default()
                })
                .await?;
            if let Some(run) = runs.first() {
                if run.status.is_final() || Instant::now() > deadline {
                    lags.push(
                        (run.created_at - run.scheduled_for)
                            .num_microseconds()
                            .unwrap_or(0) as f64
                            / 1000.0,
                    );
                    break;
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "reminder {id} did not fire in time"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // First page of the reminder list, as an operator's console reads it.
    let mut list = Vec::with_capacity(args.lists);
    for _ in 0..args.lists {
        let t = Instant::now();
        let mut resp = http
            .get(format!("{base}/v1/reminders"))
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("GET /v1/reminders: {e}"))?;
        let body = resp.body().limit(64 << 20).await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "GET /v1/reminders: {}",
            resp.status()
        );
        drop(body);
        list.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    // Idle: nothing due, nothing sending; only the daemon's own timers.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (cpu0, t0) = (cpu_ticks()?, Instant::now());
    tokio::time::sleep(args.idle).await;
    let cpu_s = (cpu_ticks()? - cpu0) as f64 / ticks_per_second();
    let idle_cpu_pct = cpu_s / t0.elapsed().as_secs_f64() * 100.0;
    let rss_mb = rss_kb()? as f64 / 1024.0;

    Ok(format!(
        "scale: backend={backend} reminders={} targets={} rss_mb={rss_mb:.0} idle_cpu_pct={idle_cpu_pct:.2} ready_s={ready_s:.2} list_p99_ms={:.2} fire_lag_p99_ms={:.2}",
        args.reminders,
        args.reminders * args.groups,
        percentile(&mut list, 0.99),
        percentile(&mut lags, 0.99),
    ))
}

/// User plus system CPU time of this process, in clock ticks.
pub(super) fn cpu_ticks() -> anyhow::Result<u64> {
    stat_ticks(&std::fs::read_to_string("/proc/self/stat")?)
}

/// User plus system CPU time in a `/proc/…/stat` line (a process's or one
/// thread's), in clock ticks.
pub(super) fn stat_ticks(stat: &str) -> anyhow::Result<u64> {
    // The command name (field 2) may hold spaces; count from after it.
    let rest = stat
        .rsplit_once(')')
        .context("unexpected /proc stat line")?
        .1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let utime: u64 = fields.get(11).context("utime")?.parse()?;
    let stime: u64 = fields.get(12).context("stime")?.parse()?;
    Ok(utime + stime)
}

/// Linux reports /proc times in USER_HZ, which is 100 on every platform
/// it runs on.
pub(super) fn ticks_per_second() -> f64 {
    100.0
}

/// Resident set size of this process (VmRSS), in KiB.
pub(super) fn rss_kb() -> anyhow::Result<u64> {
    rss_kb_of("/proc/self/status")
}

/// VmRSS in KiB from a process's `/proc/…/status` file.
pub(super) fn rss_kb_of(status: &str) -> anyhow::Result<u64> {
    std::fs::read_to_string(status)?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("VmRSS in {status}"))
}
