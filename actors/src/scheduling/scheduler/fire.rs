//! Firing: a due occurrence becomes a run (queued and dispatched, or
//! recorded missed), idempotent on (reminder, scheduled_for); and the
//! operator's fire-now.

use super::config::{SchedulerPorts, FIRE_CONCURRENCY};
use super::due::{missed_summary, Due};
use super::state::{Action, DeferredRun, Firing};
use crate::domain::{ReminderState, RunId, RunStatus, TimeZone};
use crate::lifecycle::RunEvent;
use crate::messages::RunDue;
use crate::ports::{NewRun, RunUpdate, Store, StoreError, StoreResult};
use actix::prelude::*;
use chrono::{DateTime, Timelike, Utc};
use futures_util::StreamExt;
use serde_json::json;
use std::cell::RefCell;

/// What [`fire`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// Created as queued and dispatched.
    Queued(RunId),
    /// Recorded as missed.
    Missed(RunId),
    /// Someone (a restart, another scheduler) already created this run.
    AlreadyFired(RunId),
    /// Only an event noted skipped missed occurrences.
    SkipNoted,
    /// A deferred run was no longer `scheduled` (cancelled meanwhile).
    NotScheduled(RunId),
    /// A deferred run's reminder is no longer active: run cancelled.
    Cancelled(RunId),
}

/// Carries out one [`Firing`] at `now` (the instant `due_now` used).
pub async fn fire(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    f: &Firing,
    now: DateTime<Utc>,
) -> StoreResult<Fired> {
    let store = &*ports.store;
    match &f.action {
        Action::Queue => {
            let c = create_one(store, queue_run(ports, f), now).await?;
            if !c.created {
                return Ok(Fired::AlreadyFired(c.run.id));
            }
            if f.selects {
                freeze_selected(store, f.reminder_id, c.run.id).await;
            }
            queued(ports, dispatch, f, c.run.id, now, c.event).await;
            Ok(Fired::Queued(c.run.id))
        }
        Action::Miss => {
            let summary = missed_summary(&f.due, &f.tz, now);
            let new = NewRun {
                status: RunStatus::Missed,
                error_summary: Some(summary.clone()),
                event: Some(missed_event(ports, f, None, &summary)),
                ..queue_run(ports, f)
            };
            let c = create_one(store, new, now).await?;
            if !c.created {
                return Ok(Fired::AlreadyFired(c.run.id));
            }
            missed(ports, f, c.run.id, &summary, c.event);
            Ok(Fired::Missed(c.run.id))
        }
        Action::SkipMissed {
            count,
            at_least,
            recorded,
        } => {
            skip_missed(ports, f, *count, *at_least, *recorded).await;
            Ok(Fired::SkipNoted)
        }
        Action::Release(run_id) | Action::ReleaseMissed(run_id) => {
            release(ports, dispatch, f, *run_id, now).await
        }
    }
}

/// Older missed occurrences past the cap: counted, and told once.
async fn skip_missed(
    ports: &SchedulerPorts,
    f: &Firing,
    count: u64,
    at_least: bool,
    recorded: usize,
) {
    for _ in 0..count {
        ports.metrics.run_missed();
    }
    let more = if at_least { "more than " } else { "" };
    let message = format!(
        "MISSED_WINDOW: {more}{count} older missed occurrences (the last due {}) were not recorded; only the newest {recorded} were; none sent",
        local_text(f.due.occurrence, &f.tz),
    );
    tracing::warn!(reminder_id = f.reminder_id, count, "{message}");
    ports
        .events
        .emit(
            "missed_runs_skipped",
            Some(&f.account_id),
            None,
            firing_data(
                f,
                json!({"count": count, "at_least": at_least, "message": message}),
            ),
        )
        .await;
}

/// A `scheduled` run whose window opened: queued and dispatched, or
/// cancelled when its reminder is no longer active, or recorded missed
/// when it was picked up too late.
async fn release(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    f: &Firing,
    run_id: RunId,
    now: DateTime<Utc>,
) -> StoreResult<Fired> {
    let store = &*ports.store;
    // Cancelled or started by someone else meanwhile: leave it.
    match store.get_run(run_id).await? {
        Some(run) if run.status == RunStatus::Scheduled => {}
        _ => return Ok(Fired::NotScheduled(run_id)),
    }
    let active = store
        .get_reminder(f.reminder_id)
        .await?
        .is_some_and(|r| r.state == ReminderState::Active);
    let (status, summary) = if !active {
        (
            RunStatus::Cancelled,
            "reminder was paused or archived before its window opened; not sent".to_string(),
        )
    } else if matches!(f.action, Action::ReleaseMissed(_)) {
        (RunStatus::Missed, missed_summary(&f.due, &f.tz, now))
    } else {
        let release = RunUpdate {
            event: Some(queued_event(ports, f, Some(run_id), json!({}))),
            ..RunEvent::Release.update()
        };
        let told = match store.update_run(run_id, &release).await {
            Ok(told) => told,
            // Stopped by the operator since we read it.
            Err(StoreError::Conflict(_)) => return Ok(Fired::NotScheduled(run_id)),
            Err(e) => return Err(e),
        };
        queued(ports, dispatch, f, run_id, now, told).await;
        return Ok(Fired::Queued(run_id));
    };
    let dropped = store
        .update_run(
            run_id,
            &RunUpdate {
                finished_at: Some(now),
                error_summary: Some(summary.clone()),
                event: Some(if status == RunStatus::Missed {
                    missed_event(ports, f, Some(run_id), &summary)
                } else {
                    // Cancelled before its window opened: it ended.
                    ports.events.event(
                        "run_finished",
                        Some(&f.account_id),
                        Some(run_id),
                        json!({"status": status, "summary": summary}),
                    )
                }),
                ..RunEvent::Drop(status).update()
            },
        )
        .await;
    let told = match dropped {
        Ok(told) => told,
        Err(StoreError::Conflict(_)) => return Ok(Fired::NotScheduled(run_id)),
        Err(e) => return Err(e),
    };
    if status == RunStatus::Cancelled {
        ports.events.published(told);
        return Ok(Fired::Cancelled(run_id));
    }
    missed(ports, f, run_id, &summary, told);
    Ok(Fired::Missed(run_id))
}

/// Resolves a selector reminder's groups the moment its run is created,
/// so a sync or a label change while the run waits in its account's queue
/// or for its window cannot change which groups it sends to. Should this
/// fail, the run's first start resolves them instead; nothing is lost.
pub(crate) async fn freeze_selected(store: &dyn Store, reminder_id: i64, run: RunId) {
    match store.get_reminder(reminder_id).await {
        Ok(Some(r)) => freeze_spec(store, reminder_id, run, &r.spec).await,
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, run_id = %run, reminder_id, "could not freeze the run's groups now; its first start will")
        }
    }
}

/// [`freeze_selected`] with the reminder already read.
async fn freeze_spec(
    store: &dyn Store,
    reminder_id: i64,
    run: RunId,
    spec: &crate::domain::NewReminder,
) {
    let frozen = crate::scheduling::preflight::freeze_targets(store, run, spec)
        .await
        .map(|t| t.len());
    match frozen {
        Ok(groups) => tracing::debug!(run_id = %run, reminder_id, groups, "run's groups frozen"),
        Err(e) => {
            tracing::warn!(error = %e, run_id = %run, reminder_id, "could not freeze the run's groups now; its first start will")
        }
    }
}

/// An event's data about a firing, with `extra`'s fields added.
/// The occurrence `f` as a queued run, with its `run_queued` event.
fn queue_run(ports: &SchedulerPorts, f: &Firing) -> NewRun {
    NewRun {
        reminder_id: f.reminder_id,
        account_id: f.account_id.clone(),
        scheduled_for: f.due.occurrence,
        status: RunStatus::Queued,
        error_summary: None,
        event: Some(queued_event(ports, f, None, json!({}))),
    }
}

/// [`Store::create_runs`] of one run: the run and its event in one
/// transaction.
async fn create_one(
    store: &dyn Store,
    run: NewRun,
    now: DateTime<Utc>,
) -> StoreResult<crate::ports::RunCreated> {
    store
        .create_runs(std::slice::from_ref(&run), now)
        .await?
        .pop()
        .ok_or_else(|| StoreError::Backend("create_runs answered no run".into()))
}

/// `run_queued` for `f` (`run`: `None` when the store fills it in).
fn queued_event(
    ports: &SchedulerPorts,
    f: &Firing,
    run: Option<RunId>,
    extra: serde_json::Value,
) -> crate::domain::NewEvent {
    ports.events.event(
        "run_queued",
        Some(&f.account_id),
        run,
        firing_data(f, extra),
    )
}

/// `run_missed` for `f`, with its summary.
fn missed_event(
    ports: &SchedulerPorts,
    f: &Firing,
    run: Option<RunId>,
    summary: &str,
) -> crate::domain::NewEvent {
    let data = firing_data(f, json!({"error_summary": summary}));
    ports
        .events
        .event("run_missed", Some(&f.account_id), run, data)
}

fn firing_data(f: &Firing, extra: serde_json::Value) -> serde_json::Value {
    let mut v = json!({
        "reminder_id": f.reminder_id,
        "scheduled_for": f.due.occurrence,
        "due_at": f.due.effective,
    });
    if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
        v.extend(extra);
    }
    v
}

/// Carries out firings one at a time, `FIRE_CONCURRENCY` in flight; the
/// reminders that could not fire are added to `failed`.
pub(crate) async fn fire_each(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    firings: &[Firing],
    now: DateTime<Utc>,
    failed: &RefCell<Vec<i64>>,
) {
    // Occurrences of different reminders are independent and each fire is
    // idempotent: overlap their store round trips.
    futures_util::stream::iter(firings)
        .for_each_concurrent(FIRE_CONCURRENCY, |f| async move {
            if let Err(e) = fire(ports, dispatch, f, now).await {
                tracing::error!(error = %e, reminder_id = f.reminder_id, "could not fire; retrying at the next reconcile");
                failed.borrow_mut().push(f.reminder_id);
                // Told, so an operator (or a webhook) hears of it before
                // the retry: the store may stay unable for a while.
                let data = json!({
                    "error": e.to_string(),
                    "retry": "at the next reconcile",
                });
                ports
                    .events
                    .emit(
                        "reminder_failed_to_fire",
                        Some(&f.account_id),
                        None,
                        firing_data(f, data),
                    )
                    .await;
            }
        })
        .await;
}

/// Carries out [`Action::Queue`] firings with one `Store::create_runs`
/// call, then dispatches each run it created as [`fire`] does. If the batch
/// fails (say one reminder was deleted meanwhile) nothing was written, and
/// the firings are retried one by one so the others still go out.
pub(crate) async fn fire_queue_batch(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    batch: &[Firing],
    now: DateTime<Utc>,
    failed: &RefCell<Vec<i64>>,
) {
    let runs: Vec<NewRun> = batch.iter().map(|f| queue_run(ports, f)).collect();
    let created = ports.store.create_runs(&runs, now).await.and_then(|c| {
        if c.len() == runs.len() {
            Ok(c)
        } else {
            Err(StoreError::Backend(format!(
                "create_runs answered {} of {} runs",
                c.len(),
                runs.len()
            )))
        }
    });
    match created {
        Ok(created) => {
            let fresh: Vec<(&Firing, RunId, Option<crate::domain::Event>)> = batch
                .iter()
                .zip(created)
                .filter(|(_, c)| c.created)
                .map(|(f, c)| (f, c.run.id, c.event))
                .collect();
            futures_util::stream::iter(fresh.iter().filter(|(f, ..)| f.selects))
                .for_each_concurrent(FIRE_CONCURRENCY, |(f, run, _)| {
                    freeze_selected(&*ports.store, f.reminder_id, *run)
                })
                .await;
            for (f, run, told) in fresh {
                queued(ports, dispatch, f, run, now, told).await;
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, firings = batch.len(), "could not fire a batch; firing one by one");
            fire_each(ports, dispatch, batch, now, failed).await;
        }
    }
}

fn local_text(t: DateTime<Utc>, tz: &TimeZone) -> String {
    format!(
        "{} {tz}",
        t.with_timezone(&tz.tz()).format("%Y-%m-%d %H:%M")
    )
}

/// A run stored as queued (with `told`, its `run_queued` event, in the
/// same transaction): dispatched to its account, counted, broadcast.
pub(crate) async fn queued(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    f: &Firing,
    run_id: RunId,
    now: DateTime<Utc>,
    told: Option<crate::domain::Event>,
) {
    dispatch.do_send(RunDue {
        run_id,
        account_id: f.account_id.clone(),
    });
    let lag = (now - f.due.effective).to_std().unwrap_or_default();
    ports.metrics.fire_lag(lag);
    tracing::info!(run_id = %run_id, reminder_id = f.reminder_id, account_id = %f.account_id, lag_ms = lag.as_millis() as u64, "run queued");
    ports.events.published(told);
}

/// A run stored as missed (with `told`, its `run_missed` event).
pub(crate) fn missed(
    ports: &SchedulerPorts,
    f: &Firing,
    run_id: RunId,
    summary: &str,
    told: Option<crate::domain::Event>,
) {
    ports.metrics.run_missed();
    tracing::warn!(run_id = %run_id, reminder_id = f.reminder_id, account_id = %f.account_id, "{summary}");
    ports.events.published(told);
}

/// Why `FireNow` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FireNowError {
    #[error("reminder {0} not found")]
    NotFound(i64),
    #[error("reminder {id} is {state}; only an active reminder can fire")]
    NotActive { id: i64, state: ReminderState },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// For callers whose message to the actor was not delivered.
    #[error("the scheduler is not running")]
    Unavailable,
}

impl From<MailboxError> for FireNowError {
    fn from(_: MailboxError) -> Self {
        Self::Unavailable
    }
}

/// What `FireNow` did.
#[derive(Debug, Clone)]
pub enum FireNowOutcome {
    /// Inside the window: queued and dispatched (or it already existed).
    Queued(RunId),
    /// Outside the window: created as `scheduled`, waiting for the opening.
    Deferred(DeferredRun),
}

impl FireNowOutcome {
    pub fn run_id(&self) -> RunId {
        match self {
            Self::Queued(id) => *id,
            Self::Deferred(d) => d.run_id,
        }
    }
}

/// Creates a run for `now` (to the second), subject to the window.
pub async fn fire_now(
    ports: &SchedulerPorts,
    dispatch: &Recipient<RunDue>,
    reminder_id: i64,
    now: DateTime<Utc>,
) -> Result<FireNowOutcome, FireNowError> {
    let store = &*ports.store;
    let r = store
        .get_reminder(reminder_id)
        .await?
        .ok_or(FireNowError::NotFound(reminder_id))?;
    if r.state != ReminderState::Active {
        return Err(FireNowError::NotActive {
            id: reminder_id,
            state: r.state,
        });
    }
    let at = now.with_nanosecond(0).unwrap_or(now);
    let tz = r.spec.timezone;
    let span = r.spec.window.span_at_or_after(&tz, at);
    let inside = span.contains(at);
    let status = if inside {
        RunStatus::Queued
    } else {
        RunStatus::Scheduled
    };
    let f = Firing {
        reminder_id,
        account_id: r.spec.account_id.clone(),
        tz,
        due: Due {
            occurrence: at,
            effective: if inside { at } else { span.open },
        },
        selects: false,
        action: Action::Queue,
    };
    let kind = if inside {
        "run_queued"
    } else {
        "run_scheduled"
    };
    let told = ports.events.event(
        kind,
        Some(&f.account_id),
        None,
        firing_data(&f, json!({"fire_now": true})),
    );
    let new = NewRun {
        status,
        event: Some(told),
        ..queue_run(ports, &f)
    };
    let c = create_one(store, new, now).await?;
    if c.created && r.spec.select.is_some() {
        // Also a run waiting for its window: its groups are those of now.
        freeze_spec(store, reminder_id, c.run.id, &r.spec).await;
    }
    if inside || c.run.status != RunStatus::Scheduled {
        if c.created {
            queued(ports, dispatch, &f, c.run.id, now, c.event).await;
        }
        return Ok(FireNowOutcome::Queued(c.run.id));
    }
    ports.events.published(c.event);
    Ok(FireNowOutcome::Deferred(DeferredRun::new(
        &c.run,
        tz,
        &r.spec.window,
    )))
}
