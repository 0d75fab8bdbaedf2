//! The seed's fault control, shared by one daemon generation's faulty ports.

use crate::domain::SeededRng;
use rand::RngExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A deliberate defect, to show the checker finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    /// Run status writes ignore the status they expect.
    NoCompareAndSet,
    /// The supervisor never sweeps for runs without an owner.
    NoSweep,
    /// Several daemons: the store and WhatsApp ignore fences, so a daemon
    /// that lost an account still writes and sends for it.
    NoFencing,
    /// A run's event is stored after its change commits, in a second
    /// write (as Herald once did), so a crash or a failed write in between
    /// loses it.
    EventAfterCommit,
    /// WhatsApp's answer to the time-lock query reaches the engine without
    /// the lock's end (as from a client that cannot read it), so the
    /// engine guesses, retrying, instead of pausing until the end.
    NoTimeLockEnd,
}

// ---------------------------------------------------------------- faults

/// Shared by a generation's faulty ports: the seed's fault generator and
/// whether the generation has crashed.
pub(super) struct FaultCtl {
    pub(super) dead: AtomicBool,
    /// A daemon cut off (paused, partitioned): its calls wait until then.
    pub(super) stalled_until: Mutex<Option<tokio::time::Instant>>,
    /// A cut-off of this long waiting for the daemon's next send to be on
    /// the wire (the case fencing at WhatsApp is for).
    pub(super) cut_at_next_send: Mutex<Option<Duration>>,
    pub(super) rng: Mutex<SeededRng>,
    pub(super) faults: Arc<AtomicU64>,
    pub(super) store_error_rate: f64,
}

impl FaultCtl {
    pub(super) fn roll(&self, p: f64) -> bool {
        let hit = self.rng.lock().expect("fault rng").random_bool(p);
        if hit {
            self.faults.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// A crashed generation's calls never return; a stalled one's wait.
    pub(super) async fn alive(&self) {
        if self.dead.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let until = *self.stalled_until.lock().expect("stall");
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
        if self.dead.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}
