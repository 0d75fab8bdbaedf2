//! The fake WhatsApp media host: HTTPS on loopback, taking the client's
//! encrypted uploads and answering with where they are kept.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
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
    files: Mutex<HashMap<String, Bytes>>,
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
/// `whatsapp-rust-ureq-http-client` dev-dependency). hyper reads the
/// requests (Content-Length or chunked bodies) off the TLS stream.
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
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let trace = s.trace;
            let service = hyper::service::service_fn(move |req| media_request(s.clone(), req));
            let served = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
            if let Err(e) = served {
                if trace {
                    // hyper's error, then why (e.g. the body's own error).
                    let why: Vec<String> =
                        std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                            .map(ToString::to_string)
                            .collect();
                    eprintln!("[fake-wa media] {}", why.join(": "));
                }
            }
        });
    }
}

/// One request: a recipient's download (GET) or the client's upload (any
/// other method). A body cut short ends the connection with hyper's error.
async fn media_request(
    s: Arc<MediaHost>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    use sha2::{Digest, Sha256};
    let path = req.uri().path().to_owned();
    if req.method() == Method::GET {
        // A recipient downloads what a sender uploaded.
        let file = s.files.lock().unwrap().get(&path).cloned();
        let (status, body) = match file {
            Some(f) => (StatusCode::OK, f),
            None => (StatusCode::NOT_FOUND, Bytes::new()),
        };
        return Ok(reply(status, "application/octet-stream", body));
    }
    let resume = req.uri().query().is_some_and(|q| q.contains("resume=1"));
    let content = req.into_body().collect().await?.to_bytes();
    if resume {
        return Ok(reply(StatusCode::NOT_FOUND, "application/json", "{}"));
    }
    let token = path.rsplit('/').next().unwrap_or_default();
    // The upload token is the encrypted file's SHA-256 in URL-safe
    // base64 without padding (whatsapp-rust's and Baileys' form).
    let hash_matches = URL_SAFE_NO_PAD
        .decode(token)
        .is_ok_and(|t| t == Sha256::digest(&content).as_slice());
    let n = {
        let mut u = s.uploads.lock().unwrap();
        u.push(Upload {
            path: path.clone(),
            bytes: content.len(),
            hash_matches,
        });
        u.len()
    };
    let host = s.host.lock().unwrap().clone();
    let direct = format!("/v/t62.7118-24/fake-{n}.enc");
    s.files.lock().unwrap().insert(direct.clone(), content);
    let json = format!(r#"{{"url":"https://{host}{direct}","direct_path":"{direct}"}}"#);
    Ok(reply(StatusCode::OK, "application/json", json))
}

/// A response with its body's Content-Length (hyper's, from `Full`).
fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let headers = r.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // One request a connection, as the host always served: hyper closes
    // the connection after a response that says so.
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    r
}
