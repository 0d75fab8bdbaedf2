//! The whole path an operator takes: account, picture, reminder, fire,
//! watch it finish over the event stream.

use crate::api::helpers::*;
use herald_actors::domain::AccountId;
use serde_json::json;

#[actix_rt::test]
async fn a_reminder_with_a_picture_reaches_five_groups() {
    let app = spawn_app().await;
    app.add_account("e2e").await;
    let r = app
        .patch(
            "/v1/accounts/e2e",
            json!({"max_per_minute": 600, "group_concurrency": 5}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let media = app.upload_png().await;

    let mut body = reminder_body("e2e", &groups(5));
    body["parts"] = json!([
        {"kind": "media", "media": media["id"], "caption": "Today's poster"},
        {"kind": "text", "text": "See you at 9"},
    ]);
    let reminder = app.create_reminder(body).await;
    let rid = reminder["id"].as_i64().unwrap();

    let fired = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(fired.status, 202, "{}", fired.text);
    app.assert_schema("FireResult", &fired.json).await;
    // Inside the window it is queued at once, never `scheduled`; the answer
    // reads the run back after the account's actor got it, which may
    // already have started it (seen once under six test threads).
    let status = fired.json["status"].as_str().unwrap();
    assert!(
        ["queued", "running", "success"].contains(&status),
        "{}",
        fired.text
    );
    let run = fired.json["run_id"].as_i64().unwrap();
    assert_eq!(
        fired.headers.get("location").unwrap(),
        &format!("/v1/runs/{run}")
    );

    let done = app
        .wait_run(run, 20, |r| {
            r["status"]
                .as_str()
                .is_some_and(|s| s != "queued" && s != "running")
        })
        .await;
    assert_eq!(done["status"], "success", "{done:#}");
    assert_eq!(done["counts"]["sent"], 5);
    assert_eq!(done["delivered"], "5 of 5 delivered");
    assert!(done["forecast"]
        .as_str()
        .unwrap()
        .starts_with("forecast: all 5 groups fit"));
    assert!(done["error_summary"].is_null());

    let targets = app.get(&format!("/v1/runs/{run}/targets")).await;
    let items = targets.json["items"].as_array().unwrap();
    assert_eq!(items.len(), 5);
    for (i, t) in items.iter().enumerate() {
        assert_eq!(t["group"], group(i + 1));
        assert_eq!(t["status"], "sent", "{t}");
        assert_eq!(t["parts_sent"], 2);
        assert!(t["message_id"].as_str().unwrap().starts_with("3EB0"));
        assert!(t["sent_at"].is_string());
    }
    // The simulated WhatsApp got each part once: 5 groups × 2 parts.
    let account = AccountId::parse("e2e").unwrap();
    assert_eq!(app.state.simulator.delivered(&account), 10);
    assert_eq!(app.state.simulator.duplicate_deliveries(), 0);

    // The stream replays the run from the start and reports its end.
    let events = app
        .read_events("/v1/events?after=0", &[], 10, |evs| {
            evs.iter()
                .any(|e| e.kind == "run_finished" && e.data["run_id"] == run)
        })
        .await;
    let of_run: Vec<_> = events.iter().filter(|e| e.data["run_id"] == run).collect();
    let kinds: Vec<_> = of_run.iter().map(|e| e.kind.as_str()).collect();
    let started = kinds
        .iter()
        .position(|k| *k == "run_started")
        .expect("run_started");
    let finished = kinds.iter().position(|k| *k == "run_finished").unwrap();
    assert!(started < finished, "{kinds:?}");
    let end = of_run[finished];
    assert_eq!(end.data["data"]["delivered"], "5 of 5 delivered");
    assert_eq!(end.data["id"], end.id);
    app.assert_schema("Event", &end.data).await;
    // Ids only grow.
    assert!(events.windows(2).all(|w| w[0].id < w[1].id));

    let live = app.get("/v1/accounts/e2e").await.json["live"].clone();
    assert!(live["current_run"].is_null(), "{live}");
    assert_eq!(live["per_minute"], 600);
}
