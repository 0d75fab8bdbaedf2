//! An account's last 30 days, as its chart draws them: the messages sent
//! each local day against the ceiling the engine held it to that day (its
//! daily cap, or the warm-up ramp's step where that is lower), and its
//! last incident. Read from the store's sent-at times, so the chart draws
//! nothing the API cannot answer.

use super::error::ApiError;
use super::{Allowed, Operation, Service};
use chrono::{DateTime, Duration, NaiveDate, NaiveTime, Utc};
use herald_actors::delivery::caps::{CapKind, CapPolicy, Warmup};
use herald_actors::domain::{Account, AccountId, Role, TimeZone};
use herald_actors::ports::Store;
use schemars::JsonSchema;
use serde::Serialize;

pub static HISTORY: Operation = Operation::read("getAccountHistory", Role::Viewer);

/// Days an account's history covers, today included.
pub const DAYS: i64 = 30;

/// One local day of an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct DaySends {
    /// The local calendar day.
    pub day: NaiveDate,
    /// Messages (parts) of groups whose last part went out that day.
    pub messages: u32,
    /// The most the engine let it send that day; null without a cap or
    /// ramp.
    pub ceiling: Option<u32>,
    /// What set the ceiling: `daily_cap` or `warmup`.
    pub ceiling_by: Option<String>,
}

/// A stretch of the 30 days the account spent in a state other than
/// connected (cooling down after a breaker or a time-lock, banned,
/// disabled, logged out, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct StateSpan {
    pub state: String,
    pub reason: Option<String>,
    /// Its start, or the history's first day if it began before.
    pub from: DateTime<Utc>,
    /// Its end; null while it lasts.
    pub until: Option<DateTime<Utc>>,
}

/// One state change: when, the state, and why.
pub type StateChange = (DateTime<Utc>, String, Option<String>);

/// An account's last 30 days.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AccountHistory {
    pub account_id: AccountId,
    /// The zone its days are counted in: the account's own, else UTC.
    pub timezone: TimeZone,
    /// Oldest first, today last.
    pub days: Vec<DaySends>,
    /// Its last incident (a breaker opening, a time-lock): the warm-up
    /// ramp starts again from it.
    pub incident_at: Option<DateTime<Utc>>,
    /// Where it was not connected, oldest first.
    pub states: Vec<StateSpan>,
    /// When this was read: a state that lasts is drawn up to here.
    pub as_of: DateTime<Utc>,
}

/// The spans outside `connected` from `changes` (oldest first, the first
/// possibly before `since`), clipped to start at `since`. With no change
/// known, an account not connected now has been so since `since` at least.
pub fn spans(
    changes: &[StateChange],
    current: &str,
    current_reason: Option<&str>,
    since: DateTime<Utc>,
) -> Vec<StateSpan> {
    if changes.is_empty() {
        return (current != "connected")
            .then(|| StateSpan {
                state: current.to_owned(),
                reason: current_reason.map(str::to_owned),
                from: since,
                until: None,
            })
            .into_iter()
            .collect();
    }
    let mut out = Vec::new();
    for (i, (at, state, reason)) in changes.iter().enumerate() {
        if state == "connected" {
            continue;
        }
        let until = changes.get(i + 1).map(|(next, _, _)| *next);
        if until.is_some_and(|u| u <= since) {
            continue;
        }
        out.push(StateSpan {
            state: state.clone(),
            reason: reason.clone(),
            from: (*at).max(since),
            until,
        });
    }
    out
}

impl AccountHistory {
    /// `account`'s days up to `now`'s, from its `sends` (sent-at, parts),
    /// under `warmup` (the engine's ramp where it applies to the account).
    pub fn of(
        account: &Account,
        warmup: Option<Warmup>,
        sends: &[(DateTime<Utc>, u32)],
        changes: &[StateChange],
        now: DateTime<Utc>,
    ) -> Self {
        let tz = account
            .limits
            .timezone
            .unwrap_or_else(|| TimeZone::parse("UTC").expect("UTC is a zone"));
        let policy = CapPolicy {
            tz,
            daily: account.limits.daily_cap,
            hourly: account.limits.hourly_cap,
            warmup,
            ramp_start: account.ramp_start(),
        };
        let local_day = |at: DateTime<Utc>| at.with_timezone(&tz.tz()).date_naive();
        let today = local_day(now);
        let days = (0..DAYS)
            .rev()
            .map(|back| {
                let day = today - Duration::days(back);
                // Noon is on the day whatever its DST change.
                let noon = day
                    .and_time(NaiveTime::from_hms_opt(12, 0, 0).expect("noon"))
                    .and_local_timezone(tz.tz())
                    .earliest()
                    .map_or(now, |t| t.with_timezone(&Utc));
                let ceiling = policy.daily_ceiling(noon);
                DaySends {
                    day,
                    messages: sends
                        .iter()
                        .filter(|(at, _)| local_day(*at) == day)
                        .map(|(_, parts)| parts)
                        .sum(),
                    ceiling: ceiling.as_ref().map(|(c, _)| *c),
                    ceiling_by: ceiling.map(|(_, kind)| {
                        match kind {
                            CapKind::Warmup { .. } => "warmup",
                            _ => "daily_cap",
                        }
                        .to_owned()
                    }),
                }
            })
            .collect();
        Self {
            account_id: account.id.clone(),
            timezone: tz,
            days,
            incident_at: account.incident_at,
            states: spans(
                changes,
                account.state.as_str(),
                account.state_reason.as_deref(),
                Self::since(account, now),
            ),
            as_of: now,
        }
    }

    /// The first day the history covers, at its local midnight.
    fn since(account: &Account, now: DateTime<Utc>) -> DateTime<Utc> {
        let tz = account.limits.timezone.map_or(chrono_tz::UTC, |t| t.tz());
        let first = now.with_timezone(&tz).date_naive() - Duration::days(DAYS - 1);
        first
            .and_time(NaiveTime::MIN)
            .and_local_timezone(tz)
            .earliest()
            .map_or(now - Duration::days(DAYS), |t| t.with_timezone(&Utc))
    }
}

/// Reading accounts' histories.
pub struct Histories<'a> {
    store: &'a dyn Store,
    warmup: Option<&'a Warmup>,
    warmup_all: bool,
}

impl<'a> Histories<'a> {
    pub fn of(service: &'a Service) -> Self {
        let config = &service.state.engine.config;
        Self {
            store: service.state.store.as_ref(),
            warmup: config.warmup.as_ref(),
            warmup_all: config.warmup_all,
        }
    }

    /// Account `id`'s last 30 days.
    pub async fn get(&self, allowed: Allowed, id: &AccountId) -> Result<AccountHistory, ApiError> {
        allowed.of(&HISTORY)?;
        let account = self
            .store
            .get_account(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("account {id}")))?;
        let now = Utc::now();
        let since = AccountHistory::since(&account, now);
        let changes: Vec<StateChange> = self
            .store
            .account_states(id, since)
            .await?
            .into_iter()
            .filter_map(|e| {
                let state = e.data["state"].as_str()?.to_owned();
                let reason = e.data["reason"].as_str().map(str::to_owned);
                Some((e.at, state, reason))
            })
            .collect();
        let sends: Vec<(DateTime<Utc>, u32)> = self
            .store
            .sent_since(id, since)
            .await?
            .into_iter()
            .filter_map(|(at, parts)| at.map(|at| (at, parts)))
            .collect();
        // The ramp applies as the engine applies it (run/plan.rs).
        let warmup = self
            .warmup
            .filter(|_| account.limits.new_number || self.warmup_all)
            .cloned();
        Ok(AccountHistory::of(&account, warmup, &sends, &changes, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use herald_actors::domain::{AccountLimits, AccountState, GatewayKind};

    fn account(created: DateTime<Utc>, limits: AccountLimits) -> Account {
        Account {
            id: AccountId::parse("a").unwrap(),
            name: "a".into(),
            kind: GatewayKind::Simulator,
            state: AccountState::Connected,
            state_reason: None,
            state_until: None,
            limits,
            created_at: created,
            incident_at: None,
            standing: Default::default(),
        }
    }

    #[test]
    fn spans_outside_connected_are_clipped_to_the_history() {
        let t = |d: i64| Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap() + Duration::days(d);
        let change = |d: i64, s: &str| (t(d), s.to_owned(), None);
        let changes = [
            change(-3, "cooling_down"),
            change(2, "connected"),
            change(5, "banned"),
            change(6, "connected"),
            change(9, "disabled"),
        ];
        let got = spans(&changes, "disabled", None, t(0));
        let brief: Vec<_> = got
            .iter()
            .map(|s| (s.state.as_str(), s.from, s.until))
            .collect();
        assert_eq!(
            brief,
            [
                ("cooling_down", t(0), Some(t(2))),
                ("banned", t(5), Some(t(6))),
                ("disabled", t(9), None),
            ]
        );
        // A span that ended before the history starts is not in it.
        let old = [change(-9, "banned"), change(-8, "connected")];
        assert!(spans(&old, "connected", None, t(0)).is_empty());
        // No change known: now's state, since the start at least.
        let none = spans(&[], "logged_out", Some("unpaired on the phone"), t(0));
        assert_eq!(none[0].from, t(0));
        assert_eq!(none[0].reason.as_deref(), Some("unpaired on the phone"));
    }

    #[test]
    fn days_are_local_and_the_ceiling_is_the_lower_of_cap_and_ramp() {
        let now = Utc.with_ymd_and_hms(2026, 11, 28, 3, 0, 0).unwrap();
        let limits = AccountLimits {
            daily_cap: Some(100),
            new_number: true,
            timezone: Some(TimeZone::parse("Asia/Kuala_Lumpur").unwrap()),
            ..Default::default()
        };
        // Paired two days ago (local): day 0, 1 and 2 of the ramp.
        let a = account(now - Duration::days(2), limits);
        let ramp = Warmup::parse("0:20, 2:150", "warmup").unwrap();
        let sends = [
            // 23:30 UTC on the 27th is the 28th in Kuala Lumpur (UTC+8).
            (Utc.with_ymd_and_hms(2026, 11, 27, 23, 30, 0).unwrap(), 2),
            (Utc.with_ymd_and_hms(2026, 11, 27, 15, 59, 0).unwrap(), 1),
        ];
        let h = AccountHistory::of(&a, Some(ramp), &sends, &[], now);
        assert_eq!(h.days.len(), 30);
        let today = h.days.last().unwrap();
        assert_eq!(today.day, NaiveDate::from_ymd_opt(2026, 11, 28).unwrap());
        assert_eq!(today.messages, 2);
        assert_eq!(h.days[28].messages, 1, "15:59 UTC is 23:59 on the 27th");
        // Day 2 of the ramp allows 150: the daily cap of 100 is lower.
        assert_eq!(
            (today.ceiling, today.ceiling_by.as_deref()),
            (Some(100), Some("daily_cap"))
        );
        // Day 0 and 1 of the ramp: 20.
        assert_eq!(h.days[27].ceiling, Some(20));
        assert_eq!(h.days[27].ceiling_by.as_deref(), Some("warmup"));
        let plain =
            AccountHistory::of(&account(now, AccountLimits::default()), None, &[], &[], now);
        assert!(plain.states.is_empty(), "connected all along");
        assert!(plain
            .days
            .iter()
            .all(|d| d.ceiling.is_none() && d.messages == 0));
        assert_eq!(plain.timezone.name(), "UTC");
    }
}
