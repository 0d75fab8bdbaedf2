//! The activity log: appended in order, alone and in batches, read by id.

use super::fixtures::{account, at, S};
use crate::domain::*;

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

/// An account's state changes since a time, behind the one it was in then:
/// other accounts' and other kinds of events are not among them.
pub async fn account_states_read_one_account_since_a_time(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let state = |acc: &AccountId, kind: &'static str, t: i64, state: &str| NewEvent {
        at: at(t),
        kind,
        account_id: Some(acc.clone()),
        run_id: None,
        data: serde_json::json!({ "state": state }),
    };
    let news = [
        state(&a, "account_state", 1, "cooling_down"),
        state(&a, "account_state", 2, "connected"),
        state(&b, "account_state", 3, "banned"),
        state(&a, "run_started", 4, "x"),
        state(&a, "account_state", 5, "disabled"),
        state(&a, "account_state", 7, "connected"),
    ];
    for e in &news {
        s.append_event(e).await.unwrap();
    }
    let states = |since: i64| {
        let s = s.clone();
        let a = a.clone();
        async move {
            s.account_states(&a, at(since))
                .await
                .unwrap()
                .iter()
                .map(|e| (e.at, e.data["state"].as_str().unwrap().to_owned()))
                .collect::<Vec<_>>()
        }
    };
    let named = |v: &[(i64, &str)]| -> Vec<(chrono::DateTime<chrono::Utc>, String)> {
        v.iter().map(|(t, s)| (at(*t), (*s).to_owned())).collect()
    };
    // The state at 3 was set at 2; then what changed since.
    assert_eq!(
        states(3).await,
        named(&[(2, "connected"), (5, "disabled"), (7, "connected")])
    );
    assert_eq!(
        states(0).await,
        named(&[
            (1, "cooling_down"),
            (2, "connected"),
            (5, "disabled"),
            (7, "connected")
        ])
    );
    assert_eq!(states(8).await, named(&[(7, "connected")]));
    assert!(s
        .account_states(&AccountId::parse("nobody").unwrap(), at(0))
        .await
        .unwrap()
        .is_empty());
}
