//! Where a webhook may point: `http` or `https` only, and not at a
//! loopback, private or link-local address unless `webhooks.allow_private`
//! says so, so the control port cannot be used to probe the operator's
//! own network. The URL is checked when a webhook is added, and every
//! attempt's connection is checked on the very addresses it connects to
//! ([`PublicOnly`]).

use std::net::{IpAddr, ToSocketAddrs};
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// The URL's shape: an absolute `http`/`https` URL with a host.
pub fn check_url(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("must be an absolute URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("must be http or https, not {}", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("must name a host".into());
    }
    Ok(url)
}

/// Not an address the operator's network keeps to itself.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || a == 0
                // Carrier-grade NAT, 100.64.0.0/10.
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                // Unique local fc00::/7 and link-local fe80::/10.
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

/// Resolves the URL's host (this blocks: run it off the runtime) and
/// refuses it if any address it names is not public, unless
/// `allow_private`.
pub fn resolve_allowed(raw: &str, allow_private: bool) -> Result<(), String> {
    let url = check_url(raw)?;
    if allow_private {
        return Ok(());
    }
    let host = url
        .host_str()
        .unwrap_or_default()
        .trim_matches(|c| c == '[' || c == ']');
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs: Vec<IpAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host} does not resolve: {e}"))?
        .map(|a| a.ip())
        .collect();
    match addrs.iter().find(|ip| !is_public(**ip)) {
        Some(ip) => Err(not_public(host, *ip)),
        None if addrs.is_empty() => Err(format!("{host} does not resolve")),
        None => Ok(()),
    }
}

fn not_public(host: &str, ip: IpAddr) -> String {
    format!(
        "{host} resolves to {ip}, a loopback, private or link-local address; set \
         webhooks.allow_private = true to allow it"
    )
}

/// The webhook sender's resolver: the addresses a name resolves to are
/// the ones it connects to, and none may be private. A check before the
/// request and a second lookup at the connect would leave a window in
/// which the name could be pointed at the operator's network (DNS
/// rebinding).
#[derive(Debug, Default)]
pub struct PublicOnly(DefaultResolver);

impl Resolver for PublicOnly {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let addrs = self.0.resolve(uri, config, timeout)?;
        match addrs.iter().find(|a| !is_public(a.ip())) {
            Some(a) => Err(ureq::Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                not_public(uri.host().unwrap_or_default(), a.ip()),
            ))),
            None => Ok(addrs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sender's client refuses to connect to a private address: the
    /// listener on loopback never sees a connection, and the error names
    /// the address and the setting.
    #[test]
    fn the_senders_client_never_connects_to_a_private_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let agent = ureq::Agent::with_parts(
            ureq::Agent::config_builder().build(),
            ureq::unversioned::transport::DefaultConnector::new(),
            PublicOnly::default(),
        );
        for url in [
            format!("http://127.0.0.1:{port}/hook"),
            format!("http://localhost:{port}/hook"),
        ] {
            let e = agent.post(&url).send("{}").unwrap_err().to_string();
            assert!(
                e.contains("resolves to") && e.contains("allow_private"),
                "{url}: {e}"
            );
        }
        assert_eq!(
            listener.accept().map(|_| ()).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock,
            "nothing connected"
        );
    }

    #[test]
    fn only_public_http_targets() {
        for bad in [
            "ftp://example.com/x",
            "not a url",
            "file:///etc/passwd",
            "http://",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        for private in [
            "http://127.0.0.1:9/x",
            "http://localhost/x",
            "http://10.1.2.3/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/",
            "http://[fd00::1]/",
            "http://[::ffff:10.0.0.1]/",
            "http://100.64.0.1/",
        ] {
            let e = resolve_allowed(private, false).unwrap_err();
            assert!(e.contains("allow_private"), "{private}: {e}");
            assert!(resolve_allowed(private, true).is_ok(), "{private}");
        }
        assert!(is_public("93.184.215.14".parse().unwrap()));
        assert!(is_public(
            "2606:2800:21f:cb07:6820:80da:af6b:8b2c".parse().unwrap()
        ));
    }
}
