//! What the simulator delivered, and its journal: every delivery and
//! upload as a JSON line, so a simulated WhatsApp survives a restart of
//! its process and a test can check from outside what it delivered.

use crate::domain::{AccountId, GroupJid, MediaId};
use chrono::{DateTime, Utc};

/// What a delivered message contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveredContent {
    Text(String),
    Media {
        media: MediaId,
        mime: String,
        caption: Option<String>,
    },
    /// A poll (its question in the group's rendering).
    Poll {
        question: String,
        options: Vec<String>,
        multiple: bool,
    },
    /// A delete for everyone of the account's message `of` in the group.
    Revoke {
        of: String,
    },
    /// A new text for the account's message `of` in the group.
    Edit {
        of: String,
        text: String,
    },
}

impl DeliveredContent {
    /// The message a revoke or an edit is about.
    pub fn amends(&self) -> Option<&str> {
        match self {
            Self::Revoke { of } | Self::Edit { of, .. } => Some(of),
            Self::Text(_) | Self::Media { .. } | Self::Poll { .. } => None,
        }
    }
}

/// One message WhatsApp accepted and delivered. Serialized flat, as
/// [`DeliveryRecord`]: a line of the journal and an item of the simulator
/// server's `GET /deliveries`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "DeliveryRecord", from = "DeliveryRecord")]
pub struct Delivery {
    /// Global acceptance order across all accounts.
    pub seq: u64,
    pub account: AccountId,
    pub group: GroupJid,
    pub message_id: String,
    pub content: DeliveredContent,
    /// Identifies the content regardless of message id or upload handle:
    /// the same text, or the same media with the same caption, has the same key.
    pub content_key: String,
    pub at: DateTime<Utc>,
    /// The lease the send carried (several daemons), if any.
    pub fence: Option<crate::domain::Fence>,
}

/// A [`Delivery`] as written down: its content in flat, optional fields.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DeliveryRecord {
    seq: u64,
    account: AccountId,
    group: GroupJid,
    message_id: String,
    content_key: String,
    text: Option<String>,
    media: Option<MediaId>,
    mime: Option<String>,
    caption: Option<String>,
    at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fence: Option<crate::domain::Fence>,
    /// The message a revoke names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revokes: Option<String>,
    /// The message an edit names (its new text in `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    edits: Option<String>,
    /// A poll's options (its question in `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    poll_options: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    poll_multiple: bool,
}

impl From<Delivery> for DeliveryRecord {
    fn from(d: Delivery) -> Self {
        let (mut revokes, mut edits) = (None, None);
        let (mut poll_options, mut poll_multiple) = (None, false);
        let (text, media, mime, caption) = match d.content {
            DeliveredContent::Text(t) => (Some(t), None, None, None),
            DeliveredContent::Media {
                media,
                mime,
                caption,
            } => (None, Some(media), Some(mime), caption),
            DeliveredContent::Revoke { of } => {
                revokes = Some(of);
                (None, None, None, None)
            }
            DeliveredContent::Edit { of, text } => {
                edits = Some(of);
                (Some(text), None, None, None)
            }
            DeliveredContent::Poll {
                question,
                options,
                multiple,
            } => {
                (poll_options, poll_multiple) = (Some(options), multiple);
                (Some(question), None, None, None)
            }
        };
        Self {
            seq: d.seq,
            account: d.account,
            group: d.group,
            message_id: d.message_id,
            content_key: d.content_key,
            text,
            media,
            mime,
            caption,
            at: d.at,
            fence: d.fence,
            revokes,
            edits,
            poll_options,
            poll_multiple,
        }
    }
}

impl From<DeliveryRecord> for Delivery {
    fn from(d: DeliveryRecord) -> Self {
        let content = match (d.text, d.media) {
            _ if d.revokes.is_some() => DeliveredContent::Revoke {
                of: d.revokes.unwrap_or_default(),
            },
            (text, _) if d.edits.is_some() => DeliveredContent::Edit {
                of: d.edits.unwrap_or_default(),
                text: text.unwrap_or_default(),
            },
            (text, _) if d.poll_options.is_some() => DeliveredContent::Poll {
                question: text.unwrap_or_default(),
                options: d.poll_options.unwrap_or_default(),
                multiple: d.poll_multiple,
            },
            (Some(t), _) => DeliveredContent::Text(t),
            (None, Some(media)) => DeliveredContent::Media {
                media,
                mime: d.mime.unwrap_or_default(),
                caption: d.caption,
            },
            (None, None) => DeliveredContent::Text(String::new()),
        };
        Self {
            seq: d.seq,
            account: d.account,
            group: d.group,
            message_id: d.message_id,
            content,
            content_key: d.content_key,
            at: d.at,
            fence: d.fence,
        }
    }
}

/// One line of the simulator's journal (JSON lines).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(super) enum JournalLine {
    Delivery(Delivery),
    Upload {
        account: AccountId,
        handle: String,
        media: MediaId,
        bytes: u64,
        expires_at: DateTime<Utc>,
    },
}

/// Reads the deliveries recorded in a simulator journal, in order. For
/// checks from outside the process that wrote it (crash tests).
pub fn read_journal(path: &std::path::Path) -> std::io::Result<Vec<Delivery>> {
    Ok(parse_journal(path)?
        .into_iter()
        .filter_map(|l| match l {
            JournalLine::Delivery(d) => Some(d),
            JournalLine::Upload { .. } => None,
        })
        .collect())
}

fn parse_journal(path: &std::path::Path) -> std::io::Result<Vec<JournalLine>> {
    Ok(parse_journal_with_len(path)?.0)
}

/// The journal's lines and the length in bytes of its intact part.
pub(super) fn parse_journal_with_len(
    path: &std::path::Path,
) -> std::io::Result<(Vec<JournalLine>, u64)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let (mut out, mut len) = (Vec::new(), 0u64);
    for line in text.split_inclusive('\n') {
        // A crash can cut the last line short; everything before it counts.
        match serde_json::from_str(line.trim_end()) {
            Ok(l) if line.ends_with('\n') => {
                out.push(l);
                len += line.len() as u64;
            }
            _ => break,
        }
    }
    Ok((out, len))
}
