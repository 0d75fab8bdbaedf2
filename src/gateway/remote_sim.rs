//! [`RemoteSimulator`]: the [`Gateway`] of `simulator` accounts when
//! `simulator.url` names a shared `herald simulator serve` process (see
//! [`super::sim_server`] for the API). Several daemons pointed at one
//! simulator write one journal, which shows whether each group got each
//! message exactly once across all of them.
//!
//! The client is hyper-util's pooled HTTP/1.1 client, not awc: the engine
//! holds a `Gateway`'s futures across threads, so they must be `Send`, and
//! awc's client is not. One client, one pool of keep-alive connections, for
//! every account. A connection that cannot be made, an answer that does not
//! come within the timeout, and any 5xx are [`GatewayError::Unreachable`]
//! (retried like a dropped WhatsApp socket; a resent message id is
//! deduplicated by the simulator); refusals come back as the very
//! `GatewayError` the simulator answered.

use super::sim_wire::*;
pub use crate::settings::parse_simulator_url as parse_url;
use async_trait::async_trait;
use herald_actors::domain::Fence;
use herald_actors::domain::{AccountId, GroupInfo, GroupJid, MediaId, UploadHandle};
use herald_actors::ports::{Gateway, GatewayError, OutgoingMessage, SendReceipt};
use herald_actors::simulator::Delivery;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{header, Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;

/// How long one request may take before it is `Unreachable`: above any
/// latency, upload time or reconnect wait the simulator models.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// A shared simulator over HTTP. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct RemoteSimulator {
    base: Arc<str>,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl std::fmt::Debug for RemoteSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSimulator")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// An error with its causes, as one line ("client error (Connect): tcp
/// connect error: Connection refused (os error 111)").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = c.source();
    }
    text
}

impl RemoteSimulator {
    /// A client of the simulator at `url` (see [`parse_url`]). Needs a
    /// tokio runtime only when it makes requests.
    pub fn new(url: &str) -> Result<Self, String> {
        Self::with_timeout(url, DEFAULT_TIMEOUT)
    }

    pub fn with_timeout(url: &str, timeout: Duration) -> Result<Self, String> {
        let base = parse_url(url)?;
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        Ok(Self {
            base: base.into(),
            client,
            timeout,
        })
    }

    /// The base URL requests go to.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// One request; the status and the whole body. A connection failure,
    /// a timeout or a 5xx is `Unreachable`.
    async fn call(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), GatewayError> {
        let uri = format!("{}{path}", self.base);
        let unreachable =
            |why: String| GatewayError::Unreachable(format!("simulator {uri}: {why}"));
        let req = Request::builder()
            .method(method)
            .uri(&uri)
            .header(header::CONTENT_TYPE, content_type)
            .body(Full::new(body))
            .map_err(|e| unreachable(e.to_string()))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| unreachable(chain(&e)))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(chain(&e)))?
                .to_bytes();
            Ok::<_, GatewayError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| unreachable(format!("no answer within {:?}", self.timeout)))??;
        if status.is_server_error() {
            return Err(unreachable(format!(
                "answered {status}: {}",
                excerpt(&body)
            )));
        }
        Ok((status, body))
    }

    /// A call whose success is JSON `T`; a refusal is the `GatewayError`
    /// it carries.
    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, GatewayError> {
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let (status, bytes) = self.call(method, path, "application/json", body).await?;
        decode(status, &bytes, path)
    }

    /// Pairs `account` with `groups` numbered groups on the simulator, or
    /// leaves it as it is if the simulator already knows it.
    pub async fn register(
        &self,
        account: &AccountId,
        groups: usize,
    ) -> Result<Registered, GatewayError> {
        let body = serde_json::json!({ "groups": groups });
        self.json(Method::PUT, &format!("/accounts/{account}"), Some(body))
            .await
    }

    /// What the simulator knows of `account`.
    pub async fn account(&self, account: &AccountId) -> Result<AccountReport, GatewayError> {
        self.json(Method::GET, &format!("/accounts/{account}"), None)
            .await
    }

    /// Every delivery (of `account`, or of all), in acceptance order.
    pub async fn deliveries(
        &self,
        account: Option<&AccountId>,
    ) -> Result<Vec<Delivery>, GatewayError> {
        let mut out = Vec::new();
        let mut after: Option<u64> = None;
        loop {
            let mut path = String::from("/deliveries?limit=10000");
            if let Some(a) = account {
                path.push_str(&format!("&account={a}"));
            }
            if let Some(seq) = after {
                path.push_str(&format!("&after={seq}"));
            }
            let page: DeliveryPage = self.json(Method::GET, &path, None).await?;
            out.extend(page.items);
            match page.next_after {
                Some(seq) => after = Some(seq),
                None => return Ok(out),
            }
        }
    }

    /// Makes `account`'s upload handles expire now (a test control).
    pub async fn expire_uploads(&self, account: &AccountId) -> Result<(), GatewayError> {
        let path = format!("/accounts/{account}/expire-uploads");
        self.no_content(Method::POST, &path, None).await
    }

    pub async fn health(&self) -> Result<Health, GatewayError> {
        self.json(Method::GET, "/health", None).await
    }

    async fn no_content(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(), GatewayError> {
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let (status, bytes) = self.call(method, path, "application/json", body).await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(refusal(status, &bytes, path))
        }
    }
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn decode<T: DeserializeOwned>(
    status: StatusCode,
    body: &[u8],
    path: &str,
) -> Result<T, GatewayError> {
    if status.is_success() {
        serde_json::from_slice(body).map_err(|e| {
            GatewayError::Unreachable(format!(
                "simulator {path}: unreadable answer ({e}): {}",
                excerpt(body)
            ))
        })
    } else {
        Err(refusal(status, body, path))
    }
}

/// A non-2xx answer: the refusal it carries, or (not the simulator's API:
/// a wrong URL, a proxy) `Unreachable` naming the status.
fn refusal(status: StatusCode, body: &[u8], path: &str) -> GatewayError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(refused) => refused.error.into(),
        Err(_) => GatewayError::Unreachable(format!(
            "simulator {path}: answered {status}: {}",
            excerpt(body)
        )),
    }
}

#[async_trait]
impl Gateway for RemoteSimulator {
    async fn upload(
        &self,
        account: &AccountId,
        media: &MediaId,
        mime: &str,
        bytes: Arc<[u8]>,
    ) -> Result<UploadHandle, GatewayError> {
        let path = format!("/accounts/{account}/uploads/{media}");
        let (status, body) = self
            .call(Method::POST, &path, mime, Bytes::copy_from_slice(&bytes))
            .await?;
        decode(status, &body, &path)
    }

    async fn ready(&self, account: &AccountId) -> Result<(), GatewayError> {
        self.no_content(Method::POST, &format!("/accounts/{account}/ready"), None)
            .await
    }

    async fn list_groups(&self, account: &AccountId) -> Result<Vec<GroupInfo>, GatewayError> {
        let groups: Vec<WireGroup> = self
            .json(Method::GET, &format!("/accounts/{account}/groups"), None)
            .await?;
        Ok(groups.into_iter().map(GroupInfo::from).collect())
    }

    async fn typing(
        &self,
        account: &AccountId,
        group: &GroupJid,
        shown: Duration,
    ) -> Result<(), GatewayError> {
        let body = serde_json::to_value(TypingRequest {
            group: group.clone(),
            for_ms: u64::try_from(shown.as_millis()).unwrap_or(u64::MAX),
        })
        .expect("typing request serialises");
        let path = format!("/accounts/{account}/typing");
        self.no_content(Method::POST, &path, Some(body)).await
    }

    async fn send(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
    ) -> Result<SendReceipt, GatewayError> {
        self.send_fenced(account, group, message, message_id, None)
            .await
    }

    async fn claim_fence(&self, fence: &Fence) -> Result<(), GatewayError> {
        let body = serde_json::to_value(fence).expect("a fence serialises");
        let path = format!("/accounts/{}/fence", fence.account);
        self.no_content(Method::POST, &path, Some(body)).await
    }

    /// The fence goes to the simulator, which refuses an epoch older than
    /// the newest it has seen for the account (across every daemon).
    async fn send_fenced(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        fence: Option<&Fence>,
    ) -> Result<SendReceipt, GatewayError> {
        let body = serde_json::to_value(SendRequest {
            group: group.clone(),
            message_id: message_id.to_owned(),
            message: message.into(),
            fence: fence.cloned(),
        })
        .expect("send request serialises");
        let path = format!("/accounts/{account}/send");
        let answer: SendAnswer = self.json(Method::POST, &path, Some(body)).await?;
        Ok(SendReceipt {
            duplicate: answer.duplicate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulator_url_is_plain_http_with_a_host_and_no_path() {
        assert_eq!(
            parse_url("http://127.0.0.1:7790").unwrap(),
            "http://127.0.0.1:7790"
        );
        assert_eq!(
            parse_url("http://sim.internal:80/").unwrap(),
            "http://sim.internal:80"
        );
        for bad in [
            "127.0.0.1:7790",
            "https://127.0.0.1:7790",
            "ws://127.0.0.1:7790",
            "http://127.0.0.1:7790/v1",
            "http://127.0.0.1:7790/?x=1",
            "http://user@127.0.0.1:7790",
            "http://",
            "not a url",
        ] {
            assert!(parse_url(bad).is_err(), "{bad} accepted");
        }
    }

    #[tokio::test]
    async fn nobody_listening_is_unreachable_naming_the_cause() {
        // A port that was free a moment ago.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let sim = RemoteSimulator::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let a = AccountId::parse("a1").unwrap();
        let got = sim.ready(&a).await;
        let Err(GatewayError::Unreachable(why)) = got else {
            panic!("{got:?}");
        };
        assert!(why.contains("refused"), "{why}");
    }
}
