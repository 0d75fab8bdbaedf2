//! Upload once, send to every group.
//!
//! `Client::upload` returns an `UploadResponse` (CDN path, media key,
//! hashes). Herald's engine caches one `UploadHandle` per account and media
//! and hands it back for every group and every later run until it expires,
//! so the handle carries those fields as JSON. `UploadResponse` is
//! `#[non_exhaustive]` with no constructor or `Deserialize`, so it cannot be
//! rebuilt from the handle; [`image_message`] builds the same
//! `ImageMessage` that `whatsapp_rust::media::image_message` does, field for
//! field, from the stored copy.

use chrono::{DateTime, Utc};
use herald_actors::domain::GroupJid;
use serde::{Deserialize, Serialize};
use whatsapp_rust::upload::UploadResponse;
use whatsapp_rust::waproto::buffa::MessageField;
use whatsapp_rust::waproto::whatsapp as wa;

/// The parts of an `UploadResponse` a message needs, as stored in
/// `UploadHandle.handle`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredUpload {
    /// Format version of this JSON.
    pub v: u8,
    pub url: String,
    pub direct_path: String,
    #[serde(with = "hex32")]
    pub media_key: [u8; 32],
    #[serde(with = "hex32")]
    pub file_enc_sha256: [u8; 32],
    #[serde(with = "hex32")]
    pub file_sha256: [u8; 32],
    pub file_length: u64,
    pub media_key_timestamp: i64,
}

impl StoredUpload {
    pub const VERSION: u8 = 1;

    pub fn from_response(r: &UploadResponse) -> Self {
        Self {
            v: Self::VERSION,
            url: r.url.clone(),
            direct_path: r.direct_path.clone(),
            media_key: r.media_key,
            file_enc_sha256: r.file_enc_sha256,
            file_sha256: r.file_sha256,
            file_length: r.file_length,
            media_key_timestamp: r.media_key_timestamp,
        }
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("plain fields serialize")
    }

    /// `None` for anything this gateway did not issue (or an older format).
    pub fn decode(handle: &str) -> Option<Self> {
        serde_json::from_str::<Self>(handle)
            .ok()
            .filter(|u| u.v == Self::VERSION && !u.direct_path.is_empty())
    }

    /// Whether a handle with this expiry may still be sent at `now`.
    pub fn usable(expires_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        expires_at > now
    }
}

/// An image with an optional caption, from a stored upload. The group is
/// not part of the message: the same message goes to every group.
pub fn image_message(u: &StoredUpload, caption: Option<&str>, mime: &str) -> wa::Message {
    wa::Message {
        image_message: MessageField::some(wa::message::ImageMessage {
            url: Some(u.url.clone()),
            direct_path: Some(u.direct_path.clone()),
            media_key: Some(u.media_key.to_vec()),
            file_sha256: Some(u.file_sha256.to_vec()),
            file_enc_sha256: Some(u.file_enc_sha256.to_vec()),
            file_length: Some(u.file_length),
            media_key_timestamp: Some(u.media_key_timestamp),
            mimetype: Some(if mime.is_empty() {
                "image/jpeg".to_owned()
            } else {
                mime.to_owned()
            }),
            caption: caption.map(str::to_owned),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Plain text, as WA Web sends it (a `conversation`).
pub fn text_message(text: &str) -> wa::Message {
    use whatsapp_rust::wacore::proto_helpers::MessageBuilderExt;
    wa::Message::text(text)
}

/// A delete for everyone of the account's own message `wire_id` in
/// `group`, as whatsapp-rust's `revoke_message` builds it (a sender revoke:
/// `from_me`, no participant). Sent with a message id of its own, so the
/// crate marks the stanza `edit="7"` from its content.
pub fn revoke_message(group: &GroupJid, wire_id: &str) -> wa::Message {
    wa::Message {
        protocol_message: MessageField::some(wa::message::ProtocolMessage {
            key: MessageField::some(own_key(group, wire_id)),
            r#type: Some(wa::message::protocol_message::Type::Revoke),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A new text for the account's own message `wire_id` in `group` (a text,
/// or a picture's caption: WhatsApp applies the edit's text to either), as
/// whatsapp-rust's `edit_message` builds it; the crate marks it `edit="1"`.
pub fn edit_message(group: &GroupJid, wire_id: &str, text: &str, at: DateTime<Utc>) -> wa::Message {
    wa::Message {
        protocol_message: MessageField::some(wa::message::ProtocolMessage {
            key: MessageField::some(own_key(group, wire_id)),
            r#type: Some(wa::message::protocol_message::Type::MessageEdit),
            edited_message: MessageField::some(text_message(text)),
            timestamp_ms: Some(at.timestamp_millis()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn own_key(group: &GroupJid, wire_id: &str) -> wa::MessageKey {
    wa::MessageKey {
        remote_jid: Some(group.as_str().to_owned()),
        from_me: Some(true),
        id: Some(wire_id.to_owned()),
        participant: None,
    }
}

mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = String::deserialize(d)?;
        let bytes = hex::decode(&s).map_err(serde::de::Error::custom)?;
        bytes
            .try_into()
            .map_err(|_| serde::de::Error::custom("expected 32 bytes"))
    }
}

#[cfg(test)]
pub(crate) fn sample_upload() -> StoredUpload {
    StoredUpload {
        v: StoredUpload::VERSION,
        url: "https://mmg.whatsapp.net/o1/v/t62/abc?ccb=9-4".into(),
        direct_path: "/o1/v/t62/abc?ccb=9-4".into(),
        media_key: [7; 32],
        file_enc_sha256: [8; 32],
        file_sha256: [9; 32],
        file_length: 12_345,
        media_key_timestamp: 1_780_000_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_round_trips_and_forgeries_are_refused() {
        let u = sample_upload();
        let handle = u.encode();
        assert_eq!(StoredUpload::decode(&handle), Some(u));
        for forged in ["never-issued", "{}", r#"{"v":2}"#, ""] {
            assert_eq!(StoredUpload::decode(forged), None, "{forged}");
        }
        let now: DateTime<Utc> = "2026-05-04T09:00:00Z".parse().unwrap();
        assert!(StoredUpload::usable(
            now + chrono::Duration::seconds(1),
            now
        ));
        assert!(!StoredUpload::usable(now, now));
    }

    #[test]
    fn the_image_message_carries_the_upload_and_caption() {
        let u = sample_upload();
        let m = image_message(&u, Some("Today's agenda"), "image/png");
        let img = m.image_message.as_option().expect("an image message");
        assert_eq!(img.direct_path.as_deref(), Some(u.direct_path.as_str()));
        assert_eq!(img.url.as_deref(), Some(u.url.as_str()));
        assert_eq!(img.media_key.as_deref(), Some(&u.media_key[..]));
        assert_eq!(img.file_sha256.as_deref(), Some(&u.file_sha256[..]));
        assert_eq!(img.file_enc_sha256.as_deref(), Some(&u.file_enc_sha256[..]));
        assert_eq!(img.file_length, Some(u.file_length));
        assert_eq!(img.media_key_timestamp, Some(u.media_key_timestamp));
        assert_eq!(img.mimetype.as_deref(), Some("image/png"));
        assert_eq!(img.caption.as_deref(), Some("Today's agenda"));
        let bare = image_message(&u, None, "");
        let img = bare.image_message.as_option().unwrap();
        assert_eq!(img.caption, None, "a caption is optional");
        assert_eq!(
            img.mimetype.as_deref(),
            Some("image/jpeg"),
            "the crate's default"
        );
    }

    #[test]
    fn one_upload_builds_the_same_message_for_every_group() {
        // The group is only the send's target: one upload, one message body.
        let handle = sample_upload().encode();
        let groups = [
            "120363000000000001@g.us",
            "120363000000000002@g.us",
            "120363000000000003@g.us",
        ];
        let bodies: Vec<wa::Message> = groups
            .iter()
            .map(|_| {
                image_message(
                    &StoredUpload::decode(&handle).unwrap(),
                    Some("Reminder"),
                    "image/jpeg",
                )
            })
            .collect();
        assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn text_is_a_conversation() {
        let m = text_message("Standup in 10 minutes");
        assert_eq!(m.conversation.as_deref(), Some("Standup in 10 minutes"));
    }
}
