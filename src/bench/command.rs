//! `herald bench …` on the command line: the benchmarks' arguments and the
//! System each runs in.

use crate::telemetry;
use clap::Subcommand;

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
    /// What keeping accounts' leases costs PostgreSQL: `daemons` daemons
    /// sharing `accounts` accounts each renew all their leases `rounds`
    /// times; rows, transactions and WAL per 1,000 renewals.
    Leases {
        /// A postgres:// URL (a scratch database is made there and dropped).
        #[arg(long)]
        db: String,
        #[arg(long, default_value_t = 3)]
        daemons: usize,
        #[arg(long, default_value_t = 5000)]
        accounts: usize,
        #[arg(long, default_value_t = 20)]
        rounds: usize,
    },
    /// Webhook deliveries a second to a fast local receiver, and the
    /// engine's send rate with and without a slow receiver subscribed.
    Webhooks {
        #[arg(long, default_value = "sqlite")]
        db: String,
        #[arg(long, default_value_t = 5000)]
        events: usize,
        #[arg(long, default_value_t = 20)]
        accounts: usize,
        #[arg(long, default_value_t = 1000)]
        groups: usize,
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
    /// Real-protocol WhatsApp accounts one node holds: the real client of
    /// each on sessions in the store, against the fake WhatsApp server on
    /// loopback; RSS, idle CPU, threads and files while connected, and a
    /// restart's reconnect time and peak logins a second.
    Sessions {
        #[arg(long, default_value_t = 100)]
        accounts: usize,
        /// Seconds of idle measured for CPU.
        #[arg(long, default_value_t = 30)]
        idle_secs: u64,
        /// Logins started a second (`whatsapp.logins_per_sec`).
        #[arg(long, default_value_t = 10)]
        logins_per_sec: u32,
        /// Fan-out: groups sent to by one more account.
        #[arg(long, default_value_t = 10)]
        groups: usize,
        /// Fan-out: other members of each group.
        #[arg(long, default_value_t = 250)]
        members: usize,
        /// Fan-out: devices of each member.
        #[arg(long, default_value_t = 4)]
        devices: u32,
        /// Fan-out: sends to every group after the first.
        #[arg(long, default_value_t = 20)]
        later_rounds: usize,
        /// Run the fake WhatsApp server as a process of its own
        /// (`herald fake-whatsapp serve`), so RSS and CPU are Herald's
        /// alone; without it the server shares this process.
        #[arg(long)]
        fake_process: bool,
        /// Database URL: `sqlite` for a temporary file, or postgres://…
        /// (a scratch database, dropped afterwards).
        #[arg(long, default_value = "sqlite")]
        db: String,
        /// Every login a first one: the devices' pre-keys are not on the
        /// server yet, so each uploads and stores 812 (as when many
        /// accounts are brought in at once). Without it, a restart's.
        #[arg(long)]
        first_logins: bool,
    },
    /// Receipts counted a second through the real counter and store, for
    /// a run to `groups` groups of `members` members with `devices`
    /// devices each; checks every group's counts.
    Receipts {
        #[arg(long, default_value = "sqlite")]
        db: String,
        #[arg(long, default_value_t = 1000)]
        groups: usize,
        #[arg(long, default_value_t = 250)]
        members: usize,
        #[arg(long, default_value_t = 2)]
        devices: usize,
        /// Share (0–1) of the members who read.
        #[arg(long, default_value_t = 0.5)]
        read_share: f64,
    },
    /// Poll votes opened (WhatsApp's own decryption) and counted a second
    /// through the real counter and store, for a poll to `groups` groups
    /// of `members` members who all vote, a fourth change and a tenth
    /// withdraw; checks every group's answer.
    Polls {
        #[arg(long, default_value = "sqlite")]
        db: String,
        #[arg(long, default_value_t = 1000)]
        groups: usize,
        #[arg(long, default_value_t = 250)]
        members: usize,
    },
    /// The X25519 agreement of a new Signal session: whatsapp-rust's own
    /// ladder and graviola's (what the WhatsApp gateway installs where the
    /// CPU runs it), microseconds each, every answer compared.
    X25519 {
        #[arg(long, default_value_t = 20_000)]
        agreements: usize,
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
        /// `no-cas` (status writes without compare-and-set), `no-sweep`,
        /// `no-fencing` (with --nodes: store and WhatsApp ignore leases), or
        /// `event-after-commit` (a run's event written after its change), or
        /// `no-timelock-end` (the engine never hears a time-lock's end, and guesses).
        #[arg(long, value_parser = ["no-cas", "no-sweep", "no-fencing", "event-after-commit", "no-timelock-end"])]
        break_engine: Option<String>,
        /// Daemons sharing the store and the simulated WhatsApp; more than
        /// one owns accounts through leases, and crashes or cuts off one.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
    },
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
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
        use herald_actors::testkit::chaos::Breakage;
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
                Some("event-after-commit") => Some(Breakage::EventAfterCommit),
                Some("no-timelock-end") => Some(Breakage::NoTimeLockEnd),
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
            BenchCommand::Webhooks {
                db,
                events,
                accounts,
                groups,
            } => crate::bench::webhooks::run(&db, events, accounts, groups).await?,
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
            BenchCommand::Sessions {
                accounts,
                idle_secs,
                logins_per_sec,
                groups,
                members,
                devices,
                later_rounds,
                fake_process,
                db,
                first_logins,
            } => {
                let args = crate::bench::sessions::SessionsArgs {
                    accounts,
                    fake_process,
                    db,
                    first_logins,
                    idle: std::time::Duration::from_secs(idle_secs),
                    logins_per_sec,
                    // Every login paced, plus a margin for the slowest.
                    within: std::time::Duration::from_secs(
                        60 + 2 * accounts as u64 / u64::from(logins_per_sec.max(1)),
                    ),
                    fan_out: crate::bench::sessions::FanOut {
                        groups,
                        members,
                        devices,
                        later_rounds,
                    },
                };
                crate::bench::sessions::run(&args).await?
            }
            BenchCommand::Leases {
                db,
                daemons,
                accounts,
                rounds,
            } => crate::bench::leases::run(&db, daemons, accounts, rounds).await?,
            BenchCommand::X25519 { agreements } => crate::bench::x25519::run(agreements)?,
            BenchCommand::Actors { accounts } => crate::bench::engine::actors(accounts).await?,
            BenchCommand::Receipts {
                db,
                groups,
                members,
                devices,
                read_share,
            } => {
                crate::bench::receipts::run(&crate::bench::receipts::ReceiptsArgs {
                    db,
                    groups,
                    members,
                    devices,
                    read_share,
                })
                .await?
            }
            BenchCommand::Polls {
                db,
                groups,
                members,
            } => {
                crate::bench::polls::run(&crate::bench::polls::PollsArgs {
                    db,
                    groups,
                    members,
                })
                .await?
            }
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
