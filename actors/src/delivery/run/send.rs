//! Step 3: every open target, `group_concurrency` at a time; each group's
//! parts in order, one token per message taken when the gateway can write,
//! a durable `sending` mark with a deterministic message id before each send.

use super::ctx::{After, Gate, RunCtx, Tries};
use crate::delivery::engine::Deferral;
use crate::delivery::outcome::{message_id, StopReason};
use crate::domain::*;
use crate::ports::{GatewayError, OutgoingMessage, StoreError};
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use std::rc::Rc;
use std::time::Duration;

impl RunCtx {
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

    /// Step 3a: one group's parts in order, each marked `sending` (durable)
    /// before it goes, then [`sent`](Self::sent) or
    /// [`after_failure`](Self::after_failure).
    pub(super) async fn deliver_group(&self, target: RunTarget) {
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

    /// Says whether a group may go on.
    pub(super) fn gate(&self) -> Gate {
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
    pub(super) async fn take_token_when_ready(
        &self,
    ) -> Option<Result<tokio::time::Instant, GatewayError>> {
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

    pub(super) fn must_not_send(&self) -> bool {
        self.control.must_not_send() || self.engine.ports.clock.now() >= self.window_end
    }

    /// Whether one more message keeps the account within its caps; if not,
    /// the run is deferred to when the cap resets (inside its window, or
    /// the next one with resume_next_window) or, if it cannot be, stopped
    /// with the reason on every group left.
    pub(super) fn within_caps(&self) -> bool {
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

    /// Step 3b: a part the gateway accepted, posted as sent.
    pub(super) fn sent(&self, target: &RunTarget, part: u32, parts: u32, latency: Duration) {
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

    /// Shows the account typing, takes a token once the gateway can
    /// write, then sends at once, so queued sends never leave back to back
    /// after a reconnect. `None`: the run must not send any more.
    pub(super) async fn send_when_ready(
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
            Err(e @ (GatewayError::Fenced { .. } | GatewayError::LeaseEnded(_))) => {
                self.lose_lease(&e.to_string());
                None
            }
            answer => Some(answer.map(|_| started.elapsed())),
        }
    }
}
