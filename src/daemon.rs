//! systemd integration: `READY=1` once the port answers, `WATCHDOG=1` while
//! the daemon is healthy, `STOPPING=1` when it drains. Outside systemd
//! (`NOTIFY_SOCKET` unset) every call here does nothing.

use crate::state::AppState;
use herald_actors::scheduling::scheduler::NextDue;
use sd_notify::NotifyState;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::JoinHandle;

/// `herald serve`'s exit code when what it needs is held by another live
/// daemon (its node id, its database): EX_TEMPFAIL, worth retrying later.
pub const EXIT_IN_USE: u8 = 75;
/// `herald serve`'s exit code for settings it refuses: EX_CONFIG, which no
/// restart mends.
pub const EXIT_CONFIG: u8 = 78;

/// The exit code of a daemon that stopped with `e`: [`EXIT_IN_USE`],
/// [`EXIT_CONFIG`], else 1.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<crate::store::HeldByAnother>()) {
        EXIT_IN_USE
    } else if e.chain().any(|c| c.is::<crate::settings::SettingsError>()) {
        EXIT_CONFIG
    } else {
        1
    }
}

/// Tells systemd what the daemon is doing (`STATUS=`), shown by
/// `systemctl status`.
pub fn notify_status(status: &str) {
    notify(&[NotifyState::Status(status)]);
}

/// Tells systemd start-up is complete (Type=notify).
pub fn notify_ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells systemd we are stopping on our own, so a SIGTERM sent by someone
/// other than systemd is not taken for a crash, and the watchdog stands down.
pub fn notify_stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "could not notify systemd");
    }
}

/// systemd's watchdog interval, with libsystemd's `sd_watchdog_enabled`
/// rules: `WATCHDOG_USEC` set and positive, and `WATCHDOG_PID` either unset
/// or ours. (sd-notify 0.4 insists on `WATCHDOG_PID` being set, which is
/// stricter than libsystemd and than what a test harness can provide
/// before it knows the child's pid.)
pub fn watchdog_interval() -> Option<Duration> {
    watchdog_interval_from(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

fn watchdog_interval_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(me) {
            return None;
        }
    }
    Some(Duration::from_micros(usec))
}

/// Pings the watchdog at half its interval while [`healthy`] says so. A
/// stuck database or a dead scheduler stops the pings, and systemd restarts
/// the daemon after `WatchdogSec`. `None` when there is no watchdog.
pub fn spawn_watchdog(state: AppState) -> Option<JoinHandle<()>> {
    let interval = watchdog_interval()?;
    let every = interval / 2;
    // A check slower than this counts as a failure: together with the tick
    // it keeps two pings well inside one watchdog interval.
    let check_timeout = (interval / 4).max(Duration::from_millis(20));
    tracing::info!(?interval, "systemd watchdog enabled");
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_healthy = true;
        loop {
            tick.tick().await;
            match tokio::time::timeout(check_timeout, healthy(&state)).await {
                Ok(Ok(())) => {
                    notify(&[NotifyState::Watchdog]);
                    if !was_healthy {
                        tracing::info!("healthy again: watchdog pings resumed");
                    }
                    was_healthy = true;
                }
                res => {
                    if was_healthy {
                        let why = match res {
                            Ok(Err(why)) => why,
                            _ => format!("health check took over {check_timeout:?}"),
                        };
                        tracing::error!(%why, "unhealthy: withholding watchdog pings");
                    }
                    was_healthy = false;
                }
            }
        }
    }))
}

/// The store answers, and — unless we are draining, when the scheduler has
/// been stopped on purpose — the scheduler actor is alive and answers a
/// message (its mailbox is being processed, not just open).
pub async fn healthy(state: &AppState) -> Result<(), String> {
    state
        .store
        .ping()
        .await
        .map_err(|e| format!("store: {e}"))?;
    // `ready` is only false here once draining has begun.
    if state.ready.load(Ordering::SeqCst) {
        if !state.scheduler.connected() {
            return Err("scheduler actor stopped".into());
        }
        state
            .scheduler
            .send(NextDue { reminder_id: -1 })
            .await
            .map_err(|e| format!("scheduler: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_follows_libsystemd_rules() {
        let d = Duration::from_micros;
        assert_eq!(
            watchdog_interval_from(Some("30000000"), None, 7),
            Some(d(30_000_000))
        );
        assert_eq!(
            watchdog_interval_from(Some("200000"), Some("7"), 7),
            Some(d(200_000))
        );
        // Meant for another process (inherited by a child): not ours.
        assert_eq!(watchdog_interval_from(Some("200000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_from(Some("soon"), None, 7), None);
        assert_eq!(watchdog_interval_from(None, Some("7"), 7), None);
    }
}
