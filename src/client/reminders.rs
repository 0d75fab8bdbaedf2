//! `herald reminders …`: create from a JSON file (with targets from a CSV),
//! list, edit, pause, fire now, and preview.

use super::conn::Client;
use super::format::{items, key_values, s, table, url_encode};
use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;
use std::path::PathBuf;

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

/// The first column of each non-blank CSV row (RFC 4180: a quoted field
/// may hold commas, quotes and line breaks); a first row reading `jid`,
/// `name` or `group` is a header. A UTF-8 byte-order mark is dropped: Excel's
/// "CSV UTF-8" writes one, and the csv crate would keep it in the header.
pub(crate) fn csv_entries(text: &str) -> anyhow::Result<Vec<String>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        // Rows may have any number of columns: only the first is read.
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut rows = Vec::new();
    for record in reader.records() {
        let record =
            record.map_err(|e| anyhow::anyhow!("--targets-csv: not a CSV file (RFC 4180): {e}"))?;
        if record.iter().all(|f| f.trim().is_empty()) {
            continue;
        }
        rows.push(record.get(0).unwrap_or_default().trim().to_owned());
    }
    if rows
        .first()
        .is_some_and(|h| ["jid", "name", "group"].contains(&h.to_lowercase().as_str()))
    {
        rows.remove(0);
    }
    Ok(rows)
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
    let entries = csv_entries(&text)?;
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

pub(crate) fn read_body_file(file: &std::path::Path) -> anyhow::Result<Value> {
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
