//! Deterministic message ids and the operator-facing outcome of a run.

use crate::domain::{GroupJid, RunId, RunStatus, TargetCounts, TimeZone};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

/// The message id for one part to one group of one run. Derived, never
/// random, so a resend after a crash carries the same id and a gateway that
/// deduplicates by id delivers it once. Shaped like WhatsApp Web's own ids
/// ("3EB0" + uppercase hex).
pub fn message_id(run: RunId, group: &GroupJid, part: u32) -> String {
    let digest = Sha256::digest(format!("herald:{}:{}:{}", run.0, group.as_str(), part));
    format!("3EB0{}", hex::encode_upper(&digest[..10]))
}

/// The id of the revoke or edit amendment `amendment` sends for `part`
/// of its run to `group`: derived like [`message_id`], so a group's
/// amendment sent again after a crash is not applied twice.
pub fn amend_message_id(amendment: i64, group: &GroupJid, part: u32) -> String {
    let digest = Sha256::digest(format!(
        "herald:amend:{amendment}:{}:{part}",
        group.as_str()
    ));
    format!("3EB0{}", hex::encode_upper(&digest[..10]))
}

/// Why a run stopped before every group was handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The operator stopped the run.
    Operator,
    /// The delivery window closed at this instant.
    WindowClosed(DateTime<Utc>),
    /// The account can no longer send (logged out, banned).
    Account(String),
    /// A daily, hourly or warm-up cap was reached and resets only after
    /// the window closes (a run without resume_next_window).
    Cap(String),
}

impl StopReason {
    /// The error recorded on each target left unsent.
    pub fn target_error(&self) -> String {
        match self {
            Self::Operator => "stopped by operator".into(),
            Self::WindowClosed(_) => "delivery window closed".into(),
            Self::Account(why) | Self::Cap(why) => why.clone(),
        }
    }
}

/// The final status and seed 000's summary wording.
pub fn finish(
    counts: &TargetCounts,
    stop: Option<&StopReason>,
    tz: &TimeZone,
) -> (RunStatus, Option<String>) {
    let total = counts.total();
    let sent = counts.sent;
    let delivered = format!("{sent} of {total} groups delivered.");
    let status = if sent == total && total > 0 {
        RunStatus::Success
    } else if matches!(stop, Some(StopReason::Operator)) {
        RunStatus::Cancelled
    } else if sent > 0 {
        RunStatus::Partial
    } else {
        RunStatus::Failed
    };
    let summary = match (status, stop) {
        (RunStatus::Success, _) => None,
        (_, Some(StopReason::WindowClosed(at))) => Some(format!(
            "Delivery window closed at {} ({}). {delivered} This account is at capacity for this fan-out — consider sending the remainder from another paired account.",
            at.with_timezone(&tz.tz()).format("%H:%M"),
            tz.name(),
        )),
        (_, Some(StopReason::Operator)) => Some(format!("Stopped by operator. {delivered}")),
        (_, Some(StopReason::Account(why))) => Some(format!(
            "{why}. {delivered} Re-pair or re-enable the account, then retry this run."
        )),
        (_, Some(StopReason::Cap(why))) => Some(format!(
            "{why}. {delivered} Turn on resume_next_window to carry the rest over, or send it from another paired account."
        )),
        (_, None) => Some(format!(
            "{delivered} {} failed, {} skipped; see the run's targets for each reason.",
            counts.failed, counts.skipped
        )),
    };
    (status, summary)
}

/// "X of Y delivered", the event stream's short form.
pub fn delivered_line(counts: &TargetCounts) -> String {
    format!("{} of {} delivered", counts.sent, counts.total())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(sent: u32, failed: u32, skipped: u32) -> TargetCounts {
        TargetCounts {
            sent,
            failed,
            skipped,
            ..Default::default()
        }
    }

    #[test]
    fn message_ids_are_stable_distinct_and_whatsapp_shaped() {
        let g = GroupJid::parse("120363000000000001@g.us").unwrap();
        let h = GroupJid::parse("120363000000000002@g.us").unwrap();
        let a = message_id(RunId(7), &g, 0);
        assert_eq!(a, message_id(RunId(7), &g, 0));
        assert_ne!(a, message_id(RunId(7), &g, 1));
        assert_ne!(a, message_id(RunId(8), &g, 0));
        assert_ne!(a, message_id(RunId(7), &h, 0));
        assert_eq!(a.len(), 24);
        assert!(a.starts_with("3EB0"));
        assert!(a[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)));
    }

    #[test]
    fn seed_wording_for_window_close() {
        let tz = TimeZone::parse("Asia/Kuala_Lumpur").unwrap();
        let at: DateTime<Utc> = "2026-11-23T10:00:00Z".parse().unwrap();
        let (status, summary) = finish(
            &counts(412, 0, 588),
            Some(&StopReason::WindowClosed(at)),
            &tz,
        );
        assert_eq!(status, RunStatus::Partial);
        assert_eq!(
            summary.unwrap(),
            "Delivery window closed at 18:00 (Asia/Kuala_Lumpur). 412 of 1000 groups delivered. This account is at capacity for this fan-out — consider sending the remainder from another paired account."
        );
    }

    #[test]
    fn statuses() {
        let tz = TimeZone::parse("UTC").unwrap();
        assert_eq!(
            finish(&counts(10, 0, 0), None, &tz),
            (RunStatus::Success, None)
        );
        assert_eq!(finish(&counts(0, 10, 0), None, &tz).0, RunStatus::Failed);
        assert_eq!(finish(&counts(3, 7, 0), None, &tz).0, RunStatus::Partial);
        let (s, text) = finish(&counts(3, 0, 7), Some(&StopReason::Operator), &tz);
        assert_eq!(s, RunStatus::Cancelled);
        assert_eq!(
            text.unwrap(),
            "Stopped by operator. 3 of 10 groups delivered."
        );
        let (s, text) = finish(
            &counts(0, 0, 5),
            Some(&StopReason::Account("Account logged out".into())),
            &tz,
        );
        assert_eq!(s, RunStatus::Failed);
        assert!(text
            .unwrap()
            .starts_with("Account logged out. 0 of 5 groups delivered."));
    }
}
