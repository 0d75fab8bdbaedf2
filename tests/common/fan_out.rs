//! Seeds the fan-out the process tests drive: a connected simulated
//! account at a given limit, one reminder of plain text to numbered groups,
//! and a queued run of it. The reminder is due in 2099, so no daemon's
//! scheduler fires it by itself: the test queues the run when it is ready.

#![allow(dead_code)] // each test file uses its own part

use chrono::Utc;
use herald::store::SqlStore;
use herald_actors::domain::*;
use herald_actors::ports::{AccountStore, NewAccount, ReminderStore, RunStore};
use herald_actors::simulator::Simulator;

/// Creates `account` (simulated, connected, `per_minute` in any 60 s) and
/// a reminder from it to `groups` numbered groups. Returns the reminder id.
pub async fn seed_reminder(
    store: &SqlStore,
    account: &AccountId,
    per_minute: u32,
    groups: usize,
    title: &str,
) -> i64 {
    let now = Utc::now();
    store
        .create_account(
            &NewAccount {
                id: account.clone(),
                name: format!("simulated {account}"),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits {
                    max_per_minute: Some(per_minute),
                    ..Default::default()
                },
            },
            now,
        )
        .await
        .unwrap();
    let spec = NewReminder::new(
        account.clone(),
        title,
        TimeZone::parse("UTC").unwrap(),
        Schedule::once("2099-01-01T09:00").unwrap(),
        WindowHours::parse(0, 24).unwrap(),
        false,
        vec![MessagePart::text(&format!("Reminder from {account}: standup at 09:30")).unwrap()],
        (0..groups).map(Simulator::numbered_group).collect(),
    )
    .unwrap();
    store.create_reminder(&spec, now).await.unwrap().id
}

/// Queues a run of `reminder` now, as the scheduler would have.
pub async fn queue_run(store: &SqlStore, reminder: i64, account: &AccountId) -> RunId {
    let now = Utc::now();
    store
        .create_run(reminder, account, now, RunStatus::Queued, None, now)
        .await
        .unwrap()
        .run
        .id
}
