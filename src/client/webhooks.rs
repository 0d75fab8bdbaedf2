//! `herald webhooks …`: subscriptions that push events to your systems,
//! their deliveries, pings and secret rotation (admin).

use super::conn::Client;
use super::format::{items, key_values, s, table};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Debug, Subcommand)]
pub enum WebhooksCmd {
    List,
    /// Add a subscription; prints its signing secret once (store it now).
    Add {
        url: String,
        /// Event types, comma-separated: run.started, run.progress,
        /// run.finished, run.missed, run.receipts, account.state_changed,
        /// reminder.failed_to_fire.
        #[arg(long, value_delimiter = ',', required = true)]
        types: Vec<String>,
        #[arg(long)]
        description: Option<String>,
    },
    Show {
        id: i64,
    },
    Enable {
        id: i64,
    },
    Disable {
        id: i64,
    },
    Delete {
        id: i64,
    },
    /// A new secret; the old one goes on signing for --overlap-hours.
    Rotate {
        id: i64,
        #[arg(long, default_value_t = 24)]
        overlap_hours: u32,
    },
    /// Send a `webhook.ping` test event.
    Ping {
        id: i64,
    },
    /// The subscription's deliveries, newest first.
    Deliveries {
        id: i64,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Send a delivery again, with the same webhook-id.
    Retry {
        id: i64,
        delivery: i64,
    },
}

fn hooks_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|w| {
            let types = w["types"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            vec![
                s(w, "id"),
                s(w, "url"),
                types,
                s(w, "enabled"),
                s(w, "disabled_reason"),
            ]
        })
        .collect();
    table(&["id", "url", "types", "enabled", "disabled because"], rows)
}

fn deliveries_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|d| {
            vec![
                s(d, "id"),
                s(d, "type"),
                s(d, "status"),
                s(d, "attempts"),
                s(d, "last_status"),
                s(d, "next_attempt_at"),
                s(d, "last_error"),
            ]
        })
        .collect();
    table(
        &[
            "id",
            "type",
            "status",
            "attempts",
            "answer",
            "next attempt",
            "error",
        ],
        rows,
    )
}

pub async fn webhooks(c: Client, cmd: WebhooksCmd) -> anyhow::Result<()> {
    use awc::http::Method;
    let enable = |id: i64, on: bool| (format!("/v1/webhooks/{id}"), json!({ "enabled": on }));
    let v = match cmd {
        WebhooksCmd::List => {
            let v = c.get("/v1/webhooks").await?;
            c.print(&v, hooks_table);
            return Ok(());
        }
        WebhooksCmd::Add {
            url,
            types,
            description,
        } => {
            let body =
                json!({"url": url, "types": types, "description": description.unwrap_or_default()});
            let v = c.send_json(Method::POST, "/v1/webhooks", &body).await?;
            if !c.json {
                // The secret alone on stdout, for `SECRET=$(herald webhooks add …)`.
                println!("{}", s(&v, "secret"));
                eprintln!(
                    "webhook {} added; its signing secret is shown only this once",
                    s(&v, "id")
                );
                return Ok(());
            }
            v
        }
        WebhooksCmd::Show { id } => c.get(&format!("/v1/webhooks/{id}")).await?,
        WebhooksCmd::Enable { id } | WebhooksCmd::Disable { id } => {
            let on = matches!(cmd, WebhooksCmd::Enable { .. });
            let (path, body) = enable(id, on);
            c.send_json(Method::PATCH, &path, &body).await?
        }
        WebhooksCmd::Delete { id } => {
            c.delete(&format!("/v1/webhooks/{id}")).await?;
            if !c.json {
                eprintln!("webhook {id} deleted");
            }
            return Ok(());
        }
        WebhooksCmd::Rotate { id, overlap_hours } => {
            let v = c
                .post(&format!(
                    "/v1/webhooks/{id}/rotate?overlap_hours={overlap_hours}"
                ))
                .await?;
            if !c.json {
                println!("{}", s(&v, "secret"));
                eprintln!(
                    "the old secret goes on signing until {}",
                    s(&v, "old_secret_until")
                );
                return Ok(());
            }
            v
        }
        WebhooksCmd::Ping { id } => c.post(&format!("/v1/webhooks/{id}/ping")).await?,
        WebhooksCmd::Deliveries { id, limit } => {
            let v = c
                .get(&format!("/v1/webhooks/{id}/deliveries?limit={limit}"))
                .await?;
            c.print(&v, deliveries_table);
            return Ok(());
        }
        WebhooksCmd::Retry { id, delivery } => {
            c.post(&format!("/v1/webhooks/{id}/deliveries/{delivery}/retry"))
                .await?
        }
    };
    c.print(&v, key_values);
    Ok(())
}
