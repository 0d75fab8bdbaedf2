//! Users and roles, black-box: every `/v1` route against every role (the
//! route table itself is the test's list, so a new route is covered the
//! day it is added), revocation and expiry at once, the console by role,
//! and the audit log of a scripted session.

use crate::api::console::Browser;
use crate::api::helpers::*;
use herald::http::ROUTES;
use herald_actors::domain::{NewApiUser, Role};
use serde_json::{json, Value};

/// A user made through the API by the daemon's token; answers its token.
async fn add_user(app: &TestApp, name: &str, role: &str) -> (i64, String) {
    let r = app
        .post("/v1/users", json!({"name": name, "role": role}))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let token = r.json["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("hrld_"), "{token}");
    assert_eq!(
        r.headers.get("location").unwrap().to_str().unwrap(),
        format!("/v1/users/{}", r.json["id"])
    );
    (r.json["id"].as_i64().unwrap(), token)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A request as `token`; only the status and, on a refusal, the problem
/// (the event stream never ends, so its body is not read).
async fn status_as(app: &TestApp, token: &str, method: &str, path: &str) -> (u16, Value) {
    let m = awc::http::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = app
        .client
        .request(m, app.url(path))
        .insert_header(("Authorization", bearer(token)));
    let mut res = if method == "GET" || method == "DELETE" {
        req.send().await
    } else {
        req = req.insert_header(("Content-Type", "application/json"));
        req.send_body("{}").await
    }
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = res.status().as_u16();
    let problem = if status >= 400 {
        serde_json::from_slice(&res.body().await.unwrap()).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    (status, problem)
}

/// A concrete path for a route pattern: ids nobody has, so a request the
/// role allows reaches its handler and changes nothing.
fn concrete(pattern: &str) -> String {
    pattern
        .split('/')
        .map(|seg| match seg {
            "{id}" if pattern.starts_with("/v1/accounts") => "nobody-here",
            "{id}" if pattern.starts_with("/v1/media") => {
                "0000000000000000000000000000000000000000000000000000000000000000"
            }
            "{id}" => "999999",
            "{jid}" => "120363000000000999@g.us",
            "{delivery_id}" => "999999",
            other => other,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[actix_rt::test]
async fn every_route_refuses_the_roles_below_its_own_and_names_the_role() {
    let app = spawn_app_with_token().await;
    app.add_account("roles-1").await;
    let mut tokens = Vec::new();
    for role in Role::ALL {
        let (_, t) = add_user(&app, &format!("as-{role}"), role.as_str()).await;
        tokens.push((role, t));
    }
    let before = app.snapshot().await;
    let mut checked = 0;
    for route in ROUTES {
        let needed = route
            .role
            .unwrap_or_else(|| panic!("{} {} has no role", route.method, route.path));
        let path = concrete(route.path);
        for (role, token) in &tokens {
            let (status, problem) = status_as(&app, token, route.method, &path).await;
            let what = format!("{role} {} {path}", route.method);
            if role.allows(needed) {
                assert!(
                    status != 401 && status != 403,
                    "{what}: allowed, yet {status} {problem}"
                );
            } else {
                assert_eq!(status, 403, "{what}: {problem}");
                assert_eq!(problem["type"], "urn:herald:problem:needs-role", "{what}");
                assert_eq!(problem["field"], "role", "{what}");
                let detail = problem["detail"].as_str().unwrap();
                assert!(
                    detail.contains(&format!("needs the {needed} role"))
                        && detail.contains(&format!("as-{role} has the {role} role")),
                    "{what}: {detail}"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, ROUTES.len() * 3);
    // Nothing a refused or id-less request did changed what is stored (the
    // three users were made before the snapshot).
    assert_eq!(app.snapshot().await, before);
}

#[actix_rt::test]
async fn a_revoked_or_expired_token_is_refused_at_once() {
    let app = spawn_app_with_token().await;
    let (id, token) = add_user(&app, "leaver", "operator").await;
    let (code, _) = status_as(&app, &token, "GET", "/v1/reminders").await;
    assert_eq!(code, 200);

    // Signed in to the console with it too.
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(&token).await.status, 303);
    let page = b.get("/reminders").await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("leaver · operator"), "{}", page.text);

    let r = app.delete(&format!("/v1/users/{id}")).await;
    assert_eq!(r.status, 204, "{}", r.text);
    let (code, problem) = status_as(&app, &token, "GET", "/v1/reminders").await;
    assert_eq!(code, 401, "{problem}");
    assert_eq!(
        b.get("/reminders").await.location.as_deref(),
        Some("/sign-in"),
        "the console session ended with the user"
    );
    assert_eq!(b.sign_in(&token).await.status, 401);
    assert_eq!(app.delete(&format!("/v1/users/{id}")).await.status, 404);

    // A token whose expiry has passed (written to the store directly: the
    // API only takes expiries in the future).
    let expired = "hrld_expired-token-for-the-test";
    app.state
        .store
        .create_user(&NewApiUser {
            name: "gone".into(),
            role: Role::Admin,
            token_hash: herald::http::token_hash(expired),
            created_at: chrono::Utc::now() - chrono::Duration::hours(2),
            expires_at: Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
            created_by: "control.token".into(),
        })
        .await
        .unwrap();
    let (code, _) = status_as(&app, expired, "GET", "/v1/reminders").await;
    assert_eq!(code, 401);
    assert_eq!(Browser::new(&app).sign_in(expired).await.status, 401);
}

#[actix_rt::test]
async fn user_input_is_checked_field_by_field_and_nothing_is_stored() {
    let app = spawn_app_with_token().await;
    add_user(&app, "ana", "viewer").await;
    for (body, field) in [
        (json!({"name": "", "role": "viewer"}), "name"),
        (json!({"name": "a b", "role": "viewer"}), "name"),
        (json!({"name": "bo", "role": "root"}), "role"),
        // The names the daemon token and an open port act under.
        (json!({"name": "control.token", "role": "viewer"}), "name"),
        (json!({"name": "Anonymous", "role": "viewer"}), "name"),
        (
            json!({"name": "bo", "role": "viewer", "expires_at": "2001-01-01T00:00:00Z"}),
            "expires_at",
        ),
        (
            json!({"name": "bo", "role": "viewer", "expires_at": "tomorrow"}),
            "expires_at",
        ),
    ] {
        let r = app.post("/v1/users", body.clone()).await;
        assert_problem(&r, 422, Some(field));
    }
    let r = app
        .post("/v1/users", json!({"name": "ana", "role": "admin"}))
        .await;
    assert_problem(&r, 409, None);
    let list = app.get("/v1/users").await;
    assert_eq!(list.status, 200);
    let names: Vec<&str> = list.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ana"]);
    assert!(
        list.json["items"][0].get("token").is_none(),
        "a token is shown only at creation"
    );
    assert_eq!(list.json["items"][0]["created_by"], "control.token");
}

#[actix_rt::test]
async fn the_audit_log_holds_every_write_of_a_session_and_no_read() {
    let app = spawn_app_with_token().await;
    let (_, op_token) = add_user(&app, "ops", "operator").await;
    let (_, viewer_token) = add_user(&app, "watcher", "viewer").await;
    let account = app.add_account("audit-1").await;
    let account = account["id"].as_str().unwrap().to_owned();
    let as_op = [("Authorization", bearer(&op_token))];
    let as_op: Vec<(&str, &str)> = as_op.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let json_as =
        |method: &'static str, path: String, body: Value, who: Vec<(&'static str, String)>| {
            let app = &app;
            async move {
                let headers: Vec<(&str, &str)> =
                    who.iter().map(|(k, v)| (*k, v.as_str())).collect();
                app.send(
                    method,
                    &path,
                    Some("application/json"),
                    Some(body.to_string().into_bytes()),
                    &headers,
                )
                .await
            }
        };
    let op = || vec![("Authorization", bearer(&op_token))];

    // The scripted session: reads and writes as the operator.
    let r = json_as(
        "POST",
        "/v1/reminders".into(),
        reminder_body(&account, &groups(3)),
        op(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let rid = r.json["id"].as_i64().unwrap();
    let reads = [
        format!("/v1/reminders/{rid}"),
        "/v1/reminders".into(),
        "/v1/runs".into(),
        format!("/v1/accounts/{account}"),
    ];
    for path in &reads {
        assert_eq!(app.send("GET", path, None, None, &as_op).await.status, 200);
    }
    // A POST that only reads (a preview) is no write.
    let r = json_as(
        "POST",
        format!("/v1/reminders/{rid}/preview"),
        json!({}),
        op(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(
            "POST",
            &format!("/v1/reminders/{rid}/pause"),
            None,
            None,
            &as_op,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(
            "POST",
            &format!("/v1/reminders/{rid}/resume"),
            None,
            None,
            &as_op,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(
            "POST",
            &format!("/v1/reminders/{rid}/fire"),
            None,
            None,
            &as_op,
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let run = r.json["run_id"].as_i64().unwrap();
    // A write beyond the viewer's role: refused, and on the trail.
    let (code, _) = status_as(
        &app,
        &viewer_token,
        "DELETE",
        &format!("/v1/reminders/{rid}"),
    )
    .await;
    assert_eq!(code, 403);
    let r = app.delete(&format!("/v1/reminders/{rid}")).await;
    assert_eq!(r.status, 204, "{}", r.text);

    let log = app.get("/v1/audit?limit=500").await;
    assert_eq!(log.status, 200, "{}", log.text);
    let got: Vec<(String, String, String, String, i64)> = log.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_owned(),
                e["operation"].as_str().unwrap().to_owned(),
                e["resource"].as_str().unwrap_or("").to_owned(),
                e["via"].as_str().unwrap().to_owned(),
                e["status"].as_i64().unwrap(),
            )
        })
        .collect();
    let ct = "control.token".to_owned();
    let w = |a: &str, o: &str, r: &str, s: i64| {
        (
            a.to_owned(),
            o.to_owned(),
            r.to_owned(),
            "api".to_owned(),
            s,
        )
    };
    let rid = rid.to_string();
    assert_eq!(
        got,
        vec![
            w(&ct, "createUser", "1", 201),
            w(&ct, "createUser", "2", 201),
            w(&ct, "createAccount", &account, 201),
            w("ops", "createReminder", &rid, 201),
            w("ops", "pauseReminder", &rid, 200),
            w("ops", "resumeReminder", &rid, 200),
            w("ops", "fireReminder", &rid, 202),
            w("watcher", "archiveReminder", &rid, 403),
            w(&ct, "archiveReminder", &rid, 204),
        ],
        "every write once, in order, and no read"
    );
    let first_write = &log.json["items"].as_array().unwrap()[5];
    assert_eq!(first_write["role"], "operator");
    assert_eq!(first_write["method"], "POST");
    assert_eq!(first_write["path"], "/v1/reminders");
    assert_eq!(first_write["remote"], "127.0.0.1");
    let summary = first_write["summary"].as_str().unwrap();
    assert!(summary.contains("\"title\":\"Standup\""), "{summary}");
    assert!(
        !log.text.contains(&op_token) && !log.text.contains("hrld_"),
        "no token is ever in the log"
    );

    // Filters and paging.
    let mine = app.get("/v1/audit?actor=ops").await;
    assert_eq!(mine.json["items"].as_array().unwrap().len(), 4);
    let fired = app
        .get(&format!("/v1/audit?operation=fireReminder&resource={rid}"))
        .await;
    assert_eq!(fired.json["items"].as_array().unwrap().len(), 1);
    let page = app.get("/v1/audit?limit=4").await;
    let next = page.json["next_before_id"].as_i64().unwrap();
    let rest = app
        .get(&format!("/v1/audit?limit=500&before_id={next}"))
        .await;
    assert_eq!(
        page.json["items"].as_array().unwrap().len() + rest.json["items"].as_array().unwrap().len(),
        9,
        "{} / {}",
        page.text,
        rest.text
    );
    let bad = app.get("/v1/audit?since=yesterday").await;
    assert_problem(&bad, 400, Some("since"));
    let _ = run;

    // The console: a viewer's write is refused with the role named, and
    // the operator's is recorded as made through the console.
    let mut viewer = Browser::new(&app);
    assert_eq!(viewer.sign_in(&viewer_token).await.status, 303);
    let csrf = viewer.csrf().await;
    let p = viewer
        .post(&format!("/runs/{run}/stop"), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 403, "{}", p.text);
    assert!(p.text.contains("needs the operator role"), "{}", p.text);
    assert_eq!(viewer.get("/users").await.status, 403);
    // A viewer is offered no write; an operator is.
    let list = viewer.get("/reminders").await;
    assert!(!list.text.contains("/reminders/new"), "{}", list.text);
    let mut operator = Browser::new(&app);
    assert_eq!(operator.sign_in(&op_token).await.status, 303);
    let csrf = operator.csrf().await;
    assert!(operator
        .get("/reminders")
        .await
        .text
        .contains("/reminders/new"));
    let p = operator
        .post(&format!("/runs/{run}/retry"), &[("csrf", &csrf)])
        .await;
    assert!(p.status < 500, "{}", p.text);
    let console = app.get("/v1/audit?limit=3").await;
    let items = console.json["items"].as_array().unwrap();
    assert_eq!(items[0]["actor"], "ops");
    assert_eq!(items[0]["via"], "console");
    assert_eq!(items[0]["operation"], "retryRun");
    assert_eq!(items[0]["resource"], run.to_string());
    assert!(!items[0]["summary"].as_str().unwrap().contains(&csrf));
    // The operator's sign-in is on the trail too.
    assert_eq!(items[1]["actor"], "ops");
    assert_eq!(items[1]["operation"], "signIn");
    assert_eq!(items[2]["actor"], "watcher");
    assert_eq!(items[2]["operation"], "stopRun");
    assert_eq!(items[2]["status"], 403);
}

#[actix_rt::test]
async fn an_admin_adds_and_revokes_users_in_the_console() {
    let app = spawn_app_with_token().await;
    let mut b = crate::api::console::signed_in(&app).await;
    let csrf = b.csrf().await;
    let p = b
        .post(
            "/users",
            &[
                ("csrf", &csrf),
                ("name", "nina"),
                ("role", "viewer"),
                ("expires_at", ""),
            ],
        )
        .await;
    assert_eq!(p.status, 201, "{}", p.text);
    let token = p
        .text
        .split("id=\"token-value\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap()
        .to_owned();
    assert!(token.starts_with("hrld_"), "{token}");
    let (code, _) = status_as(&app, &token, "GET", "/v1/runs").await;
    assert_eq!(code, 200, "the token shown works");
    let users = app.get("/v1/users").await;
    let id = users.json["items"][0]["id"].as_i64().unwrap();
    assert_eq!(users.json["items"][0]["role"], "viewer");
    // Shown once: the list page does not show it again.
    assert!(!b.get("/users").await.text.contains(&token));
    let p = b
        .post(&format!("/users/{id}/revoke"), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    let (code, _) = status_as(&app, &token, "GET", "/v1/runs").await;
    assert_eq!(code, 401);
    let audit = b.get("/audit").await;
    assert_eq!(audit.status, 200);
    assert!(
        audit.text.contains("revokeUser") && audit.text.contains("createUser"),
        "{}",
        audit.text
    );
    assert!(!audit.text.contains(&token));
}
