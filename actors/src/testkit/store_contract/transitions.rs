//! A run's life: target transitions and their rules, batches, marks,
//! compare-and-set updates, stops and resumes after a crash, listings.

use super::fixtures::{
    account, all_targets, assert_conflict, assert_not_found, at, counts, counts_of, groups,
    reminder, run, snapshot, targets, S,
};
use crate::domain::*;
use crate::ports::*;

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
    // Between two parts, its next part marked `sending`: both count.
    s.apply_transitions(&[Transition::Sending {
        target_id: ta[1].id,
        part: 1,
        message_id: "m-part-2".into(),
    }])
    .await
    .unwrap();
    let mut got = s.sent_since(&a, at(60)).await.unwrap();
    got.sort();
    assert_eq!(got, vec![(None, 1), (None, 1), (Some(at(70)), 1)]);
}

/// A send whose answer was lost before its run ended counts at the end;
/// a retried run's sends count however long ago it first ended.
pub async fn sent_since_sees_lost_answers_and_retried_runs(s: S) {
    use crate::lifecycle::retry_update;
    let c = account(&s, "c").await;
    let r = reminder(&s, &c, 2).await;
    let run = run(&s, &r, 0, RunStatus::Queued).await;
    let ts = targets(&s, run.id, 2).await;
    s.apply_transitions(&[Transition::Sending {
        target_id: ts[0].id,
        part: 0,
        message_id: "m-c0".into(),
    }])
    .await
    .unwrap();
    super::scale::finish(&s, run.id, RunStatus::Partial, at(100)).await;
    assert_eq!(
        s.sent_since(&c, at(90)).await.unwrap(),
        vec![(Some(at(100)), 1)],
        "skipped, maybe delivered: at the run's end"
    );
    assert!(s.sent_since(&c, at(101)).await.unwrap().is_empty());
    s.update_run(run.id, &retry_update()).await.expect("retry");
    s.apply_transitions(&[Transition::Sending {
        target_id: ts[1].id,
        part: 0,
        message_id: "m-c1".into(),
    }])
    .await
    .unwrap();
    let got = s.sent_since(&c, at(500)).await.unwrap();
    assert!(
        got.contains(&(None, 1)),
        "the retried run's send counts: {got:?}"
    );
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
