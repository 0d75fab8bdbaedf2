//! Several daemons: an operation that must reach an account's actor or
//! connection (a run's controls, recall and edit, pairing) answers
//! `Done::Elsewhere` when another daemon holds the account's lease
//! (`service::owner` finds it); the request is forwarded there and its
//! answer passed back.
//!
//! Every daemon of a cluster uses the same control token, so a daemon
//! forwards with its own. A forwarded request carries [`HOP`] (the daemon
//! that forwards it) and [`FOR`] (the principal it was asked by); a daemon
//! that receives one for an account it does not hold (the lease moved on
//! the way) answers 503 instead of forwarding again.
//!
//! The trail: the daemon that performs a forwarded write audits it, under
//! the principal it was forwarded for and naming the daemon that forwarded
//! it; the forwarding daemon, given the owner's answer, writes none
//! ([`AnsweredElsewhere`]). So a forwarded write is on the trail once, and
//! the daemon token with a forwarding header writes nothing unaudited: the
//! header is honoured only on an operation that forwards, from a live
//! daemon of the cluster, and the write is audited where it runs.

use super::console::session::Session;
use super::errors::{ApiError, Kind};
use super::principal::Principal;
use crate::service::Service;
use actix_web::http::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use actix_web::http::{Method, StatusCode};
use actix_web::web::Bytes;
use actix_web::{HttpMessage, HttpRequest, HttpResponse};
use std::time::Duration;

/// Names the daemon a request was forwarded by.
pub const HOP: &str = "x-herald-forwarded-by";
/// Names the daemon whose actor answered a forwarded request.
pub const ANSWERED_BY: &str = "x-herald-answered-by";
/// Names whom a forwarded request is performed for: the daemon's own
/// token (`control.token`) or a user by id (`user:17`), whom the owner
/// finds in the shared store itself (so a revoked user is refused there
/// too, and the role checked is the user's own).
pub const FOR: &str = "x-herald-forwarded-for";

/// Left in a request whose answer another daemon gave: that daemon
/// audited the write, so this one's trail writes no second entry.
#[derive(Debug, Clone)]
pub struct AnsweredElsewhere(pub String);

/// How [`FOR`] names `who`.
pub fn for_value(who: &Principal) -> String {
    match who.user_id {
        Some(id) => format!("user:{id}"),
        None => who.name.clone(),
    }
}

/// Whom the request `req` acts for: the `/v1` caller, or the console's
/// signed-in user.
fn caller_of(req: &HttpRequest) -> Option<Principal> {
    let ext = req.extensions();
    ext.get::<Principal>()
        .cloned()
        .or_else(|| ext.get::<Session>().map(|s| s.user.clone()))
}

/// A request another daemon forwarded here (it must not hop again).
pub fn is_hop(req: &actix_web::HttpRequest) -> bool {
    req.headers().contains_key(HOP)
}

use crate::service::Done;

/// An operation's answer: done here, answered with `status`, or asked of
/// the daemon that holds the account and its answer relayed.
pub async fn answer<T: serde::Serialize>(
    req: &HttpRequest,
    service: &Service,
    done: Done<T>,
    status: StatusCode,
) -> Result<HttpResponse, ApiError> {
    answer_with(req, service, done, |v| HttpResponse::build(status).json(v)).await
}

/// An operation's answer, written by `here` when it was done here, else
/// the owner's answer as it came.
pub async fn answer_with<T>(
    req: &HttpRequest,
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
        } => Ok(ask(req, service, (&node, &url), &path, body, read)
            .await?
            .response()),
    }
}

/// An operation's outcome for the console: done here (`Some`), or done by
/// the daemon that holds the account (`None`), its refusal as this one's.
pub async fn settle<T>(
    req: &HttpRequest,
    service: &Service,
    done: Done<T>,
) -> Result<Option<T>, ApiError> {
    match done {
        Done::Here(v) => Ok(Some(v)),
        Done::Elsewhere {
            node,
            url,
            path,
            body,
            read,
        } => ask(req, service, (&node, &url), &path, body, read)
            .await?
            .ok()
            .map(|_| None),
    }
}

/// Asks the owner (`node` at `url`) to perform `path` for the caller of
/// `req`: a read with GET, else a POST with its JSON body. Once the owner
/// answered, `req` is marked [`AnsweredElsewhere`].
async fn ask(
    req: &HttpRequest,
    service: &Service,
    (node, url): (&str, &str),
    path: &str,
    body: Option<serde_json::Value>,
    read: bool,
) -> Result<Relayed, ApiError> {
    let who = caller_of(req).ok_or_else(|| {
        ApiError::new(
            Kind::Internal,
            "a request to forward has no caller to name to the account's owner",
        )
    })?;
    let method = if read { Method::GET } else { Method::POST };
    let body = body.map(|v| Bytes::from(v.to_string()));
    let me = service.node().unwrap_or_default();
    let relayed = relay(
        (me, service.control_token()),
        (node, url),
        &who,
        method,
        path,
        body,
    )
    .await?;
    req.extensions_mut()
        .insert(AnsweredElsewhere(node.to_owned()));
    Ok(relayed)
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

thread_local! {
    /// The client forwarded requests go out on: one per worker thread (an
    /// awc client is not Send), kept, so its pool reuses the connections
    /// to the other daemons instead of opening one per request. No
    /// redirect is followed: a request carries the daemon's token, which
    /// goes to the owner's advertised address and nowhere else.
    static RELAY_CLIENT: awc::Client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .disable_redirects()
        .finish();
}

/// Sends `method path` (with its query, and a JSON body if any) to the
/// owning daemon.
async fn relay(
    (me, token): (&str, Option<&crate::settings::Secret>),
    (node, url): (&str, &str),
    who: &Principal,
    method: Method,
    path: &str,
    json: Option<Bytes>,
) -> Result<Relayed, ApiError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::new(
            Kind::Unavailable,
            format!("daemon {node}, which owns the account, did not answer at {url}: {e}"),
        )
    };
    let client = RELAY_CLIENT.with(awc::Client::clone);
    let mut req = client
        .request(method, format!("{}{path}", url.trim_end_matches('/')))
        .insert_header((HOP, me))
        .insert_header((FOR, for_value(who)));
    if let Some(token) = token {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Secret;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A one-shot HTTP server: answers `reply` to the first request and
    /// hands back what it received.
    fn one_shot(reply: String) -> (u16, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let got = std::thread::spawn(move || {
            listener.set_nonblocking(false).unwrap();
            let Ok((mut s, _)) = listener.accept() else {
                return String::new();
            };
            s.set_read_timeout(Some(std::time::Duration::from_millis(500)))
                .unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let _ = s.write_all(reply.as_bytes());
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (port, got)
    }

    #[actix_web::test]
    async fn forwarding_follows_no_redirect_with_the_token() {
        // Where a redirect would send the daemon token.
        let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
        elsewhere.set_nonblocking(true).unwrap();
        let to = elsewhere.local_addr().unwrap().port();
        let (owner, got) = one_shot(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:{to}/steal\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        let token = Secret::new("forward-test-token-0123456789");
        let who = Principal {
            user_id: Some(7),
            name: "ana".into(),
            role: herald_actors::domain::Role::Operator,
        };
        let relayed = relay(
            ("n1", Some(&token)),
            ("n2", &format!("http://127.0.0.1:{owner}")),
            &who,
            Method::POST,
            "/v1/runs/3/stop",
            None,
        )
        .await
        .unwrap();
        assert_eq!(relayed.status.as_u16(), 307, "the redirect is the answer");
        let asked = got.join().unwrap().to_ascii_lowercase();
        assert!(asked.contains("x-herald-forwarded-by: n1"), "{asked}");
        assert!(asked.contains("x-herald-forwarded-for: user:7"), "{asked}");
        assert!(
            asked.contains("authorization: bearer forward-test-token"),
            "{asked}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            elsewhere.accept().is_err(),
            "nothing reached the redirect's target"
        );
    }

    /// A daemon answering `{}` to every request on keep-alive connections;
    /// counts the connections it accepted.
    fn keep_alive_owner() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut conn = conn;
                    loop {
                        let mut line = String::new();
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line.trim_end().is_empty() {
                                break;
                            }
                        }
                        let reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                                     Content-Length: 2\r\n\r\n{}";
                        if conn.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (port, accepted)
    }

    #[actix_web::test]
    async fn forwarded_requests_reuse_a_connection_to_the_owner() {
        let (owner, accepted) = keep_alive_owner();
        let who = Principal {
            user_id: None,
            name: "daemon".into(),
            role: herald_actors::domain::Role::Admin,
        };
        for _ in 0..3 {
            let relayed = relay(
                ("n1", None),
                ("n2", &format!("http://127.0.0.1:{owner}")),
                &who,
                Method::GET,
                "/v1/runs/3",
                None,
            )
            .await
            .unwrap();
            assert_eq!(relayed.status.as_u16(), 200);
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one pooled connection for three forwarded requests"
        );
    }
}
