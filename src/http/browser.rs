//! What keeps a web browser from driving the control port for a page the
//! operator happens to open (the token alone does not, once `control.token
//! = "none"`, and DNS rebinding gets round the same-origin policy):
//!
//! - `Host` must name this port: `localhost` (and `*.localhost`), a
//!   loopback address, the listen address (any address when listening on
//!   all of them), or a name in `control.allowed_hosts`. A rebinding page
//!   sends its own domain name as `Host`, so it is refused on every route.
//!   The port in `Host` is not compared: behind a reverse proxy it differs,
//!   and it gives a rebinding page nothing.
//! - On `/v1`, an `Origin` other than the port's own, or a `Sec-Fetch-Site`
//!   other than `same-origin` / `none`, is a request some other site's page
//!   made: refused. (`same-site` is refused too: a page on another port of
//!   the same host is "same-site".) Clients that are not browsers send
//!   neither header.
//!
//! Requests over the Unix socket skip the `Host` rule: no browser can
//! reach a socket file.

use super::errors::{ApiError, Kind};
use crate::settings::ControlSettings;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::web;
use std::net::IpAddr;

pub const HOST_RULE: &str = "must name this port: localhost, a loopback or listen address, \
or a name in control.allowed_hosts (DNS rebinding protection)";
pub const ORIGIN_RULE: &str =
    "must be this port's own origin (http://<Host>): cross-site requests are refused";
pub const FETCH_SITE_RULE: &str =
    "must be same-origin or none: requests from other sites' pages are refused";

/// The `Host` values this port answers.
#[derive(Debug, Clone)]
pub struct HostPolicy {
    listen: IpAddr,
    names: Vec<String>,
}

impl HostPolicy {
    pub fn new(listen: IpAddr, names: Vec<String>) -> Self {
        Self { listen, names }
    }

    pub fn from_settings(s: &ControlSettings) -> Self {
        let listen = s
            .listen_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        Self::new(listen, s.allowed_hosts())
    }

    /// `host` as sent, e.g. `localhost:8790`, `[::1]:8790`, `herald.lan`.
    pub fn allows(&self, host: &str) -> bool {
        let name = host_name(host);
        if let Ok(ip) = name.trim_matches(['[', ']']).parse::<IpAddr>() {
            return ip.is_loopback() || ip == self.listen || self.listen.is_unspecified();
        }
        name == "localhost" || name.ends_with(".localhost") || self.names.contains(&name)
    }

    fn check(&self, req: &ServiceRequest) -> Result<(), ApiError> {
        // The Unix socket: no browser reaches it.
        if req.peer_addr().is_none() {
            return Ok(());
        }
        match req.headers().get(header::HOST) {
            // Every browser sends Host; a client that does not is no browser.
            None => Ok(()),
            Some(v) if v.to_str().is_ok_and(|h| self.allows(h)) => Ok(()),
            Some(_) => Err(refusal("Host", HOST_RULE)),
        }
    }
}

/// The host part of a `Host` value, lower-cased, without port or final dot.
fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    let name = if host.starts_with('[') {
        // [v6]:port
        host.split_inclusive(']').next().unwrap_or("").to_owned()
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_owned(),
            _ => host,
        }
    };
    name.trim_end_matches('.').to_owned()
}

fn refusal(header: &str, rule: &str) -> ApiError {
    let mut e = ApiError::field_error(Kind::Forbidden, header, rule);
    e.detail = format!("{header} {rule}");
    e
}

/// The cross-site rules for `/v1`: `Origin` and `Sec-Fetch-Site`.
pub fn check_same_origin(headers: &header::HeaderMap) -> Result<(), ApiError> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("").trim().to_ascii_lowercase();
        if site != "same-origin" && site != "none" {
            return Err(refusal("Sec-Fetch-Site", FETCH_SITE_RULE));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let own = match (origin.to_str(), host) {
            (Ok(o), Some(h)) => {
                let o = o.trim().to_ascii_lowercase();
                let h = h.trim().to_ascii_lowercase();
                o.strip_prefix("http://")
                    .or_else(|| o.strip_prefix("https://"))
                    .is_some_and(|authority| authority == h)
            }
            _ => false,
        };
        if !own {
            return Err(refusal("Origin", ORIGIN_RULE));
        }
    }
    Ok(())
}

/// Every route: the `Host` rule.
pub async fn require_own_host(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if let Some(policy) = req.app_data::<web::Data<HostPolicy>>() {
        policy.check(&req)?;
    }
    next.call(req).await
}

/// `/v1`: the cross-site rules.
pub async fn refuse_cross_site(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    check_same_origin(req.headers())?;
    next.call(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};

    fn policy(listen: &str) -> HostPolicy {
        HostPolicy::new(listen.parse().unwrap(), vec!["herald.lan".into()])
    }

    #[test]
    fn hosts_that_name_the_port_pass_and_others_do_not() {
        let p = policy("127.0.0.1");
        for ok in [
            "localhost:8790",
            "LOCALHOST",
            "127.0.0.1:8790",
            "127.0.0.2",
            "[::1]:8790",
            "app.localhost:1",
            "herald.lan:8790",
            "herald.lan.",
        ] {
            assert!(p.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example:8790",
            "evil.example",
            "localhost.evil.example",
            "192.168.1.5:8790",
            "herald.lan.evil.example",
            "",
        ] {
            assert!(!p.allows(bad), "{bad}");
        }
        // Listening on every address: any IP literal names the port, names
        // still need the list.
        let p = policy("0.0.0.0");
        assert!(p.allows("192.168.1.5:8790"));
        assert!(!p.allows("evil.example"));
        assert!(policy("10.0.0.7").allows("10.0.0.7:8790"));
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_the_ports_own_origin_passes() {
        let host = ("host", "127.0.0.1:8790");
        for ok in [
            vec![host],
            vec![host, ("origin", "http://127.0.0.1:8790")],
            vec![host, ("sec-fetch-site", "same-origin")],
            vec![host, ("sec-fetch-site", "none")],
        ] {
            assert!(check_same_origin(&headers(&ok)).is_ok(), "{ok:?}");
        }
        for (bad, field) in [
            (vec![host, ("origin", "http://evil.example")], "Origin"),
            (vec![host, ("origin", "null")], "Origin"),
            (vec![host, ("origin", "http://127.0.0.1:3000")], "Origin"),
            (vec![("origin", "http://127.0.0.1:8790")], "Origin"),
            (
                vec![host, ("sec-fetch-site", "cross-site")],
                "Sec-Fetch-Site",
            ),
            (
                vec![host, ("sec-fetch-site", "same-site")],
                "Sec-Fetch-Site",
            ),
        ] {
            let e = check_same_origin(&headers(&bad)).unwrap_err();
            assert_eq!(e.kind, Kind::Forbidden, "{bad:?}");
            assert_eq!(e.field.as_deref(), Some(field), "{bad:?}");
        }
    }
}
