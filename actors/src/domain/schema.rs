//! The JSON Schema of the domain types whose JSON is not what a derive
//! would read off their fields: strings held to a rule, and the shapes a
//! request gives and an answer shows back. The control port's API document
//! is generated from these and from the derives on the records.

use super::{
    AccountId, GroupJid, MediaId, MessagePart, Schedule, TargetSelector, TimeZone, WindowHours,
};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use std::borrow::Cow;

/// A string newtype with the rule `parse` enforces, as its pattern (a
/// property test keeps each pattern and its parser in agreement).
macro_rules! pattern_string {
    ($($ty:ty => $pattern:expr),+ $(,)?) => {$(
        impl JsonSchema for $ty {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> Cow<'static, str> {
                stringify!($ty).into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({ "type": "string", "pattern": $pattern })
            }
        }
    )+};
}

pattern_string!(
    AccountId => AccountId::PATTERN,
    GroupJid => GroupJid::PATTERN,
    MediaId => MediaId::PATTERN,
);

impl JsonSchema for TimeZone {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "TimeZone".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "description": "An IANA timezone name" })
    }
}

/// A shape that an answer shows exactly as a request gives it. The API
/// document states it once, from the rules that parse the request, and
/// puts that statement under this name in place of the one here; the
/// document's own test fails if it does not.
macro_rules! shaped_by_request {
    ($($ty:ty => $name:literal),+ $(,)?) => {$(
        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({ "description": concat!("As a request's `", $name, "`") })
            }
        }
    )+};
}

shaped_by_request!(
    Schedule => "Schedule",
    WindowHours => "Window",
    MessagePart => "Part",
    TargetSelector => "TargetSelector",
);

/// The names [`shaped_by_request`] gives: the document must state each.
pub const REQUEST_SHAPES: &[&str] = &["Schedule", "Window", "Part", "TargetSelector"];
