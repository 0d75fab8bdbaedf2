//! Herald's domain: newtypes that are valid by construction, and the records
//! the engine, the scheduler and the control port pass around.
//!
//! Every `parse` refuses bad input with a [`ValidationError`] naming the
//! field and the rule, so the control port can answer with exactly that.

mod groups;
mod ids;
mod part;
mod records;
mod reminder;
mod schedule;
mod selector;
mod template;
mod window;

pub use groups::{
    fold_name, parse_labels, Group, GroupFilter, GroupInfo, GroupPage, GroupSyncSummary, Label,
    MAX_LABELS,
};
pub use ids::{AccountId, GroupJid, MediaId, RunId, TimeZone};
pub use part::{MessagePart, MAX_CAPTION_CHARS, MAX_TEXT_CHARS};
pub use records::*;
pub use reminder::{NewReminder, ReminderRequest, MAX_PARTS, MAX_TARGETS, MAX_TITLE_CHARS};
pub use schedule::{dst_note, Schedule};
pub use selector::{
    chosen_by, resolve_entries, resolve_targets, ImportRefused, NamePattern, Offender,
    SelectorRequest, TargetSelector, CHOSEN_EXPLICIT, MAX_ENTRY_CHARS, MAX_PATTERN_CHARS,
};
pub use template::{Pick, RenderVars, Template, GROUP_NAME_FALLBACK, VARIABLES};
pub use window::{resolve_local, WindowHours, WindowSpan};

use std::fmt;

/// A value refused at the edge: `field` is a dotted path into the request
/// ("window.end_hour", "targets[3]"), `rule` says what it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct ValidationError {
    pub field: String,
    pub rule: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, rule: impl fmt::Display) -> Self {
        Self {
            field: field.into(),
            rule: rule.to_string(),
        }
    }

    /// Re-roots the error under a parent field, e.g. `parts[2]` + `caption`.
    pub fn under(self, parent: &str) -> Self {
        Self {
            field: format!("{parent}.{}", self.field),
            rule: self.rule,
        }
    }
}
