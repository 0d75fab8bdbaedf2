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
    #[cfg(feature = "bench")]
    #[command(subcommand)]
    Bench(crate::bench::command::BenchCommand),
    /// Benchmarks: not in this build (build with `--features bench`).
    #[cfg(not(feature = "bench"))]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
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
    /// API users and their roles (client of a running daemon; admin).
    #[command(subcommand)]
    Users(crate::client::UsersCmd),
    /// The audit log: every write, newest first (client of a running daemon; admin).
    Audit(crate::client::AuditArgs),
    /// Webhooks: events pushed to your systems, signed (client of a running daemon; admin).
    #[command(subcommand)]
    Webhooks(crate::client::WebhooksCmd),
    /// The simulated WhatsApp as its own process, shared by several daemons.
    #[command(subcommand)]
    Simulator(SimulatorCommand),
    /// The fake WhatsApp Web server of the tests as its own process, with an
    /// HTTP control (test machinery, bench builds).
    #[cfg(feature = "bench")]
    #[command(subcommand)]
    FakeWhatsapp(FakeWhatsappCommand),
    /// The fake WhatsApp Web server: not in this build (build with `--features bench`).
    #[cfg(not(feature = "bench"))]
    #[command(hide = true)]
    FakeWhatsapp {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// WhatsApp sessions in the database (run with the daemons stopped).
    #[command(subcommand)]
    Whatsapp(WhatsappCommand),
    /// Copy an embedded (SQLite) install into one file while its daemon
    /// runs: the database (a consistent snapshot) and the media files. Not
    /// the control token nor the session key: keep those apart.
    Backup {
        /// The archive to write (a tar); it must not exist.
        file: PathBuf,
    },
    /// Put a backup back into storage.data_dir, which must hold no file
    /// yet; then start the daemon on it.
    Restore {
        /// The archive `herald backup` wrote.
        file: PathBuf,
    },
    /// GET a path on this machine's daemon (control.listen) and exit 0 if
    /// it answers 200: the container image's health check.
    Probe {
        /// What to ask: /readyz (started, not draining) or /healthz (the
        /// database answers).
        #[arg(default_value = "/readyz")]
        path: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum WhatsappCommand {
    /// Re-seal every stored WhatsApp session and webhook secret under a
    /// new key: writes the new key to `whatsapp.session_key_file` and keeps
    /// the old one as `<file>.old`. Copy the new file to every daemon
    /// before starting them.
    Rekey,
}

#[cfg(feature = "bench")]
#[derive(Debug, Subcommand)]
pub enum FakeWhatsappCommand {
    /// Serve the fake WhatsApp Web server (WebSocket on a free loopback
    /// port) and its HTTP control on `--listen` until SIGTERM or SIGINT.
    Serve(crate::bench::fake_server::ServeArgs),
}

#[derive(Debug, Subcommand)]
pub enum SimulatorCommand {
    /// Serve one simulated WhatsApp over HTTP/JSON; daemons whose
    /// `simulator.url` points here send their simulator accounts' messages
    /// to it, and its journal is the one log of all their deliveries.
    Serve(crate::gateway::sim_server::ServeArgs),
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
        Command::Users(cmd) => return client::run(opts, config, |c| client::users(c, cmd)),
        Command::Audit(args) => return client::run(opts, config, |c| client::audit(c, args)),
        Command::Webhooks(cmd) => return client::run(opts, config, |c| client::webhooks(c, cmd)),
        Command::Serve => {
            return match serve(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(crate::daemon::exit_code(&e))
                }
            }
        }
        Command::Config => Settings::load(config.as_deref()).map(|s| {
            print!("{}", s.to_redacted_toml());
        }),
        #[cfg(feature = "bench")]
        Command::Bench(b) => crate::bench::command::run(b),
        #[cfg(not(feature = "bench"))]
        Command::Bench { .. } => Err(anyhow::anyhow!(
            "this herald was built without benchmarks: they and the fault simulation they \
             drive are test machinery; build with `cargo build --release --features bench`"
        )),
        Command::Simulate(args) => simulate(args),
        Command::Simulator(SimulatorCommand::Serve(args)) => simulator_serve(config, args),
        #[cfg(feature = "bench")]
        Command::FakeWhatsapp(FakeWhatsappCommand::Serve(args)) => fake_whatsapp_serve(args),
        #[cfg(not(feature = "bench"))]
        Command::FakeWhatsapp { .. } => Err(anyhow::anyhow!(
            "this herald was built without the fake WhatsApp server: it is test machinery; \
             build with `cargo build --features bench`"
        )),
        Command::Whatsapp(WhatsappCommand::Rekey) => whatsapp_rekey(config),
        Command::Backup { file } => backup(config, &file),
        Command::Restore { file } => restore(config, &file),
        Command::Probe { path } => return probe(config, &path),
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
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        let app = Application::build(settings).await?;
        app.run_until_stopped().await
    });
    // What still runs on the System (tasks an early error cut off, some
    // mid-query) is dropped with it, inside the runtime's context: a pooled
    // database connection they held goes back through the runtime instead
    // of panicking for want of one after the runtime is gone.
    let runtime = system.runtime().tokio_runtime().handle().clone();
    let inside = runtime.enter();
    drop(system);
    drop(inside);
    result
}

fn whatsapp_rekey(config: Option<PathBuf>) -> anyhow::Result<()> {
    let settings = Settings::load(config.as_deref())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(crate::seal::rekey::rekey(&settings))?;
    println!(
        "re-sealed {} session rows of {} accounts and {} webhook secrets: key {} -> {}",
        r.rows,
        r.accounts,
        r.webhook_secrets,
        r.old_id.as_deref().unwrap_or("(none)"),
        r.new_id
    );
    match &r.old_file {
        Some(old) => println!(
            "the new key is {}; the old one is kept as {}",
            r.key_file.display(),
            old.display()
        ),
        None => println!("the new key is {}", r.key_file.display()),
    }
    println!("copy the new key file to every daemon of the cluster before starting them; delete the old one after");
    Ok(())
}

fn current_thread() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn backup(config: Option<PathBuf>, file: &std::path::Path) -> anyhow::Result<()> {
    let settings = Settings::load(config.as_deref())?;
    let r = current_thread()?.block_on(crate::backup::backup(&settings, file))?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "backed up {} (schema {}): the database ({:.1} MiB) and {} media files ({:.1} MiB)",
        file.display(),
        r.manifest.schema_version,
        mib(r.database_bytes),
        r.manifest.media_files,
        mib(r.media_bytes)
    );
    if !r.media_skipped.is_empty() {
        println!(
            "left out {} media no reminder uses, collected by retention while the backup ran",
            r.media_skipped.len()
        );
    }
    println!(
        "not in the backup, keep them apart: the session key ({}) and the control token",
        settings.session_key_path().display()
    );
    Ok(())
}

fn restore(config: Option<PathBuf>, file: &std::path::Path) -> anyhow::Result<()> {
    let settings = Settings::load(config.as_deref())?;
    let r = current_thread()?.block_on(crate::backup::restore(&settings, file))?;
    println!(
        "restored {} into {}: the database (schema {}, backed up {} by herald {}) and {} media files",
        file.display(),
        settings.storage.data_dir.display(),
        r.manifest.schema_version,
        r.manifest.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
        r.manifest.herald_version,
        r.media_files
    );
    println!(
        "before starting the daemon, put back the session key ({}; WhatsApp accounts must pair \
         again without it) and the control token if you set one",
        settings.session_key_path().display()
    );
    Ok(())
}

/// Exit 0 on 200, 1 otherwise (a container runtime's health check reads
/// only the exit code; the line says why for a person).
fn probe(config: Option<PathBuf>, path: &str) -> ExitCode {
    let answer = Settings::load(config.as_deref())
        .and_then(|s| crate::client::probe_addr(&s))
        .and_then(|addr| crate::client::probe(addr, path).map(|code| (addr, code)));
    match answer {
        Ok((_, 200)) => ExitCode::SUCCESS,
        Ok((addr, code)) => {
            eprintln!("{path} on {addr} answered {code}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
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

#[cfg(feature = "bench")]
fn fake_whatsapp_serve(args: crate::bench::fake_server::ServeArgs) -> anyhow::Result<()> {
    telemetry::init_subscriber(telemetry::get_subscriber("warn", std::io::stderr));
    actix_rt::System::new().block_on(async move { crate::bench::fake_server::serve(&args).await })
}

fn simulate(args: crate::simulate::SimulateArgs) -> anyhow::Result<()> {
    telemetry::init_subscriber(telemetry::get_subscriber("warn", std::io::stderr));
    // Virtual time from the start: the same arguments give the same plan.
    herald_actors::world::virtual_time_system().block_on(async move {
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
