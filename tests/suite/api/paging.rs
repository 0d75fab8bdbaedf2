//! Keyset paging on the lists that had none: reminders (as summaries
//! without their targets) and accounts.

use crate::api::helpers::*;
use serde_json::{json, Value};

/// Follows `next_after` from the first page; answers every page's ids.
async fn pages(app: &TestApp, path: &str, limit: usize) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let q = match &after {
            None => format!("{path}?limit={limit}"),
            Some(a) => format!("{path}?limit={limit}&after={a}"),
        };
        let r = app.get(&q).await;
        assert_eq!(r.status, 200, "{q}: {}", r.text);
        let ids: Vec<Value> = r.json["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].clone())
            .collect();
        assert!(ids.len() <= limit);
        out.push(ids);
        match &r.json["next_after"] {
            Value::Null => return out,
            Value::String(s) => after = Some(s.clone()),
            v => after = Some(v.to_string()),
        }
        assert!(out.len() < 50, "paging does not end");
    }
}

#[actix_rt::test]
async fn reminders_page_by_id_as_summaries() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(app.create_reminder(reminder_body("acc", &groups(3))).await["id"].clone());
    }
    let got = pages(&app, "/v1/reminders", 3).await;
    assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 1]);
    assert_eq!(got.concat(), ids);

    // A summary counts targets and parts instead of listing them; the
    // single reminder keeps the full form.
    let r = app.get("/v1/reminders?limit=1").await;
    let first = &r.json["items"][0];
    assert_eq!(
        (first["targets"].clone(), first["parts"].clone()),
        (json!(3), json!(1))
    );
    app.assert_schema("ReminderPage", &r.json).await;
    let full = app.get(&format!("/v1/reminders/{}", ids[0])).await;
    assert_eq!(full.json["targets"], json!(groups(3)));

    // An exact last page says so: no cursor to a page that is empty.
    let r = app.get(&format!("/v1/reminders?after={}", ids[3])).await;
    assert_eq!(r.json["items"].as_array().unwrap().len(), 3);
    assert!(r.json["next_after"].is_null());
    for (q, field) in [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("after=x", "after"),
        ("after=-1", "after"),
        ("state=", "state"),
    ] {
        assert_problem(
            &app.get(&format!("/v1/reminders?{q}")).await,
            400,
            Some(field),
        );
    }
}

#[actix_rt::test]
async fn accounts_page_by_id() {
    let app = spawn_app().await;
    let names = ["a1", "a2", "b", "c-1", "z"];
    for n in names {
        app.add_account(n).await;
    }
    let got = pages(&app, "/v1/accounts", 2).await;
    assert_eq!(got.len(), 3);
    assert_eq!(got.concat(), names.map(|n| json!(n)).to_vec());
    let r = app.get("/v1/accounts?limit=2").await;
    app.assert_schema("AccountPage", &r.json).await;
    assert_eq!(r.json["next_after"], "a2");
    for (q, field) in [("limit=0", "limit"), ("after=Bad%20Id", "after")] {
        assert_problem(
            &app.get(&format!("/v1/accounts?{q}")).await,
            400,
            Some(field),
        );
    }
}
