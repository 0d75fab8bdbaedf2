//! `herald simulate`: the real engine against the simulated WhatsApp on
//! virtual time. An operator's capacity planner ("does a 1000-group picture
//! reminder fit in my window at 40/min?") and our acceptance benchmark.

use anyhow::{bail, Context};
use chrono::{NaiveDate, NaiveTime, Utc};
use herald_actors::delivery::engine::{EngineConfig, TypingConfig};
use herald_actors::domain::*;
use herald_actors::simulator::risk::{RiskModel, Sign, Verdict};
use herald_actors::simulator::{Latency, SimConfig};
use herald_actors::world::SimWorld;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Accounts firing at the same minute, each to its own groups.
    #[arg(long, default_value_t = 1)]
    pub accounts: usize,
    /// Groups per account.
    #[arg(long, default_value_t = 1000)]
    pub groups: usize,
    /// What each group receives: text, image (with caption) or text+image.
    #[arg(long, default_value = "image")]
    pub parts: String,
    /// Size of the picture in bytes.
    #[arg(long, default_value_t = 1_048_576)]
    pub media_bytes: usize,
    /// Messages per minute per account.
    #[arg(long, default_value_t = 40)]
    pub rate: u32,
    /// Groups in flight per account.
    #[arg(long, default_value_t = 3)]
    pub group_concurrency: u32,
    /// Delivery window, START-END hours in the timezone (e.g. 06-18, 22-06).
    #[arg(long, default_value = "06-18")]
    pub window: String,
    #[arg(long, default_value = "Asia/Kuala_Lumpur")]
    pub timezone: String,
    /// Local time the reminder fires.
    #[arg(long, default_value = "09:00")]
    pub start: String,
    /// Local date (default: today in the timezone).
    #[arg(long)]
    pub date: Option<String>,
    /// Simulated per-message latency range in ms, MIN-MAX.
    #[arg(long, default_value = "80-400")]
    pub latency_ms: String,
    /// Simulated upload bandwidth, bytes per second.
    #[arg(long, default_value_t = 2_000_000)]
    pub upload_bps: u64,
    /// Judge the sends with the ban-risk model (identical content,
    /// regular intervals, no typing, volume above the account's age).
    #[arg(long)]
    pub risk: bool,
    /// Age of the simulated accounts in days (the risk model's allowance).
    #[arg(long, default_value_t = 365)]
    pub account_age_days: u32,
    /// Spread of the gaps between sends around their mean (0 = regular).
    #[arg(long, default_value_t = 0.5)]
    pub jitter: f64,
    /// The mean gap as a multiple of the limit's spacing
    /// (`delivery.pace_slack`).
    #[arg(long, default_value_t = 0.9)]
    pub slack: f64,
    /// Typing presence before each message.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub typing: bool,
    /// Vary the text per group (a template with alternatives and the
    /// "no two groups alike" option); false sends identical bytes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub variation: bool,
}

/// The varied wording `--variation` sends: 17,280 variants.
const VARIED_TEXT: &str = "{Reminder: |Heads up: |}{Hello|Hi|Good morning|Hey|Dear all} {team|everyone|folks|all}, \
    {the|our} {standup|daily standup|team sync|check-in} {starts|begins|is} {at|from} {time} {today|this morning}{.|!| :)}";
const PLAIN_TEXT: &str = "Reminder: standup at 09:30";

#[derive(Debug, Clone, PartialEq)]
pub struct SimulateOutcome {
    pub accounts: usize,
    pub groups: usize,
    pub messages: u64,
    pub ideal_min: f64,
    pub took_min: f64,
    pub efficiency: f64,
    pub max_per_60s: usize,
    pub uploads: u64,
    pub upload_bytes: u64,
    pub duplicates: u64,
    pub status: String,
    pub runs: Vec<Run>,
    /// Risk-model warnings and temporary bans over all accounts.
    pub warnings: u64,
    pub bans: u64,
    /// One line per warning or ban, for the operator.
    pub risk_lines: Vec<String>,
}

impl SimulateOutcome {
    pub fn last_line(&self) -> String {
        format!(
            "simulate: accounts={} groups={} messages={} ideal_min={:.1} took_min={:.1} efficiency={:.3} max_per_60s={} uploads={} upload_bytes={} duplicates={} warnings={} bans={} status={}",
            self.accounts, self.groups, self.messages, self.ideal_min, self.took_min, self.efficiency,
            self.max_per_60s, self.uploads, self.upload_bytes, self.duplicates, self.warnings,
            self.bans, self.status
        )
    }
}

fn parse_pair(s: &str, what: &str) -> anyhow::Result<(i64, i64)> {
    let (a, b) = s
        .split_once('-')
        .with_context(|| format!("--{what} must look like A-B, got {s:?}"))?;
    Ok((
        a.trim()
            .parse()
            .with_context(|| format!("--{what}: {a:?} is not a number"))?,
        b.trim()
            .parse()
            .with_context(|| format!("--{what}: {b:?} is not a number"))?,
    ))
}

/// Runs the simulation; call inside an actix system on virtual time
/// ([`herald_actors::world::virtual_time_system`]), or its sends take real time.
pub async fn simulate(args: &SimulateArgs) -> anyhow::Result<SimulateOutcome> {
    if args.accounts == 0 || args.groups == 0 {
        bail!("--accounts and --groups must be at least 1");
    }
    if args.rate == 0 {
        bail!("--rate must be at least 1");
    }
    let tz =
        TimeZone::parse(&args.timezone).map_err(|e| anyhow::anyhow!("--timezone: {}", e.rule))?;
    let (ws, we) = parse_pair(&args.window, "window")?;
    let window = WindowHours::parse(ws, we).map_err(|e| anyhow::anyhow!("--window: {e}"))?;
    let (lat_min, lat_max) = parse_pair(&args.latency_ms, "latency-ms")?;
    if lat_min < 0 || lat_min > lat_max {
        bail!("--latency-ms: MIN-MAX with 0 <= MIN <= MAX");
    }
    if !(0.5..=2.0).contains(&args.slack) {
        bail!("--slack must be between 0.5 and 2");
    }
    if !(0.0..=0.95).contains(&args.jitter) {
        bail!("--jitter must be between 0 and 0.95");
    }
    let time = NaiveTime::parse_from_str(&args.start, "%H:%M").context("--start must be HH:MM")?;
    let date = match &args.date {
        Some(d) => NaiveDate::parse_from_str(d, "%Y-%m-%d").context("--date must be YYYY-MM-DD")?,
        None => Utc::now().with_timezone(&tz.tz()).date_naive(),
    };
    let start = herald_actors::domain::resolve_local(tz.tz(), date.and_time(time));

    let sim = SimConfig {
        latency: Latency::Uniform {
            min: Duration::from_millis(lat_min as u64),
            max: Duration::from_millis(lat_max as u64),
        },
        upload_bytes_per_sec: Some(args.upload_bps.max(1)),
        // WhatsApp's own limit sits above the configured safe rate.
        rate_limit_per_minute: Some(args.rate.max(60) + args.rate / 2),
        risk: args.risk.then(RiskModel::default),
        account_age_days: args.account_age_days,
        ..SimConfig::default()
    };
    let engine = EngineConfig {
        max_per_minute: args.rate,
        group_concurrency: args.group_concurrency.max(1),
        fire_concurrency: 0,
        pace_jitter: args.jitter,
        pace_slack: args.slack,
        typing: if args.typing {
            TypingConfig::default()
        } else {
            TypingConfig::OFF
        },
        // A fixed seed: the same arguments give the same figures.
        seed: 1,
        ..EngineConfig::default()
    };
    let world = SimWorld::start(sim, engine, start);
    let media = if args.parts.contains("image") {
        // Distinct bytes per run of the simulator are not needed: one picture.
        Some(
            world
                .add_media(vec![0x42; args.media_bytes], "image/jpeg")
                .await,
        )
    } else {
        None
    };
    let text = if args.variation {
        VARIED_TEXT
    } else {
        PLAIN_TEXT
    };
    let parts: Vec<MessagePart> = match args.parts.as_str() {
        "text" => vec![MessagePart::text(text)?],
        "image" => vec![MessagePart::media(media.clone().unwrap(), Some(text))?],
        "text+image" => vec![
            MessagePart::text(text)?,
            MessagePart::media(media.clone().unwrap(), Some("Today's agenda"))?,
        ],
        other => bail!("--parts must be text, image or text+image, got {other:?}"),
    };
    let mut runs = Vec::new();
    let mut accounts = Vec::new();
    for i in 0..args.accounts {
        let (a, groups) = world
            .add_account(
                &format!("sim-{}", i + 1),
                args.groups,
                AccountLimits::default(),
            )
            .await;
        let r = herald_actors::world::reminder(&a, tz.name(), window, parts.clone(), groups)
            .with_unique_texts(args.variation && args.parts == "text")
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        accounts.push(a);
        runs.push(r);
    }
    let mut ids = Vec::new();
    for r in &runs {
        ids.push(world.fire(r).await);
    }
    let mut finished = Vec::new();
    for id in ids {
        // Two days of virtual time is more than any window.
        finished.push(world.wait_final(id, Duration::from_secs(48 * 3600)).await);
    }
    let last_finish = finished
        .iter()
        .filter_map(|r| r.finished_at)
        .max()
        .unwrap_or(start);
    let took_min = (last_finish - start).num_milliseconds() as f64 / 60_000.0;
    let per_account = args.groups as u64 * parts.len() as u64;
    let messages = per_account * args.accounts as u64;
    let ideal_min = per_account as f64 / f64::from(args.rate);
    let mut statuses: Vec<&str> = finished.iter().map(|r| r.status.as_str()).collect();
    statuses.dedup();
    let mut risk_lines = Vec::new();
    for a in &accounts {
        for (at, verdict) in world.sim.risk_log(a) {
            let local = |t: chrono::DateTime<Utc>| {
                t.with_timezone(&tz.tz())
                    .format("%Y-%m-%d %H:%M")
                    .to_string()
            };
            let signs = |s: &[Sign]| s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
            risk_lines.push(match verdict {
                Verdict::Fine => continue,
                Verdict::Warning(s) => {
                    format!(
                        "risk: account {a} warned at {} for {}",
                        local(at),
                        signs(&s)
                    )
                }
                Verdict::Ban { until, signs: s } => format!(
                    "risk: account {a} temporarily banned at {} until {} for {}",
                    local(at),
                    local(until),
                    signs(&s)
                ),
            });
        }
    }
    let outcome = SimulateOutcome {
        accounts: args.accounts,
        groups: args.groups,
        messages,
        ideal_min,
        took_min,
        // Pace achieved against the rate, over what was actually delivered
        // (a run cut by its window is judged on the part it sent).
        efficiency: if took_min > 0.0 {
            world.sim.total_delivered() as f64
                / args.accounts as f64
                / f64::from(args.rate)
                / took_min
        } else {
            0.0
        },
        max_per_60s: accounts
            .iter()
            .map(|a| world.sim.max_in_any_60s(a))
            .max()
            .unwrap_or(0),
        uploads: accounts.iter().map(|a| world.sim.uploads(a)).sum(),
        upload_bytes: accounts.iter().map(|a| world.sim.upload_bytes(a)).sum(),
        duplicates: world.sim.duplicate_deliveries(),
        status: statuses.join(","),
        runs: finished,
        warnings: accounts.iter().map(|a| world.sim.stats(a).warnings).sum(),
        bans: accounts.iter().map(|a| world.sim.stats(a).bans).sum(),
        risk_lines,
    };
    Ok(outcome)
}
