//! Reading what WhatsApp says of an account (its standing: the reach-out
//! time-lock, the new-chat quota) through its gateway, keeping it with the
//! account, and telling a change: an `account_standing` event (and so the
//! `account.standing` webhook), and the account's metrics.
//!
//! The account's actor asks when it starts, on a schedule (hourly, as
//! WhatsApp Web asks for the quota), and for the time-lock at once after a
//! 463. A reading that could not be taken because the account is not
//! connected leaves the last one as it was; one that came back unreadable
//! is kept as `Unknown` (logged once per account and cause), never a
//! reason to stop sending.

use super::engine::Engine;
use crate::domain::*;
use crate::ports::{Gateway, StandingError, StoreError};

/// Which parts to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parts {
    TimeLock,
    Both,
}

/// One part's new reading from the gateway's answer, or the last one.
fn reading<T>(
    last: &Reading<T>,
    answer: Result<T, StandingError>,
    now: chrono::DateTime<chrono::Utc>,
    account: &AccountId,
    what: &str,
) -> Reading<T>
where
    T: Clone,
{
    match answer {
        Ok(value) => Reading::Known {
            value,
            read_at: now,
        },
        Err(StandingError::Unsupported) | Err(StandingError::NotNow(_)) => last.clone(),
        Err(StandingError::Unreadable(why)) => {
            // Once per account and cause: the next hour's read says the
            // same, and the log is not the place to repeat it.
            if !matches!(last, Reading::Unknown { why: w, .. } if *w == why) {
                tracing::warn!(%account, part = what, %why, "WhatsApp's answer about the account could not be read; shown as unknown, sending goes on");
            }
            Reading::Unknown { why, read_at: now }
        }
    }
}

/// Reads `parts` of `account`'s standing, keeps it (with the event of a
/// change) and reports it to the metrics; answers the standing now known.
pub async fn refresh(
    engine: &Engine,
    gateway: &dyn Gateway,
    account: &AccountId,
    parts: Parts,
) -> Standing {
    let timelock = gateway.fetch_timelock(account).await;
    let quota = match parts {
        Parts::Both => Some(gateway.fetch_quota(account).await),
        Parts::TimeLock => None,
    };
    keep(engine, account, timelock, quota).await
}

/// Keeps what the gateway answered (`quota`: `None` when not asked) as
/// the account's standing, with the event of a change, and reports it to
/// the metrics; answers the standing now known. The store failing leaves
/// the standing as read, unkept: it is read again at the next occasion.
pub async fn keep(
    engine: &Engine,
    account: &AccountId,
    timelock: Result<TimeLock, StandingError>,
    quota: Option<Result<NewChatQuota, StandingError>>,
) -> Standing {
    let now = engine.ports.clock.now();
    keep_in(
        engine.ports.store.as_ref(),
        &engine.events,
        now,
        account,
        timelock,
        quota,
    )
    .await
}

/// [`keep`] with the store and event bus it writes to (the WhatsApp
/// gateway keeps what it reads at login this way).
pub async fn keep_in(
    store: &dyn crate::ports::Store,
    events: &crate::events::EventBus,
    now: chrono::DateTime<chrono::Utc>,
    account: &AccountId,
    timelock: Result<TimeLock, StandingError>,
    quota: Option<Result<NewChatQuota, StandingError>>,
) -> Standing {
    // Two readings may be kept at once (the actor's and the one taken at
    // login): each writes only over the standing it read, so a change is
    // told once; the one that lost reads again and compares with that.
    for _ in 0..KEEP_ATTEMPTS {
        let last = match store.get_account(account).await {
            Ok(Some(a)) => a.standing,
            Ok(None) => return Standing::default(),
            Err(e) => {
                tracing::warn!(%account, error = %e, "could not read the account's standing");
                return Standing::default();
            }
        };
        let standing = Standing {
            timelock: reading(&last.timelock, timelock.clone(), now, account, "timelock"),
            quota: match &quota {
                Some(answer) => reading(&last.quota, answer.clone(), now, account, "quota"),
                None => last.quota.clone(),
            },
        };
        if standing == last {
            return standing;
        }
        let changed = (!standing.same_as(&last)).then(|| {
            events.event(
                "account_standing",
                Some(account),
                None,
                serde_json::json!({ "standing": standing, "needs_attention": standing.needs_attention(now) }),
            )
        });
        match store
            .set_account_standing(account, Some(&last), &standing, changed.as_ref())
            .await
        {
            Ok(told) => events.published(told),
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => {
                tracing::warn!(%account, error = %e, "could not keep the account's standing");
            }
        }
        return standing;
    }
    tracing::warn!(%account, "the account's standing kept changing under this reading; it is read again at the next occasion");
    match store.get_account(account).await {
        Ok(Some(a)) => a.standing,
        _ => Standing::default(),
    }
}

/// How often a reading is compared again with a standing kept meanwhile
/// by another reading before it gives way.
const KEEP_ATTEMPTS: usize = 4;
