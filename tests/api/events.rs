use crate::helpers::*;
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
