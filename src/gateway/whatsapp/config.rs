//! The gateway's time limits and sizes, from the `[whatsapp]` settings.

use std::time::Duration;

/// The gateway's time limits and sizes.
#[derive(Debug, Clone)]
pub struct WhatsappConfig {
    /// How long a sent message may wait for the server's ack before the
    /// send answers `Transient` (the engine resends with the same id).
    pub ack_timeout: Duration,
    /// How long a send waits for a dropped connection to come back before
    /// answering `Unreachable`; also how long a drop lasts before the
    /// account is recorded as disconnected.
    pub reconnect_wait: Duration,
    /// How long starting pairing waits for WhatsApp's first answer (a QR or
    /// pair code) before failing with "cannot reach WhatsApp".
    pub connect_timeout: Duration,
    /// Limit for one request (send, group query).
    pub request_timeout: Duration,
    /// Limit for one media upload.
    pub upload_timeout: Duration,
    /// How long an uploaded picture is reused before uploading it again.
    pub upload_valid_for: Duration,
    /// How long the account's group list is trusted.
    pub groups_ttl: Duration,
    /// Accepted message ids remembered per account (duplicate detection).
    pub remember_acks: usize,
    /// Worker threads of the WhatsApp runtime.
    pub threads: usize,
    /// Paired sessions opened at once at start-up.
    pub resume_concurrency: usize,
    /// Logins started a second when many accounts connect at once.
    pub logins_per_sec: u32,
    /// WebSocket URL override (tests point it at loopback).
    pub transport_url: Option<String>,
    /// Fixed WhatsApp Web version instead of fetching the current one.
    pub version_override: Option<(u32, u32, u32)>,
    /// The new-chat quota query's document id (`whatsapp.quota_doc_id`).
    pub quota_doc_id: &'static str,
}

impl Default for WhatsappConfig {
    fn default() -> Self {
        Self {
            ack_timeout: Duration::from_secs(30),
            reconnect_wait: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(20),
            request_timeout: Duration::from_secs(20),
            upload_timeout: Duration::from_secs(120),
            // CDN media outlives this comfortably; re-uploading weekly is cheap.
            upload_valid_for: Duration::from_secs(7 * 24 * 3600),
            groups_ttl: Duration::from_secs(600),
            remember_acks: 100_000,
            threads: 2,
            resume_concurrency: 8,
            logins_per_sec: 10,
            transport_url: None,
            version_override: None,
            quota_doc_id: wacore_quota_doc_id(),
        }
    }
}

impl WhatsappConfig {
    /// The gateway's settings from the `[whatsapp]` section (validated
    /// there), on top of the defaults for what is not configurable.
    pub fn from_settings(w: &crate::settings::WhatsappSettings) -> Self {
        let secs = Duration::from_secs;
        Self {
            ack_timeout: secs(w.ack_timeout_secs),
            reconnect_wait: secs(w.reconnect_wait_secs),
            connect_timeout: secs(w.connect_timeout_secs),
            request_timeout: secs(w.request_timeout_secs),
            upload_timeout: secs(w.upload_timeout_secs),
            upload_valid_for: secs(w.upload_valid_hours.saturating_mul(3600)),
            groups_ttl: secs(w.groups_ttl_secs),
            threads: w.threads as usize,
            logins_per_sec: w.logins_per_sec,
            transport_url: Some(w.server_url.clone()).filter(|u| !u.is_empty()),
            // Validated with the settings.
            version_override: w.version_numbers().ok().flatten(),
            // Read once at start, for the life of the process: the client
            // takes a document id as `&'static str`.
            quota_doc_id: if w.quota_doc_id == wacore_quota_doc_id() {
                wacore_quota_doc_id()
            } else {
                Box::leak(w.quota_doc_id.clone().into_boxed_str())
            },
            ..Self::default()
        }
    }
}

/// The quota query's document id in the client version Herald pins.
fn wacore_quota_doc_id() -> &'static str {
    whatsapp_rust::wacore::iq::mex_operations::fetch_new_chat_message_capping_info::DOC_ID
}
