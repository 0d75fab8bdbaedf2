//! The control port's edge across restarts and daemons, on real processes:
//! a console session ends with the token that opened it (SQLite, one
//! daemon restarted with another token; PostgreSQL, two daemons of a
//! cluster restarted with another), and a forwarding header is honoured
//! only as the cluster sends it, every misuse refused and on the trail.

use crate::common::cluster;
use crate::common::daemon as harness;
use crate::common::postgres;

use harness::{request, Daemon};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const TOKEN_A: &str = "edge-token-a-0123456789abcdef";
const TOKEN_B: &str = "edge-token-b-fedcba9876543210";

fn start(dir: &Path, token: &str) -> Daemon {
    let mut d = Daemon::start(dir, &[("HERALD_CONTROL__TOKEN", token.into())]);
    d.wait_healthy(Duration::from_secs(60));
    d
}

fn cookie_of(head: &str) -> Option<String> {
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie: herald_session=")
                .then(|| {
                    l["set-cookie: ".len()..]
                        .split(';')
                        .next()
                        .unwrap()
                        .to_owned()
                })
        })
        .filter(|c| c != "herald_session=")
}

/// Signs in to the console with `token` (or, on an open port, by opening
/// the sign-in page): the session's cookie.
fn sign_in(port: u16, token: Option<&str>) -> String {
    let origin = "Sec-Fetch-Site: same-origin".to_owned();
    let (status, head, body) = match token {
        Some(t) => request(
            port,
            "POST",
            "/sign-in",
            &[
                origin,
                "Content-Type: application/x-www-form-urlencoded".into(),
            ],
            &format!("token={t}"),
        ),
        None => request(port, "GET", "/sign-in", &[], ""),
    }
    .expect("the daemon answers");
    assert_eq!(status, 303, "{head}\n{body}");
    cookie_of(&head).unwrap_or_else(|| panic!("no session cookie: {head}"))
}

/// The status a console page answers with `cookie` (303: to the sign-in).
fn page(port: u16, cookie: &str, path: &str) -> u16 {
    request(port, "GET", path, &[format!("Cookie: {cookie}")], "")
        .expect("the daemon answers")
        .0
}

fn bearer(port: u16, token: &str, path: &str) -> u16 {
    harness::http(port, "GET", path, Some(token))
        .expect("the daemon answers")
        .0
}

#[test]
fn a_rotated_token_ends_every_console_session_it_opened_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    // Opened while the port had no token.
    let open = start(dir.path(), "none");
    let anonymous = sign_in(open.port, None);
    assert_eq!(page(open.port, &anonymous, "/users"), 200);
    open.stop();

    let a = start(dir.path(), TOKEN_A);
    assert_eq!(
        page(a.port, &anonymous, "/"),
        303,
        "a session of the open port outlives the token configured after it"
    );
    let under_a = sign_in(a.port, Some(TOKEN_A));
    assert_eq!(page(a.port, &under_a, "/"), 200);
    assert_eq!(page(a.port, &under_a, "/users"), 200);
    a.stop();

    // The same token again: the session goes on across the restart.
    let a = start(dir.path(), TOKEN_A);
    assert_eq!(page(a.port, &under_a, "/users"), 200);
    a.stop();

    let b = start(dir.path(), TOKEN_B);
    for path in ["/", "/users", "/audit"] {
        assert_eq!(page(b.port, &under_a, path), 303, "{path} under token B");
    }
    assert_eq!(bearer(b.port, TOKEN_A, "/v1/runs"), 401);
    assert_eq!(bearer(b.port, TOKEN_B, "/v1/runs"), 200);
    // Its event stream is closed to it too.
    assert_eq!(page(b.port, &under_a, "/v1/events"), 401);
    let under_b = sign_in(b.port, Some(TOKEN_B));
    assert_eq!(page(b.port, &under_b, "/users"), 200);
    b.stop();
}

/// The audit entries of `operation` a daemon shows, newest first.
fn audit(port: u16, token: &str, operation: &str) -> Vec<Value> {
    let (status, _, body) = harness::http(
        port,
        "GET",
        &format!("/v1/audit?operation={operation}"),
        Some(token),
    )
    .expect("the daemon answers");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["items"].as_array().unwrap().clone()
}

/// A request to `port` with the daemon token and forwarding headers.
fn forwarded(
    port: u16,
    token: &str,
    method: &str,
    path: &str,
    hop: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let mut headers = vec![
        format!("Authorization: Bearer {token}"),
        "Content-Type: application/json".to_owned(),
    ];
    headers.extend(hop.iter().map(|(k, v)| format!("{k}: {v}")));
    let (status, _, body) = request(port, method, path, &headers, body).expect("answers");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

#[test]
fn across_a_cluster_a_rotation_ends_sessions_and_a_forwarding_header_cannot_hide_a_write() {
    let Some(base) = postgres::base("the edge test on a cluster") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let db = cluster::Db::create(&base);
    let node = |name: &str, token: &str| {
        let mut d = cluster::start_node(name, tmp.path(), db.url(), token, 3, &[]);
        d.wait_healthy(Duration::from_secs(60));
        d
    };
    let (n1, n2) = (node("n1", TOKEN_A), node("n2", TOKEN_A));
    let cookie = sign_in(n1.port, Some(TOKEN_A));
    assert_eq!(
        page(n2.port, &cookie, "/users"),
        200,
        "one session, two daemons"
    );
    n1.stop();
    n2.stop();
    let (n1, n2) = (node("n1", TOKEN_B), node("n2", TOKEN_B));
    assert_eq!(page(n1.port, &cookie, "/users"), 303);
    assert_eq!(page(n2.port, &cookie, "/users"), 303);

    // The daemon token with a forwarding header, on a route that never
    // forwards: refused, and on the trail of the daemon it reached,
    // naming the daemon it claims.
    let user = r#"{"name":"backdoor","role":"admin"}"#;
    let hop = [
        ("x-herald-forwarded-by", "n1"),
        ("x-herald-forwarded-for", "control.token"),
    ];
    let (status, problem) = forwarded(n2.port, TOKEN_B, "POST", "/v1/users", &hop, user);
    assert_eq!(status, 400, "{problem}");
    assert_eq!(problem["field"], "x-herald-forwarded-by", "{problem}");
    let refused = audit(n2.port, TOKEN_B, "createUser");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["status"], 400);
    assert_eq!(refused[0]["forwarded_by"], "n1");
    assert_eq!(refused[0]["actor"], "control.token");
    assert_eq!(
        bearer(n2.port, TOKEN_B, "/v1/users"),
        200,
        "the port still answers"
    );
    let (_, users) = forwarded(n2.port, TOKEN_B, "GET", "/v1/users", &[], "");
    assert!(
        !users.to_string().contains("backdoor"),
        "no user was made: {users}"
    );

    // A daemon that is not of the cluster, or a principal nobody is:
    // refused before any route runs, on the trail.
    for (hop, field) in [
        (
            [
                ("x-herald-forwarded-by", "n9"),
                ("x-herald-forwarded-for", "control.token"),
            ],
            "x-herald-forwarded-by",
        ),
        (
            [
                ("x-herald-forwarded-by", "n1"),
                ("x-herald-forwarded-for", "user:999"),
            ],
            "x-herald-forwarded-for",
        ),
    ] {
        let (status, problem) = forwarded(n2.port, TOKEN_B, "POST", "/v1/runs/1/stop", &hop, "");
        assert_eq!(status, 400, "{problem}");
        assert_eq!(problem["field"], field, "{problem}");
    }
    assert_eq!(audit(n2.port, TOKEN_B, "refusedForwarding").len(), 2);
    n1.stop();
    n2.stop();
    db.drop_database();
}
