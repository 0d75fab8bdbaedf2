//! Standard Webhooks signatures: `v1,` and the base64 HMAC-SHA256, keyed
//! with the secret's bytes, of `{webhook-id}.{webhook-timestamp}.{body}`.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngExt;
use sha2::Sha256;

/// Every secret starts so, as the standard's libraries expect.
pub const SECRET_PREFIX: &str = "whsec_";

/// A new secret: the prefix and 24 random bytes in base64.
pub fn new_secret() -> String {
    let bytes: [u8; 24] = rand::rng().random();
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// One `v1,…` signature of a message under `secret`.
pub fn sign(secret: &str, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let key = STANDARD
        .decode(secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret))
        // Herald makes every secret; one that does not decode is used as
        // its raw bytes rather than left unsigned.
        .unwrap_or_else(|_| secret.as_bytes().to_vec());
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes a key of any length");
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` header: one signature per secret that signs
/// now, separated by spaces (during a rotation's overlap, two).
pub fn signature_header(secrets: &[&str], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| sign(s, msg_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the standard's own test suites: this secret, id,
    /// timestamp and body give this signature.
    #[test]
    fn matches_the_standards_test_vector() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let sig = sign(
            secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn secrets_are_fresh_and_prefixed() {
        let (a, b) = (new_secret(), new_secret());
        assert!(a.starts_with(SECRET_PREFIX) && a != b);
        assert_eq!(
            STANDARD.decode(&a[SECRET_PREFIX.len()..]).unwrap().len(),
            24
        );
        let two = signature_header(&[&a, &b], "m", 1, b"{}");
        assert_eq!(two.split(' ').count(), 2);
        assert!(two.starts_with(&sign(&a, "m", 1, b"{}")));
    }
}
