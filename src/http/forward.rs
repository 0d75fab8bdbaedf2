//! Several daemons: a control request that must reach an account's actor
//! (stop, pause, resume, retry a run) is forwarded to the daemon that holds
//! the account's lease, found in the store, and its answer passed back.
//! Reads need no forwarding: every daemon answers them from the store.
//!
//! Every daemon of a cluster uses the same control token, so a daemon
//! forwards with its own. A forwarded request carries [`HOP`]; a daemon
//! that receives one for an account it does not hold (the lease moved on
//! the way) answers 503 instead of forwarding again.

use super::errors::{ApiError, Kind};
use crate::state::AppState;
use actix_web::http::header::CONTENT_TYPE;
use actix_web::HttpResponse;
use herald_actors::domain::AccountId;
use std::time::Duration;

/// Names the daemon a request was forwarded by.
pub const HOP: &str = "x-herald-forwarded-by";
/// Names the daemon whose actor answered a forwarded request.
pub const ANSWERED_BY: &str = "x-herald-answered-by";

/// Where an account's actor runs.
pub enum Owner {
    /// Here (or there is only one daemon).
    Here,
    /// Another live daemon, reachable at `url`.
    Elsewhere { node: String, url: String },
}

fn moving(account: &AccountId) -> ApiError {
    ApiError::new(
        Kind::Unavailable,
        format!(
            "account {account} has no live owner right now (its lease is moving between \
             daemons); try again in a few seconds"
        ),
    )
}

/// Which daemon carries `account` now. `hop`: the request was already
/// forwarded once, so an account not held here is an error, not a hop.
pub async fn owner(state: &AppState, account: &AccountId, hop: bool) -> Result<Owner, ApiError> {
    let Some(table) = state.engine.leases.get() else {
        return Ok(Owner::Here);
    };
    if table.holds(account) {
        return Ok(Owner::Here);
    }
    if hop {
        return Err(moving(account));
    }
    let Some(lease) = state
        .store
        .list_leases()
        .await?
        .into_iter()
        .find(|l| &l.account == account && !l.expired && l.node != table.node())
    else {
        return Err(moving(account));
    };
    let url = state
        .store
        .live_nodes()
        .await?
        .into_iter()
        .find(|n| n.node == lease.node)
        .and_then(|n| n.control_url)
        .ok_or_else(|| moving(account))?;
    Ok(Owner::Elsewhere {
        node: lease.node,
        url,
    })
}

/// POSTs `path` (with its query) to the owning daemon and answers what it answered.
pub async fn post(
    state: &AppState,
    node: &str,
    url: &str,
    path: &str,
) -> Result<HttpResponse, ApiError> {
    let me = state
        .engine
        .leases
        .get()
        .map(|t| t.node().to_owned())
        .unwrap_or_default();
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::new(
            Kind::Unavailable,
            format!("daemon {node}, which owns the account, did not answer at {url}: {e}"),
        )
    };
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let mut req = client
        .post(format!("{}{path}", url.trim_end_matches('/')))
        .insert_header((HOP, me));
    if let Some(token) = &state.control_token {
        req = req.bearer_auth(token.expose());
    }
    let mut resp = req.send().await.map_err(|e| unreachable(&e))?;
    let body = resp
        .body()
        .limit(1 << 20)
        .await
        .map_err(|e| unreachable(&e))?;
    let mut out = HttpResponse::build(resp.status());
    if let Some(ct) = resp.headers().get(CONTENT_TYPE) {
        out.insert_header((CONTENT_TYPE, ct.clone()));
    }
    out.insert_header((ANSWERED_BY, node.to_owned()));
    Ok(out.body(body))
}
