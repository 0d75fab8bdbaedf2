//! `herald bench sessions`: how many real-protocol WhatsApp accounts one
//! node holds. The real whatsapp-rust client of each account, on sessions
//! in Herald's store (`--db`: SQLite in a temporary file, or a scratch
//! PostgreSQL database), against the fake WhatsApp Web server on loopback:
//!
//! - `accounts` devices are written into the store as after pairing (no
//!   pairing is spent; the server holds their pre-keys, so no login uploads
//!   any, unless `--first-logins`), then all are connected and held idle
//!   once their post-login work is written: RSS and its
//!   growth per account, idle CPU, threads, open files;
//! - a restart: every client stopped, a new gateway on the same store,
//!   time until all are logged in again and the peak logins in any second
//!   the server saw (paced by `whatsapp.logins_per_sec`), the database
//!   connections sqlx handed out only after its slow threshold (2 s), and
//!   how long the engine's run marks took while the storm went on (a run
//!   due mid-storm must not wait for the logins);
//! - a fan-out: one more account, paired by QR by the real client, sends to
//!   `groups` groups of `members` members with `devices` devices each,
//!   straight through the gateway (no rate limits: the protocol's cost). The
//!   first send to a group opens a Signal session with every member device
//!   and hands it the group's sender key; later sends only encrypt once.
//!
//! With `--fake-process` the fake server is a process of its own
//! (`herald fake-whatsapp serve`, driven over its HTTP control): RSS, CPU,
//! threads and files are Herald's alone, and the line says `fake=process`.
//! Otherwise it shares the process (`fake=thread`): CPU figures leave out
//! its threads, but RSS includes its side of each connection (an upper
//! bound for Herald's).

use super::percentile;
use super::scale::{cpu_ticks, rss_kb, rss_kb_of, stat_ticks, ticks_per_second};
use crate::gateway::whatsapp::store::SessionStore;
use crate::gateway::whatsapp::{WhatsappConfig, WhatsappGateway};
use crate::seal::key_file::open_key;
use crate::store::SqlStore;
use anyhow::Context as _;
use herald_actors::domain::*;
use herald_actors::ports::{AccountStore, NewAccount, StoreBase as _};
use herald_fake_whatsapp::FakeWhatsApp;
use std::time::{Duration, Instant};
use whatsapp_rust::wacore::store::traits::DeviceStore as _;

#[derive(Debug, Clone)]
pub struct SessionsArgs {
    pub accounts: usize,
    /// The fake server in a process of its own.
    pub fake_process: bool,
    /// As for [`super::ScratchDb::create`].
    pub db: String,
    /// Devices whose pre-keys the server does not have yet: each login
    /// uploads 812 and writes them.
    pub first_logins: bool,
    /// Idle stretch measured for CPU.
    pub idle: Duration,
    pub logins_per_sec: u32,
    /// Limit for all accounts to log in (each phase).
    pub within: Duration,
    pub fan_out: FanOut,
}

/// The fan-out phase's groups.
#[derive(Debug, Clone)]
pub struct FanOut {
    pub groups: usize,
    /// Other members of each group (no member is in two groups).
    pub members: usize,
    /// Devices of each member (the phone and companions).
    pub devices: u32,
    /// Sends to every group after the first.
    pub later_rounds: usize,
}

/// The fake WhatsApp server the benchmark runs against.
enum Fake {
    /// In this process, on threads of its own.
    Thread(FakeWhatsApp),
    /// `herald fake-whatsapp serve`, driven over its HTTP control.
    Process(FakeProcess),
}

struct FakeProcess {
    child: std::process::Child,
    control: String,
    websocket: String,
    http: awc::Client,
}

impl FakeProcess {
    /// One request to the control; a status other than 2xx is an error
    /// naming the request, the status and the body. Answers the body.
    async fn call(
        &self,
        method: awc::http::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<Vec<u8>> {
        let url = format!("{}{path}", self.control);
        let req = self.http.request(method.clone(), &url);
        let sent = match &body {
            Some(b) => req.send_json(b).await,
            None => req.send().await,
        };
        super::ok_body(sent, &format!("{method} {url}"), 64 << 20).await
    }
}

impl Drop for FakeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `GET /stats` answers (computed in place for a fake in-process).
#[derive(Debug, Clone, Default, serde::Deserialize)]
struct Stats {
    phone: String,
    /// Connections that logged in (got past `<success>`).
    logins: usize,
    handshakes: usize,
    /// Stanzas other than keep-alive pings.
    busy: usize,
    key_shares: usize,
}

impl Fake {
    async fn start(process: bool) -> anyhow::Result<Self> {
        if !process {
            // It blocks on a runtime of its own while it binds: not from this one.
            let fake = std::thread::spawn(FakeWhatsApp::start)
                .join()
                .map_err(|_| anyhow::anyhow!("the fake WhatsApp server did not start"))?;
            fake.shallow_log();
            return Ok(Self::Thread(fake));
        }
        let exe = std::env::current_exe()?;
        let mut child = std::process::Command::new(exe)
            .args(["fake-whatsapp", "serve", "--shallow-log"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting `herald fake-whatsapp serve`")?;
        let stdout = child.stdout.take().context("its stdout")?;
        // "fake-whatsapp: control on http://ADDR, websocket on URL"
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
                .map(|_| line)
        })
        .await??;
        let (control, websocket) = line
            .trim()
            .strip_prefix("fake-whatsapp: control on ")
            .and_then(|rest| rest.split_once(", websocket on "))
            .with_context(|| format!("unexpected first line: {line:?}"))?;
        let http = awc::Client::builder()
            .timeout(Duration::from_secs(600))
            .finish();
        Ok(Self::Process(FakeProcess {
            control: control.to_owned(),
            websocket: websocket.to_owned(),
            child,
            http,
        }))
    }

    fn label(&self) -> &'static str {
        match self {
            Self::Thread(_) => "thread",
            Self::Process(_) => "process",
        }
    }

    fn url(&self) -> String {
        match self {
            Self::Thread(f) => f.url(),
            Self::Process(p) => p.websocket.clone(),
        }
    }

    /// The fake process's resident memory, in KiB (none in-process).
    fn own_rss_kb(&self) -> Option<u64> {
        match self {
            Self::Thread(_) => None,
            Self::Process(p) => rss_kb_of(&format!("/proc/{}/status", p.child.id())).ok(),
        }
    }

    async fn stats(&self) -> anyhow::Result<Stats> {
        use super::fake_server::{busy, key_shares, logins};
        match self {
            Self::Thread(f) => Ok(Stats {
                phone: f.phone().user.clone(),
                logins: logins(f),
                handshakes: f.log(|l| l.handshakes().len()),
                busy: busy(f),
                key_shares: key_shares(f),
            }),
            Self::Process(p) => {
                let body = p.call(awc::http::Method::GET, "/stats", None).await?;
                Ok(serde_json::from_slice(&body)?)
            }
        }
    }

    /// `n` groups of `members` members with `devices` devices each, their
    /// keys made now; answers their JIDs.
    async fn set_groups(
        &self,
        n: usize,
        members: usize,
        devices: u32,
    ) -> anyhow::Result<Vec<String>> {
        match self {
            Self::Thread(f) => {
                let groups = FakeWhatsApp::numbered_groups(n, members, 0);
                let jids = groups.iter().map(|g| g.jid.clone()).collect();
                f.set_groups(groups);
                f.set_member_devices(devices);
                f.prepare_keys();
                Ok(jids)
            }
            Self::Process(p) => {
                let body = serde_json::json!({
                    "count": n, "members": members, "devices": devices, "prepare_keys": true,
                });
                let answer = p
                    .call(awc::http::Method::PUT, "/groups", Some(body))
                    .await?;
                let v: serde_json::Value = serde_json::from_slice(&answer)?;
                serde_json::from_value(v["groups"].clone()).context("the groups' JIDs")
            }
        }
    }

    /// The account's phone scans `qr`.
    async fn scan(&self, qr: &str) -> anyhow::Result<()> {
        match self {
            Self::Thread(f) => f.scan(qr).map_err(|e| anyhow::anyhow!("scanning: {e}")),
            Self::Process(p) => {
                let body = serde_json::json!({ "qr": qr });
                p.call(awc::http::Method::POST, "/phone/scan", Some(body))
                    .await
                    .context("scanning")?;
                Ok(())
            }
        }
    }
}

/// CPU ticks of this process less those of the fake server's threads:
/// Herald's side (a thread that has ended still counts for the process).
fn herald_ticks() -> anyhow::Result<u64> {
    let mut fake = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else {
            continue;
        };
        if stat.contains("(fake-whatsapp)") {
            fake += stat_ticks(&stat)?;
        }
    }
    Ok(cpu_ticks()?.saturating_sub(fake))
}

/// Ticks between two [`herald_ticks`] readings (each rounds per thread, so
/// a later one can read a tick lower).
fn since(before: u64) -> anyhow::Result<u64> {
    Ok(herald_ticks()?.saturating_sub(before))
}

/// Milliseconds of CPU in `ticks`.
fn ticks_ms(ticks: u64) -> f64 {
    ticks as f64 * 1000.0 / ticks_per_second()
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

/// A run's targets marked `sending` then `sent` every 100 ms, as the
/// engine marks a run due in the middle of a login storm: how long each
/// mark took to commit.
struct MarkProbe<'a> {
    store: &'a SqlStore,
    targets: Vec<i64>,
}

impl<'a> MarkProbe<'a> {
    /// Targets for a storm of up to 10 minutes.
    const TARGETS: usize = 6000;

    async fn new(store: &'a SqlStore, account: &AccountId) -> anyhow::Result<Self> {
        use herald_actors::ports::RunStore as _;
        let run = super::running_run(store, account, "mid-storm run", chrono::Utc::now()).await?;
        let groups = (0..Self::TARGETS)
            .map(|i| GroupJid::parse(&format!("120363{i:012}@g.us")))
            .collect::<Result<Vec<_>, _>>()?;
        store.create_targets(run, &groups).await?;
        let targets = store
            .list_targets(run, None, None, 0)
            .await?
            .iter()
            .map(|t| t.id)
            .collect();
        Ok(Self { store, targets })
    }

    /// Runs `work`, marking one target every 100 ms beside it until it is
    /// done; answers its outcome and each mark's milliseconds.
    async fn during<T>(
        self,
        work: impl std::future::Future<Output = T>,
    ) -> anyhow::Result<(T, Vec<f64>)> {
        use herald_actors::ports::RunStore as _;
        let done = std::cell::Cell::new(false);
        let work = async {
            let out = work.await;
            done.set(true);
            out
        };
        let probe = async {
            let mut took = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for id in self.targets {
                tick.tick().await;
                if done.get() {
                    break;
                }
                let started = Instant::now();
                self.store
                    .apply_transitions(&[Transition::Sending {
                        target_id: id,
                        part: 0,
                        message_id: format!("3EB0{id:016X}"),
                    }])
                    .await?;
                self.store
                    .apply_transitions(&[Transition::Sent {
                        target_id: id,
                        part: 0,
                        last: true,
                        at: chrono::Utc::now(),
                        latency_ms: 0,
                    }])
                    .await?;
                took.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            anyhow::Ok(took)
        };
        let (out, took) = tokio::join!(work, probe);
        Ok((out, took?))
    }
}

/// Waits until `want` logins in all; answers the time it took and the
/// most logins the server saw start in any one second.
async fn wait_logins(fake: &Fake, want: usize, within: Duration) -> anyhow::Result<(f64, usize)> {
    let start = Instant::now();
    let mut samples: Vec<(Instant, usize)> = vec![(start, fake.stats().await?.handshakes)];
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = fake.stats().await?;
        samples.push((Instant::now(), stats.handshakes));
        if stats.logins >= want {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < within,
            "only {} of {want} accounts logged in within {within:?}",
            stats.logins
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

/// Waits until the server has received nothing but keep-alive pings and
/// Herald has written nothing to the sessions for `quiet` (at most
/// `limit`): the logins' own work (app-state sync, device lists) is done.
async fn settle(
    fake: &Fake,
    sessions: &SessionStore,
    quiet: Duration,
    limit: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mark = async || anyhow::Ok((fake.stats().await?.busy, sessions.rows().commits().1));
    let (mut last, mut since) = (mark().await?, Instant::now());
    while since.elapsed() < quiet && start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = mark().await?;
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    Ok(())
}

pub async fn run(args: &SessionsArgs) -> anyhow::Result<String> {
    let fake = Fake::start(args.fake_process).await?;
    let dir = std::env::temp_dir().join(format!(
        "herald-bench-sessions-{:08x}",
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir)?;
    let scratch = super::ScratchDb::create(&args.db).await?;
    let out = match SqlStore::connect(&scratch.url).await {
        Ok(sql) => {
            let out = drive(args, &fake, &sql, &scratch.url, &dir).await;
            sql.close().await;
            out
        }
        Err(e) => Err(e),
    };
    scratch.cleanup().await?;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// The session store a gateway of the benchmark writes through. On
/// PostgreSQL a pool of its own: a connection opened on a gateway's
/// runtime lives on that runtime's I/O driver and dies with it, and the
/// benchmark drops each gateway it makes (a daemon makes one for its life).
async fn gateway_sessions(
    sql: &SqlStore,
    url: &str,
    key: &crate::seal::SessionKey,
) -> anyhow::Result<(SessionStore, Option<SqlStore>)> {
    use herald_actors::ports::StoreBase as _;
    let own = match sql.backend() {
        "postgres" => Some(SqlStore::connect(url).await?),
        _ => None,
    };
    let rows = own.as_ref().unwrap_or(sql).wa_rows();
    Ok((SessionStore::new(rows, key.clone()), own))
}

/// Closes a gateway's own pool once the gateway is gone; its connections'
/// runtime may be gone too, so it is not waited on for long.
async fn close_own(own: Option<SqlStore>) {
    if let Some(own) = own {
        let _ = tokio::time::timeout(Duration::from_secs(5), own.close()).await;
    }
}

async fn drive(
    args: &SessionsArgs,
    fake: &Fake,
    sql: &SqlStore,
    url: &str,
    dir: &std::path::Path,
) -> anyhow::Result<String> {
    let key = open_key(&dir.join("session.key"), &sql.sealed()).await?;
    let sessions = SessionStore::new(sql.wa_rows(), key.clone());
    let user = fake.stats().await?.phone;
    let mut accounts = Vec::with_capacity(args.accounts);
    for i in 0..args.accounts {
        let id = AccountId::parse(&format!("bench-{i:05}"))?;
        let new = NewAccount::named_by_id(id, GatewayKind::Whatsapp, AccountState::Connected);
        let account = sql.create_account(&new, chrono::Utc::now()).await?;
        // As after pairing: a device of the fake phone's account.
        let mut device = whatsapp_rust::wacore::store::Device::new();
        device.pn = Some(format!("{user}:{}@s.whatsapp.net", i + 10).parse()?);
        // Pairing uploaded its pre-keys, so a restart's logins upload none.
        // `--first-logins`: none uploaded yet, so every login generates and
        // writes 812 (a storm of accounts brought in at once).
        device.server_has_prekeys = !args.first_logins;
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
    let (sessions, own) = gateway_sessions(sql, url, &key).await?;
    let gateway = WhatsappGateway::new(config.clone(), dir, sessions.clone())?;
    gateway.resume(&accounts);
    let (connect_s, _) = wait_logins(fake, args.accounts, args.within)
        .await
        .context("connecting")?;
    // Let post-login housekeeping (app-state sync, queries) finish: idle
    // is once neither the server nor the store has seen work for 3 s.
    settle(fake, &sessions, Duration::from_secs(3), args.within).await?;
    let rss = rss_kb()?;
    let fake_rss = fake
        .own_rss_kb()
        .map_or("-".to_owned(), |kb| format!("{:.1}", kb as f64 / 1024.0));
    let (threads, files) = (threads(), open_files());
    let ticks = herald_ticks()?;
    tokio::time::sleep(args.idle).await;
    let idle_cpu_pct = ticks_ms(since(ticks)?) / 1000.0 / args.idle.as_secs_f64() * 100.0;

    // A restart: the clients stop, a new gateway logs them all in again.
    gateway.shutdown().await;
    drop(gateway);
    let before = fake.stats().await?.logins;
    close_own(own).await;
    let probe = MarkProbe::new(sql, &accounts[0].id).await?;
    let (sessions, own) = gateway_sessions(sql, url, &key).await?;
    let gateway = WhatsappGateway::new(config.clone(), dir, sessions.clone())?;
    gateway.resume(&accounts);
    let storm = wait_logins(fake, before + args.accounts, args.within);
    let (reconnect, mut marks) = probe.during(storm).await?;
    let (reconnect_s, peak) = reconnect.context("reconnecting")?;
    gateway.shutdown().await;
    drop(gateway);
    let slow = crate::telemetry::slow_acquires();

    close_own(own).await;
    let (sessions, own) = gateway_sessions(sql, url, &key).await?;
    let sent = fan_out(fake, sql, dir, config, sessions, &args.fan_out).await;
    close_own(own).await;
    let mut sent = sent.context("fan-out")?;

    let grown_kb = rss.saturating_sub(base_rss) as f64;
    Ok(format!(
        "sessions: fake={} db={} first_logins={} accounts={} rss_mb={:.1} fake_rss_mb={} rss_per_account_kb={:.0} idle_cpu_pct={:.2} threads={} fds={} connect_s={:.2} reconnect_s={:.2} peak_logins_per_s={} logins_per_sec={} slow_acquires={} slow_acquire_max_s={:.1} storm_mark_ms_p50={:.1} storm_mark_ms_max={:.1} group_devices={} x25519={} first_send_ms_p50={:.1} first_send_cpu_ms={:.1} send_ms_p50={:.2} send_cpu_us={:.0} sends_per_core_s={:.0}",
        fake.label(),
        sql.backend(),
        args.first_logins,
        args.accounts,
        rss as f64 / 1024.0,
        fake_rss,
        grown_kb / args.accounts.max(1) as f64,
        idle_cpu_pct,
        threads,
        files,
        connect_s,
        reconnect_s,
        peak,
        args.logins_per_sec,
        slow.count,
        slow.max_secs,
        percentile(&mut marks, 0.5),
        percentile(&mut marks, 1.0),
        sent.group_devices,
        crate::gateway::whatsapp::crypto::in_use().name(),
        percentile(&mut sent.first_ms, 0.5),
        sent.first_cpu_ms,
        percentile(&mut sent.later_ms, 0.5),
        sent.later_cpu_us,
        if sent.later_cpu_us > 0.0 { 1e6 / sent.later_cpu_us } else { 0.0 },
    ))
}

struct Sent {
    /// Member devices of a group, the account's own other devices included.
    group_devices: usize,
    first_ms: Vec<f64>,
    /// CPU per first send, on average.
    first_cpu_ms: f64,
    later_ms: Vec<f64>,
    /// CPU per later send, on average.
    later_cpu_us: f64,
}

/// Pairs one more account by QR (the fake phone scans it) and sends to
/// every group: once (the first send), then `later_rounds` times more.
async fn fan_out(
    fake: &Fake,
    sql: &SqlStore,
    dir: &std::path::Path,
    config: WhatsappConfig,
    sessions: SessionStore,
    f: &FanOut,
) -> anyhow::Result<Sent> {
    use herald_actors::ports::{Gateway as _, OutgoingMessage};
    let groups = fake.set_groups(f.groups, f.members, f.devices).await?;
    let id = AccountId::parse("fan-out")?;
    let new = NewAccount::named_by_id(id, GatewayKind::Whatsapp, AccountState::Pairing);
    let account = sql.create_account(&new, chrono::Utc::now()).await?;
    let gateway = WhatsappGateway::new(config, dir, sessions)?;
    let view = gateway
        .start_pairing(&account, None)
        .await
        .map_err(|e| anyhow::anyhow!("pairing: {e}"))?;
    let qr = view.qr.context("no QR code to scan")?;
    fake.scan(&qr).await?;
    let paired = Instant::now();
    while gateway.pairing(&account).await.state != "paired" {
        anyhow::ensure!(
            paired.elapsed() < Duration::from_secs(60),
            "not paired within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gateway
        .ready(&account.id)
        .await
        .map_err(|e| anyhow::anyhow!("not ready to send: {e}"))?;
    let message = OutgoingMessage::Text("Fan-out benchmark: stand-up at 10:00.".into());
    let send_all = |round: usize| {
        let (gateway, groups, id, message) = (&gateway, &groups, &account.id, &message);
        async move {
            let mut took = Vec::with_capacity(groups.len());
            let ticks = herald_ticks()?;
            for (i, g) in groups.iter().enumerate() {
                let started = Instant::now();
                gateway
                    .send(
                        id,
                        &GroupJid::parse(g)?,
                        message,
                        &format!("fan-out-{round}-{i}"),
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("send {round} to {g}: {e}"))?;
                took.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            anyhow::Ok((took, ticks_ms(since(ticks)?)))
        }
    };
    let (first_ms, first_cpu) = send_all(0).await?;
    let (mut later_ms, mut later_cpu) = (Vec::new(), 0.0);
    for round in 1..=f.later_rounds {
        let (took, cpu) = send_all(round).await?;
        later_ms.extend(took);
        later_cpu += cpu;
    }
    let key_shares = fake.stats().await?.key_shares;
    gateway.shutdown().await;
    Ok(Sent {
        group_devices: key_shares,
        first_cpu_ms: first_cpu / f.groups.max(1) as f64,
        first_ms,
        later_cpu_us: later_cpu * 1000.0 / later_ms.len().max(1) as f64,
        later_ms,
    })
}
