//! What a failed send means: the group's target fails, or the part is
//! tried again after the wait, back-off, cool-down or halt the answer
//! calls for.

use super::ctx::{After, RunCtx, Tries};
use crate::delivery::engine::Halt;
use crate::delivery::signals::AccountSignal;
use crate::domain::*;
use crate::ports::GatewayError;
use std::time::Duration;

impl RunCtx {
    /// Step 3c: what a failed send means. The group's target fails
    /// (`Done`), or the part is tried again after the wait, back-off,
    /// cool-down or halt this answer calls for (`Retry`; the gate then
    /// decides whether the group goes on).
    pub(super) async fn after_failure(
        &self,
        target: &RunTarget,
        part: u32,
        e: GatewayError,
        tries: &mut Tries,
    ) -> After {
        match e {
            GatewayError::RateLimited { retry_after } => {
                self.on_rate_limited(target, retry_after, tries).await
            }
            e if e.is_target_failure() => {
                let reason = match e {
                    GatewayError::GroupNotFound => "group_not_found",
                    GatewayError::NotParticipant => "not_participant",
                    GatewayError::Unsupported(_) => "unsupported",
                    _ => "not_allowed",
                };
                self.fail(target, &e, reason);
                After::Done
            }
            GatewayError::Restricted {
                code: 463,
                retry_after,
            } => {
                if self.time_locked().await {
                    return After::Retry;
                }
                self.on_restricted(463, retry_after, tries).await
            }
            GatewayError::Restricted { code, retry_after } => {
                self.on_restricted(code, retry_after, tries).await
            }
            e if e.is_account_failure() => self.on_account_failure(&e).await,
            GatewayError::Unreachable(e) => {
                // An outage is the account's, not the group's: wait it
                // out without spending the group's attempts.
                tries.outage += 1;
                self.metrics().send_failed(&self.account, "unreachable");
                tracing::warn!(account = %self.account, error = %e, "WhatsApp unreachable; waiting");
                let cfg = &self.engine.config;
                self.control
                    .nap(backoff(cfg.retry_base, tries.outage).min(Duration::from_secs(60)))
                    .await;
                After::Retry
            }
            e => self.on_transient(target, part, e, tries).await,
        }
    }

    /// A 429: back the bucket off and wait what WhatsApp asked; repeated,
    /// cool the account down; far too often for one group, fail it.
    async fn on_rate_limited(
        &self,
        target: &RunTarget,
        retry_after: Option<Duration>,
        tries: &mut Tries,
    ) -> After {
        let cfg = &self.engine.config;
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
        After::Retry
    }

    /// A 463 or 479 also comes back on a single message (a stale group key,
    /// one chat's limit): like a 429 it pauses the account only when it
    /// repeats; until then the part is retried.
    async fn on_restricted(
        &self,
        code: u16,
        retry_after: Option<Duration>,
        tries: &mut Tries,
    ) -> After {
        let cfg = &self.engine.config;
        self.metrics().send_failed(&self.account, "account");
        let signal = AccountSignal::of(&GatewayError::Restricted { code, retry_after })
            .unwrap_or(AccountSignal::Restricted);
        self.signal(signal);
        let now = self.engine.ports.clock.now();
        if self.breaker.borrow_mut().rate_limited(&cfg.breaker, now) {
            self.cool_down(signal, retry_after).await;
        } else {
            tries.attempts += 1;
            self.control
                .nap(backoff(cfg.retry_base, tries.attempts))
                .await;
        }
        After::Retry
    }

    /// A 463: WhatsApp applying the account's reach-out time-lock. Asks
    /// WhatsApp at once until when; a lock that holds with an end pauses
    /// the account until exactly then (halted before anything else is
    /// awaited, so no other group's send starts meanwhile), and its runs
    /// resume by themselves. Whether it paused: a lock that does not hold,
    /// has no end, or an answer that cannot be read is left to the breaker,
    /// as any restriction (only repeats pause, for a cool-down).
    async fn time_locked(&self) -> bool {
        if self.control.halted().is_some() {
            // Another group's 463 already paused the account.
            return true;
        }
        let answer = self.gateway.fetch_timelock(&self.account).await;
        let now = self.engine.ports.clock.now();
        let until = match &answer {
            Ok(lock) if lock.holds_at(now) => lock.until,
            _ => None,
        };
        let paused = match until {
            Some(until) if self.control.halted().is_none() => {
                self.metrics().send_failed(&self.account, "account");
                self.signal(AccountSignal::ReachOutLocked);
                let tz = self.caps.as_ref().map_or(self.spec.timezone, |c| c.tz);
                let reason = format!(
                    "{} (463): paused until then, resumes by itself",
                    Standing::describe_lock(Some(until), tz.tz())
                );
                tracing::warn!(account = %self.account, %until, "account time-locked by WhatsApp; paused until the lock ends");
                let extra = serde_json::json!({ "timelock_until": until });
                self.pause_account(AccountSignal::ReachOutLocked, reason, until, extra)
                    .await;
                true
            }
            Some(_) => true,
            None => false,
        };
        crate::delivery::standing::keep(&self.engine, &self.account, answer, None).await;
        paused
    }

    /// Logged out or banned: the run halts with the account's state.
    async fn on_account_failure(&self, e: &GatewayError) -> After {
        self.metrics().send_failed(&self.account, "account");
        // Counted once: by the session when the gateway has one.
        if !self.gateway.reports_session_signals() {
            if let Some(signal) = AccountSignal::of(e) {
                self.signal(signal);
            }
            // A ban is an incident (the warm-up starts over); a
            // logout is not a warning about how the account sent.
            if matches!(e, GatewayError::Banned { .. }) {
                self.incident().await;
            }
        }
        self.halt_with(e);
        After::Retry
    }

    /// Any other failure spends one of the group's attempts; failures in a
    /// row open the breaker; an expired upload is renewed first.
    async fn on_transient(
        &self,
        target: &RunTarget,
        part: u32,
        e: GatewayError,
        tries: &mut Tries,
    ) -> After {
        let cfg = &self.engine.config;
        tries.attempts += 1;
        let label = if e == GatewayError::MediaExpired {
            "upload"
        } else {
            "transient"
        };
        self.metrics().send_failed(&self.account, label);
        // An expired upload is renewed, not a sign of trouble.
        if e != GatewayError::MediaExpired && self.breaker.borrow_mut().failed(&cfg.breaker) {
            self.signal(AccountSignal::RepeatedFailures);
            self.cool_down(AccountSignal::RepeatedFailures, None).await;
            return After::Retry;
        }
        if tries.attempts >= cfg.max_attempts {
            let gave_up =
                GatewayError::Transient(format!("gave up after {} attempts: {e}", tries.attempts));
            self.fail(target, &gave_up, label);
            return After::Done;
        }
        if e == GatewayError::MediaExpired {
            // Upload again before the next attempt; bounded by the same
            // attempts as any other failure.
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
        After::Retry
    }

    /// Opens the account's breaker: the run leaves its groups as they are
    /// and the account's queue pauses for a cool-down (doubling while
    /// signals repeat, at least what WhatsApp asked), then resumes by itself.
    pub(super) async fn cool_down(&self, signal: AccountSignal, asked: Option<Duration>) {
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
        let extra = serde_json::json!({ "strike": strike });
        self.pause_account(signal, reason, until, extra).await;
    }

    /// Pauses the account's queue until `until` for `signal`: the run
    /// leaves its groups as they are and resumes by itself then. Halted
    /// before anything is awaited, so no other group's send starts
    /// meanwhile; then the incident (the warm-up starts over) and the
    /// `account_signal` event, with `extra` fields.
    async fn pause_account(
        &self,
        signal: AccountSignal,
        reason: String,
        until: chrono::DateTime<chrono::Utc>,
        extra: serde_json::Value,
    ) {
        self.control.halt(Halt {
            state: AccountState::CoolingDown,
            reason: reason.clone(),
            record: true,
            until: Some(until),
        });
        self.incident().await;
        let mut data = serde_json::json!({
            "signal": signal.label(),
            "reason": reason,
            "cooldown_until": until,
        });
        if let (Some(d), serde_json::Value::Object(more)) = (data.as_object_mut(), extra) {
            d.extend(more);
        }
        self.engine
            .events
            .emit(
                "account_signal",
                Some(&self.account),
                Some(self.run_id()),
                data,
            )
            .await;
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
