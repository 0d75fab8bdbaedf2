//! Rejections that do not belong to one resource: malformed JSON, sizes,
//! content types, unknown routes and methods.

use crate::api::helpers::*;
use serde_json::json;

#[actix_rt::test]
async fn malformed_bodies_get_problem_json_and_change_nothing() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let before = app.snapshot().await;
    let json_ct = Some("application/json");
    for (body, status) in [
        (&b"{\"id\": \"x\", "[..], 400),
        (b"not json", 400),
        (b"", 400),
        (b"[1, 2]", 422),
        (b"\"a string\"", 422),
    ] {
        for path in ["/v1/accounts", "/v1/reminders", "/v1/accounts/acc"] {
            let method = if path == "/v1/accounts/acc" {
                "PATCH"
            } else {
                "POST"
            };
            let r = app
                .send(method, path, json_ct, Some(body.to_vec()), &[])
                .await;
            assert_problem(&r, status, None);
        }
    }
    let r = app
        .send(
            "POST",
            "/v1/accounts",
            Some("application/x-www-form-urlencoded"),
            Some(b"id=x&kind=simulator".to_vec()),
            &[],
        )
        .await;
    assert_problem(&r, 415, None);

    // Over control.max_json_bytes: refused before parsing.
    let mut big = reminder_body("acc", &groups(1));
    big["title"] = json!("x".repeat(JSON_LIMIT));
    assert_problem(&app.post("/v1/reminders", big).await, 413, None);
    assert_eq!(app.snapshot().await, before);
}

#[actix_rt::test]
async fn unknown_routes_and_methods_are_problems_too() {
    let app = spawn_app().await;
    let r = app.get("/v1/nothing-here").await;
    assert_problem(&r, 404, None);
    assert_problem(&app.get("/elsewhere").await, 404, None);
    let r = app.delete("/v1/runs").await;
    assert_problem(&r, 405, None);
    assert_eq!(r.headers.get("allow").unwrap(), "GET");
    let r = app.send("PUT", "/v1/accounts", None, None, &[]).await;
    assert_eq!(r.headers.get("allow").unwrap(), "GET, POST");
}

#[actix_rt::test]
async fn framework_errors_are_problems_too() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let before = app.snapshot().await;
    // A path segment that does not percent-decode to UTF-8 names nothing.
    for path in [
        "/v1/reminders/%FF",
        "/v1/accounts/%C3%28",
        "/v1/runs/%FF/targets",
    ] {
        assert_problem(&app.get(path).await, 404, None);
    }
    // Over actix-web's own body limit on the one route that reads raw
    // bytes (the optional pairing body): 413, problem+json.
    let r = app
        .send(
            "POST",
            "/v1/accounts/acc/pair",
            Some("application/json"),
            Some(vec![b' '; 300 * 1024]),
            &[],
        )
        .await;
    assert_problem(&r, 413, None);
    // A malformed query string.
    assert_problem(&app.get("/v1/runs?limit=%FF").await, 400, Some("limit"));
    assert_eq!(app.snapshot().await, before);
}
