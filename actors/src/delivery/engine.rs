//! What every account actor shares: the ports, the delivery settings, the
//! event bus, the group-commit writer and the fire-concurrency permits.

use crate::delivery::outcome::StopReason;
use crate::delivery::writer::StoreWriter;
use crate::domain::AccountState;
use crate::domain::SeededRng;
use crate::events::EventBus;
use crate::messages::{ArmWindow, DisarmWindow, ParkRun};
use crate::ports::Ports;
use actix::Recipient;
use chrono::{DateTime, Utc};
use rand::{RngExt, SeedableRng};
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Default messages per minute per account (per-account override wins).
    pub max_per_minute: u32,
    /// Default groups in flight per account.
    pub group_concurrency: u32,
    /// Accounts mid-run at once; 0 = unlimited.
    pub fire_concurrency: u32,
    /// Pause between two parts to one group, uniform in this range.
    pub jitter_min: Duration,
    pub jitter_max: Duration,
    /// Attempts per part for transient failures.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt.
    pub retry_base: Duration,
    /// Rate after a rate-limit answer, as a fraction, for `rate_limit_cooldown`.
    pub rate_limit_factor: f64,
    pub rate_limit_cooldown: Duration,
    /// An upload handle is reused only if it stays valid at least this long.
    pub upload_margin: Duration,
    /// How long a run with an all-day (0–24) window may take from its
    /// scheduled time: such a run has no window end of its own.
    pub all_day_horizon: Duration,
    /// How often the supervisor looks for unfinished runs that no actor
    /// owns and hands them back.
    pub sweep_every: Duration,
    /// Seeds the jitter between parts: a simulation replays exactly.
    pub seed: u64,
    /// How often the supervisor checks its actors are alive (a panic ends
    /// an actor without telling anyone).
    pub health_every: Duration,
    /// Human pacing of an account's sends: spread of each gap around its
    /// mean (0 = machine-regular) and the mean as a multiple of the
    /// limit's spacing. The 60 s limit stays exact either way.
    pub pace_jitter: f64,
    pub pace_slack: f64,
    /// Typing presence before each message, where the gateway supports it.
    pub typing: TypingConfig,
    /// The warm-up ramp for accounts marked `new_number` (`None`: no ramp;
    /// the account's own daily and hourly caps still apply).
    pub warmup: Option<crate::delivery::caps::Warmup>,
    /// Apply the ramp to every account, not only new numbers.
    pub warmup_all: bool,
    /// When account-level signals pause an account, and for how long.
    pub breaker: crate::delivery::signals::BreakerConfig,
    /// How long after a send WhatsApp lets it be recalled or edited.
    pub amend_windows: crate::domain::AmendWindows,
    /// How often an account's standing (time-lock, new-chat quota) is read
    /// from WhatsApp besides at start, at each reconnect and after a 463
    /// (hourly: WhatsApp Web asks for the quota as often).
    pub standing_every: Duration,
}

/// How long an account "types" before a message: a base plus a time per
/// character, bounded, so a long text does not hold a group for minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypingConfig {
    pub enabled: bool,
    pub base: Duration,
    pub per_char: Duration,
    pub max: Duration,
}

impl Default for TypingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            base: Duration::from_millis(600),
            per_char: Duration::from_millis(25),
            max: Duration::from_secs(4),
        }
    }
}

impl TypingConfig {
    /// Off: no presence, no time spent.
    pub const OFF: TypingConfig = TypingConfig {
        enabled: false,
        base: Duration::ZERO,
        per_char: Duration::ZERO,
        max: Duration::ZERO,
    };

    /// How long to type `chars` characters (zero when off).
    pub fn duration(&self, chars: usize) -> Duration {
        if !self.enabled {
            return Duration::ZERO;
        }
        let per = self
            .per_char
            .saturating_mul(u32::try_from(chars).unwrap_or(u32::MAX));
        (self.base + per).min(self.max)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_per_minute: 40,
            group_concurrency: 3,
            fire_concurrency: 8,
            jitter_min: Duration::from_millis(200),
            jitter_max: Duration::from_millis(500),
            max_attempts: 5,
            retry_base: Duration::from_secs(2),
            rate_limit_factor: 0.5,
            rate_limit_cooldown: Duration::from_secs(600),
            upload_margin: Duration::from_secs(3600),
            all_day_horizon: Duration::from_secs(24 * 3600),
            sweep_every: Duration::from_secs(30),
            seed: rand::random(),
            health_every: Duration::from_secs(1),
            pace_jitter: 0.5,
            pace_slack: 0.9,
            typing: TypingConfig::default(),
            warmup: None,
            warmup_all: false,
            breaker: crate::delivery::signals::BreakerConfig::default(),
            amend_windows: crate::domain::AmendWindows::default(),
            standing_every: Duration::from_secs(3600),
        }
    }
}

/// Where the engine sends window timers; set once the WindowActor exists
/// (it needs the supervisor's address first, so it cannot be passed in).
pub struct WindowLinks {
    pub arm: Recipient<ArmWindow>,
    pub disarm: Recipient<DisarmWindow>,
    /// Wakes a parked run (resume_next_window) at its next opening.
    pub park: Recipient<ParkRun>,
}

pub struct Engine {
    pub ports: Ports,
    pub config: EngineConfig,
    pub events: EventBus,
    pub writer: StoreWriter,
    pub fire_permits: Option<Arc<Semaphore>>,
    /// The window actor, which the engine tells of runs to stop at their
    /// window's close. Given at construction ([`Engine::with_window`]):
    /// the window actor's address exists before the actor runs.
    pub window: Option<WindowLinks>,
    /// Several daemons: the account leases this daemon holds. `None`: the
    /// daemon owns every account (one daemon per database).
    pub leases: Option<Arc<crate::delivery::leases::LeaseTable>>,
    rng: Mutex<SeededRng>,
}

/// Whether this daemon may act for an account now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// One daemon per database: every account is ours, nothing to prove.
    Sole,
    /// Held, with the fence to write and send under.
    Leased(crate::domain::Fence),
    /// Not held, or its local deadline passed: do nothing for it.
    Lost,
}

impl Ownership {
    /// The fence to attach, or `Err` when the lease is lost.
    pub fn fence(self) -> Result<Option<crate::domain::Fence>, crate::domain::LeaseLost> {
        match self {
            Self::Sole => Ok(None),
            Self::Leased(f) => Ok(Some(f)),
            Self::Lost => Err(crate::domain::LeaseLost),
        }
    }
}

impl Engine {
    pub fn new(ports: Ports, config: EngineConfig, writer: StoreWriter) -> Self {
        let events = EventBus::new(ports.store.clone(), ports.clock.clone());
        let fire_permits = (config.fire_concurrency > 0)
            .then(|| Arc::new(Semaphore::new(config.fire_concurrency as usize)));
        Self {
            ports,
            events,
            writer,
            fire_permits,
            window: None,
            leases: None,
            rng: Mutex::new(SeededRng::seed_from_u64(config.seed)),
            config,
        }
    }

    /// The pause between two parts to one group, drawn from the engine's
    /// seeded generator.
    pub fn jitter(&self) -> Duration {
        let (lo, hi) = (self.config.jitter_min, self.config.jitter_max);
        if hi <= lo {
            return lo;
        }
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        rng.random_range(lo..=hi)
    }

    /// The rate an account sends at: its own limit, or the engine's default.
    pub fn per_minute(&self, limits: &crate::domain::AccountLimits) -> u32 {
        limits
            .max_per_minute
            .unwrap_or(self.config.max_per_minute)
            .max(1)
    }

    /// The account's human pacing, seeded per account so accounts do not
    /// move in step and a simulation replays exactly.
    pub fn pacing(&self, account: &crate::domain::AccountId) -> crate::delivery::bucket::Pacing {
        crate::delivery::bucket::Pacing {
            jitter: self.config.pace_jitter,
            slack: self.config.pace_slack,
            seed: self.config.seed ^ crate::domain::fnv64(account.as_str().as_bytes()),
        }
    }

    /// Links the engine to the window actor.
    pub fn with_window(mut self, links: WindowLinks) -> Self {
        self.window = Some(links);
        self
    }

    /// Turns on account leases (several daemons on one database).
    pub fn with_leases(mut self, leases: Arc<crate::delivery::leases::LeaseTable>) -> Self {
        self.leases = Some(leases);
        self
    }

    /// [`crate::ports::Store::update_run`] for a run of `account` this
    /// daemon is executing: under its lease, if leases are on. The event
    /// the update carries is broadcast once committed.
    pub async fn update_owned_run(
        &self,
        account: &crate::domain::AccountId,
        id: crate::domain::RunId,
        u: &crate::ports::RunUpdate,
    ) -> crate::ports::StoreResult<()> {
        let Ok(fence) = self.ownership(account).fence() else {
            return Err(crate::ports::StoreError::Fenced(format!(
                "this daemon no longer holds account {account}'s lease"
            )));
        };
        let stored = if fence.is_none() {
            self.ports.store.update_run(id, u).await?
        } else {
            let u = crate::ports::RunUpdate { fence, ..u.clone() };
            self.ports.store.update_run(id, &u).await?
        };
        self.events.published(stored);
        Ok(())
    }

    /// The fence to write and send under for work that must act under one
    /// lease epoch only (a run's execution, an amendment's): the first
    /// epoch seen is pinned in `epoch`, and a later one is a lost lease,
    /// so an execution left over from a lease this daemon lost and took
    /// again never acts beside the new one.
    pub fn pinned_fence(
        &self,
        account: &crate::domain::AccountId,
        epoch: &Cell<Option<i64>>,
    ) -> Result<Option<crate::domain::Fence>, crate::domain::LeaseLost> {
        let fence = self.ownership(account).fence()?;
        if let Some(f) = &fence {
            match epoch.get() {
                None => epoch.set(Some(f.epoch)),
                Some(e) if e != f.epoch => return Err(crate::domain::LeaseLost),
                Some(_) => {}
            }
        }
        Ok(fence)
    }

    /// Whether this daemon may write or send for `account` now.
    pub fn ownership(&self, account: &crate::domain::AccountId) -> Ownership {
        match self.leases.as_ref() {
            None => Ownership::Sole,
            Some(t) => t.fence(account).map_or(Ownership::Lost, Ownership::Leased),
        }
    }
}

/// Why the account stopped sending mid-run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    pub state: AccountState,
    pub reason: String,
    /// The gateway said so (record the state on the account); otherwise it
    /// came from the account's row and is already recorded.
    pub record: bool,
    /// A temporary ban's end: the account resumes by itself then.
    pub until: Option<DateTime<Utc>>,
}

impl Halt {
    /// WhatsApp logged the account out or banned it mid-send: recorded on
    /// the account.
    pub fn from_gateway(e: &crate::ports::GatewayError) -> Self {
        let (state, reason, until) = match e {
            crate::ports::GatewayError::Banned { until: Some(t) } => (
                AccountState::Banned,
                format!("Account temporarily banned by WhatsApp until {t}"),
                Some(*t),
            ),
            crate::ports::GatewayError::Banned { until: None } => (
                AccountState::Banned,
                "Account temporarily banned by WhatsApp".into(),
                None,
            ),
            _ => (
                AccountState::LoggedOut,
                "Account logged out of WhatsApp".into(),
                None,
            ),
        };
        Self {
            state,
            reason,
            record: true,
            until,
        }
    }

    /// The account's row says it cannot send: recorded already. A ban or
    /// cool-down recorded by an earlier start or another daemon still ends
    /// when it said.
    pub fn of_account(account: &crate::domain::Account) -> Self {
        Self {
            state: account.state,
            reason: account
                .state_reason
                .clone()
                .unwrap_or_else(|| format!("account is {}", account.state)),
            record: false,
            until: account.state_until,
        }
    }
}

/// Flags shared between an AccountActor and the run it is executing. Lives
/// on the actor's thread; `wake` interrupts the run's waits on any change.
/// Pause, drain and halt make the run leave its targets as they are; stop
/// and window close make it skip them.
#[derive(Default)]
pub struct RunControl {
    stop: RefCell<Option<StopReason>>,
    paused: Cell<bool>,
    draining: Cell<bool>,
    halt: RefCell<Option<Halt>>,
    deferred: RefCell<Option<Deferral>>,
    pub wake: Notify,
}

/// A cap was reached: the run leaves its remaining targets and parks
/// until `resumes_at`, held to the window closing at `close`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    pub resumes_at: DateTime<Utc>,
    pub close: DateTime<Utc>,
    /// "daily cap reached: 500 sent today; the rest resumes at 06:00 …"
    pub reason: String,
}

impl RunControl {
    /// The first stop reason wins (a window close after an operator stop
    /// does not rewrite why the run ended).
    pub fn stop(&self, reason: StopReason) {
        let mut stop = self.stop.borrow_mut();
        if stop.is_none() {
            *stop = Some(reason);
        }
        drop(stop);
        self.wake.notify_waiters();
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop.borrow().clone()
    }

    pub fn pause(&self) {
        self.paused.set(true);
        self.wake.notify_waiters();
    }

    pub fn is_paused(&self) -> bool {
        self.paused.get()
    }

    pub fn drain(&self) {
        self.draining.set(true);
        self.wake.notify_waiters();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// The account cannot send: the first halt wins.
    pub fn halt(&self, halt: Halt) {
        let mut h = self.halt.borrow_mut();
        if h.is_none() {
            *h = Some(halt);
        }
        drop(h);
        self.wake.notify_waiters();
    }

    pub fn halted(&self) -> Option<Halt> {
        self.halt.borrow().clone()
    }

    /// A cap was reached: the first deferral wins.
    pub fn defer(&self, d: Deferral) {
        let mut cur = self.deferred.borrow_mut();
        if cur.is_none() {
            *cur = Some(d);
        }
        drop(cur);
        self.wake.notify_waiters();
    }

    pub fn deferred(&self) -> Option<Deferral> {
        self.deferred.borrow().clone()
    }

    /// Whether the run is on its way out without finishing: its groups
    /// leave their targets as they are.
    pub fn is_leaving(&self) -> bool {
        self.is_paused()
            || self.is_draining()
            || self.halt.borrow().is_some()
            || self.deferred.borrow().is_some()
    }

    /// Whether a send now would go against the operator or the account.
    pub fn must_not_send(&self) -> bool {
        self.is_leaving() || self.stop.borrow().is_some()
    }

    /// Sleeps for `d`, waking early on any control change.
    pub async fn nap(&self, d: Duration) {
        if d.is_zero() {
            return;
        }
        let woken = self.wake.notified();
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = woken => {}
        }
    }
}
