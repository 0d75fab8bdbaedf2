//! The `herald` command line: the daemon, its settings, benchmarks and the
//! capacity simulator.

use crate::settings::Settings;
use crate::startup::Application;
use crate::telemetry;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "herald",
    version,
    about = "Scheduled WhatsApp reminder fan-out"
)]
pub struct Cli {
    /// Settings file layered over the defaults (see config/default.toml).
    #[arg(long, global = true, env = "HERALD_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub client: crate::client::ClientOpts,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: migrate, start the actors, serve the control port.
    Serve,
    /// Print the effective settings, secrets redacted.
    Config,
    /// Benchmarks; each prints a machine-readable last line.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run the real engine against the simulated WhatsApp on virtual time
    /// and print how a fan-out would go: a capacity planner.
    Simulate(crate::simulate::SimulateArgs),
    /// Paired accounts (client of a running daemon).
    #[command(subcommand)]
    Accounts(crate::client::AccountsCmd),
    /// An account's groups: list, search, sync, label (client of a running daemon).
    #[command(subcommand)]
    Groups(crate::client::GroupsCmd),
    /// Pictures for reminders (client of a running daemon).
    #[command(subcommand)]
    Media(crate::client::MediaCmd),
    /// Reminders (client of a running daemon).
    #[command(subcommand)]
    Reminders(crate::client::RemindersCmd),
    /// Runs: list, inspect, control, watch (client of a running daemon).
    #[command(subcommand)]
    Runs(crate::client::RunsCmd),
    /// The simulated WhatsApp as its own process, shared by several daemons.
    #[command(subcommand)]
    Simulator(SimulatorCommand),
}

#[derive(Debug, Subcommand)]
pub enum SimulatorCommand {
    /// Serve one simulated WhatsApp over HTTP/JSON; daemons whose
    /// `simulator.url` points here send their simulator accounts' messages
    /// to it, and its journal is the one log of all their deliveries.
    Serve(crate::gateway::sim_server::ServeArgs),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Run-target status transitions through the real store.
    Store {
        /// Database URL: `sqlite` for a temporary file, or postgres://…
        #[arg(long, default_value = "sqlite")]
        db: String,
        #[arg(long, default_value_t = 100_000)]
        transitions: u64,
    },
    /// Messages per second through the whole engine and the real store,
    /// with a zero-latency simulator and rate limits off.
    Engine {
        #[arg(long, default_value = "sqlite")]
        db: String,
        #[arg(long, default_value_t = 100)]
        accounts: usize,
        #[arg(long, default_value_t = 1000)]
        groups: usize,
        #[arg(long, default_value_t = 3)]
        group_concurrency: u32,
    },
    /// Due → queued latency of the scheduler through the real store.
    Scheduler {
        #[arg(long, default_value = "sqlite")]
        db: String,
        /// Reminders due at the same instant in the burst phase.
        #[arg(long, default_value_t = 10_000)]
        reminders: usize,
    },
    /// A large install on one node: the daemon started on `reminders`
    /// reminders of `groups` groups each, idle; RSS, idle CPU, start-up,
    /// list latency and fire lag.
    Scale {
        #[arg(long, default_value_t = 1000)]
        reminders: usize,
        #[arg(long, default_value_t = 2000)]
        groups: usize,
        /// PostgreSQL base URL (a scratch database is created and
        /// dropped); SQLite in a temporary directory otherwise.
        #[arg(long)]
        postgres: Option<String>,
        /// Seconds of idle measured for CPU.
        #[arg(long, default_value_t = 65)]
        idle_secs: u64,
    },
    /// Searches of one account's group directory (name, label, plain
    /// listing) through the real store: p50/p99 of a first page.
    Groups {
        #[arg(long, default_value = "sqlite")]
        db: String,
        #[arg(long, default_value_t = 5000)]
        groups: usize,
    },
    /// Status requests per second against the control port while accounts
    /// send; latency percentiles and whether the sends kept their pace.
    Control {
        #[arg(long, default_value_t = 10)]
        accounts: usize,
        #[arg(long, default_value_t = 500)]
        rps: u32,
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Resident memory with one idle AccountActor per account.
    Actors {
        #[arg(long, default_value_t = 10_000)]
        accounts: usize,
    },
    /// The whole engine on virtual time under seeded faults (store errors,
    /// crashes, gateway faults, operator actions), each seed checked
    /// against Herald's promises. Exits non-zero if any seed broke one.
    Chaos {
        /// How many seeds, starting at --first.
        #[arg(long, default_value_t = 1000)]
        seeds: u64,
        #[arg(long, default_value_t = 0)]
        first: u64,
        /// Replay just this seed (same as --first S --seeds 1).
        #[arg(long)]
        seed: Option<u64>,
        /// Virtual hours of faults per seed, before the quiet period.
        #[arg(long, default_value_t = 10)]
        hours: u32,
        /// Worker threads (default: one per core).
        #[arg(long)]
        threads: Option<usize>,
        /// Run a deliberately broken engine, to see the checker catch it:
        /// `no-cas` (status writes without compare-and-set), `no-sweep`, or
        /// `no-fencing` (with --nodes: store and WhatsApp ignore leases).
        #[arg(long, value_parser = ["no-cas", "no-sweep", "no-fencing"])]
        break_engine: Option<String>,
        /// Daemons sharing the store and the simulated WhatsApp; more than
        /// one owns accounts through leases, and crashes or cuts off one.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
    },
}

pub fn run(cli: Cli) -> ExitCode {
    use crate::client;
    let (opts, config) = (cli.client, cli.config);
    let result = match cli.command {
        Command::Accounts(cmd) => return client::run(opts, config, |c| client::accounts(c, cmd)),
        Command::Groups(cmd) => return client::run(opts, config, |c| client::groups(c, cmd)),
        Command::Media(cmd) => return client::run(opts, config, |c| client::media(c, cmd)),
        Command::Reminders(cmd) => return client::run(opts, config, |c| client::reminders(c, cmd)),
        Command::Runs(cmd) => return client::run(opts, config, |c| client::runs(c, cmd)),
        Command::Serve => serve(config),
        Command::Config => Settings::load(config.as_deref()).map(|s| {
            print!("{}", s.to_redacted_toml());
        }),
        Command::Bench(b) => bench(b),
        Command::Simulate(args) => simulate(args),
        Command::Simulator(SimulatorCommand::Serve(args)) => simulator_serve(config, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(config: Option<PathBuf>) -> anyhow::Result<()> {
    let settings = Settings::load(config.as_deref())?;
    telemetry::init_subscriber(telemetry::get_subscriber(
        &settings.log.filter,
        std::io::stderr,
    ));
    actix_rt::System::new().block_on(async move {
        let app = Application::build(settings).await?;
        app.run_until_stopped().await
    })
}

fn simulator_serve(
    config: Option<PathBuf>,
    args: crate::gateway::sim_server::ServeArgs,
) -> anyhow::Result<()> {
    let settings = Settings::load(config.as_deref())?;
    telemetry::init_subscriber(telemetry::get_subscriber(
        &settings.log.filter,
        std::io::stderr,
    ));
    actix_rt::System::new()
        .block_on(async move { crate::gateway::sim_server::serve(&args, &settings).await })
}

fn bench(cmd: BenchCommand) -> anyhow::Result<()> {
    // Errors the chaos seeds inject are logged as errors by design: only
    // the checker's verdict is of interest there.
    let filter = if matches!(cmd, BenchCommand::Chaos { .. }) {
        "off"
    } else {
        "warn"
    };
    telemetry::init_subscriber(telemetry::get_subscriber(filter, std::io::stderr));
    if let BenchCommand::Chaos {
        seeds,
        first,
        seed,
        hours,
        threads,
        break_engine,
        nodes,
    } = cmd
    {
        use herald_actors::chaos::Breakage;
        let (first, seeds) = seed.map_or((first, seeds), |s| (s, 1));
        let args = crate::bench::chaos::ChaosArgs {
            seeds,
            first,
            hours,
            threads: threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            breakage: match break_engine.as_deref() {
                Some("no-cas") => Some(Breakage::NoCompareAndSet),
                Some("no-sweep") => Some(Breakage::NoSweep),
                Some("no-fencing") => Some(Breakage::NoFencing),
                _ => None,
            },
            nodes,
        };
        println!("{}", crate::bench::chaos::run(&args)?);
        return Ok(());
    }
    actix_rt::System::new().block_on(async move {
        let line = match cmd {
            BenchCommand::Store { db, transitions } => {
                crate::bench::store::run(&db, transitions).await?
            }
            BenchCommand::Engine {
                db,
                accounts,
                groups,
                group_concurrency,
            } => crate::bench::engine::run(&db, accounts, groups, group_concurrency).await?,
            BenchCommand::Groups { db, groups } => crate::bench::groups::run(&db, groups).await?,
            BenchCommand::Scale {
                reminders,
                groups,
                postgres,
                idle_secs,
            } => {
                let args = crate::bench::scale::ScaleArgs {
                    postgres,
                    idle: std::time::Duration::from_secs(idle_secs),
                    ..crate::bench::scale::ScaleArgs::new(reminders, groups)
                };
                crate::bench::scale::run(&args).await?
            }
            BenchCommand::Actors { accounts } => crate::bench::engine::actors(accounts).await?,
            BenchCommand::Control {
                accounts,
                rps,
                seconds,
            } => crate::bench::control::run(accounts, rps, seconds).await?,
            BenchCommand::Scheduler { db, reminders } => {
                crate::bench::scheduler::run(&db, reminders).await?
            }
            BenchCommand::Chaos { .. } => unreachable!("run above, outside an actix system"),
        };
        println!("{line}");
        Ok(())
    })
}

fn simulate(args: crate::simulate::SimulateArgs) -> anyhow::Result<()> {
    telemetry::init_subscriber(telemetry::get_subscriber("warn", std::io::stderr));
    // Virtual time from the start: the same arguments give the same plan.
    herald_actors::sim::virtual_time_system().block_on(async move {
        let outcome = crate::simulate::simulate(&args).await?;
        for run in &outcome.runs {
            println!(
                "run {} account {}: {} — {} of {} groups delivered{}",
                run.id,
                run.account_id,
                run.status,
                run.counts.sent,
                run.counts.total(),
                run.error_summary
                    .as_deref()
                    .map(|s| format!("\n  {s}"))
                    .unwrap_or_default()
            );
            if let Some(f) = &run.forecast {
                println!("  {f}");
            }
        }
        for line in &outcome.risk_lines {
            println!("{line}");
        }
        println!("{}", outcome.last_line());
        Ok(())
    })
}
