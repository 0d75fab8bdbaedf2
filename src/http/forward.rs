//! Several daemons: an operation that must reach an account's actor or
//! connection (a run's controls, recall and edit, pairing) answers
//! `Done::Elsewhere` when another daemon holds the account's lease
//! (`service::owner` finds it); the request is forwarded there and its
//! answer passed back.
//!
//! Every daemon of a cluster uses the same control token, so a daemon
//! forwards with its own. A forwarded request carries [`HOP`]; a daemon
//! that receives one for an account it does not hold (the lease moved on
//! the way) answers 503 instead of forwarding again.

use super::errors::{ApiError, Kind};
use crate::service::Service;
use actix_web::http::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use actix_web::http::{Method, StatusCode};
use actix_web::web::Bytes;
use actix_web::HttpResponse;
use std::time::Duration;

/// Names the daemon a request was forwarded by.
pub const HOP: &str = "x-herald-forwarded-by";
/// Names the daemon whose actor answered a forwarded request.
pub const ANSWERED_BY: &str = "x-herald-answered-by";

/// A request another daemon forwarded here (it must not hop again).
pub fn is_hop(req: &actix_web::HttpRequest) -> bool {
    req.headers().contains_key(HOP)
}

use crate::service::Done;

/// An operation's answer: done here, answered with `status`, or asked of
/// the daemon that holds the account and its answer relayed.
pub async fn answer<T: serde::Serialize>(
    service: &Service,
    done: Done<T>,
    status: StatusCode,
) -> Result<HttpResponse, ApiError> {
    answer_with(service, done, |v| HttpResponse::build(status).json(v)).await
}

/// An operation's answer, written by `here` when it was done here, else
/// the owner's answer as it came.
pub async fn answer_with<T>(
    service: &Service,
    done: Done<T>,
    here: impl FnOnce(T) -> HttpResponse,
) -> Result<HttpResponse, ApiError> {
    match done {
        Done::Here(v) => Ok(here(v)),
        Done::Elsewhere {
            node,
            url,
            path,
            body,
            read,
        } => Ok(ask(service, (&node, &url), &path, body, read)
            .await?
            .response()),
    }
}

/// An operation's outcome for the console: done here (`Some`), or done by
/// the daemon that holds the account (`None`), its refusal as this one's.
pub async fn settle<T>(service: &Service, done: Done<T>) -> Result<Option<T>, ApiError> {
    match done {
        Done::Here(v) => Ok(Some(v)),
        Done::Elsewhere {
            node,
            url,
            path,
            body,
            read,
        } => ask(service, (&node, &url), &path, body, read)
            .await?
            .ok()
            .map(|_| None),
    }
}

/// Asks the owner (`node` at `url`) to perform `path`: a read with GET,
/// else a POST with its JSON body.
async fn ask(
    service: &Service,
    (node, url): (&str, &str),
    path: &str,
    body: Option<serde_json::Value>,
    read: bool,
) -> Result<Relayed, ApiError> {
    let method = if read { Method::GET } else { Method::POST };
    let body = body.map(|v| Bytes::from(v.to_string()));
    relay(service, node, url, method, path, body).await
}

/// What the owning daemon answered.
pub struct Relayed {
    node: String,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

impl Relayed {
    /// The answer as it came: status, body, content type and caching.
    pub fn response(self) -> HttpResponse {
        let mut out = HttpResponse::build(self.status);
        for h in self.headers {
            out.insert_header(h);
        }
        out.insert_header((ANSWERED_BY, self.node));
        out.body(self.body)
    }

    /// The owner's refusal as this daemon's own problem, or `Ok` for a
    /// success (the console renders the one and redirects on the other).
    pub fn ok(self) -> Result<Self, ApiError> {
        if self.status.is_success() {
            return Ok(self);
        }
        let problem: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        let kind = Kind::ALL
            .iter()
            .copied()
            .find(|k| problem["type"] == k.type_uri())
            .or_else(|| {
                Kind::ALL
                    .iter()
                    .copied()
                    .find(|k| k.status() == self.status)
            })
            .unwrap_or(Kind::Unavailable);
        let detail = problem["detail"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("daemon {} answered {}", self.node, self.status));
        let mut e = ApiError::new(kind, detail);
        e.field = problem["field"].as_str().map(str::to_owned);
        e.rule = problem["rule"].as_str().map(str::to_owned);
        Err(e)
    }
}

/// Sends `method path` (with its query, and a JSON body if any) to the
/// owning daemon.
async fn relay(
    service: &Service,
    node: &str,
    url: &str,
    method: Method,
    path: &str,
    json: Option<Bytes>,
) -> Result<Relayed, ApiError> {
    let me = service.node().unwrap_or_default().to_owned();
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
        .request(method, format!("{}{path}", url.trim_end_matches('/')))
        .insert_header((HOP, me));
    if let Some(token) = service.control_token() {
        req = req.bearer_auth(token.expose());
    }
    let sent = match json {
        Some(body) => {
            req.insert_header((CONTENT_TYPE, "application/json"))
                .send_body(body)
                .await
        }
        None => req.send().await,
    };
    let mut resp = sent.map_err(|e| unreachable(&e))?;
    let body = resp
        .body()
        .limit(1 << 20)
        .await
        .map_err(|e| unreachable(&e))?;
    let headers = [CONTENT_TYPE, CACHE_CONTROL, RETRY_AFTER]
        .into_iter()
        .filter_map(|name| {
            let v = resp.headers().get(&name)?.clone();
            Some((name, v))
        })
        .collect();
    Ok(Relayed {
        node: node.to_owned(),
        status: resp.status(),
        headers,
        body,
    })
}
