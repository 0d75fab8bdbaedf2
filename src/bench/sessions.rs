//! `herald bench sessions`: how many real-protocol WhatsApp accounts one
//! node holds. The real whatsapp-rust client of each account, on sessions
//! in Herald's store (SQLite in a temporary directory), against the fake
//! WhatsApp Web server on loopback in this process:
//!
//! - `accounts` devices are written into the store as after pairing (no
//!   pairing is spent), then all are connected and held idle: RSS and its
//!   growth per account, idle CPU, threads, open files;
//! - a restart: every client stopped, a new gateway on the same store,
//!   time until all are logged in again and the peak logins in any second
//!   the server saw (paced by `whatsapp.logins_per_sec`).
//!
//! The fake server shares the process, so the figures include its side of
//! each connection: an upper bound for Herald's own.

use super::scale::{cpu_ticks, rss_kb};
use crate::bench::fake_whatsapp::FakeWhatsApp;
use crate::gateway::whatsapp::store::{open_key, SessionStore};
use crate::gateway::whatsapp::{WhatsappConfig, WhatsappGateway};
use crate::store::SqlStore;
use anyhow::Context as _;
use herald_actors::domain::*;
use herald_actors::ports::{AccountStore, NewAccount};
use std::time::{Duration, Instant};
use whatsapp_rust::wacore::store::traits::DeviceStore as _;

#[derive(Debug, Clone)]
pub struct SessionsArgs {
    pub accounts: usize,
    /// Idle stretch measured for CPU.
    pub idle: Duration,
    pub logins_per_sec: u32,
    /// Limit for all accounts to log in (each phase).
    pub within: Duration,
}

/// Logins that got past `<success>`: the client leaves passive mode.
fn logged_in(fake: &FakeWhatsApp) -> usize {
    fake.log(|l| {
        l.stanzas()
            .filter(|(_, n)| n.tag == "iq" && n.attrs.get("xmlns").is_some_and(|x| *x == "passive"))
            .map(|(c, _)| c)
            .collect::<std::collections::HashSet<_>>()
            .len()
    })
}

fn threads() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Waits until `want` logins in all; answers the time it took and the
/// most logins the server saw start in any one second.
async fn wait_logins(
    fake: &FakeWhatsApp,
    want: usize,
    within: Duration,
) -> anyhow::Result<(f64, usize)> {
    let start = Instant::now();
    let handshakes = || fake.log(|l| l.handshakes().len());
    let mut samples: Vec<(Instant, usize)> = vec![(start, handshakes())];
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        samples.push((Instant::now(), handshakes()));
        if logged_in(fake) >= want {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < within,
            "only {} of {want} accounts logged in within {within:?}",
            logged_in(fake)
        );
    }
    let mut peak = 0;
    for (i, (t, n)) in samples.iter().enumerate() {
        let later = samples[i..]
            .iter()
            .take_while(|(u, _)| *u - *t < Duration::from_secs(1))
            .last()
            .map_or(*n, |(_, m)| *m);
        peak = peak.max(later - n);
    }
    Ok((start.elapsed().as_secs_f64(), peak))
}

pub async fn run(args: &SessionsArgs) -> anyhow::Result<String> {
    // It blocks on a runtime of its own while it binds: not from this one.
    let fake = std::thread::spawn(FakeWhatsApp::start)
        .join()
        .map_err(|_| anyhow::anyhow!("the fake WhatsApp server did not start"))?;
    let dir = std::env::temp_dir().join(format!(
        "herald-bench-sessions-{:08x}",
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir)?;
    let sql = SqlStore::connect(&format!("sqlite://{}", dir.join("herald.db").display())).await?;
    let key = open_key(&dir.join("session.key"), &sql.wa_rows()).await?;
    let sessions = SessionStore::new(sql.wa_rows(), key);
    let user = fake.phone().user.clone();
    let mut accounts = Vec::with_capacity(args.accounts);
    for i in 0..args.accounts {
        let account = sql
            .create_account(
                &NewAccount {
                    id: AccountId::parse(&format!("bench-{i:05}"))?,
                    name: format!("Bench {i}"),
                    kind: GatewayKind::Whatsapp,
                    state: AccountState::Connected,
                    limits: AccountLimits::default(),
                },
                chrono::Utc::now(),
            )
            .await?;
        // As after pairing: a device of the fake phone's account.
        let mut device = whatsapp_rust::wacore::store::Device::new();
        device.pn = Some(format!("{user}:{}@s.whatsapp.net", i + 10).parse()?);
        sessions.backend(&account.id).save(&device).await?;
        accounts.push(account);
    }
    let config = WhatsappConfig {
        transport_url: Some(fake.url()),
        version_override: Some((2, 3000, 1_027_000_000)),
        logins_per_sec: args.logins_per_sec,
        ..WhatsappConfig::default()
    };
    let base_rss = rss_kb()?;
    let gateway = WhatsappGateway::new(config.clone(), &dir, sessions.clone())?;
    gateway.resume(&accounts);
    let (connect_s, _) = wait_logins(&fake, args.accounts, args.within)
        .await
        .context("connecting")?;
    // Let post-login housekeeping (pre-key uploads, queries) finish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss = rss_kb()?;
    let (threads, files) = (threads(), open_files());
    let ticks = cpu_ticks()?;
    tokio::time::sleep(args.idle).await;
    let idle_cpu_pct = (cpu_ticks()? - ticks) as f64 / 100.0 / args.idle.as_secs_f64() * 100.0;

    // A restart: the clients stop, a new gateway logs them all in again.
    gateway.shutdown().await;
    drop(gateway);
    let before = logged_in(&fake);
    let gateway = WhatsappGateway::new(config, &dir, sessions)?;
    gateway.resume(&accounts);
    let (reconnect_s, peak) = wait_logins(&fake, before + args.accounts, args.within)
        .await
        .context("reconnecting")?;
    gateway.shutdown().await;
    drop(gateway);
    sql.close().await;
    let _ = std::fs::remove_dir_all(&dir);

    let grown_kb = rss.saturating_sub(base_rss) as f64;
    Ok(format!(
        "sessions: accounts={} rss_mb={:.1} rss_per_account_kb={:.0} idle_cpu_pct={:.2} threads={} fds={} connect_s={:.2} reconnect_s={:.2} peak_logins_per_s={} logins_per_sec={}",
        args.accounts,
        rss as f64 / 1024.0,
        grown_kb / args.accounts.max(1) as f64,
        idle_cpu_pct,
        threads,
        files,
        connect_s,
        reconnect_s,
        peak,
        args.logins_per_sec,
    ))
}
