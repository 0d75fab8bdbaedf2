//! Pairing: the per-account state machine the control port shows, and the
//! QR code as terminal text and PNG.
//!
//! ```text
//! idle ─start─▶ connecting ─QR─▶ waiting_qr ──(rotates)──┐
//!   ▲              │   └─pair code─▶ waiting_pair_code    │
//!   │              ▼                    │                 ▼
//!   │      failed(reason) ◀──error/timeout/expired── paired ──▶ logged_out
//!   └────────── start again (from failed or logged_out) ◀───────┘
//! ```
//! `connecting` is the step before WhatsApp has answered at all; an
//! unreachable WhatsApp fails it with "cannot reach WhatsApp: …" instead of
//! leaving it waiting.

use super::classify::Signal;
use chrono::{DateTime, Utc};
use qrcode::render::unicode::Dense1x2;
use qrcode::{Color, QrCode};

pub use crate::gateway::pairing_view::PairingView;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Idle,
    Connecting,
    WaitingQr {
        code: String,
        expires_at: DateTime<Utc>,
    },
    WaitingPairCode {
        code: String,
        expires_at: DateTime<Utc>,
    },
    Paired {
        jid: Option<String>,
    },
    Failed {
        reason: String,
    },
    LoggedOut {
        reason: String,
    },
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Connecting => "connecting",
            Phase::WaitingQr { .. } => "waiting_qr",
            Phase::WaitingPairCode { .. } => "waiting_pair_code",
            Phase::Paired { .. } => "paired",
            Phase::Failed { .. } => "failed",
            Phase::LoggedOut { .. } => "logged_out",
        }
    }
}

/// Why pairing cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairingError {
    #[error("the account is already paired{}; log it out from the phone (WhatsApp > Linked devices) before pairing it again", .0.as_ref().map(|j| format!(" as {j}")).unwrap_or_default())]
    AlreadyPaired(Option<String>),
    #[error("{rule}")]
    Invalid { field: &'static str, rule: String },
    #[error("account {0} is not a whatsapp account")]
    NotWhatsapp(String),
    #[error("cannot reach WhatsApp: {0}")]
    Unreachable(String),
    /// Several daemons: another one holds the account's lease, and only
    /// the holder may connect the device.
    #[error("account {0} is served by another daemon of the cluster (it holds the account's lease); pair it through that daemon's control port")]
    Elsewhere(String),
    #[error("{0}")]
    Internal(String),
}

/// What a start request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// A new pairing attempt began.
    New,
    /// The same attempt was already under way; nothing changed.
    AlreadyRunning,
}

/// One account's pairing state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pairing {
    pub phase: Phase,
    pub since: DateTime<Utc>,
    /// Set when pairing by phone number (pair code) rather than QR.
    pub phone: Option<String>,
}

const QR_EXHAUSTED: &str = "the QR codes expired before one was scanned; start pairing again";

impl Pairing {
    pub fn new(phase: Phase, now: DateTime<Utc>) -> Self {
        Self {
            phase,
            since: now,
            phone: None,
        }
    }

    fn enter(&mut self, phase: Phase, now: DateTime<Utc>) -> bool {
        if self.phase == phase {
            return false;
        }
        self.phase = phase;
        self.since = now;
        true
    }

    /// Connecting or waiting for the phone.
    pub fn in_progress(&self) -> bool {
        matches!(
            self.phase,
            Phase::Connecting | Phase::WaitingQr { .. } | Phase::WaitingPairCode { .. }
        )
    }

    /// Begins pairing (QR without a phone, pair code with one).
    pub fn start(
        &mut self,
        phone: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Started, PairingError> {
        match &self.phase {
            Phase::Paired { jid } => Err(PairingError::AlreadyPaired(jid.clone())),
            _ if self.in_progress() && self.phone == phone => Ok(Started::AlreadyRunning),
            _ => {
                self.phone = phone;
                self.phase = Phase::Connecting;
                self.since = now;
                Ok(Started::New)
            }
        }
    }

    /// Fails an attempt in progress (unreachable, timed out); true if it did.
    pub fn fail(&mut self, reason: impl Into<String>, now: DateTime<Utc>) -> bool {
        if !self.in_progress() {
            return false;
        }
        self.enter(
            Phase::Failed {
                reason: reason.into(),
            },
            now,
        )
    }

    /// Applies an account event; true when the phase changed.
    pub fn on_signal(&mut self, s: &Signal, now: DateTime<Utc>) -> bool {
        let expires = |d: std::time::Duration| {
            now + chrono::Duration::from_std(d).unwrap_or_else(|_| chrono::Duration::seconds(60))
        };
        match s {
            Signal::Qr { code, valid_for }
                if self.phone.is_none()
                    && matches!(self.phase, Phase::Connecting | Phase::WaitingQr { .. }) =>
            {
                self.enter(
                    Phase::WaitingQr {
                        code: code.clone(),
                        expires_at: expires(*valid_for),
                    },
                    now,
                )
            }
            Signal::PairCode { code, valid_for } if self.phone.is_some() && self.in_progress() => {
                self.enter(
                    Phase::WaitingPairCode {
                        code: code.clone(),
                        expires_at: expires(*valid_for),
                    },
                    now,
                )
            }
            Signal::PairSuccess { jid } if self.in_progress() => self.enter(
                Phase::Paired {
                    jid: Some(jid.clone()),
                },
                now,
            ),
            // A stored session that logs straight in was paired already.
            Signal::Connected if self.in_progress() || self.phase == Phase::Idle => {
                self.enter(Phase::Paired { jid: None }, now)
            }
            Signal::PairFailed(reason) | Signal::Blocked(reason) => self.fail(reason.clone(), now),
            Signal::Banned { reason, .. } => self.fail(reason.clone(), now),
            Signal::QrExhausted if matches!(self.phase, Phase::WaitingQr { .. }) => {
                self.fail(QR_EXHAUSTED, now)
            }
            // Only before WhatsApp has answered: once a QR is up, a dropped
            // socket is the crate's to reconnect.
            Signal::TransportFailed(cause) if self.phase == Phase::Connecting => {
                self.fail(format!("cannot reach WhatsApp: {cause}"), now)
            }
            Signal::LoggedOut(reason) => self.enter(
                Phase::LoggedOut {
                    reason: reason.clone(),
                },
                now,
            ),
            _ => false,
        }
    }

    /// The JSON the control port answers with.
    pub fn view(&self, account_id: &str) -> PairingView {
        let mut v = PairingView {
            account_id: account_id.to_owned(),
            state: self.phase.name(),
            since: self.since,
            phone: self.phone.clone(),
            qr: None,
            qr_text: None,
            qr_png: None,
            pair_code: None,
            expires_at: None,
            jid: None,
            reason: None,
        };
        match &self.phase {
            Phase::WaitingQr { code, expires_at } => {
                v.qr_text = qr_text(code).ok();
                v.qr = Some(code.clone());
                v.qr_png = Some(format!("/v1/accounts/{account_id}/pair/qr.png"));
                v.expires_at = Some(*expires_at);
            }
            Phase::WaitingPairCode { code, expires_at } => {
                v.pair_code = Some(code.clone());
                v.expires_at = Some(*expires_at);
            }
            Phase::Paired { jid } => v.jid = jid.clone(),
            Phase::Failed { reason } | Phase::LoggedOut { reason } => {
                v.reason = Some(reason.clone())
            }
            Phase::Idle | Phase::Connecting => {}
        }
        v
    }
}

/// A phone number for pair-code linking: country code and number, digits
/// only (spaces, dashes, dots, parentheses and a leading '+' are dropped).
pub fn normalize_phone(raw: &str) -> Result<String, PairingError> {
    let digits: String = raw
        .trim()
        .trim_start_matches('+')
        .chars()
        .filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')'))
        .collect();
    let rule = "must be the phone number in international form, e.g. +60 12 345 6789: 7 to 15 digits, country code first, no leading 0";
    if (7..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0')
    {
        Ok(digits)
    } else {
        Err(PairingError::Invalid {
            field: "phone",
            rule: rule.into(),
        })
    }
}

/// The QR drawn for a terminal, two modules per character cell. Light
/// modules are drawn as blocks so the code reads correctly on the usual
/// dark-background terminal (the quiet zone becomes the light border).
pub fn qr_text(payload: &str) -> Result<String, String> {
    let code = QrCode::new(payload.as_bytes()).map_err(|e| e.to_string())?;
    Ok(code
        .render::<Dense1x2>()
        .dark_color(Dense1x2::Light)
        .light_color(Dense1x2::Dark)
        .quiet_zone(true)
        .build())
}

/// Pixels per module and modules of quiet zone in the PNG.
const PNG_SCALE: usize = 8;
const QUIET: usize = 4;

/// The QR as an 8-bit grayscale PNG, black on white.
pub fn qr_png(payload: &str) -> Result<Vec<u8>, String> {
    let code = QrCode::new(payload.as_bytes()).map_err(|e| e.to_string())?;
    let width = code.width();
    let colors = code.to_colors();
    let side = (width + 2 * QUIET) * PNG_SCALE;
    let mut pixels = vec![255u8; side * side];
    for (i, c) in colors.iter().enumerate() {
        if *c != Color::Dark {
            continue;
        }
        let (mx, my) = (i % width + QUIET, i / width + QUIET);
        for y in my * PNG_SCALE..(my + 1) * PNG_SCALE {
            pixels[y * side + mx * PNG_SCALE..y * side + (mx + 1) * PNG_SCALE].fill(0);
        }
    }
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, side as u32, side as u32);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| e.to_string())?;
    w.write_image_data(&pixels).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_780_000_000 + s, 0).unwrap()
    }

    #[test]
    fn the_document_lists_every_state_a_pairing_shows() {
        let (code, expires_at, reason) = (String::new(), t(0), String::new());
        let phases = [
            Phase::Idle,
            Phase::Connecting,
            Phase::WaitingQr {
                code: code.clone(),
                expires_at,
            },
            Phase::WaitingPairCode { code, expires_at },
            Phase::Paired { jid: None },
            Phase::Failed {
                reason: reason.clone(),
            },
            Phase::LoggedOut { reason },
        ];
        let names: Vec<&str> = phases.iter().map(Phase::name).collect();
        assert_eq!(names, crate::gateway::pairing_view::STATES);
    }

    fn qr(code: &str) -> Signal {
        Signal::Qr {
            code: code.into(),
            valid_for: Duration::from_secs(60),
        }
    }

    #[test]
    fn qr_pairing_goes_idle_connecting_waiting_paired() {
        let mut p = Pairing::new(Phase::Idle, t(0));
        assert_eq!(p.start(None, t(0)), Ok(Started::New));
        assert_eq!(p.phase, Phase::Connecting);
        assert!(p.on_signal(&qr("2@one"), t(1)));
        assert_eq!(
            p.phase,
            Phase::WaitingQr {
                code: "2@one".into(),
                expires_at: t(61)
            }
        );
        // The QR rotates.
        assert!(p.on_signal(&qr("2@two"), t(20)));
        assert!(matches!(&p.phase, Phase::WaitingQr { code, .. } if code == "2@two"));
        assert_eq!(p.start(None, t(21)), Ok(Started::AlreadyRunning));
        assert!(p.on_signal(
            &Signal::PairSuccess {
                jid: "60123@s.whatsapp.net".into()
            },
            t(30)
        ));
        assert_eq!(
            p.phase,
            Phase::Paired {
                jid: Some("60123@s.whatsapp.net".into())
            }
        );
        assert!(!p.on_signal(&Signal::Connected, t(31)), "stays paired");
        assert!(matches!(
            p.start(None, t(40)),
            Err(PairingError::AlreadyPaired(_))
        ));
    }

    #[test]
    fn pair_code_pairing() {
        let mut p = Pairing::new(Phase::Idle, t(0));
        p.start(Some("60123456789".into()), t(0)).unwrap();
        assert!(
            !p.on_signal(&qr("2@ignored"), t(1)),
            "QRs are not shown in pair-code mode"
        );
        assert!(p.on_signal(
            &Signal::PairCode {
                code: "ABCD-EFGH".into(),
                valid_for: Duration::from_secs(180)
            },
            t(2)
        ));
        let v = p.view("sales");
        assert_eq!(v.state, "waiting_pair_code");
        assert_eq!(v.pair_code.as_deref(), Some("ABCD-EFGH"));
        assert_eq!(v.expires_at, Some(t(182)));
        // Asking with another number starts over.
        assert_eq!(p.start(Some("60111111111".into()), t(3)), Ok(Started::New));
        assert_eq!(p.phase, Phase::Connecting);
    }

    #[test]
    fn failures_end_the_attempt_and_allow_a_new_one() {
        let mut p = Pairing::new(Phase::Idle, t(0));
        p.start(None, t(0)).unwrap();
        assert!(p.on_signal(
            &Signal::TransportFailed("dns error: no such host".into()),
            t(1)
        ));
        assert_eq!(
            p.phase,
            Phase::Failed {
                reason: "cannot reach WhatsApp: dns error: no such host".into()
            }
        );
        assert!(!p.fail("again", t(2)), "only an attempt in progress fails");
        assert_eq!(p.start(None, t(3)), Ok(Started::New));
        p.on_signal(&qr("2@x"), t(4));
        assert!(
            !p.on_signal(&Signal::TransportFailed("reset".into()), t(5)),
            "a dropped socket after the QR is up is the crate's to retry"
        );
        assert!(p.on_signal(&Signal::QrExhausted, t(6)));
        assert_eq!(p.view("a").reason.as_deref(), Some(QR_EXHAUSTED));
        p.start(None, t(7)).unwrap();
        assert!(p.on_signal(&Signal::PairFailed("pairing failed: x".into()), t(8)));
        p.start(None, t(9)).unwrap();
        assert!(p.fail("cannot reach WhatsApp: no answer within 20s", t(29)));
        assert_eq!(p.view("a").state, "failed");
    }

    #[test]
    fn logged_out_says_so_and_can_pair_again() {
        let mut p = Pairing::new(Phase::Paired { jid: None }, t(0));
        assert!(p.on_signal(&Signal::LoggedOut("removed from phone".into()), t(1)));
        let v = p.view("sales");
        assert_eq!(v.state, "logged_out");
        assert_eq!(v.reason.as_deref(), Some("removed from phone"));
        assert_eq!(p.start(None, t(2)), Ok(Started::New));
    }

    #[test]
    fn a_stored_session_that_connects_is_paired() {
        let mut p = Pairing::new(Phase::Idle, t(0));
        assert!(p.on_signal(&Signal::Connected, t(1)));
        assert_eq!(p.view("x").state, "paired");
    }

    #[test]
    fn view_of_a_qr_has_text_and_png_link() {
        let mut p = Pairing::new(Phase::Idle, t(0));
        p.start(None, t(0)).unwrap();
        p.on_signal(&qr("2@payload,abc,def,ghi"), t(1));
        let v = p.view("sales");
        assert_eq!(v.state, "waiting_qr");
        assert_eq!(v.qr_png.as_deref(), Some("/v1/accounts/sales/pair/qr.png"));
        let text = v.qr_text.unwrap();
        assert!(text.lines().count() > 10);
        let json = serde_json::to_value(p.view("sales")).unwrap();
        assert_eq!(json["state"], "waiting_qr");
        assert!(json.get("reason").is_none(), "absent fields are left out");
    }

    #[test]
    fn png_is_a_scannable_size_and_matches_the_modules() {
        let payload = "2@abcdefghijklmnopqrstuvwxyz,0123456789,ABCDEFGH";
        let bytes = qr_png(payload).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let decoder = png::Decoder::new(std::io::Cursor::new(&bytes[..]));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        let code = QrCode::new(payload.as_bytes()).unwrap();
        let side = (code.width() + 2 * QUIET) * PNG_SCALE;
        assert_eq!((info.width as usize, info.height as usize), (side, side));
        let colors = code.to_colors();
        for (i, c) in colors.iter().enumerate() {
            let (mx, my) = (i % code.width() + QUIET, i / code.width() + QUIET);
            let px = buf[(my * PNG_SCALE + 1) * side + mx * PNG_SCALE + 1];
            assert_eq!(px == 0, *c == Color::Dark, "module {i}");
        }
        assert_eq!(buf[0], 255, "the quiet zone is white");
    }

    #[test]
    fn phone_numbers() {
        assert_eq!(normalize_phone("+60 12-345 6789").unwrap(), "60123456789");
        assert_eq!(normalize_phone("15551234567").unwrap(), "15551234567");
        for bad in ["", "012345678", "+60 12 abc", "123", "1234567890123456"] {
            assert!(normalize_phone(bad).is_err(), "{bad}");
        }
    }
}
