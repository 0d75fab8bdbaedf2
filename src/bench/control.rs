//! `herald bench control`: the control port under load while accounts send.
//!
//! Starts the whole daemon in this process (temporary SQLite data dir,
//! simulated WhatsApp, port 0), has `accounts` accounts fan a reminder out
//! to 1000 groups each at 40 messages/min, and meanwhile sends `rps` status
//! requests a second for `seconds` (account views, which ask the account's
//! actor for a live snapshot, and run views, which read the store). It
//! reports the requests' latency and whether the sends kept their pace.
//! Client and daemon share this machine's cores, so the figures are a
//! pessimistic bound for a daemon with the machine to itself.

use super::percentile;
use crate::settings::Settings;
use crate::startup::Application;
use anyhow::Context;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

const RATE: u32 = 40;
const GROUPS: usize = 1000;

pub async fn run(accounts: usize, rps: u32, seconds: u64) -> anyhow::Result<String> {
    anyhow::ensure!(
        accounts > 0 && rps > 0 && seconds > 0,
        "accounts, rps and seconds must be positive"
    );
    let dir = tempfile_dir()?;
    let env: HashMap<String, String> = [
        ("HERALD_CONTROL__LISTEN", "127.0.0.1:0".to_owned()),
        ("HERALD_STORAGE__DATA_DIR", dir.display().to_string()),
        ("HERALD_LOG__FILTER", "warn".to_owned()),
        // Every account sends at once (the default caps accounts mid-run at 8).
        ("HERALD_DELIVERY__FIRE_CONCURRENCY", accounts.to_string()),
        // One client at `rps`: the bench measures the daemon, not the
        // per-client rate limit (which would answer 429 above 50/s).
        ("HERALD_CONTROL__RATE_LIMIT_PER_SECOND", "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let settings = Settings::load_from(None, &env)?;
    let app = Application::build(settings).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let sim = app.state().simulator.clone();
    let token = app
        .token()
        .context("the daemon has a token")?
        .expose()
        .to_owned();
    actix_rt::spawn(app.run_until_stopped());
    let http = awc::Client::builder()
        .timeout(Duration::from_secs(10))
        .add_default_header(("Authorization", format!("Bearer {token}")))
        .finish();

    let targets: Vec<String> = (1..=GROUPS)
        .map(|i| format!("120363{i:012}@g.us"))
        .collect();
    let mut runs = Vec::new();
    let mut ids = Vec::new();
    for a in 0..accounts {
        let id = format!("load-{a}");
        post(
            &http,
            &format!("{base}/v1/accounts"),
            json!({"id": id, "kind": "simulator"}),
        )
        .await?;
        let reminder = post(
            &http,
            &format!("{base}/v1/reminders"),
            json!({
                "account_id": id,
                "title": "load test",
                "timezone": "UTC",
                "schedule": {"cron": "0 0 1 1 *"},
                "window": {"start_hour": 0, "end_hour": 24},
                "parts": [{"kind": "text", "text": "Reminder under load"}],
                "targets": targets,
            }),
        )
        .await?;
        let rid = reminder["id"].as_i64().context("reminder id")?;
        let fired = post(&http, &format!("{base}/v1/reminders/{rid}/fire"), json!({})).await?;
        runs.push(fired["run_id"].as_i64().context("run id")?);
        ids.push(id);
    }
    let fired_at = Instant::now();

    let latencies = Rc::new(RefCell::new(Vec::with_capacity(
        (rps as u64 * seconds) as usize,
    )));
    let errors = Rc::new(RefCell::new(0u64));
    let interval = Duration::from_secs_f64(1.0 / f64::from(rps));
    let total = u64::from(rps) * seconds;
    let start = tokio::time::Instant::now();
    let mut handles = Vec::with_capacity(total as usize);
    for i in 0..total {
        // Open-loop: requests go out on schedule whether or not earlier ones
        // have answered, so a slow server shows up as latency.
        tokio::time::sleep_until(start + interval * i as u32).await;
        let url = if i % 2 == 0 {
            format!("{base}/v1/accounts/{}", ids[i as usize % ids.len()])
        } else {
            format!("{base}/v1/runs/{}", runs[i as usize % runs.len()])
        };
        let (http, latencies, errors) = (http.clone(), latencies.clone(), errors.clone());
        handles.push(actix_rt::spawn(async move {
            let t = Instant::now();
            let ok = match http.get(url).send().await {
                Ok(mut resp) => resp.status().is_success() && resp.body().await.is_ok(),
                Err(_) => false,
            };
            if ok {
                latencies
                    .borrow_mut()
                    .push(t.elapsed().as_secs_f64() * 1000.0);
            } else {
                *errors.borrow_mut() += 1;
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let sending_for = fired_at.elapsed().as_secs_f64();

    let mut lat = latencies.borrow().clone();
    let (p50, p99) = (percentile(&mut lat, 0.50), percentile(&mut lat, 0.99));
    let mut sent = 0u64;
    let mut max_per_60s = 0usize;
    for id in &ids {
        let account = herald_actors::domain::AccountId::parse(id)?;
        sent += sim.delivered(&account);
        max_per_60s = max_per_60s.max(sim.max_in_any_60s(&account));
    }
    // An account's first token comes after 60/RATE s (the bucket starts empty).
    let per_account_ideal = ((sending_for - 60.0 / f64::from(RATE)) * f64::from(RATE) / 60.0)
        .floor()
        .max(0.0)
        + 1.0;
    let expected = per_account_ideal as u64 * accounts as u64;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!(
        "control: accounts={accounts} rps={rps} seconds={seconds} requests={} achieved_rps={:.0} errors={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} sent={sent} expected_sent={expected} pace={:.3} max_per_60s={max_per_60s}",
        lat.len() as u64 + *errors.borrow(),
        (lat.len() as u64 + *errors.borrow()) as f64 / elapsed,
        *errors.borrow(),
        p50,
        p99,
        lat.last().copied().unwrap_or(f64::NAN),
        sent as f64 / expected.max(1) as f64,
    ))
}

/// POSTs JSON and answers the JSON reply; a non-2xx status is an error
/// naming the URL, the status and the body.
pub(super) async fn post(http: &awc::Client, url: &str, body: Value) -> anyhow::Result<Value> {
    let sent = http.post(url).send_json(&body).await;
    let bytes = super::ok_body(sent, &format!("POST {url}"), 16 << 20).await?;
    Ok(serde_json::from_slice(&bytes)?)
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "herald-bench-control-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
