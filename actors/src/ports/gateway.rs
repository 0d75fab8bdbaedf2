//! The gateway port: how the core talks to WhatsApp (the simulator or the
//! real client), how a send can fail, and where media bytes come from.

use crate::domain::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;

/// How a gateway answered; the engine's failure classification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// Slow down: the whole account backs off.
    #[error("rate limited by WhatsApp")]
    RateLimited { retry_after: Option<Duration> },
    /// Worth retrying the same part with the same id.
    #[error("transient failure: {0}")]
    Transient(String),
    #[error("group not found")]
    GroupNotFound,
    #[error("account is not a participant of the group")]
    NotParticipant,
    #[error("not allowed to post in the group")]
    NotAllowed,
    /// The account must be paired again.
    #[error("account logged out")]
    LoggedOut,
    #[error("account temporarily banned")]
    Banned { until: Option<DateTime<Utc>> },
    /// WhatsApp refuses the account's messages for a while (463 reach-out
    /// time-lock, 479, …): the account cools down, then tries again.
    #[error("WhatsApp restricted the account (code {code})")]
    Restricted {
        code: u16,
        retry_after: Option<Duration>,
    },
    /// The upload handle can no longer be used; upload again.
    #[error("media upload expired")]
    MediaExpired,
    #[error("cannot reach WhatsApp: {0}")]
    Unreachable(String),
    /// The gateway does not offer this operation.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The send carried a lease epoch older than one the gateway has
    /// already seen for the account: another daemon owns it now. Nothing
    /// was sent; the run must stop acting for the account.
    #[error("refused: account lease epoch {sent} is older than {seen}")]
    Fenced { sent: i64, seen: i64 },
    /// This daemon's lease on the account ended (or has less than its
    /// safety margin left) before the message could be written: nothing
    /// was sent; the run must stop acting for the account and leave the
    /// part to the account's next owner.
    #[error("not sent: {0}")]
    LeaseEnded(String),
}

/// Why a standing query gave no reading.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StandingError {
    /// This gateway cannot ask (the reading stays as it was).
    #[error("this gateway cannot read an account's standing")]
    Unsupported,
    /// The account cannot ask now (not connected): the reading stays as
    /// it was, and is asked again later.
    #[error("not asked: {0}")]
    NotNow(String),
    /// Asked, and the answer said nothing Herald can read (an unknown
    /// document id, a malformed answer): the reading becomes `Unknown`,
    /// never a reason to stop sending.
    #[error("{0}")]
    Unreadable(String),
}

impl GatewayError {
    /// Ends one target (the group is the problem, or the message is one
    /// the gateway cannot send: trying again would not help), not the
    /// account.
    pub fn is_target_failure(&self) -> bool {
        matches!(
            self,
            Self::GroupNotFound | Self::NotParticipant | Self::NotAllowed | Self::Unsupported(_)
        )
    }

    /// Stops the account's queue.
    pub fn is_account_failure(&self) -> bool {
        matches!(self, Self::LoggedOut | Self::Banned { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutgoingMessage {
    Text(String),
    Media {
        upload: UploadHandle,
        mime: String,
        caption: Option<String>,
    },
    /// A poll: the question as this group reads it, the options as
    /// written (votes name them by their text's hash).
    Poll {
        question: String,
        options: Vec<String>,
        multiple: bool,
    },
    /// Deletes for everyone the message the account sent to the group
    /// with Herald's id `of`.
    Revoke {
        of: String,
    },
    /// Replaces the text (or a picture's caption) of the message the
    /// account sent to the group with Herald's id `of`.
    Edit {
        of: String,
        text: String,
    },
}

impl OutgoingMessage {
    /// Characters a person would type for it: the text or the caption (a
    /// revoke or an edit is a menu choice, typed nothing).
    pub fn typed_chars(&self) -> usize {
        match self {
            Self::Text(t) => t.chars().count(),
            Self::Media { caption, .. } => caption.as_deref().map_or(0, |c| c.chars().count()),
            Self::Poll {
                question, options, ..
            } => {
                question.chars().count() + options.iter().map(|o| o.chars().count()).sum::<usize>()
            }
            Self::Revoke { .. } | Self::Edit { .. } => 0,
        }
    }

    /// The message a revoke or an edit is about.
    pub fn amends(&self) -> Option<&str> {
        match self {
            Self::Revoke { of } | Self::Edit { of, .. } => Some(of),
            Self::Text(_) | Self::Media { .. } | Self::Poll { .. } => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReceipt {
    /// True when the gateway had already accepted this message id.
    pub duplicate: bool,
}

#[async_trait]
pub trait Gateway: Send + Sync + 'static {
    /// The gateway itself counts the account-level signals that reach its
    /// session (logout, lock, ban) and records their incident, whether or
    /// not a send was under way; the run then does not count them again.
    fn reports_session_signals(&self) -> bool {
        false
    }
    /// Uploads media once; the handle is reused for every group.
    async fn upload(
        &self,
        account: &AccountId,
        media: &MediaId,
        mime: &str,
        bytes: Arc<[u8]>,
    ) -> Result<UploadHandle, GatewayError>;

    /// Resolves when the account can write to WhatsApp now (connected,
    /// logged in). The engine takes its token only after this, so sends
    /// queued behind a reconnect do not leave back to back.
    async fn ready(&self, _account: &AccountId) -> Result<(), GatewayError> {
        Ok(())
    }

    /// The groups the account is in, with one query to WhatsApp. Never
    /// called from the send loop: a group directory sync calls it, at most
    /// as often as its throttle allows.
    async fn list_groups(&self, _account: &AccountId) -> Result<Vec<GroupInfo>, GatewayError> {
        Err(GatewayError::Unsupported(
            "this gateway cannot list an account's groups",
        ))
    }

    /// What WhatsApp says of the account's reach-out time-lock now (one
    /// query). The default is a gateway that cannot ask.
    async fn fetch_timelock(&self, _account: &AccountId) -> Result<TimeLock, StandingError> {
        Err(StandingError::Unsupported)
    }

    /// What WhatsApp says of the account's new-chat quota now (one query).
    /// The default is a gateway that cannot ask.
    async fn fetch_quota(&self, _account: &AccountId) -> Result<NewChatQuota, StandingError> {
        Err(StandingError::Unsupported)
    }

    /// Shows the account as typing in `group` for about `for_` (a chat
    /// presence, not a message); the engine waits that long, then sends.
    /// The default is a gateway without presences: nothing is shown.
    async fn typing(
        &self,
        _account: &AccountId,
        _group: &GroupJid,
        _for: Duration,
    ) -> Result<(), GatewayError> {
        Ok(())
    }

    /// Sends one message with a caller-chosen id. Sending the same id again
    /// must not deliver twice.
    async fn send(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
    ) -> Result<SendReceipt, GatewayError>;

    /// Tells the gateway that `fence` now holds the account, before its
    /// first send: from then on it refuses sends with an older epoch, so a
    /// request the previous owner had under way when it was paused cannot
    /// land after the new owner's limiter counted the account's minute.
    /// [`GatewayError::Fenced`] if a newer epoch was already seen. The
    /// default cannot check (WhatsApp knows nothing of leases).
    async fn claim_fence(&self, _fence: &crate::domain::Fence) -> Result<(), GatewayError> {
        Ok(())
    }

    /// [`Gateway::send`] by the holder of `fence` (several daemons). A
    /// gateway that can check it refuses an epoch older than the newest it
    /// has seen for the account with [`GatewayError::Fenced`], so a daemon
    /// that lost its lease while paused cannot send when it wakes. The
    /// default cannot check (WhatsApp itself knows nothing of leases) and
    /// sends; the engine's local lease deadline is then the only guard.
    async fn send_fenced(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        _fence: Option<&crate::domain::Fence>,
    ) -> Result<SendReceipt, GatewayError> {
        self.send(account, group, message, message_id).await
    }
}

/// Where media bytes live (files under the data dir in the daemon).
#[async_trait]
pub trait MediaSource: Send + Sync + 'static {
    async fn read(&self, media: &MediaId) -> std::io::Result<Arc<[u8]>>;
}

/// Picks the gateway for an account's kind.
pub trait GatewayRegistry: Send + Sync + 'static {
    fn gateway(&self, kind: GatewayKind) -> Option<Arc<dyn Gateway>>;
}

/// Where a gateway hands the receipts and poll votes it hears for the
/// accounts' messages. Never waits: the gateway hears them on its client's
/// dispatch path. One offered while the counter is [`RECEIPT_BACKLOG`]
/// behind is dropped and counted as dropped (WhatsApp does not send it
/// again once acknowledged, so a dropped receipt is an undercount, never a
/// double; a dropped vote leaves the voter's earlier choice standing).
#[derive(Clone, Debug)]
pub struct ReceiptSink {
    tx: tokio::sync::mpsc::Sender<Heard>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
}

/// What a gateway heard back about a message it sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    Receipt(Receipt),
    Vote(Vote),
    /// A vote the gateway did not open, and why: a poll another member
    /// sent, or one that did not decrypt (counted, never stored).
    Unopened(VoteIgnored),
}

/// How many receipts may wait for the counter before new ones are dropped:
/// a 1,000-group run to groups of 250 members with two devices each is
/// 500,000 delivery receipts, and the counter writes tens of thousands a
/// second, so this is seconds of a stalled database.
pub const RECEIPT_BACKLOG: usize = 200_000;

impl ReceiptSink {
    /// A sink and the inbox its receipts arrive in.
    pub fn channel(capacity: usize) -> (Self, tokio::sync::mpsc::Receiver<Heard>) {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        (
            Self {
                tx,
                dropped: Arc::default(),
            },
            rx,
        )
    }

    /// Offers a receipt; `false` if it was dropped (backlog full, or the
    /// counter has stopped).
    pub fn offer(&self, r: Receipt) -> bool {
        self.offer_heard(Heard::Receipt(r))
    }

    /// Offers a poll vote; `false` if it was dropped.
    pub fn offer_vote(&self, v: Vote) -> bool {
        self.offer_heard(Heard::Vote(v))
    }

    /// Tells the counter a vote was not opened, and why.
    pub fn vote_unopened(&self, why: VoteIgnored) -> bool {
        self.offer_heard(Heard::Unopened(why))
    }

    fn offer_heard(&self, h: Heard) -> bool {
        let ok = self.tx.try_send(h).is_ok();
        if !ok {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        ok
    }

    /// Receipts offered and not yet taken by the counter.
    pub fn waiting(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Receipts dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}
