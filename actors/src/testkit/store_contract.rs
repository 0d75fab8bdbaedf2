//! The contract every [`Store`] must meet, written once against
//! `Arc<dyn Store>`: the sqlx store runs it on SQLite and PostgreSQL, the
//! memory store runs it too.
//!
//! Each `pub async fn` is one test and takes a brand-new, empty store.
//! [`run_all`] runs them all in order, naming each on stderr, so a failure
//! points at the test that broke.
//!
//! Conventions the suite pins down where the trait's docs are silent:
//! - positions (reminder parts and targets, run targets) count from 0;
//! - lists of accounts are ordered by id, reminders by id ascending, runs
//!   newest first, unfinished runs oldest first;
//! - a `limit` of 0 means "no limit";
//! - instants round-trip exactly at microsecond precision (the suite only
//!   uses whole seconds);
//! - an unknown target id in a transition batch fails the whole batch with
//!   NotFound;
//! - deleting an account takes its archived reminders (and their runs) along.

use crate::domain::*;
use crate::ports::*;
use chrono::{DateTime, Duration, Utc};
use std::future::Future;
use std::sync::Arc;

type S = Arc<dyn Store>;

/// Runs every test, each on a store from `fresh`.
pub async fn run_all<F, Fut>(fresh: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    macro_rules! tests {
        ($($t:ident),+ $(,)?) => {
            $(
                let store = fresh().await;
                eprintln!("store contract [{}]: {}", store.backend(), stringify!($t));
                $t(store).await;
            )+
        };
    }
    tests!(
        accounts_crud,
        account_delete_rules,
        media_is_idempotent,
        upload_handles,
        reminders_round_trip,
        rejected_writes_change_nothing,
        create_run_is_idempotent,
        create_run_under_concurrent_callers,
        create_runs_is_create_run_for_each,
        create_runs_under_concurrent_callers,
        create_targets_is_idempotent,
        chosen_targets_keep_how_they_were_chosen,
        transitions_follow_the_rules,
        a_thousand_transitions_in_one_batch,
        transition_batches_are_atomic,
        resume_after_crash,
        update_run_changes_only_given_fields,
        update_run_is_compare_and_set,
        a_stop_request_is_kept_until_a_retry,
        finishing_skips_open_targets_in_the_same_write,
        target_marks_apply_only_from_their_statuses,
        sent_since_reads_recent_sends_of_one_account,
        list_runs_filters_and_paging,
        events_append_and_read,
        events_append_in_batches,
        group_directory_sync,
        group_listing_filters_and_pages,
        group_labels,
        reminder_summaries_page_by_id,
        accounts_page_by_id,
        reminder_schedules_read_changes_since_a_version,
        the_change_feed_misses_no_write_under_concurrent_writers,
        prune_runs_keeps_unfinished_and_newest_runs,
        prune_events_records_how_far_it_went,
        prune_media_deletes_only_what_no_reminder_uses,
    );
}

// ---------------------------------------------------------------- fixtures

fn t0() -> DateTime<Utc> {
    "2026-03-02T01:00:00Z".parse().expect("valid instant")
}

/// `t0` plus `n` minutes.
fn at(n: i64) -> DateTime<Utc> {
    t0() + Duration::minutes(n)
}

fn aid(s: &str) -> AccountId {
    AccountId::parse(s).expect("valid account id")
}

fn new_account(id: &str) -> NewAccount {
    NewAccount {
        id: aid(id),
        name: format!("Account {id}"),
        kind: GatewayKind::Simulator,
        state: AccountState::Connected,
        limits: AccountLimits::default(),
    }
}

async fn account(s: &S, id: &str) -> AccountId {
    s.create_account(&new_account(id), t0())
        .await
        .expect("create account");
    aid(id)
}

fn group(i: usize) -> GroupJid {
    GroupJid::parse(&format!("120363{i:012}@g.us")).expect("valid group")
}

fn groups(range: std::ops::Range<usize>) -> Vec<GroupJid> {
    range.map(group).collect()
}

fn text(s: &str) -> MessagePart {
    MessagePart::text(s).expect("valid text")
}

fn media_info(bytes: &[u8], filename: &str) -> MediaInfo {
    MediaInfo {
        id: MediaId::of_bytes(bytes),
        mime: "image/png".into(),
        size: bytes.len() as u64,
        filename: Some(filename.into()),
        created_at: t0(),
    }
}

async fn media(s: &S, bytes: &[u8]) -> MediaId {
    s.put_media(&media_info(bytes, "picture.png"))
        .await
        .expect("put media")
        .id
}

fn spec(
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

async fn reminder(s: &S, account: &AccountId, targets: usize) -> Reminder {
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
async fn run(s: &S, r: &Reminder, minute: i64, status: RunStatus) -> Run {
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

async fn all_targets(s: &S, run: RunId) -> Vec<RunTarget> {
    s.list_targets(run, None, None, 0)
        .await
        .expect("list targets")
}

async fn targets(s: &S, run: RunId, n: usize) -> Vec<RunTarget> {
    s.create_targets(run, &groups(0..n))
        .await
        .expect("create targets");
    let ts = all_targets(s, run).await;
    assert_eq!(ts.len(), n);
    ts
}

async fn counts(s: &S, run: RunId) -> TargetCounts {
    s.get_run(run)
        .await
        .expect("get run")
        .expect("run exists")
        .counts
}

fn counts_of(pending: u32, sending: u32, sent: u32, failed: u32, skipped: u32) -> TargetCounts {
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
struct Snapshot {
    accounts: Vec<Account>,
    reminders: Vec<Reminder>,
    runs: Vec<Run>,
    targets: Vec<Vec<RunTarget>>,
    events: Vec<Event>,
}

async fn snapshot(s: &S) -> Snapshot {
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

fn assert_invalid<T: std::fmt::Debug>(r: StoreResult<T>, field: &str) {
    match r {
        Err(StoreError::Invalid(e)) => assert_eq!(e.field, field, "wrong field in {e}"),
        other => panic!("expected Invalid({field}), got {other:?}"),
    }
}

fn assert_conflict<T: std::fmt::Debug>(r: StoreResult<T>) {
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "expected Conflict, got {r:?}"
    );
}

fn assert_not_found<T: std::fmt::Debug>(r: StoreResult<T>) {
    assert!(
        matches!(r, Err(StoreError::NotFound(_))),
        "expected NotFound, got {r:?}"
    );
}

// ---------------------------------------------------------------- accounts

pub async fn accounts_crud(s: S) {
    s.ping().await.expect("ping");
    assert!(s.list_accounts().await.unwrap().is_empty());

    let mut b = new_account("b-2");
    b.kind = GatewayKind::Whatsapp;
    b.state = AccountState::Pairing;
    b.limits = AccountLimits {
        max_per_minute: Some(20),
        group_concurrency: None,
        daily_cap: Some(5000),
        hourly_cap: Some(400),
        timezone: Some(TimeZone::parse("Asia/Kuala_Lumpur").unwrap()),
        new_number: true,
    };
    let created = s.create_account(&b, at(1)).await.unwrap();
    assert_eq!(
        created,
        Account {
            id: b.id.clone(),
            name: b.name.clone(),
            kind: GatewayKind::Whatsapp,
            state: AccountState::Pairing,
            state_reason: None,
            state_until: None,
            limits: b.limits.clone(),
            created_at: at(1),
            incident_at: None,
        }
    );
    // A state that ends by itself keeps its end; any other clears it.
    let banned = s
        .set_account_state_until(&b.id, AccountState::Banned, Some("banned"), Some(at(30)))
        .await
        .unwrap();
    assert_eq!(
        (banned.state, banned.state_until),
        (AccountState::Banned, Some(at(30)))
    );
    assert_eq!(
        s.get_account(&b.id).await.unwrap().unwrap().state_until,
        Some(at(30)),
        "a temporary ban's end is kept with the account"
    );
    let back = s
        .set_account_state(&b.id, AccountState::Pairing, None)
        .await
        .unwrap();
    assert_eq!(
        (back.state, back.state_until),
        (AccountState::Pairing, None)
    );
    s.record_incident(&b.id, at(2)).await.unwrap();
    assert_eq!(
        s.get_account(&b.id).await.unwrap().unwrap().incident_at,
        Some(at(2)),
        "an incident restarts the warm-up from its time"
    );
    s.record_incident(&b.id, at(1)).await.unwrap();
    let created = Account {
        incident_at: Some(at(1)),
        ..created
    };
    assert_eq!(s.get_account(&b.id).await.unwrap(), Some(created.clone()));
    assert_eq!(s.get_account(&aid("nobody")).await.unwrap(), None);

    let a = account(&s, "a-1").await;
    let ids: Vec<AccountId> = s
        .list_accounts()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, vec![a.clone(), b.id.clone()], "listed by id");

    // A taken id is a conflict and the first account stays as it was.
    let mut dup = new_account("b-2");
    dup.name = "Impostor".into();
    assert_conflict(s.create_account(&dup, at(2)).await);
    assert_eq!(s.get_account(&b.id).await.unwrap(), Some(created.clone()));

    let limits = AccountLimits {
        max_per_minute: Some(30),
        group_concurrency: Some(2),
        daily_cap: None,
        hourly_cap: Some(100),
        timezone: Some(TimeZone::parse("Europe/London").unwrap()),
        new_number: false,
    };
    let updated = s.update_account_limits(&a, &limits).await.unwrap();
    assert_eq!(updated.limits, limits);
    assert_eq!(s.get_account(&a).await.unwrap().unwrap().limits, limits);
    let cleared = s
        .update_account_limits(&a, &AccountLimits::default())
        .await
        .unwrap();
    assert_eq!(cleared.limits, AccountLimits::default());

    let banned = s
        .set_account_state(&a, AccountState::Banned, Some("temporary ban until 10:00"))
        .await
        .unwrap();
    assert_eq!(banned.state, AccountState::Banned);
    assert_eq!(
        banned.state_reason.as_deref(),
        Some("temporary ban until 10:00")
    );
    assert_eq!(s.get_account(&a).await.unwrap(), Some(banned));
    let back = s
        .set_account_state(&a, AccountState::Connected, None)
        .await
        .unwrap();
    assert_eq!(back.state, AccountState::Connected);
    assert_eq!(
        back.state_reason, None,
        "a new state without a reason clears it"
    );

    let ghost = aid("ghost");
    assert_not_found(s.update_account_limits(&ghost, &limits).await);
    assert_not_found(
        s.set_account_state(&ghost, AccountState::Connected, None)
            .await,
    );
    assert_not_found(s.delete_account(&ghost).await);
    assert_eq!(
        s.get_account(&ghost).await.unwrap(),
        None,
        "nothing created"
    );

    s.delete_account(&a).await.unwrap();
    assert_eq!(s.get_account(&a).await.unwrap(), None);
    assert_eq!(s.list_accounts().await.unwrap(), vec![created]);
}

pub async fn account_delete_rules(s: S) {
    let a = account(&s, "sales-1").await;
    let m = media(&s, b"logo").await;
    let r = reminder(&s, &a, 3).await;
    let other = account(&s, "other").await;
    let kept = reminder(&s, &other, 1).await;
    s.put_upload_handle(
        &a,
        &m,
        &UploadHandle {
            handle: "h".into(),
            expires_at: at(60),
        },
    )
    .await
    .unwrap();

    for state in [ReminderState::Active, ReminderState::Paused] {
        s.set_reminder_state(r.id, state, at(1)).await.unwrap();
        let before = snapshot(&s).await;
        assert_conflict(s.delete_account(&a).await);
        assert_eq!(
            snapshot(&s).await,
            before,
            "refused delete ({state}) wrote something"
        );
    }

    s.set_reminder_state(r.id, ReminderState::Archived, at(2))
        .await
        .unwrap();
    run(&s, &r, 0, RunStatus::Success).await;
    s.delete_account(&a).await.unwrap();
    assert_eq!(s.get_account(&a).await.unwrap(), None);
    assert_eq!(
        s.get_reminder(r.id).await.unwrap(),
        None,
        "archived reminder goes too"
    );
    let left = s.list_reminders(&ReminderFilter::default()).await.unwrap();
    assert_eq!(left, vec![kept], "other accounts' reminders stay");
    let runs = s
        .list_runs(&RunFilter {
            reminder_id: Some(r.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        runs.is_empty(),
        "runs of deleted reminders go too: {runs:?}"
    );

    // The id is free again, with no stale upload handle attached.
    account(&s, "sales-1").await;
    assert_eq!(s.get_upload_handle(&a, &m).await.unwrap(), None);
}

// ---------------------------------------------------------------- media

pub async fn media_is_idempotent(s: S) {
    let first = media_info(b"a picture", "first.png");
    assert_eq!(s.get_media(&first.id).await.unwrap(), None);
    assert_eq!(s.put_media(&first).await.unwrap(), first);

    let mut again = media_info(b"a picture", "second.png");
    again.created_at = at(5);
    assert_eq!(
        s.put_media(&again).await.unwrap(),
        first,
        "the same bytes return the first record"
    );
    assert_eq!(s.get_media(&first.id).await.unwrap(), Some(first.clone()));

    let mut other = media_info(b"another picture", "x.jpg");
    other.mime = "image/jpeg".into();
    other.filename = None;
    assert_eq!(s.put_media(&other).await.unwrap(), other);
    assert_eq!(s.get_media(&other.id).await.unwrap(), Some(other));
    assert_eq!(s.get_media(&first.id).await.unwrap(), Some(first));
}

pub async fn upload_handles(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let m = media(&s, b"picture").await;
    assert_eq!(s.get_upload_handle(&a, &m).await.unwrap(), None);

    let h1 = UploadHandle {
        handle: "mmg/abc".into(),
        expires_at: at(60),
    };
    s.put_upload_handle(&a, &m, &h1).await.unwrap();
    assert_eq!(s.get_upload_handle(&a, &m).await.unwrap(), Some(h1));
    assert_eq!(
        s.get_upload_handle(&b, &m).await.unwrap(),
        None,
        "handles are per account"
    );

    let h2 = UploadHandle {
        handle: "mmg/def".into(),
        expires_at: at(120),
    };
    s.put_upload_handle(&a, &m, &h2).await.unwrap();
    assert_eq!(
        s.get_upload_handle(&a, &m).await.unwrap(),
        Some(h2.clone()),
        "replaced"
    );

    let unknown_media = MediaId::of_bytes(b"never stored");
    assert!(s.put_upload_handle(&a, &unknown_media, &h2).await.is_err());
    assert_eq!(s.get_upload_handle(&a, &unknown_media).await.unwrap(), None);
    let ghost = aid("ghost");
    assert!(s.put_upload_handle(&ghost, &m, &h2).await.is_err());
    assert_eq!(s.get_upload_handle(&ghost, &m).await.unwrap(), None);
}

// ---------------------------------------------------------------- reminders

pub async fn reminders_round_trip(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let pic = media(&s, b"picture").await;
    let doc = media(&s, b"poster").await;
    let parts = vec![
        text("Reminder: standup"),
        MessagePart::media(pic.clone(), Some("Today's agenda")).unwrap(),
        MessagePart::media(doc.clone(), None).unwrap(),
        text("See you there"),
    ];
    let targets = vec![group(7), group(3), group(9), group(1), group(5)];
    let first = spec(&a, "Monday standup", parts.clone(), targets.clone());
    let r1 = s.create_reminder(&first, at(1)).await.unwrap();
    assert!(r1.id > 0);
    assert_eq!(r1.state, ReminderState::Active);
    assert_eq!(r1.spec, first, "parts and targets kept in order");
    assert_eq!((r1.created_at, r1.updated_at), (at(1), at(1)));
    assert_eq!(s.get_reminder(r1.id).await.unwrap(), Some(r1.clone()));

    let mut second = spec(&b, "Fortnightly", vec![text("hello")], groups(0..1000));
    second.schedule = Schedule::once("2026-12-01T09:00").unwrap();
    second.timezone = TimeZone::parse("Europe/London").unwrap();
    second.window = WindowHours::parse(22, 6).unwrap();
    second.resume_next_window = true;
    // The "no two groups alike" option survives the round trip.
    second.unique_texts = true;
    // So does a target selector.
    second.select = Some(
        serde_json::from_value::<SelectorRequest>(serde_json::json!({
            "all": true, "labels": ["east", "vip"], "name": "kl-*",
            "exclude": ["120363000000009999@g.us"],
        }))
        .unwrap()
        .parse(&second.targets)
        .unwrap(),
    );
    let r2 = s.create_reminder(&second, at(2)).await.unwrap();
    assert!(r2.id > r1.id);
    assert_eq!(s.get_reminder(r2.id).await.unwrap(), Some(r2.clone()));
    let r2 = s
        .set_reminder_state(r2.id, ReminderState::Paused, at(3))
        .await
        .unwrap();
    assert_eq!(r2.state, ReminderState::Paused);
    assert_eq!((r2.created_at, r2.updated_at), (at(2), at(3)));
    assert_eq!(r2.spec, second);

    let list = |account: Option<&AccountId>, state: Option<ReminderState>| {
        let s = s.clone();
        let f = ReminderFilter {
            account_id: account.cloned(),
            state,
        };
        async move { s.list_reminders(&f).await.unwrap() }
    };
    assert_eq!(list(None, None).await, vec![r1.clone(), r2.clone()]);
    assert_eq!(list(Some(&a), None).await, vec![r1.clone()]);
    assert_eq!(
        list(None, Some(ReminderState::Paused)).await,
        vec![r2.clone()]
    );
    assert_eq!(list(Some(&a), Some(ReminderState::Paused)).await, vec![]);
    assert_eq!(
        list(Some(&b), Some(ReminderState::Paused)).await,
        vec![r2.clone()]
    );

    // An update replaces parts and targets wholesale and keeps the state.
    let mut changed = spec(
        &b,
        "Monday standup (moved)",
        vec![
            MessagePart::media(doc, Some("new poster")).unwrap(),
            text("Now at 10"),
        ],
        vec![group(9), group(2), group(7)],
    );
    changed.window = WindowHours::parse(8, 20).unwrap();
    let u1 = s.update_reminder(r1.id, &changed, at(10)).await.unwrap();
    assert_eq!(u1.id, r1.id);
    assert_eq!(u1.spec, changed);
    assert_eq!(u1.state, ReminderState::Active);
    assert_eq!((u1.created_at, u1.updated_at), (at(1), at(10)));
    assert_eq!(s.get_reminder(r1.id).await.unwrap(), Some(u1.clone()));
    assert_eq!(list(Some(&b), None).await, vec![u1.clone(), r2.clone()]);

    let paused_update = s.update_reminder(r2.id, &first, at(11)).await.unwrap();
    assert_eq!(
        paused_update.state,
        ReminderState::Paused,
        "update keeps the state"
    );
    assert_eq!(s.get_reminder(r2.id).await.unwrap(), Some(paused_update));

    let archived = s
        .set_reminder_state(r1.id, ReminderState::Archived, at(12))
        .await
        .unwrap();
    assert_eq!(archived.state, ReminderState::Archived);
    assert_eq!(archived.spec, changed);
    assert_eq!(s.get_reminder(r1.id).await.unwrap(), Some(archived));

    let missing = r2.id + 1000;
    assert_eq!(s.get_reminder(missing).await.unwrap(), None);
    assert_not_found(s.update_reminder(missing, &first, at(13)).await);
    assert_not_found(
        s.set_reminder_state(missing, ReminderState::Paused, at(13))
            .await,
    );
    assert_eq!(s.get_reminder(missing).await.unwrap(), None);
}

pub async fn rejected_writes_change_nothing(s: S) {
    let a = account(&s, "a").await;
    let pic = media(&s, b"picture").await;
    let r = reminder(&s, &a, 4).await;
    let done = run(&s, &r, 0, RunStatus::Success).await;
    let ts = targets(&s, done.id, 4).await;
    let busy_reminder = reminder(&s, &a, 2).await;
    let busy = run(&s, &busy_reminder, 5, RunStatus::Queued).await;
    s.append_event(&NewEvent {
        at: at(1),
        kind: "run_started",
        account_id: Some(a.clone()),
        run_id: Some(done.id),
        data: serde_json::json!({"targets": 4}),
    })
    .await
    .unwrap();
    let ghost_media = MediaId::of_bytes(b"never uploaded");

    let before = snapshot(&s).await;
    macro_rules! unchanged {
        ($what:expr) => {
            assert_eq!(snapshot(&s).await, before, "{} wrote something", $what)
        };
    }

    assert_conflict(s.create_account(&new_account("a"), at(9)).await);
    unchanged!("duplicate account");

    let unknown_account = spec(&aid("ghost"), "x", vec![text("x")], groups(0..3));
    assert_invalid(
        s.create_reminder(&unknown_account, at(9)).await,
        "account_id",
    );
    unchanged!("reminder for an unknown account");

    let unknown_media = spec(
        &a,
        "x",
        vec![
            MessagePart::media(pic.clone(), None).unwrap(),
            MessagePart::media(ghost_media.clone(), Some("hi")).unwrap(),
        ],
        groups(0..3),
    );
    assert_invalid(
        s.create_reminder(&unknown_media, at(9)).await,
        "parts[1].media",
    );
    unchanged!("reminder with unknown media");

    let bad_update = spec(
        &a,
        "changed",
        vec![
            text("a"),
            text("b"),
            MessagePart::media(ghost_media.clone(), None).unwrap(),
        ],
        groups(10..12),
    );
    assert_invalid(
        s.update_reminder(r.id, &bad_update, at(9)).await,
        "parts[2].media",
    );
    unchanged!("update with unknown media");
    assert_invalid(
        s.update_reminder(r.id, &unknown_account, at(9)).await,
        "account_id",
    );
    unchanged!("update to an unknown account");

    assert_conflict(s.delete_account(&a).await);
    unchanged!("delete of an account with live reminders");

    assert_not_found(
        s.create_targets(RunId(done.id.0 + 1000), &groups(0..3))
            .await,
    );
    unchanged!("targets for an unknown run");

    let batch = vec![
        Transition::Sending {
            target_id: ts[0].id,
            part: 0,
            message_id: "m-0".into(),
        },
        Transition::Failed {
            target_id: ts[1].id,
            error: "group not found".into(),
        },
        Transition::Requeue {
            target_id: ts[3].id + 100_000,
        },
    ];
    assert_not_found(s.apply_transitions(&batch).await);
    unchanged!("a batch with an unknown target");

    assert!(s
        .create_run(r.id + 1000, &a, at(30), RunStatus::Queued, None, at(30))
        .await
        .is_err());
    unchanged!("a run of an unknown reminder");

    // A reminder with a run in flight cannot change under it.
    let good_update = spec(&a, "changed", vec![text("new")], groups(20..22));
    for status in [
        RunStatus::Scheduled,
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Paused,
        RunStatus::Parked,
    ] {
        s.update_run(
            busy.id,
            &RunUpdate {
                status: Some(status),
                expect: RunStatus::ALL.to_vec(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let before = snapshot(&s).await;
        assert_conflict(
            s.update_reminder(busy_reminder.id, &good_update, at(9))
                .await,
        );
        assert_eq!(
            snapshot(&s).await,
            before,
            "update while {status} wrote something"
        );
    }
    s.update_run(
        busy.id,
        &RunUpdate {
            status: Some(RunStatus::Partial),
            expect: RunStatus::ALL.to_vec(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let updated = s
        .update_reminder(busy_reminder.id, &good_update, at(9))
        .await
        .expect("a finished run no longer blocks updates");
    assert_eq!(updated.spec, good_update);
}

// ---------------------------------------------------------------- runs

pub async fn create_run_is_idempotent(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 2).await;
    let other = reminder(&s, &a, 2).await;
    assert_eq!(s.last_scheduled_for(r.id).await.unwrap(), None);

    let first = s
        .create_run(r.id, &a, at(60), RunStatus::Queued, None, at(61))
        .await
        .unwrap();
    assert!(first.created);
    let run = first.run.clone();
    assert_eq!(
        (
            run.reminder_id,
            &run.account_id,
            run.scheduled_for,
            run.status
        ),
        (r.id, &a, at(60), RunStatus::Queued)
    );
    assert_eq!(run.counts, TargetCounts::default());
    assert_eq!(
        (run.window_end_at, &run.forecast, &run.error_summary),
        (None, &None, &None)
    );
    assert_eq!(
        (run.created_at, run.started_at, run.finished_at),
        (at(61), None, None)
    );
    assert_eq!(s.get_run(run.id).await.unwrap(), Some(run.clone()));

    // The same occurrence again (a restart, another node): not created, and
    // the stored run is returned untouched.
    let again = s
        .create_run(r.id, &a, at(60), RunStatus::Missed, Some("late"), at(70))
        .await
        .unwrap();
    assert_eq!(
        again,
        RunCreated {
            run: run.clone(),
            created: false
        }
    );

    let missed = s
        .create_run(
            r.id,
            &a,
            at(120),
            RunStatus::Missed,
            Some("MISSED_WINDOW: picked up 7 minutes late"),
            at(127),
        )
        .await
        .unwrap();
    assert!(missed.created);
    assert_ne!(missed.run.id, run.id);
    assert_eq!(missed.run.status, RunStatus::Missed);
    assert_eq!(
        missed.run.error_summary.as_deref(),
        Some("MISSED_WINDOW: picked up 7 minutes late")
    );

    // The same instant for another reminder is another occurrence.
    let o = s
        .create_run(other.id, &a, at(60), RunStatus::Queued, None, at(61))
        .await
        .unwrap();
    assert!(o.created);

    assert_eq!(s.last_scheduled_for(r.id).await.unwrap(), Some(at(120)));
    assert_eq!(s.last_scheduled_for(other.id).await.unwrap(), Some(at(60)));
    let all = s.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(s.get_run(RunId(o.run.id.0 + 1000)).await.unwrap(), None);
}

pub async fn create_run_under_concurrent_callers(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 2).await;
    for round in 0..3 {
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let s = s.clone();
                let a = a.clone();
                tokio::spawn(async move {
                    s.create_run(r.id, &a, at(round), RunStatus::Queued, None, at(i))
                        .await
                })
            })
            .collect();
        let mut winners = 0;
        let mut ids = std::collections::HashSet::new();
        for t in tasks {
            let c = t.await.expect("task").expect("create_run under contention");
            winners += usize::from(c.created);
            ids.insert(c.run.id);
        }
        assert_eq!(
            winners, 1,
            "round {round}: exactly one caller fires the occurrence"
        );
        assert_eq!(ids.len(), 1, "round {round}: everyone sees the same run");
        let runs = s
            .list_runs(&RunFilter {
                reminder_id: Some(r.id),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(runs.len(), round as usize + 1, "one row per occurrence");
    }
}

fn new_run(r: &Reminder, minute: i64, status: RunStatus, summary: Option<&str>) -> NewRun {
    NewRun {
        reminder_id: r.id,
        account_id: r.spec.account_id.clone(),
        scheduled_for: at(minute),
        status,
        error_summary: summary.map(str::to_owned),
    }
}

pub async fn create_runs_is_create_run_for_each(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 2).await;
    let other = reminder(&s, &a, 2).await;
    assert!(s.create_runs(&[], at(1)).await.unwrap().is_empty());
    let existing = run(&s, &r, 60, RunStatus::Queued).await;

    let batch = vec![
        new_run(&other, 60, RunStatus::Queued, None),
        // There already: returned untouched.
        new_run(&r, 60, RunStatus::Missed, Some("late")),
        new_run(
            &r,
            120,
            RunStatus::Missed,
            Some("MISSED_WINDOW: 7 min late"),
        ),
        // The first element's occurrence again: it was this call's, once.
        new_run(&other, 60, RunStatus::Missed, Some("again")),
        new_run(&r, 180, RunStatus::Scheduled, None),
    ];
    let got = s.create_runs(&batch, at(121)).await.unwrap();
    assert_eq!(got.len(), batch.len(), "one result per input");
    assert_eq!(
        got.iter().map(|c| c.created).collect::<Vec<_>>(),
        vec![true, false, true, false, true]
    );
    for (c, n) in got.iter().zip(&batch) {
        assert_eq!(
            (c.run.reminder_id, c.run.scheduled_for),
            (n.reminder_id, n.scheduled_for),
            "results follow the input's order"
        );
        assert_eq!(
            s.get_run(c.run.id).await.unwrap().as_ref(),
            Some(&c.run),
            "returned as stored"
        );
    }
    assert_eq!(got[1].run, existing);
    assert_eq!(got[3].run, got[0].run);
    for i in [0, 2, 4] {
        let (run, n) = (&got[i].run, &batch[i]);
        assert_eq!(
            (
                &run.account_id,
                run.status,
                &run.error_summary,
                run.created_at
            ),
            (&a, n.status, &n.error_summary, at(121))
        );
        assert_eq!(run.counts, TargetCounts::default());
        assert_eq!(
            (
                run.window_end_at,
                &run.forecast,
                run.started_at,
                run.finished_at
            ),
            (None, &None, None, None)
        );
    }
    let all = s.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(all.len(), 4, "one row per occurrence: {all:?}");
    assert_eq!(s.last_scheduled_for(r.id).await.unwrap(), Some(at(180)));

    // The whole batch again: nothing new, the same runs.
    let again = s.create_runs(&batch, at(200)).await.unwrap();
    assert!(again.iter().all(|c| !c.created));
    assert_eq!(
        again.iter().map(|c| &c.run).collect::<Vec<_>>(),
        got.iter().map(|c| &c.run).collect::<Vec<_>>()
    );

    // An unknown reminder fails the whole batch, which writes nothing.
    let before = snapshot(&s).await;
    let mut ghost = new_run(&r, 240, RunStatus::Queued, None);
    ghost.reminder_id = other.id + 1000;
    let bad = vec![
        new_run(&r, 300, RunStatus::Queued, None),
        ghost,
        new_run(&other, 300, RunStatus::Queued, None),
    ];
    match s.create_runs(&bad, at(300)).await {
        Err(StoreError::NotFound(what)) => {
            assert_eq!(what, format!("reminder {}", other.id + 1000))
        }
        other => panic!("expected NotFound naming the reminder, got {other:?}"),
    }
    assert_eq!(
        snapshot(&s).await,
        before,
        "a refused batch wrote something"
    );
}

pub async fn create_runs_under_concurrent_callers(s: S) {
    let a = account(&s, "a").await;
    let mut rs = Vec::new();
    for _ in 0..4 {
        rs.push(reminder(&s, &a, 1).await);
    }
    // Eight callers over overlapping stretches of 24 occurrences (4
    // reminders × minutes 0..6), half of them in reverse order.
    let all: Vec<NewRun> = (0..6)
        .flat_map(|m| {
            rs.iter()
                .map(move |r| new_run(r, m, RunStatus::Queued, None))
        })
        .collect();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let mut batch: Vec<NewRun> = all.iter().skip(i * 2).take(12).cloned().collect();
            if i % 2 == 1 {
                batch.reverse();
            }
            let s = s.clone();
            tokio::spawn(async move {
                let got = s.create_runs(&batch, at(i as i64)).await;
                (batch, got)
            })
        })
        .collect();
    let mut winners: std::collections::HashMap<(i64, DateTime<Utc>), usize> = Default::default();
    let mut ids: std::collections::HashMap<(i64, DateTime<Utc>), RunId> = Default::default();
    for t in tasks {
        let (batch, got) = t.await.expect("task");
        let got = got.expect("create_runs under contention");
        assert_eq!(got.len(), batch.len());
        for (n, c) in batch.iter().zip(got) {
            let key = (n.reminder_id, n.scheduled_for);
            assert_eq!(
                (c.run.reminder_id, c.run.scheduled_for),
                key,
                "results follow the input's order"
            );
            *winners.entry(key).or_default() += usize::from(c.created);
            let id = *ids.entry(key).or_insert(c.run.id);
            assert_eq!(id, c.run.id, "everyone sees the same run for {key:?}");
        }
    }
    // Stretches start at 0, 2, …, 14 and take 12: all 24 are covered.
    assert_eq!(winners.len(), all.len());
    for (key, n) in &winners {
        assert_eq!(*n, 1, "{key:?}: exactly one caller fires the occurrence");
    }
    let runs = s
        .list_runs(&RunFilter {
            account_id: Some(a),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(runs.len(), all.len(), "one row per occurrence");
}

/// Targets picked by a selector keep how each was chosen, and a run's
/// targets, once created, are not changed by creating again.
pub async fn chosen_targets_keep_how_they_were_chosen(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 5).await;
    let first = run(&s, &r, 0, RunStatus::Running).await;
    let chosen = vec![
        (group(5), "explicit".to_owned()),
        (group(1), "label:east".to_owned()),
        (group(2), "name:kl-*".to_owned()),
    ];
    s.create_chosen_targets(first.id, &chosen).await.unwrap();
    s.create_chosen_targets(first.id, &chosen[1..])
        .await
        .unwrap();
    let got: Vec<_> = all_targets(&s, first.id)
        .await
        .into_iter()
        .map(|t| (t.group, t.chosen_by))
        .collect();
    assert_eq!(got, chosen);
    let plain = run(&s, &r, 1, RunStatus::Running).await;
    let ts = targets(&s, plain.id, 3).await;
    assert!(ts.iter().all(|t| t.chosen_by == "explicit"));
}

pub async fn create_targets_is_idempotent(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 5).await;
    let run = run(&s, &r, 0, RunStatus::Running).await;
    let gs = vec![group(50), group(10), group(40), group(20), group(30)];
    s.create_targets(run.id, &gs).await.unwrap();
    let ts = all_targets(&s, run.id).await;
    assert_eq!(ts.len(), 5);
    for (i, t) in ts.iter().enumerate() {
        assert_eq!(t.run_id, run.id);
        assert_eq!(t.position, i as u32, "positions count from 0 in order");
        assert_eq!(t.group, gs[i]);
        assert_eq!(t.status, TargetStatus::Pending);
        assert_eq!((t.parts_sent, t.attempts), (0, 0));
        assert_eq!(
            (&t.message_id, &t.error, t.sent_at, t.latency_ms),
            (&None, &None, None, None)
        );
    }

    s.create_targets(run.id, &gs).await.unwrap();
    assert_eq!(
        all_targets(&s, run.id).await,
        ts,
        "creating again changes nothing"
    );
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            let gs = gs.clone();
            tokio::spawn(async move { s.create_targets(run.id, &gs).await })
        })
        .collect();
    for t in racers {
        t.await.expect("task").expect("concurrent create_targets");
    }
    assert_eq!(
        all_targets(&s, run.id).await,
        ts,
        "concurrent creation changes nothing"
    );
    let mut other = gs.clone();
    other.reverse();
    other.push(group(60));
    s.create_targets(run.id, &other).await.unwrap();
    assert_eq!(
        all_targets(&s, run.id).await,
        ts,
        "a run's groups are written once: a different list changes nothing"
    );
    // Callers racing to freeze a fresh run with different lists: exactly
    // one list is stored, whole, never a mix of two.
    let fresh = self::run(&s, &r, 1, RunStatus::Queued).await;
    let lists: Vec<Vec<GroupJid>> = (0..4usize)
        .map(|k| (0..5 + k).map(|i| group(100 * (k + 1) + i)).collect())
        .collect();
    let racers: Vec<_> = lists
        .iter()
        .map(|l| {
            let (s, l) = (s.clone(), l.clone());
            tokio::spawn(async move { s.create_targets(fresh.id, &l).await })
        })
        .collect();
    for t in racers {
        t.await.expect("task").expect("racing create_targets");
    }
    let stored: Vec<GroupJid> = all_targets(&s, fresh.id)
        .await
        .into_iter()
        .map(|t| t.group)
        .collect();
    assert!(
        lists.contains(&stored),
        "one caller's list, whole: {stored:?}"
    );
    assert_eq!(counts(&s, run.id).await, counts_of(5, 0, 0, 0, 0));

    // Paging and filters.
    let page = s.list_targets(run.id, None, Some(1), 2).await.unwrap();
    assert_eq!(page, ts[2..4].to_vec());
    let rest = s.list_targets(run.id, None, Some(3), 0).await.unwrap();
    assert_eq!(rest, ts[4..].to_vec());
    s.apply_transitions(&[Transition::Failed {
        target_id: ts[1].id,
        error: "group not found".into(),
    }])
    .await
    .unwrap();
    let pending = s
        .list_targets(run.id, Some(TargetStatus::Pending), None, 0)
        .await
        .unwrap();
    assert_eq!(
        pending.iter().map(|t| t.position).collect::<Vec<_>>(),
        vec![0, 2, 3, 4]
    );
    let pending_after = s
        .list_targets(run.id, Some(TargetStatus::Pending), Some(0), 2)
        .await
        .unwrap();
    assert_eq!(
        pending_after.iter().map(|t| t.position).collect::<Vec<_>>(),
        vec![2, 3]
    );
    let other = reminder(&s, &a, 1).await;
    let empty_run = self::run(&s, &other, 0, RunStatus::Queued).await;
    assert!(
        all_targets(&s, empty_run.id).await.is_empty(),
        "targets belong to their run"
    );
}

pub async fn transitions_follow_the_rules(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 5).await;
    let run = run(&s, &r, 0, RunStatus::Running).await;
    let ts = targets(&s, run.id, 6).await;
    let id = |i: usize| ts[i].id;
    let get = |i: usize| {
        let s = s.clone();
        let run = run.id;
        async move {
            let mut t = s
                .list_targets(run, None, (i > 0).then(|| i as u32 - 1), 1)
                .await
                .unwrap();
            assert_eq!(t.len(), 1);
            let t = t.remove(0);
            assert_eq!(t.position, i as u32);
            t
        }
    };

    s.apply_transitions(&[Transition::Sending {
        target_id: id(0),
        part: 0,
        message_id: "HRLD-0-0".into(),
    }])
    .await
    .unwrap();
    let t = get(0).await;
    assert_eq!(t.status, TargetStatus::Sending);
    assert_eq!(t.message_id.as_deref(), Some("HRLD-0-0"));
    assert_eq!((t.attempts, t.parts_sent), (1, 0));
    assert_eq!(counts(&s, run.id).await, counts_of(5, 1, 0, 0, 0));

    // A part that is not the last goes back to pending, one part further on.
    s.apply_transitions(&[Transition::Sent {
        target_id: id(0),
        part: 0,
        last: false,
        at: at(1),
        latency_ms: 150,
    }])
    .await
    .unwrap();
    let t = get(0).await;
    assert_eq!(t.status, TargetStatus::Pending);
    assert_eq!((t.parts_sent, t.attempts), (1, 1));
    assert_eq!(
        t.message_id.as_deref(),
        Some("HRLD-0-0"),
        "the last message id stays"
    );
    assert_eq!((t.sent_at, t.latency_ms), (Some(at(1)), Some(150)));

    // Several steps of one target in one batch apply in order.
    s.apply_transitions(&[
        Transition::Sending {
            target_id: id(0),
            part: 1,
            message_id: "HRLD-0-1".into(),
        },
        Transition::Sent {
            target_id: id(0),
            part: 1,
            last: true,
            at: at(2),
            latency_ms: 90,
        },
        Transition::Sending {
            target_id: id(1),
            part: 0,
            message_id: "HRLD-1-0".into(),
        },
        Transition::Failed {
            target_id: id(1),
            error: "not a participant".into(),
        },
        Transition::Skipped {
            target_id: id(2),
            reason: "delivery window closed".into(),
        },
        Transition::Sending {
            target_id: id(3),
            part: 0,
            message_id: "HRLD-3-0".into(),
        },
        Transition::Failed {
            target_id: id(3),
            error: "transient: timeout".into(),
        },
        Transition::Requeue { target_id: id(3) },
        Transition::Sending {
            target_id: id(4),
            part: 0,
            message_id: "HRLD-4-0".into(),
        },
        Transition::Sent {
            target_id: id(4),
            part: 0,
            last: false,
            at: at(3),
            latency_ms: 70,
        },
        Transition::Sending {
            target_id: id(4),
            part: 1,
            message_id: "HRLD-4-1".into(),
        },
    ])
    .await
    .unwrap();

    let t = get(0).await;
    assert_eq!(t.status, TargetStatus::Sent);
    assert_eq!((t.parts_sent, t.attempts), (2, 2));
    assert_eq!(t.message_id.as_deref(), Some("HRLD-0-1"));
    assert_eq!((t.sent_at, t.latency_ms), (Some(at(2)), Some(90)));

    let t = get(1).await;
    assert_eq!(t.status, TargetStatus::Failed);
    assert_eq!(t.error.as_deref(), Some("not a participant"));
    assert_eq!((t.parts_sent, t.attempts), (0, 1));

    let t = get(2).await;
    assert_eq!(t.status, TargetStatus::Skipped);
    assert_eq!(t.error.as_deref(), Some("delivery window closed"));
    assert_eq!((t.attempts, &t.message_id), (0, &None));

    let t = get(3).await;
    assert_eq!(t.status, TargetStatus::Pending, "requeued");
    assert_eq!(t.error, None, "requeue clears the error");
    assert_eq!((t.parts_sent, t.attempts), (0, 1));
    assert_eq!(t.message_id.as_deref(), Some("HRLD-3-0"));

    let t = get(4).await;
    assert_eq!(t.status, TargetStatus::Sending);
    assert_eq!(t.message_id.as_deref(), Some("HRLD-4-1"));
    assert_eq!((t.parts_sent, t.attempts), (1, 2));

    assert_eq!(get(5).await, ts[5], "untouched");
    let expected = counts_of(2, 1, 1, 1, 1);
    assert_eq!(counts(&s, run.id).await, expected);
    let listed = s
        .list_runs(&RunFilter {
            reminder_id: Some(r.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].counts, expected);
    assert_eq!(listed[0].counts.total(), 6);

    s.apply_transitions(&[])
        .await
        .expect("an empty batch is fine");
    assert_eq!(counts(&s, run.id).await, expected);
}

pub async fn a_thousand_transitions_in_one_batch(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 1000).await;
    let run = run(&s, &r, 0, RunStatus::Running).await;
    let ts = targets(&s, run.id, 1000).await;

    let sending: Vec<Transition> = ts
        .iter()
        .map(|t| Transition::Sending {
            target_id: t.id,
            part: 0,
            message_id: format!("HRLD-{}", t.position),
        })
        .collect();
    s.apply_transitions(&sending).await.unwrap();
    assert_eq!(counts(&s, run.id).await, counts_of(0, 1000, 0, 0, 0));

    let finish: Vec<Transition> = ts
        .iter()
        .map(|t| match t.position % 4 {
            0 | 1 => Transition::Sent {
                target_id: t.id,
                part: 0,
                last: true,
                at: at(1),
                latency_ms: t.position,
            },
            2 => Transition::Failed {
                target_id: t.id,
                error: format!("failed {}", t.position),
            },
            _ => Transition::Skipped {
                target_id: t.id,
                reason: format!("skipped {}", t.position),
            },
        })
        .collect();
    s.apply_transitions(&finish).await.unwrap();
    assert_eq!(counts(&s, run.id).await, counts_of(0, 0, 500, 250, 250));
    // Requeue applies to failed and skipped targets; the sent ones stay.
    let requeue: Vec<Transition> = ts
        .iter()
        .filter(|t| t.position % 4 != 2)
        .map(|t| Transition::Requeue { target_id: t.id })
        .collect();
    s.apply_transitions(&requeue).await.unwrap();
    assert_eq!(counts(&s, run.id).await, counts_of(250, 0, 500, 250, 0));

    let after = all_targets(&s, run.id).await;
    assert_eq!(after.len(), 1000);
    for t in &after {
        assert_eq!(t.message_id, Some(format!("HRLD-{}", t.position)));
        assert_eq!(t.attempts, 1);
        match t.position % 4 {
            0 | 1 => {
                assert_eq!(t.status, TargetStatus::Sent);
                assert_eq!((t.parts_sent, t.latency_ms), (1, Some(t.position)));
            }
            2 => {
                assert_eq!(t.status, TargetStatus::Failed);
                assert_eq!(t.error, Some(format!("failed {}", t.position)));
            }
            _ => assert_eq!((t.status, t.parts_sent), (TargetStatus::Pending, 0)),
        }
    }
}

pub async fn transition_batches_are_atomic(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 300).await;
    let run = run(&s, &r, 0, RunStatus::Running).await;
    let ts = targets(&s, run.id, 300).await;
    let before = all_targets(&s, run.id).await;
    let missing = ts.iter().map(|t| t.id).max().unwrap() + 1_000_000;
    for position in [0, 150, 300] {
        let mut batch: Vec<Transition> = ts
            .iter()
            .map(|t| Transition::Sending {
                target_id: t.id,
                part: 0,
                message_id: format!("m-{}", t.id),
            })
            .collect();
        batch.insert(position, Transition::Requeue { target_id: missing });
        assert_not_found(s.apply_transitions(&batch).await);
        assert_eq!(
            all_targets(&s, run.id).await,
            before,
            "unknown target at {position}: nothing of the batch may stick"
        );
    }
}

pub async fn resume_after_crash(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let ra = reminder(&s, &a, 3).await;
    let rb = reminder(&s, &b, 3).await;
    let statuses = [
        (&ra, RunStatus::Success),
        (&rb, RunStatus::Queued),
        (&ra, RunStatus::Running),
        (&rb, RunStatus::Scheduled),
        (&ra, RunStatus::Missed),
        (&rb, RunStatus::Paused),
        (&ra, RunStatus::Queued),
        (&rb, RunStatus::Cancelled),
        (&ra, RunStatus::Partial),
        (&rb, RunStatus::Failed),
    ];
    let mut runs = Vec::new();
    for (i, (r, status)) in statuses.iter().enumerate() {
        runs.push(run(&s, r, i as i64, *status).await);
    }
    let running = &runs[2];
    let ts = targets(&s, running.id, 3).await;
    s.apply_transitions(&[
        Transition::Sending {
            target_id: ts[0].id,
            part: 0,
            message_id: "HRLD-a".into(),
        },
        Transition::Sent {
            target_id: ts[0].id,
            part: 0,
            last: true,
            at: at(3),
            latency_ms: 100,
        },
        Transition::Sending {
            target_id: ts[1].id,
            part: 0,
            message_id: "HRLD-b0".into(),
        },
        Transition::Sent {
            target_id: ts[1].id,
            part: 0,
            last: false,
            at: at(3),
            latency_ms: 100,
        },
        Transition::Sending {
            target_id: ts[1].id,
            part: 1,
            message_id: "HRLD-b1".into(),
        },
    ])
    .await
    .unwrap();

    let unfinished = s.unfinished_runs().await.unwrap();
    let got: Vec<(RunId, RunStatus)> = unfinished.iter().map(|r| (r.id, r.status)).collect();
    assert_eq!(
        got,
        vec![
            (runs[1].id, RunStatus::Queued),
            (runs[2].id, RunStatus::Running),
            (runs[5].id, RunStatus::Paused),
            (runs[6].id, RunStatus::Queued),
        ],
        "queued, running and paused runs, oldest first"
    );
    assert_eq!(unfinished[1].counts, counts_of(1, 1, 1, 0, 0));
    assert_eq!(unfinished[1].account_id, a);
    assert_eq!(unfinished[2].account_id, b);

    // A part left in `sending` is re-sent with the same id, after the
    // parts already accepted.
    let in_flight = s
        .list_targets(running.id, Some(TargetStatus::Sending), None, 0)
        .await
        .unwrap();
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].id, ts[1].id);
    assert_eq!(in_flight[0].message_id.as_deref(), Some("HRLD-b1"));
    assert_eq!(in_flight[0].parts_sent, 1);
    let to_do = s
        .list_targets(running.id, Some(TargetStatus::Pending), None, 0)
        .await
        .unwrap();
    assert_eq!(
        to_do.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![ts[2].id]
    );

    // Finishing them empties the resume list.
    for r in &unfinished {
        s.update_run(
            r.id,
            &RunUpdate {
                status: Some(RunStatus::Cancelled),
                expect: RunStatus::ALL.to_vec(),
                finished_at: Some(at(100)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    assert!(s.unfinished_runs().await.unwrap().is_empty());
}

pub async fn update_run_changes_only_given_fields(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 3).await;
    let run = run(&s, &r, 0, RunStatus::Queued).await;
    let other = self::run(&s, &r, 1, RunStatus::Queued).await;

    s.update_run(
        run.id,
        &RunUpdate {
            status: Some(RunStatus::Running),
            expect: RunStatus::ALL.to_vec(),
            started_at: Some(at(2)),
            window_end_at: Some(at(600)),
            forecast: Some("1000 messages at 40/min: about 25 minutes, fits".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let started = s.get_run(run.id).await.unwrap().unwrap();
    assert_eq!(
        started,
        Run {
            status: RunStatus::Running,
            started_at: Some(at(2)),
            window_end_at: Some(at(600)),
            forecast: Some("1000 messages at 40/min: about 25 minutes, fits".into()),
            ..run.clone()
        }
    );

    let summary =
        "Delivery window closed at 18:00 (Asia/Kuala_Lumpur). 412 of 1000 groups delivered.";
    s.update_run(
        run.id,
        &RunUpdate {
            status: Some(RunStatus::Partial),
            expect: RunStatus::ALL.to_vec(),
            finished_at: Some(at(601)),
            error_summary: Some(summary.into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let finished = s.get_run(run.id).await.unwrap().unwrap();
    assert_eq!(
        finished,
        Run {
            status: RunStatus::Partial,
            finished_at: Some(at(601)),
            error_summary: Some(summary.into()),
            ..started
        }
    );
    s.update_run(run.id, &RunUpdate::default()).await.unwrap();
    assert_eq!(
        s.get_run(run.id).await.unwrap().unwrap(),
        finished,
        "an empty update is a no-op"
    );
    assert_eq!(
        s.get_run(other.id).await.unwrap().unwrap(),
        other,
        "other runs untouched"
    );
    assert_not_found(
        s.update_run(RunId(other.id.0 + 1000), &RunUpdate::default())
            .await,
    );
}

pub async fn update_run_is_compare_and_set(s: S) {
    use crate::lifecycle::RunEvent;
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 3).await;
    let run = run(&s, &r, 0, RunStatus::Queued).await;
    let before = snapshot(&s).await;
    // A status change must name the statuses it expects.
    let bare = RunUpdate {
        status: Some(RunStatus::Running),
        ..Default::default()
    };
    assert!(matches!(
        s.update_run(run.id, &bare).await,
        Err(StoreError::Invalid(_))
    ));
    // Resume expects `paused`; the run is `queued`: refused, naming it.
    match s.update_run(run.id, &RunEvent::Resume.update()).await {
        Err(StoreError::Conflict(why)) => assert!(why.contains("queued"), "{why}"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        snapshot(&s).await,
        before,
        "a lost compare-and-set wrote something"
    );
    s.update_run(run.id, &RunEvent::Start.update())
        .await
        .unwrap();
    s.update_run(
        run.id,
        &RunEvent::Finish(RunStatus::Cancelled).finish_update(at(5), None, "stopped"),
    )
    .await
    .unwrap();
    // Two racing finishes: the second loses and changes nothing.
    let done = snapshot(&s).await;
    assert_conflict(
        s.update_run(
            run.id,
            &RunEvent::Finish(RunStatus::Success).finish_update(at(6), None, "x"),
        )
        .await,
    );
    assert_conflict(s.update_run(run.id, &RunEvent::Pause.update()).await);
    assert_eq!(snapshot(&s).await, done, "a finished run was resurrected");
}

pub async fn a_stop_request_is_kept_until_a_retry(s: S) {
    use crate::lifecycle::{retry_update, RunEvent, MAYBE_DELIVERED, UNFINISHED};
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 3).await;
    let run = run(&s, &r, 0, RunStatus::Running).await;
    assert_eq!(run.stop_requested_at, None);
    s.create_targets(run.id, &groups(0..2)).await.unwrap();
    let ts = s.list_targets(run.id, None, None, 0).await.unwrap();
    // Group 0's message was handed over; its answer never came.
    s.apply_transitions(&[Transition::Sending {
        target_id: ts[0].id,
        part: 0,
        message_id: "m0".into(),
    }])
    .await
    .unwrap();
    let stop = |t| RunUpdate {
        expect: UNFINISHED.to_vec(),
        stop_requested_at: Some(at(t)),
        ..Default::default()
    };
    s.update_run(run.id, &stop(2)).await.unwrap();
    let stored = s.get_run(run.id).await.unwrap().unwrap();
    assert_eq!(stored.stop_requested_at, Some(at(2)));
    assert_eq!(
        stored.status,
        RunStatus::Running,
        "a stop request is not a status"
    );
    // Other writes keep it; the run finishes cancelled with it.
    s.update_run(
        run.id,
        &RunEvent::Finish(RunStatus::Cancelled).finish_update(at(3), None, "stopped"),
    )
    .await
    .unwrap();
    let done = s.get_run(run.id).await.unwrap().unwrap();
    assert_eq!(done.stop_requested_at, Some(at(2)));
    // A finished run takes no stop request.
    assert_conflict(s.update_run(run.id, &stop(4)).await);
    // A retry forgets it, or the retried run would end at once; the group
    // whose message may have arrived goes back as sending, not pending.
    s.update_run(run.id, &retry_update()).await.unwrap();
    let retried = s.get_run(run.id).await.unwrap().unwrap();
    assert_eq!(retried.stop_requested_at, None);
    assert_eq!(retried.status, RunStatus::Queued);
    assert_eq!((retried.counts.sending, retried.counts.pending), (1, 1));
    let ts = s.list_targets(run.id, None, None, 0).await.unwrap();
    assert_eq!(ts[0].status, TargetStatus::Sending);
    assert_eq!(
        (ts[0].error.as_deref(), ts[0].message_id.as_deref()),
        (None, Some("m0"))
    );
    // Skipped again, it still says it may have been delivered.
    s.update_run(run.id, &RunEvent::Start.update())
        .await
        .unwrap();
    s.update_run(
        run.id,
        &RunEvent::Finish(RunStatus::Partial).finish_update(at(5), None, "delivery window closed"),
    )
    .await
    .unwrap();
    let ts = s.list_targets(run.id, None, None, 0).await.unwrap();
    let maybe = format!("delivery window closed{MAYBE_DELIVERED}");
    assert_eq!(ts[0].error.as_deref(), Some(maybe.as_str()));
    assert_eq!(ts[1].error.as_deref(), Some("delivery window closed"));
}

pub async fn finishing_skips_open_targets_in_the_same_write(s: S) {
    use crate::lifecycle::RunEvent;
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 3).await;
    let run = run(&s, &r, 0, RunStatus::Running).await;
    s.create_targets(run.id, &groups(0..3)).await.unwrap();
    let ts = s.list_targets(run.id, None, None, 0).await.unwrap();
    s.apply_transitions(&[
        Transition::Sending {
            target_id: ts[0].id,
            part: 0,
            message_id: "m0".into(),
        },
        Transition::Sent {
            target_id: ts[0].id,
            part: 0,
            last: true,
            at: at(3),
            latency_ms: 5,
        },
        Transition::Sending {
            target_id: ts[1].id,
            part: 0,
            message_id: "m1".into(),
        },
    ])
    .await
    .unwrap();
    s.update_run(
        run.id,
        &RunEvent::Finish(RunStatus::Cancelled).finish_update(at(4), None, "stopped by operator"),
    )
    .await
    .unwrap();
    let ts = s.list_targets(run.id, None, None, 0).await.unwrap();
    let statuses: Vec<_> = ts.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        [
            TargetStatus::Sent,
            TargetStatus::Skipped,
            TargetStatus::Skipped
        ]
    );
    // The target that was sending may have reached its group: it says so.
    let maybe = format!("stopped by operator{}", crate::lifecycle::MAYBE_DELIVERED);
    assert_eq!(ts[1].error.as_deref(), Some(maybe.as_str()));
    assert_eq!(ts[2].error.as_deref(), Some("stopped by operator"));
    let c = s.get_run(run.id).await.unwrap().unwrap().counts;
    assert_eq!((c.sent, c.skipped, c.pending, c.sending), (1, 2, 0, 0));
}

pub async fn target_marks_apply_only_from_their_statuses(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 3).await;
    let run = run(&s, &r, 0, RunStatus::Running).await;
    s.create_targets(run.id, &groups(0..2)).await.unwrap();
    let ts = s.list_targets(run.id, None, None, 0).await.unwrap();
    let sent = |id| Transition::Sent {
        target_id: id,
        part: 0,
        last: true,
        at: at(3),
        latency_ms: 1,
    };
    // `sent` without `sending` first is a stray mark: skipped.
    s.apply_transitions(&[sent(ts[0].id)]).await.unwrap();
    assert_eq!(
        s.list_targets(run.id, None, None, 0).await.unwrap()[0].status,
        TargetStatus::Pending
    );
    // A late `skipped` after `sent` cannot undo it; a requeue of a sent target does nothing.
    s.apply_transitions(&[
        Transition::Sending {
            target_id: ts[1].id,
            part: 0,
            message_id: "m".into(),
        },
        sent(ts[1].id),
    ])
    .await
    .unwrap();
    s.apply_transitions(&[
        Transition::Skipped {
            target_id: ts[1].id,
            reason: "late".into(),
        },
        Transition::Requeue {
            target_id: ts[1].id,
        },
    ])
    .await
    .unwrap();
    let t1 = &s.list_targets(run.id, None, None, 0).await.unwrap()[1];
    assert_eq!((t1.status, t1.error.as_deref()), (TargetStatus::Sent, None));
    let c = s.get_run(run.id).await.unwrap().unwrap().counts;
    assert_eq!(
        (c.sent, c.pending),
        (1, 1),
        "counts follow only applied marks"
    );
}

pub async fn sent_since_reads_recent_sends_of_one_account(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let ra = reminder(&s, &a, 2).await;
    let rb = reminder(&s, &b, 2).await;
    let runa = run(&s, &ra, 0, RunStatus::Running).await;
    let runb = run(&s, &rb, 0, RunStatus::Running).await;
    s.create_targets(runa.id, &groups(0..3)).await.unwrap();
    s.create_targets(runb.id, &groups(0..1)).await.unwrap();
    let ta = s.list_targets(runa.id, None, None, 0).await.unwrap();
    let tb = s.list_targets(runb.id, None, None, 0).await.unwrap();
    let mut marks = Vec::new();
    for (t, sec, last) in [(&ta[0], 10, true), (&ta[1], 70, false), (&tb[0], 80, true)] {
        marks.push(Transition::Sending {
            target_id: t.id,
            part: 0,
            message_id: format!("m{}", t.id),
        });
        marks.push(Transition::Sent {
            target_id: t.id,
            part: 0,
            last,
            at: at(sec),
            latency_ms: 1,
        });
    }
    s.apply_transitions(&marks).await.unwrap();
    let mut got = s.sent_since(&a, at(60)).await.unwrap();
    got.sort();
    assert_eq!(
        got,
        vec![(Some(at(70)), 1)],
        "only a's sends at or after the instant"
    );
    assert_eq!(s.sent_since(&a, at(0)).await.unwrap().len(), 2);
    // A target left `sending` (its answer lost) counts, time unknown.
    s.apply_transitions(&[Transition::Sending {
        target_id: ta[2].id,
        part: 0,
        message_id: "m-lost".into(),
    }])
    .await
    .unwrap();
    let mut got = s.sent_since(&a, at(60)).await.unwrap();
    got.sort();
    assert_eq!(got, vec![(None, 1), (Some(at(70)), 1)]);
}

pub async fn list_runs_filters_and_paging(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let ra = reminder(&s, &a, 2).await;
    let rb = reminder(&s, &b, 2).await;
    let mut runs_a = Vec::new();
    let mut runs_b = Vec::new();
    for i in 0..8 {
        let status = if i % 3 == 0 {
            RunStatus::Success
        } else {
            RunStatus::Partial
        };
        if i % 2 == 0 || i == 7 {
            runs_a.push(run(&s, &ra, i, status).await);
        } else {
            runs_b.push(run(&s, &rb, i, status).await);
        }
    }
    // Counts come along in lists, per run.
    let with_targets = runs_a[1].id;
    let ts = targets(&s, with_targets, 2).await;
    s.apply_transitions(&[Transition::Skipped {
        target_id: ts[0].id,
        reason: "delivery window closed".into(),
    }])
    .await
    .unwrap();

    let ids = |runs: &[Run]| runs.iter().map(|r| r.id).collect::<Vec<_>>();
    let newest_first = |runs: &[Run]| {
        let mut v = ids(runs);
        v.sort();
        v.reverse();
        v
    };
    let list = |f: RunFilter| {
        let s = s.clone();
        async move { s.list_runs(&f).await.unwrap() }
    };
    let all: Vec<Run> = runs_a.iter().chain(&runs_b).cloned().collect();
    let everything = list(RunFilter::default()).await;
    assert_eq!(
        ids(&everything),
        newest_first(&all),
        "limit 0 lists all, newest first"
    );
    let counted = everything.iter().find(|r| r.id == with_targets).unwrap();
    assert_eq!(counted.counts, counts_of(1, 0, 0, 0, 1));
    assert!(everything
        .iter()
        .filter(|r| r.id != with_targets)
        .all(|r| r.counts == TargetCounts::default()));

    let by_reminder = list(RunFilter {
        reminder_id: Some(ra.id),
        ..Default::default()
    })
    .await;
    assert_eq!(ids(&by_reminder), newest_first(&runs_a));
    let by_account = list(RunFilter {
        account_id: Some(b.clone()),
        ..Default::default()
    })
    .await;
    assert_eq!(ids(&by_account), newest_first(&runs_b));
    let successes: Vec<Run> = all
        .iter()
        .filter(|r| r.status == RunStatus::Success)
        .cloned()
        .collect();
    let by_status = list(RunFilter {
        status: Some(RunStatus::Success),
        ..Default::default()
    })
    .await;
    assert_eq!(ids(&by_status), newest_first(&successes));
    let combined = list(RunFilter {
        account_id: Some(a.clone()),
        status: Some(RunStatus::Partial),
        ..Default::default()
    })
    .await;
    let expected: Vec<Run> = runs_a
        .iter()
        .filter(|r| r.status == RunStatus::Partial)
        .cloned()
        .collect();
    assert_eq!(ids(&combined), newest_first(&expected));

    let top = list(RunFilter {
        limit: 3,
        ..Default::default()
    })
    .await;
    assert_eq!(ids(&top), newest_first(&all)[..3].to_vec());

    // Walk a reminder's runs two at a time with before_id.
    let mut walked = Vec::new();
    let mut before = None;
    loop {
        let page = list(RunFilter {
            reminder_id: Some(ra.id),
            before_id: before,
            limit: 2,
            ..Default::default()
        })
        .await;
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        before = Some(last.id.0);
        walked.extend(page);
    }
    assert_eq!(
        ids(&walked),
        newest_first(&runs_a),
        "paging visits each run once, in order"
    );
    assert_eq!(walked, by_reminder, "pages carry the same runs as one list");
}

// ---------------------------------------------------------------- events

pub async fn events_append_and_read(s: S) {
    assert!(s.events_after(0, 10).await.unwrap().is_empty());
    let a = account(&s, "a").await;
    let news = vec![
        NewEvent {
            at: at(1),
            kind: "run_started",
            account_id: Some(a.clone()),
            run_id: Some(RunId(7)),
            data: serde_json::json!({"targets": 1000, "title": "Standup ☕"}),
        },
        NewEvent {
            at: at(2),
            kind: "run_progress",
            account_id: Some(a.clone()),
            run_id: Some(RunId(7)),
            data: serde_json::json!({"sent": 412, "nested": {"list": [1, 2.5, null, "x"]}}),
        },
        NewEvent {
            at: at(3),
            kind: "account_state",
            account_id: None,
            run_id: None,
            data: serde_json::Value::Null,
        },
        NewEvent {
            at: at(4),
            kind: "run_finished",
            account_id: Some(a.clone()),
            run_id: Some(RunId(7)),
            data: serde_json::json!("412 of 1000 delivered"),
        },
        NewEvent {
            at: at(5),
            kind: "run_started",
            account_id: None,
            run_id: Some(RunId(8)),
            data: serde_json::json!([]),
        },
    ];
    let mut stored = Vec::new();
    for e in &news {
        let got = s.append_event(e).await.unwrap();
        assert_eq!(
            got,
            Event {
                id: got.id,
                at: e.at,
                kind: e.kind.to_owned(),
                account_id: e.account_id.as_ref().map(|a| a.as_str().to_owned()),
                run_id: e.run_id.map(|r| r.0),
                data: e.data.clone(),
            }
        );
        if let Some(prev) = stored.last() {
            let prev: &Event = prev;
            assert!(got.id > prev.id, "ids increase");
        }
        stored.push(got);
    }
    assert_eq!(s.events_after(0, 100).await.unwrap(), stored);
    assert_eq!(
        s.events_after(0, 0).await.unwrap(),
        stored,
        "limit 0 is no limit"
    );
    assert_eq!(
        s.events_after(stored[1].id, 2).await.unwrap(),
        stored[2..4].to_vec()
    );
    assert_eq!(
        s.events_after(stored[3].id, 10).await.unwrap(),
        stored[4..].to_vec()
    );
    assert!(s.events_after(stored[4].id, 10).await.unwrap().is_empty());
}

pub async fn events_append_in_batches(s: S) {
    assert!(s.append_events(&[]).await.unwrap().is_empty());
    let a = account(&s, "a").await;
    let ev = |minute: i64, kind: &'static str, run: Option<i64>, data| NewEvent {
        at: at(minute),
        kind,
        account_id: run.map(|_| a.clone()),
        run_id: run.map(RunId),
        data,
    };
    let first = s
        .append_event(&ev(
            0,
            "run_started",
            Some(1),
            serde_json::json!({"targets": 3}),
        ))
        .await
        .unwrap();
    let news: Vec<NewEvent> = (0..300)
        .map(|i| {
            ev(
                i % 7,
                "run_queued",
                (i % 3 != 0).then_some(i),
                serde_json::json!({"i": i, "text": format!("Standup ☕ {i}"), "list": [1, null, "x"]}),
            )
        })
        .collect();
    let stored = s.append_events(&news).await.unwrap();
    assert_eq!(stored.len(), news.len());
    let mut prev = first.id;
    for (got, e) in stored.iter().zip(&news) {
        assert!(got.id > prev, "ids ascend in input order");
        prev = got.id;
        assert_eq!(
            got,
            &Event {
                id: got.id,
                at: e.at,
                kind: e.kind.to_owned(),
                account_id: e.account_id.as_ref().map(|a| a.as_str().to_owned()),
                run_id: e.run_id.map(|r| r.0),
                data: e.data.clone(),
            }
        );
    }
    let last = s
        .append_event(&ev(9, "run_finished", None, serde_json::Value::Null))
        .await
        .unwrap();
    assert!(last.id > prev);
    let mut all = vec![first];
    all.extend(stored);
    all.push(last);
    assert_eq!(s.events_after(0, 0).await.unwrap(), all);
    assert_eq!(
        s.events_after(all[0].id, 5).await.unwrap(),
        all[1..6].to_vec()
    );
}

// ---------------------------------------------------------------- groups

fn ginfo(i: usize, subject: &str) -> GroupInfo {
    GroupInfo {
        jid: group(i),
        subject: subject.into(),
        participants: 10 + i as u32,
        announce: false,
        is_admin: false,
        community: None,
    }
}

fn label(s: &str) -> Label {
    Label::parse(s).expect("valid label")
}

async fn page(s: &S, f: GroupFilter) -> GroupPage {
    s.list_groups(&f).await.expect("list groups")
}

pub async fn group_directory_sync(s: S) {
    let a = account(&s, "sales-1").await;
    let other = account(&s, "other").await;
    assert_eq!(s.groups_synced_at(&a).await.unwrap(), None);
    let first: Vec<_> = (0..3).map(|i| ginfo(i, &format!("Team {i}"))).collect();
    let summary = s.sync_groups(&a, &first, at(1)).await.unwrap();
    assert_eq!(
        summary,
        GroupSyncSummary {
            added: 3,
            updated: 0,
            left: 0,
            total: 3
        }
    );
    assert_eq!(s.groups_synced_at(&a).await.unwrap(), Some(at(1)));
    s.set_group_labels(&a, &group(0), &[label("vip")])
        .await
        .unwrap();

    // Group 1 renamed and made admins-only, group 2 left, group 3 joined.
    let mut renamed = ginfo(1, "Team one");
    renamed.announce = true;
    let second = vec![ginfo(0, "Team 0"), renamed, ginfo(3, "Team 3")];
    let summary = s.sync_groups(&a, &second, at(2)).await.unwrap();
    assert_eq!(
        summary,
        GroupSyncSummary {
            added: 1,
            updated: 1,
            left: 1,
            total: 3
        }
    );
    let now = page(&s, GroupFilter::all_of(a.clone())).await;
    assert_eq!(now.total, 3);
    let jids: Vec<_> = now.items.iter().map(|g| g.info.jid.clone()).collect();
    assert_eq!(jids, vec![group(0), group(1), group(3)], "JID order");
    assert_eq!(
        now.items[0].labels,
        vec![label("vip")],
        "labels survive a sync"
    );
    assert_eq!(now.items[1].info.subject, "Team one");
    assert!(!now.items[1].can_post, "admins-only, not an admin");
    assert!(now.items.iter().all(|g| g.member && g.account_id == a));

    let with_left = page(
        &s,
        GroupFilter {
            include_left: true,
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    assert_eq!(with_left.total, 4);
    let gone = &with_left.items[2];
    assert_eq!((gone.info.jid.clone(), gone.member), (group(2), false));
    assert_eq!(gone.synced_at, at(2));

    // Rejoining counts as added; the other account's directory is its own.
    let summary = s.sync_groups(&a, &first, at(3)).await.unwrap();
    assert_eq!((summary.added, summary.left, summary.total), (1, 1, 3));
    assert_eq!(page(&s, GroupFilter::all_of(other.clone())).await.total, 0);
    assert_not_found(s.sync_groups(&aid("nobody"), &first, at(4)).await);
    assert_not_found(s.list_groups(&GroupFilter::all_of(aid("nobody"))).await);

    // The directory goes with its account.
    s.delete_account(&a).await.unwrap();
    account(&s, "sales-1").await;
    assert_eq!(page(&s, GroupFilter::all_of(a.clone())).await.total, 0);
    assert_eq!(s.groups_synced_at(&a).await.unwrap(), None);
}

pub async fn group_listing_filters_and_pages(s: S) {
    let a = account(&s, "sales-1").await;
    let mut all: Vec<_> = (0..25)
        .map(|i| {
            let name = if i % 5 == 0 {
                format!("KL Clients {i}")
            } else {
                format!("Penang team {i}")
            };
            ginfo(i, &name)
        })
        .collect();
    for g in all.iter_mut().filter(|g| g.participants % 2 == 0) {
        g.announce = true;
    }
    s.sync_groups(&a, &all, at(1)).await.unwrap();
    for i in [3usize, 7, 11] {
        s.set_group_labels(&a, &group(i), &[label("east"), label("weekly")])
            .await
            .unwrap();
    }

    let by_name = page(
        &s,
        GroupFilter {
            name: Some("kl clients".into()),
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    assert_eq!(by_name.total, 5, "case-insensitive substring");
    assert!(by_name
        .items
        .iter()
        .all(|g| g.info.subject.starts_with("KL Clients")));

    let postable = page(
        &s,
        GroupFilter {
            can_post: Some(true),
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    let expected = all.iter().filter(|g| g.can_post()).count() as u64;
    assert_eq!(postable.total, expected);
    assert!(postable.items.iter().all(|g| g.can_post));

    let east = page(
        &s,
        GroupFilter {
            label: Some(label("east")),
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    let jids: Vec<_> = east.items.iter().map(|g| g.info.jid.clone()).collect();
    assert_eq!(jids, vec![group(3), group(7), group(11)]);

    // Keyset pages of 10 visit every group once, in order; total is the
    // whole match on every page.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = page(
            &s,
            GroupFilter {
                after: after.clone(),
                limit: 10,
                ..GroupFilter::all_of(a.clone())
            },
        )
        .await;
        assert_eq!(p.total, 25);
        assert!(p.items.len() <= 10);
        if p.items.is_empty() {
            break;
        }
        after = p.items.last().map(|g| g.info.jid.clone());
        seen.extend(p.items.into_iter().map(|g| g.info.jid));
    }
    assert_eq!(seen, groups(0..25));

    // Filters combine.
    let both = page(
        &s,
        GroupFilter {
            name: Some("penang".into()),
            label: Some(label("weekly")),
            limit: 2,
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    assert_eq!(both.total, 3);
    assert_eq!(both.items.len(), 2);
}

pub async fn group_labels(s: S) {
    let a = account(&s, "sales-1").await;
    s.sync_groups(&a, &[ginfo(0, "A"), ginfo(1, "B")], at(1))
        .await
        .unwrap();
    let g = s
        .set_group_labels(&a, &group(1), &[label("west"), label("east")])
        .await
        .unwrap();
    assert_eq!(g.labels, vec![label("east"), label("west")], "sorted");
    assert_eq!(g.info.subject, "B");
    let g = s.set_group_labels(&a, &group(1), &[]).await.unwrap();
    assert!(g.labels.is_empty(), "an empty set clears them");
    let directory = || GroupFilter {
        include_left: true,
        ..GroupFilter::all_of(a.clone())
    };
    let before = page(&s, directory()).await;
    assert_not_found(
        s.set_group_labels(&a, &group(9), &[label("x")])
            .await
            .map(|_| ()),
    );
    assert_not_found(
        s.set_group_labels(&aid("nobody"), &group(0), &[label("x")])
            .await
            .map(|_| ()),
    );
    assert_eq!(page(&s, directory()).await, before, "a refused label wrote");
}

// ---------------------------------------------------------------- scale and retention

pub async fn reminder_summaries_page_by_id(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let r1 = reminder(&s, &a, 3).await;
    let r2 = reminder(&s, &b, 2).await;
    let r3 = reminder(&s, &a, 1).await;
    s.set_reminder_state(r2.id, ReminderState::Paused, at(1))
        .await
        .unwrap();
    let page = |filter: ReminderFilter, after_id: Option<i64>, limit: u32| {
        let s = s.clone();
        async move {
            s.list_reminder_summaries(&ReminderPage {
                filter,
                after_id,
                limit,
            })
            .await
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect::<Vec<_>>()
        }
    };
    let all = ReminderFilter::default();
    assert_eq!(page(all.clone(), None, 2).await, vec![r1.id, r2.id]);
    assert_eq!(page(all.clone(), Some(r2.id), 2).await, vec![r3.id]);
    assert_eq!(page(all.clone(), Some(r3.id), 2).await, Vec::<i64>::new());
    assert_eq!(page(all, None, 0).await, vec![r1.id, r2.id, r3.id]);
    let of_a = ReminderFilter {
        account_id: Some(a.clone()),
        state: None,
    };
    assert_eq!(page(of_a.clone(), None, 10).await, vec![r1.id, r3.id]);
    assert_eq!(page(of_a, Some(r1.id), 10).await, vec![r3.id]);
    let paused = ReminderFilter {
        account_id: None,
        state: Some(ReminderState::Paused),
    };
    assert_eq!(page(paused, None, 10).await, vec![r2.id]);
    // A summary is the reminder without its parts and targets, counted.
    let got = s
        .list_reminder_summaries(&ReminderPage {
            filter: ReminderFilter::default(),
            after_id: None,
            limit: 1,
        })
        .await
        .unwrap();
    let full = s.get_reminder(r1.id).await.unwrap().unwrap();
    assert_eq!(got, vec![ReminderSummary::of(&full)]);
    assert_eq!((got[0].parts, got[0].targets), (1, 3));
}

pub async fn accounts_page_by_id(s: S) {
    for id in ["c", "a", "b"] {
        account(&s, id).await;
    }
    let page = |after: Option<&'static str>, limit: u32| {
        let s = s.clone();
        async move {
            s.list_accounts_page(after, limit)
                .await
                .unwrap()
                .into_iter()
                .map(|a| a.id.as_str().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(page(None, 2).await, ["a", "b"]);
    assert_eq!(page(Some("b"), 2).await, ["c"]);
    assert_eq!(page(Some("a"), 0).await, ["b", "c"]);
    assert!(page(Some("zzz"), 2).await.is_empty());
    assert_eq!(
        s.list_accounts_page(None, 1).await.unwrap(),
        vec![s.get_account(&aid("a")).await.unwrap().unwrap()]
    );
}

/// Writers edit, pause and resume reminders at once while a reader follows
/// the change feed as the scheduler does (`ChangedAfter` the highest
/// version it has seen). Once the writers are done, the reader's view must
/// hold every reminder's last write. A version taken before a slower
/// writer commits, and passed by the reader meanwhile, would hide that
/// write until the scheduler's next full pass.
pub async fn the_change_feed_misses_no_write_under_concurrent_writers(s: S) {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    let a = account(&s, "a").await;
    let mut reminders = Vec::new();
    for _ in 0..6 {
        reminders.push(reminder(&s, &a, 2).await);
    }
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (s, done) = (s.clone(), done.clone());
        tokio::spawn(async move {
            let (mut seen, mut view) = (0, HashMap::new());
            loop {
                // Read once more after the writers are done.
                let last = done.load(Ordering::SeqCst);
                for r in s
                    .reminder_schedules(ScheduleScan::ChangedAfter(seen))
                    .await
                    .unwrap()
                {
                    seen = seen.max(r.version);
                    view.insert(r.id, (r.version, r.state));
                }
                if last {
                    return view;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let writers: Vec<_> = reminders
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (s, r) = (s.clone(), r.clone());
            tokio::spawn(async move {
                for round in 0..8 {
                    // An edit writes its targets after the version: the
                    // widest window for a reader to pass it.
                    if (i + round) % 2 == 0 {
                        let mut edited = r.spec.clone();
                        edited.title = format!("Edit {round}");
                        edited.targets = groups(0..150 + round);
                        s.update_reminder(r.id, &edited, at(round as i64))
                            .await
                            .unwrap();
                    } else {
                        let state = [ReminderState::Paused, ReminderState::Active][round % 2];
                        s.set_reminder_state(r.id, state, at(round as i64))
                            .await
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
    done.store(true, Ordering::SeqCst);
    let view = reader.await.expect("reader");
    for r in &reminders {
        let now = s.get_reminder_schedule(r.id).await.unwrap().unwrap();
        assert_eq!(
            view.get(&r.id),
            Some(&(now.version, now.state)),
            "reminder {}: the change feed never showed its last write",
            r.id
        );
    }
}

pub async fn reminder_schedules_read_changes_since_a_version(s: S) {
    let a = account(&s, "a").await;
    let r1 = reminder(&s, &a, 2).await;
    let r2 = reminder(&s, &a, 2).await;
    let active = s.reminder_schedules(ScheduleScan::Active).await.unwrap();
    assert_eq!(
        active.iter().map(|r| r.id).collect::<Vec<_>>(),
        [r1.id, r2.id]
    );
    assert!(active[0].version < active[1].version, "{active:?}");
    for (got, r) in active.iter().zip([&r1, &r2]) {
        assert_eq!(got, &ReminderSchedule::of(r, got.version, None));
    }
    let v = active[1].version;
    assert!(s
        .reminder_schedules(ScheduleScan::ChangedAfter(v))
        .await
        .unwrap()
        .is_empty());

    // A pause is a change; the paused reminder leaves the active set.
    s.set_reminder_state(r1.id, ReminderState::Paused, at(1))
        .await
        .unwrap();
    let changed = s
        .reminder_schedules(ScheduleScan::ChangedAfter(v))
        .await
        .unwrap();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(
        (changed[0].id, changed[0].state),
        (r1.id, ReminderState::Paused)
    );
    assert!(changed[0].version > v);
    let v = changed[0].version;
    let active = s.reminder_schedules(ScheduleScan::Active).await.unwrap();
    assert_eq!(active.iter().map(|r| r.id).collect::<Vec<_>>(), [r2.id]);

    // A run is not a change of its reminder, but moves its cursor.
    run(&s, &r2, 10, RunStatus::Queued).await;
    assert!(s
        .reminder_schedules(ScheduleScan::ChangedAfter(v))
        .await
        .unwrap()
        .is_empty());
    let one = s.get_reminder_schedule(r2.id).await.unwrap().unwrap();
    assert_eq!(one.last_scheduled_for, Some(at(10)));
    assert_eq!(one.version, active[0].version);

    // An edit is a change, in version order after the pause.
    let mut edited = r2.spec.clone();
    edited.title = "Edited".into();
    s.update_run(
        s.list_runs(&RunFilter {
            reminder_id: Some(r2.id),
            limit: 1,
            ..RunFilter::default()
        })
        .await
        .unwrap()[0]
            .id,
        &RunUpdate {
            status: Some(RunStatus::Cancelled),
            expect: vec![RunStatus::Queued],
            finished_at: Some(at(11)),
            ..RunUpdate::default()
        },
    )
    .await
    .unwrap();
    s.update_reminder(r2.id, &edited, at(12)).await.unwrap();
    s.set_reminder_state(r1.id, ReminderState::Active, at(13))
        .await
        .unwrap();
    let changed = s
        .reminder_schedules(ScheduleScan::ChangedAfter(v))
        .await
        .unwrap();
    assert_eq!(
        changed.iter().map(|r| r.id).collect::<Vec<_>>(),
        [r2.id, r1.id]
    );
    assert!(changed[0].version < changed[1].version);
    assert!(s.get_reminder_schedule(999_999).await.unwrap().is_none());
}

/// Ends a run `status` at `finished`.
async fn finish(s: &S, run: RunId, status: RunStatus, finished: DateTime<Utc>) {
    s.update_run(
        run,
        &RunUpdate {
            status: Some(status),
            expect: vec![RunStatus::Queued],
            finished_at: Some(finished),
            ..RunUpdate::default()
        },
    )
    .await
    .expect("finish run");
}

pub async fn prune_runs_keeps_unfinished_and_newest_runs(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 3).await;
    let other = reminder(&s, &a, 1).await;
    let old = run(&s, &r, 0, RunStatus::Queued).await;
    targets(&s, old.id, 3).await;
    finish(&s, old.id, RunStatus::Success, at(1)).await;
    let failed = run(&s, &r, 10, RunStatus::Queued).await;
    targets(&s, failed.id, 3).await;
    finish(&s, failed.id, RunStatus::Failed, at(11)).await;
    // Queued long ago and still not finished: in flight, never pruned.
    let in_flight = run(&s, &r, 20, RunStatus::Queued).await;
    targets(&s, in_flight.id, 3).await;
    // A missed run never started: it ended when it was created.
    let missed = run(&s, &r, 30, RunStatus::Missed).await;
    // The other reminder's only run: its cursor, kept however old.
    let only = run(&s, &other, 5, RunStatus::Queued).await;
    finish(&s, only.id, RunStatus::Success, at(6)).await;

    let prune_all = |before: DateTime<Utc>| {
        let s = s.clone();
        async move {
            let mut total = PrunedRuns::default();
            loop {
                let n = s.prune_runs(before, 2).await.unwrap();
                assert!(n.targets <= 2 && n.runs <= 2, "{n:?}");
                if n == PrunedRuns::default() {
                    return total;
                }
                total.runs += n.runs;
                total.targets += n.targets;
            }
        }
    };
    // Only `old` ended before minute 11 (`failed` ended at it, not before).
    assert_eq!(
        prune_all(at(11)).await,
        PrunedRuns {
            runs: 1,
            targets: 3
        }
    );
    assert!(s.get_run(old.id).await.unwrap().is_none());
    assert!(s.get_run(failed.id).await.unwrap().is_some());
    assert_eq!(all_targets(&s, failed.id).await.len(), 3);

    // Far in the future: everything finished goes but the newest runs.
    assert_eq!(
        prune_all(at(100_000)).await,
        PrunedRuns {
            runs: 1,
            targets: 3
        }
    );
    assert!(s.get_run(failed.id).await.unwrap().is_none());
    let kept = s.get_run(in_flight.id).await.unwrap().unwrap();
    assert_eq!(kept.status, RunStatus::Queued);
    assert_eq!(all_targets(&s, in_flight.id).await.len(), 3);
    assert!(s.get_run(missed.id).await.unwrap().is_some());
    assert!(s.get_run(only.id).await.unwrap().is_some());
    assert_eq!(s.last_scheduled_for(r.id).await.unwrap(), Some(at(30)));
}

pub async fn prune_events_records_how_far_it_went(s: S) {
    assert_eq!(s.events_pruned_through().await.unwrap(), 0);
    let news: Vec<NewEvent> = (1..=5)
        .map(|i| NewEvent {
            at: at(i),
            kind: "run_progress",
            account_id: None,
            run_id: None,
            data: serde_json::json!({"i": i}),
        })
        .collect();
    let stored = s.append_events(&news).await.unwrap();
    let ids: Vec<i64> = stored.iter().map(|e| e.id).collect();
    // Events at minutes 1–3 are before minute 4.
    assert_eq!(s.prune_events(at(4), 2).await.unwrap(), 2);
    assert_eq!(s.events_pruned_through().await.unwrap(), ids[1]);
    assert_eq!(s.prune_events(at(4), 2).await.unwrap(), 1);
    assert_eq!(s.prune_events(at(4), 2).await.unwrap(), 0);
    assert_eq!(s.events_pruned_through().await.unwrap(), ids[2]);
    let left: Vec<i64> = s
        .events_after(0, 0)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, ids[3..]);
    // New events keep counting up from the highest id ever given.
    let next = s.append_event(&news[0]).await.unwrap();
    assert!(next.id > ids[4]);
}

pub async fn prune_media_deletes_only_what_no_reminder_uses(s: S) {
    let a = account(&s, "a").await;
    let used = media(&s, b"used picture").await;
    let unused = media(&s, b"unused picture").await;
    let fresh = s
        .put_media(&MediaInfo {
            created_at: at(60),
            ..media_info(b"fresh picture", "fresh.png")
        })
        .await
        .unwrap()
        .id;
    s.create_reminder(
        &spec(
            &a,
            "With a picture",
            vec![MessagePart::Media {
                media: used.clone(),
                caption: None,
            }],
            groups(0..1),
        ),
        t0(),
    )
    .await
    .unwrap();
    let handle = UploadHandle {
        handle: "h".into(),
        expires_at: at(1000),
    };
    s.put_upload_handle(&a, &unused, &handle).await.unwrap();
    assert_eq!(
        s.prune_media(at(30), 10).await.unwrap(),
        vec![unused.clone()]
    );
    assert!(s.get_media(&unused).await.unwrap().is_none());
    assert!(s.get_upload_handle(&a, &unused).await.unwrap().is_none());
    assert!(s.get_media(&used).await.unwrap().is_some());
    assert!(s.get_media(&fresh).await.unwrap().is_some());
    assert!(s.prune_media(at(30), 10).await.unwrap().is_empty());
    // Once old enough, the unused one goes too; the used one never.
    assert_eq!(s.prune_media(at(100), 10).await.unwrap(), vec![fresh]);
    assert!(s.get_media(&used).await.unwrap().is_some());
}
