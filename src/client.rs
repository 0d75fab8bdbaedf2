//! `herald accounts|media|reminders|runs …`: the command-line client of the
//! control port. Tables for people, `--json` for scripts, and exit codes a
//! script can branch on (see [`Exit`]).

use crate::settings::Settings;
use anyhow::Context;
use clap::{Args, Subcommand};
use futures_util::StreamExt;
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

#[derive(Debug, Subcommand)]
pub enum GroupsCmd {
    /// An account's groups, from its directory (`sync` refreshes it).
    List {
        account: String,
        /// Only groups whose name contains this (ignoring case).
        #[arg(long)]
        name: Option<String>,
        /// Only groups with this label.
        #[arg(long)]
        label: Option<String>,
        /// Only groups the account may (true) or may not (false) post in.
        #[arg(long)]
        can_post: Option<bool>,
        /// Also groups the account has left.
        #[arg(long)]
        include_left: bool,
        /// Comma-separated values instead of a table.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
    },
    /// Ask WhatsApp for the account's groups now (throttled per account).
    Sync { account: String },
    /// Set a group's labels; none clears them.
    Label {
        account: String,
        jid: String,
        labels: Vec<String>,
    },
}

/// An account's limits and caps, as `accounts add` and `accounts set`
/// take them.
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// Messages per minute for this account.
    #[arg(long)]
    rate: Option<u32>,
    #[arg(long)]
    group_concurrency: Option<u32>,
    /// Messages per local day.
    #[arg(long)]
    daily_cap: Option<u32>,
    /// Messages per local hour.
    #[arg(long)]
    hourly_cap: Option<u32>,
    /// IANA timezone of the account's days and hours (for its caps).
    #[arg(long)]
    timezone: Option<String>,
}

impl LimitArgs {
    /// Sets the given ones on a JSON body, under the API's names.
    fn fill(self, body: &mut serde_json::Value) {
        let fields = [
            ("max_per_minute", self.rate.map(|v| json!(v))),
            (
                "group_concurrency",
                self.group_concurrency.map(|v| json!(v)),
            ),
            ("daily_cap", self.daily_cap.map(|v| json!(v))),
            ("hourly_cap", self.hourly_cap.map(|v| json!(v))),
            ("timezone", self.timezone.map(|v| json!(v))),
        ];
        for (k, v) in fields {
            if let Some(v) = v {
                body[k] = v;
            }
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum AccountsCmd {
    /// List accounts.
    List,
    /// One account with its live state (queue, current run, tokens).
    Show {
        id: String,
    },
    /// Add an account.
    Add {
        id: String,
        #[arg(long, default_value = "simulator")]
        kind: String,
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
        /// The number is new to sending at volume: hold it to the warm-up
        /// ramp (`delivery.warmup`).
        #[arg(long)]
        new_number: bool,
    },
    /// Change per-account overrides.
    Set {
        id: String,
        #[command(flatten)]
        limits: LimitArgs,
        /// Whether the warm-up ramp holds this account (true or false).
        #[arg(long)]
        new_number: Option<bool>,
    },
    Disable {
        id: String,
    },
    Enable {
        id: String,
    },
    Remove {
        id: String,
    },
    /// Pair a WhatsApp account: shows the QR (or pair code) until paired.
    Pair {
        id: String,
        /// Phone number in international format for a pair code instead of a QR.
        #[arg(long)]
        phone: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum MediaCmd {
    /// Upload a picture; prints its id (sha256) for reminders.
    Upload {
        file: PathBuf,
    },
    Show {
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum RemindersCmd {
    /// Create a reminder from a TOML or JSON file (same fields as the API).
    Create {
        #[arg(long)]
        file: PathBuf,
        /// Add targets from a CSV whose first column holds group JIDs or
        /// exact group names (a `jid`/`name`/`group` header is skipped);
        /// refused, creating nothing, if a name matches no group or several.
        #[arg(long)]
        targets_csv: Option<PathBuf>,
    },
    /// Replace a reminder from a TOML or JSON file.
    Update {
        id: i64,
        #[arg(long)]
        file: PathBuf,
        /// As for `create`.
        #[arg(long)]
        targets_csv: Option<PathBuf>,
    },
    List {
        #[arg(long)]
        account: Option<String>,
        #[arg(long)]
        state: Option<String>,
    },
    Show {
        id: i64,
    },
    Pause {
        id: i64,
    },
    Resume {
        id: i64,
    },
    Delete {
        id: i64,
    },
    /// Fire now (subject to the delivery window).
    Fire {
        id: i64,
    },
    /// Dry run: would it fit in its window at the account's rate?
    Forecast {
        id: i64,
    },
    /// Render what the first groups of a run would receive (templates
    /// with their variables and alternatives filled in).
    Preview {
        id: i64,
        /// How many groups to render (1–50).
        #[arg(long, default_value_t = 5)]
        samples: usize,
    },
}

#[derive(Debug, Subcommand)]
pub enum RunsCmd {
    List {
        #[arg(long)]
        reminder: Option<i64>,
        #[arg(long)]
        account: Option<String>,
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    Show {
        id: i64,
    },
    /// A run's targets, in order.
    Targets {
        id: i64,
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    Stop {
        id: i64,
    },
    Pause {
        id: i64,
    },
    Resume {
        id: i64,
    },
    Retry {
        id: i64,
    },
    /// Live progress bar until the run ends; exit 0 only on success.
    Watch {
        id: i64,
    },
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

    fn request(&self, method: awc::http::Method, path: &str) -> awc::ClientRequest {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.insert_header(("Authorization", format!("Bearer {t}"))),
            None => req,
        }
    }

    async fn finish(
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

    fn unreachable(&self, e: impl std::fmt::Display) -> anyhow::Error {
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

    fn print(&self, value: &Value, table: impl FnOnce(&Value) -> String) {
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

/// Formats rows as aligned columns under a header.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

fn s(v: &Value, key: &str) -> String {
    match v.pointer(key).or_else(|| v.get(key)) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(x)) => x.clone(),
        Some(other) => other.to_string(),
    }
}

fn items(v: &Value) -> Vec<Value> {
    v.get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn key_values(v: &Value) -> String {
    let mut out = String::new();
    if let Value::Object(m) = v {
        for (k, val) in m {
            let text = match val {
                Value::String(x) => x.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!("{k:<22} {text}\n"));
        }
    }
    out
}

/// The first column of each non-blank CSV row, unquoted; a first row
/// reading `jid`, `name` or `group` is a header.
fn csv_entries(text: &str) -> Vec<String> {
    let mut rows: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.is_empty() {
                return None;
            }
            let first = if let Some(rest) = line.strip_prefix('"') {
                // A quoted field: up to the closing quote, "" for a quote.
                let mut out = String::new();
                let mut chars = rest.chars().peekable();
                while let Some(ch) = chars.next() {
                    match ch {
                        '"' if chars.peek() == Some(&'"') => {
                            out.push('"');
                            chars.next();
                        }
                        '"' => break,
                        _ => out.push(ch),
                    }
                }
                out
            } else {
                line.split(',').next().unwrap_or("").to_owned()
            };
            Some(first.trim().to_owned())
        })
        .collect();
    if rows
        .first()
        .is_some_and(|h| ["jid", "name", "group"].contains(&h.to_lowercase().as_str()))
    {
        rows.remove(0);
    }
    rows
}

/// Resolves a targets CSV through the daemon and appends the JIDs to the
/// body's `targets`; the daemon refuses unknown or ambiguous names.
async fn with_csv_targets(
    c: &Client,
    mut body: Value,
    csv: Option<&std::path::Path>,
) -> anyhow::Result<Value> {
    let Some(csv) = csv else {
        return Ok(body);
    };
    let text =
        std::fs::read_to_string(csv).with_context(|| format!("reading {}", csv.display()))?;
    let entries = csv_entries(&text);
    let account = body
        .get("account_id")
        .and_then(Value::as_str)
        .context("the reminder file has no account_id")?
        .to_owned();
    let resolved = c
        .send_json(
            awc::http::Method::POST,
            &format!("/v1/accounts/{}/groups/resolve", url_encode(&account)),
            &serde_json::json!({ "entries": entries }),
        )
        .await?;
    let mut targets: Vec<Value> = body
        .get("targets")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for t in resolved["targets"].as_array().cloned().unwrap_or_default() {
        if !targets.contains(&t) {
            targets.push(t);
        }
    }
    body["targets"] = Value::Array(targets);
    Ok(body)
}

fn read_body_file(file: &std::path::Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let is_json =
        file.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
    if is_json {
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", file.display()))
    } else {
        let v: toml::Value = toml::from_str(&text)
            .with_context(|| format!("{} is not valid TOML", file.display()))?;
        Ok(serde_json::to_value(v)?)
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

/// One CSV field: quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn group_row(g: &Value) -> Vec<String> {
    let labels = g["labels"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    vec![
        s(g, "jid"),
        s(g, "subject"),
        s(g, "participants"),
        s(g, "can_post"),
        labels,
    ]
}

const GROUP_COLUMNS: [&str; 5] = ["jid", "name", "members", "can post", "labels"];

pub async fn groups(c: Client, cmd: GroupsCmd) -> anyhow::Result<()> {
    match cmd {
        GroupsCmd::List {
            account,
            name,
            label,
            can_post,
            include_left,
            csv,
        } => {
            let mut query = Vec::new();
            if let Some(n) = name {
                query.push(format!("name={}", url_encode(&n)));
            }
            if let Some(l) = label {
                query.push(format!("label={}", url_encode(&l)));
            }
            if let Some(p) = can_post {
                query.push(format!("can_post={p}"));
            }
            if include_left {
                query.push("include_left=true".into());
            }
            let path = format!("/v1/accounts/{account}/groups?{}", query.join("&"));
            let v = c.get_all(&path).await?;
            if csv {
                println!("{}", GROUP_COLUMNS.join(","));
                for g in items(&v) {
                    let row: Vec<String> = group_row(&g).iter().map(|f| csv_field(f)).collect();
                    println!("{}", row.join(","));
                }
                return Ok(());
            }
            c.print(&v, |v| {
                table(&GROUP_COLUMNS, items(v).iter().map(group_row).collect())
            });
        }
        GroupsCmd::Sync { account } => {
            let v = c
                .post(&format!("/v1/accounts/{account}/groups/sync"))
                .await?;
            c.print(&v, key_values);
        }
        GroupsCmd::Label {
            account,
            jid,
            labels,
        } => {
            let v = c
                .send_json(
                    awc::http::Method::PUT,
                    &format!("/v1/accounts/{account}/groups/{jid}/labels"),
                    &json!({ "labels": labels }),
                )
                .await?;
            c.print(&v, |v| table(&GROUP_COLUMNS, vec![group_row(v)]));
        }
    }
    Ok(())
}

pub async fn accounts(c: Client, cmd: AccountsCmd) -> anyhow::Result<()> {
    use awc::http::Method;
    let v = match cmd {
        AccountsCmd::List => {
            let v = c.get_all("/v1/accounts").await?;
            c.print(&v, |v| {
                let rows = items(v)
                    .iter()
                    .map(|a| {
                        vec![
                            s(a, "id"),
                            s(a, "kind"),
                            s(a, "state"),
                            s(a, "/limits/max_per_minute"),
                            s(a, "name"),
                            // Why it does not send (a ban, a cool-down, a logout).
                            s(a, "state_reason"),
                        ]
                    })
                    .collect();
                table(
                    &["id", "kind", "state", "rate override", "name", "reason"],
                    rows,
                )
            });
            return Ok(());
        }
        AccountsCmd::Show { id } => c.get(&format!("/v1/accounts/{id}")).await?,
        AccountsCmd::Add {
            id,
            kind,
            name,
            limits,
            new_number,
        } => {
            let mut body = json!({"id": id, "kind": kind});
            if let Some(n) = name {
                body["name"] = json!(n);
            }
            limits.fill(&mut body);
            if new_number {
                body["new_number"] = json!(true);
            }
            c.send_json(Method::POST, "/v1/accounts", &body).await?
        }
        AccountsCmd::Set {
            id,
            limits,
            new_number,
        } => {
            let mut body = json!({});
            limits.fill(&mut body);
            if let Some(n) = new_number {
                body["new_number"] = json!(n);
            }
            c.send_json(Method::PATCH, &format!("/v1/accounts/{id}"), &body)
                .await?
        }
        AccountsCmd::Disable { id } => c.post(&format!("/v1/accounts/{id}/disable")).await?,
        AccountsCmd::Enable { id } => c.post(&format!("/v1/accounts/{id}/enable")).await?,
        AccountsCmd::Remove { id } => c.delete(&format!("/v1/accounts/{id}")).await?,
        AccountsCmd::Pair { id, phone } => return pair(c, id, phone).await,
    };
    c.print(&v, key_values);
    Ok(())
}

async fn pair(c: Client, id: String, phone: Option<String>) -> anyhow::Result<()> {
    let body = match &phone {
        Some(p) => json!({"phone": p}),
        None => json!({}),
    };
    c.send_json(
        awc::http::Method::POST,
        &format!("/v1/accounts/{id}/pair"),
        &body,
    )
    .await?;
    let mut shown = String::new();
    loop {
        let v = c.get(&format!("/v1/accounts/{id}/pair")).await?;
        if c.json {
            println!("{v}");
        }
        let state = s(&v, "state");
        let code = v
            .get("qr_text")
            .or_else(|| v.get("pair_code"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if !c.json && !code.is_empty() && code != shown {
            println!("{code}");
            println!("Scan this with WhatsApp → Linked devices (state: {state})");
            shown = code;
        }
        match state.as_str() {
            "paired" => {
                println!("account {id} is paired");
                return Ok(());
            }
            "failed" | "logged_out" => {
                let why = s(&v, "reason");
                return Err(ClientError {
                    exit: Exit::Failure,
                    message: format!("pairing {state}: {why}"),
                }
                .into());
            }
            _ => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}

pub async fn media(c: Client, cmd: MediaCmd) -> anyhow::Result<()> {
    let v = match cmd {
        MediaCmd::Upload { file } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let q: String = url_encode(&name);
            let v = c.upload(&format!("/v1/media?filename={q}"), bytes).await?;
            if !c.json {
                println!("{}", s(&v, "id"));
                eprintln!("{} bytes, {}", s(&v, "size"), s(&v, "mime"));
                return Ok(());
            }
            v
        }
        MediaCmd::Show { id } => c.get(&format!("/v1/media/{id}")).await?,
    };
    c.print(&v, key_values);
    Ok(())
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub async fn reminders(c: Client, cmd: RemindersCmd) -> anyhow::Result<()> {
    use awc::http::Method;
    let v = match cmd {
        RemindersCmd::Create { file, targets_csv } => {
            let body = with_csv_targets(&c, read_body_file(&file)?, targets_csv.as_deref()).await?;
            let v = c.send_json(Method::POST, "/v1/reminders", &body).await?;
            if !c.json {
                println!("created reminder {}", s(&v, "id"));
                return Ok(());
            }
            v
        }
        RemindersCmd::Update {
            id,
            file,
            targets_csv,
        } => {
            let body = with_csv_targets(&c, read_body_file(&file)?, targets_csv.as_deref()).await?;
            c.send_json(Method::PUT, &format!("/v1/reminders/{id}"), &body)
                .await?
        }
        RemindersCmd::List { account, state } => {
            let mut q = vec![];
            if let Some(a) = account {
                q.push(format!("account_id={}", url_encode(&a)));
            }
            if let Some(st) = state {
                q.push(format!("state={}", url_encode(&st)));
            }
            let v = c.get_all(&format!("/v1/reminders?{}", q.join("&"))).await?;
            c.print(&v, |v| {
                let rows = items(v)
                    .iter()
                    .map(|r| {
                        // A list carries the count of targets, not the targets.
                        let targets = r.get("targets").and_then(Value::as_u64).unwrap_or(0);
                        let sched = r.get("schedule").map(|x| x.to_string()).unwrap_or_default();
                        vec![
                            s(r, "id"),
                            s(r, "account_id"),
                            s(r, "state"),
                            s(r, "timezone"),
                            sched,
                            targets.to_string(),
                            s(r, "title"),
                        ]
                    })
                    .collect();
                table(
                    &[
                        "id", "account", "state", "timezone", "schedule", "groups", "title",
                    ],
                    rows,
                )
            });
            return Ok(());
        }
        RemindersCmd::Show { id } => c.get(&format!("/v1/reminders/{id}")).await?,
        RemindersCmd::Pause { id } => c.post(&format!("/v1/reminders/{id}/pause")).await?,
        RemindersCmd::Resume { id } => c.post(&format!("/v1/reminders/{id}/resume")).await?,
        RemindersCmd::Delete { id } => c.delete(&format!("/v1/reminders/{id}")).await?,
        RemindersCmd::Fire { id } => {
            let v = c.post(&format!("/v1/reminders/{id}/fire")).await?;
            if !c.json {
                println!("run {}", s(&v, "run_id"));
                return Ok(());
            }
            v
        }
        RemindersCmd::Forecast { id } => c.post(&format!("/v1/reminders/{id}/forecast")).await?,
        RemindersCmd::Preview { id, samples } => {
            let v = c
                .post(&format!("/v1/reminders/{id}/preview?samples={samples}"))
                .await?;
            if !c.json {
                print_preview(&v);
                return Ok(());
            }
            v
        }
    };
    c.print(&v, key_values);
    Ok(())
}

/// One block per sampled group, then how varied each part is.
fn print_preview(v: &Value) {
    let samples = v
        .get("samples")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for sample in &samples {
        println!("{}", s(sample, "group"));
        for (i, part) in sample
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            println!(
                "  [{}] {}",
                i + 1,
                part.as_str().unwrap_or("(picture, no caption)")
            );
        }
    }
    let targets = s(v, "targets");
    for (i, n) in v
        .get("distinct")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        println!("part {}: {n} different texts over {targets} groups", i + 1);
    }
}

fn runs_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|r| {
            vec![
                s(r, "id"),
                s(r, "reminder_id"),
                s(r, "account_id"),
                s(r, "status"),
                format!("{}/{}", s(r, "/counts/sent"), total(r)),
                s(r, "scheduled_for"),
            ]
        })
        .collect();
    table(
        &[
            "id",
            "reminder",
            "account",
            "status",
            "sent",
            "scheduled for",
        ],
        rows,
    )
}

fn total(run: &Value) -> u64 {
    ["pending", "sending", "sent", "failed", "skipped"]
        .iter()
        .filter_map(|k| run.pointer(&format!("/counts/{k}")).and_then(Value::as_u64))
        .sum()
}

pub async fn runs(c: Client, cmd: RunsCmd) -> anyhow::Result<()> {
    let v = match cmd {
        RunsCmd::List {
            reminder,
            account,
            status,
            limit,
        } => {
            let mut q = vec![format!("limit={limit}")];
            if let Some(r) = reminder {
                q.push(format!("reminder_id={r}"));
            }
            if let Some(a) = account {
                q.push(format!("account_id={}", url_encode(&a)));
            }
            if let Some(st) = status {
                q.push(format!("status={}", url_encode(&st)));
            }
            let v = c.get(&format!("/v1/runs?{}", q.join("&"))).await?;
            c.print(&v, runs_table);
            return Ok(());
        }
        RunsCmd::Show { id } => c.get(&format!("/v1/runs/{id}")).await?,
        RunsCmd::Targets { id, status, limit } => {
            let mut path = format!("/v1/runs/{id}/targets?limit={limit}");
            if let Some(st) = status {
                path.push_str(&format!("&status={}", url_encode(&st)));
            }
            let v = c.get(&path).await?;
            c.print(&v, |v| {
                let rows = items(v)
                    .iter()
                    .map(|t| {
                        vec![
                            s(t, "position"),
                            s(t, "group"),
                            s(t, "status"),
                            s(t, "chosen_by"),
                            s(t, "attempts"),
                            s(t, "error"),
                        ]
                    })
                    .collect();
                table(
                    &["#", "group", "status", "chosen by", "attempts", "error"],
                    rows,
                )
            });
            return Ok(());
        }
        RunsCmd::Stop { id } => c.post(&format!("/v1/runs/{id}/stop")).await?,
        RunsCmd::Pause { id } => c.post(&format!("/v1/runs/{id}/pause")).await?,
        RunsCmd::Resume { id } => c.post(&format!("/v1/runs/{id}/resume")).await?,
        RunsCmd::Retry { id } => c.post(&format!("/v1/runs/{id}/retry")).await?,
        RunsCmd::Watch { id } => return watch(c, id).await,
    };
    c.print(&v, key_values);
    Ok(())
}

const FINAL: &[&str] = &["success", "partial", "failed", "cancelled", "missed"];

/// Follows a run on the event stream with a progress bar; the run's own
/// record is read first so a finished run answers at once.
async fn watch(c: Client, id: i64) -> anyhow::Result<()> {
    // Subscribe to live events first, then read the run: a finish that
    // lands between the two is either in the record or on the stream.
    // (Replaying from event 0 would read the daemon's whole history.)
    let resp = c
        .request(awc::http::Method::GET, "/v1/events")
        .timeout(Duration::from_secs(24 * 3600))
        .send()
        .await
        .map_err(|e| c.unreachable(e))?;
    if !resp.status().is_success() {
        c.finish(resp).await?;
        anyhow::bail!("the event stream refused the request");
    }
    let run = c.get(&format!("/v1/runs/{id}")).await?;
    let bar = indicatif::ProgressBar::new(total(&run).max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} run {prefix} [{bar:40}] {pos}/{len} sent · {msg} · {elapsed}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(id.to_string());
    // Without a terminal (a script, a log file) the bar is hidden: print a
    // line per update instead.
    let plain = !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let show = |v: &Value| {
        let sent = v
            .pointer("/counts/sent")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        bar.set_length(total(v).max(1));
        bar.set_position(sent);
        bar.set_message(s(v, "status"));
        if plain {
            eprintln!("run {id}: {sent}/{} sent ({})", total(v), s(v, "status"));
        }
    };
    show(&run);
    let mut status = s(&run, "status");
    if !FINAL.contains(&status.as_str()) {
        let mut stream = resp;
        let mut buf = String::new();
        'outer: while let Some(chunk) = stream.next().await {
            buf.push_str(&String::from_utf8_lossy(
                &chunk.context("event stream broke")?,
            ));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data:")) else {
                    continue;
                };
                let Ok(ev) = serde_json::from_str::<Value>(data.trim()) else {
                    continue;
                };
                if ev.get("run_id").and_then(Value::as_i64) != Some(id) {
                    continue;
                }
                // Counts in events are authoritative enough for the bar; the
                // final record is fetched once at the end.
                if let Some(counts) = ev.pointer("/data/counts") {
                    show(&json!({"counts": counts, "status": s(&ev, "kind")}));
                }
                if matches!(
                    ev.get("kind").and_then(Value::as_str),
                    Some("run_finished" | "run_missed")
                ) {
                    break 'outer;
                }
            }
        }
        let run = c.get(&format!("/v1/runs/{id}")).await?;
        show(&run);
        status = s(&run, "status");
        bar.finish();
        if let Some(summary) = run.get("error_summary").and_then(Value::as_str) {
            println!("{summary}");
        }
        println!("run {id}: {status} — {}", s(&run, "delivered"));
    } else {
        bar.finish();
        println!("run {id}: {status} — {}", s(&run, "delivered"));
    }
    if status == "success" {
        Ok(())
    } else {
        Err(ClientError {
            exit: Exit::RunNotSuccessful,
            message: format!("run {id} ended {status}"),
        }
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["id", "state"],
            vec![
                vec!["a1".into(), "connected".into()],
                vec!["long-id".into(), "x".into()],
            ],
        );
        assert_eq!(t, "ID       STATE\na1       connected\nlong-id  x\n");
    }

    #[test]
    fn a_targets_csv_gives_its_first_column() {
        let csv = "name,notes\nSales KL,weekly\n\n\"Team, East\",x\n120363000000000001@g.us\n\"Say \"\"hi\"\"\"\n";
        assert_eq!(
            csv_entries(csv),
            vec![
                "Sales KL",
                "Team, East",
                "120363000000000001@g.us",
                "Say \"hi\""
            ]
        );
        assert_eq!(csv_entries("Group 0001\n"), vec!["Group 0001"]);
    }

    #[test]
    fn toml_reminder_file_becomes_the_api_body() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.toml");
        std::fs::write(
            &path,
            "account_id = \"sales-1\"\ntitle = \"Standup\"\ntimezone = \"Asia/Kuala_Lumpur\"\ntargets = [\"120363000000000001@g.us\"]\n[schedule]\ncron = \"0 9 * * 1\"\n[[parts]]\nkind = \"text\"\ntext = \"hi\"\n",
        )
        .unwrap();
        let v = read_body_file(&path).unwrap();
        assert_eq!(v["schedule"]["cron"], "0 9 * * 1");
        assert_eq!(v["parts"][0]["kind"], "text");
        let parsed: herald_actors::domain::ReminderRequest = serde_json::from_value(v).unwrap();
        assert!(parsed.parse().is_ok());
    }

    #[test]
    fn csv_fields_are_quoted_only_when_they_must_be() {
        assert_eq!(csv_field("Team KL"), "Team KL");
        assert_eq!(csv_field("KL, east"), "\"KL, east\"");
        assert_eq!(csv_field("the \"A\" team"), "\"the \"\"A\"\" team\"");
        let row = group_row(&json!({"jid": "1@g.us", "subject": "A", "participants": 3,
                                    "can_post": true, "labels": ["x", "y"]}));
        assert_eq!(row, vec!["1@g.us", "A", "3", "true", "x y"]);
    }

    #[test]
    fn url_encoding() {
        assert_eq!(url_encode("a b/é.png"), "a%20b%2F%C3%A9.png");
    }
}
