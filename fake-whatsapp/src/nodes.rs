//! Small stanzas the fake server answers with.

use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::{Node, NodeContent};

/// The bytes of `node`'s child `tag` (empty when absent).
pub(super) fn child_bytes(node: &Node, tag: &str) -> Vec<u8> {
    match node
        .get_optional_child(tag)
        .and_then(|c| c.content.as_ref())
    {
        Some(NodeContent::Bytes(b)) => b.clone(),
        Some(NodeContent::String(s)) => s.as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

/// A message's group part (`<enc type="skmsg">`), encrypted with the
/// sender's key for the group.
pub(super) fn group_part(message: &Node) -> Option<&Node> {
    message
        .children()
        .unwrap_or_default()
        .iter()
        .find(|c| c.tag == "enc" && c.attrs.get("type").is_some_and(|t| *t == "skmsg"))
}

/// The server's ack of a stanza, with an error code for a refusal.
pub(super) fn ack(node: &Node, from: &str, error: Option<u16>) -> Node {
    let mut b = NodeBuilder::new("ack")
        .attr("class", node.tag.to_string())
        .attr(
            "id",
            node.attrs
                .get("id")
                .map(|v| v.to_string())
                .unwrap_or_default(),
        )
        .attr("from", from.to_owned())
        .attr("t", chrono::Utc::now().timestamp().to_string());
    if let Some(code) = error {
        b = b.attr("error", code.to_string());
    }
    b.build()
}

/// The attributes of a refused login's `<failure>`: the reason, and the
/// code and expiry (seconds) when given.
pub(super) fn failure_attrs(
    reason: u16,
    code: Option<u32>,
    expire: Option<u64>,
) -> Vec<(&'static str, String)> {
    let mut a = vec![("reason", reason.to_string())];
    a.extend(code.map(|c| ("code", c.to_string())));
    a.extend(expire.map(|e| ("expire", e.to_string())));
    a
}

pub(super) fn error(id: &str, code: u16, text: &str) -> Node {
    NodeBuilder::new("iq")
        .attr("from", SERVER)
        .attr("type", "error")
        .attr("id", id.to_owned())
        .children([NodeBuilder::new("error")
            .attr("code", code.to_string())
            .attr("text", text.to_owned())
            .build()])
        .build()
}

pub(super) const SERVER: &str = "s.whatsapp.net";

/// `<stream:error><conflict type=…/>`: the device was removed, or another
/// connection of it logged in.
pub(super) fn conflict(kind: &str) -> Node {
    NodeBuilder::new("stream:error")
        .children([NodeBuilder::new("conflict")
            .attr("type", kind.to_owned())
            .build()])
        .build()
}

/// The privacy settings: read receipts on, so a client that asks before it
/// reads sends them.
pub(super) fn privacy() -> Node {
    NodeBuilder::new("privacy")
        .children([NodeBuilder::new("category")
            .attr("name", "readreceipts")
            .attr("value", "all")
            .build()])
        .build()
}

/// The offline queue is empty (after the client goes active).
pub(super) fn offline_done() -> Node {
    NodeBuilder::new("ib")
        .attr("from", SERVER)
        .children([NodeBuilder::new("offline").attr("count", "0").build()])
        .build()
}

/// Where to upload media: `host`.
pub(super) fn media_conn(host: String) -> Node {
    NodeBuilder::new("media_conn")
        .attr("auth", "fake-media-auth")
        .attr("ttl", "21600")
        .attr("max_buckets", "12")
        .children([NodeBuilder::new("host").attr("hostname", host).build()])
        .build()
}

/// App state: every collection named is empty at version 0.
pub(super) fn empty_app_state(names: Vec<String>) -> Node {
    let collections = names.into_iter().map(|n| {
        NodeBuilder::new("collection")
            .attr("name", n)
            .attr("version", "0")
            .build()
    });
    NodeBuilder::new("sync").children(collections).build()
}

/// A new device's refs to show as QR codes (stanza id `id`).
pub(super) fn pair_device(id: String, refs: Vec<String>) -> Node {
    NodeBuilder::new("iq")
        .attr("from", SERVER)
        .attr("type", "set")
        .attr("id", id)
        .attr("xmlns", "md")
        .children([NodeBuilder::new("pair-device")
            .children(
                refs.into_iter()
                    .map(|r| NodeBuilder::new("ref").bytes(r.into_bytes()).build()),
            )
            .build()])
        .build()
}

/// A login's `<success>`, telling the device its LID.
pub(super) fn success(lid: &str) -> Node {
    NodeBuilder::new("success")
        .attr("t", chrono::Utc::now().timestamp().to_string())
        .attr("lid", format!("{lid}@lid"))
        .attr("props", "1")
        .build()
}
