//! What the fake server saw on the wire, in order, for the tests to read.

use super::noise::ClientHello;
use whatsapp_rust::wacore_binary::Node;

/// One thing that happened on the wire.
#[derive(Debug, Clone)]
pub enum Seen {
    /// A WebSocket was accepted (connection number).
    Connected(u64),
    /// The Noise handshake finished; `ik` when the client used the cached
    /// server key (Noise IK), else XX. `client_static` is the client's
    /// Noise key, proven by the handshake.
    Handshake {
        conn: u64,
        ik: bool,
        client_static: [u8; 32],
        payload: ClientHello,
    },
    /// A stanza from the client, after decryption and decoding.
    Stanza { conn: u64, node: Node },
    /// The client's socket closed.
    Closed(u64),
    /// A device logged in on connection `new` while it was connected on
    /// `old`: as WhatsApp does, `old` got `<conflict type="replaced"/>`
    /// and was closed.
    Replaced { old: u64, new: u64 },
}

/// Everything the server saw, in order.
#[derive(Default)]
pub struct Log {
    pub seen: Vec<Seen>,
}

impl Log {
    pub fn handshakes(&self) -> Vec<(u64, bool, [u8; 32], ClientHello)> {
        self.seen
            .iter()
            .filter_map(|s| match s {
                Seen::Handshake {
                    conn,
                    ik,
                    client_static,
                    payload,
                } => Some((*conn, *ik, *client_static, payload.clone())),
                _ => None,
            })
            .collect()
    }

    /// Each thing seen from position `after` on, in plain strings: what a
    /// check in another process (over `herald fake-whatsapp serve`'s
    /// control) reads of the log.
    pub fn summary(&self, after: usize) -> Vec<SeenLine> {
        let line = |kind: &str, conn: u64| SeenLine {
            kind: kind.to_owned(),
            conn,
            tag: None,
            attrs: Vec::new(),
        };
        self.seen
            .iter()
            .skip(after)
            .map(|s| match s {
                Seen::Connected(c) => line("connected", *c),
                Seen::Handshake { conn, ik, .. } => {
                    let mut l = line("handshake", *conn);
                    l.attrs
                        .push(("noise".into(), if *ik { "IK" } else { "XX" }.into()));
                    l
                }
                Seen::Stanza { conn, node } => SeenLine {
                    tag: Some(node.tag.to_string()),
                    attrs: node
                        .attrs
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    ..line("stanza", *conn)
                },
                Seen::Closed(c) => line("closed", *c),
                Seen::Replaced { old, new } => {
                    let mut l = line("replaced", *new);
                    l.attrs.push(("old".into(), old.to_string()));
                    l
                }
            })
            .collect()
    }

    pub fn stanzas(&self) -> impl Iterator<Item = (u64, &Node)> {
        self.seen.iter().filter_map(|s| match s {
            Seen::Stanza { conn, node } => Some((*conn, node)),
            _ => None,
        })
    }
}

/// One [`Seen`] in plain strings (see [`Log::summary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenLine {
    /// `connected`, `handshake`, `stanza`, `closed` or `replaced`.
    pub kind: String,
    pub conn: u64,
    /// A stanza's tag.
    pub tag: Option<String>,
    /// A stanza's attributes; `noise` of a handshake; `old` of a replacement.
    pub attrs: Vec<(String, String)>,
}
