//! Paging by id at scale, the scheduler's change feed under concurrent
//! writers, and retention (pruning runs, events, media).

use super::fixtures::{
    account, aid, all_targets, at, groups, media, media_info, reminder, run, spec, t0, targets, S,
};
use crate::domain::*;
use crate::ports::*;
use chrono::{DateTime, Utc};
use std::sync::Arc;

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
pub(super) async fn finish(s: &S, run: RunId, status: RunStatus, finished: DateTime<Utc>) {
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
