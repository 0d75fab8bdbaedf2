//! One run's delivery, executed inside its AccountActor's context, in four
//! named steps the actor (and the simulation) drive in turn:
//!
//! 1. [`begin`]: load the run and its account, take a fire permit, move the
//!    run to `running` (compare-and-set: a run paused, stopped or finished
//!    meanwhile is not started), pre-create its targets, rebuild the
//!    account's bucket, fix the window end, forecast, arm the window timer;
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
use crate::domain::*;
use crate::engine::{Engine, Halt, ParkRun, RunControl};
use crate::lifecycle::RunEvent;
use crate::messages::{ArmWindow, DisarmWindow, RunDue};
use crate::outcome::{delivered_line, finish, message_id, StopReason};
use crate::ports::{Gateway, GatewayError, OutgoingMessage, RunUpdate, StoreError};
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
        RunEnd::Requeue {
            halt: None,
            why: e.to_string(),
        }
    }
}

/// Everything a group's delivery needs, shared by the groups in flight.
pub struct RunCtx {
    engine: Arc<Engine>,
    account: AccountId,
    run: Run,
    gateway: Arc<dyn Gateway>,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
    spec: NewReminder,
    media_mime: HashMap<MediaId, String>,
    window_end: DateTime<Utc>,
    concurrency: usize,
    open: RefCell<Vec<RunTarget>>,
    /// Set when a mark could not be stored.
    store_error: RefCell<Option<String>>,
    remaining: Cell<usize>,
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
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
) -> RunEnd {
    let ctx = match begin(engine, account, run_id, control, bucket, uploads).await {
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
) -> Result<(), StoreError> {
    match engine
        .ports
        .store
        .update_run(
            run.id,
            &RunUpdate {
                window_end_at: Some(close),
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
            }),
        )
        .await;
    Ok(())
}

/// Step 1: everything before the first send. `Err` ends the execution.
pub async fn begin(
    engine: Arc<Engine>,
    account_id: AccountId,
    run_id: RunId,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
) -> Result<Rc<RunCtx>, RunEnd> {
    let store = engine.ports.store.clone();
    let clock = engine.ports.clock.clone();
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
    let Some(account) = store.get_account(&account_id).await? else {
        cannot_start(
            &engine,
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
        requeue(&engine, &run).await?;
        return Err(RunEnd::Requeue {
            halt: Some(Halt {
                state: account.state,
                reason,
                record: false,
                until: None,
            }),
            why: "the account cannot send".into(),
        });
    }
    let Some(gateway) = engine.ports.gateways.gateway(account.kind) else {
        let why = format!("No {} gateway in this build of Herald.", account.kind);
        cannot_start(&engine, &run, &why).await?;
        return Err(RunEnd::Done);
    };
    let Some(reminder) = store.get_reminder(run.reminder_id).await? else {
        cannot_start(
            &engine,
            &run,
            "The reminder was deleted before the run started.",
        )
        .await?;
        return Err(RunEnd::Done);
    };
    let spec = reminder.spec;

    // Only `fire_concurrency` accounts mid-run; waiting here keeps the run
    // queued. The permit is the run's until its execution ends.
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

    let now = clock.now();
    let window_end = run.window_end_at.unwrap_or_else(|| {
        fixed_window_end(&spec, run.scheduled_for, engine.config.all_day_horizon)
    });
    match store
        .update_run(
            run_id,
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
    if let Some(opens) = window_opening(&spec, window_end).filter(|o| now < *o) {
        park_until(&engine, &run, opens, window_end).await?;
        return Err(RunEnd::Done);
    }

    store.create_targets(run_id, &spec.targets).await?;
    let targets = store.list_targets(run_id, None, None, u32::MAX).await?;

    let limits = &account.limits;
    let per_minute = limits
        .max_per_minute
        .unwrap_or(engine.config.max_per_minute)
        .max(1);
    let concurrency = limits
        .group_concurrency
        .unwrap_or(engine.config.group_concurrency)
        .max(1);
    rebuild_bucket(&engine, &account_id, &bucket, per_minute).await?;

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
    let open: Vec<RunTarget> = targets
        .into_iter()
        .filter(|t| !t.status.is_final())
        .collect();

    let forecast = crate::forecast::forecast(
        open.len() as u32,
        spec.parts.len() as u32,
        per_minute,
        now,
        window_end,
        &spec.timezone,
    )
    .text;
    store
        .update_run(
            run_id,
            &RunUpdate {
                forecast: Some(forecast.clone()),
                ..Default::default()
            },
        )
        .await?;
    if let Some(links) = engine.window.get() {
        links.arm.do_send(ArmWindow {
            run_id,
            account_id: account_id.clone(),
            close_at: window_end,
        });
    }
    engine
        .events
        .emit(
            "run_started",
            Some(&account_id),
            Some(run_id),
            serde_json::json!({
                "reminder_id": run.reminder_id,
                "total": counts.total(),
                "remaining": open.len(),
                "window_end_at": window_end,
                "forecast": forecast,
            }),
        )
        .await;

    let mut media_mime = HashMap::new();
    for part in &spec.parts {
        if let Some(m) = part.media_id() {
            if !media_mime.contains_key(m) {
                let info = store.get_media(m).await?;
                media_mime.insert(
                    m.clone(),
                    info.map(|i| i.mime).unwrap_or_else(|| "image/jpeg".into()),
                );
            }
        }
    }
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
        uploads,
        spec,
        media_mime,
        window_end,
        concurrency: concurrency as usize,
        remaining: Cell::new(open.len()),
        open: RefCell::new(open),
        store_error: RefCell::new(None),
        progress_every: (total / 20).max(1),
        counts: RefCell::new(counts),
        _permit: permit,
    }))
}

/// A fresh actor's bucket starts from the store: the account's sends of
/// the last minute are in its grant log, at the account's own limit.
async fn rebuild_bucket(
    engine: &Engine,
    account: &AccountId,
    bucket: &RefCell<TokenBucket>,
    per_minute: u32,
) -> Result<(), StoreError> {
    let now = tokio::time::Instant::now();
    if bucket.borrow().is_rebuilt() {
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
    bucket.borrow_mut().rebuild(per_minute, now, grants);
    Ok(())
}

/// Moves a run that was executing back to `queued`; one already queued
/// stays so.
async fn requeue(engine: &Engine, run: &Run) -> Result<(), StoreError> {
    if run.status == RunStatus::Queued {
        return Ok(());
    }
    match engine
        .ports
        .store
        .update_run(run.id, &RunEvent::Requeue.update())
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
        .ports
        .store
        .update_run(
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
                requeue(engine, &run_now).await?;
                return Ok(RunEnd::Requeue {
                    halt: Some(halt),
                    why: "the account cannot send".into(),
                });
            }
            if self.control.is_paused() {
                return Ok(RunEnd::Left);
            }
            if let Some(StopReason::WindowClosed(_)) = stop {
                if self.spec.resume_next_window && !self.spec.window.is_all_day() {
                    return self.park(&run_now).await;
                }
            }
        }
        let (status, summary) = finish(&run_now.counts, stop.as_ref(), &self.spec.timezone);
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
        park_until(&self.engine, run, next.open, next.close).await?;
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

    /// Takes one token, waiting as the bucket says; `false` if the run
    /// must not send any more (stopped, paused, halted, window closed).
    async fn take_token(&self) -> bool {
        loop {
            // Checked before every grant, not only after a wait: a mark or
            // an upload may have taken us past the window or a stop.
            if self.control.must_not_send() || self.engine.ports.clock.now() >= self.window_end {
                return false;
            }
            let wait = self
                .bucket
                .borrow_mut()
                .try_take(tokio::time::Instant::now());
            match wait {
                Ok(()) => {
                    let tokens = self
                        .bucket
                        .borrow_mut()
                        .available(tokio::time::Instant::now());
                    let pm = self.bucket.borrow().per_minute();
                    self.metrics().tokens_available(&self.account, tokens, pm);
                    return true;
                }
                Err(w) => self.control.nap(w).await,
            }
        }
    }

    async fn message(&self, part: u32) -> Result<OutgoingMessage, GatewayError> {
        Ok(match &self.spec.parts[part as usize] {
            MessagePart::Text { text } => OutgoingMessage::Text(text.clone()),
            MessagePart::Media { media, caption } => {
                let upload = self.upload(media, false).await?;
                OutgoingMessage::Media {
                    upload,
                    mime: self.media_mime.get(media).cloned().unwrap_or_default(),
                    caption: caption.clone(),
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
        self.engine.writer.post(Transition::Skipped {
            target_id: target.id,
            reason,
        });
        self.record(TargetStatus::Skipped);
    }

    fn fail(&self, target: &RunTarget, e: &GatewayError, reason: &'static str) {
        self.metrics().send_failed(&self.account, reason);
        self.engine.writer.post(Transition::Failed {
            target_id: target.id,
            error: e.to_string(),
        });
        self.record(TargetStatus::Failed);
    }

    async fn deliver_group(&self, target: RunTarget) {
        let n = self.spec.parts.len() as u32;
        let cfg = &self.engine.config;
        let mut part = target.parts_sent;
        let mut attempts = 0u32;
        let mut limited = 0u32;
        let mut outage = 0u32;
        let mut first = true;
        // Whether the current part was handed to the gateway without an answer.
        let mut unconfirmed = target.status == TargetStatus::Sending;
        while part < n {
            // Between two parts of one group (not before a retry): keeps
            // WhatsApp's natural per-chat pace; the bucket is the real gate.
            if !first && attempts == 0 && limited == 0 && outage == 0 {
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
            if let Err(e) = self.engine.writer.commit(mark).await {
                *self.store_error.borrow_mut() = Some(e.to_string());
                self.control.wake.notify_waiters();
                return;
            }
            let sent = match self.message(part).await {
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
                    self.metrics().message_sent(&self.account, latency);
                    self.engine.writer.post(Transition::Sent {
                        target_id: target.id,
                        part,
                        last: part + 1 == n,
                        at: self.engine.ports.clock.now(),
                        latency_ms: latency.as_millis().min(u128::from(u32::MAX)) as u32,
                    });
                    part += 1;
                    attempts = 0;
                    limited = 0;
                    outage = 0;
                }
                Err(GatewayError::RateLimited { retry_after }) => {
                    limited += 1;
                    self.metrics().rate_limited(&self.account);
                    self.bucket.borrow_mut().back_off(
                        tokio::time::Instant::now(),
                        cfg.rate_limit_factor,
                        cfg.rate_limit_cooldown,
                    );
                    if limited > cfg.max_attempts * 3 {
                        return self.fail(
                            &target,
                            &GatewayError::RateLimited { retry_after },
                            "rate_limited",
                        );
                    }
                    self.control
                        .nap(retry_after.unwrap_or(Duration::from_secs(30)))
                        .await;
                }
                Err(e) if e.is_target_failure() => {
                    let reason = match e {
                        GatewayError::GroupNotFound => "group_not_found",
                        GatewayError::NotParticipant => "not_participant",
                        _ => "not_allowed",
                    };
                    return self.fail(&target, &e, reason);
                }
                Err(e) if e.is_account_failure() => {
                    self.metrics().send_failed(&self.account, "account");
                    self.halt_with(&e);
                }
                Err(GatewayError::Unreachable(e)) => {
                    // An outage is the account's, not the group's: wait it
                    // out without spending the group's attempts.
                    outage += 1;
                    self.metrics().send_failed(&self.account, "unreachable");
                    tracing::warn!(account = %self.account, error = %e, "WhatsApp unreachable; waiting");
                    self.control
                        .nap(backoff(cfg.retry_base, outage).min(Duration::from_secs(60)))
                        .await;
                }
                Err(e) => {
                    attempts += 1;
                    let label = if e == GatewayError::MediaExpired {
                        "upload"
                    } else {
                        "transient"
                    };
                    self.metrics().send_failed(&self.account, label);
                    if attempts >= cfg.max_attempts {
                        let gave_up = GatewayError::Transient(format!(
                            "gave up after {attempts} attempts: {e}"
                        ));
                        return self.fail(&target, &gave_up, label);
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
                        self.control.nap(backoff(cfg.retry_base, attempts)).await;
                    }
                }
            }
        }
        self.record(TargetStatus::Sent);
    }

    /// Waits until the gateway can write, then takes a token and sends at
    /// once, so queued sends never leave back to back after a reconnect.
    /// `None`: the run must not send any more.
    async fn send_when_ready(
        &self,
        group: &GroupJid,
        msg: &OutgoingMessage,
        message_id: &str,
    ) -> Option<Result<Duration, GatewayError>> {
        if let Err(e) = self.gateway.ready(&self.account).await {
            return Some(Err(e));
        }
        if !self.take_token().await {
            return None;
        }
        let started = tokio::time::Instant::now();
        Some(
            self.gateway
                .send(&self.account, group, msg, message_id)
                .await
                .map(|_| started.elapsed()),
        )
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

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Duration::from_secs(2);
        assert_eq!(backoff(b, 1), Duration::from_secs(2));
        assert_eq!(backoff(b, 3), Duration::from_secs(8));
        assert_eq!(backoff(b, 30), Duration::from_secs(600));
    }
}
