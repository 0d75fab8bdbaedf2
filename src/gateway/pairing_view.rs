//! What the control port shows of an account's pairing. Apart from the
//! WhatsApp gateway, which fills it in, so the API document states it in
//! every build.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Every state a pairing can be in, as `state` names it.
pub const STATES: &[&str] = &[
    "idle",
    "connecting",
    "waiting_qr",
    "waiting_pair_code",
    "paired",
    "failed",
    "logged_out",
];

/// `GET /v1/accounts/{id}/pair`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[schemars(rename = "Pairing")]
pub struct PairingView {
    pub account_id: String,
    #[schemars(extend("enum" = STATES))]
    pub state: &'static str,
    /// When the account entered this state.
    pub since: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    /// The QR payload (waiting_qr).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qr: Option<String>,
    /// The QR drawn with Unicode half blocks for a terminal (waiting_qr).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qr_text: Option<String>,
    /// Where the PNG of the same QR is served (waiting_qr).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qr_png: Option<String>,
    /// The 8-character code to type on the phone (waiting_pair_code).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair_code: Option<String>,
    /// When the QR or pair code stops being valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// The paired account's JID, when WhatsApp told us (paired).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jid: Option<String>,
    /// Why pairing failed or the account was logged out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
