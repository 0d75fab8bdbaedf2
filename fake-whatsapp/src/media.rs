//! The fake WhatsApp media host: HTTPS on loopback, taking the client's
//! encrypted uploads and answering with where they are kept.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use std::sync::{Arc, Mutex};

/// One media upload received over HTTPS.
#[derive(Debug, Clone)]
pub struct Upload {
    /// e.g. `/mms/image/<token>`.
    pub path: String,
    /// Bytes of the encrypted media.
    pub bytes: usize,
    /// The body's SHA-256 is the token in the URL (the client's
    /// `file_enc_sha256`): the encrypted file arrived whole.
    pub hash_matches: bool,
}

/// What the media host keeps: where it listens and what it received.
pub(super) struct MediaHost {
    /// `127.0.0.1:port`.
    pub host: Mutex<String>,
    pub uploads: Mutex<Vec<Upload>>,
    /// The encrypted files, by the path they are downloaded from.
    files: Mutex<std::collections::HashMap<String, Vec<u8>>>,
    trace: bool,
}

impl MediaHost {
    pub fn new(trace: bool) -> Self {
        Self {
            host: Mutex::default(),
            uploads: Mutex::default(),
            files: Mutex::default(),
            trace,
        }
    }
}

/// The media server: HTTPS on loopback with a self-signed certificate
/// (test builds of Herald do not verify media TLS certificates, see the
/// `whatsapp-rust-ureq-http-client` dev-dependency).
pub(super) async fn serve_media(s: Arc<MediaHost>, listener: tokio::net::TcpListener) {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert = CertificateDer::from_pem_slice(include_bytes!("media-cert.pem")).expect("cert");
    let key = PrivateKeyDer::from_pem_slice(include_bytes!("media-key.pem")).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .expect("TLS config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    while let Ok((tcp, _)) = listener.accept().await {
        let (s, acceptor) = (s.clone(), acceptor.clone());
        tokio::spawn(async move {
            if let Ok(tls) = acceptor.accept(tcp).await {
                if let Err(e) = media_request(&s, tls).await {
                    if s.trace {
                        eprintln!("[fake-wa media] {e}");
                    }
                }
            }
        });
    }
}

async fn read_more<S: tokio::io::AsyncRead + Unpin>(
    io: &mut S,
    body: &mut Vec<u8>,
) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 16 * 1024];
    let n = io.read(&mut chunk).await.map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("closed mid-body".to_string());
    }
    body.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// One HTTP/1.1 request (the client's upload), answered and closed.
async fn media_request<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &MediaHost,
    mut io: S,
) -> Result<(), String> {
    use sha2::{Digest, Sha256};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = io.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before the request head".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut body = buf[head_end..].to_vec();
    let target = head.split(' ').nth(1).unwrap_or_default().to_owned();
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    };
    let content = if let Some(len) = header("content-length") {
        let len = decimal(&len).ok_or("bad content-length")?;
        while body.len() < len {
            read_more(&mut io, &mut body).await?;
        }
        body.truncate(len);
        body
    } else if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let line_end = loop {
                if let Some(i) = body[pos..].windows(2).position(|w| w == b"\r\n") {
                    break pos + i;
                }
                read_more(&mut io, &mut body).await?;
            };
            let size = chunk_size(&body[pos..line_end]).ok_or("bad chunk size")?;
            pos = line_end + 2;
            if size == 0 {
                break out;
            }
            while body.len() < pos + size + 2 {
                read_more(&mut io, &mut body).await?;
            }
            out.extend_from_slice(&body[pos..pos + size]);
            pos += size + 2;
        }
    } else {
        Vec::new()
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    if head.starts_with("GET ") {
        // A recipient downloads what a sender uploaded.
        let file = s.files.lock().unwrap().get(path).cloned();
        let (status, body) = match file {
            Some(f) => ("200 OK", f),
            None => ("404 Not Found", Vec::new()),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        io.write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        io.write_all(&body).await.map_err(|e| e.to_string())?;
        let _ = io.shutdown().await;
        return Ok(());
    }
    let (status, reply) = if query.contains("resume=1") {
        ("404 Not Found", String::from("{}"))
    } else {
        let token = path.rsplit('/').next().unwrap_or_default();
        // The upload token is the encrypted file's SHA-256 in URL-safe
        // base64 without padding (whatsapp-rust's and Baileys' form).
        let hash_matches = URL_SAFE_NO_PAD
            .decode(token)
            .is_ok_and(|t| t == Sha256::digest(&content).as_slice());
        let n = {
            let mut u = s.uploads.lock().unwrap();
            u.push(Upload {
                path: path.to_owned(),
                bytes: content.len(),
                hash_matches,
            });
            u.len()
        };
        let host = s.host.lock().unwrap().clone();
        let direct = format!("/v/t62.7118-24/fake-{n}.enc");
        s.files.lock().unwrap().insert(direct.clone(), content);
        (
            "200 OK",
            format!(r#"{{"url":"https://{host}{direct}","direct_path":"{direct}"}}"#),
        )
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
        reply.len()
    );
    io.write_all(response.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let _ = io.shutdown().await;
    Ok(())
}

/// A chunk-size line's size (RFC 9112: hex digits, then any extensions
/// after `;`). Digits only: `from_str_radix` alone would take a sign.
fn chunk_size(line: &[u8]) -> Option<usize> {
    let line = std::str::from_utf8(line).ok()?;
    let digits = line.split(';').next()?.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    usize::from_str_radix(digits, 16).ok()
}

/// A Content-Length: decimal digits only (`parse` alone takes a `+`).
fn decimal(s: &str) -> Option<usize> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_digits_and_nothing_else() {
        assert_eq!(chunk_size(b"1a"), Some(26));
        assert_eq!(chunk_size(b"1A;name=value"), Some(26));
        assert_eq!(chunk_size(b"0"), Some(0));
        for bad in [&b"+1a"[..], b"-1", b"", b" ", b"1g", b"0x1a"] {
            assert_eq!(chunk_size(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(decimal("42"), Some(42));
        for bad in ["+42", "-1", "", "4 2", "0x2a"] {
            assert_eq!(decimal(bad), None, "{bad:?}");
        }
    }
}
