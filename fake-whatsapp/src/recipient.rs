//! The members' devices as recipients: each holds the Signal keys its
//! pre-key bundle handed out and decrypts what the sender's client sends
//! it, as a phone would: its pairwise message (`pkmsg`, then `msg`)
//! carrying the group's sender key, then the group message (`skmsg`) with
//! that key. What they read is what the tests compare with the reminder; a
//! message a device cannot decrypt is reported, not ignored.

use super::nodes::group_part;
use super::phone::DeviceKeys;
use std::collections::HashMap;
use std::sync::Arc;
use whatsapp_rust::wacore::libsignal::protocol::{
    group_decrypt, message_decrypt_prekey, message_decrypt_signal,
    process_sender_key_distribution_message, Direction, GenericSignedPreKey, IdentityChange,
    IdentityKey, IdentityKeyPair, IdentityKeyStore, PreKeyId, PreKeyRecord, PreKeySignalMessage,
    PreKeyStore, ProtocolAddress, SenderKeyDistributionMessage, SenderKeyName, SenderKeyRecord,
    SenderKeyStore, SessionRecord, SessionStore, SignalMessage, SignalProtocolError,
    SignedPreKeyId, SignedPreKeyRecord, SignedPreKeyStore, Timestamp, UsePQRatchet,
};
use whatsapp_rust::wacore_binary::{Node, NodeContent};
use whatsapp_rust::waproto::whatsapp as wa;

type SignalResult<T> = Result<T, SignalProtocolError>;

/// What a message's recipients read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decrypted {
    /// `text`, `image`, `revoke`, `edit` or `other`.
    pub kind: String,
    /// The text, or a picture's caption, or an edit's new text.
    pub text: Option<String>,
    /// The message a revoke or an edit names.
    pub refers_to: Option<String>,
    /// Member devices that decrypted the group message.
    pub devices: usize,
    /// Why a device could not (its JID first).
    pub failures: Vec<String>,
}

/// One member device's Signal state, a store per family so one decrypt
/// can borrow them all at once.
struct Device {
    identity: Identity,
    signed: SignedPreKeys,
    sessions: Sessions,
    sender_keys: SenderKeys,
}

struct Identity {
    keys: Arc<DeviceKeys>,
    known: HashMap<String, IdentityKey>,
}
struct SignedPreKeys(Arc<DeviceKeys>);
#[derive(Default)]
struct Sessions(HashMap<String, SessionRecord>);
#[derive(Default)]
struct SenderKeys(HashMap<String, SenderKeyRecord>);
/// The bundles carry no one-time pre-keys.
struct NoPreKeys;

impl Device {
    fn new(keys: Arc<DeviceKeys>) -> Self {
        Self {
            identity: Identity {
                keys: keys.clone(),
                known: HashMap::new(),
            },
            signed: SignedPreKeys(keys),
            sessions: Sessions::default(),
            sender_keys: SenderKeys::default(),
        }
    }
}

/// Every member device's state, by device JID.
#[derive(Default)]
pub(super) struct Recipients {
    devices: HashMap<String, Device>,
}

/// The futures of stores in memory never wait.
fn ready<T>(f: impl std::future::Future<Output = T>) -> T {
    use futures_util::FutureExt;
    f.now_or_never()
        .expect("in-memory Signal stores never wait")
}

impl Recipients {
    /// Takes one group message: each `<to jid>` device's pairwise message
    /// (which hands it the sender's key), then the group message for
    /// every device of `members` that holds the sender's key.
    pub(super) fn receive(
        &mut self,
        group: &str,
        sender: &str,
        participants: &[(String, String, Vec<u8>)],
        skmsg: Option<&[u8]>,
        members: &[String],
        keys_of: impl Fn(&str) -> Arc<DeviceKeys>,
    ) -> Decrypted {
        let mut out = Decrypted::default();
        let address = ProtocolAddress::new(sender, 0.into());
        let name = SenderKeyName::from_parts(group, sender);
        for (jid, kind, bytes) in participants {
            let device = self
                .devices
                .entry(jid.clone())
                .or_insert_with(|| Device::new(keys_of(jid)));
            if let Err(e) = device.take_key(&address, &name, kind, bytes) {
                out.failures.push(format!("{jid}: {e}"));
            }
        }
        let Some(skmsg) = skmsg else {
            return out;
        };
        for jid in members {
            let Some(device) = self.devices.get_mut(jid) else {
                continue;
            };
            if !device.sender_keys.0.contains_key(name.cache_key()) {
                continue;
            }
            match ready(group_decrypt(skmsg, &mut device.sender_keys, &name))
                .map_err(|e| e.to_string())
                .and_then(|padded| {
                    whatsapp_rust::wacore::messages::decode_plaintext(&padded, 2)
                        .map_err(|e| e.to_string())
                }) {
                Ok(m) => {
                    let read = read(&m);
                    if out.devices > 0 && (read.0 != out.kind || read.1 != out.text) {
                        out.failures
                            .push(format!("{jid}: read {read:?}, others {:?}", out.text));
                    }
                    (out.kind, out.text, out.refers_to) = read;
                    out.devices += 1;
                }
                Err(e) => out.failures.push(format!("{jid}: {e}")),
            }
        }
        out
    }
}

/// A group message's parts: each `<participants><to>` device's pairwise
/// message (its JID as `pn` gives it, the `enc` type, the bytes), and the
/// group message (`skmsg`).
pub(super) type Pairwise = Vec<(String, String, Vec<u8>)>;

pub(super) fn parts(node: &Node, pn: impl Fn(&str) -> String) -> (Pairwise, Option<Vec<u8>>) {
    let attr = |n: &Node, k: &str| n.attrs.get(k).map(|v| v.to_string());
    let bytes = |n: &Node| match &n.content {
        Some(NodeContent::Bytes(b)) => b.to_vec(),
        _ => Vec::new(),
    };
    let pairwise = node
        .get_optional_child("participants")
        .and_then(|p| p.children())
        .unwrap_or_default()
        .iter()
        .filter_map(|to| {
            let enc = to.get_optional_child("enc")?;
            Some((pn(&attr(to, "jid")?), attr(enc, "type")?, bytes(enc)))
        })
        .collect();
    let skmsg = group_part(node).map(bytes);
    (pairwise, skmsg)
}

/// What a decrypted message says: (kind, text, the message it refers to).
fn read(m: &wa::Message) -> (String, Option<String>, Option<String>) {
    if let Some(p) = m.protocol_message.as_option() {
        let refers_to = p.key.as_option().and_then(|k| k.id.clone());
        if let Some(edited) = p.edited_message.as_option() {
            return ("edit".into(), read(edited).1, refers_to);
        }
        return ("revoke".into(), None, refers_to);
    }
    if let Some(t) = &m.conversation {
        return ("text".into(), Some(t.clone()), None);
    }
    if let Some(t) = m.extended_text_message.as_option() {
        return ("text".into(), t.text.clone(), None);
    }
    if let Some(i) = m.image_message.as_option() {
        return ("image".into(), i.caption.clone(), None);
    }
    ("other".into(), None, None)
}

impl Device {
    /// Decrypts a pairwise message and takes the sender key it carries.
    fn take_key(
        &mut self,
        from: &ProtocolAddress,
        name: &SenderKeyName,
        kind: &str,
        bytes: &[u8],
    ) -> Result<(), String> {
        let mut rng = rand::rng();
        let padded = match kind {
            "pkmsg" => {
                let m = PreKeySignalMessage::try_from(bytes).map_err(|e| e.to_string())?;
                ready(message_decrypt_prekey(
                    &m,
                    from,
                    &mut self.sessions,
                    &mut self.identity,
                    &mut NoPreKeys,
                    &self.signed,
                    &mut rng,
                    UsePQRatchet::No,
                ))
                .map_err(|e| e.to_string())?
                .plaintext
            }
            "msg" => {
                let m = SignalMessage::try_from(bytes).map_err(|e| e.to_string())?;
                ready(message_decrypt_signal(
                    &m,
                    from,
                    &mut self.sessions,
                    &mut self.identity,
                    &mut rng,
                ))
                .map_err(|e| e.to_string())?
                .plaintext
            }
            other => return Err(format!("a pairwise message of type {other}")),
        };
        let m = whatsapp_rust::wacore::messages::decode_plaintext(&padded, 2)
            .map_err(|e| e.to_string())?;
        let skdm = m
            .sender_key_distribution_message
            .as_option()
            .and_then(|d| d.axolotl_sender_key_distribution_message.clone())
            .ok_or("the pairwise message carries no sender key")?;
        let skdm =
            SenderKeyDistributionMessage::try_from(skdm.as_slice()).map_err(|e| e.to_string())?;
        ready(process_sender_key_distribution_message(
            name,
            &skdm,
            &mut self.sender_keys,
        ))
        .map_err(|e| e.to_string())
    }
}

#[whatsapp_rust::async_trait]
impl IdentityKeyStore for Identity {
    async fn get_identity_key_pair(&self) -> SignalResult<IdentityKeyPair> {
        Ok(IdentityKeyPair::from(self.keys.identity.clone()))
    }
    async fn get_local_registration_id(&self) -> SignalResult<u32> {
        Ok(self.keys.registration_id)
    }
    async fn save_identity(
        &mut self,
        address: &ProtocolAddress,
        identity: &IdentityKey,
    ) -> SignalResult<IdentityChange> {
        let old = self.known.insert(address.to_string(), *identity);
        Ok(IdentityChange::from_changed(
            old.is_some_and(|o| o != *identity),
        ))
    }
    async fn is_trusted_identity(
        &self,
        _address: &ProtocolAddress,
        _identity: &IdentityKey,
        _direction: Direction,
    ) -> SignalResult<bool> {
        Ok(true)
    }
    async fn get_identity(&self, address: &ProtocolAddress) -> SignalResult<Option<IdentityKey>> {
        Ok(self.known.get(&address.to_string()).copied())
    }
}

#[whatsapp_rust::async_trait]
impl PreKeyStore for NoPreKeys {
    async fn get_pre_key(&self, _id: PreKeyId) -> SignalResult<PreKeyRecord> {
        Err(SignalProtocolError::InvalidPreKeyId)
    }
    async fn save_pre_key(&mut self, _id: PreKeyId, _record: &PreKeyRecord) -> SignalResult<()> {
        Ok(())
    }
    async fn remove_pre_key(&mut self, _id: PreKeyId) -> SignalResult<()> {
        Ok(())
    }
}

#[whatsapp_rust::async_trait]
impl SignedPreKeyStore for SignedPreKeys {
    async fn get_signed_pre_key(&self, id: SignedPreKeyId) -> SignalResult<SignedPreKeyRecord> {
        // The bundle's `skey` has id 1.
        if u32::from(id) != 1 {
            return Err(SignalProtocolError::InvalidSignedPreKeyId);
        }
        Ok(SignedPreKeyRecord::new(
            id,
            Timestamp::from_epoch_millis(0),
            &self.0.signed_pre_key,
            &self.0.signature,
        ))
    }
    async fn save_signed_pre_key(
        &mut self,
        _id: SignedPreKeyId,
        _record: &SignedPreKeyRecord,
    ) -> SignalResult<()> {
        Ok(())
    }
}

#[whatsapp_rust::async_trait]
impl SessionStore for Sessions {
    async fn load_session(&self, address: &ProtocolAddress) -> SignalResult<Option<SessionRecord>> {
        Ok(self.0.get(&address.to_string()).cloned())
    }
    async fn has_session(&self, address: &ProtocolAddress) -> SignalResult<bool> {
        Ok(self.0.contains_key(&address.to_string()))
    }
    async fn store_session(
        &mut self,
        address: &ProtocolAddress,
        record: SessionRecord,
    ) -> SignalResult<()> {
        self.0.insert(address.to_string(), record);
        Ok(())
    }
}

#[whatsapp_rust::async_trait]
impl SenderKeyStore for SenderKeys {
    async fn store_sender_key(
        &mut self,
        name: &SenderKeyName,
        record: SenderKeyRecord,
    ) -> SignalResult<()> {
        self.0.insert(name.cache_key().to_owned(), record);
        Ok(())
    }
    async fn load_sender_key(&self, name: &SenderKeyName) -> SignalResult<Option<SenderKeyRecord>> {
        Ok(self.0.get(name.cache_key()).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phone::key_pair;

    #[test]
    fn a_message_no_device_can_decrypt_is_reported_not_ignored() {
        let mut r = Recipients::default();
        let member = "15550001@s.whatsapp.net".to_owned();
        let got = r.receive(
            "120363000000000001@g.us",
            "15559999:7",
            &[(member.clone(), "pkmsg".into(), vec![3, 1, 4, 1, 5])],
            Some(&[9, 2, 6][..]),
            std::slice::from_ref(&member),
            |_| Arc::new(DeviceKeys::new(key_pair())),
        );
        assert_eq!(got.devices, 0);
        assert_eq!(got.failures.len(), 1, "{got:?}");
        assert!(got.failures[0].starts_with(&member), "{got:?}");
        // A pairwise message of a kind no phone takes.
        let got = r.receive(
            "120363000000000001@g.us",
            "15559999:7",
            &[(member.clone(), "frag".into(), vec![1])],
            None,
            &[],
            |_| Arc::new(DeviceKeys::new(key_pair())),
        );
        assert!(got.failures[0].contains("frag"), "{got:?}");
    }
}
