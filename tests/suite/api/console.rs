//! The web console over a real port: sign-in, the session cookie, CSRF and
//! cross-site refusals, and every page with real data.

use crate::api::helpers::*;
use serde_json::{json, Value};
use std::time::Duration;

/// A browser as far as the console can tell: it keeps the session cookie
/// and follows no redirect by itself.
pub struct Browser {
    base: String,
    client: awc::Client,
    pub cookie: Option<String>,
}

pub struct Page {
    pub status: u16,
    pub location: Option<String>,
    pub set_cookie: Option<String>,
    pub retry_after: Option<String>,
    pub content_type: String,
    pub text: String,
}

impl Page {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    /// The session's CSRF token, from a form on the page.
    pub fn csrf(&self) -> String {
        self.field("csrf")
    }

    /// The value of the page's (first) input named `name`, unescaped.
    pub fn field(&self, name: &str) -> String {
        let key = format!(r#"name="{name}" value=""#);
        let at = self
            .text
            .find(&key)
            .unwrap_or_else(|| panic!("no input {name}"));
        let rest = &self.text[at + key.len()..];
        rest[..rest.find('"').unwrap()]
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
    }
}

impl Browser {
    pub fn new(app: &TestApp) -> Self {
        Self {
            base: app.base.clone(),
            client: awc::Client::builder()
                .disable_redirects()
                .timeout(Duration::from_secs(20))
                .finish(),
            cookie: None,
        }
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        form: Option<&[(&str, &str)]>,
        headers: &[(&str, &str)],
    ) -> Page {
        let method = awc::http::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            req = req.insert_header(("Cookie", format!("herald_session={c}")));
        }
        for (k, v) in headers {
            req = req.insert_header((*k, *v));
        }
        let res = match form {
            Some(pairs) => {
                let body: String = form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(pairs.iter())
                    .finish();
                req.insert_header(("Content-Type", "application/x-www-form-urlencoded"))
                    .send_body(body)
                    .await
            }
            None => req.send().await,
        };
        let mut res = res.unwrap_or_else(|e| panic!("{path}: {e}"));
        let header = |name: &str| {
            res.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let retry_after = header("retry-after");
        let (location, set_cookie, content_type) = (
            header("location"),
            header("set-cookie"),
            header("content-type"),
        );
        let text = String::from_utf8_lossy(&res.body().limit(8 << 20).await.unwrap()).into_owned();
        if let Some(c) = &set_cookie {
            let value = c
                .split(';')
                .next()
                .unwrap()
                .trim_start_matches("herald_session=");
            self.cookie = (!value.is_empty()).then(|| value.to_owned());
        }
        Page {
            status: res.status().as_u16(),
            location,
            set_cookie,
            retry_after,
            content_type: content_type.unwrap_or_default(),
            text,
        }
    }

    pub async fn get(&mut self, path: &str) -> Page {
        self.send("GET", path, None, &[]).await
    }

    pub async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Page {
        self.send("POST", path, Some(form), &[]).await
    }

    pub async fn post_with(
        &mut self,
        path: &str,
        form: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Page {
        self.send("POST", path, Some(form), headers).await
    }

    pub async fn sign_in(&mut self, token: &str) -> Page {
        self.post("/sign-in", &[("token", token)]).await
    }

    /// A CSRF token of the signed-in session.
    pub async fn csrf(&mut self) -> String {
        let p = self.get("/accounts").await;
        assert_eq!(p.status, 200, "{}", p.text);
        p.csrf()
    }
}

pub(crate) async fn signed_in(app: &TestApp) -> Browser {
    let mut b = Browser::new(app);
    let p = b.sign_in(TOKEN).await;
    assert_eq!(p.status, 303, "{}", p.text);
    b
}

#[actix_rt::test]
async fn every_page_redirects_to_sign_in_without_a_session() {
    let app = spawn_app_with_token().await;
    let mut b = Browser::new(&app);
    for path in [
        "/",
        "/accounts",
        "/accounts/x",
        "/reminders",
        "/reminders/new",
        "/reminders/1",
        "/runs",
        "/runs/1",
        "/runs/1/live",
    ] {
        let p = b.get(path).await;
        assert_eq!(p.status, 303, "{path}: {}", p.text);
        assert_eq!(p.location.as_deref(), Some("/sign-in"), "{path}");
    }
    let before = app.snapshot().await;
    let p = b
        .post(
            "/accounts",
            &[("id", "sneaky"), ("kind", "simulator"), ("csrf", "x")],
        )
        .await;
    assert_eq!(p.status, 303);
    assert_eq!(app.snapshot().await, before);
    // A made-up or stale cookie is no session either.
    b.cookie = Some("0".repeat(64));
    assert_eq!(b.get("/").await.status, 303);
    let p = b.get("/sign-in").await;
    assert_eq!(p.status, 200);
    assert!(p.content_type.starts_with("text/html"));
    assert!(p.text.contains(r#"type="password""#), "{}", p.text);
}

#[actix_rt::test]
async fn sign_in_sets_a_strict_http_only_session_cookie_and_sign_out_ends_it() {
    let app = spawn_app_with_token().await;
    let mut b = Browser::new(&app);
    let p = b.sign_in("wrong-token").await;
    assert_eq!(p.status, 401, "{}", p.text);
    assert!(p.set_cookie.is_none());
    assert!(
        p.text.contains("not this daemon&#39;s token")
            || p.text.contains("not this daemon's token"),
        "{}",
        p.text
    );
    assert_eq!(b.get("/").await.status, 303);

    let p = b.sign_in(TOKEN).await;
    assert_eq!(p.status, 303, "{}", p.text);
    assert_eq!(p.location.as_deref(), Some("/"));
    let cookie = p.set_cookie.unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(flag), "{flag} in {cookie}");
    }
    assert!(
        !cookie.contains(TOKEN),
        "the token is not the cookie: {cookie}"
    );
    let page = b.get("/").await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(page.text.contains("Sending now"));
    for (name, value) in [("x-frame-options", "DENY"), ("cache-control", "no-store")] {
        let r = app.client.get(app.url("/sign-in")).send().await.unwrap();
        assert_eq!(r.headers().get(name).unwrap(), value);
    }

    let csrf = page.csrf();
    let p = b.post("/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(p.status, 303);
    assert!(p.set_cookie.unwrap().contains("Max-Age=0"));
    assert_eq!(b.get("/").await.status, 303);
}

#[actix_rt::test]
async fn console_posts_need_the_sessions_csrf_token_and_same_origin() {
    let app = spawn_app_with_token().await;
    let mut b = signed_in(&app).await;
    let csrf = b.csrf().await;
    let before = app.snapshot().await;
    fn form(token: &str) -> Vec<(&str, &str)> {
        vec![("id", "formed"), ("kind", "simulator"), ("csrf", token)]
    }

    // Missing or wrong CSRF token.
    for token in ["", "0123", &"0".repeat(64)] {
        let p = b.post("/accounts", &form(token)).await;
        assert_eq!(p.status, 403, "{}", p.text);
        assert_eq!(p.json()["field"], "csrf", "{}", p.text);
    }
    // Another session's token is no good either.
    let mut other = signed_in(&app).await;
    let theirs = other.csrf().await;
    assert_ne!(theirs, csrf);
    assert_eq!(b.post("/accounts", &form(&theirs)).await.status, 403);
    // Cross-site, even with the right token.
    for (header, value, field) in [
        ("Origin", "http://evil.example", "Origin"),
        ("Sec-Fetch-Site", "cross-site", "Sec-Fetch-Site"),
        ("Sec-Fetch-Site", "same-site", "Sec-Fetch-Site"),
    ] {
        let p = b
            .post_with("/accounts", &form(&csrf), &[(header, value)])
            .await;
        assert_eq!(p.status, 403, "{}", p.text);
        assert_eq!(p.json()["field"], field);
    }
    // Sign-in from another site's page is refused too.
    let mut stranger = Browser::new(&app);
    let p = stranger
        .post_with(
            "/sign-in",
            &[("token", TOKEN)],
            &[("Origin", "http://evil.example")],
        )
        .await;
    assert_eq!(p.status, 403, "{}", p.text);
    assert!(p.set_cookie.is_none());
    assert_eq!(app.snapshot().await, before);

    // The same form from the console's own page works.
    let host = app.base.trim_start_matches("http://").to_owned();
    let origin = format!("http://{host}");
    let p = b
        .post_with(
            "/accounts",
            &form(&csrf),
            &[("Origin", &origin), ("Sec-Fetch-Site", "same-origin")],
        )
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    assert_eq!(p.location.as_deref(), Some("/accounts/formed"));
    assert_eq!(app.get("/v1/accounts/formed").await.status, 200);
}

#[actix_rt::test]
async fn the_session_cookie_reads_the_event_stream_and_nothing_else_under_v1() {
    let app = spawn_app_with_token().await;
    let b = signed_in(&app).await;
    let cookie = format!("herald_session={}", b.cookie.clone().unwrap());
    let before = app.snapshot().await;
    let client = awc::Client::default();
    for (method, path) in [
        ("POST", "/v1/accounts"),
        ("GET", "/v1/accounts"),
        ("POST", "/v1/reminders/1/fire"),
        ("GET", "/v1/runs"),
    ] {
        let r = client
            .request(
                awc::http::Method::from_bytes(method.as_bytes()).unwrap(),
                app.url(path),
            )
            .insert_header(("Cookie", cookie.as_str()))
            .insert_header(("Content-Type", "application/json"))
            .send_body(json!({"id": "cookie-made", "kind": "simulator"}).to_string())
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "{method} {path}");
    }
    assert_eq!(app.snapshot().await, before);
    let r = client
        .get(app.url("/v1/events"))
        .insert_header(("Cookie", cookie.as_str()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    // Without a session the stream needs the token as before.
    let r = client.get(app.url("/v1/events")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
}

#[actix_rt::test]
async fn with_no_token_configured_the_console_signs_in_by_itself() {
    let app = spawn_app_with(&[("HERALD_CONTROL__TOKEN", "none")]).await;
    let mut b = Browser::new(&app);
    assert_eq!(b.get("/").await.status, 303);
    let p = b.get("/sign-in").await;
    assert_eq!(p.status, 303);
    assert!(p.set_cookie.unwrap().contains("HttpOnly"));
    let page = b.get("/").await;
    assert_eq!(page.status, 200);
    // Forms still need the CSRF token.
    let p = b
        .post("/accounts", &[("id", "x1"), ("kind", "simulator")])
        .await;
    assert_eq!(p.status, 403);
}

/// Labels two of the account's groups `east`.
async fn label_east(app: &TestApp, account: &str) {
    for i in [2, 5] {
        let r = app
            .put(
                &format!("/v1/accounts/{account}/groups/{}/labels", group(i)),
                json!({"labels": ["east"]}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
}

#[actix_rt::test]
async fn a_refused_form_shows_the_apis_reason_beside_its_field_and_stores_nothing() {
    let app = spawn_app_with_token().await;
    app.add_account("sales-1").await;
    let mut b = signed_in(&app).await;
    let csrf = b.csrf().await;
    let before = app.snapshot().await;
    let base = |end: &'static str, tz: &'static str| {
        vec![
            ("account_id", "sales-1"),
            ("title", "Weekly"),
            ("timezone", tz),
            ("kind", "at"),
            ("at", "2099-01-05T09:00"),
            ("start_hour", "6"),
            ("end_hour", end),
            ("text", "Hello"),
            ("targets", "120363000000000001@g.us"),
        ]
    };
    for (form, field, api_field) in [
        (base("30", "UTC"), "window", "window.end_hour"),
        (base("18", "Mars/Olympus"), "timezone", "timezone"),
        (
            {
                let mut f = base("18", "UTC");
                f[7] = ("text", "");
                f
            },
            "text",
            "parts",
        ),
        (
            {
                let mut f = base("18", "UTC");
                f[3] = ("kind", "cron");
                f.push(("cron", "61 9 * * *"));
                f
            },
            "schedule",
            "schedule",
        ),
    ] {
        let mut form = form;
        form.push(("csrf", &csrf));
        let p = b.post("/reminders", &form).await;
        assert_eq!(p.status, 422, "{field}: {}", p.text);
        assert!(p.content_type.starts_with("text/html"));
        assert!(
            p.text.contains(&format!(r#"id="err-{field}""#)),
            "{field}: {}",
            p.text
        );
        assert!(p.text.contains(api_field), "{api_field}: {}", p.text);
        assert!(p.text.contains("Nothing was saved."));
        // What was typed comes back.
        assert!(p.text.contains(r#"value="Weekly""#));
    }
    assert_eq!(app.snapshot().await, before);
}

/// "Preview" shows, before anything is saved, the schedule's next five
/// times in the reminder's timezone (with the daylight-saving note where a
/// time falls in a gap or an overlap) and the engine's forecast; a preview
/// stores nothing, and a form that does not parse shows its field's rule.
#[actix_rt::test]
async fn preview_shows_the_next_times_with_dst_notes_and_the_forecast_before_saving() {
    let app = spawn_app_with_token().await;
    app.add_account("sales-1").await;
    let mut b = signed_in(&app).await;
    let csrf = b.csrf().await;
    let before = app.snapshot().await;
    let form = |kind: &'static str, when: (&'static str, &'static str), tz: &'static str| {
        vec![
            ("account_id", "sales-1"),
            ("title", "Weekly"),
            ("timezone", tz),
            ("kind", kind),
            when,
            ("start_hour", "0"),
            ("end_hour", "24"),
            ("text", "Hello"),
            ("targets", "120363000000000001@g.us"),
            ("targets", "120363000000000002@g.us"),
            ("preview", "1"),
            ("csrf", csrf.as_str()),
        ]
    };
    let p = b
        .post(
            "/reminders",
            &form("cron", ("cron", "0 9 * * 1"), "Asia/Kuala_Lumpur"),
        )
        .await;
    assert_eq!(p.status, 200, "{}", p.text);
    assert!(p.text.contains("Preview (not saved)"), "{}", p.text);
    let times = p.text.split(r#"id="next-times""#).nth(1).unwrap();
    let times = times.split("</ol>").next().unwrap();
    assert_eq!(times.matches("<li>").count(), 5, "{times}");
    assert!(times.contains("09:00"), "{times}");
    assert!(
        p.text.contains(r#"id="preview-forecast""#) && p.text.contains("all 2 groups fit"),
        "{}",
        p.text
    );
    assert!(
        p.text.contains(r#"value="Weekly""#),
        "the form keeps what was typed"
    );

    // A one-shot in London's spring-forward gap says what will happen.
    let p = b
        .post(
            "/reminders",
            &form("at", ("at", "2099-03-29T01:30"), "Europe/London"),
        )
        .await;
    assert_eq!(p.status, 200, "{}", p.text);
    assert!(
        p.text
            .contains("clocks go forward at 01:00: a time in the skipped hour fires at 02:00"),
        "{}",
        p.text
    );

    // A form that does not parse: the field's rule, still nothing stored.
    let p = b
        .post("/reminders", &form("cron", ("cron", "61 9 * * *"), "UTC"))
        .await;
    assert_eq!(p.status, 422, "{}", p.text);
    assert!(p.text.contains(r#"id="err-schedule""#), "{}", p.text);
    assert_eq!(app.snapshot().await, before, "a preview stores nothing");
}

/// A run's page lists its groups 500 at a time, with a link on to the
/// next ones (and back to the first), so a 1000+-group run is all there.
#[actix_rt::test]
async fn a_big_runs_groups_are_paged_on_its_page() {
    let app = spawn_app_with_token().await;
    app.add_account("sales-1").await;
    let jids: Vec<String> = (0..600)
        .map(|i| format!("120363{:012}@g.us", 9000 + i))
        .collect();
    let rem = app.create_reminder(reminder_body("sales-1", &jids)).await;
    let fired = app
        .post_empty(&format!("/v1/reminders/{}/fire", rem["id"]))
        .await;
    assert_eq!(fired.status, 202, "{}", fired.text);
    let run = fired.json["run_id"].as_i64().unwrap();
    app.wait_run(run, 20, |r| r["finished_at"].is_string())
        .await;
    let mut b = signed_in(&app).await;
    let first = b.get(&format!("/runs/{run}")).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let rows = |t: &str| {
        t.split(r#"id="targets""#)
            .nth(1)
            .unwrap()
            .matches("<tr>")
            .count()
            - 1
    };
    assert_eq!(rows(&first.text), 500);
    let next = format!("/runs/{run}?after=499");
    assert!(
        first.text.contains(&format!(r#"href="{next}""#)),
        "{}",
        first.text
    );
    let second = b.get(&next).await;
    assert_eq!(rows(&second.text), 100);
    assert!(
        second.text.contains(&jids[599]),
        "the last group is on the second page"
    );
    assert!(!second.text.contains("Next groups"));
    assert!(second.text.contains("First groups"));
}

#[actix_rt::test]
async fn a_reminder_made_in_the_form_fires_and_every_page_shows_real_data() {
    let app = spawn_app_with_token().await;
    app.add_account("sales-1").await;
    label_east(&app, "sales-1").await;
    let mut b = signed_in(&app).await;
    let form_page = b.get("/reminders/new?account=sales-1").await;
    assert_eq!(form_page.status, 200, "{}", form_page.text);
    assert!(
        form_page.text.contains(r#"value="east""#),
        "the label is offered"
    );
    let csrf = form_page.csrf();
    let png = app.upload_png().await;
    let media = png["id"].as_str().unwrap();
    let p = b
        .post(
            "/reminders",
            &[
                ("csrf", &csrf),
                ("account_id", "sales-1"),
                ("title", "East standup"),
                ("timezone", "Asia/Kuala_Lumpur"),
                ("kind", "cron"),
                ("cron", "0 9 * * 1-5"),
                ("start_hour", "0"),
                ("end_hour", "24"),
                ("resume_next_window", "on"),
                ("text", "Standup at 10"),
                ("media", media),
                ("caption", "the plan"),
                ("labels", "east"),
            ],
        )
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    let location = p.location.unwrap();
    let id: i64 = location.trim_start_matches("/reminders/").parse().unwrap();
    let stored = app.get(&format!("/v1/reminders/{id}")).await.json;
    assert_eq!(stored["select"]["labels"], json!(["east"]));
    assert_eq!(stored["timezone"], "Asia/Kuala_Lumpur");
    assert_eq!(stored["parts"][1]["media"], media);

    let detail = b.get(&location).await;
    assert_eq!(detail.status, 200, "{}", detail.text);
    assert!(detail.text.contains("East standup"));
    assert!(
        detail.text.contains("groups fit before the window closes"),
        "{}",
        detail.text
    );
    assert!(
        detail.text.contains("+08"),
        "fire times in the reminder's timezone: {}",
        detail.text
    );
    let list = b.get("/reminders").await;
    assert!(
        list.text.contains("East standup") && list.text.contains("+08"),
        "{}",
        list.text
    );
    let edit = b.get(&format!("/reminders/{id}/edit")).await;
    assert_eq!(edit.status, 200);
    assert!(
        edit.text.contains(r#"value="0 9 * * 1-5""#),
        "{}",
        edit.text
    );

    let csrf = detail.csrf();
    let p = b
        .post(&format!("/reminders/{id}/fire"), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    let run_page = p.location.unwrap();
    let run_id: i64 = run_page.trim_start_matches("/runs/").parse().unwrap();
    app.wait_run(run_id, 30, |r| r["status"] == "success").await;

    // The simulated groups' members deliver at once: both groups reached.
    let counted = app
        .wait_run(run_id, 30, |r| r["receipts"]["groups_delivered"] == 2)
        .await;
    let reached = counted["receipts"]["delivered"].as_u64().unwrap();
    let run = b.get(&run_page).await;
    assert_eq!(run.status, 200);
    assert!(run.text.contains("2 of 2 delivered"), "{}", run.text);
    assert!(run.text.contains("label:east"), "{}", run.text);
    assert!(
        run.text
            .contains(&format!("reached {reached} participants in 2 groups")),
        "the receipts' totals: {}",
        run.text
    );
    assert!(run.text.contains(">Reached<") && run.text.contains(">Read<"));
    let live = b.get(&format!("{run_page}/live")).await.json();
    assert_eq!(live["delivered"], "2 of 2 delivered");
    assert_eq!(live["is_final"], true);
    assert!(
        live["receipts"]
            .as_str()
            .unwrap()
            .starts_with(&format!("reached {reached} participants in 2 groups")),
        "{live}"
    );
    let failed_only = b.get(&format!("{run_page}?status=failed")).await;
    assert!(
        !failed_only.text.contains("label:east"),
        "the filter hides sent groups"
    );

    let overview = b.get("/").await;
    assert!(
        overview.text.contains("East standup"),
        "fires next: {}",
        overview.text
    );
    let accounts = b.get("/accounts").await;
    assert!(
        accounts.text.contains("sales-1") && accounts.text.contains("4 (no daily cap)"),
        "{}",
        accounts.text
    );
    let account = b.get("/accounts/sales-1").await;
    assert!(
        account.text.contains(&group(2)) && account.text.contains("east"),
        "{}",
        account.text
    );
    let runs = b.get("/runs").await;
    // Named by its reminder's title, the id second.
    assert!(
        runs.text.contains(&format!(" · run {run_id}")),
        "{}",
        runs.text
    );

    // Account actions go through the API's handlers.
    let csrf = account.csrf();
    let p = b
        .post(
            "/accounts/sales-1/limits",
            &[
                ("csrf", &csrf),
                ("max_per_minute", "12"),
                ("group_concurrency", ""),
                ("daily_cap", "500"),
                ("hourly_cap", ""),
            ],
        )
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    let a = app.get("/v1/accounts/sales-1").await.json;
    assert_eq!(a["limits"]["max_per_minute"], 12);
    assert_eq!(a["limits"]["daily_cap"], 500);
    let p = b
        .post(
            "/accounts/sales-1/limits",
            &[("csrf", &csrf), ("max_per_minute", "0")],
        )
        .await;
    assert_eq!(p.status, 422, "{}", p.text);
    assert!(p.text.contains("max_per_minute"));
    let p = b
        .post("/accounts/sales-1/disable", &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 303);
    assert_eq!(
        app.get("/v1/accounts/sales-1").await.json["state"],
        "disabled"
    );
    let p = b
        .post(&format!("/reminders/{id}/pause"), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 303);
    assert_eq!(
        app.get(&format!("/v1/reminders/{id}")).await.json["state"],
        "paused"
    );
}

#[actix_rt::test]
async fn a_run_is_stopped_from_its_page_and_a_whatsapp_account_has_a_pairing_page() {
    let app = spawn_app_with_token().await;
    app.add_account("sales-1").await;
    let r = app
        .create_reminder(reminder_body("sales-1", &groups(40)))
        .await;
    let mut b = signed_in(&app).await;
    let csrf = b.csrf().await;
    let p = b
        .post(&format!("/reminders/{}/fire", r["id"]), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    let run_page = p.location.unwrap();
    let run_id: i64 = run_page.trim_start_matches("/runs/").parse().unwrap();
    app.wait_run(run_id, 30, |r| r["counts"]["sent"].as_u64() >= Some(1))
        .await;
    let page = b.get(&run_page).await;
    assert!(
        page.text
            .contains(&format!(r#"action="/runs/{run_id}/stop""#)),
        "{}",
        page.text
    );
    let p = b
        .post(&format!("/runs/{run_id}/stop"), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    assert_eq!(p.location.as_deref(), Some(run_page.as_str()));
    let run = app
        .wait_run(run_id, 30, |r| r["status"] == "cancelled")
        .await;
    assert!(run["counts"]["sent"].as_u64().unwrap() < 40, "{run}");
    let page = b.get(&run_page).await;
    assert!(page.text.contains("badge cancelled"), "{}", page.text);
    assert!(page.text.contains("Retry unsent groups"));
    let live = b.get(&format!("{run_page}/live")).await.json();
    assert_eq!(live["status"], "cancelled");
    // A second stop is the API's refusal, shown with its status.
    let p = b
        .post(&format!("/runs/{run_id}/pause"), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 409, "{}", p.text);
    assert!(p.content_type.starts_with("text/html"));

    let r = app
        .post("/v1/accounts", json!({"id": "wa-1", "kind": "whatsapp"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let page = b.get("/accounts/wa-1/pair").await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(
        page.text.contains("Start pairing") && page.text.contains(r#"data-account="wa-1""#),
        "{}",
        page.text
    );
    let state = b.get("/accounts/wa-1/pair/state").await;
    assert_eq!(state.status, 200, "{}", state.text);
    assert!(state.json()["state"].is_string(), "{}", state.text);
    // No QR before pairing starts: the API's 404, as problem+json.
    assert_eq!(b.get("/accounts/wa-1/pair/qr.png").await.status, 404);

    // Pairing by phone number: the form sends the phone to the API's
    // pairing, which checks it before dialling WhatsApp.
    assert!(
        page.text.contains(r#"id="pair-by-phone""#) && page.text.contains(r#"name="phone""#),
        "{}",
        page.text
    );
    let csrf = page.csrf();
    let p = b
        .post("/accounts/wa-1/pair", &[("csrf", &csrf), ("phone", "12ab")])
        .await;
    assert_eq!(p.status, 422, "{}", p.text);
    assert!(p.content_type.starts_with("text/html"));
    assert!(p.text.contains("phone"), "the field is named: {}", p.text);
    assert!(p.text.contains("digits"), "and its rule: {}", p.text);
    let p = b
        .post(
            "/accounts/wa-1/pair",
            &[("csrf", ""), ("phone", "60123456789")],
        )
        .await;
    assert_eq!(p.status, 403, "{}", p.text);
    assert_eq!(
        b.get("/accounts/wa-1/pair/state").await.json()["state"],
        state.json()["state"],
        "a refused form starts nothing"
    );
}

#[actix_rt::test]
async fn an_edit_through_the_form_is_saved_and_a_stale_form_is_refused() {
    let app = spawn_app_with_token().await;
    app.add_account("sales-1").await;
    let r = app
        .create_reminder(reminder_body("sales-1", &groups(1)))
        .await;
    let id = r["id"].as_i64().unwrap();
    let mut b = signed_in(&app).await;
    let edit = b.get(&format!("/reminders/{id}/edit")).await;
    assert_eq!(edit.status, 200, "{}", edit.text);
    assert_eq!(edit.field("at"), "2099-01-05T09:00");
    let (csrf, version) = (edit.csrf(), edit.field("version"));
    let group1 = group(1);
    let form = |title: &'static str| {
        vec![
            ("account_id", "sales-1"),
            ("title", title),
            ("timezone", "UTC"),
            ("kind", "at"),
            ("at", "2099-01-05T09:30"),
            ("start_hour", "0"),
            ("end_hour", "24"),
            ("text", "Standup in 10 minutes"),
            ("targets", group1.as_str()),
        ]
    };
    let mut first = form("Retitled");
    first.extend([("csrf", csrf.as_str()), ("version", version.as_str())]);
    let p = b.post(&format!("/reminders/{id}"), &first).await;
    assert_eq!(p.status, 303, "{}", p.text);
    let stored = app.get(&format!("/v1/reminders/{id}")).await.json;
    assert_eq!(stored["title"], "Retitled");
    assert_eq!(stored["schedule"]["at"], "2099-01-05T09:30:00");

    // The same form again: drawn from the version before that save.
    let before = app.snapshot().await;
    let mut stale = form("Third");
    stale.extend([("csrf", csrf.as_str()), ("version", version.as_str())]);
    let p = b.post(&format!("/reminders/{id}"), &stale).await;
    assert_eq!(p.status, 412, "{}", p.text);
    assert!(
        p.text.contains("changed since this form was opened"),
        "{}",
        p.text
    );
    assert_eq!(app.snapshot().await, before);
}

/// A one-shot time that happens twice (London, 31 October 2027, 01:30):
/// the form's fold picks the second; the preview names both offsets and
/// which one fires, and saving stores the choice.
#[actix_rt::test]
async fn the_form_picks_the_second_of_a_repeated_time() {
    let app = spawn_app_with_token().await;
    app.add_account("sales-1").await;
    let mut b = signed_in(&app).await;
    let csrf = b.csrf().await;
    let form = |fold: &'static str, preview: bool| {
        let mut f = vec![
            ("account_id", "sales-1"),
            ("title", "Night shift"),
            ("timezone", "Europe/London"),
            ("kind", "at"),
            ("at", "2027-10-31T01:30"),
            ("fold", fold),
            ("start_hour", "0"),
            ("end_hour", "24"),
            ("text", "Hello"),
            ("targets", "120363000000000001@g.us"),
            ("csrf", csrf.as_str()),
        ];
        if preview {
            f.push(("preview", "1"));
        }
        f
    };
    let p = b.post("/reminders", &form("earlier", true)).await;
    assert_eq!(p.status, 200, "{}", p.text);
    assert!(
        p.text.contains("fires once, at the first (+01:00;"),
        "{}",
        p.text
    );
    let p = b.post("/reminders", &form("later", true)).await;
    assert_eq!(p.status, 200, "{}", p.text);
    assert!(
        p.text
            .contains("fires once, at the second (+00:00; the first is +01:00)"),
        "{}",
        p.text
    );
    assert!(
        p.text.contains(r#"<option value="later" selected>"#),
        "the choice stays picked: {}",
        p.text
    );
    let p = b.post("/reminders", &form("later", false)).await;
    assert_eq!(p.status, 303, "{}", p.text);
    let list = app.get("/v1/reminders").await;
    let saved = &list.json["items"][0];
    assert_eq!(
        saved["schedule"],
        serde_json::json!({"at": "2027-10-31T01:30:00", "fold": "later"})
    );
    let d = app.get(&format!("/v1/reminders/{}", saved["id"])).await;
    assert_eq!(d.json["next_fires"][0]["at"], "2027-10-31T01:30:00Z");
    // Its edit form shows the second picked.
    let page = b.get(&format!("/reminders/{}/edit", saved["id"])).await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(
        page.text.contains(r#"<option value="later" selected>"#),
        "{}",
        page.text
    );
}

/// The run page's "Recall…" leads to a page that says how many groups
/// and that it cannot be undone; its button recalls the run, and the run
/// page shows the recall's progress.
#[actix_rt::test]
async fn a_run_is_recalled_from_its_page_after_saying_how_many_groups() {
    let app = spawn_app_with_token().await;
    app.add_account("sales-1").await;
    let r = app
        .create_reminder(reminder_body("sales-1", &groups(3)))
        .await;
    let fired = app
        .post_empty(&format!("/v1/reminders/{}/fire", r["id"]))
        .await;
    let run_id = fired.json["run_id"].as_i64().unwrap();
    app.wait_run(run_id, 30, |r| r["status"] == "success").await;
    let mut b = signed_in(&app).await;
    let run_page = format!("/runs/{run_id}");
    let page = b.get(&run_page).await;
    assert!(
        page.text
            .contains(&format!(r#"href="/runs/{run_id}/recall""#)),
        "{}",
        page.text
    );
    let ask = b.get(&format!("{run_page}/recall")).await;
    assert_eq!(ask.status, 200, "{}", ask.text);
    assert!(
        ask.text
            .contains(r#"<strong id="recall-groups">3</strong>"#),
        "{}",
        ask.text
    );
    assert!(ask.text.contains("cannot be undone"), "{}", ask.text);
    assert!(ask.text.contains("Recall from 3 groups"), "{}", ask.text);
    assert_eq!(
        app.get(&run_page.replace("/runs", "/v1/runs")).await.json["amendment"],
        Value::Null,
        "asking recalls nothing"
    );
    let csrf = ask.csrf();
    let p = b
        .post(&format!("{run_page}/recall"), &[("csrf", &csrf)])
        .await;
    assert_eq!(p.status, 303, "{}", p.text);
    assert_eq!(p.location.as_deref(), Some(run_page.as_str()));
    app.wait_run(run_id, 30, |r| !r["amendment"]["finished_at"].is_null())
        .await;
    let page = b.get(&run_page).await;
    assert!(
        page.text
            .contains("recall: 3 of 3 groups recalled (finished)"),
        "{}",
        page.text
    );
    // What the page's script refreshes the line from.
    let live = b.get(&format!("{run_page}/live")).await.json();
    assert_eq!(
        live["amendment"],
        "recall: 3 of 3 groups recalled (finished)"
    );
}

/// What WhatsApp says of an account shows where an operator looks: the
/// account's page lists its time-lock and quota; a lock that holds or a
/// quota at its second warning puts it among the accounts needing
/// attention, though its state is `connected`.
#[actix_rt::test]
async fn an_accounts_standing_shows_on_its_page_and_asks_for_attention() {
    use herald_actors::domain::*;
    let app = spawn_app_with_token().await;
    app.add_account("acc").await;
    let mut b = Browser::new(&app);
    assert_eq!(b.sign_in(TOKEN).await.status, 303);
    let page = b.get("/accounts/acc").await;
    assert!(
        page.text.contains("not read yet") || page.text.contains("none"),
        "{}",
        page.text
    );
    let overview = b.get("/").await;
    assert!(
        !overview.text.contains("time-locked by WhatsApp"),
        "{}",
        overview.text
    );
    let now = chrono::Utc::now();
    let standing = Standing {
        timelock: locked_until(now + chrono::Duration::hours(3), now),
        quota: quota_at(QuotaStatus::Capped, 50, 50, now),
    };
    app.state
        .store
        .set_account_standing(&AccountId::parse("acc").unwrap(), None, &standing, None)
        .await
        .unwrap();
    let page = b.get("/accounts/acc").await;
    assert!(page.text.contains("time-locked until"), "{}", page.text);
    assert!(page.text.contains("capped, 50 of 50 used"), "{}", page.text);
    let overview = b.get("/").await;
    assert!(
        overview.text.contains("time-locked by WhatsApp until")
            && overview
                .text
                .contains("new-chat quota capped (50 of 50 used)"),
        "{}",
        overview.text
    );
    // The API shows the same standing.
    let a = app.get("/v1/accounts/acc").await;
    assert_eq!(a.json["standing"]["timelock"]["active"], true, "{}", a.text);
    assert_eq!(a.json["standing"]["quota"]["status"], "capped");
}

/// A poll run's page answers it: a bar per option, labelled with its
/// votes, the same figures as the API, and the groups' counts below.
#[actix_rt::test]
async fn a_poll_runs_page_shows_a_bar_per_option_and_the_groups_counts() {
    let app = spawn_app_with(&[
        ("HERALD_CONTROL__TOKEN", TOKEN),
        ("HERALD_SIMULATOR__VOTE_SHARE", "1"),
        ("HERALD_SIMULATOR__VOTE_AFTER_SECS", "0"),
        ("HERALD_SIMULATOR__VOTE_AGAIN_AFTER_SECS", "0"),
    ])
    .await;
    app.add_account("club").await;
    let mut body = reminder_body("club", &groups(3));
    body["parts"] = json!([{"kind": "poll", "question": "Who drives?",
                            "options": ["Me", "Not me"], "multiple": true}]);
    let rem = app.create_reminder(body).await;
    let fired = app
        .post_empty(&format!("/v1/reminders/{}/fire", rem["id"]))
        .await;
    assert_eq!(fired.status, 202, "{}", fired.text);
    let run = fired.json["run_id"].as_i64().unwrap();
    app.wait_run(run, 20, |r| r["finished_at"].is_string())
        .await;
    // Settled once the API's answer stops moving.
    let mut last = Value::Null;
    let answer = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let a = app.get(&format!("/v1/runs/{run}/poll")).await;
        assert_eq!(a.status, 200, "{}", a.text);
        if a.json["polls"][0]["groups_voted"] == 3 && a.json == last {
            break a.json;
        }
        last = a.json;
    };
    app.assert_schema("RunPollAnswer", &answer).await;
    let mut b = signed_in(&app).await;
    let page = b.get(&format!("/runs/{run}")).await;
    assert_eq!(page.status, 200, "{}", page.text);
    let polls = page
        .text
        .split(r#"id="polls""#)
        .nth(1)
        .expect("the answers section");
    assert!(polls.contains("<svg"), "{polls}");
    for o in answer["polls"][0]["options"].as_array().unwrap() {
        let (option, votes) = (o["option"].as_str().unwrap(), o["votes"].as_u64().unwrap());
        assert!(
            polls.contains(&format!(">{option}</text>")),
            "{option}: {polls}"
        );
        assert!(
            polls.contains(&format!(">{votes}</text>")),
            "{votes}: {polls}"
        );
    }
    let voters = answer["polls"][0]["voters"].as_u64().unwrap();
    assert!(
        polls.contains(&format!("{voters} voters in 3 groups")),
        "{polls}"
    );
    let table = polls.split(r#"id="poll-groups""#).nth(1).unwrap();
    let rows = table
        .split("</table>")
        .next()
        .unwrap()
        .matches("<tr>")
        .count();
    assert_eq!(rows, 1 + 3, "a header and a row a group");
}
