//! Recalling or editing a sent run ([`Amendment`]), executed in its
//! account's actor like a run: serial with the account's runs, paced by the
//! same bucket (each revoke or edit is a message, counted in the 60 s
//! window), under the account's lease, one group at a time in the order of
//! the run's groups. Each group is marked `sending` (durable) before its
//! first message goes and `done` after its last, so a crash or a takeover
//! resumes where it stopped: a group marked done is never sent again, and
//! one caught between the marks is sent again with the same message ids,
//! which WhatsApp does not apply twice.
//!
//! Imports: `delivery` (the engine, bucket, run steps and outcome), `domain`,
//! `ports`.

use crate::delivery::bucket::TokenBucket;
use crate::delivery::engine::{Engine, Halt, RunControl};
use crate::delivery::outcome::{amend_message_id, message_id};
use crate::delivery::run::{backoff, claim_account, rebuild_bucket, RunEnd};
use crate::domain::*;
use crate::ports::{Gateway, GatewayError, OutgoingMessage, StoreError};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// Groups read from the store at a time.
const PAGE: u32 = 200;

/// What an operator asks: a recall, or an edit with the new text of the
/// run's text parts and the new caption of its pictures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmendAsk {
    pub kind: AmendKind,
    pub text: Option<String>,
    pub caption: Option<String>,
}

impl AmendAsk {
    /// A recall: every message deleted for everyone.
    pub fn recall() -> Self {
        Self {
            kind: AmendKind::Recall,
            text: None,
            caption: None,
        }
    }
}

/// Stores the amendment an operator asked of a finished run (the actor
/// stops a run still sending first), under the account's lease, with its
/// `*_started` event. Invalid names the field an edit cannot apply;
/// Conflict says why it cannot be done (past WhatsApp's window, naming the
/// deadline; another under way; an edit of a changed reminder).
pub async fn request(
    engine: &Engine,
    account: &AccountId,
    run: &Run,
    ask: &AmendAsk,
) -> Result<Amendment, StoreError> {
    let store = &engine.ports.store;
    let now = engine.ports.clock.now();
    let window = engine.config.amend_windows.of(ask.kind);
    let window_secs = window.as_secs() as i64;
    // Its last message went by the time it finished (or now, if it is
    // only now stopping): past that plus the window, nothing can be done.
    let last = run.finished_at.unwrap_or(now);
    let deadline = last + chrono::TimeDelta::seconds(window_secs);
    if now >= deadline {
        return Err(StoreError::Conflict(format!(
            "too late to {} run {}: WhatsApp allows it for {} after a message is sent, and this \
             run's last message went by {}, so the deadline was {}",
            ask.kind,
            run.id,
            crate::domain::duration_words(window_secs),
            rfc3339(last),
            rfc3339(deadline)
        )));
    }
    let (edits, left_as_sent) = match ask.kind {
        AmendKind::Recall => (Vec::new(), Vec::new()),
        AmendKind::Edit => edits_of(store.as_ref(), run, ask).await?,
    };
    let new = NewAmendment {
        run_id: run.id,
        kind: ask.kind,
        edits,
        requested_at: now,
        window_secs,
    };
    let event = engine.events.event(
        ask.kind.started_event(),
        Some(account),
        Some(run.id),
        serde_json::json!({
            "kind": ask.kind,
            "deadline": deadline,
            "requested_at": now,
            "left_as_sent": left_as_sent,
        }),
    );
    let fence = engine.ownership(account).fence().map_err(|_| {
        StoreError::Fenced(format!(
            "this daemon no longer holds account {account}'s lease"
        ))
    })?;
    let (mut a, stored) = store
        .create_amendment(&new, fence.as_slice(), &event)
        .await?;
    engine.events.published(Some(stored));
    a.left_as_sent = left_as_sent;
    Ok(a)
}

/// An edit's new texts by part, and the parts it leaves as sent (polls);
/// Conflict when the reminder changed since the run, or when every part
/// is a poll.
async fn edits_of(
    store: &dyn crate::ports::Store,
    run: &Run,
    ask: &AmendAsk,
) -> Result<(Vec<Option<String>>, Vec<String>), StoreError> {
    let reminder = store
        .get_reminder(run.reminder_id)
        .await?
        .filter(|r| r.updated_at <= run.created_at)
        .ok_or_else(|| {
            StoreError::Conflict(format!(
                "run {} cannot be edited: its reminder was changed or deleted after \
                 the run fired, so what its parts were is no longer known; recall it \
                 instead",
                run.id
            ))
        })?;
    let kinds: Vec<PartKind> = reminder.spec.parts.iter().map(|p| p.kind()).collect();
    let left_as_sent = polls_left(&kinds);
    if left_as_sent.len() == kinds.len() {
        return Err(StoreError::Conflict(format!(
            "run {} cannot be edited: {} {} a poll, and WhatsApp does not edit polls; \
             recall it instead",
            run.id,
            left_as_sent.join(" and "),
            if kinds.len() == 1 { "is" } else { "are each" }
        )));
    }
    let edits = edits_for(&kinds, ask.text.as_deref(), ask.caption.as_deref())?;
    Ok((edits, left_as_sent))
}

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// One amendment's execution.
struct AmendCtx {
    engine: Arc<Engine>,
    account: AccountId,
    amendment: Amendment,
    gateway: Arc<dyn Gateway>,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
    /// The lease epoch it first acted under: it acts under no other.
    epoch: std::cell::Cell<Option<i64>>,
}

/// Executes amendment `id` of `account` to its end, or until it must
/// leave (drain, lost lease, halt, store failure).
pub async fn execute(
    engine: Arc<Engine>,
    account: AccountId,
    id: i64,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
) -> RunEnd {
    let ctx = match admit(engine, account, id, control, bucket).await {
        Ok(ctx) => ctx,
        Err(end) => return end,
    };
    ctx.amend_all().await.err().unwrap_or(RunEnd::Done)
}

async fn admit(
    engine: Arc<Engine>,
    account_id: AccountId,
    id: i64,
    control: Rc<RunControl>,
    bucket: Rc<RefCell<TokenBucket>>,
) -> Result<AmendCtx, RunEnd> {
    let store = &engine.ports.store;
    let Some(amendment) = store.get_amendment(id).await? else {
        return Err(RunEnd::Done);
    };
    if amendment.is_finished() {
        return Err(RunEnd::Done);
    }
    let Some(account) = store.get_account(&account_id).await? else {
        return Err(RunEnd::Done);
    };
    if account.state != AccountState::Connected {
        return Err(RunEnd::Requeue {
            halt: Some(Halt::of_account(&account)),
            why: "the account cannot send".into(),
        });
    }
    let Some(gateway) = engine.ports.gateways.gateway(account.kind) else {
        return Err(RunEnd::Done);
    };
    claim_account(&engine, &account_id, &*gateway).await?;
    let per_minute = engine.per_minute(&account.limits);
    rebuild_bucket(&engine, &account_id, &bucket, per_minute).await?;
    tracing::info!(account = %account_id, run = %amendment.run_id, amendment = id, kind = %amendment.kind, "amending a sent run");
    Ok(AmendCtx {
        engine,
        account: account_id,
        amendment,
        gateway,
        control,
        bucket,
        epoch: std::cell::Cell::new(None),
    })
}

impl AmendCtx {
    /// Every group of the run with a message, in the run's order, then
    /// the amendment's end (stored with its event).
    async fn amend_all(&self) -> Result<(), RunEnd> {
        let store = &self.engine.ports.store;
        let mut after = None;
        loop {
            let page = store.amend_targets(self.amendment.id, after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.position);
            for t in page {
                if t.state.is_some_and(AmendState::is_final) {
                    continue;
                }
                self.amend_group(&t).await?;
            }
        }
        self.finish().await
    }

    async fn finish(&self) -> Result<(), RunEnd> {
        let store = &self.engine.ports.store;
        let a = &self.amendment;
        let progress = store
            .get_amendment(a.id)
            .await?
            .map(|a| a.progress)
            .unwrap_or_default();
        let line = progress.line(a.kind);
        let event = self.engine.events.event(
            a.kind.finished_event(),
            Some(&self.account),
            Some(a.run_id),
            serde_json::json!({"amendment_id": a.id, "kind": a.kind, "progress": progress, "summary": line}),
        );
        let fence = self.fence()?;
        let now = self.engine.ports.clock.now();
        let stored = store
            .finish_amendment(fence.as_slice(), a.id, now, &event)
            .await?;
        self.engine.events.published(stored);
        tracing::info!(account = %self.account, run = %a.run_id, amendment = a.id, summary = %line, "amendment finished");
        Ok(())
    }

    /// The fence to write and send under, as long as it is the lease this
    /// amendment started under; a lost lease leaves it to the next owner.
    fn fence(&self) -> Result<Option<Fence>, RunEnd> {
        self.engine
            .pinned_fence(&self.account, &self.epoch)
            .map_err(|_| RunEnd::Left)
    }

    /// Marks `t`; `false` if its state did not allow it (another daemon's
    /// mark came first).
    async fn mark(
        &self,
        t: &AmendTarget,
        state: AmendState,
        error: Option<&str>,
    ) -> Result<bool, RunEnd> {
        let fence = self.fence()?;
        let now = self.engine.ports.clock.now();
        Ok(self
            .engine
            .ports
            .store
            .mark_amend(
                fence.as_slice(),
                self.amendment.id,
                t.target_id,
                state,
                error,
                now,
            )
            .await?)
    }

    /// One group: too old, or marked, its messages sent, marked done.
    async fn amend_group(&self, t: &AmendTarget) -> Result<(), RunEnd> {
        if self.control.must_not_send() {
            return Err(RunEnd::Left);
        }
        let a = &self.amendment;
        let now = self.engine.ports.clock.now();
        // A group already marked before the wire may have its messages
        // amended (by this daemon before a crash, or by the account's
        // previous owner): it is sent again under the same ids, past the
        // window or not, and WhatsApp does not apply one twice.
        if t.state.is_none() {
            if t.too_old(a.window_secs, now) {
                self.mark(t, AmendState::TooOld, None).await?;
                return Ok(());
            }
            if !self.mark(t, AmendState::Sending, None).await? {
                return Ok(());
            }
        }
        for part in 0..t.messages() {
            let of = message_id(a.run_id, &t.group, part);
            let msg = match a.kind {
                AmendKind::Recall => OutgoingMessage::Revoke { of },
                AmendKind::Edit => match a.edits.get(part as usize) {
                    Some(Some(text)) => OutgoingMessage::Edit {
                        of,
                        text: text.clone(),
                    },
                    // A picture without a new caption, or the reverse.
                    _ => continue,
                },
            };
            let id = amend_message_id(a.id, &t.group, part);
            if let Some(refused) = self.send(&t.group, &msg, &id).await? {
                self.mark(t, AmendState::Failed, Some(&refused.to_string()))
                    .await?;
                return Ok(());
            }
            self.control.nap(self.engine.jitter()).await;
        }
        self.mark(t, AmendState::Done, None).await?;
        Ok(())
    }

    /// Sends one message when the bucket allows, trying again what can be
    /// tried again. `Some(e)`: the group refused it (not a participant,
    /// gone), or it failed `max_attempts` times; `Err`: the amendment must
    /// leave (and is taken up again later: the account cannot send now).
    async fn send(
        &self,
        group: &GroupJid,
        msg: &OutgoingMessage,
        id: &str,
    ) -> Result<Option<GatewayError>, RunEnd> {
        let cfg = &self.engine.config;
        let (mut tries, mut limited, mut outage) = (0u32, 0u32, 0u32);
        loop {
            let granted = self.take_token().await?;
            let fence = self.fence()?;
            let answer = self
                .gateway
                .send_fenced(&self.account, group, msg, id, fence.as_ref())
                .await;
            self.bucket
                .borrow_mut()
                .settle(granted, tokio::time::Instant::now());
            let e = match answer {
                Ok(_) => return Ok(None),
                Err(e) => e,
            };
            match e {
                GatewayError::Fenced { .. } | GatewayError::LeaseEnded(_) => {
                    return Err(RunEnd::Left)
                }
                e if e.is_target_failure() => return Ok(Some(e)),
                e if e.is_account_failure() => {
                    return Err(RunEnd::Requeue {
                        halt: Some(Halt::from_gateway(&e)),
                        why: e.to_string(),
                    })
                }
                // The account's trouble, not the group's: the account
                // slows down, and past a few the actor tries later.
                GatewayError::RateLimited { retry_after }
                | GatewayError::Restricted { retry_after, .. } => {
                    limited += 1;
                    if limited > cfg.max_attempts {
                        return Err(RunEnd::Requeue {
                            halt: None,
                            why: format!("{} kept being refused: {e}", msg_kind(msg)),
                        });
                    }
                    self.engine.ports.metrics.rate_limited(&self.account);
                    self.bucket.borrow_mut().back_off(
                        tokio::time::Instant::now(),
                        cfg.rate_limit_factor,
                        cfg.rate_limit_cooldown,
                    );
                    let wait = retry_after.unwrap_or_else(|| backoff(cfg.retry_base, limited));
                    self.control.nap(wait).await;
                }
                // An outage is waited out without spending the group's tries.
                GatewayError::Unreachable(_) => {
                    outage += 1;
                    let wait = backoff(cfg.retry_base, outage).min(Duration::from_secs(60));
                    self.control.nap(wait).await;
                }
                // Anything else, as many times as a run's part would be
                // tried; then the group is reported refused with why, so a
                // revoke WhatsApp will never take cannot hold the account.
                e => {
                    tries += 1;
                    if tries >= cfg.max_attempts {
                        return Ok(Some(e));
                    }
                    tracing::debug!(account = %self.account, error = %e, "amendment message failed; trying again");
                    self.control.nap(backoff(cfg.retry_base, tries)).await;
                }
            }
        }
    }

    /// A token at a moment the gateway can write (see the run's
    /// `take_token_when_ready`); `Err(Left)` once the actor must not send.
    async fn take_token(&self) -> Result<tokio::time::Instant, RunEnd> {
        loop {
            if self.control.must_not_send() {
                return Err(RunEnd::Left);
            }
            if let Err(e) = self.gateway.ready(&self.account).await {
                if e.is_account_failure() {
                    return Err(RunEnd::Requeue {
                        halt: Some(Halt::from_gateway(&e)),
                        why: e.to_string(),
                    });
                }
                self.control.nap(Duration::from_secs(1)).await;
                continue;
            }
            if self.control.must_not_send() {
                return Err(RunEnd::Left);
            }
            let now = tokio::time::Instant::now();
            let wait = self.bucket.borrow_mut().try_take(now);
            match wait {
                Ok(()) => return Ok(now),
                Err(w) => self.control.nap(w).await,
            }
        }
    }
}

fn msg_kind(msg: &OutgoingMessage) -> &'static str {
    match msg {
        OutgoingMessage::Revoke { .. } => "a revoke",
        _ => "an edit",
    }
}
