//! Authority on what runs: every declared route, as every role, at its
//! canonical path and at the path variants a router and a second lookup
//! by string could disagree on (each letter of each static segment
//! percent-encoded in both hex cases, doubled and trailing slashes, dot
//! segments, `;params`, `%2F` inside an id). The answer must be what the
//! route's declared role says for the canonical path, and a 400 naming the
//! rule for every other form; every write attempt leaves exactly one audit
//! row naming the principal who made it.

use crate::api::console::Browser;
use crate::api::helpers::*;
use herald::http::{CONSOLE_ROUTES, ROUTES};
use herald_actors::domain::{AuditFilter, Role};
use serde_json::{json, Value};

/// The problem type of a refused non-canonical path.
const NON_CANONICAL: &str = "urn:herald:problem:non-canonical-path";

/// An id nobody has for a `{…}` segment, so a request the role allows
/// reaches its handler and changes nothing.
fn id_for(pattern: &str, seg: &str) -> Option<&'static str> {
    let accounts = pattern.starts_with("/v1/accounts") || pattern.starts_with("/accounts");
    let media = pattern.starts_with("/v1/media") || pattern.starts_with("/media");
    Some(match seg {
        "{id}" if accounts => "nobody-here",
        "{id}" if media => "0000000000000000000000000000000000000000000000000000000000000000",
        "{id}" | "{delivery_id}" => "999999",
        "{jid}" => "120363000000000999@g.us",
        _ => return None,
    })
}

/// How a variant differs from the canonical path.
#[derive(Debug, Clone)]
pub struct Variant {
    pub label: String,
    pub path: String,
    pub canonical: bool,
}

/// The canonical path of `pattern` and every non-canonical spelling of it.
pub fn variants(pattern: &str) -> Vec<Variant> {
    let segs: Vec<&str> = pattern.split('/').skip(1).collect();
    let concrete_segs: Vec<String> = segs
        .iter()
        .map(|s| id_for(pattern, s).unwrap_or(s).to_owned())
        .collect();
    let join = |s: &[String]| format!("/{}", s.join("/"));
    let canonical = join(&concrete_segs);
    let mut out = vec![Variant {
        label: "canonical".into(),
        path: canonical.clone(),
        canonical: true,
    }];
    let mut push = |label: String, path: String| {
        out.push(Variant {
            label,
            path,
            canonical: false,
        })
    };
    for (i, seg) in segs.iter().enumerate() {
        if seg.starts_with('{') {
            // `%2F` inside an id: one segment to a router, two to a proxy.
            let mut s = concrete_segs.clone();
            s[i] = format!("{}%2Fx", s[i]);
            push(format!("%2F in {seg}"), join(&s));
            continue;
        }
        for (at, c) in seg.char_indices() {
            let lower = format!("%{:02x}", c as u32);
            let upper = format!("%{:02X}", c as u32);
            for hex in if lower == upper {
                vec![lower]
            } else {
                vec![lower, upper]
            } {
                let mut s = concrete_segs.clone();
                s[i] = format!("{}{hex}{}", &seg[..at], &seg[at + c.len_utf8()..]);
                push(format!("{c} as {hex}"), join(&s));
            }
        }
        // `;params` on a static segment.
        let mut s = concrete_segs.clone();
        s[i] = format!("{seg};x=y");
        push(format!("{seg};x=y"), join(&s));
    }
    for i in 0..concrete_segs.len() {
        let (a, b) = concrete_segs.split_at(i);
        let double = format!("{}//{}", join(a).trim_end_matches('/'), b.join("/"));
        push(format!("// before segment {i}"), double);
    }
    push("trailing /".into(), format!("{canonical}/"));
    let (first, rest) = concrete_segs.split_at(1);
    push(
        "/./".into(),
        format!("{}/./{}", join(first), rest.join("/")),
    );
    push(
        "/../".into(),
        format!("{}/x/../{}", join(first), rest.join("/")),
    );
    out
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A request as `token`: the status and, on a refusal, the problem (the
/// event stream never ends, so a 200's body is not read).
async fn as_token(app: &TestApp, token: &str, method: &str, path: &str) -> (u16, Value) {
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

/// Audit rows naming `actor`.
async fn rows_of(app: &TestApp, actor: &str) -> usize {
    let filter = AuditFilter {
        actor: Some(actor.into()),
        ..Default::default()
    };
    app.state
        .store
        .list_audit(&filter, None, 100_000)
        .await
        .unwrap()
        .len()
}

/// A daemon with one user per role and no request rate limit (this test
/// makes thousands of requests).
async fn app_with_users() -> (TestApp, Vec<(Role, String)>) {
    let app = spawn_app_with(&[
        ("HERALD_CONTROL__TOKEN", TOKEN),
        ("HERALD_CONTROL__RATE_LIMIT_PER_SECOND", "0"),
    ])
    .await;
    app.add_account("roles-1").await;
    let mut tokens = Vec::new();
    for role in Role::ALL {
        let r = app
            .post(
                "/v1/users",
                json!({"name": format!("as-{role}"), "role": role.as_str()}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        tokens.push((role, r.json["token"].as_str().unwrap().to_owned()));
    }
    (app, tokens)
}

/// Every failure, so one run shows all of them.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    fn assert_none(self, checked: usize) {
        assert!(
            self.0.is_empty(),
            "{} of {checked} requests answered other than the role table says:\n{}",
            self.0.len(),
            self.0
                .iter()
                .take(400)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

fn is_write_method(method: &str) -> bool {
    method != "GET"
}

#[actix_rt::test]
async fn every_api_route_every_role_every_spelling_answers_as_the_role_table_says() {
    let (app, tokens) = app_with_users().await;
    let before = app.snapshot().await;
    let mut found = Findings::default();
    let mut checked = 0;
    for route in ROUTES {
        let needed = route.role.expect("every /v1 route declares a role");
        for v in variants(route.path) {
            for (role, token) in &tokens {
                let actor = format!("as-{role}");
                let rows = rows_of(&app, &actor).await;
                let (status, problem) = as_token(&app, token, route.method, &v.path).await;
                let what = || {
                    format!(
                        "{role:<8} {} {} ({}): {status} {problem}",
                        route.method, v.path, v.label
                    )
                };
                if !v.canonical {
                    found.check(status == 400 && problem["type"] == NON_CANONICAL, what);
                } else if role.allows(needed) {
                    found.check(
                        status != 401 && status != 403 && problem["type"] != NON_CANONICAL,
                        what,
                    );
                } else {
                    found.check(
                        status == 403 && problem["type"] == "urn:herald:problem:needs-role",
                        what,
                    );
                }
                // Every write attempt (a write method, or a route that
                // writes) is on the trail once, under the caller's name.
                let writes = if v.canonical {
                    route.writes()
                } else {
                    is_write_method(route.method)
                };
                let added = rows_of(&app, &actor).await - rows;
                found.check(added == usize::from(writes), || {
                    format!(
                        "{role:<8} {} {} ({}): {added} audit rows for {actor}, expected {}",
                        route.method,
                        v.path,
                        v.label,
                        usize::from(writes)
                    )
                });
                checked += 1;
            }
        }
    }
    found.assert_none(checked);
    // Nothing any of it did changed what is stored (beyond the trail).
    assert_eq!(app.snapshot().await, before);
}

#[actix_rt::test]
async fn the_attack_in_the_issue_is_refused_and_on_the_trail() {
    let (app, tokens) = app_with_users().await;
    let viewer = &tokens.iter().find(|(r, _)| *r == Role::Viewer).unwrap().1;
    let headers = [("Authorization", bearer(viewer))];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let evil = json!({"name": "evil", "role": "admin"})
        .to_string()
        .into_bytes();
    for path in [
        "/v1/users",
        "/v1/user%73",
        "/v1/%75sers",
        "/v1/users/",
        "/v1//users",
    ] {
        let r = app
            .send(
                "POST",
                path,
                Some("application/json"),
                Some(evil.clone()),
                &headers,
            )
            .await;
        assert!(
            r.status == 403 || r.status == 400,
            "POST {path} as a viewer: {} {}",
            r.status,
            r.text
        );
    }
    for path in ["/v1/%61udit", "/v1/audi%74", "/v1/audit;x=y", "/v1/./audit"] {
        let r = app.send("GET", path, None, None, &headers).await;
        assert_eq!(r.status, 400, "GET {path} as a viewer: {}", r.text);
    }
    let users = app.get("/v1/users").await;
    let names: Vec<&str> = users.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"evil"), "{names:?}");
    // Five attempts, five rows, each naming the viewer; none the daemon.
    let trail = app.get("/v1/audit?actor=as-viewer&limit=100").await;
    assert_eq!(
        trail.json["items"].as_array().unwrap().len(),
        5,
        "{}",
        trail.text
    );
    let by_daemon = app.get("/v1/audit?actor=control.token&limit=100").await;
    let daemon_ops: Vec<&str> = by_daemon.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["operation"].as_str().unwrap())
        .collect();
    assert_eq!(
        daemon_ops,
        ["createUser", "createUser", "createUser", "createAccount"],
        "only the setup's writes are the daemon's"
    );
}

#[actix_rt::test]
async fn every_console_route_every_role_every_spelling_answers_as_the_role_table_says() {
    let (app, tokens) = app_with_users().await;
    let mut browsers = Vec::new();
    for (role, token) in &tokens {
        let mut b = Browser::new(&app);
        assert_eq!(b.sign_in(token).await.status, 303);
        let csrf = b.csrf().await;
        browsers.push((*role, b, csrf));
    }
    let mut found = Findings::default();
    let mut checked = 0;
    for route in CONSOLE_ROUTES {
        // Sign-in, sign-out and the assets are free; sign-out would end
        // the session the rest of the test uses.
        let Some(needed) = route.role else { continue };
        for v in variants(route.path) {
            for (role, b, csrf) in browsers.iter_mut() {
                let actor = format!("as-{role}");
                let rows = rows_of(&app, &actor).await;
                let page = if route.method == "GET" {
                    b.get(&v.path).await
                } else {
                    b.post(&v.path, &[("csrf", csrf.as_str())]).await
                };
                let status = page.status;
                let what = || {
                    let text: String = page.text.chars().take(200).collect();
                    format!(
                        "{role:<8} {} {} ({}): {status} {text}",
                        route.method, v.path, v.label
                    )
                };
                if !v.canonical {
                    found.check(status == 400 && page.text.contains(NON_CANONICAL), what);
                } else if role.allows(needed) {
                    // Allowed: whatever the handler says of an id nobody
                    // has or a form without its fields, but no refusal for
                    // the role or the path.
                    found.check(
                        status != 401
                            && !(status == 403 && page.text.contains("needs the"))
                            && !page.text.contains(NON_CANONICAL),
                        what,
                    );
                } else {
                    found.check(
                        status == 403 && page.text.contains(&format!("needs the {needed} role")),
                        what,
                    );
                }
                let writes = if v.canonical {
                    route.writes()
                } else {
                    is_write_method(route.method)
                };
                let added = rows_of(&app, &actor).await - rows;
                found.check(added == usize::from(writes), || {
                    format!(
                        "{role:<8} {} {} ({}): {added} audit rows for {actor}, expected {}",
                        route.method,
                        v.path,
                        v.label,
                        usize::from(writes)
                    )
                });
                checked += 1;
            }
        }
    }
    found.assert_none(checked);
}

#[test]
fn variants_cover_each_letter_in_both_hex_cases() {
    let v = variants("/v1/accounts/{id}/pair/qr.png");
    let paths: Vec<&str> = v.iter().map(|v| v.path.as_str()).collect();
    assert_eq!(paths[0], "/v1/accounts/nobody-here/pair/qr.png");
    for want in [
        "/v1/accounts/nobody-here/pair/qr%2Epng",
        "/v1/accounts/nobody-here/pair/qr%2epng",
        "/%761/accounts/nobody-here/pair/qr.png",
        "/v%31/accounts/nobody-here/pair/qr.png",
        "/v1/accounts/nobody-here%2Fx/pair/qr.png",
        "/v1/accounts/nobody-here/pair;x=y/qr.png",
        "/v1//accounts/nobody-here/pair/qr.png",
        "//v1/accounts/nobody-here/pair/qr.png",
        "/v1/accounts/nobody-here/pair/qr.png/",
        "/v1/./accounts/nobody-here/pair/qr.png",
        "/v1/x/../accounts/nobody-here/pair/qr.png",
        "/v1/%61ccounts/nobody-here/pair/qr.png",
        "/v1/accounts/nobody-here/p%61ir/qr.png",
    ] {
        assert!(
            paths.contains(&want) || paths.iter().any(|p| p.eq_ignore_ascii_case(want)),
            "{want} missing from {paths:#?}"
        );
    }
    assert!(v.iter().skip(1).all(|v| !v.canonical));
}

/// Audit entries of `operation`: (actor, remote, count, status), read
/// through the API (which writes the attempts counted in memory first).
async fn entries_of(app: &TestApp, operation: &str) -> Vec<(String, String, u32, u16)> {
    let r = app
        .get(&format!("/v1/audit?operation={operation}&limit=500"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_owned(),
                e["remote"].as_str().unwrap().to_owned(),
                e["count"].as_u64().unwrap() as u32,
                e["status"].as_u64().unwrap() as u16,
            )
        })
        .collect()
}

#[actix_rt::test]
async fn a_forwarding_header_counts_only_from_a_daemon_of_this_cluster() {
    let (app, tokens) = app_with_users().await;
    let admin = &tokens.iter().find(|(r, _)| *r == Role::Admin).unwrap().1;
    let hop = [("x-herald-forwarded-by", "n9")];
    // An admin user's token, and even the daemon's own token on a daemon
    // that is not in a cluster: refused, nothing done, on the trail.
    for (who, token) in [("as-admin", admin.as_str()), ("control.token", TOKEN)] {
        let auth = bearer(token);
        let r = app
            .send(
                "POST",
                "/v1/users",
                Some("application/json"),
                Some(
                    json!({"name": "smuggled", "role": "admin"})
                        .to_string()
                        .into_bytes(),
                ),
                &[hop[0], ("Authorization", &auth)],
            )
            .await;
        assert_eq!(r.status, 400, "{}", r.text);
        assert_eq!(r.json["field"], "x-herald-forwarded-by", "{}", r.text);
        let refused = entries_of(&app, "refusedForwarding").await;
        assert_eq!(refused[0].0, who);
        assert_eq!(refused[0].3, 400);
        // A read with the header is refused too.
        let r = app
            .send(
                "GET",
                "/v1/runs",
                None,
                None,
                &[hop[0], ("Authorization", &auth)],
            )
            .await;
        assert_eq!(r.status, 400);
    }
    assert_eq!(entries_of(&app, "refusedForwarding").await.len(), 4);
    let users = app.get("/v1/users").await;
    assert!(!users.text.contains("smuggled"), "{}", users.text);
    assert!(entries_of(&app, "createUser")
        .await
        .iter()
        .all(|e| e.0 == "control.token"));
}

#[actix_rt::test]
async fn a_flood_of_bad_tokens_and_sign_ins_is_counted_per_address_and_minute() {
    let (app, tokens) = app_with_users().await;
    for i in 0..300 {
        let r = app
            .client
            .get(app.url("/v1/runs"))
            .insert_header(("Authorization", bearer(&format!("hrld_wrong-{i}"))))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
    }
    // Below the sign-in lockout (its own test below).
    for _ in 0..9 {
        assert_eq!(Browser::new(&app).sign_in("not-a-token").await.status, 401);
    }
    let operator = &tokens.iter().find(|(r, _)| *r == Role::Operator).unwrap().1;
    for _ in 0..3 {
        assert_eq!(Browser::new(&app).sign_in(operator).await.status, 303);
    }
    // At most two entries each (the flood may straddle a minute), and the
    // counts add up to every attempt.
    for (op, attempts, actor, status) in [
        ("failedAuthentication", 300, "(unauthenticated)", 401),
        ("signInFailed", 9, "(unauthenticated)", 401),
        ("signIn", 3, "as-operator", 303),
    ] {
        let e = entries_of(&app, op).await;
        assert!((1..=2).contains(&e.len()), "{op}: {e:?}");
        assert_eq!(e.iter().map(|e| e.2).sum::<u32>(), attempts, "{op}: {e:?}");
        assert!(
            e.iter()
                .all(|e| e.0 == actor && e.1 == "127.0.0.1" && e.3 == status),
            "{op}: {e:?}"
        );
    }
    // The API shows the count, and no role for an attempt without identity.
    let log = app.get("/v1/audit?operation=failedAuthentication").await;
    assert_eq!(log.status, 200, "{}", log.text);
    assert_eq!(log.json["items"][0]["role"], Value::Null);
    assert!(log.json["items"][0]["count"].as_u64().unwrap() >= 150);
}

#[actix_rt::test]
async fn ten_failed_sign_ins_lock_the_network_out_whatever_it_sends_next() {
    let (app, tokens) = app_with_users().await;
    for _ in 0..10 {
        assert_eq!(Browser::new(&app).sign_in("not-a-token").await.status, 401);
    }
    let operator = &tokens.iter().find(|(r, _)| *r == Role::Operator).unwrap().1;
    for token in ["not-a-token", operator.as_str(), TOKEN] {
        let r = Browser::new(&app).sign_in(token).await;
        assert_eq!(r.status, 429, "{}", r.text);
        let wait: u64 = r.retry_after.as_deref().unwrap().parse().unwrap();
        assert!((800..=900).contains(&wait), "{wait}");
        assert!(r.text.contains("Too many failed sign-ins"), "{}", r.text);
    }
    // The API is not locked: the bearer token still works.
    assert_eq!(app.get("/v1/runs").await.status, 200);
    let failed = entries_of(&app, "signInFailed").await;
    assert_eq!(failed.iter().map(|e| e.2).sum::<u32>(), 10, "{failed:?}");
    assert!(
        entries_of(&app, "signIn").await.is_empty(),
        "nobody signed in"
    );
}

#[actix_rt::test]
async fn sign_ins_end_only_the_same_users_oldest_sessions() {
    let (app, tokens) = app_with_users().await;
    let mut admin = Browser::new(&app);
    assert_eq!(admin.sign_in(TOKEN).await.status, 303);
    let viewer = &tokens.iter().find(|(r, _)| *r == Role::Viewer).unwrap().1;
    let mut first = Browser::new(&app);
    assert_eq!(first.sign_in(viewer).await.status, 303);
    // A viewer signing in again and again (to evict everyone) ends only
    // their own oldest sessions.
    for _ in 0..40 {
        assert_eq!(Browser::new(&app).sign_in(viewer).await.status, 303);
    }
    assert_eq!(
        admin.get("/users").await.status,
        200,
        "the admin is still signed in"
    );
    assert_eq!(
        first.get("/runs").await.location.as_deref(),
        Some("/sign-in"),
        "the viewer's oldest session ended"
    );
}

#[actix_rt::test]
async fn the_cookie_is_secure_and_the_client_named_only_behind_a_trusted_proxy() {
    let proxied = spawn_app_with(&[
        ("HERALD_CONTROL__TOKEN", TOKEN),
        ("HERALD_CONTROL__TRUSTED_PROXIES", "127.0.0.1"),
    ])
    .await;
    let direct = spawn_app_with_token().await;
    let https = [
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-For", "203.0.113.7"),
    ];
    for (app, secure, remote) in [
        (&proxied, true, "203.0.113.7"),
        (&direct, false, "127.0.0.1"),
    ] {
        let mut b = Browser::new(app);
        let p = b.post_with("/sign-in", &[("token", TOKEN)], &https).await;
        assert_eq!(p.status, 303, "{}", p.text);
        let cookie = p.set_cookie.unwrap();
        assert_eq!(cookie.contains("; Secure"), secure, "{cookie}");
        let signed = entries_of(app, "signIn").await;
        assert_eq!(signed[0].1, remote, "the audited address");
    }
    // Through the proxy over plain HTTP: no Secure.
    let p = Browser::new(&proxied).sign_in(TOKEN).await;
    assert!(!p.set_cookie.unwrap().contains("Secure"));
    // A setting that is no address list stops start-up naming it.
    let mut env = std::collections::HashMap::new();
    env.insert(
        "HERALD_CONTROL__TRUSTED_PROXIES".to_owned(),
        "proxy.lan".to_owned(),
    );
    let e = herald::settings::Settings::load_from(None, &env)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("control.trusted_proxies") && e.contains("proxy.lan"),
        "{e}"
    );
}
