//! `herald users …` and `herald audit`: API users and the audit log
//! (both need an admin token).

use super::conn::Client;
use super::format::{items, key_values, s, table, url_encode};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Debug, Subcommand)]
pub enum UsersCmd {
    List,
    /// Add a user; prints its token once (store it now).
    Add {
        name: String,
        /// viewer, operator or admin.
        #[arg(long)]
        role: String,
        /// When the token stops working (RFC 3339); default: until revoked.
        #[arg(long)]
        expires_at: Option<String>,
    },
    Show {
        id: i64,
    },
    /// Revoke a user: its token and console sign-ins stop at once.
    Revoke {
        id: i64,
    },
}

fn users_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|u| {
            vec![
                s(u, "id"),
                s(u, "name"),
                s(u, "role"),
                s(u, "expires_at"),
                s(u, "created_by"),
                s(u, "created_at"),
            ]
        })
        .collect();
    table(
        &["id", "name", "role", "expires", "created by", "created"],
        rows,
    )
}

pub async fn users(c: Client, cmd: UsersCmd) -> anyhow::Result<()> {
    let v = match cmd {
        UsersCmd::List => {
            let v = c.get("/v1/users").await?;
            c.print(&v, users_table);
            return Ok(());
        }
        UsersCmd::Add {
            name,
            role,
            expires_at,
        } => {
            let body = json!({"name": name, "role": role, "expires_at": expires_at});
            let v = c
                .send_json(awc::http::Method::POST, "/v1/users", &body)
                .await?;
            if !c.json {
                // The token alone on stdout, for `TOKEN=$(herald users add …)`.
                println!("{}", s(&v, "token"));
                eprintln!(
                    "user {} ({}) added as id {}; the token is shown only this once",
                    s(&v, "name"),
                    s(&v, "role"),
                    s(&v, "id")
                );
                return Ok(());
            }
            v
        }
        UsersCmd::Show { id } => c.get(&format!("/v1/users/{id}")).await?,
        UsersCmd::Revoke { id } => {
            c.delete(&format!("/v1/users/{id}")).await?;
            if !c.json {
                eprintln!("user {id} revoked");
            }
            return Ok(());
        }
    };
    c.print(&v, key_values);
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Only this user's writes (`control.token` for the daemon's token).
    #[arg(long)]
    actor: Option<String>,
    /// Only this operation (`createReminder`, `stopRun`, …).
    #[arg(long)]
    operation: Option<String>,
    /// Only writes to this id.
    #[arg(long)]
    resource: Option<String>,
    /// At or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// Entries older than this id (the previous page's last).
    #[arg(long)]
    before_id: Option<i64>,
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

pub async fn audit(c: Client, a: AuditArgs) -> anyhow::Result<()> {
    let mut q = vec![format!("limit={}", a.limit)];
    for (name, value) in [
        ("actor", a.actor),
        ("operation", a.operation),
        ("resource", a.resource),
        ("since", a.since),
        ("until", a.until),
    ] {
        if let Some(v) = value {
            q.push(format!("{name}={}", url_encode(&v)));
        }
    }
    if let Some(b) = a.before_id {
        q.push(format!("before_id={b}"));
    }
    let v = c.get(&format!("/v1/audit?{}", q.join("&"))).await?;
    c.print(&v, |v| {
        let rows = items(v)
            .iter()
            .map(|e| {
                vec![
                    s(e, "id"),
                    s(e, "at"),
                    s(e, "actor"),
                    s(e, "operation"),
                    s(e, "resource"),
                    s(e, "status"),
                    s(e, "via"),
                    s(e, "remote"),
                ]
            })
            .collect();
        let mut out = table(
            &[
                "id",
                "at",
                "who",
                "operation",
                "id",
                "status",
                "via",
                "from",
            ],
            rows,
        );
        if let Some(n) = v["next_before_id"].as_i64() {
            out.push_str(&format!("(older: --before-id {n})\n"));
        }
        out
    });
    Ok(())
}
