//! What an account may send for a run: its limits, its daily and hourly
//! caps and warm-up, and the forecast the run states at its start (also
//! the control port's dry-run).

use crate::delivery::caps::{CapPolicy, SendLedger};
use crate::delivery::engine::Engine;
use crate::domain::*;
use crate::ports::StoreError;
use chrono::{DateTime, Utc};

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
pub(super) fn effective_limits(engine: &Engine, account: &Account) -> (u32, u32) {
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
) -> crate::delivery::forecast::Forecast {
    let (per_minute, concurrency) = effective_limits(engine, account);
    let typed = spec
        .parts
        .first()
        .and_then(MessagePart::written)
        .map(|w| w.chars().count())
        .unwrap_or(0);
    let sustained = crate::delivery::forecast::paced_per_minute(
        per_minute,
        engine.pacing(&account.id),
        engine.config.typing.duration(typed),
        concurrency,
    );
    let parts = spec.parts.len() as u32;
    // What WhatsApp said of the account can hold the run back: nothing
    // leaves before a time-lock that holds ends, nor before the pause it
    // (or a cool-down) put the account in ends.
    let held = held_back(account, start, &spec.timezone);
    let from = held
        .as_ref()
        .map_or(start, |(until, _)| (*until).max(start));
    let mut f =
        crate::delivery::forecast::forecast(groups, parts, sustained, from, close, &spec.timezone);
    let fit = crate::delivery::caps::WindowFit::new(f.groups_fit, spec.window.hours(), sustained);
    if let Some(capped) = caps.and_then(|c| c.forecast(ledger, from, groups, parts, fit)) {
        f.text = format!("{}; {capped}", f.text);
    }
    if let Some(note) = held_note(held, close, &spec.timezone) {
        f.text = match f.groups_fit {
            0 => note,
            _ => format!("{note}; {}", f.text),
        };
    }
    f
}

/// What WhatsApp's word on `account` means for a run sending from `start`
/// until `close`: `None` when nothing holds it back.
pub fn standing_note(
    account: &Account,
    start: DateTime<Utc>,
    close: DateTime<Utc>,
    tz: &TimeZone,
) -> Option<String> {
    held_note(held_back(account, start, tz), close, tz)
}

fn held_note(
    held: Option<(DateTime<Utc>, String)>,
    close: DateTime<Utc>,
    tz: &TimeZone,
) -> Option<String> {
    let (until, why) = held?;
    let close_text = close.with_timezone(&tz.tz()).format("%H:%M %Z").to_string();
    Some(if until >= close {
        format!("{why}, after the window closes at {close_text}: nothing will be sent")
    } else {
        format!("{why}: nothing leaves before then")
    })
}

/// Until when, from `at`, the account cannot send, and why: a reach-out
/// time-lock that holds as WhatsApp last said (the later end wins), or a
/// pause the account is in with its end.
pub fn held_back(
    account: &Account,
    at: DateTime<Utc>,
    tz: &TimeZone,
) -> Option<(DateTime<Utc>, String)> {
    let lock = account
        .standing
        .locked_until(at)
        .flatten()
        .map(|until| (until, Standing::describe_lock(Some(until), tz.tz())));
    let pause = account
        .state_until
        .filter(|u| *u > at && account.state == AccountState::CoolingDown)
        .map(|until| {
            let local = until.with_timezone(&tz.tz()).format("%Y-%m-%d %H:%M %Z");
            (until, format!("the account is paused until {local}"))
        });
    match (lock, pause) {
        (Some(l), Some(p)) if p.0 > l.0 => Some(p),
        (Some(l), _) => Some(l),
        (None, p) => p,
    }
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
