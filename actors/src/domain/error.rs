//! The one error every parser in the domain answers: which field, which rule.

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
