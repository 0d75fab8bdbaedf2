//! What the fake server tells its tests about: the devices linked through
//! it, the group messages it received and how it answered each.

use super::recipient::Decrypted;
use std::time::Instant;

/// A device linked through this server.
#[derive(Debug, Clone)]
pub struct Linked {
    pub user: String,
    pub device: u32,
    /// The device's identity key (from the QR), verified by its signature.
    pub identity_key: [u8; 32],
}

/// A group message the server received.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub group: String,
    pub id: String,
    /// The stanza's `type`: `text` or `media`.
    pub kind: String,
    /// `mediatype` of the encrypted payload, when the client gave one.
    pub media_type: Option<String>,
    /// The stanza's `edit` attribute: `7` for a sender's revoke, `1` for
    /// an edit (WhatsApp Web's values), none for a new message.
    pub edit: Option<String>,
    /// Bytes of the group-encrypted payload (`skmsg`).
    pub size: usize,
    /// Devices the client sent the group's sender key to, in this stanza.
    pub key_shares: usize,
    /// When it arrived.
    pub at: Instant,
    /// How many times this id had arrived before (0 = first).
    pub seen_before: usize,
    /// The connection it came on.
    pub conn: u64,
    pub verdict: Verdict,
    /// What the group's member devices decrypted from it.
    pub read: Decrypted,
}

/// How the server answers a group message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `<ack class="message" …/>`: accepted.
    Ack,
    /// An ack with `error="code"` (429, 463, 479, 403, …).
    Nack(u16),
    /// No answer at all.
    Drop,
    /// The socket is closed instead of an answer.
    Disconnect,
}

/// Decides the verdict for a message: (delivery so far, times seen before).
pub type Policy = Box<dyn Fn(&Delivery) -> Verdict + Send + Sync>;
