//! The fake server's groups: who is in them, how many devices each member
//! has, and the group and device-list nodes it answers with.

use super::phone::sign;
use whatsapp_rust::buffa::Message as _;
use whatsapp_rust::wacore::libsignal::protocol::KeyPair;
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::{Node, NodeContent};
use whatsapp_rust::waproto::whatsapp as wa;

/// A group the account is in.
#[derive(Debug, Clone)]
pub struct Group {
    /// `120363…@g.us`.
    pub jid: String,
    pub subject: String,
    /// Other members' phone numbers (the account itself is always a member).
    pub members: Vec<String>,
    /// Only admins may post (the account is not an admin).
    pub announce: bool,
}

/// `n` groups `120363000000000001@g.us`… with `members` other members
/// each, no member in two groups; every `announce_every`-th one (if not 0)
/// is announcement-only.
pub fn numbered_groups(n: usize, members: usize, announce_every: usize) -> Vec<Group> {
    (1..=n)
        .map(|i| Group {
            jid: format!("120363{i:012}@g.us"),
            subject: format!("Group {i}"),
            members: (0..members)
                .map(|m| format!("1555{:04}{m:03}", i))
                .collect(),
            announce: announce_every != 0 && i % announce_every == 0,
        })
        .collect()
}

/// The `<group>` node of `g`, with `me` (the account's phone number) as
/// creator and first participant.
pub(super) fn group_node(me: &str, g: &Group) -> Node {
    let me = format!("{me}@s.whatsapp.net");
    let mut children: Vec<Node> = std::iter::once(&me)
        .cloned()
        .chain(g.members.iter().map(|m| format!("{m}@s.whatsapp.net")))
        .map(|jid| NodeBuilder::new("participant").attr("jid", jid).build())
        .collect();
    if g.announce {
        children.push(NodeBuilder::new("announcement").build());
    }
    NodeBuilder::new("group")
        .attr("id", g.jid.trim_end_matches("@g.us").to_owned())
        .attr("subject", g.subject.clone())
        .attr("addressing_mode", "pn")
        .attr("creation", "1700000000")
        .attr("creator", me.clone())
        .attr("s_t", "1700000000")
        .attr("size", (g.members.len() + 1).to_string())
        .children(children)
        .build()
}

/// The `<user>` node of a device-list answer: `devices` are the device
/// numbers (0 is the phone). Companions carry their key index (their
/// number) and the list of valid indexes is signed by the phone's
/// `identity`, as WhatsApp serves them: whatsapp-rust leaves out a user's
/// companions that come without it.
pub(super) fn device_list(
    jid: &str,
    devices: impl IntoIterator<Item = u32>,
    identity: &KeyPair,
) -> Node {
    let devices: Vec<u32> = devices.into_iter().collect();
    let companions: Vec<u32> = devices.iter().copied().filter(|d| *d != 0).collect();
    let nodes = devices.iter().map(|&d| {
        let node = NodeBuilder::new("device").attr("id", d.to_string());
        match d {
            0 => node.build(),
            d => node.attr("key-index", d.to_string()).build(),
        }
    });
    let mut children = vec![NodeBuilder::new("device-list").children(nodes).build()];
    if !companions.is_empty() {
        let details = wa::ADVKeyIndexList {
            raw_id: Some(1),
            timestamp: Some(1_700_000_000),
            current_index: companions.iter().copied().max(),
            valid_indexes: companions,
            ..Default::default()
        }
        .encode_to_vec();
        let signed = wa::ADVSignedKeyIndexList {
            account_signature: Some(sign(identity, &details)),
            details: Some(details),
            ..Default::default()
        }
        .encode_to_vec();
        children.push(
            NodeBuilder::new("key-index-list")
                .attr("ts", "1700000000")
                .bytes(signed)
                .build(),
        );
    }
    NodeBuilder::new("user")
        .attr("jid", jid.to_owned())
        .children([NodeBuilder::new("devices").children(children).build()])
        .build()
}

/// A device-list `<user>` node with the user's LID added (for a client
/// that asked for LIDs).
pub(super) fn with_lid(user: Node, lid: &str) -> Node {
    let mut children = user.children().map(|c| c.to_vec()).unwrap_or_default();
    children.push(
        NodeBuilder::new("lid")
            .attr("val", format!("{lid}@lid"))
            .build(),
    );
    Node::new(user.tag, user.attrs, Some(NodeContent::Nodes(children)))
}

/// The device JIDs of `member` when each member has `devices` devices:
/// the phone, then companions 1, 2, ….
pub(super) fn member_devices(member: &str, devices: u32) -> impl Iterator<Item = String> + '_ {
    (0..devices.max(1)).map(move |d| match d {
        0 => format!("{member}@s.whatsapp.net"),
        d => format!("{member}:{d}@s.whatsapp.net"),
    })
}
