//! Step 1: everything before a run's first send, in named steps: admit the
//! run, take a fire permit, mark it running, claim the account at the
//! gateway, open its targets and rebuild the account's limiter, announce it.

use super::conclude::{cannot_start, requeue};
use super::ctx::{RunCtx, RunEnd};
use super::plan::{account_caps, effective_limits, forecast_for};
use super::window::{fixed_window_end, park_until, window_opening};
use crate::delivery::bucket::TokenBucket;
use crate::delivery::engine::{Engine, Halt, RunControl};
use crate::delivery::outcome::{message_id, StopReason};
use crate::delivery::signals::Breaker;
use crate::delivery::variation::RunTexts;
use crate::domain::*;
use crate::lifecycle::RunEvent;
use crate::messages::ArmWindow;
use crate::ports::{Gateway, GatewayError, RunUpdate, StoreError};
use chrono::{DateTime, Utc};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

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
    let texts = run_texts(
        &engine,
        &account,
        &run,
        &spec,
        opened.counts.total() as usize,
    )
    .await?;
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
        progress_every: (counts.total() as usize / 20).max(1),
        progress_told_at: Cell::new(now),
        counts: RefCell::new(counts),
        _permit: permit,
    }))
}

/// The run's texts, with the account's group names when a part asks for
/// them.
async fn run_texts(
    engine: &Engine,
    account: &Account,
    run: &Run,
    spec: &NewReminder,
    total: usize,
) -> Result<RunTexts, RunEnd> {
    let texts = RunTexts::new(spec, run.id, run.scheduled_for, total);
    Ok(if texts.wants_group_names() {
        texts.with_names(
            crate::delivery::variation::directory_names(&*engine.ports.store, &account.id).await?,
        )
    } else {
        texts
    })
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
        requeue(engine, &run, None).await?;
        return Err(RunEnd::Requeue {
            halt: Some(Halt::of_account(&account)),
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
pub(crate) async fn claim_account(
    engine: &Engine,
    account: &AccountId,
    gateway: &dyn Gateway,
) -> Result<(), RunEnd> {
    let Ok(Some(fence)) = engine.ownership(account).fence() else {
        return Ok(());
    };
    match gateway.claim_fence(&fence).await {
        Ok(()) => Ok(()),
        Err(e @ (GatewayError::Fenced { .. } | GatewayError::LeaseEnded(_))) => {
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
    let targets =
        crate::scheduling::preflight::freeze_targets(store.as_ref(), run.id, spec).await?;
    if targets.is_empty() {
        let synced = store.groups_synced_at(&account.id).await?;
        cannot_start(
            engine,
            run,
            &crate::scheduling::preflight::nothing_picked(synced),
        )
        .await?;
        return Err(RunEnd::Done);
    }
    open_polls(store.as_ref(), run.id, spec, &targets).await?;
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

/// The run's polls as they go out, and each group's copy, kept before the
/// first send so a vote that comes back finds them (votes can come within
/// a second of the send). Idempotent: a resumed run keeps the first.
async fn open_polls(
    store: &dyn crate::ports::Store,
    run: RunId,
    spec: &NewReminder,
    targets: &[RunTarget],
) -> crate::ports::StoreResult<()> {
    let polls: Vec<RunPoll> = spec
        .parts
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            MessagePart::Poll {
                question,
                options,
                multiple,
            } => Some(RunPoll {
                part: i as u32,
                question: question.clone(),
                options: options.clone(),
                multiple: *multiple,
            }),
            _ => None,
        })
        .collect();
    if polls.is_empty() {
        return Ok(());
    }
    let messages: Vec<PollMessage> = targets
        .iter()
        .flat_map(|t| {
            polls.iter().map(move |p| PollMessage {
                target_id: t.id,
                part: p.part,
                key: receipt_key(&message_id(run, &t.group, p.part)).to_owned(),
            })
        })
        .collect();
    store.open_polls(run, &polls, &messages).await
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
    // The forecast and `run_started` in one transaction: a start that
    // is announced is on the event stream and its webhooks, whatever
    // happens next.
    let started = engine.events.event(
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
    );
    engine
        .update_owned_run(
            &run.account_id,
            run.id,
            &RunUpdate {
                forecast: Some(forecast.to_owned()),
                event: Some(started),
                ..Default::default()
            },
        )
        .await?;
    if let Some(links) = engine.window.as_ref() {
        links.arm.do_send(ArmWindow {
            run_id: run.id,
            account_id: run.account_id.clone(),
            close_at: window_end,
        });
    }
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

/// A fresh actor's bucket, or one whose account changed lease epoch since
/// its last rebuild, starts from the store: the account's sends of
/// the last minute are in its grant log, at the account's own limit.
pub(crate) async fn rebuild_bucket(
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
