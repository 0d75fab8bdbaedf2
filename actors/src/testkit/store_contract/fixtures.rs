//! What every contract test builds on: a fixed clock, accounts, groups,
//! reminders and runs, a snapshot of the whole store, and the three
//! refusals (invalid, conflict, not found) asserted by kind.

use crate::domain::*;
use crate::ports::*;
use chrono::{DateTime, Duration, Utc};
use std::sync::Arc;

pub(super) type S = Arc<dyn Store>;

// ---------------------------------------------------------------- fixtures

pub(super) fn t0() -> DateTime<Utc> {
    "2026-03-02T01:00:00Z".parse().expect("valid instant")
}

/// `t0` plus `n` minutes.
pub(super) fn at(n: i64) -> DateTime<Utc> {
    t0() + Duration::minutes(n)
}

pub(super) fn aid(s: &str) -> AccountId {
    AccountId::parse(s).expect("valid account id")
}

pub(super) fn new_account(id: &str) -> NewAccount {
    NewAccount {
        id: aid(id),
        name: format!("Account {id}"),
        kind: GatewayKind::Simulator,
        state: AccountState::Connected,
        limits: AccountLimits::default(),
    }
}

pub(super) async fn account(s: &S, id: &str) -> AccountId {
    s.create_account(&new_account(id), t0())
        .await
        .expect("create account");
    aid(id)
}

pub(super) fn group(i: usize) -> GroupJid {
    GroupJid::parse(&format!("120363{i:012}@g.us")).expect("valid group")
}

pub(super) fn groups(range: std::ops::Range<usize>) -> Vec<GroupJid> {
    range.map(group).collect()
}

pub(super) fn text(s: &str) -> MessagePart {
    MessagePart::text(s).expect("valid text")
}

pub(super) fn media_info(bytes: &[u8], filename: &str) -> MediaInfo {
    MediaInfo {
        id: MediaId::of_bytes(bytes),
        mime: "image/png".into(),
        size: bytes.len() as u64,
        filename: Some(filename.into()),
        created_at: t0(),
    }
}

pub(super) async fn media(s: &S, bytes: &[u8]) -> MediaId {
    s.put_media(&media_info(bytes, "picture.png"))
        .await
        .expect("put media")
        .id
}

pub(super) fn spec(
    account: &AccountId,
    title: &str,
    parts: Vec<MessagePart>,
    targets: Vec<GroupJid>,
) -> NewReminder {
    NewReminder::new(
        account.clone(),
        title,
        TimeZone::parse("Asia/Kuala_Lumpur").expect("tz"),
        Schedule::cron("0 9 * * 1").expect("cron"),
        WindowHours::default(),
        false,
        parts,
        targets,
    )
    .expect("valid reminder")
}

pub(super) async fn reminder(s: &S, account: &AccountId, targets: usize) -> Reminder {
    s.create_reminder(
        &spec(
            account,
            "Standup",
            vec![text("Standup in 10 minutes")],
            groups(0..targets),
        ),
        t0(),
    )
    .await
    .expect("create reminder")
}

/// A run of `r` scheduled `minute` minutes after t0.
pub(super) async fn run(s: &S, r: &Reminder, minute: i64, status: RunStatus) -> Run {
    let c = s
        .create_run(
            r.id,
            &r.spec.account_id,
            at(minute),
            status,
            None,
            at(minute),
        )
        .await
        .expect("create run");
    assert!(c.created, "run at minute {minute} should be new");
    c.run
}

pub(super) async fn all_targets(s: &S, run: RunId) -> Vec<RunTarget> {
    s.list_targets(run, None, None, 0)
        .await
        .expect("list targets")
}

pub(super) async fn targets(s: &S, run: RunId, n: usize) -> Vec<RunTarget> {
    s.create_targets(run, &groups(0..n))
        .await
        .expect("create targets");
    let ts = all_targets(s, run).await;
    assert_eq!(ts.len(), n);
    ts
}

pub(super) async fn counts(s: &S, run: RunId) -> TargetCounts {
    s.get_run(run)
        .await
        .expect("get run")
        .expect("run exists")
        .counts
}

pub(super) fn counts_of(
    pending: u32,
    sending: u32,
    sent: u32,
    failed: u32,
    skipped: u32,
) -> TargetCounts {
    TargetCounts {
        pending,
        sending,
        sent,
        failed,
        skipped,
    }
}

/// Everything a rejected write must leave exactly as it was.
#[derive(Debug, PartialEq)]
pub(super) struct Snapshot {
    accounts: Vec<Account>,
    reminders: Vec<Reminder>,
    runs: Vec<Run>,
    targets: Vec<Vec<RunTarget>>,
    events: Vec<Event>,
}

pub(super) async fn snapshot(s: &S) -> Snapshot {
    let runs = s
        .list_runs(&RunFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .expect("list runs");
    let mut targets = Vec::new();
    for r in &runs {
        targets.push(
            s.list_targets(r.id, None, None, 100_000)
                .await
                .expect("list targets"),
        );
    }
    Snapshot {
        accounts: s.list_accounts().await.expect("list accounts"),
        reminders: s
            .list_reminders(&ReminderFilter::default())
            .await
            .expect("list reminders"),
        runs,
        targets,
        events: s.events_after(0, 10_000).await.expect("events"),
    }
}

pub(super) fn assert_invalid<T: std::fmt::Debug>(r: StoreResult<T>, field: &str) {
    match r {
        Err(StoreError::Invalid(e)) => assert_eq!(e.field, field, "wrong field in {e}"),
        other => panic!("expected Invalid({field}), got {other:?}"),
    }
}

pub(super) fn assert_conflict<T: std::fmt::Debug>(r: StoreResult<T>) {
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "expected Conflict, got {r:?}"
    );
}

pub(super) fn assert_not_found<T: std::fmt::Debug>(r: StoreResult<T>) {
    assert!(
        matches!(r, Err(StoreError::NotFound(_))),
        "expected NotFound, got {r:?}"
    );
}
