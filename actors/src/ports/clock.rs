//! The clock port: wall-clock time, real or virtual.

use chrono::{DateTime, Utc};
use std::time::Duration;

/// Wall-clock time. Sleeping always goes through tokio so that tests and
/// `herald simulate` can run on paused, auto-advancing time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

/// The real wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that reads tokio's time from a fixed start: with
/// `tokio::time::pause()` it becomes virtual time that jumps whenever every
/// task is waiting on a timer.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start_utc: DateTime<Utc>,
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_at(start_utc: DateTime<Utc>) -> Self {
        Self {
            start_utc,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = tokio::time::Instant::now() - self.start;
        self.start_utc + chrono::Duration::from_std(elapsed).expect("elapsed fits")
    }
}

/// Sleeps until `at` on `clock`, re-reading the clock at least every minute
/// so a wall-clock step (NTP, suspend) does not make us oversleep.
pub async fn sleep_until(clock: &dyn Clock, at: DateTime<Utc>) {
    loop {
        let left = at - clock.now();
        let Ok(left) = left.to_std() else { return };
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(Duration::from_secs(60))).await;
    }
}
