//! The X25519 agreement whatsapp-rust's Signal code runs: graviola's
//! (s2n-bignum's formally verified assembly) where the CPU has what it needs,
//! instead of curve25519-dalek's portable ladder.
//!
//! A first send to a group sets up a Signal session with every member device
//! it has none with, four or five agreements each, and the ladder was most
//! of that send's CPU (issue 49). whatsapp-rust 0.7 lets the application
//! replace exactly this primitive ([`SignalCryptoProvider::x25519_agreement`])
//! through one process-wide provider; everything else (AES, HMAC, the Noise
//! transport) stays the crate's own, byte for byte.
//!
//! The answer is always the one the crate's own implementation gives:
//! - graviola is used only where [`Agreement::detect`] finds the CPU features
//!   it asserts on entry (x86-64: AES, PCLMULQDQ, BMI1, BMI2, ADX, AVX, AVX2;
//!   AArch64: AES, PMULL, SHA2, NEON). Without them, and under valgrind, which
//!   hides ADX, the crate's own ladder runs, so graviola never panics here.
//! - graviola refuses an all-zero result (a peer's low-order point, RFC 7748
//!   §6.1) where the crate returns zeros; that case, which no honest peer
//!   produces, is handed to the crate's own ladder, so a session behaves
//!   exactly as before even then.
//!
//! [`install`] runs once, before the first client exists; a process that
//! already did Signal work on the default keeps it (the provider can be set
//! only once) and says so.

use std::sync::OnceLock;
use whatsapp_rust::wacore::libsignal::crypto::{
    CryptoProviderError, GcmInPlaceBuffer, RustCryptoProvider, SignalCryptoProvider, TransportAead,
};

/// Which X25519 this process agrees with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// graviola's assembly.
    Graviola,
    /// whatsapp-rust's own (curve25519-dalek); the reason names why.
    Portable(&'static str),
}

/// What [`Agreement::detect`] found, asked of the CPU once per process.
static DETECTED: OnceLock<Agreement> = OnceLock::new();

impl Agreement {
    /// graviola where this CPU runs it; the crate's own ladder otherwise.
    /// Asked on every agreement, so answered from [`DETECTED`].
    pub fn detect() -> Self {
        *DETECTED.get_or_init(Self::probe)
    }

    fn probe() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let all = std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
                && std::arch::is_x86_feature_detected!("bmi1")
                && std::arch::is_x86_feature_detected!("bmi2")
                && std::arch::is_x86_feature_detected!("adx")
                && std::arch::is_x86_feature_detected!("avx")
                && std::arch::is_x86_feature_detected!("avx2");
            if all {
                Self::Graviola
            } else {
                Self::Portable("the CPU lacks one of AES, PCLMULQDQ, BMI1, BMI2, ADX, AVX, AVX2")
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            let all = std::arch::is_aarch64_feature_detected!("aes")
                && std::arch::is_aarch64_feature_detected!("pmull")
                && std::arch::is_aarch64_feature_detected!("sha2")
                && std::arch::is_aarch64_feature_detected!("neon");
            if all {
                Self::Graviola
            } else {
                Self::Portable("the CPU lacks one of AES, PMULL, SHA2, NEON")
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Self::Portable("graviola supports x86-64 and AArch64 only")
        }
    }

    /// The metric label and log word: `graviola` or `portable`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Graviola => "graviola",
            Self::Portable(_) => "portable",
        }
    }
}

/// whatsapp-rust's provider with the agreement replaced; every other method
/// is the crate's own.
pub struct Provider;

/// The crate's provider, as a static: `transport_aead` wants `&'static`.
static OWN: RustCryptoProvider = RustCryptoProvider;

impl Provider {
    /// X25519 of `private_key` (clamped by the callee, as RFC 7748 says) and
    /// `their_public_key` by graviola, where this CPU runs it (`None`
    /// otherwise); the crate's own answer where graviola refuses a zero
    /// result.
    pub fn graviola(
        private_key: &[u8; 32],
        their_public_key: &[u8; 32],
    ) -> Option<Result<[u8; 32], CryptoProviderError>> {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        if Agreement::detect() == Agreement::Graviola {
            use graviola::key_agreement::x25519::{PublicKey, StaticPrivateKey};
            let key = StaticPrivateKey::from_array(private_key);
            return Some(
                match key.diffie_hellman(&PublicKey::from_array(their_public_key)) {
                    Ok(shared) => Ok(shared.0),
                    // Zero (a low-order point): the crate answers zeros;
                    // give its answer, not an error, so behaviour is the
                    // crate's exactly.
                    Err(_) => Self::portable(private_key, their_public_key),
                },
            );
        }
        None
    }

    /// The crate's own agreement (the trait's default body: curve25519-dalek).
    pub fn portable(
        private_key: &[u8; 32],
        their_public_key: &[u8; 32],
    ) -> Result<[u8; 32], CryptoProviderError> {
        OWN.x25519_agreement(private_key, their_public_key)
    }
}

impl SignalCryptoProvider for Provider {
    fn aes_256_cbc_encrypt(
        &self,
        key: &[u8; 32],
        iv: &[u8; 16],
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoProviderError> {
        OWN.aes_256_cbc_encrypt(key, iv, plaintext, out)
    }

    fn aes_256_cbc_decrypt(
        &self,
        key: &[u8; 32],
        iv: &[u8; 16],
        ciphertext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoProviderError> {
        OWN.aes_256_cbc_decrypt(key, iv, ciphertext, out)
    }

    fn aes_256_cbc_decrypt_in_place(
        &self,
        key: &[u8; 32],
        iv: &[u8; 16],
        buffer: &mut Vec<u8>,
    ) -> Result<(), CryptoProviderError> {
        OWN.aes_256_cbc_decrypt_in_place(key, iv, buffer)
    }

    fn aes_256_gcm_encrypt(
        &self,
        key: &[u8; 32],
        nonce: &[u8; 12],
        aad: &[u8],
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoProviderError> {
        OWN.aes_256_gcm_encrypt(key, nonce, aad, plaintext, out)
    }

    fn aes_256_gcm_decrypt(
        &self,
        key: &[u8; 32],
        nonce: &[u8; 12],
        aad: &[u8],
        ciphertext_with_tag: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoProviderError> {
        OWN.aes_256_gcm_decrypt(key, nonce, aad, ciphertext_with_tag, out)
    }

    fn hmac_sha256(&self, key: &[u8], input: &[u8]) -> [u8; 32] {
        OWN.hmac_sha256(key, input)
    }

    fn hmac_sha256_two_part(&self, key: &[u8], first: &[u8], second: &[u8]) -> [u8; 32] {
        OWN.hmac_sha256_two_part(key, first, second)
    }

    fn x25519_agreement(
        &self,
        private_key: &[u8; 32],
        their_public_key: &[u8; 32],
    ) -> Result<[u8; 32], CryptoProviderError> {
        // Installed only where graviola runs; the fallback keeps the impl
        // whole on every target.
        Self::graviola(private_key, their_public_key)
            .unwrap_or_else(|| Self::portable(private_key, their_public_key))
    }

    fn aes_256_gcm_encrypt_in_place(
        &self,
        key: &[u8; 32],
        nonce: &[u8; 12],
        aad: &[u8],
        buffer: &mut dyn GcmInPlaceBuffer,
    ) -> Result<(), CryptoProviderError> {
        OWN.aes_256_gcm_encrypt_in_place(key, nonce, aad, buffer)
    }

    fn aes_256_gcm_decrypt_in_place(
        &self,
        key: &[u8; 32],
        nonce: &[u8; 12],
        aad: &[u8],
        buffer: &mut dyn GcmInPlaceBuffer,
    ) -> Result<(), CryptoProviderError> {
        OWN.aes_256_gcm_decrypt_in_place(key, nonce, aad, buffer)
    }

    fn transport_aead(
        &'static self,
        key: &[u8; 32],
    ) -> Result<Box<dyn TransportAead>, CryptoProviderError> {
        OWN.transport_aead(key)
    }
}

/// What [`install`] decided, once per process.
static INSTALLED: OnceLock<Agreement> = OnceLock::new();

/// Installs [`Provider`] as whatsapp-rust's, once per process, and answers
/// which agreement runs. Call before any client starts; idempotent.
pub fn install() -> Agreement {
    *INSTALLED.get_or_init(|| {
        let agreement = Agreement::detect();
        if let Agreement::Portable(why) = agreement {
            tracing::info!(reason = why, "X25519 agreement: whatsapp-rust's own ladder");
            return agreement;
        }
        match whatsapp_rust::wacore::libsignal::crypto::set_crypto_provider(Provider) {
            Ok(()) => {
                tracing::info!("X25519 agreement: graviola");
                agreement
            }
            // Some Signal work already ran on the default provider (a test
            // process with the fake server in it); it keeps the default.
            Err(_) => {
                tracing::warn!(
                    "X25519 agreement: a crypto provider was set before Herald's; \
                     whatsapp-rust's own ladder runs"
                );
                Agreement::Portable("a provider was already set in this process")
            }
        }
    })
}

/// The agreement this process runs: [`install`]'s answer, or the crate's
/// own where nothing installed one.
pub fn in_use() -> Agreement {
    INSTALLED
        .get()
        .copied()
        .unwrap_or(Agreement::Portable("not installed"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex32(s: &str) -> [u8; 32] {
        let v: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        v.try_into().unwrap()
    }

    /// graviola's answer, or the crate's with a note where this CPU cannot
    /// run graviola (so the equivalence checks below hold trivially there).
    fn graviola(k: &[u8; 32], u: &[u8; 32]) -> [u8; 32] {
        match Provider::graviola(k, u) {
            Some(answer) => answer.unwrap(),
            None => {
                eprintln!(
                    "skipped: this CPU cannot run graviola ({:?})",
                    Agreement::detect()
                );
                Provider::portable(k, u).unwrap()
            }
        }
    }

    /// RFC 7748 §5.2's two vectors (unclamped scalars, a u with its top
    /// bit set) and §6.1's exchange, by both agreements.
    #[test]
    fn both_agreements_give_rfc_7748s_answers() {
        let vectors = [
            (
                "a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
                "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
                "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552",
            ),
            (
                "4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
                "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
                "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957",
            ),
            // §6.1: Alice's private key, Bob's public key, their secret.
            (
                "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
                "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f",
                "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742",
            ),
            // §6.1: Bob's private key, Alice's public key, the same secret.
            (
                "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb",
                "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a",
                "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742",
            ),
        ];
        for (k, u, out) in vectors {
            let (k, u, out) = (hex32(k), hex32(u), hex32(out));
            assert_eq!(
                Provider::portable(&k, &u).unwrap(),
                out,
                "portable, k={k:02x?}"
            );
            assert_eq!(graviola(&k, &u), out, "graviola, k={k:02x?}");
        }
    }

    /// Points of small order (and their non-canonical encodings) give an
    /// all-zero secret. graviola refuses those; the provider answers the
    /// crate's zeros instead, so a session behaves as it always did.
    #[test]
    fn low_order_points_answer_what_the_crate_answers() {
        let points = [
            "0000000000000000000000000000000000000000000000000000000000000000",
            "0100000000000000000000000000000000000000000000000000000000000000",
            "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
            "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
            "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        ];
        let k = hex32("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4");
        for u in points {
            let u = hex32(u);
            let own = Provider::portable(&k, &u).unwrap();
            assert_eq!(own, [0; 32], "the crate's answer for {u:02x?}");
            assert_eq!(graviola(&k, &u), own, "u = {u:02x?}");
            assert_eq!(
                Provider.x25519_agreement(&k, &u).unwrap(),
                own,
                "through the trait, u = {u:02x?}"
            );
        }
    }

    /// Every other primitive is the crate's own: the same bytes out.
    #[test]
    fn the_other_primitives_are_the_crates_own() {
        let (key, iv, nonce) = ([7u8; 32], [3u8; 16], [5u8; 12]);
        let text = b"Stand-up at 10:00 in the usual room.";
        let (mut ours, mut own) = (Vec::new(), Vec::new());
        Provider
            .aes_256_cbc_encrypt(&key, &iv, text, &mut ours)
            .unwrap();
        OWN.aes_256_cbc_encrypt(&key, &iv, text, &mut own).unwrap();
        assert_eq!(ours, own);
        let (mut ours, mut own) = (Vec::new(), Vec::new());
        Provider
            .aes_256_gcm_encrypt(&key, &nonce, b"aad", text, &mut ours)
            .unwrap();
        OWN.aes_256_gcm_encrypt(&key, &nonce, b"aad", text, &mut own)
            .unwrap();
        assert_eq!(ours, own);
        let mut opened = Vec::new();
        Provider
            .aes_256_gcm_decrypt(&key, &nonce, b"aad", &ours, &mut opened)
            .unwrap();
        assert_eq!(opened, text);
        assert_eq!(
            Provider.hmac_sha256_two_part(&key, b"first", b"second"),
            OWN.hmac_sha256(&key, b"firstsecond")
        );
    }

    /// Installing is once per process and idempotent, and says why when
    /// the crate's own ladder runs.
    #[test]
    fn install_answers_the_same_every_time() {
        let first = install();
        assert_eq!(install(), first);
        assert_eq!(in_use(), first);
        match (Agreement::detect(), first) {
            (Agreement::Graviola, Agreement::Graviola) => {}
            // Another test of this binary did Signal work first.
            (Agreement::Graviola, Agreement::Portable(why)) => {
                assert_eq!(why, "a provider was already set in this process")
            }
            (Agreement::Portable(_), answer) => assert_eq!(answer, Agreement::detect()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]
        /// Any private key against any 32 bytes as a public key (top bit
        /// set, u at or above p included): graviola and the crate's ladder
        /// agree byte for byte.
        #[test]
        fn graviola_agrees_with_the_crate_on_any_keys(
            k in proptest::array::uniform32(any::<u8>()),
            u in proptest::array::uniform32(any::<u8>()),
        ) {
            prop_assert_eq!(graviola(&k, &u), Provider::portable(&k, &u).unwrap());
        }

        /// The same for u near p = 2^255 - 19, where reduction matters.
        #[test]
        fn graviola_agrees_with_the_crate_near_p(
            k in proptest::array::uniform32(any::<u8>()),
            low in 0u8..=40,
            top in any::<bool>(),
        ) {
            let mut u = [0xff; 32];
            u[0] = 0xd0 + low % 0x30;
            u[31] = if top { 0xff } else { 0x7f };
            prop_assert_eq!(graviola(&k, &u), Provider::portable(&k, &u).unwrap());
        }
    }
}
