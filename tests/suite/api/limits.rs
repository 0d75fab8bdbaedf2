//! The port's own limits: a client that floods requests or opens too many
//! event streams is refused (429 / 503 with Retry-After, problem+json) and
//! cannot change anything meanwhile; other clients and the CLI's pace are
//! not hurt.

use crate::api::helpers::*;
use serde_json::json;

#[actix_rt::test]
async fn a_flood_gets_429_with_retry_after_and_changes_nothing() {
    let app = spawn_app_with(&[
        ("HERALD_CONTROL__RATE_LIMIT_PER_SECOND", "2"),
        ("HERALD_CONTROL__RATE_LIMIT_BURST", "5"),
    ])
    .await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(app.get("/v1/runs").await.status);
    }
    // The burst passes, then the bucket is empty.
    assert_eq!(&statuses[..5], &[200; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    let r = app
        .post("/v1/accounts", json!({"id": "flood", "kind": "simulator"}))
        .await;
    assert_problem(&r, 429, None);
    let wait: u64 = r
        .headers
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5).contains(&wait), "{wait}");
    // The open routes (probes, metrics) count against the same bucket: a
    // client cannot hammer them either.
    for path in ["/healthz", "/metrics", "/openapi.json"] {
        assert_eq!(app.get(path).await.status, 429, "{path}");
    }
    // After the wait the client may go on, and the refused create did not happen.
    tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
    let r = app.get("/v1/accounts").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["items"], json!([]));
}

#[actix_rt::test]
async fn the_default_rate_lets_a_busy_cli_through() {
    let app = spawn_app().await;
    // More than any one CLI command makes (a list of many pages, a watch).
    for _ in 0..150 {
        assert_eq!(app.get("/v1/runs?limit=1").await.status, 200);
    }
}

#[actix_rt::test]
async fn event_streams_beyond_the_limit_get_503_until_one_closes() {
    let app = spawn_app_with(&[("HERALD_CONTROL__MAX_EVENT_STREAMS", "2")]).await;
    let open = || async {
        let mut req = app.client.get(app.url("/v1/events"));
        if let Some(t) = &app.token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        req.send().await.unwrap()
    };
    let first = open().await;
    let second = open().await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let r = app.get("/v1/events").await;
    assert_problem(&r, 503, None);
    assert!(r.headers.get("retry-after").is_some());
    // Closing one frees its slot. The server notices a closed connection
    // when a write to it fails: fired runs give the streams events to write.
    drop(first);
    app.add_account("acc").await;
    let reminder = app.create_reminder(reminder_body("acc", &groups(1))).await["id"].clone();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        app.post_empty(&format!("/v1/reminders/{reminder}/fire"))
            .await;
        let mut req = app.client.get(app.url("/v1/events"));
        if let Some(t) = &app.token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        let res = req.send().await.unwrap();
        if res.status().as_u16() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was not freed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    drop(second);
}

#[actix_rt::test]
async fn scrapes_are_limited_and_a_metrics_token_is_asked_for_when_set() {
    let scrape_token = "metrics-token-0123456789abcdef";
    let app = spawn_app_with(&[
        ("HERALD_CONTROL__TOKEN", TOKEN),
        ("HERALD_CONTROL__RATE_LIMIT_PER_SECOND", "2"),
        ("HERALD_CONTROL__RATE_LIMIT_BURST", "5"),
        ("HERALD_CONTROL__METRICS_TOKEN", scrape_token),
    ])
    .await;
    let scrape = |token: &'static str| {
        let req = app
            .client
            .get(app.url("/metrics"))
            .insert_header(("Authorization", format!("Bearer {token}")));
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // The daemon token is not the metrics token.
    assert_eq!(scrape(TOKEN).await, 401);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(scrape(scrape_token).await);
    }
    // One bucket: the refused scrape above took a token of it.
    assert_eq!(&statuses[..4], &[200; 4], "{statuses:?}");
    assert!(statuses[4..].iter().all(|s| *s == 429), "{statuses:?}");
}
