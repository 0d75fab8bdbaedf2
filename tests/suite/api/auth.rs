use crate::api::helpers::*;
use serde_json::json;

#[actix_rt::test]
async fn v1_needs_the_bearer_token_and_probes_do_not() {
    let mut app = spawn_app_with_token().await;
    app.add_account("guarded").await;
    let before = app.snapshot().await;

    for auth in [
        None,
        Some("Bearer wrong-token"),
        Some("Basic dGVzdA=="),
        Some(TOKEN),
    ] {
        app.token = None;
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
        for (method, path) in [
            ("GET", "/v1/accounts"),
            ("GET", "/v1/accounts/guarded"),
            ("GET", "/v1/events"),
            ("GET", "/v1/no-such-route"),
        ] {
            let r = app.send(method, path, None, None, &headers).await;
            assert_problem(&r, 401, None);
            assert_eq!(
                r.headers.get("www-authenticate").unwrap(),
                "Bearer realm=\"herald\""
            );
        }
        let r = app
            .send(
                "POST",
                "/v1/accounts",
                Some("application/json"),
                Some(
                    json!({"id": "sneaky", "kind": "simulator"})
                        .to_string()
                        .into_bytes(),
                ),
                &headers,
            )
            .await;
        assert_problem(&r, 401, None);
        let r = app
            .send("POST", "/v1/media", None, Some(tiny_png()), &headers)
            .await;
        assert_problem(&r, 401, None);
    }
    app.token = Some(TOKEN.into());
    assert_eq!(app.snapshot().await, before);
    assert!(!app
        .data_dir
        .path()
        .join("media")
        .read_dir()
        .unwrap()
        .any(|_| true));

    // Open routes answer without a token.
    app.token = None;
    assert_eq!(app.get("/healthz").await.status, 200);
    assert_eq!(app.get("/openapi.json").await.status, 200);
    assert_ne!(app.get("/readyz").await.status, 401);
}

#[actix_rt::test]
async fn the_right_token_opens_v1() {
    let app = spawn_app_with_token().await;
    let r = app.get("/v1/accounts").await;
    assert_eq!(r.status, 200, "{}", r.text);
    app.add_account("ok").await;
}

/// Sends one HTTP/1.1 request over a Unix socket and returns the status code.
async fn status_over_unix(path: &std::path::Path, request_path: &str, token: Option<&str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req =
        format!("GET {request_path} HTTP/1.1\r\nHost: herald\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[actix_rt::test]
async fn the_unix_socket_is_0600_and_keeps_the_token_rule() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("herald.sock");
    // A stale socket file from a crashed run must not stop start-up.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let _app = spawn_app_with(&[
        ("HERALD_CONTROL__UNIX_SOCKET", sock.to_str().unwrap()),
        ("HERALD_CONTROL__TOKEN", TOKEN),
    ])
    .await;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(status_over_unix(&sock, "/healthz", None).await, 200);
    assert_eq!(status_over_unix(&sock, "/v1/accounts", None).await, 401);
    let token = TOKEN.strip_prefix("Bearer ").unwrap_or(TOKEN);
    assert_eq!(
        status_over_unix(&sock, "/v1/accounts", Some(token)).await,
        200
    );
}

#[actix_rt::test]
async fn with_no_token_configured_v1_needs_the_generated_one() {
    let mut app = spawn_app().await;
    let generated = herald::token::read(app.data_dir.path()).expect("token file");
    assert_eq!(app.token.as_deref(), Some(generated.expose()));
    app.add_account("mine").await;
    let before = app.snapshot().await;
    let token = app.token.take();
    assert_problem(&app.get("/v1/accounts").await, 401, None);
    let r = app
        .post("/v1/accounts", json!({"id": "theirs", "kind": "simulator"}))
        .await;
    assert_problem(&r, 401, None);
    app.token = token;
    assert_eq!(app.snapshot().await, before);
}

#[actix_rt::test]
async fn control_token_none_opens_v1_on_purpose_and_writes_no_token() {
    let app = spawn_app_with(&[("HERALD_CONTROL__TOKEN", "none")]).await;
    assert_eq!(app.token, None);
    assert_eq!(app.get("/v1/accounts").await.status, 200);
    assert!(herald::token::read(app.data_dir.path()).is_none());
}
