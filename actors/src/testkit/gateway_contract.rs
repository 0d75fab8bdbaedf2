//! What every [`Gateway`] must do, whatever WhatsApp it talks to.
//!
//! Each test takes the gateway and a [`ContractSetup`] that gives it a fresh
//! paired account with groups it may post to; [`run_all`] runs them all.
//! The tests only look at the gateway's answers, so they hold for the
//! simulator and for WhatsApp Web alike; what only the simulator can show
//! (its log, time, limits) is tested beside it.

use crate::domain::{AccountId, GroupJid, MediaId, UploadHandle};
use crate::ports::{Gateway, GatewayError, OutgoingMessage, SendReceipt};
use async_trait::async_trait;
use std::sync::Arc;

/// How a gateway's tests prepare what the contract needs.
#[async_trait]
pub trait ContractSetup: Send + Sync {
    /// An account no other test has used (so message ids never collide),
    /// paired and a member of `n` groups it may post to, and those groups.
    async fn account_with_groups(&self, n: usize) -> (AccountId, Vec<GroupJid>);

    /// A group the account does not know.
    fn unknown_group(&self) -> GroupJid {
        GroupJid::parse("999000000000000001@g.us").expect("valid jid")
    }

    /// Makes the account's upload handles expire now. Returns false where
    /// the gateway cannot be made to (the expired case is then skipped; the
    /// unknown-handle case still runs).
    async fn expire_uploads(&self, _account: &AccountId) -> bool {
        false
    }
}

const MIME: &str = "image/png";

fn picture() -> Arc<[u8]> {
    Arc::from(&b"\x89PNG\r\n\x1a\nherald gateway contract picture"[..])
}

fn media_message(upload: &UploadHandle, caption: Option<&str>) -> OutgoingMessage {
    OutgoingMessage::Media {
        upload: upload.clone(),
        mime: MIME.to_owned(),
        caption: caption.map(str::to_owned),
    }
}

fn text(s: &str) -> OutgoingMessage {
    OutgoingMessage::Text(s.to_owned())
}

const DELIVERED: SendReceipt = SendReceipt { duplicate: false };
const DUPLICATE: SendReceipt = SendReceipt { duplicate: true };

async fn upload_picture(gw: &dyn Gateway, account: &AccountId) -> UploadHandle {
    let bytes = picture();
    let handle = gw
        .upload(account, &MediaId::of_bytes(&bytes), MIME, bytes)
        .await
        .expect("upload to a paired account");
    assert!(
        !handle.handle.is_empty(),
        "an upload handle names the upload"
    );
    handle
}

/// A text, then a picture with a caption, reach a group the account is in.
pub async fn text_and_media_reach_a_known_group(gw: &dyn Gateway, setup: &dyn ContractSetup) {
    let (account, groups) = setup.account_with_groups(1).await;
    let got = gw
        .send(
            &account,
            &groups[0],
            &text("Standup in 10 minutes"),
            "c1-text",
        )
        .await;
    assert_eq!(got, Ok(DELIVERED));
    let handle = upload_picture(gw, &account).await;
    let got = gw
        .send(
            &account,
            &groups[0],
            &media_message(&handle, Some("Today's agenda")),
            "c1-media",
        )
        .await;
    assert_eq!(got, Ok(DELIVERED));
    let got = gw
        .send(
            &account,
            &groups[0],
            &media_message(&handle, None),
            "c1-bare",
        )
        .await;
    assert_eq!(got, Ok(DELIVERED), "a caption is optional");
}

/// One upload serves every group: the handle is reused, not re-uploaded.
pub async fn one_upload_serves_many_groups(gw: &dyn Gateway, setup: &dyn ContractSetup) {
    let (account, groups) = setup.account_with_groups(5).await;
    let handle = upload_picture(gw, &account).await;
    let msg = media_message(&handle, Some("Reminder"));
    for (i, group) in groups.iter().enumerate() {
        let got = gw.send(&account, group, &msg, &format!("c2-{i}")).await;
        assert_eq!(got, Ok(DELIVERED), "group {group}");
    }
}

/// Sending a message id again (a resend after a crash) delivers once.
pub async fn same_message_id_delivers_once(gw: &dyn Gateway, setup: &dyn ContractSetup) {
    let (account, groups) = setup.account_with_groups(1).await;
    let msg = text("Only once, please");
    assert_eq!(
        gw.send(&account, &groups[0], &msg, "c3-text").await,
        Ok(DELIVERED)
    );
    assert_eq!(
        gw.send(&account, &groups[0], &msg, "c3-text").await,
        Ok(DUPLICATE)
    );

    let handle = upload_picture(gw, &account).await;
    let msg = media_message(&handle, Some("Once"));
    assert_eq!(
        gw.send(&account, &groups[0], &msg, "c3-media").await,
        Ok(DELIVERED)
    );
    assert_eq!(
        gw.send(&account, &groups[0], &msg, "c3-media").await,
        Ok(DUPLICATE)
    );
}

/// A group the account does not know is the target's failure, not the account's.
pub async fn unknown_group_is_group_not_found(gw: &dyn Gateway, setup: &dyn ContractSetup) {
    let (account, _) = setup.account_with_groups(1).await;
    let got = gw
        .send(&account, &setup.unknown_group(), &text("Anyone?"), "c4")
        .await;
    assert_eq!(got, Err(GatewayError::GroupNotFound));
}

/// A handle the gateway never issued, or one that expired, answers
/// `MediaExpired`; uploading again recovers.
pub async fn unknown_or_expired_handle_is_media_expired(
    gw: &dyn Gateway,
    setup: &dyn ContractSetup,
) {
    let (account, groups) = setup.account_with_groups(1).await;
    let forged = UploadHandle {
        handle: "never-issued".to_owned(),
        expires_at: chrono::DateTime::<chrono::Utc>::MAX_UTC,
    };
    let got = gw
        .send(
            &account,
            &groups[0],
            &media_message(&forged, None),
            "c5-forged",
        )
        .await;
    assert_eq!(got, Err(GatewayError::MediaExpired));

    let old = upload_picture(gw, &account).await;
    if setup.expire_uploads(&account).await {
        let got = gw
            .send(&account, &groups[0], &media_message(&old, None), "c5-old")
            .await;
        assert_eq!(got, Err(GatewayError::MediaExpired));
    }
    let fresh = upload_picture(gw, &account).await;
    let got = gw
        .send(
            &account,
            &groups[0],
            &media_message(&fresh, None),
            "c5-fresh",
        )
        .await;
    assert_eq!(got, Ok(DELIVERED));
}

/// The whole contract.
pub async fn run_all(gw: &dyn Gateway, setup: &dyn ContractSetup) {
    text_and_media_reach_a_known_group(gw, setup).await;
    one_upload_serves_many_groups(gw, setup).await;
    same_message_id_delivers_once(gw, setup).await;
    unknown_group_is_group_not_found(gw, setup).await;
    unknown_or_expired_handle_is_media_expired(gw, setup).await;
}
