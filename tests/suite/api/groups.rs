//! The group directory over the control port: a simulated account's
//! groups are synced when it is created, then listed, searched, paged,
//! labelled and synced again on demand, within the sync throttle.

use crate::api::helpers::*;
use herald_actors::domain::AccountId;
use herald_actors::simulator::{GroupAccess, Simulator};
use serde_json::{json, Value};

fn jids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["jid"].as_str().unwrap().to_owned())
        .collect()
}

#[actix_rt::test]
async fn a_new_account_lists_its_groups_and_pages_and_searches_them() {
    let app = spawn_app().await;
    app.add_account("sales-1").await;
    let all = app.get("/v1/accounts/sales-1/groups").await;
    assert_eq!(all.status, 200, "{}", all.text);
    app.assert_schema("GroupPage", &all.json).await;
    // The helper's daemon puts each simulated account in 60 groups.
    assert_eq!(all.json["total"], 60);
    assert_eq!(all.json["items"][0]["jid"], group(0));
    assert_eq!(all.json["items"][0]["subject"], "Group 0000");
    assert_eq!(all.json["items"][0]["can_post"], true);
    assert!(all.json["next_after"].is_null(), "one page of 100");

    // Keyset pages of 25 visit each group once.
    let mut seen = Vec::new();
    let mut path = "/v1/accounts/sales-1/groups?limit=25".to_owned();
    loop {
        let page = app.get(&path).await;
        assert_eq!(page.status, 200, "{}", page.text);
        assert_eq!(page.json["total"], 60);
        seen.extend(jids(&page.json));
        match page.json["next_after"].as_str() {
            Some(after) => path = format!("/v1/accounts/sales-1/groups?limit=25&after={after}"),
            None => break,
        }
    }
    assert_eq!(seen, (0..60).map(group).collect::<Vec<_>>());

    let found = app
        .get("/v1/accounts/sales-1/groups?name=GROUP%20004")
        .await;
    assert_eq!(found.json["total"], 10, "{}", found.text);
    assert_eq!(jids(&found.json)[0], group(40));
}

#[actix_rt::test]
async fn labels_are_set_checked_and_filtered_on() {
    let app = spawn_app().await;
    app.add_account("sales-1").await;
    for i in [3, 7, 11] {
        let path = format!("/v1/accounts/sales-1/groups/{}/labels", group(i));
        let r = app
            .put(&path, json!({ "labels": ["weekly", "east"] }))
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["labels"], json!(["east", "weekly"]));
        app.assert_schema("Group", &r.json).await;
    }
    let east = app.get("/v1/accounts/sales-1/groups?label=east").await;
    assert_eq!(jids(&east.json), vec![group(3), group(7), group(11)]);
    assert_eq!(east.json["total"], 3);

    let before = app
        .get("/v1/accounts/sales-1/groups?include_left=true")
        .await;
    let path = format!("/v1/accounts/sales-1/groups/{}/labels", group(3));
    let bad = app.put(&path, json!({ "labels": ["ok", "Not OK"] })).await;
    assert_problem(&bad, 422, Some("labels[1]"));
    let twice = app.put(&path, json!({ "labels": ["a", "a"] })).await;
    assert_problem(&twice, 422, Some("labels[1]"));
    let unknown = app
        .put(
            "/v1/accounts/sales-1/groups/120363999999999999@g.us/labels",
            json!({ "labels": ["x"] }),
        )
        .await;
    assert_problem(&unknown, 404, None);
    let after = app
        .get("/v1/accounts/sales-1/groups?include_left=true")
        .await;
    assert_eq!(before.json, after.json, "a refused label wrote");

    let cleared = app.put(&path, json!({ "labels": [] })).await;
    assert_eq!(cleared.json["labels"], json!([]));
    let bad_query = app.get("/v1/accounts/sales-1/groups?label=Nope").await;
    assert_problem(&bad_query, 400, Some("label"));
    let nobody = app.get("/v1/accounts/nobody/groups").await;
    assert_problem(&nobody, 404, None);
}

#[actix_rt::test]
async fn a_sync_is_throttled_then_picks_up_leaves_renames_and_posting_rights() {
    let app = spawn_app_syncing_every_second().await;
    app.add_account("sales-1").await;
    let account = AccountId::parse("sales-1").unwrap();
    // Synced when it was created: too soon for another.
    let early = app.post_empty("/v1/accounts/sales-1/groups/sync").await;
    assert_problem(&early, 429, None);
    assert!(
        early.headers.contains_key("retry-after"),
        "{:?}",
        early.headers
    );

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
    sim.set_group_name(&account, &Simulator::numbered_group(7), "Clients KL");
    // The interval is one second, counted from the last attempt.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let synced = app.post_empty("/v1/accounts/sales-1/groups/sync").await;
    assert_eq!(synced.status, 200, "{}", synced.text);
    app.assert_schema("GroupSync", &synced.json).await;
    assert_eq!(
        (
            &synced.json["added"],
            &synced.json["updated"],
            &synced.json["left"],
            &synced.json["total"]
        ),
        (&json!(0), &json!(2), &json!(1), &json!(59))
    );
    let postable = app.get("/v1/accounts/sales-1/groups?can_post=false").await;
    assert_eq!(jids(&postable.json), vec![group(6)]);
    let kl = app.get("/v1/accounts/sales-1/groups?name=clients").await;
    assert_eq!(jids(&kl.json), vec![group(7)]);
    let left = app
        .get("/v1/accounts/sales-1/groups?include_left=true&limit=1&after=120363000000000004@g.us")
        .await;
    assert_eq!(left.json["items"][0]["member"], false);
}

#[actix_rt::test]
async fn a_disabled_account_cannot_sync() {
    let app = spawn_app_syncing_every_second().await;
    app.add_account("sales-1").await;
    let r = app.post_empty("/v1/accounts/sales-1/disable").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let refused = app.post_empty("/v1/accounts/sales-1/groups/sync").await;
    assert_problem(&refused, 409, None);
    let nobody = app.post_empty("/v1/accounts/nobody/groups/sync").await;
    assert_problem(&nobody, 404, None);
}

#[actix_rt::test]
async fn five_thousand_groups_are_searched_and_paged() {
    let app = spawn_app_with(&[
        ("HERALD_CONTROL__TOKEN", TOKEN),
        ("HERALD_SIMULATOR__GROUPS_PER_ACCOUNT", "5000"),
    ])
    .await;
    app.add_account("big").await;
    let page = app
        .get("/v1/accounts/big/groups?name=group%2042&limit=5")
        .await;
    assert_eq!(page.status, 200, "{}", page.text);
    // "Group 4200" to "Group 4299".
    assert_eq!(page.json["total"], 100);
    assert_eq!(
        jids(&page.json),
        (4200..4205).map(group).collect::<Vec<_>>()
    );
    let last = app
        .get(&format!(
            "/v1/accounts/big/groups?limit=1000&after={}",
            group(4499)
        ))
        .await;
    assert_eq!(last.json["items"].as_array().unwrap().len(), 500);
    assert!(last.json["next_after"].is_null());
}

#[actix_rt::test]
async fn names_and_jids_resolve_and_bad_names_are_all_listed() {
    let app = spawn_app().await;
    let account = AccountId::parse("sales-1").unwrap();
    let sim = &app.state.simulator;
    sim.set_group_name(&account, &Simulator::numbered_group(8), "Group 0007");
    app.add_account("sales-1").await;
    let ok = app
        .post(
            "/v1/accounts/sales-1/groups/resolve",
            json!({ "entries": ["group 0001", " Group 0002 ", group(30), "GROUP 0001"] }),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    app.assert_schema("ResolvedGroups", &ok.json).await;
    assert_eq!(ok.json["targets"], json!([group(1), group(2), group(30)]));

    let before = app.snapshot().await;
    let bad = app
        .post(
            "/v1/accounts/sales-1/groups/resolve",
            json!({ "entries": ["Group 0001", "Nope", "group 0007", "Group"] }),
        )
        .await;
    assert_problem(&bad, 422, Some("entries"));
    let rule = bad.json["rule"].as_str().unwrap();
    assert!(rule.contains("3 do not"), "{rule}");
    assert!(
        rule.contains(r#"entries[1] "Nope" names no group"#),
        "{rule}"
    );
    assert!(
        rule.contains(r#"entries[2] "group 0007" names 2 groups"#),
        "{rule}"
    );
    assert!(
        rule.contains(r#"entries[3] "Group" names no group"#),
        "{rule}"
    );
    // Every offender as data too, for a client to show beside its rows.
    assert_eq!(
        bad.json["offenders"],
        json!([
            {"index": 1, "entry": "Nope", "matches": 0},
            {"index": 2, "entry": "group 0007", "matches": 2},
            {"index": 3, "entry": "Group", "matches": 0},
        ]),
        "{}",
        bad.text
    );
    app.assert_schema("Problem", &bad.json).await;
    let blank = app
        .post(
            "/v1/accounts/sales-1/groups/resolve",
            json!({ "entries": [" "] }),
        )
        .await;
    assert_problem(&blank, 422, Some("entries[0]"));
    let none = app
        .post(
            "/v1/accounts/sales-1/groups/resolve",
            json!({ "entries": [] }),
        )
        .await;
    assert_problem(&none, 422, Some("entries"));
    let nobody = app
        .post(
            "/v1/accounts/nobody/groups/resolve",
            json!({ "entries": ["x"] }),
        )
        .await;
    assert_problem(&nobody, 404, None);
    assert_eq!(before, app.snapshot().await, "resolving wrote something");
}
