//! Where a webhook may point: `http` or `https` only, and not at a
//! loopback, private or link-local address unless `webhooks.allow_private`
//! says so, so the control port cannot be used to probe the operator's
//! own network. The URL is checked when a webhook is added, and every
//! attempt's connection is checked on the very addresses it connects to
//! ([`PublicOnly`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};
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

/// Not an address the operator's network keeps to itself, nor one the
/// kernel would route to this host, nor one IANA's special-purpose
/// registries set aside from the public Internet.
///
/// IPv4: `0.0.0.0/8`, loopback `127.0.0.0/8` (all of it: Linux answers
/// every address of it on `lo`), the private ranges, link-local,
/// carrier-grade NAT `100.64.0.0/10`, IETF protocol assignments
/// `192.0.0.0/24` (where some clouds put their metadata service), the
/// documentation ranges, the deprecated 6to4 relay anycast
/// `192.88.99.0/24`, benchmarking `198.18.0.0/15`, multicast and the
/// reserved `240.0.0.0/4` (broadcast included). IPv6: `::` and `::1`,
/// unique local `fc00::/7`, link-local `fe80::/10`, the deprecated
/// site-local `fec0::/10`, multicast, discard-only `100::/64`, the local-use
/// NAT64 prefix `64:ff9b:1::/48` (a translator of the operator's own, to
/// any IPv4 address), IETF protocol assignments `2001::/23` (Teredo among
/// them) and documentation `2001:db8::/32`, and every form that embeds an
/// IPv4 address — IPv4-mapped `::ffff:0:0/96`, IPv4-compatible `::/96`,
/// NAT64 `64:ff9b::/96` and 6to4 `2002::/16` — refused when the IPv4
/// address it embeds (or reaches, through a NAT64 gateway or a 6to4 relay)
/// is.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                // Carrier-grade NAT, 100.64.0.0/10.
                || (a == 100 && (64..128).contains(&b))
                // IETF protocol assignments, 192.0.0.0/24.
                || (a, b, c) == (192, 0, 0)
                // 6to4 relay anycast, 192.88.99.0/24.
                || (a, b, c) == (192, 88, 99)
                // Benchmarking, 198.18.0.0/15.
                || (a == 198 && (b & 0xfe) == 18)
                // Reserved, 240.0.0.0/4.
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // Unique local fc00::/7, link-local fe80::/10 and the
                // deprecated site-local fec0::/10.
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                // Discard-only, 100::/64.
                || s[..4] == [0x100, 0, 0, 0]
                // Local-use NAT64, 64:ff9b:1::/48.
                || s[..3] == [0x64, 0xff9b, 1]
                // IETF protocol assignments 2001::/23 (Teredo, ORCHID, …)
                // and documentation 2001:db8::/32.
                || (s[0] == 0x2001 && s[1] < 0x200)
                || s[..2] == [0x2001, 0xdb8])
        }
    }
}

/// The IPv4 address an IPv6 address carries, in the forms that deliver to
/// it: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d` (not `::`
/// or `::1`, which are IPv6's own), NAT64 `64:ff9b::a.b.c.d` and 6to4
/// `2002:AABB:CCDD::/48`.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    match s {
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
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
/// rebinding). The one exception is the proxy of `webhooks.proxy`, which
/// the operator chose (usually on their own network).
#[derive(Debug, Default)]
pub struct PublicOnly {
    resolver: DefaultResolver,
    /// The configured proxy's host and port.
    proxy: Option<(String, u16)>,
}

impl PublicOnly {
    pub fn with_proxy(proxy: Option<&ureq::Proxy>) -> Self {
        Self {
            resolver: DefaultResolver::default(),
            proxy: proxy.map(|p| (p.host().to_ascii_lowercase(), p.port())),
        }
    }

    fn is_proxy(&self, uri: &ureq::http::Uri) -> bool {
        let Some((host, port)) = &self.proxy else {
            return false;
        };
        let default = match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        };
        uri.host()
            .map(|h| {
                h.trim_matches(|c| c == '[' || c == ']')
                    .to_ascii_lowercase()
            })
            .as_deref()
            == Some(host.trim_matches(|c| c == '[' || c == ']'))
            && uri.port_u16().unwrap_or(default) == *port
    }
}

impl Resolver for PublicOnly {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let addrs = self.resolver.resolve(uri, config, timeout)?;
        if self.is_proxy(uri) {
            return Ok(addrs);
        }
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
            ureq::Agent::config_builder().proxy(None).build(),
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

    fn refused(addrs: &[&str]) {
        for a in addrs {
            let ip: IpAddr = a.parse().unwrap();
            assert!(!is_public(ip), "{a} must be refused");
            let url = match ip {
                IpAddr::V4(_) => format!("http://{a}/hook"),
                IpAddr::V6(_) => format!("http://[{a}]/hook"),
            };
            let e = resolve_allowed(&url, false).unwrap_err();
            assert!(e.contains("allow_private"), "{url}: {e}");
        }
    }

    fn allowed(addrs: &[&str]) {
        for a in addrs {
            assert!(is_public(a.parse().unwrap()), "{a} must be allowed");
        }
    }

    /// The kernel answers every address of 127.0.0.0/8 on `lo`, and
    /// 0.0.0.0 and `::` reach this host too; so do their IPv6 forms.
    #[test]
    fn every_form_of_loopback_is_refused() {
        refused(&[
            "127.0.0.1",
            "127.0.0.2",
            "127.1.2.3",
            "127.255.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:127.9.9.9",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "::127.3.2.1",
        ]);
    }

    /// `::/96`, IPv4-compatible: refused when the IPv4 address is.
    #[test]
    fn ipv4_compatible_addresses_are_judged_by_their_ipv4_address() {
        refused(&[
            "::10.0.0.1",
            "::192.168.1.1",
            "::172.16.0.1",
            "::169.254.169.254",
            "::100.64.0.1",
            "::0.0.0.2",
        ]);
        allowed(&["::8.8.8.8", "::93.184.215.14"]);
    }

    /// `64:ff9b::/96`, NAT64: the gateway connects to the IPv4 address.
    #[test]
    fn nat64_addresses_are_judged_by_the_ipv4_address_they_reach() {
        refused(&[
            "64:ff9b::127.0.0.1",
            "64:ff9b::10.1.2.3",
            "64:ff9b::192.168.0.1",
            "64:ff9b::169.254.169.254",
            "64:ff9b::100.64.0.1",
            "64:ff9b::0.0.0.0",
        ]);
        allowed(&["64:ff9b::8.8.8.8", "64:ff9b::5db8:d70e"]);
    }

    /// The special-purpose ranges IANA sets aside, which are not the
    /// public Internet (192.0.0.0/24 holds a cloud metadata address).
    #[test]
    fn special_purpose_ranges_are_refused() {
        refused(&[
            "192.0.0.192",
            "192.0.0.1",
            "192.0.2.10",
            "198.51.100.7",
            "203.0.113.9",
            "192.88.99.1",
            "198.18.0.1",
            "198.19.255.254",
            "240.0.0.1",
            "250.1.2.3",
            "255.255.255.254",
            "224.0.0.1",
            "239.255.255.250",
            "64:ff9b:1::1",
            "64:ff9b:1:ffff::8.8.8.8",
            "64:ff9b:1::c000:ac",
            "100::1",
            "2001::1",
            "2001:1ff::1",
            "2001:db8::1",
            "ff02::1",
            "::ffff:192.0.0.192",
            "64:ff9b::c612:1",
            "2002:c000:00c0::1",
        ]);
        // Just outside each of them.
        allowed(&[
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.1",
            "223.255.255.254",
            "64:ff9b:2::1",
            "2001:200::1",
            "2001:db9::1",
            "101::1",
        ]);
    }

    /// `fec0::/10`, the deprecated site-local range: private, always.
    #[test]
    fn site_local_addresses_are_refused() {
        refused(&["fec0::1", "fed0:1:2::3", "feff:ffff::1"]);
        // Just outside: ff00::/8 is multicast (no TCP), fe80::/10 link-local.
        refused(&["fe80::1", "febf::1"]);
    }

    /// `2002::/16`, 6to4: the IPv4 address of the relay's tunnel end is
    /// in bits 16–47.
    #[test]
    fn six_to_four_addresses_are_judged_by_their_ipv4_address() {
        refused(&[
            "2002:7f00:1::1",
            "2002:a00:1::",
            "2002:c0a8:101::5",
            "2002:a9fe:a9fe::1",
            "2002:6440:1::1",
            "2002::1",
        ]);
        allowed(&["2002:808:808::1", "2002:5db8:d70e::1"]);
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
