//! One run's delivery, executed inside its AccountActor's context, in four
//! named steps the actor (and the simulation) drive in turn:
//!
//! 1. [`begin`]: admit the run (load it and its account), take a fire
//!    permit, move it to `running` (compare-and-set: a run paused, stopped
//!    or finished meanwhile is not started) with its window end fixed,
//!    open its targets and rebuild the account's bucket, then announce it
//!    (forecast, window timer, event);
//! 2. [`RunCtx::prepare_uploads`]: upload each unique media once (or reuse a
//!    cached handle);
//! 3. [`RunCtx::deliver`]: up to `group_concurrency` groups in flight, each
//!    group's parts strictly in order, one token per message taken when
//!    the gateway is ready to write, a durable `sending` mark with a
//!    deterministic message id before every send;
//! 4. [`RunCtx::conclude`]: once its marks are durable, the run finishes,
//!    parks until its next window, or goes back to the account's queue.
//!
//! Every status change goes through [`crate::lifecycle::RunEvent`].

use crate::bucket::TokenBucket;
use crate::caps::{CapPolicy, SendLedger};
use crate::domain::*;
use crate::engine::{Deferral, Engine, Halt, ParkRun, RunControl};
use crate::lifecycle::RunEvent;
use crate::messages::{ArmWindow, DisarmWindow, RunDue};
use crate::outcome::{delivered_line, finish, message_id, StopReason};
use crate::ports::{Gateway, GatewayError, OutgoingMessage, RunUpdate, StoreError};
use crate::signals::{AccountSignal, Breaker};
use crate::variation::RunTexts;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// How a run's execution ended, for the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Finished, parked, or no longer this actor's to run (paused,
    /// stopped or finished by someone else).
    Done,
    /// Paused or drained mid-run: its targets stay as they are and the
    /// status says what happens next.
    Left,
    /// Back to the front of the account's queue: the account cannot send
    /// (`halt`), or the store failed and the run is tried again shortly.
    Requeue { halt: Option<Halt>, why: String },
}

impl From<StoreError> for RunEnd {
    fn from(e: StoreError) -> Self {
        match e {
            // Another daemon owns the account now: leave the run to it.
            StoreError::Fenced(_) => RunEnd::Left,
            e => RunEnd::Requeue {
                halt: None,
                why: e.to_string(),
            },
        }
    }
}

/// One group's failed tries of its current part, by kind: each kind has
/// its own allowance, and a sent part starts them over.
#[derive(Debug, Default)]
struct Tries {
    /// Transient failures (and 463/479 below the breaker).
    attempts: u32,
    /// Rate-limit answers.
    limited: u32,
    /// Sends that found WhatsApp unreachable.
    outage: u32,
}

impl Tries {
    fn is_fresh(&self) -> bool {
        self.attempts == 0 && self.limited == 0 && self.outage == 0
    }
}

/// What [`RunCtx::after_failure`] decided for the group.
enum After {
    /// Try the part again (the gate decides whether the group goes on).
    Retry,
    /// The group's target is failed; the group is done.
    Done,
}

/// Everything a group's delivery needs, shared by the groups in flight.
pub struct RunCtx {
    engine: Arc<Engine>,
    account: AccountId,
    run: Run,
    gateway: Arc<dyn Gateway>,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    breaker: Rc<RefCell<Breaker>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
    spec: NewReminder,
    /// The run's renderings of its templates.
    texts: RunTexts,
    /// The account's daily, hourly and warm-up caps (`None`: unlimited)
    /// and its sends of the last day, counted as they go.
    caps: Option<CapPolicy>,
    ledger: RefCell<SendLedger>,
    media_mime: HashMap<MediaId, String>,
    window_end: DateTime<Utc>,
    concurrency: usize,
    open: RefCell<Vec<RunTarget>>,
    /// Set when a mark could not be stored.
    store_error: RefCell<Option<String>>,
    remaining: Cell<usize>,
    /// The lease epoch this run first acted under (several daemons): it
    /// acts under no other, so an actor left over from a lease this daemon
    /// lost and took again never sends beside the new one.
    epoch: Cell<Option<i64>>,
    progress_every: usize,
    counts: RefCell<TargetCounts>,
    /// The fire-concurrency permit, released when the execution ends (a
    /// paused run leaves, so it never holds one).
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// What a group's delivery stopped on.
enum Gate {
    Go,
    /// Skip the rest of this group with this reason.
    Skip(String),
    /// Leave the group as it is (pause, drain, halt, park, store error):
    /// it resumes later.
    Leave,
}

/// Runs all four steps.
pub async fn execute(
    engine: Arc<Engine>,
    account: AccountId,
    run_id: RunId,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    breaker: Rc<RefCell<Breaker>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
) -> RunEnd {
    let ctx = match begin(engine, account, run_id, control, bucket, breaker, uploads).await {
        Ok(ctx) => ctx,
        Err(end) => return end,
    };
    ctx.prepare_uploads().await;
    ctx.deliver().await;
    ctx.conclude().await.unwrap_or_else(|end| end)
}

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
async fn park_until(
    engine: &Engine,
    run: &Run,
    opens: DateTime<Utc>,
    close: DateTime<Utc>,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    match engine
        .update_owned_run(
            &run.account_id,
            run.id,
            &RunUpdate {
                window_end_at: Some(close),
                error_summary: reason.map(str::to_owned),
                ..RunEvent::Park.update()
            },
        )
        .await
    {
        Ok(()) => {}
        Err(StoreError::Conflict(_)) => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(links) = engine.window.get() {
        links.disarm.do_send(DisarmWindow { run_id: run.id });
        links.park.do_send(ParkRun {
            due: RunDue {
                run_id: run.id,
                account_id: run.account_id.clone(),
            },
            at: opens,
        });
    }
    engine
        .events
        .emit(
            "run_parked",
            Some(&run.account_id),
            Some(run.id),
            serde_json::json!({
                "delivered": delivered_line(&run.counts),
                "resumes_at": opens,
                "reason": reason,
            }),
        )
        .await;
    Ok(())
}

/// What [`admit`] found: a run that may start, on an account that can send.
struct Admitted {
    run: Run,
    account: Account,
    gateway: Arc<dyn Gateway>,
    spec: NewReminder,
}

/// The run's open targets, its counts and the account's pace, after
/// [`open_targets`].
struct Opened {
    open: Vec<RunTarget>,
    counts: TargetCounts,
    concurrency: usize,
}

/// Step 1: everything before the first send, itself in named steps:
/// [`admit`], [`take_fire_permit`], [`mark_started`], [`claim_account`],
/// [`open_targets`], [`announce`]. `Err` ends the execution.
pub async fn begin(
    engine: Arc<Engine>,
    account_id: AccountId,
    run_id: RunId,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    breaker: Rc<RefCell<Breaker>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
) -> Result<Rc<RunCtx>, RunEnd> {
    let Admitted {
        run,
        account,
        gateway,
        spec,
    } = admit(&engine, &account_id, run_id, &control).await?;
    let permit = take_fire_permit(&engine, &control).await?;
    let now = engine.ports.clock.now();
    let window_end = mark_started(&engine, &run, &spec, now).await?;
    claim_account(&engine, &account.id, gateway.as_ref()).await?;
    let opened = open_targets(&engine, &account, &run, &spec, &bucket).await?;
    let texts = RunTexts::new(
        &spec,
        run.id,
        run.scheduled_for,
        opened.counts.total() as usize,
    );
    let texts = if texts.wants_group_names() {
        texts
            .with_names(crate::variation::directory_names(&*engine.ports.store, &account.id).await?)
    } else {
        texts
    };
    let (caps, ledger) = account_caps(&engine, &account, &spec, now).await?;
    let forecast = forecast_for(
        &engine,
        &account,
        &spec,
        caps.as_ref(),
        &ledger,
        opened.open.len() as u32,
        now,
        window_end,
    )
    .text;
    announce(&engine, &run, &forecast, &opened, window_end).await?;
    let Opened {
        open,
        counts,
        concurrency,
    } = opened;
    let media_mime = media_types(&engine, &spec).await?;
    engine
        .ports
        .metrics
        .targets_remaining(&account_id, open.len());
    let total = counts.total() as usize;
    Ok(Rc::new(RunCtx {
        engine,
        account: account_id,
        run: Run {
            window_end_at: Some(window_end),
            ..run
        },
        gateway,
        control,
        bucket,
        breaker,
        uploads,
        spec,
        texts,
        caps,
        ledger: RefCell::new(ledger),
        media_mime,
        window_end,
        concurrency,
        remaining: Cell::new(open.len()),
        epoch: Cell::new(None),
        open: RefCell::new(open),
        store_error: RefCell::new(None),
        progress_every: (total / 20).max(1),
        counts: RefCell::new(counts),
        _permit: permit,
    }))
}

/// Step 1a: the run may start, its account can send, its gateway is built
/// in and its reminder still exists. A run that cannot start ends with a
/// reason; one whose account cannot send goes back to the queue.
async fn admit(
    engine: &Engine,
    account_id: &AccountId,
    run_id: RunId,
    control: &RunControl,
) -> Result<Admitted, RunEnd> {
    let store = &engine.ports.store;
    let Some(run) = store.get_run(run_id).await? else {
        return Err(RunEnd::Done);
    };
    if !RunEvent::Start.from().contains(&run.status) {
        // Paused, stopped or finished before it got here: not ours to run.
        return Err(RunEnd::Done);
    }
    // Stopped by the operator before a crash or a requeue: it ends
    // cancelled, skipping its groups, whatever the account's state.
    let stopping = run.stop_requested_at.is_some();
    if stopping {
        control.stop(StopReason::Operator);
    }
    let Some(account) = store.get_account(account_id).await? else {
        cannot_start(
            engine,
            &run,
            "The account was deleted before the run started.",
        )
        .await?;
        return Err(RunEnd::Done);
    };
    if account.state != AccountState::Connected && !stopping {
        // The account keeps the run in its queue until it can send again.
        let reason = account
            .state_reason
            .clone()
            .unwrap_or_else(|| format!("account is {}", account.state));
        requeue(engine, &run, None).await?;
        return Err(RunEnd::Requeue {
            halt: Some(Halt {
                state: account.state,
                reason,
                record: false,
                // A ban or cool-down recorded by an earlier start or another
                // daemon still ends when it said.
                until: account.state_until,
            }),
            why: "the account cannot send".into(),
        });
    }
    let Some(gateway) = engine.ports.gateways.gateway(account.kind) else {
        let why = format!("No {} gateway in this build of Herald.", account.kind);
        cannot_start(engine, &run, &why).await?;
        return Err(RunEnd::Done);
    };
    let Some(reminder) = store.get_reminder(run.reminder_id).await? else {
        cannot_start(
            engine,
            &run,
            "The reminder was deleted before the run started.",
        )
        .await?;
        return Err(RunEnd::Done);
    };
    Ok(Admitted {
        run,
        account,
        gateway,
        spec: reminder.spec,
    })
}

/// Step 1b: only `fire_concurrency` accounts mid-run; waiting here keeps
/// the run queued. The permit is the run's until its execution ends.
async fn take_fire_permit(
    engine: &Engine,
    control: &RunControl,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, RunEnd> {
    let permit = match &engine.fire_permits {
        Some(p) => Some(
            p.clone()
                .acquire_owned()
                .await
                .expect("permits never close"),
        ),
        None => None,
    };
    if control.is_leaving() {
        return Err(RunEnd::Left);
    }
    Ok(permit)
}

/// Step 1c: `running` (compare-and-set), held to the window end fixed at
/// firing. A run whose window has not opened yet goes back to waiting
/// for the opening. Returns the window end.
async fn mark_started(
    engine: &Engine,
    run: &Run,
    spec: &NewReminder,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, RunEnd> {
    let window_end = run.window_end_at.unwrap_or_else(|| {
        fixed_window_end(spec, run.scheduled_for, engine.config.all_day_horizon)
    });
    match engine
        .update_owned_run(
            &run.account_id,
            run.id,
            &RunUpdate {
                started_at: run.started_at.is_none().then_some(now),
                window_end_at: Some(window_end),
                ..RunEvent::Start.update()
            },
        )
        .await
    {
        Ok(()) => {}
        // Paused or stopped between our read and our write.
        Err(StoreError::Conflict(_)) => return Err(RunEnd::Done),
        Err(e) => return Err(e.into()),
    }
    // Held to a window that has not opened yet (a parked run resumed by
    // the operator early): back to waiting for the opening.
    if let Some(opens) = window_opening(spec, window_end).filter(|o| now < *o) {
        park_until(engine, run, opens, window_end, None).await?;
        return Err(RunEnd::Done);
    }
    Ok(window_end)
}

/// Step 1d (several daemons): the gateway is told this daemon's lease
/// before the limiter reads the account's last minute from the store, so
/// no send the previous owner still had under way (a paused daemon's) can
/// land after that read. A newer epoch already seen means the lease is gone.
async fn claim_account(
    engine: &Engine,
    account: &AccountId,
    gateway: &dyn Gateway,
) -> Result<(), RunEnd> {
    let Ok(Some(fence)) = engine.ownership(account).fence() else {
        return Ok(());
    };
    match gateway.claim_fence(&fence).await {
        Ok(()) => Ok(()),
        Err(e @ GatewayError::Fenced { .. }) => {
            tracing::warn!(%account, error = %e, "account lease lost: leaving the run to its new owner");
            Err(RunEnd::Left)
        }
        // Not told (the gateway is unreachable): its first send finds out,
        // and the local lease deadline still guards.
        Err(e) => {
            tracing::debug!(%account, error = %e, "could not claim the account's lease at the gateway");
            Ok(())
        }
    }
}

/// Step 1e: the run's targets (created once, idempotently), the ones still
/// open, their counts, and the account's bucket rebuilt at its limit.
async fn open_targets(
    engine: &Engine,
    account: &Account,
    run: &Run,
    spec: &NewReminder,
    bucket: &RefCell<TokenBucket>,
) -> Result<Opened, RunEnd> {
    let store = &engine.ports.store;
    // A selector's groups were frozen when the scheduler created the run;
    // a run without them (explicit JIDs only, or the scheduler failed to
    // freeze) gets them here, once: a resumed or requeued run finds its
    // targets and never re-reads the directory.
    let targets = crate::preflight::freeze_targets(store.as_ref(), run.id, spec).await?;
    if targets.is_empty() {
        let synced = store.groups_synced_at(&account.id).await?;
        cannot_start(engine, run, &crate::preflight::nothing_picked(synced)).await?;
        return Err(RunEnd::Done);
    }
    let (per_minute, concurrency) = effective_limits(engine, account);
    rebuild_bucket(engine, &account.id, bucket, per_minute).await?;
    let mut counts = TargetCounts::default();
    for t in &targets {
        counts.add(
            if t.status == TargetStatus::Sending {
                TargetStatus::Pending
            } else {
                t.status
            },
            1,
        );
    }
    let open = targets
        .into_iter()
        .filter(|t| !t.status.is_final())
        .collect();
    Ok(Opened {
        open,
        counts,
        concurrency: concurrency as usize,
    })
}

/// Step 1f: the forecast stored on the run, the window timer armed, and
/// `run_started` told to the event stream.
async fn announce(
    engine: &Engine,
    run: &Run,
    forecast: &str,
    Opened { open, counts, .. }: &Opened,
    window_end: DateTime<Utc>,
) -> Result<(), RunEnd> {
    engine
        .update_owned_run(
            &run.account_id,
            run.id,
            &RunUpdate {
                forecast: Some(forecast.to_owned()),
                ..Default::default()
            },
        )
        .await?;
    if let Some(links) = engine.window.get() {
        links.arm.do_send(ArmWindow {
            run_id: run.id,
            account_id: run.account_id.clone(),
            close_at: window_end,
        });
    }
    engine
        .events
        .emit(
            "run_started",
            Some(&run.account_id),
            Some(run.id),
            serde_json::json!({
                "reminder_id": run.reminder_id,
                "total": counts.total(),
                "remaining": open.len(),
                "window_end_at": window_end,
                "forecast": forecast,
            }),
        )
        .await;
    Ok(())
}

/// The content type of each picture the run sends, read once.
async fn media_types(
    engine: &Engine,
    spec: &NewReminder,
) -> Result<HashMap<MediaId, String>, RunEnd> {
    let mut media_mime = HashMap::new();
    for part in &spec.parts {
        if let Some(m) = part.media_id() {
            if !media_mime.contains_key(m) {
                let info = engine.ports.store.get_media(m).await?;
                media_mime.insert(
                    m.clone(),
                    info.map(|i| i.mime).unwrap_or_else(|| "image/jpeg".into()),
                );
            }
        }
    }
    Ok(media_mime)
}

/// The caps that apply to `account`: its own daily and hourly caps and,
/// for a new number, the engine's warm-up ramp, counted in the account's
/// timezone (or the reminder's, for an account without one).
pub fn cap_policy(engine: &Engine, account: &Account, spec: &NewReminder) -> Option<CapPolicy> {
    let policy = CapPolicy {
        tz: account.limits.timezone.unwrap_or(spec.timezone),
        daily: account.limits.daily_cap,
        hourly: account.limits.hourly_cap,
        warmup: engine
            .config
            .warmup
            .clone()
            .filter(|_| account.limits.new_number || engine.config.warmup_all),
        ramp_start: account.ramp_start(),
    };
    (!policy.is_unlimited()).then_some(policy)
}

/// The account's messages per minute and groups in flight: its own
/// overrides, else the engine's settings.
fn effective_limits(engine: &Engine, account: &Account) -> (u32, u32) {
    let concurrency = account
        .limits
        .group_concurrency
        .unwrap_or(engine.config.group_concurrency)
        .max(1);
    (engine.per_minute(&account.limits), concurrency)
}

/// The account's caps and its sends of the last day (empty without caps).
pub async fn account_caps(
    engine: &Engine,
    account: &Account,
    spec: &NewReminder,
    now: DateTime<Utc>,
) -> Result<(Option<CapPolicy>, SendLedger), StoreError> {
    let caps = cap_policy(engine, account, spec);
    let ledger = match &caps {
        Some(_) => load_ledger(engine, &account.id, now).await?,
        None => SendLedger::default(),
    };
    Ok((caps, ledger))
}

/// The forecast a run states at its start (and the control port's
/// dry-run): at the rate the account really sustains — its pacing, the
/// typing before each message, its groups in flight — not the raw limit,
/// and, when a cap or the warm-up binds today, what it leaves for today
/// and when the rest will have gone.
#[allow(clippy::too_many_arguments)]
pub fn forecast_for(
    engine: &Engine,
    account: &Account,
    spec: &NewReminder,
    caps: Option<&CapPolicy>,
    ledger: &SendLedger,
    groups: u32,
    start: DateTime<Utc>,
    close: DateTime<Utc>,
) -> crate::forecast::Forecast {
    let (per_minute, concurrency) = effective_limits(engine, account);
    let typed = spec
        .parts
        .first()
        .and_then(|p| match p {
            MessagePart::Text { text } => Some(text.chars().count()),
            MessagePart::Media { caption, .. } => caption.as_ref().map(|c| c.chars().count()),
        })
        .unwrap_or(0);
    let sustained = crate::forecast::paced_per_minute(
        per_minute,
        engine.pacing(&account.id),
        engine.config.typing.duration(typed),
        concurrency,
    );
    let parts = spec.parts.len() as u32;
    let mut f = crate::forecast::forecast(groups, parts, sustained, start, close, &spec.timezone);
    let fit = crate::caps::WindowFit::new(f.groups_fit, spec.window.hours(), sustained);
    if let Some(capped) = caps.and_then(|c| c.forecast(ledger, start, groups, parts, fit)) {
        f.text = format!("{}; {capped}", f.text);
    }
    f
}

/// The account's sends of the last 26 hours (a local day is at most 25),
/// one entry per message, from the store.
async fn load_ledger(
    engine: &Engine,
    account: &AccountId,
    now: DateTime<Utc>,
) -> Result<SendLedger, StoreError> {
    let sent = engine
        .ports
        .store
        .sent_since(account, now - chrono::Duration::hours(26))
        .await?;
    // A target still marked `sending` (no time) is not counted: a run
    // deferred by a cap leaves the groups it had in flight that way
    // without sending them; only a crash mid-send could have sent one,
    // which can put at most group_concurrency messages over a cap.
    let _ = now;
    Ok(SendLedger::from_times(
        sent.into_iter()
            .filter_map(|(at, parts)| Some(std::iter::repeat_n(at?, parts.max(1) as usize)))
            .flatten()
            .collect(),
    ))
}

/// A fresh actor's bucket, or one whose account changed lease epoch since
/// its last rebuild, starts from the store: the account's sends of
/// the last minute are in its grant log, at the account's own limit.
async fn rebuild_bucket(
    engine: &Engine,
    account: &AccountId,
    bucket: &RefCell<TokenBucket>,
    per_minute: u32,
) -> Result<(), StoreError> {
    let now = tokio::time::Instant::now();
    // Under a new lease epoch another daemon may have sent meanwhile, which
    // this log never saw: only the store knows (a lost lease reads as -1,
    // so the next owned run reads it again).
    let epoch = match engine.ownership(account).fence() {
        Ok(fence) => fence.map_or(0, |f| f.epoch),
        Err(_) => -1,
    };
    if bucket.borrow().rebuilt_under() == Some(epoch) {
        bucket.borrow_mut().set_per_minute(per_minute, now);
        return Ok(());
    }
    let now_utc = engine.ports.clock.now();
    let sent = engine
        .ports
        .store
        .sent_since(account, now_utc - chrono::Duration::seconds(60))
        .await?;
    // `sent_at` is when the mark was made, at or after the send, and a
    // target's earlier parts count at its last part's time; a target still
    // marked `sending` (its answer, or its `sent` mark, lost in a crash)
    // counts as sent just now: each errs on the side of waiting longer.
    let grants = sent.into_iter().flat_map(|(at, parts)| {
        let ago = at.map_or(Duration::ZERO, |at| {
            (now_utc - at).to_std().unwrap_or_default()
        });
        std::iter::repeat_n(now.checked_sub(ago).unwrap_or(now), parts.max(1) as usize)
    });
    let now = tokio::time::Instant::now();
    let grants: Vec<tokio::time::Instant> = grants.collect();
    tracing::info!(%account, epoch, per_minute, sent_last_minute = grants.len(), "send limiter rebuilt from the store");
    bucket.borrow_mut().rebuild(per_minute, now, grants, epoch);
    Ok(())
}

/// Moves a run that was executing back to `queued`; one already queued
/// stays so. `why` (the account's halt) goes on the run, so its final
/// summary can say what held it.
async fn requeue(engine: &Engine, run: &Run, why: Option<&str>) -> Result<(), StoreError> {
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
async fn cannot_start(engine: &Engine, run: &Run, why: &str) -> Result<(), StoreError> {
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

/// Ends a run with `event`: skips any target still open, disarms its
/// window timer, tells the event stream.
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
    match engine
        .update_owned_run(
            account,
            run_id,
            &event.finish_update(now, summary.clone(), skip_reason),
        )
        .await
    {
        Ok(()) => {}
        // Someone else ended it first (a racing stop): theirs stands.
        Err(StoreError::Conflict(_)) => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(links) = engine.window.get() {
        links.disarm.do_send(DisarmWindow { run_id });
    }
    engine.ports.metrics.targets_remaining(account, 0);
    engine
        .events
        .emit(
            "run_finished",
            Some(account),
            Some(run_id),
            serde_json::json!({
                "status": event.to(),
                "delivered": delivered_line(&counts),
                "counts": counts,
                "summary": summary,
            }),
        )
        .await;
    Ok(())
}

impl RunCtx {
    fn metrics(&self) -> &dyn crate::ports::Metrics {
        &*self.engine.ports.metrics
    }

    fn run_id(&self) -> RunId {
        self.run.id
    }

    fn halt_with(&self, e: &GatewayError) {
        let (state, reason, until) = match e {
            GatewayError::Banned { until: Some(t) } => (
                AccountState::Banned,
                format!("Account temporarily banned by WhatsApp until {t}"),
                Some(*t),
            ),
            GatewayError::Banned { until: None } => (
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
        self.control.halt(Halt {
            state,
            reason,
            record: true,
            until,
        });
    }

    /// Step 2: each unique media uploaded once, or a still-valid handle
    /// reused from this actor's cache or the store. A failure here is
    /// retried per part in step 3; an account failure halts the run.
    pub async fn prepare_uploads(&self) {
        if self.engine.ports.clock.now() >= self.window_end {
            self.control.stop(StopReason::WindowClosed(self.window_end));
            return;
        }
        if self.control.must_not_send() {
            return;
        }
        let ids: Vec<MediaId> = self.media_mime.keys().cloned().collect();
        for id in ids {
            match self.upload(&id, false).await {
                Ok(_) => {}
                Err(e) if e.is_account_failure() => return self.halt_with(&e),
                Err(e) => {
                    tracing::warn!(account = %self.account, run = %self.run_id(), error = %e, "media upload failed; retried per group");
                    return;
                }
            }
        }
    }

    async fn upload(&self, media: &MediaId, force: bool) -> Result<UploadHandle, GatewayError> {
        let engine = &self.engine;
        let now = engine.ports.clock.now();
        let margin = chrono::Duration::from_std(engine.config.upload_margin).unwrap_or_default();
        let fresh = |h: &UploadHandle| h.expires_at > now + margin;
        if !force {
            let cached = self.uploads.borrow().get(media).cloned();
            if let Some(h) = cached.filter(fresh) {
                self.metrics().media_cache_hit(&self.account);
                return Ok(h);
            }
            if let Ok(Some(h)) = engine
                .ports
                .store
                .get_upload_handle(&self.account, media)
                .await
            {
                if fresh(&h) {
                    self.metrics().media_cache_hit(&self.account);
                    self.uploads.borrow_mut().insert(media.clone(), h.clone());
                    return Ok(h);
                }
            }
        }
        let bytes = engine
            .ports
            .media
            .read(media)
            .await
            .map_err(|e| GatewayError::Transient(format!("reading media {media}: {e}")))?;
        let mime = self
            .media_mime
            .get(media)
            .cloned()
            .unwrap_or_else(|| "image/jpeg".into());
        let mut attempt = 0;
        let handle = loop {
            attempt += 1;
            match self
                .gateway
                .upload(&self.account, media, &mime, bytes.clone())
                .await
            {
                Ok(h) => break h,
                Err(e)
                    if attempt < engine.config.max_attempts
                        && matches!(
                            e,
                            GatewayError::Transient(_)
                                | GatewayError::Unreachable(_)
                                | GatewayError::RateLimited { .. }
                        ) =>
                {
                    self.control
                        .nap(backoff(engine.config.retry_base, attempt))
                        .await;
                    if self.control.must_not_send() {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        };
        self.metrics()
            .media_uploaded(&self.account, bytes.len() as u64);
        if let Err(e) = engine
            .ports
            .store
            .put_upload_handle(&self.account, media, &handle)
            .await
        {
            tracing::warn!(error = %e, "could not cache upload handle");
        }
        self.uploads
            .borrow_mut()
            .insert(media.clone(), handle.clone());
        Ok(handle)
    }

    /// Step 3: every open target, `group_concurrency` at a time.
    pub async fn deliver(self: &Rc<Self>) {
        let open = std::mem::take(&mut *self.open.borrow_mut());
        futures_util::stream::iter(open)
            .for_each_concurrent(self.concurrency, |t| {
                let ctx = self.clone();
                async move { ctx.deliver_group(t).await }
            })
            .await;
    }

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
                .filter(|s| crate::caps::is_cap_reason(s)),
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
    async fn park(&self, run: &Run) -> Result<RunEnd, RunEnd> {
        let spec = &self.spec;
        let next = spec.window.next_open_after(&spec.timezone, self.window_end);
        park_until(&self.engine, run, next.open, next.close, None).await?;
        Ok(RunEnd::Done)
    }

    /// Says whether a group may go on.
    fn gate(&self) -> Gate {
        if self.store_error.borrow().is_some() {
            return Gate::Leave;
        }
        if self.engine.ports.clock.now() >= self.window_end {
            self.control.stop(StopReason::WindowClosed(self.window_end));
        }
        match self.control.stop_reason() {
            Some(StopReason::Operator) => return Gate::Skip(StopReason::Operator.target_error()),
            Some(reason) if !self.control.is_leaving() => {
                if matches!(reason, StopReason::WindowClosed(_)) && self.spec.resume_next_window {
                    return Gate::Leave;
                }
                return Gate::Skip(reason.target_error());
            }
            _ => {}
        }
        if self.control.is_leaving() {
            return Gate::Leave;
        }
        Gate::Go
    }

    /// Takes one token at a moment the gateway can write, waiting as the
    /// bucket says. `None`: the run must not send any more (stopped,
    /// paused, halted, window closed); `Some(Err)`: the gateway cannot
    /// get ready. The readiness check comes right before each take, with
    /// no wait in between: a token held through a reconnect would leave,
    /// with the others held beside it, back to back when the socket is back.
    async fn take_token_when_ready(&self) -> Option<Result<tokio::time::Instant, GatewayError>> {
        loop {
            // Checked before every grant, not only after a wait: a mark or
            // an upload may have taken us past the window or a stop.
            if self.must_not_send() {
                return None;
            }
            if let Err(e) = self.gateway.ready(&self.account).await {
                return Some(Err(e));
            }
            if self.must_not_send() {
                return None;
            }
            if !self.within_caps() {
                return None;
            }
            let now = tokio::time::Instant::now();
            let wait = self.bucket.borrow_mut().try_take(now);
            match wait {
                Ok(()) => {
                    // Counted at the grant, not the answer: groups in
                    // flight together cannot overshoot a cap.
                    if self.caps.is_some() {
                        self.ledger
                            .borrow_mut()
                            .record(self.engine.ports.clock.now());
                    }
                    let tokens = self
                        .bucket
                        .borrow_mut()
                        .available(tokio::time::Instant::now());
                    let pm = self.bucket.borrow().per_minute();
                    self.metrics().tokens_available(&self.account, tokens, pm);
                    return Some(Ok(now));
                }
                Err(w) => self.control.nap(w).await,
            }
        }
    }

    fn must_not_send(&self) -> bool {
        self.control.must_not_send() || self.engine.ports.clock.now() >= self.window_end
    }

    /// Whether one more message keeps the account within its caps; if not,
    /// the run is deferred to when the cap resets (inside its window, or
    /// the next one with resume_next_window) or, if it cannot be, stopped
    /// with the reason on every group left.
    fn within_caps(&self) -> bool {
        let Some(policy) = &self.caps else {
            return true;
        };
        let now = self.engine.ports.clock.now();
        let Err(cap) = policy.check(&self.ledger.borrow(), now) else {
            return true;
        };
        let spec = &self.spec;
        let resume = if cap.resets_at < self.window_end {
            Some((cap.resets_at, self.window_end))
        } else if spec.resume_next_window && !spec.window.is_all_day() {
            let span = spec.window.span_at_or_after(&spec.timezone, cap.resets_at);
            Some((span.open.max(cap.resets_at), span.close))
        } else {
            None
        };
        // "06:00 Asia/Kuala_Lumpur", with the day when it is not today.
        let local = |t: DateTime<Utc>| {
            let l = t.with_timezone(&policy.tz.tz());
            let hm = format!("{} {}", l.format("%H:%M"), policy.tz);
            if l.date_naive() == now.with_timezone(&policy.tz.tz()).date_naive() {
                hm
            } else {
                format!("{hm} on {}", l.format("%a %-d %b"))
            }
        };
        match resume {
            Some((resumes_at, close)) => {
                let reason = format!(
                    "{}; the rest resumes at {}",
                    cap.reason(),
                    local(resumes_at)
                );
                tracing::info!(account = %self.account, run = %self.run_id(), %reason, "run deferred by a cap");
                self.control.defer(Deferral {
                    resumes_at,
                    close,
                    reason,
                });
            }
            None => {
                let reason = format!(
                    "{}; it resets at {}, after the window closes",
                    cap.reason(),
                    local(cap.resets_at)
                );
                self.control.stop(StopReason::Cap(reason));
            }
        }
        false
    }

    /// Counts an account-level signal.
    fn signal(&self, signal: AccountSignal) {
        self.metrics().account_signal(&self.account, signal.label());
    }

    /// Records an incident on the account: its warm-up starts over.
    async fn incident(&self) {
        let now = self.engine.ports.clock.now();
        if let Err(e) = self
            .engine
            .ports
            .store
            .record_incident(&self.account, now)
            .await
        {
            tracing::warn!(account = %self.account, error = %e, "could not record the incident");
        }
    }

    /// Opens the account's breaker: the run leaves its groups as they are
    /// and the account's queue pauses for a cool-down (doubling while
    /// signals repeat, at least what WhatsApp asked), then resumes by itself.
    async fn cool_down(&self, signal: AccountSignal, asked: Option<Duration>) {
        if self.control.halted().is_some() {
            return;
        }
        let now = self.engine.ports.clock.now();
        let (d, strike) = self
            .breaker
            .borrow_mut()
            .trip(&self.engine.config.breaker, signal, now);
        let d = d.max(asked.unwrap_or_default());
        let until = now + chrono::Duration::from_std(d).unwrap_or_default();
        let tz = self.caps.as_ref().map_or(self.spec.timezone, |c| c.tz);
        let local = until.with_timezone(&tz.tz());
        let reason = format!(
            "{}: cooling down until {} {tz} ({} min, strike {strike})",
            signal.describe(),
            local.format("%H:%M"),
            d.as_secs() / 60
        );
        tracing::warn!(account = %self.account, signal = signal.label(), %reason, "account breaker opened");
        self.incident().await;
        self.engine
            .events
            .emit(
                "account_signal",
                Some(&self.account),
                Some(self.run_id()),
                serde_json::json!({
                    "signal": signal.label(),
                    "reason": reason,
                    "cooldown_until": until,
                    "strike": strike,
                }),
            )
            .await;
        self.control.halt(Halt {
            state: AccountState::CoolingDown,
            reason,
            record: true,
            until: Some(until),
        });
    }

    /// The text (or caption) `target` gets for `part`.
    fn render(&self, target: &RunTarget, part: u32) -> Option<String> {
        self.texts
            .text(&self.spec, target.position, &target.group, part)
    }

    async fn message(
        &self,
        target: &RunTarget,
        part: u32,
    ) -> Result<OutgoingMessage, GatewayError> {
        Ok(match &self.spec.parts[part as usize] {
            MessagePart::Text { .. } => {
                OutgoingMessage::Text(self.render(target, part).unwrap_or_default())
            }
            MessagePart::Media { media, .. } => {
                let upload = self.upload(media, false).await?;
                OutgoingMessage::Media {
                    upload,
                    mime: self.media_mime.get(media).cloned().unwrap_or_default(),
                    caption: self.render(target, part),
                }
            }
        })
    }

    fn record(&self, status: TargetStatus) {
        let mut counts = self.counts.borrow_mut();
        counts.pending = counts.pending.saturating_sub(1);
        counts.add(status, 1);
        drop(counts);
        let left = self.remaining.get().saturating_sub(1);
        self.remaining.set(left);
        self.metrics().targets_remaining(&self.account, left);
        let done = self.counts.borrow().total() as usize - left;
        if left == 0 || done.is_multiple_of(self.progress_every) {
            let counts = *self.counts.borrow();
            let engine = self.engine.clone();
            let (account, run) = (self.account.clone(), self.run_id());
            // Progress is informational: emitted without holding up the sends.
            actix_rt::spawn(async move {
                engine
                    .events
                    .emit(
                        "run_progress",
                        Some(&account),
                        Some(run),
                        serde_json::json!({"delivered": delivered_line(&counts), "counts": counts}),
                    )
                    .await;
            });
        }
    }

    fn skip(&self, target: &RunTarget, mut reason: String, unconfirmed: bool) {
        if unconfirmed {
            reason.push_str(crate::lifecycle::MAYBE_DELIVERED);
        }
        self.post_mark(Transition::Skipped {
            target_id: target.id,
            reason,
        });
        self.record(TargetStatus::Skipped);
    }

    /// The fence to write and send under: the account's lease, as long as
    /// it is the one this run started acting under.
    fn owned(&self) -> Result<Option<crate::lease::Fence>, crate::lease::LeaseLost> {
        let fence = self.engine.ownership(&self.account).fence()?;
        if let Some(f) = &fence {
            match self.epoch.get() {
                None => self.epoch.set(Some(f.epoch)),
                Some(e) if e != f.epoch => return Err(crate::lease::LeaseLost),
                Some(_) => {}
            }
        }
        Ok(fence)
    }

    /// Posts a mark under the account's lease; with the lease lost it is
    /// not posted: the new owner sends the group again under the same
    /// message id, and the gateway does not deliver it twice.
    fn post_mark(&self, t: Transition) {
        match self.owned() {
            Ok(fence) => self.engine.writer.post_fenced(t, fence),
            Err(_) => tracing::debug!(account = %self.account, "mark not posted: lease lost"),
        }
    }

    /// Another daemon owns the account now (or may, any moment): stop
    /// acting for it at once. The run leaves its targets as they are, like
    /// a drain, and the new owner carries it on.
    fn lose_lease(&self, why: &str) {
        // Once per run, not once per group in flight.
        if !self.control.is_draining() {
            tracing::warn!(account = %self.account, run = %self.run_id(), %why, "account lease lost: leaving the run to its new owner");
        }
        self.control.drain();
    }

    fn fail(&self, target: &RunTarget, e: &GatewayError, reason: &'static str) {
        self.metrics().send_failed(&self.account, reason);
        self.post_mark(Transition::Failed {
            target_id: target.id,
            error: e.to_string(),
        });
        self.record(TargetStatus::Failed);
    }

    /// Step 3a: one group's parts in order, each marked `sending` (durable)
    /// before it goes, then [`sent`](Self::sent) or
    /// [`after_failure`](Self::after_failure).
    async fn deliver_group(&self, target: RunTarget) {
        let n = self.spec.parts.len() as u32;
        let mut part = target.parts_sent;
        let mut tries = Tries::default();
        let mut first = true;
        // Whether the current part was handed to the gateway without an answer.
        let mut unconfirmed = target.status == TargetStatus::Sending;
        while part < n {
            // Between two parts of one group (not before a retry): keeps
            // WhatsApp's natural per-chat pace; the bucket is the real gate.
            if !first && tries.is_fresh() {
                self.control.nap(self.engine.jitter()).await;
            }
            first = false;
            match self.gate() {
                Gate::Go => {}
                Gate::Leave => return,
                Gate::Skip(reason) => return self.skip(&target, reason, unconfirmed),
            }
            let message_id = message_id(self.run_id(), &target.group, part);
            let mark = Transition::Sending {
                target_id: target.id,
                part,
                message_id: message_id.clone(),
            };
            let Ok(fence) = self.owned() else {
                return self.lose_lease("its lease ran out before a send");
            };
            if let Err(e) = self.engine.writer.commit_fenced(mark, fence).await {
                if let StoreError::Fenced(why) = &e {
                    return self.lose_lease(why);
                }
                *self.store_error.borrow_mut() = Some(e.to_string());
                self.control.wake.notify_waiters();
                return;
            }
            let sent = match self.message(&target, part).await {
                Ok(msg) => self.send_when_ready(&target.group, &msg, &message_id).await,
                Err(e) => Some(Err(e)),
            };
            let Some(answer) = sent else {
                // No token: stopped, paused or halted meanwhile; the gate decides.
                continue;
            };
            if answer.is_err() {
                unconfirmed = true;
            }
            match answer {
                Ok(latency) => {
                    unconfirmed = false;
                    self.sent(&target, part, n, latency);
                    part += 1;
                    tries = Tries::default();
                }
                Err(e) => {
                    if let After::Done = self.after_failure(&target, part, e, &mut tries).await {
                        return;
                    }
                }
            }
        }
        self.record(TargetStatus::Sent);
    }

    /// Step 3b: a part the gateway accepted, posted as sent.
    fn sent(&self, target: &RunTarget, part: u32, parts: u32, latency: Duration) {
        self.breaker.borrow_mut().succeeded();
        self.metrics().message_sent(&self.account, latency);
        self.post_mark(Transition::Sent {
            target_id: target.id,
            part,
            last: part + 1 == parts,
            at: self.engine.ports.clock.now(),
            latency_ms: latency.as_millis().min(u128::from(u32::MAX)) as u32,
        });
    }

    /// Step 3c: what a failed send means. The group's target fails
    /// (`Done`), or the part is tried again after the wait, back-off,
    /// cool-down or halt this answer calls for (`Retry`; the gate then
    /// decides whether the group goes on).
    async fn after_failure(
        &self,
        target: &RunTarget,
        part: u32,
        e: GatewayError,
        tries: &mut Tries,
    ) -> After {
        let cfg = &self.engine.config;
        match e {
            GatewayError::RateLimited { retry_after } => {
                tries.limited += 1;
                self.metrics().rate_limited(&self.account);
                self.signal(AccountSignal::RateLimit);
                let now = self.engine.ports.clock.now();
                if self.breaker.borrow_mut().rate_limited(&cfg.breaker, now) {
                    self.signal(AccountSignal::RateLimitRepeated);
                    self.cool_down(AccountSignal::RateLimitRepeated, retry_after)
                        .await;
                    return After::Retry;
                }
                self.bucket.borrow_mut().back_off(
                    tokio::time::Instant::now(),
                    cfg.rate_limit_factor,
                    cfg.rate_limit_cooldown,
                );
                if tries.limited > cfg.max_attempts * 3 {
                    self.fail(
                        target,
                        &GatewayError::RateLimited { retry_after },
                        "rate_limited",
                    );
                    return After::Done;
                }
                self.control
                    .nap(retry_after.unwrap_or(Duration::from_secs(30)))
                    .await;
            }
            e if e.is_target_failure() => {
                let reason = match e {
                    GatewayError::GroupNotFound => "group_not_found",
                    GatewayError::NotParticipant => "not_participant",
                    _ => "not_allowed",
                };
                self.fail(target, &e, reason);
                return After::Done;
            }
            GatewayError::Restricted { code, retry_after } => {
                self.metrics().send_failed(&self.account, "account");
                let signal = AccountSignal::of(&GatewayError::Restricted { code, retry_after })
                    .unwrap_or(AccountSignal::Restricted);
                self.signal(signal);
                // A 463 or 479 also comes back on a single message (a
                // stale group key, one chat's limit): like a 429 it
                // pauses the account only when it repeats; until then
                // the part is retried.
                let now = self.engine.ports.clock.now();
                if self.breaker.borrow_mut().rate_limited(&cfg.breaker, now) {
                    self.cool_down(signal, retry_after).await;
                } else {
                    tries.attempts += 1;
                    self.control
                        .nap(backoff(cfg.retry_base, tries.attempts))
                        .await;
                }
            }
            e if e.is_account_failure() => {
                self.metrics().send_failed(&self.account, "account");
                // Counted once: by the session when the gateway has one.
                if !self.gateway.reports_session_signals() {
                    if let Some(signal) = AccountSignal::of(&e) {
                        self.signal(signal);
                    }
                    // A ban is an incident (the warm-up starts over); a
                    // logout is not a warning about how the account sent.
                    if matches!(e, GatewayError::Banned { .. }) {
                        self.incident().await;
                    }
                }
                self.halt_with(&e);
            }
            GatewayError::Unreachable(e) => {
                // An outage is the account's, not the group's: wait it
                // out without spending the group's attempts.
                tries.outage += 1;
                self.metrics().send_failed(&self.account, "unreachable");
                tracing::warn!(account = %self.account, error = %e, "WhatsApp unreachable; waiting");
                self.control
                    .nap(backoff(cfg.retry_base, tries.outage).min(Duration::from_secs(60)))
                    .await;
            }
            e => {
                tries.attempts += 1;
                let label = if e == GatewayError::MediaExpired {
                    "upload"
                } else {
                    "transient"
                };
                self.metrics().send_failed(&self.account, label);
                // An expired upload is renewed, not a sign of trouble.
                if e != GatewayError::MediaExpired && self.breaker.borrow_mut().failed(&cfg.breaker)
                {
                    self.signal(AccountSignal::RepeatedFailures);
                    self.cool_down(AccountSignal::RepeatedFailures, None).await;
                    return After::Retry;
                }
                if tries.attempts >= cfg.max_attempts {
                    let gave_up = GatewayError::Transient(format!(
                        "gave up after {} attempts: {e}",
                        tries.attempts
                    ));
                    self.fail(target, &gave_up, label);
                    return After::Done;
                }
                if e == GatewayError::MediaExpired {
                    // Upload again before the next attempt; bounded by
                    // the same attempts as any other failure.
                    if let Some(m) = self.spec.parts[part as usize].media_id().cloned() {
                        self.uploads.borrow_mut().remove(&m);
                        if let Err(e) = self.upload(&m, true).await {
                            if e.is_account_failure() {
                                self.halt_with(&e);
                            }
                        }
                    }
                } else {
                    self.control
                        .nap(backoff(cfg.retry_base, tries.attempts))
                        .await;
                }
            }
        }
        After::Retry
    }

    /// Shows the account typing, takes a token once the gateway can
    /// write, then sends at once, so queued sends never leave back to back
    /// after a reconnect. `None`: the run must not send any more.
    async fn send_when_ready(
        &self,
        group: &GroupJid,
        msg: &OutgoingMessage,
        message_id: &str,
    ) -> Option<Result<Duration, GatewayError>> {
        // Typing comes before the token, so the send still leaves the
        // moment its grant is made and the 60 s bound holds on sends.
        let typing = self.engine.config.typing.duration(msg.typed_chars());
        if !typing.is_zero() && !self.control.must_not_send() {
            match self.gateway.typing(&self.account, group, typing).await {
                Ok(()) => self.control.nap(typing).await,
                Err(e) if e.is_account_failure() => return Some(Err(e)),
                // A presence is a courtesy: failing to show one is no reason not to send.
                Err(e) => {
                    tracing::debug!(account = %self.account, error = %e, "typing presence failed")
                }
            }
        }
        let granted = match self.take_token_when_ready().await? {
            Ok(at) => at,
            Err(e) => return Some(Err(e)),
        };
        // Asked again after the token's wait, right before the send: a
        // daemon paused past its lease must not send when it wakes.
        let Ok(fence) = self.owned() else {
            self.lose_lease("its lease ran out while waiting to send");
            return None;
        };
        let started = tokio::time::Instant::now();
        let answer = self
            .gateway
            .send_fenced(&self.account, group, msg, message_id, fence.as_ref())
            .await;
        // Counted in the 60 s window from now: it reached WhatsApp by now.
        self.bucket
            .borrow_mut()
            .settle(granted, tokio::time::Instant::now());
        match answer {
            Err(e @ GatewayError::Fenced { .. }) => {
                self.lose_lease(&e.to_string());
                None
            }
            answer => Some(answer.map(|_| started.elapsed())),
        }
    }
}

/// Exponential backoff: base, 2×base, 4×base … capped at ten minutes.
pub fn backoff(base: Duration, attempt: u32) -> Duration {
    base.saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks `targets` sent now, as another daemon's run would have.
    async fn sent_elsewhere(
        store: &dyn crate::ports::Store,
        targets: &[RunTarget],
        now: DateTime<Utc>,
    ) {
        let mut marks = Vec::new();
        for t in targets {
            marks.push(Transition::Sending {
                target_id: t.id,
                part: 0,
                message_id: format!("elsewhere-{}", t.id),
            });
            marks.push(Transition::Sent {
                target_id: t.id,
                part: 0,
                last: true,
                at: now,
                latency_ms: 5,
            });
        }
        store.apply_transitions(&marks).await.unwrap();
    }

    /// The cluster test's overshoot: a daemon that owned an account, lost
    /// it, and took it again must not trust its own log, which never saw
    /// what the owner in between sent.
    #[actix_rt::test]
    async fn the_limiter_is_read_again_from_the_store_under_a_new_lease_epoch() {
        use crate::lease::LeaseTable;
        use crate::ports::Store;
        let world = crate::sim::SimWorld::start(
            crate::simulator::SimConfig::instant(),
            crate::engine::EngineConfig::default(),
            Utc::now(),
        );
        let table = Arc::new(LeaseTable::new("n1"));
        world.engine.set_leases(table.clone());
        let (account, groups) = world
            .add_account("acct", 10, AccountLimits::default())
            .await;
        let spec = crate::sim::reminder(
            &account,
            "UTC",
            WindowHours::parse(0, 24).unwrap(),
            vec![MessagePart::text("x").unwrap()],
            groups.clone(),
        );
        let store: &dyn Store = &*world.store;
        let now = world.clock.now();
        let r = store.create_reminder(&spec, now).await.unwrap();
        let run = store
            .create_run(r.id, &account, now, RunStatus::Running, None, now)
            .await
            .unwrap()
            .run;
        store.create_targets(run.id, &groups).await.unwrap();
        let targets = store.list_targets(run.id, None, None, 0).await.unwrap();
        let bucket = RefCell::new(TokenBucket::new(60, tokio::time::Instant::now()));
        let hold = |epoch| {
            let now = tokio::time::Instant::now();
            table.hold(
                &account,
                epoch,
                now,
                Duration::from_secs(60),
                Duration::ZERO,
            );
        };
        let rebuild = || rebuild_bucket(&world.engine, &account, &bucket, 60);
        let count = || bucket.borrow().in_window(tokio::time::Instant::now());

        sent_elsewhere(store, &targets[..5], now).await;
        hold(1);
        rebuild().await.unwrap();
        assert_eq!(count(), 5);
        assert_eq!(bucket.borrow().rebuilt_under(), Some(1));

        // Under the same epoch nobody else can have sent: the log is kept.
        sent_elsewhere(store, &targets[5..8], now).await;
        rebuild().await.unwrap();
        assert_eq!(count(), 5);

        // Lost and taken again: the three sends of the owner in between count.
        table.drop_lease(&account);
        hold(3);
        rebuild().await.unwrap();
        assert_eq!(count(), 8);
        assert_eq!(bucket.borrow().rebuilt_under(), Some(3));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Duration::from_secs(2);
        assert_eq!(backoff(b, 1), Duration::from_secs(2));
        assert_eq!(backoff(b, 3), Duration::from_secs(8));
        assert_eq!(backoff(b, 30), Duration::from_secs(600));
    }
}
