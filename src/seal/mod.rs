//! Secrets sealed at rest under one key, the file in
//! `whatsapp.session_key_file`: the WhatsApp sessions (a key of its own per
//! account, the account, the row's kind and its key as associated data) and
//! the webhooks' signing secrets (a key of their own, each secret's place as
//! associated data: subscription, number and overlap), so a value copied to
//! another account, row, subscription or place does not open. AES-256-GCM (ring); the keys are derived from
//! the file's by HKDF-SHA256.
//!
//! A sealed value is `1 ‖ key id (4) ‖ nonce (12) ‖ ciphertext ‖ tag (16)`.
//! Nonces are random: per-purpose keys keep each key's count of seals far
//! below the 2^32 that random 96-bit nonces allow.
//!
//! [`key_file`] decides at start-up which key a daemon may use; [`rekey`]
//! moves every sealed value to a new key.
//!
//! Imports: `settings`, `token` and `store` (the sealed rows it rekeys).

pub mod key_file;
pub mod rekey;

use anyhow::Context as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf::{Salt, HKDF_SHA256};
use sha2::Digest;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const VERSION: u8 = 1;
const KEY_ID_LEN: usize = 4;
const HEADER: usize = 1 + KEY_ID_LEN + NONCE_LEN;

/// The sessions' key, as read from its file.
#[derive(Clone)]
pub struct SessionKey {
    bytes: [u8; 32],
    id: [u8; KEY_ID_LEN],
    path: PathBuf,
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKey({} from {})", self.id(), self.path.display())
    }
}

/// Why a sealed value did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("sealed under key {found}, not under this daemon's key {ours} ({path})")]
    OtherKey {
        found: String,
        ours: String,
        path: String,
    },
    #[error("does not open: altered, truncated, or sealed for another account or row")]
    Corrupt,
}

impl SessionKey {
    /// A key from 32 bytes (tests; `load`/`create` for files).
    pub fn from_bytes(bytes: [u8; 32], path: impl Into<PathBuf>) -> Self {
        let digest = sha2::Sha256::digest(bytes);
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&digest[..KEY_ID_LEN]);
        Self {
            bytes,
            id,
            path: path.into(),
        }
    }

    /// The key's id: the first bytes of its SHA-256, in hex. Names the key
    /// in messages and in the database without giving it away.
    pub fn id(&self) -> String {
        hex::encode(self.id)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the key file (64 hex digits); `Ok(None)` when it does not
    /// exist. A file others can read is tightened to 0600.
    pub fn load(path: &Path) -> anyhow::Result<Option<Self>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let meta = std::fs::metadata(path)?;
        if meta.permissions().mode() & 0o077 != 0 {
            // A secret mounted by a container runtime (Kubernetes, compose)
            // is read-only and often root's, readable by the daemon's
            // group: who may read it is the runtime's to decide, so a file
            // that cannot be tightened is used as it is, with a warning.
            match std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
                Ok(()) => tracing::warn!(
                    path = %path.display(),
                    "the session key file was readable by others; set it to 0600"
                ),
                Err(e) => tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "the session key file is readable by others and cannot be tightened \
                     (a read-only mounted secret?): using it as it is"
                ),
            }
        }
        let line = text.lines().next().unwrap_or("").trim();
        let bytes: [u8; 32] = hex::decode(line)
            .ok()
            .and_then(|b| b.try_into().ok())
            .with_context(|| {
                format!(
                    "{}: a session key is 64 hexadecimal digits (32 bytes) on the first line",
                    path.display()
                )
            })?;
        Ok(Some(Self::from_bytes(bytes, path)))
    }

    /// Writes a new random key to `path` (0600, written and synced under a
    /// temporary name, then linked in, so a crash never leaves half a key).
    /// Refuses to replace an existing file, also one another daemon made a
    /// moment before (daemons of a cluster starting at once on one file).
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        use rand::RngExt;
        let exists = || {
            anyhow::anyhow!(
                "{} exists already; a session key is never overwritten",
                path.display()
            )
        };
        if path.exists() {
            return Err(exists());
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let bytes: [u8; 32] = rand::rng().random();
        let tmp = crate::token::beside(
            path,
            &format!(".{}.{:08x}", std::process::id(), rand::random::<u32>()),
        );
        crate::token::write_private(&tmp, &hex::encode(bytes))?;
        // A link, unlike a rename, never replaces what is there.
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => crate::token::sync_dir_of(path)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(exists()),
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
        Ok(Self::from_bytes(bytes, path))
    }

    /// A key of its own for one purpose, derived with HKDF-SHA256.
    fn derive(&self, info: &[&[u8]]) -> Sealer {
        struct Len;
        impl ring::hkdf::KeyType for Len {
            fn len(&self) -> usize {
                32
            }
        }
        let mut key = [0u8; 32];
        Salt::new(HKDF_SHA256, &[])
            .extract(&self.bytes)
            .expand(info, Len)
            .and_then(|okm| okm.fill(&mut key))
            .expect("HKDF-SHA256 yields 32 bytes");
        Sealer {
            key: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).expect("a 32-byte key")),
            key_id: self.id,
            path: self.path.display().to_string(),
        }
    }

    /// The sealer of one account's rows.
    pub fn for_account(&self, account: &str) -> AccountSeal {
        AccountSeal {
            sealer: self.derive(&[
                b"herald whatsapp session v1\0".as_slice(),
                account.as_bytes(),
            ]),
            account: account.to_owned(),
        }
    }

    /// The sealer of the webhooks' signing secrets.
    pub fn for_webhooks(&self) -> WebhookSeal {
        WebhookSeal {
            sealer: self.derive(&[b"herald webhook secret v1\0".as_slice()]),
        }
    }

    /// The id of the key a sealed value was sealed under.
    pub fn key_id_of(sealed: &[u8]) -> Option<String> {
        (sealed.len() >= HEADER && sealed[0] == VERSION)
            .then(|| hex::encode(&sealed[1..1 + KEY_ID_LEN]))
    }
}

/// AES-256-GCM under one derived key; the associated data is the caller's.
#[derive(Clone)]
struct Sealer {
    key: LessSafeKey,
    key_id: [u8; KEY_ID_LEN],
    path: String,
}

impl Sealer {
    fn seal(&self, aad: Vec<u8>, plain: &[u8]) -> Vec<u8> {
        use rand::RngExt;
        let nonce: [u8; NONCE_LEN] = rand::rng().random();
        let mut out = Vec::with_capacity(HEADER + plain.len() + AES_256_GCM.tag_len());
        out.push(VERSION);
        out.extend_from_slice(&self.key_id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let mut body = out.split_off(HEADER);
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut body,
            )
            .expect("AES-GCM seals any length Herald stores");
        out.extend_from_slice(&body);
        out
    }

    fn open(&self, aad: Vec<u8>, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() < HEADER + AES_256_GCM.tag_len() || sealed[0] != VERSION {
            return Err(SealError::Corrupt);
        }
        if sealed[1..1 + KEY_ID_LEN] != self.key_id {
            return Err(SealError::OtherKey {
                found: hex::encode(&sealed[1..1 + KEY_ID_LEN]),
                ours: hex::encode(self.key_id),
                path: self.path.clone(),
            });
        }
        let nonce: [u8; NONCE_LEN] = sealed[1 + KEY_ID_LEN..HEADER]
            .try_into()
            .expect("sliced to the nonce's length");
        let mut body = sealed[HEADER..].to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut body,
            )
            .map_err(|_| SealError::Corrupt)?;
        let n = plain.len();
        body.truncate(n);
        Ok(body)
    }
}

/// Seals and opens the rows of one account.
pub struct AccountSeal {
    sealer: Sealer,
    account: String,
}

impl AccountSeal {
    fn aad(&self, kind: i32, k: &str) -> Vec<u8> {
        let mut aad = Vec::with_capacity(self.account.len() + k.len() + 6);
        aad.extend_from_slice(self.account.as_bytes());
        aad.push(0);
        aad.extend_from_slice(&kind.to_be_bytes());
        aad.push(0);
        aad.extend_from_slice(k.as_bytes());
        aad
    }

    pub fn seal(&self, kind: i32, k: &str, plain: &[u8]) -> Vec<u8> {
        self.sealer.seal(self.aad(kind, k), plain)
    }

    pub fn open(&self, kind: i32, k: &str, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        self.sealer.open(self.aad(kind, k), sealed)
    }
}

/// Where a webhook signing secret stands: its subscription, its number
/// among the subscription's secrets, and the end of its overlap (`None`:
/// the current secret). A secret is sealed bound to its place, so a
/// copy moved to another subscription, another number, or a rotated-out
/// secret made current again (or its overlap stretched) does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretPlace {
    pub webhook: i64,
    pub n: i64,
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

impl SecretPlace {
    fn aad(&self) -> Vec<u8> {
        let until = self.until.map_or_else(
            || "current".to_owned(),
            |t| t.timestamp_micros().to_string(),
        );
        format!("webhook {} secret {} until {until}", self.webhook, self.n).into_bytes()
    }
}

/// Seals and opens webhook signing secrets, each bound to its
/// [`SecretPlace`] as associated data.
#[derive(Clone)]
pub struct WebhookSeal {
    sealer: Sealer,
}

impl std::fmt::Debug for WebhookSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WebhookSeal({})", hex::encode(self.sealer.key_id))
    }
}

impl WebhookSeal {
    pub fn seal(&self, place: &SecretPlace, secret: &str) -> Vec<u8> {
        self.sealer.seal(place.aad(), secret.as_bytes())
    }

    pub fn open(&self, place: &SecretPlace, sealed: &[u8]) -> Result<String, SealError> {
        let plain = self.sealer.open(place.aad(), sealed)?;
        String::from_utf8(plain).map_err(|_| SealError::Corrupt)
    }

    /// Opens a secret sealed before secrets were bound to their place
    /// (migration 0020), with the subscription id alone as associated
    /// data: only to bind it (`SqlStore::bind_webhook_secrets`).
    pub fn open_unbound(&self, webhook: i64, sealed: &[u8]) -> Result<String, SealError> {
        let plain = self.sealer.open(webhook.to_string().into_bytes(), sealed)?;
        String::from_utf8(plain).map_err(|_| SealError::Corrupt)
    }

    /// Seals the way a version before migration 0020 did: for the tests
    /// of the upgrade.
    #[cfg(any(test, feature = "bench"))]
    pub fn seal_unbound(&self, webhook: i64, secret: &str) -> Vec<u8> {
        self.sealer
            .seal(webhook.to_string().into_bytes(), secret.as_bytes())
    }

    /// The id of the key this seals under.
    pub fn key_id(&self) -> String {
        hex::encode(self.sealer.key_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> SessionKey {
        SessionKey::from_bytes([b; 32], "/dev/null")
    }

    #[test]
    fn a_row_opens_only_for_its_account_kind_and_key() {
        let k = key(7);
        let a = k.for_account("shop-1");
        let sealed = a.seal(2, "123@s.whatsapp.net", b"ratchet state");
        assert_eq!(
            a.open(2, "123@s.whatsapp.net", &sealed).unwrap(),
            b"ratchet state"
        );
        // Copied to another account, another kind or another key: refused.
        let b = k.for_account("shop-2");
        assert_eq!(
            b.open(2, "123@s.whatsapp.net", &sealed),
            Err(SealError::Corrupt)
        );
        assert_eq!(
            a.open(3, "123@s.whatsapp.net", &sealed),
            Err(SealError::Corrupt)
        );
        assert_eq!(
            a.open(2, "124@s.whatsapp.net", &sealed),
            Err(SealError::Corrupt)
        );
        // Not the plain text on disk, and two seals of one value differ.
        assert!(!sealed.windows(7).any(|w| w == b"ratchet"));
        assert_ne!(sealed, a.seal(2, "123@s.whatsapp.net", b"ratchet state"));
    }

    #[test]
    fn another_key_is_named_and_a_flipped_bit_is_caught() {
        let sealed = key(1).for_account("a").seal(1, "", b"device");
        let other = key(2);
        match other.for_account("a").open(1, "", &sealed) {
            Err(SealError::OtherKey { found, ours, .. }) => {
                assert_eq!(found, key(1).id());
                assert_eq!(ours, other.id());
            }
            got => panic!("{got:?}"),
        }
        assert_eq!(SessionKey::key_id_of(&sealed), Some(key(1).id()));
        let mut bad = sealed.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(
            key(1).for_account("a").open(1, "", &bad),
            Err(SealError::Corrupt)
        );
        assert_eq!(
            key(1).for_account("a").open(1, "", &sealed[..10]),
            Err(SealError::Corrupt)
        );
    }

    #[test]
    fn a_webhook_secret_opens_only_in_its_place_and_under_its_key() {
        let w = key(7).for_webhooks();
        let place = |webhook, n, until: Option<&str>| SecretPlace {
            webhook,
            n,
            until: until.map(|t| t.parse().unwrap()),
        };
        let current = place(3, 2, None);
        let sealed = w.seal(&current, "whsec_c2VjcmV0");
        assert_eq!(w.open(&current, &sealed).unwrap(), "whsec_c2VjcmV0");
        assert!(!sealed.windows(6).any(|x| x == b"whsec_"));
        // Another subscription, another number, or a current secret given
        // an overlap's end: none opens it.
        for elsewhere in [
            place(4, 2, None),
            place(3, 1, None),
            place(3, 3, None),
            place(3, 2, Some("2026-11-28T10:00:00Z")),
        ] {
            assert_eq!(
                w.open(&elsewhere, &sealed),
                Err(SealError::Corrupt),
                "{elsewhere:?}"
            );
        }
        // A rotated-out secret cannot be made current again, nor its
        // overlap stretched.
        let old = place(3, 1, Some("2026-11-28T10:00:00Z"));
        let rotated_out = w.seal(&old, "whsec_b2xk");
        assert_eq!(w.open(&old, &rotated_out).unwrap(), "whsec_b2xk");
        for moved in [place(3, 1, None), place(3, 1, Some("2027-01-01T00:00:00Z"))] {
            assert_eq!(w.open(&moved, &rotated_out), Err(SealError::Corrupt));
        }
        assert!(matches!(
            key(8).for_webhooks().open(&current, &sealed),
            Err(SealError::OtherKey { .. })
        ));
        // Another purpose's key: an account named "3" does not open it.
        assert_eq!(
            key(7).for_account("3").open(0, "", &sealed),
            Err(SealError::Corrupt)
        );
        // A secret sealed before the binding opens only as such.
        let legacy = w.seal_unbound(3, "whsec_bGVnYWN5");
        assert_eq!(w.open_unbound(3, &legacy).unwrap(), "whsec_bGVnYWN5");
        assert_eq!(w.open(&current, &legacy), Err(SealError::Corrupt));
        assert_eq!(w.open_unbound(3, &sealed), Err(SealError::Corrupt));
    }

    #[test]
    fn the_key_file_is_made_0600_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/session.key");
        assert!(SessionKey::load(&path).unwrap().is_none());
        let made = SessionKey::create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let read = SessionKey::load(&path).unwrap().unwrap();
        assert_eq!(read.id(), made.id());
        assert!(SessionKey::create(&path).is_err(), "never overwritten");
        std::fs::write(&path, "not hex\n").unwrap();
        let e = SessionKey::load(&path).unwrap_err().to_string();
        assert!(e.contains("64 hexadecimal digits"), "{e}");
    }
}
