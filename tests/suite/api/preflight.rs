//! Pre-flight: creating, editing and forecasting a reminder report the
//! groups its account is not in or may not post to (from the synced group
//! directory); its run fails those up front with that reason.

use crate::api::helpers::*;
use herald_actors::domain::AccountId;
use herald_actors::simulator::{GroupAccess, Simulator};
use serde_json::{json, Value};

fn refused(pre: &Value) -> Vec<(String, String)> {
    pre["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["group"].as_str().unwrap().to_owned(),
                r["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[actix_rt::test]
async fn groups_the_account_cannot_post_to_are_reported_then_failed_up_front() {
    let app = spawn_app_syncing_every_second().await;
    app.add_account("sales-1").await;
    let account = AccountId::parse("sales-1").unwrap();
    let sim = &app.state.simulator;
    sim.set_group_access(
        &account,
        &Simulator::numbered_group(5),
        GroupAccess::NotParticipant,
    );
    sim.set_group_access(
        &account,
        &Simulator::numbered_group(6),
        GroupAccess::AdminsOnly,
    );
    // The sync throttle is one second, counted from the account's first sync.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let synced = app.post_empty("/v1/accounts/sales-1/groups/sync").await;
    assert_eq!(synced.status, 200, "{}", synced.text);

    let unknown = "120363999999999999@g.us".to_owned();
    let targets = [group(1), group(5), group(6), unknown.clone()];
    let created = app
        .create_reminder(reminder_body("sales-1", &targets))
        .await;
    app.assert_schema("Reminder", &created).await;
    let pre = &created["preflight"];
    assert!(pre["directory_synced_at"].is_string(), "{pre}");
    assert_eq!(pre["groups"], 4);
    let want = vec![
        (group(5), "The account is not in this group".to_owned()),
        (group(6), "Only admins may post".to_owned()),
        (
            unknown.clone(),
            "The account is not in this group".to_owned(),
        ),
    ];
    let got = refused(pre);
    assert_eq!(got.len(), 3, "{pre}");
    for ((g, r), (wg, wr)) in got.iter().zip(&want) {
        assert_eq!(g, wg);
        assert!(r.starts_with(wr.as_str()), "{r}");
    }
    let rid = created["id"].as_i64().unwrap();

    let forecast = app
        .post_empty(&format!("/v1/reminders/{rid}/forecast"))
        .await;
    assert_eq!(forecast.status, 200, "{}", forecast.text);
    app.assert_schema("Forecast", &forecast.json).await;
    assert_eq!(forecast.json["groups"], 1, "refused groups cost nothing");
    assert_eq!(refused(&forecast.json["preflight"]).len(), 3);

    let r = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(r.status, 202, "{}", r.text);
    let run = r.json["run_id"].as_i64().unwrap();
    let done = app
        .wait_run(run, 20, |r| r["finished_at"].is_string())
        .await;
    assert_eq!(done["status"], "partial", "{done}");
    assert_eq!(done["counts"]["sent"], 1);
    assert_eq!(done["counts"]["failed"], 3);
    let failed = app
        .get(&format!("/v1/runs/{run}/targets?status=failed"))
        .await;
    for t in failed.json["items"].as_array().unwrap() {
        assert_eq!(t["attempts"], 0, "no send was tried: {t}");
        assert!(
            t["error"].as_str().unwrap().contains("group directory"),
            "{t}"
        );
    }
    // Nothing reached the groups it cannot post to.
    assert_eq!(sim.delivered(&account), 1);

    // An edit reports again.
    let mut body = reminder_body("sales-1", &[group(2), group(6)]);
    body["title"] = json!("Edited");
    let edited = app.put(&format!("/v1/reminders/{rid}"), body).await;
    assert_eq!(edited.status, 200, "{}", edited.text);
    assert_eq!(refused(&edited.json["preflight"]).len(), 1);
}
