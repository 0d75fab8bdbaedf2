use crate::api::helpers::*;
use std::time::Duration;

#[actix_rt::test]
async fn live_events_follow_a_run_and_a_reconnect_resumes_after_its_last_id() {
    let app = spawn_app().await;
    app.add_account("ev").await;
    app.patch(
        "/v1/accounts/ev",
        serde_json::json!({"max_per_minute": 600}),
    )
    .await;
    let rid = app.create_reminder(reminder_body("ev", &groups(2))).await["id"]
        .as_i64()
        .unwrap();

    // Live only (no `after`): subscribe first, then fire.
    let (events, fired) = futures_util::join!(
        app.read_events("/v1/events", &[], 15, |evs| {
            evs.iter().any(|e| e.kind == "run_finished")
        }),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            app.post_empty(&format!("/v1/reminders/{rid}/fire")).await
        }
    );
    assert_eq!(fired.status, 202, "{}", fired.text);
    let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
    for k in ["run_queued", "run_started", "run_finished"] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }

    // Reconnecting with Last-Event-ID replays only what came after it.
    let started = events.iter().find(|e| e.kind == "run_started").unwrap();
    let last_id = started.id.to_string();
    let replay = app
        .read_events("/v1/events", &[("Last-Event-ID", &last_id)], 10, |evs| {
            evs.iter().any(|e| e.kind == "run_finished")
        })
        .await;
    assert!(replay.iter().all(|e| e.id > started.id), "{replay:?}");
    assert!(replay.iter().all(|e| e.kind != "run_started"));
}

#[actix_rt::test]
async fn a_bad_starting_point_is_refused() {
    let app = spawn_app().await;
    assert_problem(&app.get("/v1/events?after=x").await, 400, Some("after"));
    assert_problem(&app.get("/v1/events?since=1").await, 400, Some("since"));
    let r = app
        .send(
            "GET",
            "/v1/events",
            None,
            None,
            &[("Last-Event-ID", "yesterday")],
        )
        .await;
    assert_problem(&r, 400, Some("Last-Event-ID"));
}

#[actix_rt::test]
async fn a_replay_from_a_position_retention_deleted_is_told_so() {
    use herald_actors::domain::NewEvent;
    let app = spawn_app().await;
    let store = &app.state.store;
    let long_ago: chrono::DateTime<chrono::Utc> = "2020-01-01T00:00:00Z".parse().unwrap();
    let stored = store
        .append_events(
            &(0..3)
                .map(|i| NewEvent {
                    at: long_ago + chrono::Duration::minutes(i),
                    kind: "run_progress",
                    account_id: None,
                    run_id: None,
                    data: serde_json::json!({"i": i}),
                })
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    // Retention deletes the two oldest.
    let horizon = long_ago + chrono::Duration::minutes(2);
    assert_eq!(store.prune_events(horizon, 10).await.unwrap(), 2);
    let replay = app
        .read_events("/v1/events?after=0", &[], 10, |evs| {
            evs.iter().any(|e| e.id == stored[2].id)
        })
        .await;
    assert_eq!(replay[0].kind, "events_pruned", "{replay:?}");
    assert_eq!(replay[0].data["after"], 0);
    assert_eq!(replay[0].data["pruned_through"], stored[1].id);
    assert!(replay[0].data["message"]
        .as_str()
        .unwrap()
        .contains("deleted by retention"));
    assert_eq!(replay[1].id, stored[2].id, "{replay:?}");

    // From a position past the deleted ones: no notice.
    let last = stored[1].id.to_string();
    let replay = app
        .read_events("/v1/events", &[("Last-Event-ID", &last)], 10, |evs| {
            evs.iter().any(|e| e.id == stored[2].id)
        })
        .await;
    assert_eq!(replay[0].id, stored[2].id, "{replay:?}");
}

/// An operator's disable and enable are account state changes like the
/// engine's own: each is reported by an `account_state` event, stored with
/// the change (a replay from the start finds both).
#[actix_rt::test]
async fn an_operator_s_disable_and_enable_are_reported_as_account_state_events() {
    let app = spawn_app().await;
    app.add_account("st").await;
    let r = app.post_empty("/v1/accounts/st/disable").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app.post_empty("/v1/accounts/st/enable").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let replay = app
        .read_events("/v1/events?after=0", &[], 10, |evs| {
            evs.iter()
                .filter(|e| e.kind == "account_state")
                .any(|e| e.data["data"]["state"] == "connected")
        })
        .await;
    let states: Vec<&serde_json::Value> = replay
        .iter()
        .filter(|e| e.kind == "account_state")
        .map(|e| &e.data["data"]["state"])
        .collect();
    assert_eq!(states, ["disabled", "connected"], "{replay:?}");
    let disabled = replay.iter().find(|e| e.kind == "account_state").unwrap();
    assert_eq!(disabled.data["data"]["reason"], "disabled by operator");
    assert_eq!(disabled.data["account_id"], "st");
}
