//! Optimistic concurrency: an edit that names a version it read with
//! `If-Match` applies only while that version is current, so two
//! operators cannot silently overwrite each other.

use crate::api::helpers::*;
use serde_json::json;

fn etag(r: &Resp) -> String {
    r.headers
        .get("etag")
        .unwrap_or_else(|| panic!("no ETag on {}", r.text))
        .to_str()
        .unwrap()
        .to_owned()
}

async fn put_if(app: &TestApp, path: &str, body: &serde_json::Value, tag: &str) -> Resp {
    let bytes = serde_json::to_vec(body).unwrap();
    app.send(
        "PUT",
        path,
        Some("application/json"),
        Some(bytes),
        &[("If-Match", tag)],
    )
    .await
}

#[actix_rt::test]
async fn a_stale_if_match_on_a_reminder_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.add_account("ops").await;
    let mut body = reminder_body("ops", &groups(2));
    let created = app.create_reminder(body.clone()).await;
    let path = format!("/v1/reminders/{}", created["id"]);

    // Two operators read the same version.
    let read = app.get(&path).await;
    let tag = etag(&read);
    assert_eq!(etag(&app.get(&path).await), tag, "same record, same ETag");

    // The first edit wins and moves the ETag.
    body["title"] = json!("first operator");
    let first = put_if(&app, &path, &body, &tag).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let moved = etag(&first);
    assert_ne!(moved, tag);
    assert_eq!(etag(&app.get(&path).await), moved);

    // The second, still holding the old version, is refused: 412, and the
    // store keeps the first edit.
    let before = app.snapshot().await;
    body["title"] = json!("second operator");
    let second = put_if(&app, &path, &body, &tag).await;
    assert_problem(&second, 412, Some("If-Match"));
    assert!(
        second.text.contains("changed since you read it"),
        "{}",
        second.text
    );
    assert_eq!(app.snapshot().await, before, "a refused edit wrote");
    assert_eq!(app.get(&path).await.json["title"], "first operator");

    // A list of tags matches any of them; `*` matches whatever is current;
    // no If-Match at all edits as before.
    body["title"] = json!("listed");
    let listed = put_if(&app, &path, &body, &format!("{tag}, {moved}")).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    body["title"] = json!("star");
    assert_eq!(put_if(&app, &path, &body, "*").await.status, 200);
    body["title"] = json!("blind");
    assert_eq!(app.put(&path, body.clone()).await.status, 200);
    // A weak tag never matches an edit (RFC 9110 strong comparison).
    let now = etag(&app.get(&path).await);
    let weak = put_if(&app, &path, &body, &format!("W/{now}")).await;
    assert_problem(&weak, 412, Some("If-Match"));
}

#[actix_rt::test]
async fn a_stale_if_match_on_an_account_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.add_account("ops").await;
    let tag = etag(&app.get("/v1/accounts/ops").await);
    let patch = |tag: String, per_minute: u32| {
        let app = &app;
        async move {
            let body = serde_json::to_vec(&json!({ "max_per_minute": per_minute })).unwrap();
            app.send(
                "PATCH",
                "/v1/accounts/ops",
                Some("application/json"),
                Some(body),
                &[("If-Match", tag.as_str())],
            )
            .await
        }
    };
    let first = patch(tag.clone(), 20).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_ne!(etag(&first), tag);
    let before = app.snapshot().await;
    let second = patch(tag, 50).await;
    assert_problem(&second, 412, Some("If-Match"));
    assert_eq!(app.snapshot().await, before, "a refused edit wrote");
    assert_eq!(
        app.get("/v1/accounts/ops").await.json["limits"]["max_per_minute"],
        20
    );
}
