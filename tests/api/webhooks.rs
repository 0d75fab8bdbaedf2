//! `/v1/webhooks` refusals and edits, in-process: a bad or private URL,
//! bad types and a stale `If-Match` are refused naming the field, with
//! nothing stored or changed. Delivery end to end, with the reference
//! library verifying signatures, is in tests/webhooks.rs.

use crate::helpers::*;
use serde_json::json;

/// A public address given as an IP literal: no DNS needed in CI.
const PUBLIC: &str = "http://93.184.215.14/herald";

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
