//! Who is at the other end of a request: the TCP peer, or the client a
//! trusted proxy names ([`crate::proxies`]).

use crate::proxies::Proxies;
use actix_web::HttpRequest;
use std::net::IpAddr;

/// The client address of `req` as the audit log and the rate limit count
/// it: the trusted-proxy rules of the running port, else the peer.
pub fn client_of(req: &HttpRequest) -> Option<IpAddr> {
    let peer = req.peer_addr().map(|a| a.ip());
    match req.app_data::<actix_web::web::Data<Proxies>>() {
        Some(p) => p.client(req.head(), peer),
        None => peer,
    }
}

/// `client_of` as the audit log writes it (`unix` for the socket).
pub fn remote_of(req: &HttpRequest) -> String {
    client_of(req).map_or_else(|| "unix".into(), |ip| ip.to_string())
}

/// The request reached the port over HTTPS through a trusted proxy.
pub fn https_of(req: &HttpRequest) -> bool {
    req.app_data::<actix_web::web::Data<Proxies>>()
        .is_some_and(|p| p.https(req.head(), req.peer_addr().map(|a| a.ip())))
}

/// The network a client counts as, for limits and the trail: an IPv4
/// address itself; an IPv6 address by its /64, which one host or one
/// customer usually holds whole (so it cannot pose as 2^64 clients).
pub fn network_of(client: Option<IpAddr>) -> Option<IpAddr> {
    client.map(|ip| match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    })
}

/// [`network_of`] as the trail writes it: `2001:db8:1:2::/64`, `10.0.0.7`,
/// or `unix` for the socket.
pub fn network_key(client: Option<IpAddr>) -> String {
    match network_of(client) {
        None => "unix".into(),
        Some(IpAddr::V6(net)) => format!("{net}/64"),
        Some(v4) => v4.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_counts_by_its_64() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(network_key(ip("2001:db8:1:2:aaaa::1")), "2001:db8:1:2::/64");
        assert_eq!(
            network_key(ip("2001:db8:1:2:ffff:1:2:3")),
            network_key(ip("2001:db8:1:2::9"))
        );
        assert_ne!(
            network_key(ip("2001:db8:1:3::1")),
            network_key(ip("2001:db8:1:2::1"))
        );
        assert_eq!(network_key(ip("10.0.0.7")), "10.0.0.7");
        assert_eq!(network_key(ip("::ffff:10.0.0.7")), "10.0.0.7");
        assert_eq!(network_key(None), "unix");
        assert_eq!(network_of(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(network_of(ip("10.0.0.7")), ip("10.0.0.7"));
    }
}
