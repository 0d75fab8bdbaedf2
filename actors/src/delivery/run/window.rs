//! The window a run is held to: its close, fixed when it was scheduled,
//! its opening, and parking a run until the next one.

use crate::delivery::engine::Engine;
use crate::delivery::outcome::delivered_line;
use crate::domain::*;
use crate::lifecycle::RunEvent;
use crate::messages::{DisarmWindow, ParkRun, RunDue};
use crate::ports::{RunUpdate, StoreError};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// The window end a run is held to, fixed by when it was scheduled: the
/// close of the window its occurrence falls in (or the next to open), or,
/// for an all-day window, the occurrence plus the engine's horizon. A run
/// resumed after downtime keeps yesterday's close.
pub fn fixed_window_end(
    spec: &NewReminder,
    scheduled_for: DateTime<Utc>,
    all_day_horizon: Duration,
) -> DateTime<Utc> {
    if spec.window.is_all_day() {
        return scheduled_for + chrono::Duration::from_std(all_day_horizon).unwrap_or_default();
    }
    spec.window
        .span_at_or_after(&spec.timezone, scheduled_for)
        .close
}

/// When the window a run is held to opens (`None`: all day, no window).
pub fn window_opening(spec: &NewReminder, window_end: DateTime<Utc>) -> Option<DateTime<Utc>> {
    (!spec.window.is_all_day()).then(|| {
        spec.window
            .span_at_or_after(&spec.timezone, window_end - chrono::Duration::seconds(1))
            .open
    })
}

/// Parks a running run until `opens`, held to the window that closes at
/// `close`: the window timer wakes it then.
pub(super) async fn park_until(
    engine: &Engine,
    run: &Run,
    opens: DateTime<Utc>,
    close: DateTime<Utc>,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    let parked = engine.events.event(
        "run_parked",
        Some(&run.account_id),
        Some(run.id),
        serde_json::json!({
            "delivered": delivered_line(&run.counts),
            "resumes_at": opens,
            "reason": reason,
        }),
    );
    match engine
        .update_owned_run(
            &run.account_id,
            run.id,
            &RunUpdate {
                window_end_at: Some(close),
                error_summary: reason.map(str::to_owned),
                event: Some(parked),
                ..RunEvent::Park.update()
            },
        )
        .await
    {
        Ok(()) => {}
        Err(StoreError::Conflict(_)) => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(links) = engine.window.as_ref() {
        links.disarm.do_send(DisarmWindow { run_id: run.id });
        links.park.do_send(ParkRun {
            due: RunDue {
                run_id: run.id,
                account_id: run.account_id.clone(),
            },
            at: opens,
        });
    }
    Ok(())
}
