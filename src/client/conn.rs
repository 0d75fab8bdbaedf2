//! The connection to the control port: options, the thin HTTP client that
//! maps every failure to an exit code, and the System a command runs in.

use super::format::url_encode;
use crate::settings::Settings;
use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Exit codes: 0 ok; 1 could not talk to the daemon or another failure;
/// 2 usage (clap); 3 not found; 4 conflict; 5 input refused; 6 unauthorised;
/// 7 a watched run ended other than `success`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Failure = 1,
    NotFound = 3,
    Conflict = 4,
    Refused = 5,
    Unauthorised = 6,
    RunNotSuccessful = 7,
}

/// An error the client reports with its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ClientError {
    pub exit: Exit,
    pub message: String,
}

#[derive(Debug, Clone, Args)]
pub struct ClientOpts {
    /// Control port URL (default: http://<control.listen>).
    #[arg(long, global = true, env = "HERALD_URL")]
    pub url: Option<String>,
    /// Bearer token (default: control.token / control.token_file, else the
    /// token the daemon generated in <data_dir>/control.token).
    #[arg(long, global = true, env = "HERALD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the daemon's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// A thin client over awc; every call maps HTTP failures to [`Exit`].
pub struct Client {
    base: String,
    token: Option<String>,
    http: awc::Client,
    pub json: bool,
}

impl Client {
    pub fn new(opts: &ClientOpts, config: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let settings = Settings::load(config).ok();
        let base = match &opts.url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => format!(
                "http://{}",
                settings
                    .as_ref()
                    .map(|s| s.control.listen.clone())
                    .unwrap_or_else(|| "127.0.0.1:8790".into())
            ),
        };
        let token = opts.token.clone().or_else(|| {
            settings
                .as_ref()
                .and_then(crate::token::for_client)
                .map(|t| t.expose().to_owned())
        });
        let http = awc::Client::builder()
            .timeout(Duration::from_secs(30))
            .finish();
        Ok(Self {
            base,
            token,
            http,
            json: opts.json,
        })
    }

    pub(super) fn request(&self, method: awc::http::Method, path: &str) -> awc::ClientRequest {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.insert_header(("Authorization", format!("Bearer {t}"))),
            None => req,
        }
    }

    pub(super) async fn finish(
        &self,
        mut resp: awc::ClientResponse<
            impl futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>
                + Unpin,
        >,
    ) -> anyhow::Result<Value> {
        let status = resp.status();
        let body = resp
            .body()
            .limit(64 * 1024 * 1024)
            .await
            .context("reading the daemon's answer")?;
        let value: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)))
        };
        if status.is_success() {
            return Ok(value);
        }
        let exit = match status.as_u16() {
            401 | 403 => Exit::Unauthorised,
            404 => Exit::NotFound,
            409 => Exit::Conflict,
            400 | 413 | 415 | 422 => Exit::Refused,
            _ => Exit::Failure,
        };
        let detail = value.get("detail").and_then(Value::as_str).unwrap_or("");
        let title = value
            .get("title")
            .and_then(Value::as_str)
            .unwrap_or("request failed");
        let mut message = if detail.is_empty() {
            format!("{status}: {title}")
        } else {
            format!("{status}: {detail}")
        };
        if status.as_u16() == 401 {
            message.push_str(
                "\nThe CLI sends --token (HERALD_TOKEN), else control.token or control.token_file, \
                 else the daemon's generated <data_dir>/control.token, which only the daemon's \
                 user (and root) can read.",
            );
        }
        Err(ClientError { exit, message }.into())
    }

    pub(super) fn unreachable(&self, e: impl std::fmt::Display) -> anyhow::Error {
        anyhow::anyhow!("cannot reach the Herald daemon at {}: {e}", self.base)
    }

    /// Every page of a keyset-paged list: follows `next_after` until it
    /// is null and answers `{"items": [...]}` with all the items.
    pub async fn get_all(&self, path: &str) -> anyhow::Result<Value> {
        let sep = match path.find('?') {
            None => "?",
            Some(i) if i + 1 == path.len() => "",
            Some(_) => "&",
        };
        let mut all = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page_path = match &next {
                None => format!("{path}{sep}limit=500"),
                Some(after) => format!("{path}{sep}limit=500&after={}", url_encode(after)),
            };
            let page = self.get(&page_path).await?;
            all.extend(page["items"].as_array().cloned().unwrap_or_default());
            next = match &page["next_after"] {
                Value::Null => None,
                Value::String(s) => Some(s.clone()),
                other => Some(other.to_string()),
            };
            if next.is_none() {
                return Ok(serde_json::json!({ "items": all }));
            }
        }
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let resp = self
            .request(awc::http::Method::GET, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.finish(resp).await
    }

    pub async fn send_json(
        &self,
        method: awc::http::Method,
        path: &str,
        body: &Value,
    ) -> anyhow::Result<Value> {
        let resp = self
            .request(method, path)
            .send_json(body)
            .await
            .map_err(|e| self.unreachable(e))?;
        self.finish(resp).await
    }

    pub async fn post(&self, path: &str) -> anyhow::Result<Value> {
        self.send_json(awc::http::Method::POST, path, &json!({}))
            .await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        let resp = self
            .request(awc::http::Method::DELETE, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.finish(resp).await
    }

    pub async fn upload(&self, path: &str, bytes: Vec<u8>) -> anyhow::Result<Value> {
        let resp = self
            .request(awc::http::Method::POST, path)
            .insert_header(("Content-Type", "application/octet-stream"))
            .send_body(bytes)
            .await
            .map_err(|e| self.unreachable(e))?;
        self.finish(resp).await
    }

    pub(super) fn print(&self, value: &Value, table: impl FnOnce(&Value) -> String) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
        } else {
            print!("{}", table(value));
        }
    }
}

/// Runs a client command in its own actix System and maps the outcome to an exit code.
pub fn run<F, Fut>(opts: ClientOpts, config: Option<PathBuf>, f: F) -> ExitCode
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let result = actix_rt::System::new().block_on(async move {
        let client = Client::new(&opts, config.as_deref())?;
        f(client).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let code = e
                .downcast_ref::<ClientError>()
                .map(|c| c.exit)
                .unwrap_or(Exit::Failure);
            ExitCode::from(code as u8)
        }
    }
}
