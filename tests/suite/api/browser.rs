//! A web page the operator opens must not drive the port: cross-site
//! requests, rebinding Host names and JSON bodies without a JSON type are
//! refused with problem+json naming the rule, and change nothing — even
//! when the page holds the right token.

use crate::api::helpers::*;
use serde_json::json;

/// A request a hostile page could make, with the daemon's own token.
async fn attempt(app: &TestApp, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let body = json!({"id": "evil", "kind": "simulator"}).to_string();
    app.send(
        method,
        path,
        Some("application/json"),
        Some(body.into_bytes()),
        headers,
    )
    .await
}

#[actix_rt::test]
async fn cross_site_requests_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let r = app.create_reminder(reminder_body("acc", &groups(2))).await;
    let fire = format!("/v1/reminders/{}/fire", r["id"]);
    let before = app.snapshot().await;
    let other_port = format!(
        "http://127.0.0.1:{}",
        app.base.rsplit(':').next().unwrap().parse::<u16>().unwrap() + 1
    );
    for (headers, field) in [
        (vec![("Origin", "http://evil.example")], "Origin"),
        (vec![("Origin", "null")], "Origin"),
        (vec![("Origin", other_port.as_str())], "Origin"),
        (vec![("Sec-Fetch-Site", "cross-site")], "Sec-Fetch-Site"),
        (vec![("Sec-Fetch-Site", "same-site")], "Sec-Fetch-Site"),
        // The issue's request: a no-cors fetch from another site.
        (
            vec![
                ("Origin", "http://evil.example"),
                ("Sec-Fetch-Site", "cross-site"),
            ],
            "Sec-Fetch-Site",
        ),
    ] {
        for (method, path) in [
            ("POST", "/v1/accounts"),
            ("POST", fire.as_str()),
            ("DELETE", "/v1/accounts/acc"),
            ("GET", "/v1/accounts"),
        ] {
            let r = attempt(&app, method, path, &headers).await;
            assert_problem(&r, 403, Some(field));
            assert_eq!(r.json["type"], "urn:herald:problem:forbidden");
        }
    }
    assert_eq!(app.snapshot().await, before);

    // The port's own page (same origin) is served.
    let own = app.base.clone();
    let r = attempt(
        &app,
        "POST",
        "/v1/accounts",
        &[("Origin", &own), ("Sec-Fetch-Site", "same-origin")],
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
}

#[actix_rt::test]
async fn rebinding_host_names_are_refused_on_every_route() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let before = app.snapshot().await;
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    let evil = format!("evil.example:{port}");
    for (method, path) in [
        ("POST", "/v1/accounts"),
        ("GET", "/v1/accounts"),
        ("GET", "/metrics"),
        ("GET", "/healthz"),
        ("GET", "/openapi.json"),
    ] {
        let r = attempt(&app, method, path, &[("Host", &evil)]).await;
        assert_problem(&r, 403, Some("Host"));
    }
    assert_eq!(app.snapshot().await, before);

    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = app
            .send("GET", "/v1/accounts", None, None, &[("Host", &host)])
            .await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
    }
}

#[actix_rt::test]
async fn allowed_hosts_adds_names() {
    let app = spawn_app_with(&[("HERALD_CONTROL__ALLOWED_HOSTS", "herald.lan, Ops.Example")]).await;
    for host in ["herald.lan:8790", "ops.example"] {
        let r = app
            .send("GET", "/v1/accounts", None, None, &[("Host", host)])
            .await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
    }
    let r = app
        .send("GET", "/v1/accounts", None, None, &[("Host", "other.lan")])
        .await;
    assert_problem(&r, 403, Some("Host"));
}

#[actix_rt::test]
async fn json_bodies_need_a_json_content_type() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let r = app.create_reminder(reminder_body("acc", &groups(1))).await;
    let before = app.snapshot().await;
    let account = json!({"id": "new", "kind": "simulator"}).to_string();
    let reminder = reminder_body("acc", &groups(2)).to_string();
    let put = format!("/v1/reminders/{}", r["id"]);
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
    ] {
        for (method, path, body) in [
            ("POST", "/v1/accounts", &account),
            ("POST", "/v1/reminders", &reminder),
            ("PUT", put.as_str(), &reminder),
            (
                "PATCH",
                "/v1/accounts/acc",
                &r#"{"max_per_minute": 5}"#.to_owned(),
            ),
        ] {
            let r = app
                .send(method, path, ct, Some(body.clone().into_bytes()), &[])
                .await;
            assert_problem(&r, 415, Some("Content-Type"));
        }
    }
    assert_eq!(app.snapshot().await, before);
    // Any +json type is JSON.
    let r = app
        .send(
            "PATCH",
            "/v1/accounts/acc",
            Some("application/merge-patch+json"),
            Some(br#"{"max_per_minute": 5}"#.to_vec()),
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}
