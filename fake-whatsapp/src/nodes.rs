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
