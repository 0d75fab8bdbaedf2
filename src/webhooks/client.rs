//! The sender's HTTP client: a timeout, no redirects, no proxy from the
//! environment, and (unless `webhooks.allow_private`) the address check
//! on the very addresses it connects to ([`PublicOnly`]).
//!
//! ureq reads `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` by default. A
//! proxy resolves the receiver's name itself, so a proxy nobody chose for
//! webhooks would get round the address check: only `webhooks.proxy` is
//! used. With it (and the check on), Herald still resolves the receiver's
//! name and checks the addresses, then asks the proxy to connect to the
//! checked address (`CONNECT 203.0.113.7:443`); the proxy's own address
//! is the operator's choice and is not checked.

use super::target::PublicOnly;
use crate::settings::{parse_webhook_proxy, WebhookSettings, PROXY_RULE};
use std::time::Duration;
use ureq::{Proxy, ProxyProtocol};

/// The proxy `webhooks.proxy` names (`None` when empty), for a sender that
/// checks addresses unless `allow_private`. The URL's rules are
/// [`parse_webhook_proxy`]'s, which the settings check at start-up.
pub fn proxy_of(raw: &str, allow_private: bool) -> Result<Option<Proxy>, String> {
    let Some(url) = parse_webhook_proxy(raw)? else {
        return Ok(None);
    };
    let protocol = match url.scheme() {
        "https" => ProxyProtocol::Https,
        _ => ProxyProtocol::Http,
    };
    let decode = |s: &str| {
        percent_encoding_decode(s)
            .ok_or_else(|| format!("{PROXY_RULE} (its credentials do not decode)"))
    };
    let mut b = Proxy::builder(protocol)
        // IPv6 keeps its brackets: the builder writes `host:port`.
        .host(url.host_str().unwrap_or_default())
        .port(url.port_or_known_default().unwrap_or(80))
        // Herald resolves and checks the receiver's address itself and
        // asks the proxy for that address; without the check, the proxy
        // resolves the name (it may know names this host does not).
        .resolve_target(!allow_private);
    if !url.username().is_empty() {
        b = b.username(&decode(url.username())?);
    }
    if let Some(p) = url.password() {
        b = b.password(&decode(p)?);
    }
    b.build()
        .map(Some)
        .map_err(|e| format!("{PROXY_RULE} ({e})"))
}

/// `%XX` escapes decoded (a URL's user name and password). Every `%` must
/// begin two hex digits: `percent_decode_str` would pass `%zz` through as
/// text, and a credential that is not what the operator meant is refused.
fn percent_encoding_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// The agent every attempt is posted with.
pub fn agent(settings: &WebhookSettings) -> Result<ureq::Agent, String> {
    let proxy = proxy_of(settings.proxy.expose(), settings.allow_private)
        .map_err(|rule| format!("invalid setting webhooks.proxy: {rule}"))?;
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(settings.timeout_secs)))
        .http_status_as_error(false)
        // A redirect could lead to an address the URL check refused.
        .max_redirects(0)
        .user_agent(concat!("Herald-Webhooks/", env!("CARGO_PKG_VERSION")))
        // Replaces the proxy ureq would take from the environment.
        .proxy(proxy.clone())
        .build();
    Ok(if settings.allow_private {
        config.into()
    } else {
        ureq::Agent::with_parts(
            config,
            ureq::unversioned::transport::DefaultConnector::new(),
            PublicOnly::with_proxy(proxy.as_ref()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};

    fn settings(proxy: &str, allow_private: bool) -> WebhookSettings {
        WebhookSettings {
            allow_private,
            timeout_secs: 5,
            max_in_flight: 1,
            poll_ms: 10,
            disable_after_hours: 1,
            retry_scale: 1.0,
            proxy: crate::settings::Secret::new(proxy),
        }
    }

    /// A receiver answering 204 to every request: answers its port.
    fn receiver() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let mut r = BufReader::new(s);
                let mut len = 0;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body);
                let _ = r
                    .get_mut()
                    .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
            }
        });
        port
    }

    /// An HTTP CONNECT proxy that tunnels to whatever it is asked for and
    /// records each request line: answers its port and the lines.
    fn connect_proxy() -> (u16, Arc<Mutex<Vec<String>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = seen.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let mut r = BufReader::new(s);
                let mut first = String::new();
                let _ = r.read_line(&mut first);
                log.lock().unwrap().push(first.trim().to_owned());
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                }
                let Some(target) = first.split(' ').nth(1) else {
                    continue;
                };
                let Ok(upstream) = TcpStream::connect(target) else {
                    continue;
                };
                let mut client = r.into_inner();
                let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                let (mut c2, mut u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let mut upstream = upstream;
                std::thread::spawn(move || std::io::copy(&mut u2, &mut c2));
                let _ = std::io::copy(&mut client, &mut upstream);
            }
        });
        (port, seen)
    }

    #[test]
    fn the_proxy_setting_is_checked_and_never_echoed() {
        assert!(proxy_of("", false).unwrap().is_none());
        assert!(proxy_of("  ", true).unwrap().is_none());
        for (bad, why) in [
            ("socks5://proxy.internal:1080", "scheme is socks5"),
            ("http://proxy.internal:3128/path", "path"),
            ("http://proxy.internal:3128/?a=b", "query"),
            ("proxy.internal:3128", "scheme"),
            ("not a url", "does not parse"),
            ("http://user:hunter2@proxy.internal:3128/x", "path"),
        ] {
            let e = proxy_of(bad, false).unwrap_err();
            assert!(
                e.contains("http:// or https://") && e.contains(why),
                "{bad}: {e}"
            );
            assert!(!e.contains("hunter2"), "{e}");
        }
        let p = proxy_of("http://ops:p%40ss@proxy.internal:3128", false)
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.host(), p.port(), p.username(), p.password()),
            ("proxy.internal", 3128, Some("ops"), Some("p@ss"))
        );
        assert!(p.resolve_target(), "Herald resolves and checks the target");
        // An escape is `%` and two hex digits: not a sign, not one digit,
        // not the end of the text.
        for bad in ["us%+1er", "p%4", "p%", "%zz", "%-1"] {
            let e = proxy_of(&format!("http://{bad}:pw@proxy.internal:3128"), false)
                .err()
                .unwrap_or_else(|| panic!("{bad} decoded"));
            assert!(e.contains("credentials do not decode"), "{bad}: {e}");
        }
        assert!(!proxy_of("https://proxy.internal", true)
            .unwrap()
            .unwrap()
            .resolve_target());
        assert_eq!(
            proxy_of("https://proxy.internal", false)
                .unwrap()
                .unwrap()
                .port(),
            443
        );
    }

    /// Whatever HTTP(S)_PROXY/ALL_PROXY say, the agent has only the
    /// configured proxy (the process-level test sets the variables).
    #[test]
    fn the_agent_takes_no_proxy_but_the_setting() {
        for allow in [false, true] {
            let a = agent(&settings("", allow)).unwrap();
            assert!(a.config().proxy().is_none());
            let a = agent(&settings("http://127.0.0.1:3128", allow)).unwrap();
            let p = a.config().proxy().unwrap();
            assert!(!p.is_from_env());
            assert_eq!(p.port(), 3128);
        }
    }

    /// Through the configured proxy, with the address check on: the
    /// receiver's address is checked here first, so a private one is
    /// refused before the proxy is asked for anything.
    #[test]
    fn through_a_proxy_a_private_receiver_is_still_refused() {
        let (pport, seen) = connect_proxy();
        let rport = receiver();
        let a = agent(&settings(&format!("http://127.0.0.1:{pport}"), false)).unwrap();
        for url in [
            format!("http://127.0.0.1:{rport}/hook"),
            format!("http://localhost:{rport}/hook"),
            format!("http://[::ffff:127.0.0.1]:{rport}/hook"),
        ] {
            let e = a.post(&url).send("{}").unwrap_err().to_string();
            assert!(e.contains("allow_private"), "{url}: {e}");
        }
        assert!(seen.lock().unwrap().is_empty(), "the proxy was not asked");
    }

    /// The configured proxy carries the attempt: CONNECT to the receiver.
    #[test]
    fn the_configured_proxy_carries_the_attempt() {
        let (pport, seen) = connect_proxy();
        let rport = receiver();
        let a = agent(&settings(&format!("http://127.0.0.1:{pport}"), true)).unwrap();
        let res = a
            .post(&format!("http://127.0.0.1:{rport}/hook"))
            .send("{}")
            .unwrap();
        assert_eq!(res.status().as_u16(), 204);
        assert_eq!(
            seen.lock().unwrap().as_slice(),
            [format!("CONNECT 127.0.0.1:{rport} HTTP/1.1")]
        );
    }
}
