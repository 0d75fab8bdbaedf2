//! Taking a run back after it was sent: a recall deletes every message the
//! run sent for everyone, an edit replaces the text of its text parts and
//! captions. Both are an *amendment* of the run: work of its account like a
//! run, paced by the same bucket, one mark per group before and after the
//! wire, so that no group is amended twice and none is missed.

use super::{GroupJid, PartKind, RunId, ValidationError, MAX_CAPTION_CHARS, MAX_TEXT_CHARS};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How long WhatsApp lets a sender take a message back, by default:
/// delete for everyone about two days, edit 15 minutes.
pub const RECALL_WINDOW: std::time::Duration = std::time::Duration::from_secs(2 * 24 * 3600);
pub const EDIT_WINDOW: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The windows an amendment must fit in (settings `recall.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmendWindows {
    pub recall: std::time::Duration,
    pub edit: std::time::Duration,
}

impl Default for AmendWindows {
    fn default() -> Self {
        Self {
            recall: RECALL_WINDOW,
            edit: EDIT_WINDOW,
        }
    }
}

impl AmendWindows {
    pub fn of(&self, kind: AmendKind) -> std::time::Duration {
        match kind {
            AmendKind::Recall => self.recall,
            AmendKind::Edit => self.edit,
        }
    }
}

/// What an amendment does to each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AmendKind {
    /// Delete for everyone.
    Recall,
    /// Replace the text (or the caption).
    Edit,
}

impl AmendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recall => "recall",
            Self::Edit => "edit",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "recall" => Some(Self::Recall),
            "edit" => Some(Self::Edit),
            _ => None,
        }
    }

    /// The events that open and close it.
    pub fn started_event(self) -> &'static str {
        match self {
            Self::Recall => "run_recall_started",
            Self::Edit => "run_edit_started",
        }
    }

    pub fn finished_event(self) -> &'static str {
        match self {
            Self::Recall => "run_recall_finished",
            Self::Edit => "run_edit_finished",
        }
    }

    /// "recalled", "edited".
    pub fn done_word(self) -> &'static str {
        match self {
            Self::Recall => "recalled",
            Self::Edit => "edited",
        }
    }
}

impl std::fmt::Display for AmendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where one group stands in an amendment. No state: not reached yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AmendState {
    /// Marked before the wire: after a crash the group's messages are sent
    /// again with the same ids, which WhatsApp does not apply twice.
    Sending,
    Done,
    /// Its messages were past WhatsApp's window for this when reached.
    TooOld,
    /// WhatsApp refused it for this group (left the group, removed).
    Failed,
}

impl AmendState {
    pub const NAMES: &'static [&'static str] = &["sending", "done", "too_old", "failed"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sending => "sending",
            Self::Done => "done",
            Self::TooOld => "too_old",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sending" => Some(Self::Sending),
            "done" => Some(Self::Done),
            "too_old" => Some(Self::TooOld),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }

    pub fn is_final(self) -> bool {
        self != Self::Sending
    }

    /// The states a mark to `self` may come from (`None`: unmarked). A
    /// final state is never left: a group is amended at most once.
    pub fn allowed_from(self, from: Option<AmendState>) -> bool {
        match self {
            Self::Sending => from.is_none(),
            // Too old, or refused, may be found before the wire too.
            Self::Done => from == Some(Self::Sending),
            Self::TooOld | Self::Failed => matches!(from, None | Some(Self::Sending)),
        }
    }
}

impl std::fmt::Display for AmendState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An amendment as requested: `edits[p]` is part `p`'s new text (edits
/// only; `None` leaves the part as it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAmendment {
    pub run_id: RunId,
    pub kind: AmendKind,
    pub edits: Vec<Option<String>>,
    pub requested_at: DateTime<Utc>,
    /// A group whose messages were sent longer ago than this is too old.
    pub window_secs: i64,
}

/// An amendment, with its progress over the run's groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Amendment {
    pub id: i64,
    pub run_id: RunId,
    pub kind: AmendKind,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<Option<String>>,
    pub requested_at: DateTime<Utc>,
    pub window_secs: i64,
    pub finished_at: Option<DateTime<Utc>>,
    pub progress: AmendProgress,
    /// In the answer to an edit: the parts it leaves as they were sent
    /// (polls, which WhatsApp does not edit). Not kept.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub left_as_sent: Vec<String>,
}

impl Amendment {
    pub fn is_finished(&self) -> bool {
        self.finished_at.is_some()
    }
}

/// Groups by where they stand: `total` counts the groups the run sent at
/// least one message to (the only ones there is anything to amend in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct AmendProgress {
    pub total: u32,
    pub done: u32,
    pub too_old: u32,
    pub failed: u32,
    /// Marked before the wire, not yet after.
    pub sending: u32,
}

impl AmendProgress {
    pub fn add(&mut self, state: Option<AmendState>, n: u32) {
        match state {
            Some(AmendState::Done) => self.done += n,
            Some(AmendState::TooOld) => self.too_old += n,
            Some(AmendState::Failed) => self.failed += n,
            Some(AmendState::Sending) => self.sending += n,
            None => {}
        }
    }

    /// Groups with a final state.
    pub fn settled(&self) -> u32 {
        self.done + self.too_old + self.failed
    }

    /// "12 of 40 groups recalled, 3 too old to recall".
    pub fn line(&self, kind: AmendKind) -> String {
        let mut s = format!(
            "{} of {} groups {}",
            self.done,
            self.total,
            kind.done_word()
        );
        if self.too_old > 0 {
            s.push_str(&format!(", {} too old to {kind}", self.too_old));
        }
        if self.failed > 0 {
            s.push_str(&format!(", {} refused", self.failed));
        }
        s
    }
}

/// One group an amendment works on, with the run's messages to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmendTarget {
    pub target_id: i64,
    pub position: u32,
    pub group: GroupJid,
    /// Parts the gateway accepted.
    pub parts_sent: u32,
    /// Whether the part after them may have reached the group too: its
    /// send was under way when its answer was lost (a crash, a timeout).
    /// Amending a message that never arrived is harmless, missing one that
    /// did is not.
    pub in_flight: bool,
    /// When its last part was sent (`None`: its answer was lost).
    pub sent_at: Option<DateTime<Utc>>,
    pub state: Option<AmendState>,
    /// When the group was last marked in this amendment (its chart's time).
    pub marked_at: Option<DateTime<Utc>>,
}

impl AmendTarget {
    /// How many messages may have reached the group.
    pub fn messages(&self) -> u32 {
        self.parts_sent + u32::from(self.in_flight)
    }

    /// Whether its messages are past a window of `window_secs` at `now`.
    pub fn too_old(&self, window_secs: i64, now: DateTime<Utc>) -> bool {
        self.sent_at
            .is_some_and(|at| now - at >= chrono::TimeDelta::seconds(window_secs))
    }
}

/// Checks an edit's texts against the parts they replace. Answers `edits`
/// by part: a text part takes `text`, a picture `caption`, and a poll
/// nothing (WhatsApp does not edit polls; [`polls_left`] names them).
pub fn edits_for(
    parts: &[PartKind],
    text: Option<&str>,
    caption: Option<&str>,
) -> Result<Vec<Option<String>>, ValidationError> {
    if text.is_none() && caption.is_none() {
        return Err(ValidationError::new(
            "text",
            "give the new text, or the new caption, or both",
        ));
    }
    let check = |field: &'static str, v: &str, max: usize| {
        let n = v.chars().count();
        if v.trim().is_empty() {
            return Err(ValidationError::new(field, "must not be empty"));
        }
        if n > max {
            return Err(ValidationError::new(
                field,
                format!("must be at most {max} characters (got {n})"),
            ));
        }
        Ok(())
    };
    if let Some(t) = text {
        check("text", t, MAX_TEXT_CHARS)?;
        if !parts.contains(&PartKind::Text) {
            return Err(ValidationError::new(
                "text",
                "the run sent no text part to edit (give `caption` for its pictures)",
            ));
        }
    }
    if let Some(c) = caption {
        check("caption", c, MAX_CAPTION_CHARS)?;
        if !parts.contains(&PartKind::Media) {
            return Err(ValidationError::new(
                "caption",
                "the run sent no picture whose caption could be edited",
            ));
        }
    }
    Ok(parts
        .iter()
        .map(|kind| match kind {
            PartKind::Text => text.map(str::to_owned),
            PartKind::Media => caption.map(str::to_owned),
            PartKind::Poll => None,
        })
        .collect())
}

/// The fields of a run's poll parts, which an edit leaves as they were
/// sent (`parts[1]`).
pub fn polls_left(parts: &[PartKind]) -> Vec<String> {
    parts
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == PartKind::Poll)
        .map(|(i, _)| format!("parts[{i}]"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_state_is_never_left_and_done_needs_the_mark_before_the_wire() {
        use AmendState::*;
        let all = [None, Some(Sending), Some(Done), Some(TooOld), Some(Failed)];
        for to in [Sending, Done, TooOld, Failed] {
            for from in all {
                let allowed = to.allowed_from(from);
                if from.is_some_and(AmendState::is_final) {
                    assert!(!allowed, "{from:?} -> {to:?}");
                }
            }
        }
        assert!(Sending.allowed_from(None));
        assert!(!Done.allowed_from(None));
        assert!(Done.allowed_from(Some(Sending)));
        assert!(!Sending.allowed_from(Some(Sending)));
    }

    #[test]
    fn an_edit_names_the_field_it_cannot_apply() {
        use PartKind::{Media as M, Poll as P, Text as T};
        let e = edits_for(&[M], Some("new"), None).unwrap_err();
        assert_eq!(e.field, "text");
        let e = edits_for(&[T], None, Some("new")).unwrap_err();
        assert_eq!(e.field, "caption");
        let e = edits_for(&[T], None, None).unwrap_err();
        assert_eq!(e.field, "text");
        let e = edits_for(&[T], Some("  "), None).unwrap_err();
        assert!(e.to_string().contains("must not be empty"), "{e}");
        assert_eq!(
            edits_for(&[T, M], Some("t"), None).unwrap(),
            vec![Some("t".to_owned()), None]
        );
        assert_eq!(
            edits_for(&[T, M], Some("t"), Some("c")).unwrap(),
            vec![Some("t".to_owned()), Some("c".to_owned())]
        );
        // A poll is left as it was; an edit with nothing else to touch is
        // refused for the field it gave.
        assert_eq!(
            edits_for(&[T, P], Some("t"), None).unwrap(),
            vec![Some("t".to_owned()), None]
        );
        assert_eq!(polls_left(&[T, P]), vec!["parts[1]".to_owned()]);
        let e = edits_for(&[P], Some("t"), None).unwrap_err();
        assert_eq!(e.field, "text");
    }

    #[test]
    fn too_old_counts_from_the_last_send_and_an_unknown_send_is_never_too_old() {
        let at = |s: i64| DateTime::<Utc>::from_timestamp(s, 0).unwrap();
        let mut t = AmendTarget {
            target_id: 1,
            position: 0,
            group: GroupJid::parse("1@g.us").unwrap(),
            parts_sent: 1,
            in_flight: false,
            sent_at: Some(at(1000)),
            state: None,
            marked_at: None,
        };
        assert!(!t.too_old(900, at(1899)));
        assert!(t.too_old(900, at(1900)));
        t.sent_at = None;
        assert!(!t.too_old(900, at(99_999)));
    }

    #[test]
    fn the_progress_line_says_what_was_not_done() {
        let p = AmendProgress {
            total: 40,
            done: 12,
            too_old: 3,
            failed: 1,
            sending: 0,
        };
        assert_eq!(
            p.line(AmendKind::Recall),
            "12 of 40 groups recalled, 3 too old to recall, 1 refused"
        );
        assert_eq!(p.settled(), 16);
    }
}
