//! Polls through WhatsApp Web: the poll message a group gets, the secret
//! its votes are sealed with, and the votes the account's client hears.
//!
//! A member's device seals its vote with a key derived from the poll's
//! 32-byte message secret (HKDF over the poll's id, its author and the
//! voter, then AES-GCM: `wacore::poll`). Herald does not draw that secret
//! at random and store it: it derives it from the account's identity key
//! (sealed in the session with the rest of it) and the poll's wire id. So
//! a resend after a crash carries the same secret, every daemon that takes
//! the account over opens the same votes, a key rotation has nothing to
//! move, and nothing is lost between deciding the secret and the send.
//! The cost: an account paired again (a new identity) cannot open votes
//! for polls its earlier device sent.

use chrono::{DateTime, TimeZone, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use whatsapp_rust::types::events::MessageBatch;
use whatsapp_rust::wacore_binary::JidExt;
use whatsapp_rust::waproto::buffa;
use whatsapp_rust::waproto::whatsapp as wa;

/// Where a poll secret's derivation starts (changing it would leave every
/// poll already sent without its votes).
const SECRET_LABEL: &[u8] = b"herald/whatsapp/poll-message-secret/v1\0";

/// The message secret of the poll sent with `wire_id` by the device whose
/// identity private key is `identity`.
pub fn poll_secret(identity: &[u8; 32], wire_id: &str) -> [u8; 32] {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(identity).expect("HMAC takes a key of any length");
    mac.update(SECRET_LABEL);
    mac.update(wire_id.as_bytes());
    mac.finalize().into_bytes().into()
}

/// A poll as WA Web builds it: version 3 for a single choice, the first
/// version for several (WhatsApp's own split), the secret in the message's
/// context so members' devices can seal their votes. A multiple-choice
/// poll allows every option.
pub fn poll_message(
    question: &str,
    options: &[String],
    multiple: bool,
    secret: [u8; 32],
) -> wa::Message {
    let poll = wa::message::PollCreationMessage {
        name: Some(question.to_owned()),
        options: options
            .iter()
            .map(|o| wa::message::poll_creation_message::Option {
                option_name: Some(o.clone()),
                option_hash: None,
            })
            .collect(),
        selectable_options_count: Some(if multiple {
            u32::try_from(options.len()).unwrap_or(u32::MAX)
        } else {
            1
        }),
        poll_content_type: Some(wa::message::PollContentType::TEXT),
        ..Default::default()
    };
    let mut m = wa::Message::default();
    if multiple {
        m.poll_creation_message = buffa::MessageField::some(poll);
    } else {
        m.poll_creation_message_v3 = buffa::MessageField::some(poll);
    }
    m.message_context_info = buffa::MessageField::some(wa::MessageContextInfo {
        message_secret: Some(secret.to_vec()),
        ..Default::default()
    });
    m
}

/// A vote as the account's client received it, still sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedVote {
    /// The group.
    pub chat: String,
    /// The poll message's id (Herald's wire id).
    pub poll_id: String,
    /// Who sent the poll, as the vote names it (a group vote does).
    pub author: Option<String>,
    /// The voter's address without its device (a phone number or a LID).
    pub voter: String,
    /// The voter's other address when the stanza names it (its phone
    /// number for a LID sender).
    pub voter_alt: Option<String>,
    pub payload: Vec<u8>,
    pub iv: Vec<u8>,
    /// The voter's device's own time for it (the latest wins).
    pub at: DateTime<Utc>,
}

/// The group poll votes from others in a batch of messages the client
/// decrypted; everything else in it is not Herald's concern.
pub fn sealed_votes(batch: &MessageBatch) -> Vec<SealedVote> {
    batch
        .iter()
        .filter_map(|m| {
            let src = &m.info.source;
            if !src.chat.is_group() || src.is_from_me {
                return None;
            }
            let update = m.message.poll_update_message.as_option()?;
            let key = update.poll_creation_message_key.as_option()?;
            let vote = update.vote.as_option()?;
            let at = update
                .sender_timestamp_ms
                .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
                .unwrap_or(m.info.timestamp);
            Some(SealedVote {
                chat: src.chat.to_string(),
                poll_id: key.id.clone()?,
                author: key.participant.clone(),
                voter: src.sender.to_non_ad_string(),
                voter_alt: src.sender_alt.as_ref().map(|j| j.to_non_ad_string()),
                payload: vote.enc_payload.clone()?,
                iv: vote.enc_iv.clone()?,
                at,
            })
        })
        .collect()
}

/// The chosen options' hashes of an opened vote, each 32 bytes, or why
/// the vote cannot be counted.
pub fn option_hashes(opened: Vec<Vec<u8>>) -> Result<Vec<[u8; 32]>, String> {
    opened
        .into_iter()
        .map(|h| {
            <[u8; 32]>::try_from(h.as_slice())
                .map_err(|_| format!("an option hash of {} bytes, not 32", h.len()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use whatsapp_rust::wacore::poll;

    fn options() -> Vec<String> {
        vec!["Yes".into(), "No".into(), "Later".into()]
    }

    #[test]
    fn a_secret_is_the_same_for_the_same_poll_and_differs_for_another_or_another_device() {
        let a = poll_secret(&[7; 32], "3EB0AAAA");
        assert_eq!(a, poll_secret(&[7; 32], "3EB0AAAA"));
        assert_ne!(a, poll_secret(&[7; 32], "3EB0AAAB"));
        assert_ne!(a, poll_secret(&[8; 32], "3EB0AAAA"));
    }

    #[test]
    fn single_choice_goes_as_version_3_and_several_as_the_first_with_the_secret() {
        let one = poll_message("Coming?", &options(), false, [1; 32]);
        let p = one.poll_creation_message_v3.as_option().expect("v3");
        assert!(one.poll_creation_message.as_option().is_none());
        assert_eq!(p.name.as_deref(), Some("Coming?"));
        assert_eq!(p.selectable_options_count, Some(1));
        let names: Vec<_> = p
            .options
            .iter()
            .filter_map(|o| o.option_name.clone())
            .collect();
        assert_eq!(names, options());
        let ctx = one.message_context_info.as_option().expect("context");
        assert_eq!(ctx.message_secret.as_deref(), Some(&[1u8; 32][..]));

        let many = poll_message("Which days?", &options(), true, [2; 32]);
        let p = many.poll_creation_message.as_option().expect("v1");
        assert!(many.poll_creation_message_v3.as_option().is_none());
        assert_eq!(p.selectable_options_count, Some(3));
    }

    #[test]
    fn a_vote_a_member_seals_opens_with_the_derived_secret_and_not_another() {
        let secret = poll_secret(&[9; 32], "3EB0POLL");
        let chosen = vec![poll::compute_option_hash("No").to_vec()];
        let (payload, iv) = poll::encrypt_poll_vote_with_secret(
            &chosen,
            &secret,
            "3EB0POLL",
            "15550000000@s.whatsapp.net",
            "15551112222@s.whatsapp.net",
        )
        .unwrap();
        let open = |secret: &[u8; 32], voter: &str| {
            poll::decrypt_poll_vote_with_secret(
                poll::PollVoteCiphertext {
                    enc_payload: &payload,
                    enc_iv: &iv,
                },
                secret,
                "3EB0POLL",
                "15550000000@s.whatsapp.net",
                voter,
            )
        };
        let hashes = option_hashes(open(&secret, "15551112222@s.whatsapp.net").unwrap()).unwrap();
        assert_eq!(hashes, vec![poll::compute_option_hash("No")]);
        // Another poll's secret, or another voter's name on it: refused.
        assert!(open(
            &poll_secret(&[9; 32], "3EB0OTHER"),
            "15551112222@s.whatsapp.net"
        )
        .is_err());
        assert!(open(&secret, "15553334444@s.whatsapp.net").is_err());
    }

    #[test]
    fn a_hash_of_the_wrong_length_is_refused() {
        assert!(option_hashes(vec![vec![0; 31]]).is_err());
        assert_eq!(option_hashes(vec![]).unwrap(), Vec::<[u8; 32]>::new());
    }
}
