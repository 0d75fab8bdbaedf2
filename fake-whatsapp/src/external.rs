//! Member devices from outside: a client of its own (Baileys, in the tests)
//! that registers with the fake, is linked by a group member's phone,
//! uploads its pre-keys, and from then on gets what WhatsApp relays to a
//! member's device when someone sends to the group: the group message
//! (`skmsg`) and, when the sender hands it the group's sender key, the
//! pairwise message addressed to that device. Its receipts go back to the
//! sender; its retry requests are recorded.
//!
//! The server never decrypts what it relays: whether the device can read
//! it is the device's business, which is the point of bringing one in.

use super::nodes::{child_bytes, group_part};
use std::collections::{HashMap, VecDeque};
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::Node;

/// A device linked to a group member by the fake, run by another client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalDevice {
    /// The member's phone number.
    pub user: String,
    pub device: u32,
    /// The device's identity key (from its QR), verified by its signature.
    pub identity_key: [u8; 32],
}

impl ExternalDevice {
    pub fn jid(&self) -> String {
        device_jid(&self.user, self.device)
    }
}

/// `user@s.whatsapp.net` for a phone (device 0), `user:N@…` for a companion.
pub(super) fn device_jid(user: &str, device: u32) -> String {
    match device {
        0 => format!("{user}@s.whatsapp.net"),
        d => format!("{user}:{d}@s.whatsapp.net"),
    }
}

/// A member's LID (the number WhatsApp addresses it by in LID groups and
/// that newer clients, Baileys 7 among them, encrypt to): the fake makes
/// one from the phone number.
pub(super) fn member_lid(user: &str) -> String {
    format!("7{user}")
}

/// `jid` in phone-number form: a LID device JID (`7155…:22@lid`) becomes
/// the member's `155…:22@s.whatsapp.net`, the account's own LID
/// (`account.1`) its phone number (`account.0`); others stay as they are.
pub(super) fn pn_jid(jid: &str, account: (&str, &str)) -> String {
    let Some(addr) = jid.strip_suffix("@lid") else {
        return jid.to_owned();
    };
    let (user, device) = match addr.split_once(':') {
        Some((u, d)) => (u, d.parse().unwrap_or(0)),
        None => (addr, 0),
    };
    let pn = if user == account.1 {
        account.0
    } else {
        user.strip_prefix('7').unwrap_or(user)
    };
    device_jid(pn, device)
}

/// What the device uploaded (`<iq xmlns="encrypt" type="set">`), kept as
/// its nodes so a bundle hands them out as they came.
struct Uploaded {
    registration: Vec<u8>,
    kind: Vec<u8>,
    identity: Vec<u8>,
    signed: Node,
    /// One-time pre-keys not handed out yet, oldest first.
    one_time: VecDeque<Node>,
}

/// A request a device made for a message to be sent again (`retry`
/// receipt): it could not decrypt it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryAsked {
    pub device: String,
    pub group: String,
    pub message_id: String,
}

/// Receipt kinds the fake relays: delivery (no `type`) and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeviceReceipt {
    pub group: String,
    pub ids: Vec<String>,
    /// The message's author, as the device names it (`user[:N]@…`).
    pub author: String,
    pub kind: &'static str,
}

#[derive(Default)]
pub(super) struct Externals {
    pub devices: Vec<ExternalDevice>,
    keys: HashMap<String, Uploaded>,
    /// Relays for devices offline at the time, by login (user, device).
    pub waiting: Vec<((u64, u32), Node)>,
    pub retries: Vec<RetryAsked>,
    /// The login each relayed message came from, by message id: a read
    /// receipt names the author's user, not the device.
    pub authors: HashMap<String, (u64, u32)>,
    /// Device number of the next device linked to a member (apart from
    /// the simulated companions 1, 2, …).
    next_device: u32,
}

impl Externals {
    pub fn next_device(&mut self) -> u32 {
        self.next_device = self.next_device.max(20) + 1;
        self.next_device
    }

    pub fn is_external(&self, jid: &str) -> bool {
        self.devices.iter().any(|d| d.jid() == jid)
    }

    /// The external devices of `user`.
    pub fn devices_of(&self, user: &str) -> Vec<u32> {
        self.devices
            .iter()
            .filter(|d| d.user == user)
            .map(|d| d.device)
            .collect()
    }

    /// Keeps the keys `iq` uploads for `jid`; answers how many one-time
    /// pre-keys it holds now, or why the upload is refused.
    pub fn upload(&mut self, jid: &str, iq: &Node) -> Result<usize, String> {
        let bytes = |tag: &str| child_bytes(iq, tag);
        let signed = iq
            .get_optional_child("skey")
            .cloned()
            .ok_or("a pre-key upload has a signed pre-key (skey)")?;
        let identity = bytes("identity");
        if identity.len() != 32 {
            return Err(format!("identity: {} bytes, not 32", identity.len()));
        }
        // A later upload adds to the one-time pre-keys not handed out yet.
        let mut one_time = self
            .keys
            .remove(jid)
            .map(|k| k.one_time)
            .unwrap_or_default();
        one_time.extend(
            iq.get_optional_child("list")
                .and_then(|l| l.children())
                .unwrap_or_default()
                .iter()
                .filter(|k| k.tag == "key")
                .cloned(),
        );
        let held = one_time.len();
        self.keys.insert(
            jid.to_owned(),
            Uploaded {
                registration: bytes("registration"),
                kind: bytes("type"),
                identity,
                signed,
                one_time,
            },
        );
        Ok(held)
    }

    /// One-time pre-keys `jid` has on the server.
    pub fn count(&self, jid: &str) -> usize {
        self.keys.get(jid).map_or(0, |k| k.one_time.len())
    }

    /// The pre-key bundle of `jid` for a sender, taking one of its
    /// one-time pre-keys (as WhatsApp hands each out once); `None` when
    /// the device uploaded none.
    /// `jid` is the device's phone-number JID; the bundle names it `asked`,
    /// as the sender asked for it.
    pub fn bundle(&mut self, jid: &str, asked: &str) -> Option<Node> {
        let k = self.keys.get_mut(jid)?;
        let mut children = vec![
            NodeBuilder::new("registration")
                .bytes(k.registration.clone())
                .build(),
            NodeBuilder::new("type").bytes(k.kind.clone()).build(),
            NodeBuilder::new("identity")
                .bytes(k.identity.clone())
                .build(),
        ];
        children.extend(k.one_time.pop_front());
        children.push(k.signed.clone());
        Some(
            NodeBuilder::new("user")
                .attr("jid", asked.to_owned())
                .children(children)
                .build(),
        )
    }
}

/// The stanza a member's device gets for a group message from `sender`
/// (`user:N@s.whatsapp.net`): the message's own attributes, its pairwise
/// part for `device` when the sender included one (under any JID `pn`
/// maps to it), then the group part.
pub(super) fn relay(
    message: &Node,
    group: &str,
    sender: &str,
    device: &str,
    pn: impl Fn(&str) -> String,
) -> Node {
    let attr = |n: &Node, k: &str| n.attrs.get(k).map(|v| v.to_string());
    let pairwise = message
        .get_optional_child("participants")
        .and_then(|p| p.children())
        .unwrap_or_default()
        .iter()
        .find(|to| attr(to, "jid").is_some_and(|j| pn(&j) == device))
        .and_then(|to| to.get_optional_child("enc"))
        .cloned();
    let group_part = group_part(message).cloned();
    let mut b = NodeBuilder::new("message")
        .attr("from", group.to_owned())
        .attr("participant", sender.to_owned())
        .attr("id", attr(message, "id").unwrap_or_default())
        .attr("t", chrono::Utc::now().timestamp().to_string())
        .attr("notify", "Herald");
    for k in ["type", "edit"] {
        if let Some(v) = attr(message, k) {
            b = b.attr(k, v);
        }
    }
    b.children(pairwise.into_iter().chain(group_part)).build()
}

/// A `<receipt>` a device sent about group messages; `None` for one about
/// anything else. A retry request comes back as `Err`.
pub(super) fn receipt(node: &Node) -> Option<Result<DeviceReceipt, RetryAsked>> {
    let attr = |n: &Node, k: &str| n.attrs.get(k).map(|v| v.to_string());
    let group = attr(node, "to").filter(|t| t.ends_with("@g.us"))?;
    let mut ids = vec![attr(node, "id")?];
    // Several messages in one receipt: the rest are listed as items.
    if let Some(list) = node.get_optional_child("list") {
        ids.extend(
            list.children()
                .unwrap_or_default()
                .iter()
                .filter_map(|i| attr(i, "id")),
        );
    }
    let author = attr(node, "participant").unwrap_or_default();
    let kind = match attr(node, "type").as_deref() {
        // A client that has not set itself online says `inactive`: the
        // message reached the device all the same.
        None | Some("delivery") | Some("inactive") => "delivery",
        Some("read") => "read",
        Some("retry") => {
            return Some(Err(RetryAsked {
                device: String::new(),
                group,
                message_id: ids.swap_remove(0),
            }))
        }
        Some(_) => return None,
    };
    Some(Ok(DeviceReceipt {
        group,
        ids,
        author,
        kind,
    }))
}

/// `(user, device)` of a device JID: `15550001000:21@s.whatsapp.net`.
pub(super) fn login_of(jid: &str) -> Option<(u64, u32)> {
    let (addr, _) = jid.split_once('@')?;
    let (user, device) = addr.split_once(':').unwrap_or((addr, "0"));
    Some((user.parse().ok()?, device.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use whatsapp_rust::wacore_binary::NodeContent;

    fn content(n: &Node) -> Vec<u8> {
        match &n.content {
            Some(NodeContent::Bytes(b)) => b.clone(),
            _ => Vec::new(),
        }
    }

    fn upload(keys: u32) -> Node {
        let key = |id: u32| {
            NodeBuilder::new("key")
                .children([
                    NodeBuilder::new("id")
                        .bytes(id.to_be_bytes()[1..].to_vec())
                        .build(),
                    NodeBuilder::new("value").bytes(vec![id as u8; 32]).build(),
                ])
                .build()
        };
        NodeBuilder::new("iq")
            .children([
                NodeBuilder::new("registration")
                    .bytes(vec![0, 0, 4, 2])
                    .build(),
                NodeBuilder::new("type").bytes(vec![5]).build(),
                NodeBuilder::new("identity").bytes(vec![7; 32]).build(),
                NodeBuilder::new("list")
                    .children((1..=keys).map(key))
                    .build(),
                NodeBuilder::new("skey")
                    .children([NodeBuilder::new("id").bytes(vec![0, 0, 1]).build()])
                    .build(),
            ])
            .build()
    }

    #[test]
    fn each_one_time_pre_key_is_handed_out_once_and_then_bundles_go_without() {
        let mut e = Externals::default();
        let jid = "15550001000:21@s.whatsapp.net";
        assert!(e.bundle(jid, jid).is_none(), "nothing uploaded yet");
        assert_eq!(e.upload(jid, &upload(2)), Ok(2));
        let ids: Vec<Vec<u8>> = (0..3)
            .map(|_| {
                let b = e.bundle(jid, "715550001000:21@lid").unwrap();
                assert_eq!(
                    b.attrs.get("jid").unwrap().to_string(),
                    "715550001000:21@lid"
                );
                assert_eq!(child_bytes(&b, "identity"), vec![7; 32]);
                assert!(b.get_optional_child("skey").is_some());
                b.get_optional_child("key")
                    .map(|k| child_bytes(k, "id"))
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(ids, vec![vec![0, 0, 1], vec![0, 0, 2], vec![]]);
        assert_eq!(e.count(jid), 0);
        let refused = e.upload(jid, &NodeBuilder::new("iq").build());
        assert!(refused.unwrap_err().contains("skey"));
    }

    #[test]
    fn a_relay_carries_that_devices_pairwise_part_and_the_group_part() {
        let enc = |kind: &str, b: u8| {
            NodeBuilder::new("enc")
                .attr("v", "2")
                .attr("type", kind.to_owned())
                .bytes(vec![b; 4])
                .build()
        };
        let to = |jid: &str, b: u8| {
            NodeBuilder::new("to")
                .attr("jid", jid.to_owned())
                .children([enc("pkmsg", b)])
                .build()
        };
        let msg = NodeBuilder::new("message")
            .attr("to", "120363000000000001@g.us")
            .attr("id", "3EB0AB")
            .attr("type", "text")
            .attr("edit", "7")
            .children([
                NodeBuilder::new("participants")
                    .children([to("71555:21@lid", 1), to("1556@s.whatsapp.net", 2)])
                    .build(),
                enc("skmsg", 9),
            ])
            .build();
        let pn = |j: &str| pn_jid(j, ("1", "100"));
        let r = relay(
            &msg,
            "120363000000000001@g.us",
            "1:6@s.whatsapp.net",
            "1555:21@s.whatsapp.net",
            pn,
        );
        let parts: Vec<(String, Vec<u8>)> = r
            .children()
            .unwrap()
            .iter()
            .map(|c| (c.attrs.get("type").unwrap().to_string(), content(c)))
            .collect();
        assert_eq!(
            parts,
            vec![("pkmsg".into(), vec![1; 4]), ("skmsg".into(), vec![9; 4])]
        );
        assert_eq!(
            r.attrs.get("edit").map(|v| v.to_string()).as_deref(),
            Some("7")
        );
        assert_eq!(
            r.attrs.get("participant").map(|v| v.to_string()).as_deref(),
            Some("1:6@s.whatsapp.net")
        );
        let other = relay(
            &msg,
            "g@g.us",
            "1:6@s.whatsapp.net",
            "1557:21@s.whatsapp.net",
            pn,
        );
        assert_eq!(other.children().unwrap().len(), 1, "only the group part");
    }

    #[test]
    fn receipts_name_their_messages_and_a_retry_is_told_apart() {
        let r = NodeBuilder::new("receipt")
            .attr("to", "g@g.us")
            .attr("id", "A")
            .attr("participant", "1:6@s.whatsapp.net")
            .attr("type", "read")
            .children([NodeBuilder::new("list")
                .children([NodeBuilder::new("item").attr("id", "B").build()])
                .build()])
            .build();
        let got = receipt(&r).unwrap().unwrap();
        assert_eq!(
            (got.kind, got.ids.clone()),
            ("read", vec!["A".into(), "B".into()])
        );
        let retry = NodeBuilder::new("receipt")
            .attr("to", "g@g.us")
            .attr("id", "A")
            .attr("type", "retry")
            .build();
        assert!(receipt(&retry).unwrap().is_err());
        let direct = NodeBuilder::new("receipt")
            .attr("to", "1@s.whatsapp.net")
            .attr("id", "A")
            .build();
        assert!(receipt(&direct).is_none());
        assert_eq!(
            login_of("15550001000:21@s.whatsapp.net"),
            Some((15550001000, 21))
        );
        assert_eq!(
            login_of("15550001000@s.whatsapp.net"),
            Some((15550001000, 0))
        );
    }

    #[test]
    fn lids_map_back_to_phone_numbers() {
        let account = ("15550001111", "100000000000001");
        let lid = member_lid("15557770001");
        assert_eq!(
            pn_jid(&format!("{lid}:22@lid"), account),
            "15557770001:22@s.whatsapp.net"
        );
        assert_eq!(
            pn_jid(&format!("{lid}@lid"), account),
            "15557770001@s.whatsapp.net"
        );
        assert_eq!(
            pn_jid("100000000000001:6@lid", account),
            "15550001111:6@s.whatsapp.net"
        );
        assert_eq!(
            pn_jid("15557770001@s.whatsapp.net", account),
            "15557770001@s.whatsapp.net"
        );
    }
}
