//! Step 4: with the run's marks durable, it finishes, parks until its next
//! window, or goes back to the account's queue; and how a run ends early.

use super::ctx::{RunCtx, RunEnd};
use super::window::park_until;
use crate::delivery::engine::Engine;
use crate::delivery::outcome::{delivered_line, finish, StopReason};
use crate::domain::*;
use crate::lifecycle::RunEvent;
use crate::messages::DisarmWindow;
use crate::ports::{RunUpdate, StoreError};

impl RunCtx {
    /// Step 4: with the run's marks durable, finish, park or requeue.
    pub async fn conclude(&self) -> Result<RunEnd, RunEnd> {
        let engine = &self.engine;
        let store = &engine.ports.store;
        engine.writer.flush().await?;
        if let Some(e) = self.store_error.borrow().clone() {
            return Ok(RunEnd::Requeue { halt: None, why: e });
        }
        if self.control.is_draining() {
            return Ok(RunEnd::Left);
        }
        let Some(run_now) = store.get_run(self.run_id()).await? else {
            return Ok(RunEnd::Done);
        };
        let open = run_now.counts.pending + run_now.counts.sending;
        let stop = self.control.stop_reason();
        if open > 0 && !matches!(stop, Some(StopReason::Operator)) {
            if let Some(halt) = self.control.halted() {
                requeue(engine, &run_now, Some(&halt.reason)).await?;
                return Ok(RunEnd::Requeue {
                    halt: Some(halt),
                    why: "the account cannot send".into(),
                });
            }
            if self.control.is_paused() {
                return Ok(RunEnd::Left);
            }
            if let Some(d) = self.control.deferred() {
                park_until(engine, &run_now, d.resumes_at, d.close, Some(&d.reason)).await?;
                return Ok(RunEnd::Done);
            }
            if let Some(StopReason::WindowClosed(_)) = stop {
                if self.spec.resume_next_window && !self.spec.window.is_all_day() {
                    return self.park(&run_now).await;
                }
            }
        }
        let (status, mut summary) = finish(&run_now.counts, stop.as_ref(), &self.spec.timezone);
        // Held by its account (a ban, a cool-down) on the way: say so, or
        // a run cut by its window would read as merely too big for it.
        if let Some(held) = run_now
            .error_summary
            .as_deref()
            .and_then(|s| s.strip_prefix("Held: "))
        {
            summary = Some(match summary {
                Some(s) => format!("The account was held ({held}). {s}"),
                None => format!(
                    "{}; the account was held on the way ({held}).",
                    delivered_line(&run_now.counts)
                ),
            });
        } else if let (None, Some(deferred)) = (
            &summary,
            run_now
                .error_summary
                .as_ref()
                .filter(|s| crate::delivery::caps::is_cap_reason(s)),
        ) {
            // Delivered in full after a cap deferral: the deferral's text
            // must not read as the outcome.
            summary = Some(format!(
                "{}; deferred on the way ({deferred}).",
                delivered_line(&run_now.counts)
            ));
        }
        let reason = stop
            .as_ref()
            .map(StopReason::target_error)
            .unwrap_or_else(|| "run ended".into());
        finish_run(
            engine,
            &self.account,
            self.run_id(),
            RunEvent::Finish(status),
            summary,
            &reason,
            run_now.counts,
        )
        .await?;
        Ok(RunEnd::Done)
    }

    /// Parks the remainder until the next window opening (resume_next_window):
    /// the run is held to that window's close from then on.
    pub(super) async fn park(&self, run: &Run) -> Result<RunEnd, RunEnd> {
        let spec = &self.spec;
        let next = spec.window.next_open_after(&spec.timezone, self.window_end);
        park_until(&self.engine, run, next.open, next.close, None).await?;
        Ok(RunEnd::Done)
    }
}

/// Moves a run that was executing back to `queued`; one already queued
/// stays so. `why` (the account's halt) goes on the run, so its final
/// summary can say what held it.
pub(super) async fn requeue(
    engine: &Engine,
    run: &Run,
    why: Option<&str>,
) -> Result<(), StoreError> {
    if run.status == RunStatus::Queued {
        return Ok(());
    }
    match engine
        .update_owned_run(
            &run.account_id,
            run.id,
            &RunUpdate {
                error_summary: why.map(|w| format!("Held: {w}")),
                ..RunEvent::Requeue.update()
            },
        )
        .await
    {
        Ok(()) | Err(StoreError::Conflict(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A run that cannot start ends failed with the reason, nothing sent.
pub(super) async fn cannot_start(engine: &Engine, run: &Run, why: &str) -> Result<(), StoreError> {
    finish_run(
        engine,
        &run.account_id,
        run.id,
        RunEvent::Finish(RunStatus::Failed),
        Some(why.to_owned()),
        why,
        TargetCounts::default(),
    )
    .await
}

/// Ends a run with `event`: skips any target still open and stores
/// `run_finished` in the same transaction, disarms its window timer.
async fn finish_run(
    engine: &Engine,
    account: &AccountId,
    run_id: RunId,
    event: RunEvent,
    summary: Option<String>,
    skip_reason: &str,
    counts: TargetCounts,
) -> Result<(), StoreError> {
    let now = engine.ports.clock.now();
    let finished = engine.events.event(
        "run_finished",
        Some(account),
        Some(run_id),
        serde_json::json!({
            "status": event.to(),
            "delivered": delivered_line(&counts),
            "counts": counts,
            "summary": summary,
        }),
    );
    let update = RunUpdate {
        event: Some(finished),
        ..event.finish_update(now, summary.clone(), skip_reason)
    };
    match engine.update_owned_run(account, run_id, &update).await {
        Ok(()) => {}
        // Someone else ended it first (a racing stop): theirs stands.
        Err(StoreError::Conflict(_)) => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(links) = engine.window.as_ref() {
        links.disarm.do_send(DisarmWindow { run_id });
    }
    engine.ports.metrics.targets_remaining(account, 0);
    Ok(())
}
