//! What every account actor shares: the ports, the delivery settings, the
//! event bus, the group-commit writer and the fire-concurrency permits.

use crate::events::EventBus;
use crate::messages::{ArmWindow, DisarmWindow, RunDue};
use crate::outcome::StopReason;
use crate::ports::Ports;
use crate::writer::StoreWriter;
use actix::Recipient;
use chrono::{DateTime, Utc};
use std::cell::{Cell, RefCell};
use std::sync::{Arc, OnceLock};
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

/// AccountActor → WindowActor: the window closed with work left and the
/// reminder asks to resume at the next opening; send `RunDue` at `at`.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub struct ParkRun {
    pub due: RunDue,
    pub at: DateTime<Utc>,
}

pub struct Engine {
    pub ports: Ports,
    pub config: EngineConfig,
    pub events: EventBus,
    pub writer: StoreWriter,
    pub fire_permits: Option<Arc<Semaphore>>,
    pub window: OnceLock<WindowLinks>,
}

impl Engine {
    pub fn new(ports: Ports, config: EngineConfig, writer: StoreWriter) -> Self {
        let events = EventBus::new(ports.store.clone(), ports.clock.clone());
        let fire_permits = (config.fire_concurrency > 0)
            .then(|| Arc::new(Semaphore::new(config.fire_concurrency as usize)));
        Self {
            ports,
            config,
            events,
            writer,
            fire_permits,
            window: OnceLock::new(),
        }
    }

    pub fn set_window_links(&self, links: WindowLinks) {
        let _ = self.window.set(links);
    }
}

/// Flags shared between an AccountActor and the run it is executing. Lives
/// on the actor's thread; `wake` interrupts the run's waits on any change.
#[derive(Default)]
pub struct RunControl {
    stop: RefCell<Option<StopReason>>,
    paused: Cell<bool>,
    draining: Cell<bool>,
    pub wake: Notify,
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

    pub fn set_paused(&self, paused: bool) {
        self.paused.set(paused);
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
