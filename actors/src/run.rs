//! One run's delivery loop, executed inside its AccountActor's context.
//!
//! Once per run: load the run, its reminder and its targets; pre-create the
//! targets as pending; upload each unique media once (reusing cached
//! handles); work out the window end. Then up to `group_concurrency` groups
//! in flight, each group's parts strictly in order, one token per message,
//! a durable `sending` mark with a deterministic message id before every
//! send.

use crate::bucket::TokenBucket;
use crate::domain::*;
use crate::engine::{Engine, ParkRun, RunControl};
use crate::messages::{ArmWindow, DisarmWindow, RunDue};
use crate::outcome::{delivered_line, finish, message_id, StopReason};
use crate::ports::{Gateway, GatewayError, OutgoingMessage, RunUpdate, StoreError};
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use rand::Rng;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// How a run's execution ended, for the actor.
#[derive(Debug)]
pub enum RunEnd {
    /// Finished, parked, or nothing to do.
    Done,
    /// Drained for shutdown; the run stays `running` and resumes on start.
    Drained,
    /// The account cannot send; the actor stops its queue.
    Halted { state: AccountState, reason: String },
    /// The store failed; the run stays resumable.
    Error(String),
}

impl From<StoreError> for RunEnd {
    fn from(e: StoreError) -> Self {
        RunEnd::Error(e.to_string())
    }
}

/// Everything a group's delivery needs, shared by the groups in flight.
struct RunCtx {
    engine: Arc<Engine>,
    account: AccountId,
    run_id: RunId,
    gateway: Arc<dyn Gateway>,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
    parts: Vec<MessagePart>,
    media_mime: HashMap<MediaId, String>,
    window_end: DateTime<Utc>,
    park_on_close: bool,
    /// Set when the account itself failed (logged out, banned).
    halted: RefCell<Option<(AccountState, String)>>,
    /// Set when the store failed mid-run.
    store_error: RefCell<Option<String>>,
    remaining: Cell<usize>,
    progress_every: usize,
    counts: RefCell<TargetCounts>,
}

/// What a group's delivery stopped on.
enum Gate {
    Go,
    /// Skip the rest of this group with this reason.
    Skip(String),
    /// Leave the group as it is (drain, park, store error): it resumes later.
    Leave,
}

pub async fn execute(
    engine: Arc<Engine>,
    account: AccountId,
    run_id: RunId,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
) -> RunEnd {
    match execute_inner(engine, account, run_id, control, bucket, uploads).await {
        Ok(end) => end,
        Err(end) => end,
    }
}

async fn execute_inner(
    engine: Arc<Engine>,
    account_id: AccountId,
    run_id: RunId,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    uploads: Rc<RefCell<HashMap<MediaId, UploadHandle>>>,
) -> Result<RunEnd, RunEnd> {
    let store = engine.ports.store.clone();
    let clock = engine.ports.clock.clone();
    let Some(run) = store.get_run(run_id).await? else {
        return Ok(RunEnd::Error(format!("run {run_id} not found")));
    };
    if run.status.is_final() {
        return Ok(RunEnd::Done);
    }
    let Some(account) = store.get_account(&account_id).await? else {
        return Ok(RunEnd::Error(format!("account {account_id} not found")));
    };
    if account.state != AccountState::Connected {
        return Ok(RunEnd::Halted {
            state: account.state,
            reason: account
                .state_reason
                .clone()
                .unwrap_or_else(|| format!("account is {}", account.state)),
        });
    }
    // A run that cannot start ends failed with the reason, nothing sent.
    let cannot_start = |summary: String| {
        finish_run(
            &engine,
            &account_id,
            &run,
            RunStatus::Failed,
            Some(summary),
            TargetCounts::default(),
        )
    };
    let Some(gateway) = engine.ports.gateways.gateway(account.kind) else {
        cannot_start(format!(
            "No {} gateway in this build of Herald.",
            account.kind
        ))
        .await?;
        return Ok(RunEnd::Done);
    };
    let Some(reminder) = store.get_reminder(run.reminder_id).await? else {
        cannot_start("The reminder was deleted before the run started.".to_owned()).await?;
        return Ok(RunEnd::Done);
    };
    let spec = reminder.spec;

    // Only one account mid-run per permit; waiting here keeps the run queued.
    let _permit = match &engine.fire_permits {
        Some(p) => Some(
            p.clone()
                .acquire_owned()
                .await
                .expect("permits never close"),
        ),
        None => None,
    };

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
    bucket
        .borrow_mut()
        .set_per_minute(per_minute, tokio::time::Instant::now());

    let now = clock.now();
    let span = spec.window.span_at_or_after(&spec.timezone, now);
    let window_end = if span.contains(now) {
        span.close
    } else {
        last_close(&spec, now)
    };

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

    let parts_per_group = spec.parts.len() as u32;
    let forecast = crate::forecast::forecast(
        open.len() as u32,
        parts_per_group,
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
                status: Some(if control.is_paused() {
                    RunStatus::Paused
                } else {
                    RunStatus::Running
                }),
                started_at: run.started_at.is_none().then_some(now),
                window_end_at: Some(window_end),
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

    let total = counts.total() as usize;
    let ctx = Rc::new(RunCtx {
        engine: engine.clone(),
        account: account_id.clone(),
        run_id,
        gateway,
        control: control.clone(),
        bucket,
        uploads,
        parts: spec.parts.clone(),
        media_mime,
        window_end,
        park_on_close: spec.resume_next_window,
        halted: RefCell::new(None),
        store_error: RefCell::new(None),
        remaining: Cell::new(open.len()),
        progress_every: (total / 20).max(1),
        counts: RefCell::new(counts),
    });
    engine
        .ports
        .metrics
        .targets_remaining(&account_id, open.len());

    if clock.now() >= window_end {
        control.stop(StopReason::WindowClosed(window_end));
    } else if let Err(e) = ctx.prepare_uploads().await {
        if e.is_account_failure() {
            ctx.halt_with(&e);
        } else {
            control.stop(StopReason::Account(format!("Media upload failed: {e}")));
        }
    }

    futures_util::stream::iter(open)
        .for_each_concurrent(concurrency as usize, |t| {
            let ctx = ctx.clone();
            async move { ctx.deliver_group(t).await }
        })
        .await;

    engine.writer.flush().await?;
    if let Some(e) = ctx.store_error.borrow().clone() {
        return Ok(RunEnd::Error(e));
    }
    if control.is_draining() {
        return Ok(RunEnd::Drained);
    }
    let run_now = store
        .get_run(run_id)
        .await?
        .ok_or_else(|| RunEnd::Error("run vanished".into()))?;
    let stop = control.stop_reason();
    if let (Some(StopReason::WindowClosed(_)), true) = (&stop, spec.resume_next_window) {
        if run_now.counts.pending + run_now.counts.sending > 0 {
            return park(&engine, &account_id, &run_now, &spec).await;
        }
    }
    let (status, summary) = finish(&run_now.counts, stop.as_ref(), &spec.timezone);
    finish_run(
        &engine,
        &account_id,
        &run_now,
        status,
        summary,
        run_now.counts,
    )
    .await?;
    let halted = ctx.halted.borrow().clone();
    Ok(match halted {
        Some((state, reason)) => RunEnd::Halted { state, reason },
        None => RunEnd::Done,
    })
}

/// The most recent window close at or before `now` (a run that starts
/// after its window closed reports that close).
fn last_close(spec: &NewReminder, now: DateTime<Utc>) -> DateTime<Utc> {
    let mut t = now - chrono::Duration::days(2);
    let mut last = now;
    loop {
        let span = spec.window.span_at_or_after(&spec.timezone, t);
        if span.close > now {
            return last;
        }
        last = span.close;
        t = span.close;
    }
}

async fn finish_run(
    engine: &Engine,
    account: &AccountId,
    run: &Run,
    status: RunStatus,
    summary: Option<String>,
    counts: TargetCounts,
) -> Result<(), StoreError> {
    let now = engine.ports.clock.now();
    engine
        .ports
        .store
        .update_run(
            run.id,
            &RunUpdate {
                status: Some(status),
                finished_at: Some(now),
                error_summary: summary.clone(),
                ..Default::default()
            },
        )
        .await?;
    if let Some(links) = engine.window.get() {
        links.disarm.do_send(DisarmWindow { run_id: run.id });
    }
    engine.ports.metrics.targets_remaining(account, 0);
    engine
        .events
        .emit(
            "run_finished",
            Some(account),
            Some(run.id),
            serde_json::json!({
                "status": status,
                "delivered": delivered_line(&counts),
                "counts": counts,
                "summary": summary,
            }),
        )
        .await;
    Ok(())
}

/// Parks the remainder until the next window opening (resume_next_window).
async fn park(
    engine: &Engine,
    account: &AccountId,
    run: &Run,
    spec: &NewReminder,
) -> Result<RunEnd, RunEnd> {
    let now = engine.ports.clock.now();
    let next = spec.window.next_open_after(&spec.timezone, now);
    engine
        .ports
        .store
        .update_run(
            run.id,
            &RunUpdate {
                status: Some(RunStatus::Paused),
                ..Default::default()
            },
        )
        .await?;
    if let Some(links) = engine.window.get() {
        links.disarm.do_send(DisarmWindow { run_id: run.id });
        links.park.do_send(ParkRun {
            due: RunDue {
                run_id: run.id,
                account_id: account.clone(),
            },
            at: next.open,
        });
    }
    engine
        .events
        .emit(
            "run_parked",
            Some(account),
            Some(run.id),
            serde_json::json!({
                "delivered": delivered_line(&run.counts),
                "resumes_at": next.open,
            }),
        )
        .await;
    Ok(RunEnd::Done)
}

impl RunCtx {
    fn metrics(&self) -> &dyn crate::ports::Metrics {
        &*self.engine.ports.metrics
    }

    fn halt_with(&self, e: &GatewayError) {
        let (state, reason) = match e {
            GatewayError::Banned { until: Some(t) } => (
                AccountState::Banned,
                format!("Account temporarily banned by WhatsApp until {t}"),
            ),
            GatewayError::Banned { until: None } => (
                AccountState::Banned,
                "Account temporarily banned by WhatsApp".into(),
            ),
            _ => (
                AccountState::LoggedOut,
                "Account logged out of WhatsApp".into(),
            ),
        };
        self.control.stop(StopReason::Account(reason.clone()));
        *self.halted.borrow_mut() = Some((state, reason));
    }

    /// Uploads each unique media once, or reuses a still-valid handle from
    /// this actor's cache or the store.
    async fn prepare_uploads(&self) -> Result<(), GatewayError> {
        let ids: Vec<MediaId> = self.media_mime.keys().cloned().collect();
        for id in ids {
            self.upload(&id, false).await?;
        }
        Ok(())
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
                    if self.control.stop_reason().is_some() || self.control.is_draining() {
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

    /// Waits while paused; says whether the group may go on.
    async fn gate(&self) -> Gate {
        loop {
            if self.store_error.borrow().is_some() || self.control.is_draining() {
                return Gate::Leave;
            }
            if self.engine.ports.clock.now() >= self.window_end {
                self.control.stop(StopReason::WindowClosed(self.window_end));
            }
            if let Some(reason) = self.control.stop_reason() {
                if matches!(reason, StopReason::WindowClosed(_)) && self.park_on_close {
                    return Gate::Leave;
                }
                return Gate::Skip(reason.target_error());
            }
            if !self.control.is_paused() {
                return Gate::Go;
            }
            // Sleep until a control change, re-checking the window now and then.
            self.control.nap(Duration::from_secs(30)).await;
        }
    }

    /// Takes one token, waiting as the bucket says; `false` if the run
    /// stopped, paused or drained meanwhile.
    async fn take_token(&self) -> bool {
        loop {
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
                Err(w) => {
                    self.control.nap(w).await;
                    if self.control.stop_reason().is_some()
                        || self.control.is_paused()
                        || self.control.is_draining()
                    {
                        return false;
                    }
                    if self.engine.ports.clock.now() >= self.window_end {
                        return false;
                    }
                }
            }
        }
    }

    async fn message(&self, part: u32) -> Result<OutgoingMessage, GatewayError> {
        Ok(match &self.parts[part as usize] {
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
            let (account, run) = (self.account.clone(), self.run_id);
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

    fn skip(&self, target: &RunTarget, reason: String) {
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
        let n = self.parts.len() as u32;
        let mut part = target.parts_sent;
        let mut attempts = 0u32;
        let mut limited = 0u32;
        let mut first = true;
        while part < n {
            // Between two parts of one group (not before a retry): keeps
            // WhatsApp's natural per-chat pace; the bucket is the real gate.
            if !first && attempts == 0 && limited == 0 {
                let (lo, hi) = (self.engine.config.jitter_min, self.engine.config.jitter_max);
                let jitter = if hi > lo {
                    rand::rng().random_range(lo..=hi)
                } else {
                    lo
                };
                self.control.nap(jitter).await;
            }
            first = false;
            match self.gate().await {
                Gate::Go => {}
                Gate::Leave => return,
                Gate::Skip(reason) => return self.skip(&target, reason),
            }
            let message_id = message_id(self.run_id, &target.group, part);
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
            let msg = match self.message(part).await {
                Ok(m) => m,
                Err(e) if e.is_account_failure() => {
                    self.halt_with(&e);
                    continue;
                }
                Err(e) => {
                    attempts += 1;
                    if attempts >= self.engine.config.max_attempts {
                        return self.fail(&target, &e, "upload");
                    }
                    self.control
                        .nap(backoff(self.engine.config.retry_base, attempts))
                        .await;
                    continue;
                }
            };
            if !self.take_token().await {
                // Stopped, paused or drained while waiting: the gate decides.
                continue;
            }
            let started = tokio::time::Instant::now();
            match self
                .gateway
                .send(&self.account, &target.group, &msg, &message_id)
                .await
            {
                Ok(_) => {
                    let latency = started.elapsed();
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
                }
                Err(GatewayError::RateLimited { retry_after }) => {
                    limited += 1;
                    self.metrics().rate_limited(&self.account);
                    let cfg = &self.engine.config;
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
                Err(GatewayError::MediaExpired) => {
                    attempts += 1;
                    if let Some(m) = self.parts[part as usize].media_id().cloned() {
                        self.uploads.borrow_mut().remove(&m);
                        if let Err(e) = self.upload(&m, true).await {
                            if attempts >= self.engine.config.max_attempts {
                                return self.fail(&target, &e, "upload");
                            }
                        }
                    }
                }
                Err(e) => {
                    attempts += 1;
                    self.metrics().send_failed(&self.account, "transient");
                    if attempts >= self.engine.config.max_attempts {
                        let gave_up = GatewayError::Transient(format!(
                            "gave up after {attempts} attempts: {e}"
                        ));
                        return self.fail(&target, &gave_up, "transient");
                    }
                    self.control
                        .nap(backoff(self.engine.config.retry_base, attempts))
                        .await;
                }
            }
        }
        self.record(TargetStatus::Sent);
    }
}

/// Exponential backoff: base, 2×base, 4×base … capped at ten minutes.
fn backoff(base: Duration, attempt: u32) -> Duration {
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
