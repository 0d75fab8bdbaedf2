//! `herald probe [PATH]`: one GET on the daemon's own control port, exit 0
//! on 200. The container image's HEALTHCHECK, which has no curl: plain
//! std TCP, a short timeout, nothing to configure beyond the settings the
//! daemon itself reads.

use crate::settings::Settings;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(3);

/// Where a probe on this machine reaches the port `control.listen` names:
/// loopback when it listens on every address.
pub fn probe_addr(settings: &Settings) -> anyhow::Result<SocketAddr> {
    let mut addr = settings.listen_addr()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    Ok(addr)
}

/// GETs `path` at `addr`: Ok with the status line's code, or why it could
/// not ask.
pub fn probe(addr: SocketAddr, path: &str) -> anyhow::Result<u16> {
    anyhow::ensure!(
        path.starts_with('/') && !path.contains(char::is_whitespace),
        "the path must start with / and hold no spaces: {path:?}"
    );
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    // The port checks Host against its own names; an IP address always passes.
    // One write: `write!` on a socket would send each piece apart.
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        addr.ip()
    );
    s.write_all(request.as_bytes())?;
    // The status line may arrive in pieces: read until its end, the
    // buffer is full or the server closes.
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < head.len() && !head[..n].windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut head[n..])? {
            0 => break,
            got => n += got,
        }
    }
    let line = String::from_utf8_lossy(&head[..n]);
    line.strip_prefix("HTTP/1.1 ")
        .or_else(|| line.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP answer from {addr}: {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-request server answering `status`, its status line in
    /// several writes as a slow or busy server may send it.
    fn answer_once(status: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let (mut req, mut buf) = (Vec::new(), [0u8; 512]);
            while !req.ends_with(b"\r\n\r\n") {
                match c.read(&mut buf).unwrap() {
                    0 => break,
                    n => req.extend_from_slice(&buf[..n]),
                }
            }
            let req = String::from_utf8_lossy(&req).to_string();
            assert!(
                req.starts_with("GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n"),
                "{req}"
            );
            for piece in ["HTTP/1.1 ", &status[..2], &status[2..], "\r\n"] {
                c.write_all(piece.as_bytes()).unwrap();
                c.flush().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            c.write_all(b"content-length: 0\r\n\r\n").unwrap();
        });
        addr
    }

    #[test]
    fn the_probe_reads_the_status_and_fails_without_a_daemon() {
        assert_eq!(probe(answer_once("200 OK"), "/readyz").unwrap(), 200);
        assert_eq!(
            probe(answer_once("503 Service Unavailable"), "/readyz").unwrap(),
            503
        );
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(probe(closed, "/readyz").is_err());
        assert!(probe(closed, "readyz").is_err());
    }

    #[test]
    fn every_address_is_probed_on_loopback() {
        let env = |listen: &str| {
            std::collections::HashMap::from([("HERALD_CONTROL__LISTEN".to_owned(), listen.into())])
        };
        let s = Settings::load_from(None, &env("0.0.0.0:8790")).unwrap();
        assert_eq!(probe_addr(&s).unwrap(), "127.0.0.1:8790".parse().unwrap());
        let s = Settings::load_from(None, &env("[::]:9000")).unwrap();
        assert_eq!(probe_addr(&s).unwrap(), "[::1]:9000".parse().unwrap());
        let s = Settings::load_from(None, &env("10.0.0.7:8790")).unwrap();
        assert_eq!(probe_addr(&s).unwrap(), "10.0.0.7:8790".parse().unwrap());
    }
}
