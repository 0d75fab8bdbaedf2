//! `herald accounts …`: add, list, change, pair and remove accounts.

use super::conn::{Client, ClientError, Exit};
use super::format::{items, key_values, s, table};
use clap::Subcommand;
use serde_json::{json, Value};
use std::time::Duration;

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
        AccountsCmd::Show { id } => {
            let v = c.get(&format!("/v1/accounts/{id}")).await?;
            c.print(&v, |v| {
                let mut rest = v.clone();
                let standing = rest
                    .as_object_mut()
                    .and_then(|m| m.remove("standing"))
                    .unwrap_or_default();
                key_values(&rest) + &standing_lines(&standing)
            });
            return Ok(());
        }
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

/// What WhatsApp last said of the account, two lines: its reach-out
/// time-lock and its new-chat quota, each with when it was read.
fn standing_lines(standing: &Value) -> String {
    let read = |r: &Value| match r["reading"].as_str() {
        Some("known") => format!(" · read {}", s(r, "read_at")),
        Some("unknown") => format!("unknown ({}) · read {}", s(r, "why"), s(r, "read_at")),
        _ => "not read yet".into(),
    };
    let lock = &standing["timelock"];
    let lock_text = match (lock["reading"].as_str(), lock["active"].as_bool()) {
        (Some("known"), Some(true)) => format!(
            "active until {} ({}){}",
            lock["until"].as_str().unwrap_or("no end given"),
            lock["kind"].as_str().unwrap_or("no kind given"),
            read(lock)
        ),
        (Some("known"), _) => format!("none{}", read(lock)),
        _ => read(lock),
    };
    let quota = &standing["quota"];
    let quota_text = match quota["reading"].as_str() {
        Some("known") => format!(
            "{}: {} of {} used, cycle ends {}{}",
            s(quota, "status"),
            s(quota, "used"),
            s(quota, "total"),
            s(quota, "cycle_end"),
            read(quota)
        ),
        _ => read(quota),
    };
    format!(
        "{:<22} {lock_text}\n{:<22} {quota_text}\n",
        "time-lock", "new-chat quota"
    )
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
