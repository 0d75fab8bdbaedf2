//! Linking by phone number (pair code), the phone's side: the companion's
//! `companion_hello` (its ephemeral key wrapped with the code it shows),
//! the code typed on the phone, and the key bundle the companion then
//! sends, which only the right code opens.

use super::nodes::{child_bytes, SERVER};
use super::phone::{key_pair, pub32, Qr};
use whatsapp_rust::wacore::libsignal::protocol::{KeyPair, PublicKey};
use whatsapp_rust::wacore::pair_code::PairCodeUtils;
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::Node;

/// A pair-code request (`companion_hello`) waiting for the phone.
pub(super) struct PairCodeRequest {
    pub conn: u64,
    /// The phone number the companion asked to link to.
    pub jid: String,
    pub reference: Vec<u8>,
    /// The companion's ephemeral key, wrapped with the code.
    pub wrapped_ephemeral: Vec<u8>,
    /// The companion's Noise key (`companion_server_auth_key_pub`).
    pub noise_key: [u8; 32],
    /// Once the phone has read the code: its ephemeral key pair and the
    /// companion's ephemeral key as the code unwrapped it.
    pub typed: Option<(KeyPair, [u8; 32])>,
}

/// Stage 1: the request `f` came on `conn`; answers it and the body of the
/// server's reply (the pairing ref).
pub(super) fn hello(conn: u64, f: &Node) -> (PairCodeRequest, Node) {
    let attr = |n: &Node, k: &str| n.attrs.get(k).map(|v| v.to_string());
    let reference = format!("fake-link-{conn}-{:x}", rand::random::<u32>()).into_bytes();
    let request = PairCodeRequest {
        conn,
        jid: attr(f, "jid").unwrap_or_default(),
        reference: reference.clone(),
        wrapped_ephemeral: child_bytes(f, "link_code_pairing_wrapped_companion_ephemeral_pub"),
        noise_key: child_bytes(f, "companion_server_auth_key_pub")
            .try_into()
            .unwrap_or([0; 32]),
        typed: None,
    };
    let body = NodeBuilder::new("link_code_companion_reg")
        .children([NodeBuilder::new("link_code_pairing_ref")
            .bytes(reference)
            .build()])
        .build();
    (request, body)
}

/// The phone's user types `code` for the newest request to `mine`: the
/// phone unwraps the companion's ephemeral key with it and answers with
/// its own, wrapped with the same code. Answers the companion's connection
/// and the `primary_hello` notification (stanza id `id`) for it.
pub(super) fn typed(
    requests: &mut [PairCodeRequest],
    mine: &str,
    code: &str,
    phone: &KeyPair,
    id: String,
) -> Result<(u64, Node), String> {
    let code: String = code
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_uppercase();
    let r = requests
        .iter_mut()
        .rev()
        .find(|r| r.jid == mine)
        .ok_or("no pair-code request for this phone's number")?;
    let companion_eph = PairCodeUtils::decrypt_primary_ephemeral_pub(&r.wrapped_ephemeral, &code)
        .map_err(|e| e.to_string())?;
    let primary_eph = key_pair();
    let wrapped = PairCodeUtils::encrypt_ephemeral_pub(&pub32(&primary_eph), &code);
    r.typed = Some((primary_eph, companion_eph));
    let node = NodeBuilder::new("notification")
        .attr("from", SERVER)
        .attr("type", "link_code_companion_reg")
        .attr("id", id)
        .attr("t", chrono::Utc::now().timestamp().to_string())
        .children([NodeBuilder::new("link_code_companion_reg")
            .attr("stage", "primary_hello")
            .children([
                NodeBuilder::new("link_code_pairing_wrapped_primary_ephemeral_pub")
                    .bytes(wrapped.to_vec())
                    .build(),
                NodeBuilder::new("primary_identity_pub")
                    .bytes(pub32(phone).to_vec())
                    .build(),
                NodeBuilder::new("link_code_pairing_ref")
                    .bytes(r.reference.clone())
                    .build(),
            ])
            .build()])
        .build();
    Ok((r.conn, node))
}

/// The phone's side of `companion_finish`: what a scanned QR would have
/// given it (ref, keys and the ADV secret). `phone` is its identity.
pub(super) fn open_key_bundle(
    requests: &[PairCodeRequest],
    phone: &KeyPair,
    f: &Node,
) -> Result<Qr, String> {
    use whatsapp_rust::wacore::crypto::hkdf_sha256_into;
    use whatsapp_rust::wacore::libsignal::crypto::aes_256_gcm_decrypt;
    let reference = child_bytes(f, "link_code_pairing_ref");
    let r = requests
        .iter()
        .find(|r| r.reference == reference)
        .ok_or("unknown pairing ref")?;
    let (primary_eph, companion_eph) = r.typed.as_ref().ok_or("the code was not entered")?;
    let companion_identity: [u8; 32] = child_bytes(f, "companion_identity_public")
        .try_into()
        .map_err(|_| "companion identity is not 32 bytes")?;
    let wrapped = child_bytes(f, "link_code_pairing_wrapped_key_bundle");
    if wrapped.len() < 32 + 12 + 16 {
        return Err("key bundle too short".into());
    }
    let agree = |kp: &KeyPair, with: &[u8; 32]| -> Result<Vec<u8>, String> {
        let pk = PublicKey::from_djb_public_key_bytes(with).map_err(|e| e.to_string())?;
        Ok(kp
            .private_key
            .calculate_agreement(&pk)
            .map_err(|e| e.to_string())?
            .to_vec())
    };
    let eph_shared = agree(primary_eph, companion_eph)?;
    let mut key = [0u8; 32];
    hkdf_sha256_into(
        &eph_shared,
        Some(&wrapped[..32]),
        b"link_code_pairing_key_bundle_encryption_key",
        &mut key,
    )
    .map_err(|e| format!("{e:?}"))?;
    let iv: [u8; 12] = wrapped[32..44].try_into().expect("12 bytes");
    let mut bundle = Vec::new();
    aes_256_gcm_decrypt(&key, &iv, b"", &wrapped[44..], &mut bundle)
        .map_err(|_| "the key bundle does not open: wrong code")?;
    if bundle.len() != 96 || bundle[..32] != companion_identity || bundle[32..64] != pub32(phone) {
        return Err("the key bundle names other keys".into());
    }
    let id_shared = agree(phone, &companion_identity)?;
    let mut secret_input = eph_shared;
    secret_input.extend_from_slice(&id_shared);
    secret_input.extend_from_slice(&bundle[64..96]);
    let mut adv_secret = [0u8; 32];
    hkdf_sha256_into(&secret_input, None, b"adv_secret", &mut adv_secret)
        .map_err(|e| format!("{e:?}"))?;
    Ok(Qr {
        reference: String::from_utf8_lossy(&reference).into_owned(),
        noise_key: r.noise_key,
        identity_key: companion_identity,
        adv_secret,
    })
}
