//! Recalls and edits: one open per run, each group marked once before and
//! once after the wire, never left once final.

use super::fixtures::*;
use crate::domain::*;
use crate::ports::StoreError;

pub(super) fn ask(run: RunId, kind: AmendKind, minute: i64) -> NewAmendment {
    NewAmendment {
        run_id: run,
        kind,
        edits: match kind {
            AmendKind::Recall => Vec::new(),
            AmendKind::Edit => vec![Some("Standup moved to 10:30".into())],
        },
        requested_at: at(minute),
        window_secs: 172_800,
    }
}

pub(super) fn told(account: &AccountId, run: RunId, kind: &'static str, minute: i64) -> NewEvent {
    NewEvent {
        at: at(minute),
        kind,
        account_id: Some(account.clone()),
        run_id: Some(run),
        data: serde_json::json!({}),
    }
}

/// A run of four groups: the first sent, the second's send unanswered
/// (marked `sending`, nothing accepted), the third never tried, the
/// fourth marked `sending` but skipped before its send went.
async fn sent_run(s: &S, a: &AccountId) -> (Run, Vec<RunTarget>) {
    let r = reminder(s, a, 4).await;
    let run = run(s, &r, 0, RunStatus::Queued).await;
    let ts = targets(s, run.id, 4).await;
    s.apply_transitions(&[
        Transition::Sending {
            target_id: ts[0].id,
            part: 0,
            message_id: "3EB0AAAAAAAAAAAAAAAAAAAA".into(),
        },
        Transition::Sent {
            target_id: ts[0].id,
            part: 0,
            last: true,
            at: at(1),
            latency_ms: 100,
        },
        Transition::Sending {
            target_id: ts[1].id,
            part: 0,
            message_id: "3EB0BBBBBBBBBBBBBBBBBBBB".into(),
        },
        Transition::Sending {
            target_id: ts[3].id,
            part: 0,
            message_id: "3EB0DDDDDDDDDDDDDDDDDDDD".into(),
        },
        Transition::Skipped {
            target_id: ts[3].id,
            reason: "stopped by operator".into(),
        },
    ])
    .await
    .expect("marks");
    super::scale::finish(s, run.id, RunStatus::Partial, at(2)).await;
    (run, ts)
}

pub async fn amendments_mark_each_group_once(s: S) {
    let a = account(&s, "a").await;
    let (run, ts) = sent_run(&s, &a).await;
    let kind = AmendKind::Recall;
    assert_not_found(
        s.create_amendment(&ask(RunId(9999), kind, 3), &[], &told(&a, run.id, "x", 3))
            .await,
    );
    // Under a lease nobody holds: refused, nothing written.
    let stale = Fence {
        account: a.clone(),
        node: "elsewhere".into(),
        epoch: 7,
    };
    let events = s.events_after(0, 0).await.unwrap().len();
    let refused = s
        .create_amendment(
            &ask(run.id, kind, 3),
            std::slice::from_ref(&stale),
            &told(&a, run.id, kind.started_event(), 3),
        )
        .await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
    assert_eq!(s.run_amendment(run.id).await.unwrap(), None);
    assert_eq!(s.events_after(0, 0).await.unwrap().len(), events);

    let (made, event) = s
        .create_amendment(
            &ask(run.id, kind, 3),
            &[],
            &told(&a, run.id, kind.started_event(), 3),
        )
        .await
        .expect("create");
    assert_eq!(event.kind, "run_recall_started");
    assert_eq!(
        (made.run_id, made.kind, made.finished_at),
        (run.id, kind, None)
    );
    // The groups with a message that may have arrived: not the third,
    // nor the fourth, whose send never went.
    assert_eq!(made.progress.total, 2, "{made:?}");
    assert_conflict(
        s.create_amendment(
            &ask(run.id, AmendKind::Edit, 4),
            &[],
            &told(&a, run.id, "run_edit_started", 4),
        )
        .await,
    );
    let open = s.unfinished_amendments().await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].0.id, &open[0].1), (made.id, &a));

    let listed = s.amend_targets(made.id, None, 0).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        (listed[0].target_id, listed[0].parts_sent, listed[0].sent_at),
        (ts[0].id, 1, Some(at(1)))
    );
    assert_eq!((listed[0].in_flight, listed[0].messages()), (false, 1));
    // Its answer lost when the run ended: its one part may be out there.
    assert_eq!(
        (
            listed[1].target_id,
            listed[1].parts_sent,
            listed[1].in_flight
        ),
        (ts[1].id, 0, true)
    );
    assert_eq!(listed[1].messages(), 1);
    assert!(listed.iter().all(|t| t.state.is_none()));
    let after = s.amend_targets(made.id, Some(0), 0).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].position, 1);

    let mark = |t: i64, state: AmendState, minute: i64| {
        let s = s.clone();
        async move {
            s.mark_amend(&[], made.id, t, state, None, at(minute))
                .await
                .expect("mark")
        }
    };
    let since = s.sent_since(&a, at(9)).await.unwrap().len();
    // Done only after the mark before the wire; a final state never left.
    assert!(!mark(ts[0].id, AmendState::Done, 10).await);
    assert!(mark(ts[0].id, AmendState::Sending, 10).await);
    assert!(!mark(ts[0].id, AmendState::Sending, 10).await);
    let mut sent = s.sent_since(&a, at(9)).await.unwrap();
    assert_eq!(
        sent.len(),
        since + 1,
        "a group between the marks counts as now"
    );
    assert!(sent.contains(&(None, 2)), "{sent:?}");
    assert!(mark(ts[0].id, AmendState::Done, 11).await);
    assert!(!mark(ts[0].id, AmendState::TooOld, 12).await);
    assert!(!mark(ts[0].id, AmendState::Sending, 12).await);
    sent = s.sent_since(&a, at(9)).await.unwrap();
    assert!(sent.contains(&(Some(at(11)), 2)), "{sent:?}");
    assert!(!s
        .sent_since(&a, at(12))
        .await
        .unwrap()
        .contains(&(Some(at(11)), 2)));
    assert!(mark(ts[1].id, AmendState::TooOld, 12).await);
    assert_not_found(
        s.mark_amend(
            &[],
            made.id + 100,
            ts[0].id,
            AmendState::Sending,
            None,
            at(12),
        )
        .await,
    );
    assert!(matches!(
        s.mark_amend(
            std::slice::from_ref(&stale),
            made.id,
            ts[2].id,
            AmendState::Sending,
            None,
            at(12)
        )
        .await,
        Err(StoreError::Fenced(_))
    ));

    let now = s.run_amendment(run.id).await.unwrap().expect("amendment");
    assert_eq!(
        now.progress,
        AmendProgress {
            total: 2,
            done: 1,
            too_old: 1,
            failed: 0,
            sending: 0,
        }
    );
    let states: Vec<_> = s
        .amend_targets(made.id, None, 0)
        .await
        .unwrap()
        .iter()
        .map(|t| (t.state, t.marked_at))
        .collect();
    // Each with the time of its last mark (a run's chart draws them).
    assert_eq!(
        states,
        [
            (Some(AmendState::Done), Some(at(11))),
            (Some(AmendState::TooOld), Some(at(12)))
        ]
    );

    // Finished once, with its event; then nothing more is marked.
    let end = told(&a, run.id, kind.finished_event(), 13);
    let stored = s
        .finish_amendment(&[], made.id, at(13), &end)
        .await
        .unwrap();
    assert_eq!(stored.map(|e| e.kind), Some("run_recall_finished".into()));
    assert_eq!(
        s.finish_amendment(&[], made.id, at(14), &end)
            .await
            .unwrap(),
        None
    );
    assert!(s.unfinished_amendments().await.unwrap().is_empty());
    assert_eq!(
        s.get_amendment(made.id)
            .await
            .unwrap()
            .and_then(|a| a.finished_at),
        Some(at(13))
    );

    // The next one starts every group over.
    let (edit, _) = s
        .create_amendment(
            &ask(run.id, AmendKind::Edit, 15),
            &[],
            &told(&a, run.id, "run_edit_started", 15),
        )
        .await
        .expect("a second amendment once the first finished");
    assert_eq!(edit.edits, vec![Some("Standup moved to 10:30".to_owned())]);
    let latest = s.run_amendment(run.id).await.unwrap().expect("latest");
    assert_eq!((latest.id, latest.progress.settled()), (edit.id, 0));
    assert!(s
        .amend_targets(edit.id, None, 0)
        .await
        .unwrap()
        .iter()
        .all(|t| t.state.is_none()));
}

pub async fn amendments_go_with_their_run(s: S) {
    let a = account(&s, "a").await;
    let (old, ts) = sent_run(&s, &a).await;
    let (made, _) = s
        .create_amendment(
            &ask(old.id, AmendKind::Recall, 3),
            &[],
            &told(&a, old.id, "run_recall_started", 3),
        )
        .await
        .unwrap();
    s.mark_amend(&[], made.id, ts[0].id, AmendState::Sending, None, at(4))
        .await
        .unwrap();
    let r = s.get_run(old.id).await.unwrap().unwrap().reminder_id;
    let r = s.get_reminder(r).await.unwrap().unwrap();
    // A newer run keeps the old one prunable.
    run(&s, &r, 10, RunStatus::Queued).await;
    while s.prune_runs(at(100), 100).await.unwrap() != PrunedRuns::default() {}
    assert!(s.get_run(old.id).await.unwrap().is_none());
    assert_eq!(s.run_amendment(old.id).await.unwrap(), None);
    assert!(s.unfinished_amendments().await.unwrap().is_empty());
    assert!(s.amend_targets(made.id, None, 0).await.unwrap().is_empty());
}
