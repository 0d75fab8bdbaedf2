//! Reminders: round trips, and writes that are refused change nothing.

use super::fixtures::{
    account, aid, assert_conflict, assert_invalid, assert_not_found, at, group, groups, media,
    new_account, reminder, run, snapshot, spec, targets, text, S,
};
use crate::domain::*;
use crate::ports::*;

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

/// Runs are named by their reminders' titles: every stored reminder's,
/// whatever its state, in one read; an id never stored has none.
pub async fn reminder_titles_name_runs(s: S) {
    let a = account(&s, "a").await;
    let first = s
        .create_reminder(
            &spec(&a, "Rent, due \"Friday\"", vec![text("x")], groups(0..3)),
            at(1),
        )
        .await
        .unwrap();
    let second = s
        .create_reminder(
            &spec(&a, "Équipe 東京", vec![text("y")], groups(0..1)),
            at(1),
        )
        .await
        .unwrap();
    s.set_reminder_state(second.id, ReminderState::Archived, at(2))
        .await
        .unwrap();
    let titles = s
        .reminder_titles(&[first.id, second.id, second.id + 1000])
        .await
        .unwrap();
    assert_eq!(titles.len(), 2, "{titles:?}");
    assert_eq!(titles[&first.id], "Rent, due \"Friday\"");
    assert_eq!(titles[&second.id], "Équipe 東京");
    assert!(s.reminder_titles(&[]).await.unwrap().is_empty());
}
