//! Runs: firing is idempotent (alone, in batches, under concurrent
//! callers), and a run's targets are frozen once.

use super::fixtures::{
    account, all_targets, at, counts, counts_of, group, reminder, run, snapshot, targets, S,
};
use crate::domain::*;
use crate::ports::*;
use chrono::{DateTime, Utc};

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
            created: false,
            event: None,
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
        event: None,
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
