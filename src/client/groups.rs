//! `herald groups …`: list, search, label and export an account's groups.

use super::conn::Client;
use super::format::{csv_row, items, key_values, s, table, url_encode};
use clap::Subcommand;
use serde_json::{json, Value};

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

pub(crate) fn group_row(g: &Value) -> Vec<String> {
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
                println!("{}", csv_row(&GROUP_COLUMNS));
                for g in items(&v) {
                    println!("{}", csv_row(&group_row(&g)));
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
