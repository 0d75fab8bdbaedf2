//! `/v1/webhooks` refusals and edits, in-process: a bad or private URL,
//! bad types and a stale `If-Match` are refused naming the field, with
//! nothing stored or changed. Delivery end to end, with the reference
//! library verifying signatures, is in tests/suite/webhooks.rs.

use crate::api::helpers::*;
use serde_json::json;

/// A public address given as an IP literal: no DNS needed in CI.
const PUBLIC: &str = "http://93.184.215.14/herald";

/// A subscription to a public address that is switched off, so nothing is
/// sent: its id.
async fn disabled_webhook(app: &TestApp) -> i64 {
    let r = app
        .post(
            "/v1/webhooks",
            json!({"url": PUBLIC, "types": ["run.finished"], "enabled": false}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    r.json["id"].as_i64().unwrap()
}

#[actix_rt::test]
async fn bad_urls_types_and_stale_edits_are_refused_and_change_nothing() {
    let app = spawn_app_with_token().await;
    for (body, field, rule) in [
        (
            json!({"url": "ftp://93.184.215.14/x", "types": ["run.finished"]}),
            "url",
            "http or https",
        ),
        (
            json!({"url": "http://127.0.0.1:9/x", "types": ["run.finished"]}),
            "url",
            "allow_private",
        ),
        (
            json!({"url": "http://169.254.169.254/latest", "types": ["run.finished"]}),
            "url",
            "allow_private",
        ),
        (
            json!({"url": "http://[::1]/x", "types": ["run.finished"]}),
            "url",
            "allow_private",
        ),
        (json!({"url": PUBLIC, "types": []}), "types", ""),
        (
            json!({"url": PUBLIC, "types": ["run.exploded"]}),
            "types[0]",
            "",
        ),
    ] {
        let r = app.post("/v1/webhooks", body.clone()).await;
        assert_problem(&r, 422, Some(field));
        assert!(
            r.json["rule"].as_str().unwrap_or("").contains(rule),
            "{body}: {}",
            r.text
        );
    }
    assert_eq!(app.get("/v1/webhooks").await.json["items"], json!([]));

    let r = app
        .post(
            "/v1/webhooks",
            json!({"url": PUBLIC, "types": ["run.finished"], "description": "ops"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["id"].as_i64().unwrap();
    assert!(r.json["secret"].as_str().unwrap().starts_with("whsec_"));
    let got = app.get(&format!("/v1/webhooks/{id}")).await;
    assert!(got.json.get("secret").is_none());
    let tag = got
        .headers
        .get("etag")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();

    // A stale If-Match: 412, nothing changed.
    let stale = app
        .send(
            "PATCH",
            &format!("/v1/webhooks/{id}"),
            Some("application/json"),
            Some(json!({"description": "changed"}).to_string().into_bytes()),
            &[("If-Match", "\"0000\"")],
        )
        .await;
    assert_problem(&stale, 412, Some("If-Match"));
    // A private URL on edit: refused too.
    let r = app
        .patch(
            &format!("/v1/webhooks/{id}"),
            json!({"url": "http://10.0.0.8/x"}),
        )
        .await;
    assert_problem(&r, 422, Some("url"));
    assert_eq!(app.get(&format!("/v1/webhooks/{id}")).await.json, got.json);

    let ok = app
        .send(
            "PATCH",
            &format!("/v1/webhooks/{id}"),
            Some("application/json"),
            Some(
                json!({"description": "changed", "enabled": false})
                    .to_string()
                    .into_bytes(),
            ),
            &[("If-Match", &tag)],
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    assert_eq!(
        (ok.json["description"].clone(), ok.json["enabled"].clone()),
        (json!("changed"), json!(false))
    );

    let r = app.get(&format!("/v1/webhooks/{id}/deliveries")).await;
    assert_eq!(r.json["items"], json!([]));
    assert_problem(&app.get("/v1/webhooks/999/deliveries").await, 404, None);
    assert_problem(&app.post_empty("/v1/webhooks/999/ping").await, 404, None);
    assert_eq!(app.delete(&format!("/v1/webhooks/{id}")).await.status, 204);
    assert_problem(&app.get(&format!("/v1/webhooks/{id}")).await, 404, None);
}

/// A disabled subscription's deliveries show as `held` and go back to
/// `pending` when it is enabled; a second rotation inside an overlap keeps
/// the first secret signing until its own end; a ninth secret signing at
/// once is refused with 409.
#[actix_rt::test]
async fn a_disabled_webhook_holds_its_deliveries_and_rotations_keep_earlier_secrets() {
    let app = spawn_app_with_token().await;
    let id = disabled_webhook(&app).await;
    let ping = app.post_empty(&format!("/v1/webhooks/{id}/ping")).await;
    assert_eq!(ping.status, 202, "{}", ping.text);
    assert_eq!(ping.json["status"], "held");
    let list = app.get(&format!("/v1/webhooks/{id}/deliveries")).await;
    assert_eq!(list.json["items"][0]["status"], "held", "{}", list.text);
    let on = app
        .patch(&format!("/v1/webhooks/{id}"), json!({"enabled": true}))
        .await;
    assert_eq!(on.status, 200, "{}", on.text);
    let list = app.get(&format!("/v1/webhooks/{id}/deliveries")).await;
    assert_eq!(list.json["items"][0]["status"], "pending", "{}", list.text);

    let rotate = |hours: u32| {
        let path = format!("/v1/webhooks/{id}/rotate?overlap_hours={hours}");
        let app = &app;
        async move { app.post_empty(&path).await }
    };
    let first = rotate(24).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let until = first.json["old_secret_until"].as_str().unwrap().to_owned();
    let second = rotate(1).await;
    assert_eq!(second.status, 200, "{}", second.text);
    assert_eq!(
        second.json["old_secret_until"], until,
        "the first secret still signs until its own end"
    );
    for _ in 0..5 {
        assert_eq!(rotate(24).await.status, 200);
    }
    let refused = rotate(24).await;
    assert_problem(&refused, 409, None);
    assert!(refused.text.contains("secrets signing"), "{}", refused.text);
}

#[actix_rt::test]
async fn the_console_adds_shows_and_disables_webhooks_and_says_why_one_is_off() {
    use herald_actors::domain::{AttemptOutcome, NewEvent};
    let app = spawn_app_with_token().await;
    let mut b = crate::api::console::signed_in(&app).await;
    let csrf = b.csrf().await;
    let p = b
        .post(
            "/webhooks",
            &[
                ("csrf", &csrf),
                ("url", PUBLIC),
                ("types", "run.finished"),
                ("types", "account.state_changed"),
                ("description", "ops chat"),
            ],
        )
        .await;
    assert_eq!(p.status, 201, "{}", p.text);
    assert!(p.text.contains("whsec_"), "the secret is shown once");
    let listed = app.get("/v1/webhooks").await.json["items"][0].clone();
    assert_eq!(
        listed["types"],
        json!(["run.finished", "account.state_changed"])
    );
    let id = listed["id"].as_i64().unwrap();
    assert!(!b.get("/webhooks").await.text.contains("whsec_"));

    // A receiver that failed for too long: Herald turned it off, and the
    // page says why.
    let store = &app.state.store;
    store
        .append_event(&NewEvent {
            at: chrono::Utc::now(),
            kind: "run_finished",
            account_id: None,
            run_id: None,
            data: json!({"status": "success"}),
        })
        .await
        .unwrap();
    let now = chrono::Utc::now();
    let due = store
        .claim_deliveries("console-test", now, now + chrono::Duration::seconds(60), 10)
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    let gave_up = AttemptOutcome::GaveUp {
        status: Some(502),
        error: "answered 502: bad gateway".into(),
    };
    store
        .finish_attempt(
            due[0].delivery.id,
            "console-test",
            &gave_up,
            now,
            std::time::Duration::ZERO,
        )
        .await
        .unwrap();
    let page = b.get(&format!("/webhooks/{id}")).await;
    assert!(
        page.text.contains("is off: disabled by Herald") && page.text.contains("bad gateway"),
        "{}",
        page.text
    );
    assert!(page.text.contains("run.finished"), "its delivery is listed");
    let p = b
        .post(&format!("/webhooks/{id}/enable"), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    assert_eq!(
        app.get(&format!("/v1/webhooks/{id}")).await.json["enabled"],
        true
    );
    let audit = app.get("/v1/audit?operation=patchWebhook").await;
    assert_eq!(audit.json["items"][0]["via"], "console");

    // Not for a viewer.
    let r = app
        .post("/v1/users", json!({"name": "vic", "role": "operator"}))
        .await;
    let token = r.json["token"].as_str().unwrap().to_owned();
    let mut op = crate::api::console::Browser::new(&app);
    assert_eq!(op.sign_in(&token).await.status, 303);
    assert_eq!(op.get("/webhooks").await.status, 403);
}

/// A ping is an event like any other: a live follower of `/v1/events`
/// sees it as it happens, not only on a later replay.
#[actix_rt::test]
async fn a_ping_reaches_live_followers_of_the_event_log() {
    let app = spawn_app_with_token().await;
    let id = disabled_webhook(&app).await;
    // Live only (no `after`): subscribe first, then ping.
    let (events, ping) = futures_util::join!(
        app.read_events("/v1/events", &[], 10, |evs| {
            evs.iter().any(|e| e.kind == "webhook_ping")
        }),
        async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            app.post_empty(&format!("/v1/webhooks/{id}/ping")).await
        }
    );
    assert_eq!(ping.status, 202, "{}", ping.text);
    let seen = events
        .iter()
        .find(|e| e.kind == "webhook_ping")
        .expect("the ping on the live stream");
    assert_eq!(seen.data["data"]["webhook_id"], id, "{:?}", seen.data);
}
