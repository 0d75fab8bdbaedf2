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
}

impl AccountHistory {
    /// `account`'s days up to `now`'s, from its `sends` (sent-at, parts),
    /// under `warmup` (the engine's ramp where it applies to the account).
    pub fn of(
        account: &Account,
        warmup: Option<Warmup>,
        sends: &[(DateTime<Utc>, u32)],
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
        let sends: Vec<(DateTime<Utc>, u32)> = self
            .store
            .sent_since(id, AccountHistory::since(&account, now))
            .await?
            .into_iter()
            .filter_map(|(at, parts)| at.map(|at| (at, parts)))
            .collect();
        // The ramp applies as the engine applies it (run/plan.rs).
        let warmup = self
            .warmup
            .filter(|_| account.limits.new_number || self.warmup_all)
            .cloned();
        Ok(AccountHistory::of(&account, warmup, &sends, now))
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
        let h = AccountHistory::of(&a, Some(ramp), &sends, now);
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
        let plain = AccountHistory::of(&account(now, AccountLimits::default()), None, &[], now);
        assert!(plain
            .days
            .iter()
            .all(|d| d.ceiling.is_none() && d.messages == 0));
        assert_eq!(plain.timezone.name(), "UTC");
    }
}
