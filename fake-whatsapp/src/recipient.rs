//! The members' devices as recipients: each holds the Signal keys its
//! pre-key bundle handed out and decrypts what the sender's client sends
//! it, as a phone would: its pairwise message (`pkmsg`, then `msg`)
//! carrying the group's sender key, then the group message (`skmsg`) with
//! that key. What they read is what the tests compare with the reminder; a
//! message a device cannot decrypt is reported, not ignored.
//!
//! The same state sends, when a member's phone votes on a poll (see
//! `votes`): its own sender key for the group, and pairwise messages to a
//! device of the account's on the session they share, or on a new one
//! from that device's uploaded pre-keys. One Signal state per device for
//! both directions, as a phone has: a session the account's client
//! changes (a new `pkmsg`) is the session the member's reply uses.

use super::nodes::child_bytes;
use super::nodes::group_part;
use super::phone::DeviceKeys;
use std::collections::HashMap;
use std::sync::Arc;
use whatsapp_rust::wacore::libsignal::protocol::{
    create_sender_key_distribution_message, group_decrypt, group_encrypt, message_decrypt_prekey,
    message_decrypt_signal, message_encrypt, process_prekey_bundle,
    process_sender_key_distribution_message, CiphertextMessage, Direction, GenericSignedPreKey,
    IdentityChange, IdentityKey, IdentityKeyPair, IdentityKeyStore, PreKeyBundle, PreKeyId,
    PreKeyRecord, PreKeySignalMessage, PreKeyStore, ProtocolAddress, PublicKey,
    SenderKeyDistributionMessage, SenderKeyName, SenderKeyRecord, SenderKeyStore, SessionRecord,
    SessionStore, SignalMessage, SignalProtocolError, SignedPreKeyId, SignedPreKeyRecord,
    SignedPreKeyStore, Timestamp, UsePQRatchet,
};
use whatsapp_rust::wacore_binary::{Node, NodeContent};
use whatsapp_rust::waproto::whatsapp as wa;

type SignalResult<T> = Result<T, SignalProtocolError>;

/// What a message's recipients read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decrypted {
    /// `text`, `image`, `revoke`, `edit`, `poll`, `vote` or `other`.
    pub kind: String,
    /// The text, or a picture's caption, or an edit's new text, or a
    /// poll's question.
    pub text: Option<String>,
    /// The message a revoke, an edit or a vote names.
    pub refers_to: Option<String>,
    /// A poll's options, in order.
    pub options: Vec<String>,
    /// How many of a poll's options a voter may select (0: any number).
    pub selectable: u32,
    /// A poll's secret (`message_context_info.message_secret`): its votes
    /// are encrypted with it.
    pub secret: Option<Vec<u8>>,
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
            match device.open(skmsg, &name) {
                Ok(m) => {
                    let read = read(&m);
                    if out.devices > 0 && (read.kind != out.kind || read.text != out.text) {
                        out.failures
                            .push(format!("{jid}: read {read:?}, others {:?}", out.text));
                    }
                    out = Decrypted {
                        devices: out.devices + 1,
                        failures: std::mem::take(&mut out.failures),
                        ..read
                    };
                }
                Err(e) => out.failures.push(format!("{jid}: {e}")),
            }
        }
        out
    }

    /// The device `jid`'s Signal state, made from its keys on first use.
    fn device(&mut self, jid: &str, keys_of: impl Fn(&str) -> Arc<DeviceKeys>) -> &mut Device {
        self.devices
            .entry(jid.to_owned())
            .or_insert_with(|| Device::new(keys_of(jid)))
    }

    /// What the device `jid` sends to `group`: its sender key for the
    /// group as a distribution message (the key is made on its first
    /// send), then `padded` encrypted with it (`skmsg`). The distribution
    /// message is taken first, so it opens the very message encrypted
    /// after it.
    pub(super) fn seal_group(
        &mut self,
        jid: &str,
        group: &str,
        padded: &[u8],
        keys_of: impl Fn(&str) -> Arc<DeviceKeys>,
    ) -> Result<(Vec<u8>, Vec<u8>), String> {
        let device = self.device(jid, keys_of);
        let name = SenderKeyName::from_parts(group, jid);
        let mut rng = rand::rng();
        let skdm = ready(create_sender_key_distribution_message(
            &name,
            &mut device.sender_keys,
            &mut rng,
        ))
        .map_err(|e| format!("{jid}: sender key: {e}"))?;
        let skmsg = ready(group_encrypt(
            &mut device.sender_keys,
            &name,
            padded,
            &mut rng,
        ))
        .map_err(|e| format!("{jid}: group message: {e}"))?;
        Ok((skdm.serialized().to_vec(), skmsg.serialized().to_vec()))
    }

    /// `padded` from the device `jid` to the device `to` (named as
    /// [`Self::receive`] names a sender, `user:N`): on the session the two
    /// share (`msg`; `pkmsg` while `to` has not answered one the device
    /// opened), else on a new one from `to`'s pre-key bundle, as a phone
    /// opens one. Answers the `enc` type and the bytes.
    pub(super) fn seal_pairwise(
        &mut self,
        jid: &str,
        to: &str,
        padded: &[u8],
        bundle: impl FnOnce() -> Option<Result<PreKeyBundle, String>>,
        keys_of: impl Fn(&str) -> Arc<DeviceKeys>,
    ) -> Result<(&'static str, Vec<u8>), String> {
        let device = self.device(jid, keys_of);
        let address = ProtocolAddress::new(to, 0.into());
        if !device.sessions.0.contains_key(&address.to_string()) {
            let bundle = bundle()
                .ok_or_else(|| format!("{jid}: no session with {to}, and it uploaded no keys"))?
                .map_err(|e| format!("{jid}: the keys of {to}: {e}"))?;
            ready(process_prekey_bundle(
                &address,
                &mut device.sessions,
                &mut device.identity,
                &bundle,
                &mut rand::rng(),
                UsePQRatchet::No,
            ))
            .map_err(|e| format!("{jid}: a session with {to}: {e}"))?;
        }
        let sealed = ready(message_encrypt(
            padded,
            &address,
            &mut device.sessions,
            &mut device.identity,
        ))
        .map_err(|e| format!("{jid}: to {to}: {e}"))?;
        match sealed {
            CiphertextMessage::SignalMessage(m) => Ok(("msg", m.serialized().to_vec())),
            CiphertextMessage::PreKeySignalMessage(m) => Ok(("pkmsg", m.serialized().to_vec())),
            _ => Err(format!("{jid}: to {to}: not a pairwise message")),
        }
    }
}

/// The pre-key bundle in a `<user>` node (as a pre-key answer carries it,
/// and [`super::external::Externals::bundle`] makes it) of a device
/// numbered `device`.
pub(super) fn bundle_of(user: &Node, device: u32) -> Result<PreKeyBundle, String> {
    let key32 = |node: &Node, tag: &str| -> Result<PublicKey, String> {
        let b = child_bytes(node, tag);
        PublicKey::from_djb_public_key_bytes(&b).map_err(|e| format!("{tag}: {e}"))
    };
    // Ids are 3 bytes, big-endian.
    let id = |node: &Node| {
        child_bytes(node, "id")
            .iter()
            .fold(0u32, |n, b| (n << 8) | u32::from(*b))
    };
    let registration: [u8; 4] = child_bytes(user, "registration")
        .try_into()
        .map_err(|_| "registration: not 4 bytes")?;
    let identity = IdentityKey::new(key32(user, "identity")?);
    let one_time = match user.get_optional_child("key") {
        Some(k) => Some((id(k).into(), key32(k, "value")?)),
        None => None,
    };
    let signed = user
        .get_optional_child("skey")
        .ok_or("no signed pre-key (skey)")?;
    PreKeyBundle::new(
        u32::from_be_bytes(registration),
        device.into(),
        one_time,
        id(signed).into(),
        key32(signed, "value")?,
        child_bytes(signed, "signature"),
        identity,
    )
    .map_err(|e| e.to_string())
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

/// What a decrypted message says (no devices counted yet).
fn read(m: &wa::Message) -> Decrypted {
    let said = |kind: &str, text: Option<String>, refers_to: Option<String>| Decrypted {
        kind: kind.into(),
        text,
        refers_to,
        ..Decrypted::default()
    };
    if let Some(p) = m.protocol_message.as_option() {
        let refers_to = p.key.as_option().and_then(|k| k.id.clone());
        if let Some(edited) = p.edited_message.as_option() {
            return said("edit", read(edited).text, refers_to);
        }
        return said("revoke", None, refers_to);
    }
    // Version 3 is WhatsApp's single-choice poll; 1 and 2 say their count.
    let polls = [
        (m.poll_creation_message_v3.as_option(), 1),
        (m.poll_creation_message.as_option(), 0),
        (m.poll_creation_message_v2.as_option(), 0),
    ];
    if let Some((p, default)) = polls.into_iter().find_map(|(p, d)| Some((p?, d))) {
        return Decrypted {
            options: p
                .options
                .iter()
                .filter_map(|o| o.option_name.clone())
                .collect(),
            selectable: p.selectable_options_count.unwrap_or(default),
            secret: m
                .message_context_info
                .as_option()
                .and_then(|c| c.message_secret.clone()),
            ..said("poll", p.name.clone(), None)
        };
    }
    if let Some(v) = m.poll_update_message.as_option() {
        let poll = v.poll_creation_message_key.as_option();
        return said("vote", None, poll.and_then(|k| k.id.clone()));
    }
    if let Some(t) = &m.conversation {
        return said("text", Some(t.clone()), None);
    }
    if let Some(t) = m.extended_text_message.as_option() {
        return said("text", t.text.clone(), None);
    }
    if let Some(i) = m.image_message.as_option() {
        return said("image", i.caption.clone(), None);
    }
    said("other", None, None)
}

impl Recipients {
    /// What the device `jid` reads in a group message `sender` sent to
    /// `group`, with the sender key it took before.
    #[cfg(test)]
    pub(super) fn open(
        &mut self,
        jid: &str,
        group: &str,
        sender: &str,
        skmsg: &[u8],
    ) -> Result<wa::Message, String> {
        let device = self.devices.get_mut(jid).ok_or("no such device")?;
        device.open(skmsg, &SenderKeyName::from_parts(group, sender))
    }
}

impl Device {
    /// Decrypts a group message with the sender key `name`.
    fn open(&mut self, skmsg: &[u8], name: &SenderKeyName) -> Result<wa::Message, String> {
        let padded =
            ready(group_decrypt(skmsg, &mut self.sender_keys, name)).map_err(|e| e.to_string())?;
        whatsapp_rust::wacore::messages::decode_plaintext(&padded, 2).map_err(|e| e.to_string())
    }

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
    fn a_poll_reads_as_its_question_options_count_and_secret() {
        use whatsapp_rust::buffa::MessageField;
        let option = |n: &str| wa::message::poll_creation_message::Option {
            option_name: Some(n.into()),
            option_hash: None,
        };
        let poll = wa::message::PollCreationMessage {
            name: Some("Coming?".into()),
            options: vec![option("Yes"), option("No")],
            ..Default::default()
        };
        let m = wa::Message {
            poll_creation_message_v3: MessageField::some(poll.clone()),
            message_context_info: MessageField::some(wa::MessageContextInfo {
                message_secret: Some(vec![7; 32]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = read(&m);
        assert_eq!(r.kind, "poll");
        assert_eq!(r.text.as_deref(), Some("Coming?"));
        assert_eq!(r.options, ["Yes", "No"]);
        // Version 3 is single choice when it does not say.
        assert_eq!((r.selectable, r.secret), (1, Some(vec![7; 32])));
        let m = wa::Message {
            poll_creation_message: MessageField::some(wa::message::PollCreationMessage {
                selectable_options_count: Some(2),
                ..poll
            }),
            ..Default::default()
        };
        let r = read(&m);
        assert_eq!((r.kind.as_str(), r.selectable, r.secret), ("poll", 2, None));
    }

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
