//! A running daemon per test: fresh data dir, SQLite database and
//! simulator, on a free port; and a small client for its JSON API.

use awc::http::Method;
use futures_util::StreamExt;
use herald::settings::Settings;
use herald::startup::Application;
use herald::state::AppState;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

pub const JSON_LIMIT: usize = 16 * 1024;
pub const MEDIA_LIMIT: usize = 64 * 1024;
pub const TOKEN: &str = "test-token-6f1c-0a9b8c7d6e";

pub struct TestApp {
    pub base: String,
    pub client: awc::Client,
    pub state: AppState,
    /// Sent as the bearer token when set: the daemon's (generated unless
    /// the test configured one).
    pub token: Option<String>,
    pub data_dir: tempfile::TempDir,
}

pub struct Resp {
    pub status: u16,
    pub content_type: String,
    pub headers: awc::http::header::HeaderMap,
    pub json: Value,
    pub text: String,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

/// A daemon that requires the configured `TOKEN` on /v1.
pub async fn spawn_app_with_token() -> TestApp {
    spawn_app_with(&[("HERALD_CONTROL__TOKEN", TOKEN)]).await
}

/// A daemon whose group directories may be synced again one second after
/// the last sync: tests that change the simulator's groups and sync.
pub async fn spawn_app_syncing_every_second() -> TestApp {
    spawn_app_with(&[
        ("HERALD_CONTROL__TOKEN", TOKEN),
        ("HERALD_GROUPS__MIN_SYNC_INTERVAL_SECS", "1"),
    ])
    .await
}

pub async fn spawn_app_with(overrides: &[(&str, &str)]) -> TestApp {
    let data_dir = tempfile::tempdir().expect("tempdir");
    let mut env: HashMap<String, String> = [
        ("HERALD_CONTROL__LISTEN", "127.0.0.1:0"),
        (
            "HERALD_STORAGE__DATA_DIR",
            data_dir.path().to_str().unwrap(),
        ),
        ("HERALD_CONTROL__MAX_JSON_BYTES", &JSON_LIMIT.to_string()),
        ("HERALD_MEDIA__MAX_BYTES", &MEDIA_LIMIT.to_string()),
        // Fast simulated WhatsApp so a fan-out takes seconds.
        ("HERALD_SIMULATOR__LATENCY_MIN_MS", "1"),
        ("HERALD_SIMULATOR__LATENCY_MAX_MS", "5"),
        ("HERALD_SIMULATOR__GROUPS_PER_ACCOUNT", "60"),
        ("HERALD_SIMULATOR__RATE_LIMIT_PER_MINUTE", "1000"),
        ("HERALD_DELIVERY__JITTER_MIN_MS", "0"),
        ("HERALD_DELIVERY__JITTER_MAX_MS", "20"),
        ("HERALD_LOG__FILTER", "warn"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in overrides {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    let settings = Settings::load_from(None, &env).expect("settings");
    let app = Application::build(settings)
        .await
        .expect("application builds");
    let base = format!("http://127.0.0.1:{}", app.port());
    let state = app.state().clone();
    let token = app.token().map(|t| t.expose().to_owned());
    // Runs until the test's System ends.
    actix_rt::spawn(async move {
        let _ = app.run_until_stopped().await;
    });
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(20))
        .finish();
    TestApp {
        base,
        client,
        state,
        token,
        data_dir,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with the app's token (if any) and an optional raw body.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.client.request(method, self.url(path));
        if let Some(t) = &self.token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        if let Some(ct) = content_type {
            req = req.insert_header(("Content-Type", ct));
        }
        for (k, v) in headers {
            req = req.insert_header((*k, *v));
        }
        let res = match body {
            Some(b) => req.send_body(b).await,
            None => req.send().await,
        };
        let mut res = res.unwrap_or_else(|e| panic!("{path}: {e}"));
        let bytes = res.body().limit(8 << 20).await.expect("body");
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Resp {
            status: res.status().as_u16(),
            content_type: res
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default(),
            headers: res.headers().clone(),
            json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            text,
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send("GET", path, None, None, &[]).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Resp {
        self.json("POST", path, body).await
    }

    pub async fn post_empty(&self, path: &str) -> Resp {
        self.send("POST", path, None, None, &[]).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Resp {
        self.json("PUT", path, body).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Resp {
        self.json("PATCH", path, body).await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.send("DELETE", path, None, None, &[]).await
    }

    pub async fn json(&self, method: &str, path: &str, body: Value) -> Resp {
        self.send(
            method,
            path,
            Some("application/json"),
            Some(body.to_string().into_bytes()),
            &[],
        )
        .await
    }

    /// Adds a simulated account and answers its JSON.
    pub async fn add_account(&self, id: &str) -> Value {
        self.add_account_with(id, json!({})).await
    }

    /// Adds a simulated account with these settings besides (limits, a
    /// name) and answers its JSON.
    pub async fn add_account_with(&self, id: &str, settings: Value) -> Value {
        let mut body = json!({"id": id, "kind": "simulator"});
        if let (Some(b), Some(extra)) = (body.as_object_mut(), settings.as_object()) {
            b.extend(extra.clone());
        }
        let r = self.post("/v1/accounts", body).await;
        assert_eq!(r.status, 201, "{}", r.text);
        r.json
    }

    /// Fires reminder `id` now (202) and answers its run's id.
    pub async fn fire(&self, id: &Value) -> i64 {
        let r = self.post_empty(&format!("/v1/reminders/{id}/fire")).await;
        assert_eq!(r.status, 202, "{}", r.text);
        r.json["run_id"].as_i64().unwrap()
    }

    pub async fn create_reminder(&self, body: Value) -> Value {
        let r = self.post("/v1/reminders", body).await;
        assert_eq!(r.status, 201, "{}", r.text);
        r.json
    }

    pub async fn upload_png(&self) -> Value {
        let r = self
            .send(
                "POST",
                "/v1/media?filename=dot.png",
                Some("image/png"),
                Some(tiny_png()),
                &[],
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        r.json
    }

    /// Polls a run until `done` holds, for at most `secs`.
    pub async fn wait_run(&self, run_id: i64, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let r = self.get(&format!("/v1/runs/{run_id}")).await;
            assert_eq!(r.status, 200, "{}", r.text);
            if done(&r.json) {
                return r.json;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "run {run_id} did not get there: {}",
                r.text
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The whole stored state the API shows, to compare before and after a
    /// refused request.
    pub async fn snapshot(&self) -> Value {
        let mut out = json!({});
        for path in ["/v1/accounts", "/v1/reminders", "/v1/runs?limit=500"] {
            let r = self.get(path).await;
            assert_eq!(r.status, 200, "{path}: {}", r.text);
            let mut json = r.json;
            // What WhatsApp last said of an account is read by its actor on
            // its own clock (on connect, after an edit restarts it), not
            // written by the request under test.
            if let Some(items) = json["items"].as_array_mut() {
                for item in items {
                    if let Some(account) = item.as_object_mut() {
                        account.remove("standing");
                    }
                }
            }
            out[path] = json;
        }
        out
    }

    /// Reads server-sent events until `until` says stop or `secs` pass.
    pub async fn read_events(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        secs: u64,
        until: impl Fn(&[SseEvent]) -> bool,
    ) -> Vec<SseEvent> {
        let mut req = self.client.get(self.url(path));
        if let Some(t) = &self.token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        for (k, v) in headers {
            req = req.insert_header((*k, *v));
        }
        let mut res = req.send().await.expect("event stream");
        assert_eq!(res.status().as_u16(), 200);
        assert_eq!(
            res.headers().get("content-type").unwrap(),
            "text/event-stream"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut buf = String::new();
        let mut events = Vec::new();
        while !until(&events) {
            let chunk = tokio::time::timeout_at(deadline, res.next())
                .await
                .unwrap_or_else(|_| panic!("events so far: {events:#?}"))
                .expect("stream open")
                .expect("chunk");
            buf.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                if let Some(ev) = SseEvent::parse(&block) {
                    events.push(ev);
                }
            }
        }
        events
    }
}

#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: i64,
    pub kind: String,
    pub data: Value,
}

impl SseEvent {
    /// One block; comments (keep-alives) give `None`.
    fn parse(block: &str) -> Option<Self> {
        let (mut id, mut kind, mut data) = (None, None, None);
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.parse().ok();
            } else if let Some(v) = line.strip_prefix("event: ") {
                kind = Some(v.to_owned());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str(v).expect("data is JSON"));
            }
        }
        Some(Self {
            // `events_pruned` says what retention deleted and has no id.
            id: id.unwrap_or(0),
            kind: kind?,
            data: data?,
        })
    }
}

/// Asserts a problem+json answer with this status (and field, if given).
/// Account `slow` at the default 40/min and a reminder to `n` groups,
/// fired: its run takes well over a minute, so it is still going while
/// the test pokes it. Answers the reminder's id and the run's.
pub async fn slow_run(app: &TestApp, n: usize) -> (i64, i64) {
    app.add_account("slow").await;
    let rem = app.create_reminder(reminder_body("slow", &groups(n))).await;
    let run = app.fire(&rem["id"]).await;
    (rem["id"].as_i64().unwrap(), run)
}

pub fn assert_problem(r: &Resp, status: u16, field: Option<&str>) {
    assert_eq!(r.status, status, "{}", r.text);
    assert_eq!(r.content_type, "application/problem+json", "{}", r.text);
    assert_eq!(r.json["status"], status, "{}", r.text);
    for key in ["type", "title", "detail"] {
        assert!(r.json[key].is_string(), "{key} in {}", r.text);
    }
    if let Some(f) = field {
        assert_eq!(r.json["field"], f, "{}", r.text);
        assert!(r.json["rule"].is_string(), "{}", r.text);
    }
}

/// The `i`-th numbered group the simulator puts every account in.
pub fn group(i: usize) -> String {
    format!("120363{i:012}@g.us")
}

pub fn groups(n: usize) -> Vec<String> {
    (1..=n).map(group).collect()
}

/// A reminder that never fires by itself (one-shot far ahead), deliverable
/// all day in UTC, so only `fire` starts it.
pub fn reminder_body(account: &str, targets: &[String]) -> Value {
    json!({
        "account_id": account,
        "title": "Standup",
        "timezone": "UTC",
        "schedule": {"at": "2099-01-05T09:00"},
        "window": {"start_hour": 0, "end_hour": 24},
        "parts": [{"kind": "text", "text": "Standup in 10 minutes"}],
        "targets": targets,
    })
}

use crate::common::png;
pub use png::tiny_png;

/// WhatsApp's word, read at `now`, that the account's reach-out is
/// time-locked until `until`.
pub fn locked_until(
    until: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> herald_actors::domain::Reading<herald_actors::domain::TimeLock> {
    use herald_actors::domain::{Reading, TimeLock};
    Reading::Known {
        value: TimeLock {
            active: true,
            until: Some(until),
            kind: Some("DEFAULT".into()),
        },
        read_at: now,
    }
}

/// WhatsApp's word, read at `now`, on the new-chat quota: `used` of `total`
/// at `status`.
pub fn quota_at(
    status: herald_actors::domain::QuotaStatus,
    used: u64,
    total: u64,
    now: chrono::DateTime<chrono::Utc>,
) -> herald_actors::domain::Reading<herald_actors::domain::NewChatQuota> {
    use herald_actors::domain::{NewChatQuota, Reading};
    Reading::Known {
        value: NewChatQuota {
            status,
            used: Some(used),
            total: Some(total),
            cycle_start: None,
            cycle_end: None,
        },
        read_at: now,
    }
}
