//! The fake server's phone and key material: the operator's phone that
//! scans QR codes and signs device links, the QR payload, and the Signal keys
//! of group members' devices handed out in pre-key bundles.

use super::nodes::SERVER;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use std::sync::Mutex;
use whatsapp_rust::buffa::Message as _;
use whatsapp_rust::wacore::libsignal::crypto::hmac_sha256;
use whatsapp_rust::wacore::libsignal::protocol::{KeyPair, PublicKey};
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::Node;
use whatsapp_rust::waproto::whatsapp as wa;

/// A fresh X25519 / XEdDSA key pair.
pub fn key_pair() -> KeyPair {
    KeyPair::generate(&mut rand::rng())
}

pub(super) fn pub32(kp: &KeyPair) -> [u8; 32] {
    kp.public_key
        .public_key_bytes()
        .try_into()
        .expect("X25519 public keys are 32 bytes")
}

/// XEdDSA signature by `kp` (what the phone's identity key does).
pub fn sign(kp: &KeyPair, message: &[u8]) -> Vec<u8> {
    let mut rng = rand::rng();
    kp.private_key
        .calculate_signature(message, &mut rng)
        .expect("signing")
        .to_vec()
}

/// A decoded pairing QR code: `ref,noise,identity,adv_secret,client_type`,
/// bare or as `https://wa.me/settings/linked_devices#…`.
#[derive(Debug, Clone)]
pub struct Qr {
    pub reference: String,
    pub noise_key: [u8; 32],
    pub identity_key: [u8; 32],
    pub adv_secret: [u8; 32],
}

impl Qr {
    pub fn parse(code: &str) -> Result<Self, String> {
        let b64 = |s: &str| -> Result<[u8; 32], String> {
            STANDARD
                .decode(s)
                .map_err(|e| format!("{s}: not standard base64 with padding ({e})"))?
                .try_into()
                .map_err(|_| format!("{s}: not 32 bytes"))
        };
        // WhatsApp Web's newer QR codes are a link to the phone's Linked
        // devices page with the payload as its fragment (Baileys 7 shows
        // that form; whatsapp-rust the bare payload).
        let code = code
            .strip_prefix("https://wa.me/settings/linked_devices#")
            .unwrap_or(code);
        let f: Vec<&str> = code.split(',').collect();
        if f.len() < 4 {
            return Err(format!("a QR code has at least 4 fields: {code}"));
        }
        Ok(Self {
            reference: f[0].to_owned(),
            noise_key: b64(f[1])?,
            identity_key: b64(f[2])?,
            adv_secret: b64(f[3])?,
        })
    }
}

/// The operator's phone: the primary device of the account Herald links to.
pub struct Phone {
    pub user: String,
    pub lid: String,
    pub identity: KeyPair,
    /// The device number given to the next linked device.
    pub(super) next_device: Mutex<u32>,
}

impl Phone {
    pub fn new(user: &str, lid: &str) -> Self {
        Self {
            user: user.to_owned(),
            lid: lid.to_owned(),
            identity: key_pair(),
            next_device: Mutex::new(5),
        }
    }

    /// The `<pair-success>` stanza the server relays when this phone
    /// scans `qr`, linking the next device number.
    pub(super) fn pair_success(&self, qr: &Qr, id: &str) -> (Node, u32) {
        let device = {
            let mut n = self.next_device.lock().unwrap();
            *n += 1;
            *n
        };
        let who = Primary {
            user: &self.user,
            lid: Some(&self.lid),
            identity: &self.identity,
            name: "Herald test",
        };
        (pair_success(&who, qr, id, device), device)
    }
}

/// The primary device (a phone) of the account a new device links to.
pub(super) struct Primary<'a> {
    pub user: &'a str,
    pub lid: Option<&'a str>,
    pub identity: &'a KeyPair,
    /// The push name the new device is given.
    pub name: &'a str,
}

/// The `<pair-success>` stanza the server relays when `phone` scans `qr`:
/// the new device's identity signed by the phone's account key, and HMAC'd
/// with the secret only the QR code carries.
pub(super) fn pair_success(phone: &Primary, qr: &Qr, id: &str, device: u32) -> Node {
    let details = wa::ADVDeviceIdentity {
        raw_id: Some(rand::random()),
        timestamp: Some(chrono::Utc::now().timestamp() as u64),
        key_index: Some(device),
        ..Default::default()
    }
    .encode_to_vec();
    let mut to_sign = vec![6u8, 0];
    to_sign.extend_from_slice(&details);
    to_sign.extend_from_slice(&qr.identity_key);
    let signed = wa::ADVSignedDeviceIdentity {
        details: Some(details),
        account_signature_key: Some(pub32(phone.identity).to_vec()),
        account_signature: Some(sign(phone.identity, &to_sign)),
        ..Default::default()
    }
    .encode_to_vec();
    let container = wa::ADVSignedDeviceIdentityHMAC {
        hmac: Some(hmac_sha256(&qr.adv_secret, &signed).to_vec()),
        details: Some(signed),
        ..Default::default()
    }
    .encode_to_vec();
    let mut device_node =
        NodeBuilder::new("device").attr("jid", format!("{}:{device}@s.whatsapp.net", phone.user));
    if let Some(lid) = phone.lid {
        device_node = device_node.attr("lid", format!("{lid}:{device}@lid"));
    }
    NodeBuilder::new("iq")
        .attr("from", SERVER)
        .attr("type", "set")
        .attr("id", id.to_owned())
        .attr("xmlns", "md")
        .children([NodeBuilder::new("pair-success")
            .children([
                NodeBuilder::new("device-identity").bytes(container).build(),
                device_node.build(),
                // A business name gives the device its push name, as
                // WhatsApp does for business accounts.
                NodeBuilder::new("biz").attr("name", phone.name).build(),
                NodeBuilder::new("platform").attr("name", "android").build(),
            ])
            .build()])
        .build()
}

/// Checks the device's counter-signature in its `pair-device-sign` answer:
/// the device proves it holds the identity key the QR showed, over the
/// details the phone `identity` signed.
pub(super) fn verify_device_signature(
    identity: &KeyPair,
    qr: &Qr,
    signed: &[u8],
) -> Result<(), String> {
    let s = wa::ADVSignedDeviceIdentity::decode_from_slice(signed)
        .map_err(|e| format!("pair-device-sign: {e}"))?;
    let details = s.details.unwrap_or_default();
    let mut msg = vec![6u8, 1];
    msg.extend_from_slice(&details);
    msg.extend_from_slice(&qr.identity_key);
    msg.extend_from_slice(&pub32(identity));
    let key = PublicKey::from_djb_public_key_bytes(&qr.identity_key)
        .map_err(|e| format!("device identity key: {e}"))?;
    if key.verify_signature(&msg, s.device_signature.as_deref().unwrap_or_default()) {
        Ok(())
    } else {
        Err("the device signature does not verify".into())
    }
}

/// Signal keys of one device of a group member, as the server hands them
/// out in pre-key bundles.
pub(super) struct DeviceKeys {
    pub(super) registration_id: u32,
    pub(super) identity: KeyPair,
    pub(super) signed_pre_key: KeyPair,
    pub(super) signature: Vec<u8>,
}

impl DeviceKeys {
    pub(super) fn new(identity: KeyPair) -> Self {
        let signed_pre_key = key_pair();
        let signature = sign(&identity, &signed_pre_key.public_key.serialize());
        Self {
            registration_id: rand::random::<u32>() & 0x3fff,
            identity,
            signed_pre_key,
            signature,
        }
    }

    pub(super) fn bundle(&self, jid: &str) -> Node {
        NodeBuilder::new("user")
            .attr("jid", jid.to_owned())
            .children([
                NodeBuilder::new("registration")
                    .bytes(self.registration_id.to_be_bytes().to_vec())
                    .build(),
                NodeBuilder::new("type").bytes(vec![5u8]).build(),
                NodeBuilder::new("identity")
                    .bytes(pub32(&self.identity).to_vec())
                    .build(),
                NodeBuilder::new("skey")
                    .children([
                        NodeBuilder::new("id").bytes(vec![0u8, 0, 1]).build(),
                        NodeBuilder::new("value")
                            .bytes(pub32(&self.signed_pre_key).to_vec())
                            .build(),
                        NodeBuilder::new("signature")
                            .bytes(self.signature.clone())
                            .build(),
                    ])
                    .build(),
            ])
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key as the clients write it: standard base64, with its padding.
    fn key(byte: u8) -> String {
        STANDARD.encode([byte; 32])
    }

    #[test]
    fn a_qr_code_takes_standard_base64_with_padding_only() {
        let code = format!("ref,{},{},{}", key(1), key(2), key(0xfb));
        let qr = Qr::parse(&code).unwrap();
        assert_eq!(qr.adv_secret, [0xfb; 32]);
        // The URL-safe alphabet ('-', '_') is not the QR code's, and the
        // padding is part of it.
        let url_safe = key(0xfb).replace('+', "-").replace('/', "_");
        assert_ne!(url_safe, key(0xfb));
        let unpadded = key(1).trim_end_matches('=').to_owned();
        for bad in [url_safe, unpadded] {
            let code = format!("ref,{},{},{bad}", key(1), key(2));
            let e = Qr::parse(&code).unwrap_err();
            assert!(e.contains("not standard base64"), "{bad}: {e}");
        }
    }
}
