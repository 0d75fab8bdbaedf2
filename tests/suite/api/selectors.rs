//! Target selectors: a reminder picks groups from its account's directory
//! (`all`, labels, a name pattern, excludes, plus explicit JIDs); its run
//! resolves them once and keeps them, each saying how it was chosen.

use crate::api::helpers::*;
use chrono::Timelike;
use herald_actors::domain::AccountId;
use herald_actors::simulator::{GroupAccess, Simulator};
use serde_json::{json, Value};

fn selecting(select: Value, targets: &[String]) -> Value {
    let mut body = reminder_body("sales-1", targets);
    body["select"] = select;
    body
}

/// Fires the reminder and answers the run's targets as (jid, chosen_by),
/// once it has started.
async fn fire_and_list(app: &TestApp, rid: i64) -> (i64, Vec<(String, String)>) {
    let r = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(r.status, 202, "{}", r.text);
    let run = r.json["run_id"].as_i64().unwrap();
    // `started_at` is written before the run picks its groups; the
    // forecast is stored after, once the targets exist.
    app.wait_run(run, 10, |r| r["forecast"].is_string()).await;
    (run, targets_of(app, run).await)
}

/// [`fire_and_list`], then stops the run so the account's next run starts.
async fn fire_list_stop(app: &TestApp, rid: i64) -> Vec<(String, String)> {
    let (run, targets) = fire_and_list(app, rid).await;
    let r = app.post_empty(&format!("/v1/runs/{run}/stop")).await;
    assert!(r.status == 202 || r.status == 409, "{}", r.text);
    app.wait_run(run, 10, |r| r["finished_at"].is_string())
        .await;
    targets
}

async fn targets_of(app: &TestApp, run: i64) -> Vec<(String, String)> {
    let page = app.get(&format!("/v1/runs/{run}/targets?limit=500")).await;
    assert_eq!(page.status, 200, "{}", page.text);
    app.assert_schema("TargetPage", &page.json).await;
    page.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["group"].as_str().unwrap().to_owned(),
                t["chosen_by"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn label(app: &TestApp, i: usize, labels: Value) {
    let path = format!("/v1/accounts/sales-1/groups/{}/labels", group(i));
    let r = app.put(&path, json!({ "labels": labels })).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[actix_rt::test]
async fn every_selector_kind_and_their_combination() {
    let app = spawn_app_syncing_every_second().await;
    app.add_account("sales-1").await;
    let account = AccountId::parse("sales-1").unwrap();
    let sim = &app.state.simulator;
    sim.set_group_name(&account, &Simulator::numbered_group(12), "KL-East");
    sim.set_group_name(&account, &Simulator::numbered_group(13), "Team KL-East");
    sim.set_group_access(
        &account,
        &Simulator::numbered_group(59),
        GroupAccess::NotParticipant,
    );
    // The sync throttle is one second, counted from the account's first sync.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let synced = app.post_empty("/v1/accounts/sales-1/groups/sync").await;
    assert_eq!(synced.status, 200, "{}", synced.text);
    label(&app, 3, json!(["east"])).await;
    label(&app, 7, json!(["east", "vip"])).await;
    label(&app, 20, json!(["vip"])).await;

    // all, minus an exclude; the group the account is not in is not picked.
    let rem = app
        .create_reminder(selecting(json!({"all": true, "exclude": [group(0)]}), &[]))
        .await;
    app.assert_schema("Reminder", &rem).await;
    assert_eq!(rem["select"]["all"], true);
    let all = fire_list_stop(&app, rem["id"].as_i64().unwrap()).await;
    assert_eq!(
        all.iter().map(|(g, _)| g.clone()).collect::<Vec<_>>(),
        (1..59).map(group).collect::<Vec<_>>()
    );
    assert!(all.iter().all(|(_, how)| how == "all"));

    // Labels (any of), a whole-name glob, and an explicit JID, together.
    let rem = app
        .create_reminder(selecting(
            json!({"labels": ["vip", "east"], "name": "kl-*", "exclude": [group(20)]}),
            &[group(40)],
        ))
        .await;
    let got = fire_list_stop(&app, rem["id"].as_i64().unwrap()).await;
    let want: Vec<(String, String)> = [
        (40, "explicit"),
        (3, "label:east"),
        (7, "label:east"),
        (12, "name:kl-*"),
    ]
    .into_iter()
    .map(|(i, how)| (group(i), how.to_owned()))
    .collect();
    assert_eq!(got, want, "explicit first, then the union in JID order");

    // A substring pattern matches anywhere, case-insensitively.
    let rem = app
        .create_reminder(selecting(json!({"name": "KL-EAST"}), &[]))
        .await;
    let got = fire_list_stop(&app, rem["id"].as_i64().unwrap()).await;
    assert_eq!(
        got.iter().map(|(g, _)| g.clone()).collect::<Vec<_>>(),
        vec![group(12), group(13)]
    );
}

#[actix_rt::test]
async fn a_run_keeps_the_groups_it_was_resolved_with() {
    let app = spawn_app().await;
    app.add_account("sales-1").await;
    for i in [2, 4, 6] {
        label(&app, i, json!(["weekly"])).await;
    }
    let rem = app
        .create_reminder(selecting(json!({"labels": ["weekly"]}), &[]))
        .await;
    let rid = rem["id"].as_i64().unwrap();
    let (run, before) = fire_and_list(&app, rid).await;
    assert_eq!(before.len(), 3);
    // Paused, relabelled, resumed: the run starts again from its stored
    // targets, not from the directory.
    let r = app.post_empty(&format!("/v1/runs/{run}/pause")).await;
    assert!(r.status == 202 || r.status == 409, "{}", r.text);
    label(&app, 2, json!([])).await;
    label(&app, 8, json!(["weekly"])).await;
    label(&app, 10, json!(["weekly"])).await;
    if r.status == 202 {
        app.wait_run(run, 5, |r| r["status"] == "paused").await;
        let r = app.post_empty(&format!("/v1/runs/{run}/resume")).await;
        assert_eq!(r.status, 202, "{}", r.text);
    }
    app.wait_run(run, 30, |r| {
        ["success", "partial", "failed"].contains(&r["status"].as_str().unwrap())
    })
    .await;
    assert_eq!(targets_of(&app, run).await, before);
    let done = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(done.json["counts"]["sent"], 3, "{}", done.text);
    // The next firing sees the directory as it is now.
    let (_, next) = fire_and_list(&app, rid).await;
    assert_eq!(
        next.iter().map(|(g, _)| g.clone()).collect::<Vec<_>>(),
        vec![group(4), group(6), group(8), group(10)]
    );
}

/// Fired outside its window, a run waits as `scheduled`; its groups are
/// those of the moment it was created, whatever happens to the directory
/// before the window opens.
#[actix_rt::test]
async fn a_run_waiting_for_its_window_has_the_groups_of_its_firing() {
    let app = spawn_app().await;
    app.add_account("sales-1").await;
    for i in [1, 5] {
        label(&app, i, json!(["ops"])).await;
    }
    let hour = chrono::Utc::now().hour();
    let mut body = selecting(json!({"labels": ["ops"]}), &[]);
    let start = (hour + 2) % 24;
    body["window"] = json!({"start_hour": start, "end_hour": start + 1});
    let rem = app.create_reminder(body).await;
    let rid = rem["id"].as_i64().unwrap();
    let r = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(r.status, 202, "{}", r.text);
    let run = r.json["run_id"].as_i64().unwrap();
    let waiting = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(waiting.json["status"], "scheduled", "{}", waiting.text);
    let frozen = vec![
        (group(1), "label:ops".to_owned()),
        (group(5), "label:ops".to_owned()),
    ];
    assert_eq!(targets_of(&app, run).await, frozen);
    label(&app, 1, json!([])).await;
    label(&app, 9, json!(["ops"])).await;
    assert_eq!(
        targets_of(&app, run).await,
        frozen,
        "a label change after firing does not change the run"
    );
}

/// A selector that picks nothing ends its run failed, saying why, instead
/// of an empty "success".
#[actix_rt::test]
async fn a_selector_that_picks_no_group_fails_the_run_with_the_reason() {
    let app = spawn_app().await;
    app.add_account("sales-1").await;
    let rem = app
        .create_reminder(selecting(json!({"labels": ["nobody"]}), &[]))
        .await;
    let rid = rem["id"].as_i64().unwrap();
    let r = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(r.status, 202, "{}", r.text);
    let run = r.json["run_id"].as_i64().unwrap();
    let done = app
        .wait_run(run, 10, |r| r["finished_at"].is_string())
        .await;
    assert_eq!(done["status"], "failed", "{done}");
    let why = done["error_summary"].as_str().unwrap_or_default();
    assert!(why.contains("picked no group"), "{why}");
    assert_eq!(done["counts"]["sent"], 0, "{done}");
}

#[actix_rt::test]
async fn a_bad_selector_names_its_field_and_stores_nothing() {
    let app = spawn_app().await;
    app.add_account("sales-1").await;
    let before = app.snapshot().await;
    let cases = [
        (selecting(json!({}), &[]), "select"),
        (
            selecting(json!({"labels": ["Bad"]}), &[]),
            "select.labels[0]",
        ),
        (selecting(json!({"name": "**"}), &[]), "select.name"),
        (
            selecting(json!({"all": true, "exclude": ["nope"]}), &[]),
            "select.exclude[0]",
        ),
        (
            selecting(json!({"all": true, "exclude": [group(1)]}), &[group(1)]),
            "select.exclude[0]",
        ),
        (
            selecting(json!({"all": true, "every": true}), &[]),
            "select.every",
        ),
        (reminder_body("sales-1", &[]), "targets"),
    ];
    for (body, field) in cases {
        let r = app.post("/v1/reminders", body.clone()).await;
        assert_problem(&r, 422, Some(field));
    }
    assert_eq!(before, app.snapshot().await, "a refused selector wrote");
}

#[actix_rt::test]
async fn run_targets_carry_the_group_names_the_operator_picked_them_by() {
    let app = spawn_app_syncing_every_second().await;
    app.add_account("sales-1").await;
    let account = AccountId::parse("sales-1").unwrap();
    let sim = &app.state.simulator;
    sim.set_group_name(&account, &Simulator::numbered_group(12), "KL-East");
    sim.set_group_name(&account, &Simulator::numbered_group(13), "Team KL-East");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let synced = app.post_empty("/v1/accounts/sales-1/groups/sync").await;
    assert_eq!(synced.status, 200, "{}", synced.text);

    // A JID typed by hand that the account never listed has no name.
    let unknown = "120363999999999999@g.us".to_owned();
    let rem = app
        .create_reminder(selecting(
            json!({"name": "KL-East"}),
            &[group(40), unknown.clone()],
        ))
        .await;
    let rid = rem["id"].as_i64().unwrap();
    let r = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(r.status, 202, "{}", r.text);
    let run = r.json["run_id"].as_i64().unwrap();
    app.wait_run(run, 10, |r| r["forecast"].is_string()).await;
    let page = app.get(&format!("/v1/runs/{run}/targets?limit=500")).await;
    assert_eq!(page.status, 200, "{}", page.text);
    app.assert_schema("TargetPage", &page.json).await;
    let named: Vec<(String, Value)> = page.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["group"].as_str().unwrap().to_owned(),
                t["group_name"].clone(),
            )
        })
        .collect();
    let listed = app.get("/v1/accounts/sales-1/groups?limit=500").await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let name_of_40 = listed.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["jid"] == json!(group(40)))
        .map(|g| g["subject"].clone())
        .expect("group 40 in the directory");
    assert_eq!(
        named,
        vec![
            (group(40), name_of_40),
            (unknown, Value::Null),
            (group(12), json!("KL-East")),
            (group(13), json!("Team KL-East")),
        ]
    );

    // The console's run page shows the name above the JID.
    let mut b = crate::api::console::signed_in(&app).await;
    let page = b.get(&format!("/runs/{run}")).await;
    assert_eq!(page.status, 200, "{}", page.text);
    let rows = page.text.split(r#"id="targets""#).nth(1).unwrap();
    assert!(rows.contains("Team KL-East"), "{rows}");
    assert!(rows.contains(&group(13)), "the JID stays beside the name");
}
