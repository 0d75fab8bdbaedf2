//! What whatsapp-rust's errors and events mean for Herald.
//!
//! Errors are classified through the crate's `ErrorChainExt` (server
//! rejection code, transport gone, timeout, HTTP status) and typed
//! variants, never by reading their text. Both errors and events map into
//! small internal enums first — [`Failure`] and [`Signal`] — so the rest of
//! the gateway (and its tests) reason about a handful of cases rather than
//! the crate's open-ended types.

use chrono::{DateTime, Utc};
use herald_actors::domain::{participant_of, ReceiptKind};
use herald_actors::ports::GatewayError;
use std::error::Error as StdError;
use std::time::Duration;
use whatsapp_rust::types::events::{ConnectFailureReason, Event};
use whatsapp_rust::types::presence::ReceiptType;
use whatsapp_rust::wacore_binary::JidExt;
use whatsapp_rust::{ClientError, ErrorChainExt, SendError};

/// A failed call into the crate, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No socket: the transport is gone or was never up.
    Offline(String),
    /// The client holds no login right now (unpaired, or between a server
    /// stream error and the reconnect that follows it).
    NotLoggedIn,
    /// The request went out and no answer came in time.
    Timeout(String),
    /// The server refused with an IQ error code.
    Refused {
        code: u16,
        text: String,
        backoff: Option<Duration>,
    },
    /// A media host refused with an HTTP status.
    Http(u16),
    /// Anything else (encryption, encoding, invalid request).
    Other(String),
}

fn not_logged_in(err: &(dyn StdError + 'static)) -> bool {
    ErrorChainExt::sources(err).any(|e| {
        matches!(e.downcast_ref::<SendError>(), Some(SendError::NotLoggedIn))
            || matches!(
                e.downcast_ref::<ClientError>(),
                Some(ClientError::NotLoggedIn)
            )
    })
}

/// Classifies any error the crate returns (or an `anyhow::Error` through
/// `as_ref()`).
pub fn failure_of(err: &(dyn StdError + 'static)) -> Failure {
    if let Some(r) = err.server_rejection() {
        return Failure::Refused {
            code: r.code,
            text: r.text.to_owned(),
            backoff: r.backoff.map(|s| Duration::from_secs(u64::from(s))),
        };
    }
    if let Some(status) = err.http_status() {
        return Failure::Http(status);
    }
    if not_logged_in(err) {
        return Failure::NotLoggedIn;
    }
    if err.is_transport_unavailable() {
        return Failure::Offline(err.to_string());
    }
    if err.is_timeout() {
        return Failure::Timeout(err.to_string());
    }
    Failure::Other(err.to_string())
}

/// Which call failed: the same code means different things per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Send,
    Upload,
    /// Group membership queries.
    Groups,
}

/// The engine's classification of a failure that is not about the
/// connection (offline and not-logged-in are the session's call: it waits
/// for a reconnect first).
pub fn gateway_error(f: &Failure, call: Call) -> GatewayError {
    match f {
        Failure::Refused {
            code: 429, backoff, ..
        } => GatewayError::RateLimited {
            retry_after: *backoff,
        },
        // 463 (reach-out time-lock) and 479: WhatsApp refuses the
        // account's messages for a while; the account cools down.
        Failure::Refused {
            code: code @ (463 | 479),
            backoff,
            ..
        } => GatewayError::Restricted {
            code: *code,
            retry_after: *backoff,
        },
        Failure::Refused { code: 404, .. } if call != Call::Upload => GatewayError::GroupNotFound,
        Failure::Refused {
            code: 401 | 403, ..
        } if call == Call::Groups => GatewayError::NotParticipant,
        Failure::Refused {
            code: 401 | 403, ..
        } if call == Call::Send => GatewayError::NotAllowed,
        Failure::Refused { code, text, .. } => GatewayError::Transient(if text.is_empty() {
            format!("WhatsApp refused the request (code {code})")
        } else {
            format!("WhatsApp refused the request (code {code}: {text})")
        }),
        Failure::Http(429) => GatewayError::RateLimited { retry_after: None },
        Failure::Http(s) => {
            GatewayError::Transient(format!("the WhatsApp media host answered HTTP {s}"))
        }
        Failure::Timeout(what) => {
            GatewayError::Transient(format!("no answer from WhatsApp: {what}"))
        }
        Failure::Offline(why) => GatewayError::Unreachable(why.clone()),
        Failure::NotLoggedIn => GatewayError::Transient(
            "the WhatsApp session is re-establishing its login; try again".into(),
        ),
        Failure::Other(why) => GatewayError::Transient(why.clone()),
    }
}

/// The engine's classification of a server nack on a sent message.
pub fn nack_error(code: &str) -> GatewayError {
    match code {
        "429" => GatewayError::RateLimited { retry_after: None },
        "463" => GatewayError::Restricted {
            code: 463,
            retry_after: None,
        },
        "479" => GatewayError::Restricted {
            code: 479,
            retry_after: None,
        },
        "404" => GatewayError::GroupNotFound,
        "401" | "403" => GatewayError::NotAllowed,
        _ => GatewayError::Transient(format!("WhatsApp refused the message (nack {code})")),
    }
}

/// An account event, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// Logged in and ready to send.
    Connected,
    /// The connection dropped; the crate reconnects on its own.
    Disconnected(String),
    /// The connection attempt failed but the crate will retry.
    ConnectRetry(String),
    /// The transport could not be opened (seen by our transport wrapper).
    TransportFailed(String),
    /// The account must be paired again.
    LoggedOut(String),
    /// Temporarily banned; `until` when WhatsApp said how long.
    Banned {
        until: Option<DateTime<Utc>>,
        reason: String,
    },
    /// The session cannot connect until something changes (another client
    /// took over the session, outdated client, refused connect).
    Blocked(String),
    Qr {
        code: String,
        valid_for: Duration,
    },
    PairCode {
        code: String,
        valid_for: Duration,
    },
    PairSuccess {
        jid: String,
    },
    PairFailed(String),
    QrExhausted,
    /// The server's verdict on an outgoing message.
    Ack {
        id: String,
        refused: Option<String>,
    },
    /// A member's device received, or the member read, messages the
    /// account sent to a group (`participant` without its device).
    Receipt {
        chat: String,
        participant: String,
        ids: Vec<String>,
        kind: ReceiptKind,
        at: DateTime<Utc>,
    },
    /// Members voted on polls the account sent (still sealed).
    PollVotes(Vec<super::polls::SealedVote>),
    /// Nothing the gateway acts on.
    Ignore,
}

/// How a logout for a locked account starts (the session counts it as
/// `account_locked`, not `logged_out`).
pub const LOCKED: &str = "WhatsApp locked the account";

fn logout_reason(reason: &ConnectFailureReason) -> String {
    match reason {
        ConnectFailureReason::AccountLocked => LOCKED.into(),
        ConnectFailureReason::LoggedOut => {
            "the phone removed this linked device, or WhatsApp logged it out".into()
        }
        other => format!("WhatsApp logged the account out ({other:?})"),
    }
}

/// Classifies an event of the account's client.
pub fn signal_of(event: &Event, now: DateTime<Utc>) -> Signal {
    match event {
        Event::Connected(_) => Signal::Connected,
        Event::Disconnected(d) => Signal::Disconnected(format!("connection lost: {}", d.reason)),
        Event::LoggedOut(l) => {
            let mut why = logout_reason(&l.reason);
            if let Some(h) = l.logout_message.as_ref().and_then(|m| m.header.as_deref()) {
                why = format!("{why}: {h}");
            }
            Signal::LoggedOut(why)
        }
        Event::TemporaryBan(b) => Signal::Banned {
            // `expire` is a length (a chrono duration), not a deadline.
            until: now.checked_add_signed(b.expire),
            reason: format!("temporarily banned by WhatsApp ({})", b.code),
        },
        Event::ConnectFailure(f) => {
            if f.reason.is_logged_out() {
                Signal::LoggedOut(logout_reason(&f.reason))
            } else if f.reason == ConnectFailureReason::TempBanned {
                // A ban stanza without a usable expiry arrives here.
                Signal::Banned {
                    until: None,
                    reason: "temporarily banned by WhatsApp".into(),
                }
            } else if f.reason.should_reconnect() {
                Signal::ConnectRetry(format!("WhatsApp refused the connection ({:?})", f.reason))
            } else if f.reason == ConnectFailureReason::ClientOutdated {
                Signal::Blocked("WhatsApp says this client version is outdated".into())
            } else {
                let msg = f.message.as_deref().unwrap_or("");
                Signal::Blocked(format!(
                    "WhatsApp refused the connection ({:?}) {msg}",
                    f.reason
                ))
            }
        }
        Event::ClientOutdated(_) => {
            Signal::Blocked("WhatsApp says this client version is outdated".into())
        }
        Event::StreamReplaced(_) => Signal::Blocked(
            "another client using this account's WhatsApp Web session took it over".into(),
        ),
        Event::PairingQrCode(q) => Signal::Qr {
            code: q.code.clone(),
            valid_for: q.timeout,
        },
        Event::PairingCode(c) => Signal::PairCode {
            code: c.code.clone(),
            valid_for: c.timeout,
        },
        Event::PairSuccess(p) => Signal::PairSuccess {
            jid: p.id.to_string(),
        },
        Event::PairError(e) => Signal::PairFailed(format!("pairing failed: {}", e.error)),
        Event::PairingCodeError(e) => {
            Signal::PairFailed(format!("the pair code request failed: {}", e.error))
        }
        Event::QrScannedWithoutMultidevice(_) => Signal::PairFailed(
            "the phone scanned the QR code without multi-device support; update WhatsApp on the phone".into(),
        ),
        Event::PairingQrCodesExhausted(_) => Signal::QrExhausted,
        // Acks cover receipts and notifications too; only messages matter.
        Event::ServerAck(a) if a.class.as_deref().is_none_or(|c| c == "message") => Signal::Ack {
            id: a.id.clone(),
            refused: a.error.clone(),
        },
        Event::Receipt(r) => receipt_signal(r),
        Event::Messages(batch) => {
            let votes = super::polls::sealed_votes(batch);
            if votes.is_empty() {
                Signal::Ignore
            } else {
                Signal::PollVotes(votes)
            }
        }
        _ => Signal::Ignore,
    }
}

/// A group receipt from another participant, for messages this account
/// sent; anything else (a chat's, our own devices', a retry or an error
/// receipt) is not counted.
fn receipt_signal(r: &whatsapp_rust::types::events::Receipt) -> Signal {
    let kind = match r.r#type {
        ReceiptType::Delivered => ReceiptKind::Delivered,
        ReceiptType::Read | ReceiptType::Played => ReceiptKind::Read,
        _ => return Signal::Ignore,
    };
    // The crate's receipt parser leaves `is_group` unset: the chat says it.
    if !r.source.chat.is_group() || r.source.is_from_me || r.message_ids.is_empty() {
        return Signal::Ignore;
    }
    Signal::Receipt {
        chat: r.source.chat.to_string(),
        participant: participant_of(&r.source.sender.to_string()),
        ids: r.message_ids.clone(),
        kind,
        at: r.timestamp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use whatsapp_rust::transport::DisconnectReason;
    use whatsapp_rust::types::events::{
        ClientOutdated, ConnectFailure, Connected, Disconnected, LoggedOut, PairError, PairSuccess,
        PairingCode, PairingCodeError, PairingQrCode, PairingQrCodesExhausted, ServerAck,
        StreamReplaced, TempBanReason, TemporaryBan,
    };
    use whatsapp_rust::wacore::request::{IqError as CoreIqError, ServerErrorCode};
    use whatsapp_rust::{ConnectError, ConnectStage, GroupError, IqError};

    fn classify(e: &(dyn StdError + 'static)) -> Failure {
        failure_of(e)
    }

    fn refused(code: u16, backoff: Option<u32>) -> IqError {
        IqError::ServerError {
            code,
            text: "rate-overlimit".into(),
            error_type: Some("wait".into()),
            backoff,
        }
    }

    #[test]
    fn rate_limit_answers_back_the_account_off() {
        let e = SendError::Iq(refused(429, Some(30)));
        let f = classify(&e);
        assert_eq!(
            gateway_error(&f, Call::Send),
            GatewayError::RateLimited {
                retry_after: Some(Duration::from_secs(30))
            }
        );
        // The same code behind anyhow (the upload path) and from a media host.
        let any = whatsapp_rust::anyhow::Error::new(ServerErrorCode {
            code: 429,
            text: "rate-overlimit".into(),
            error_type: None,
            backoff: None,
        });
        let f = classify(any.as_ref());
        assert_eq!(
            gateway_error(&f, Call::Upload),
            GatewayError::RateLimited { retry_after: None }
        );
        assert_eq!(
            gateway_error(&Failure::Http(429), Call::Upload),
            GatewayError::RateLimited { retry_after: None }
        );
        assert_eq!(
            nack_error("429"),
            GatewayError::RateLimited { retry_after: None }
        );
    }

    #[test]
    fn account_restrictions_are_their_own_signals() {
        use herald_actors::delivery::signals::AccountSignal;
        for (code, signal) in [
            (463, AccountSignal::ReachOutLocked),
            (479, AccountSignal::Refused479),
        ] {
            let f = classify(&SendError::Iq(refused(code, Some(600))));
            let e = gateway_error(&f, Call::Send);
            assert_eq!(
                e,
                GatewayError::Restricted {
                    code,
                    retry_after: Some(Duration::from_secs(600))
                }
            );
            assert_eq!(AccountSignal::of(&e), Some(signal));
            let nack = nack_error(&code.to_string());
            assert_eq!(AccountSignal::of(&nack), Some(signal));
        }
        // 429 and a ban keep their own signals; a group's 403 is not the account's.
        let f = classify(&SendError::Iq(refused(429, None)));
        assert_eq!(
            AccountSignal::of(&gateway_error(&f, Call::Send)),
            Some(AccountSignal::RateLimit)
        );
        assert_eq!(AccountSignal::of(&nack_error("403")), None);
    }

    #[test]
    fn transport_gone_is_offline_not_a_refusal() {
        for e in [
            SendError::Iq(IqError::NotConnected),
            SendError::Client(ClientError::NotConnected),
            SendError::Iq(IqError::InternalChannelClosed),
        ] {
            assert!(matches!(classify(&e), Failure::Offline(_)), "{e}");
        }
        assert_eq!(
            gateway_error(&Failure::Offline("socket closed".into()), Call::Send),
            GatewayError::Unreachable("socket closed".into())
        );
        let core = GroupError::Iq(IqError::NotConnected);
        assert!(matches!(classify(&core), Failure::Offline(_)));
    }

    #[test]
    fn not_logged_in_is_its_own_case() {
        // The session decides: logged out for good, or between reconnects.
        assert_eq!(classify(&SendError::NotLoggedIn), Failure::NotLoggedIn);
        assert_eq!(
            classify(&SendError::Client(ClientError::NotLoggedIn)),
            Failure::NotLoggedIn
        );
    }

    #[test]
    fn timeouts_are_transient() {
        let f = classify(&SendError::Iq(IqError::Timeout));
        assert!(matches!(f, Failure::Timeout(_)), "{f:?}");
        assert!(matches!(
            gateway_error(&f, Call::Send),
            GatewayError::Transient(_)
        ));
        let c = ConnectError::Timeout {
            stage: ConnectStage::Transport,
            timeout: Duration::from_secs(20),
        };
        assert!(matches!(classify(&c), Failure::Timeout(_)));
        let _ = CoreIqError::Timeout; // the core variant classifies the same way
    }

    #[test]
    fn group_answers_name_the_target_failure() {
        let gone = classify(&GroupError::Iq(refused(404, None)));
        assert_eq!(
            gateway_error(&gone, Call::Groups),
            GatewayError::GroupNotFound
        );
        let out = classify(&GroupError::Iq(refused(403, None)));
        assert_eq!(
            gateway_error(&out, Call::Groups),
            GatewayError::NotParticipant
        );
        let send = classify(&SendError::Iq(refused(403, None)));
        assert_eq!(gateway_error(&send, Call::Send), GatewayError::NotAllowed);
        assert_eq!(nack_error("404"), GatewayError::GroupNotFound);
        assert_eq!(nack_error("403"), GatewayError::NotAllowed);
        // 479 is the account's (a signal that pauses it when it repeats).
        assert!(matches!(
            nack_error("479"),
            GatewayError::Restricted { code: 479, .. }
        ));
        assert!(matches!(nack_error("503"), GatewayError::Transient(_)));
        // 404 from the media path is not about a group.
        assert!(matches!(
            gateway_error(&gone, Call::Upload),
            GatewayError::Transient(_)
        ));
    }

    #[test]
    fn other_errors_are_transient() {
        let f = classify(&SendError::InvalidRequest("bad".into()));
        assert!(matches!(f, Failure::Other(_)));
        assert!(matches!(
            gateway_error(&f, Call::Send),
            GatewayError::Transient(_)
        ));
        let f = classify(&SendError::Iq(refused(500, None)));
        assert!(matches!(
            gateway_error(&f, Call::Send),
            GatewayError::Transient(_)
        ));
    }

    fn now() -> DateTime<Utc> {
        "2026-05-04T09:00:00Z".parse().unwrap()
    }

    #[test]
    fn connection_events() {
        assert_eq!(
            signal_of(&Event::Connected(Connected::builder().build()), now()),
            Signal::Connected
        );
        let d = Disconnected::builder()
            .reason(DisconnectReason::ReadError("reset by peer".into()))
            .build();
        assert!(matches!(
            signal_of(&Event::Disconnected(d), now()),
            Signal::Disconnected(why) if why.contains("reset by peer")
        ));
        let retry = ConnectFailure::builder()
            .reason(ConnectFailureReason::ServiceUnavailable)
            .build();
        assert!(matches!(
            signal_of(&Event::ConnectFailure(retry), now()),
            Signal::ConnectRetry(_)
        ));
        assert!(matches!(
            signal_of(
                &Event::StreamReplaced(StreamReplaced::builder().build()),
                now()
            ),
            Signal::Blocked(_)
        ));
        assert!(matches!(
            signal_of(
                &Event::ClientOutdated(ClientOutdated::builder().build()),
                now()
            ),
            Signal::Blocked(_)
        ));
    }

    #[test]
    fn logout_and_ban_events() {
        let l = LoggedOut::builder()
            .on_connect(false)
            .reason(ConnectFailureReason::LoggedOut)
            .build();
        assert!(matches!(
            signal_of(&Event::LoggedOut(l), now()),
            Signal::LoggedOut(_)
        ));
        let locked = ConnectFailure::builder()
            .reason(ConnectFailureReason::AccountLocked)
            .build();
        assert!(matches!(
            signal_of(&Event::ConnectFailure(locked), now()),
            Signal::LoggedOut(why) if why.contains("locked")
        ));
        let ban = TemporaryBan::builder()
            .code(TempBanReason::SentToTooManyPeople)
            .expire(chrono::Duration::hours(1))
            .build();
        assert_eq!(
            signal_of(&Event::TemporaryBan(ban), now()),
            Signal::Banned {
                until: Some("2026-05-04T10:00:00Z".parse().unwrap()),
                reason: "temporarily banned by WhatsApp (101: you sent too many messages to people who don't have you in their address books)".into(),
            }
        );
        let no_expiry = ConnectFailure::builder()
            .reason(ConnectFailureReason::TempBanned)
            .build();
        assert!(matches!(
            signal_of(&Event::ConnectFailure(no_expiry), now()),
            Signal::Banned { until: None, .. }
        ));
    }

    #[test]
    fn acks_for_messages_only() {
        let ok = ServerAck::builder()
            .id("3EB0A".to_owned())
            .class("message".to_owned())
            .build();
        assert_eq!(
            signal_of(&Event::ServerAck(ok), now()),
            Signal::Ack {
                id: "3EB0A".into(),
                refused: None
            }
        );
        let nack = ServerAck::builder()
            .id("3EB0B".to_owned())
            .error("429".to_owned())
            .build();
        assert_eq!(
            signal_of(&Event::ServerAck(nack), now()),
            Signal::Ack {
                id: "3EB0B".into(),
                refused: Some("429".into())
            }
        );
        let receipt = ServerAck::builder()
            .id("x".to_owned())
            .class("receipt".to_owned())
            .build();
        assert_eq!(signal_of(&Event::ServerAck(receipt), now()), Signal::Ignore);
    }

    #[test]
    fn group_receipts_from_others_become_receipts_per_member() {
        let at = now();
        let receipt = |chat: &str, sender: &str, t: ReceiptType, from_me: bool| {
            let r = whatsapp_rust::types::events::Receipt::builder()
                .message_ids(vec!["3EB0AA".to_owned(), "3EB0BB".to_owned()])
                .source(whatsapp_rust::types::message::MessageSource {
                    chat: chat.parse().unwrap(),
                    sender: sender.parse().unwrap(),
                    is_from_me: from_me,
                    ..Default::default()
                })
                .timestamp(at)
                .r#type(t)
                .offline(false)
                .build();
            signal_of(&Event::Receipt(r), at)
        };
        let group = "120363000000000001@g.us";
        assert_eq!(
            receipt(
                group,
                "15550001:2@s.whatsapp.net",
                ReceiptType::Delivered,
                false
            ),
            Signal::Receipt {
                chat: group.into(),
                participant: "15550001@s.whatsapp.net".into(),
                ids: vec!["3EB0AA".into(), "3EB0BB".into()],
                kind: ReceiptKind::Delivered,
                at,
            }
        );
        for (t, kind) in [
            (ReceiptType::Read, ReceiptKind::Read),
            (ReceiptType::Played, ReceiptKind::Read),
        ] {
            assert!(matches!(
                receipt(group, "15550001@s.whatsapp.net", t, false),
                Signal::Receipt { kind: k, .. } if k == kind
            ));
        }
        // A chat's, our own devices', a retry or a sender receipt: not counted.
        let person = "15550001@s.whatsapp.net";
        assert_eq!(
            receipt(person, person, ReceiptType::Delivered, false),
            Signal::Ignore
        );
        assert_eq!(
            receipt(group, person, ReceiptType::Delivered, true),
            Signal::Ignore
        );
        assert_eq!(
            receipt(group, person, ReceiptType::Retry, false),
            Signal::Ignore
        );
        assert_eq!(
            receipt(group, person, ReceiptType::Sender, false),
            Signal::Ignore
        );
    }

    #[test]
    fn pairing_events() {
        let qr = PairingQrCode::builder()
            .code("2@abc,def".to_owned())
            .timeout(Duration::from_secs(60))
            .build();
        assert_eq!(
            signal_of(&Event::PairingQrCode(qr), now()),
            Signal::Qr {
                code: "2@abc,def".into(),
                valid_for: Duration::from_secs(60)
            }
        );
        let code = PairingCode::builder()
            .code("ABCD-EFGH".to_owned())
            .timeout(Duration::from_secs(180))
            .build();
        assert!(matches!(
            signal_of(&Event::PairingCode(code), now()),
            Signal::PairCode { .. }
        ));
        let jid: whatsapp_rust::Jid = "60123456789@s.whatsapp.net".parse().unwrap();
        let lid: whatsapp_rust::Jid = "1234567890@lid".parse().unwrap();
        let ok = PairSuccess::builder()
            .id(jid.clone())
            .lid(lid.clone())
            .business_name(String::new())
            .platform("android".to_owned())
            .build();
        assert_eq!(
            signal_of(&Event::PairSuccess(ok), now()),
            Signal::PairSuccess {
                jid: "60123456789@s.whatsapp.net".into()
            }
        );
        let bad = PairError::builder()
            .id(jid)
            .lid(lid)
            .business_name(String::new())
            .platform(String::new())
            .error("key mismatch".to_owned())
            .build();
        assert!(matches!(
            signal_of(&Event::PairError(bad), now()),
            Signal::PairFailed(why) if why.contains("key mismatch")
        ));
        let code_err = PairingCodeError::builder()
            .error("no connection".to_owned())
            .build();
        assert!(matches!(
            signal_of(&Event::PairingCodeError(code_err), now()),
            Signal::PairFailed(_)
        ));
        let done = PairingQrCodesExhausted::builder()
            .disconnected(true)
            .build();
        assert_eq!(
            signal_of(&Event::PairingQrCodesExhausted(done), now()),
            Signal::QrExhausted
        );
    }
}
