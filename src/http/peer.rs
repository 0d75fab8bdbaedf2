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
