//! The reverse proxies the operator trusts (`control.trusted_proxies`):
//! from one of them, the client it names in `X-Forwarded-For` and the
//! scheme it names in `X-Forwarded-Proto` are believed; from any other
//! peer those headers are ignored, so a client cannot pick the address its
//! requests are counted and audited under.

use actix_web::dev::RequestHead;
use std::net::IpAddr;
use std::str::FromStr;

/// The proxies whose forwarding headers are believed: addresses and
/// networks (`10.0.0.0/8`, `::1`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proxies {
    nets: Vec<(IpAddr, u8)>,
}

impl FromStr for Proxies {
    type Err = String;

    /// A comma-separated list of addresses or CIDR networks.
    fn from_str(list: &str) -> Result<Self, String> {
        let mut nets = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (addr, bits) = match item.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (item, None),
            };
            let ip: IpAddr = addr
                .parse()
                .map_err(|_| format!("{item:?} is not an IP address or a CIDR network"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits = match bits {
                None => max,
                Some(b) => b
                    .parse::<u8>()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(|| format!("{item:?} has a prefix length outside 0–{max}"))?,
            };
            nets.push((ip, bits));
        }
        Ok(Self { nets })
    }
}

impl Proxies {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets
            .iter()
            .any(|(net, bits)| in_net(ip, canonical(*net), *bits))
    }

    /// The client's address: the peer's, or, when the peer is a trusted
    /// proxy, the nearest address in `X-Forwarded-For` that is not one.
    /// `None` over the Unix socket.
    pub fn client(&self, head: &RequestHead, peer: Option<IpAddr>) -> Option<IpAddr> {
        let peer = peer?;
        if !self.contains(peer) {
            return Some(peer);
        }
        let mut nearest = peer;
        for value in head
            .headers()
            .get_all("x-forwarded-for")
            .collect::<Vec<_>>()
            .iter()
            .rev()
        {
            let Ok(text) = value.to_str() else { break };
            for hop in text.rsplit(',') {
                let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                    return Some(nearest);
                };
                if !self.contains(ip) {
                    return Some(ip);
                }
                nearest = ip;
            }
        }
        Some(nearest)
    }

    /// The browser reached the port over HTTPS: the trusted proxy in
    /// front of it says so in `X-Forwarded-Proto`.
    pub fn https(&self, head: &RequestHead, peer: Option<IpAddr>) -> bool {
        peer.is_some_and(|p| self.contains(p))
            && head
                .headers()
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn lists_parse_and_refuse_naming_the_item() {
        let p: Proxies = "10.0.0.0/8, 192.168.1.7 ,::1, fd00::/8".parse().unwrap();
        assert!(p.contains(ip("10.1.2.3")));
        assert!(p.contains(ip("::ffff:10.9.9.9")), "mapped form");
        assert!(p.contains(ip("192.168.1.7")));
        assert!(!p.contains(ip("192.168.1.8")));
        assert!(p.contains(ip("::1")));
        assert!(p.contains(ip("fd12::1")));
        assert!(!p.contains(ip("fe80::1")));
        assert_eq!("".parse::<Proxies>().unwrap(), Proxies::default());
        assert!("10.0.0.0/33"
            .parse::<Proxies>()
            .unwrap_err()
            .contains("10.0.0.0/33"));
        assert!("proxy.lan"
            .parse::<Proxies>()
            .unwrap_err()
            .contains("proxy.lan"));
        assert!("0.0.0.0/0"
            .parse::<Proxies>()
            .unwrap()
            .contains(ip("8.8.8.8")));
    }

    #[test]
    fn forwarding_headers_count_only_from_a_trusted_proxy() {
        let p: Proxies = "10.0.0.1, 10.0.0.2".parse().unwrap();
        let req = TestRequest::default()
            .insert_header(("x-forwarded-for", "203.0.113.9, 198.51.100.4, 10.0.0.2"))
            .insert_header(("x-forwarded-proto", "https"))
            .to_http_request();
        // Through two trusted proxies: the nearest untrusted hop.
        assert_eq!(
            p.client(req.head(), Some(ip("10.0.0.1"))),
            Some(ip("198.51.100.4"))
        );
        assert!(p.https(req.head(), Some(ip("10.0.0.1"))));
        // From anyone else the headers are the client's own say-so.
        assert_eq!(
            p.client(req.head(), Some(ip("203.0.113.50"))),
            Some(ip("203.0.113.50"))
        );
        assert!(!p.https(req.head(), Some(ip("203.0.113.50"))));
        // No header: the proxy itself.
        let bare = TestRequest::default().to_http_request();
        assert_eq!(
            p.client(bare.head(), Some(ip("10.0.0.1"))),
            Some(ip("10.0.0.1"))
        );
        assert!(!p.https(bare.head(), Some(ip("10.0.0.1"))));
        assert_eq!(p.client(bare.head(), None), None);
    }
}
