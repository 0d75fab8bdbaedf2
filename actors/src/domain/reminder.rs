use super::{
    AccountId, GroupJid, MessagePart, RenderVars, Schedule, SelectorRequest, TargetSelector,
    TimeZone, ValidationError, WindowHours,
};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

pub const MAX_PARTS: usize = 10;
/// A generous ceiling: at 40 messages a minute 10,000 groups already need
/// more than four hours per part.
pub const MAX_TARGETS: usize = 10_000;
pub const MAX_TITLE_CHARS: usize = 200;

/// A reminder as an operator asks for it, valid by construction: at least
/// one part, at least one explicit target or a selector, no target twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct NewReminder {
    pub account_id: AccountId,
    pub title: String,
    pub timezone: TimeZone,
    pub schedule: Schedule,
    pub window: WindowHours,
    pub resume_next_window: bool,
    pub parts: Vec<MessagePart>,
    pub targets: Vec<GroupJid>,
    /// Groups picked from the account's directory when a run starts, on
    /// top of `targets`.
    pub select: Option<TargetSelector>,
    /// No two groups of a run receive byte-identical text: every text
    /// and caption with alternatives gives each group its own variant
    /// (refused when saved if a template cannot give enough).
    pub unique_texts: bool,
}

impl NewReminder {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        account_id: AccountId,
        title: &str,
        timezone: TimeZone,
        schedule: Schedule,
        window: WindowHours,
        resume_next_window: bool,
        parts: Vec<MessagePart>,
        targets: Vec<GroupJid>,
    ) -> Result<Self, ValidationError> {
        Self::build(
            account_id,
            title,
            timezone,
            schedule,
            window,
            resume_next_window,
            parts,
            targets,
            None,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        account_id: AccountId,
        title: &str,
        timezone: TimeZone,
        schedule: Schedule,
        window: WindowHours,
        resume_next_window: bool,
        parts: Vec<MessagePart>,
        targets: Vec<GroupJid>,
        select: Option<TargetSelector>,
    ) -> Result<Self, ValidationError> {
        let title = title.trim();
        if title.is_empty() || title.chars().count() > MAX_TITLE_CHARS {
            return Err(ValidationError::new(
                "title",
                format!("must be 1–{MAX_TITLE_CHARS} characters"),
            ));
        }
        if parts.is_empty() || parts.len() > MAX_PARTS {
            return Err(ValidationError::new(
                "parts",
                format!("must have 1–{MAX_PARTS} parts"),
            ));
        }
        if (targets.is_empty() && select.is_none()) || targets.len() > MAX_TARGETS {
            return Err(ValidationError::new(
                "targets",
                format!("must have 1–{MAX_TARGETS} groups, or may be empty when select is given"),
            ));
        }
        let mut seen = HashSet::with_capacity(targets.len());
        for (i, t) in targets.iter().enumerate() {
            if !seen.insert(t) {
                return Err(ValidationError::new(
                    format!("targets[{i}]"),
                    format!("duplicate group {t}"),
                ));
            }
        }
        Ok(Self {
            account_id,
            title: title.to_owned(),
            timezone,
            schedule,
            window,
            resume_next_window,
            parts,
            targets,
            select,
            unique_texts: false,
        })
    }

    /// Turns the "no two groups alike" option on or off; on, refused with
    /// the part's field if a text or caption cannot give every target its
    /// own text.
    pub fn with_unique_texts(mut self, on: bool) -> Result<Self, ValidationError> {
        if on {
            let vars = RenderVars {
                scheduled_for: chrono::DateTime::UNIX_EPOCH,
                timezone: &self.timezone,
                title: &self.title,
                group_name: None,
            };
            for (i, part) in self.parts.iter().enumerate() {
                if part.written().is_none() {
                    continue;
                }
                let field = format!("parts[{i}].{}", part.written_field());
                if let Some(t) = part.template() {
                    t.check_unique(self.targets.len(), &field, &vars)?;
                }
            }
        }
        self.unique_texts = on;
        Ok(self)
    }
}

/// The JSON body of a create or update. Fields are parsed one by one so an
/// error names the exact path (`targets[3]`, `parts[0].caption`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReminderRequest {
    pub account_id: String,
    pub title: String,
    pub timezone: String,
    pub schedule: serde_json::Value,
    #[serde(default)]
    pub window: Option<serde_json::Value>,
    #[serde(default)]
    pub resume_next_window: bool,
    pub parts: Vec<serde_json::Value>,
    /// Explicit JIDs; may be left out when `select` is given.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Groups chosen from the account's directory; see [`TargetSelector`].
    #[serde(default)]
    pub select: Option<serde_json::Value>,
    /// See [`NewReminder::unique_texts`].
    #[serde(default)]
    pub unique_texts: bool,
}

impl ReminderRequest {
    pub fn parse(self) -> Result<NewReminder, ValidationError> {
        let account_id = AccountId::parse(&self.account_id)?;
        let timezone = TimeZone::parse(&self.timezone)?;
        let mut schedule: Schedule = from_value(self.schedule, "schedule")?;
        schedule.settle(&timezone)?;
        let window = match self.window {
            Some(w) => from_value(w, "window")?,
            None => WindowHours::default(),
        };
        let parts = self
            .parts
            .into_iter()
            .enumerate()
            .map(|(i, p)| from_value(p, &format!("parts[{i}]")))
            .collect::<Result<Vec<MessagePart>, _>>()?;
        let targets = self
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                GroupJid::parse(t)
                    .map_err(|e| ValidationError::new(format!("targets[{i}]"), e.rule))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let select = match self.select {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(from_value::<SelectorRequest>(v, "select")?.parse(&targets)?),
        };
        NewReminder::build(
            account_id,
            &self.title,
            timezone,
            schedule,
            window,
            self.resume_next_window,
            parts,
            targets,
            select,
        )?
        .with_unique_texts(self.unique_texts)
    }
}

/// Deserialises a nested value, turning a serde message that carries a
/// `field: rule` from our own parsers into a path under `at`.
fn from_value<T: serde::de::DeserializeOwned>(
    v: serde_json::Value,
    at: &str,
) -> Result<T, ValidationError> {
    serde_json::from_value(v).map_err(|e| {
        let msg = e.to_string();
        match msg.split_once(": ") {
            // Our parsers report "field: rule"; the inner field is already
            // rooted ("window.end_hour", "schedule.cron") or local ("caption").
            Some((field, rule)) if !field.contains(' ') => {
                if field.starts_with(at.split('[').next().unwrap_or(at)) {
                    ValidationError::new(field, rule)
                } else {
                    ValidationError::new(format!("{at}.{field}"), rule)
                }
            }
            _ => ValidationError::new(at, msg),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(json: serde_json::Value) -> Result<NewReminder, ValidationError> {
        serde_json::from_value::<ReminderRequest>(json)
            .unwrap()
            .parse()
    }

    fn valid() -> serde_json::Value {
        serde_json::json!({
            "account_id": "sales-1",
            "title": "Monday standup",
            "timezone": "Asia/Kuala_Lumpur",
            "schedule": {"cron": "0 9 * * 1"},
            "parts": [{"kind": "text", "text": "Standup in 10 minutes"}],
            "targets": ["120363000000000001@g.us", "120363000000000002@g.us"],
        })
    }

    #[test]
    fn a_valid_request_parses_with_default_window() {
        let r = request(valid()).unwrap();
        assert_eq!(r.window, WindowHours::default());
        assert_eq!(r.targets.len(), 2);
        assert!(!r.resume_next_window);
    }

    #[test]
    fn each_rule_names_its_field() {
        let cases: Vec<(&str, serde_json::Value, &str)> = vec![
            ("timezone", serde_json::json!("Mars/Base"), "timezone"),
            (
                "window",
                serde_json::json!({"start_hour": 6, "end_hour": 25}),
                "window.end_hour",
            ),
            ("parts", serde_json::json!([]), "parts"),
            ("targets", serde_json::json!([]), "targets"),
            (
                "targets",
                serde_json::json!(["120363000000000001@g.us", "12345"]),
                "targets[1]",
            ),
            (
                "targets",
                serde_json::json!(["120363000000000001@g.us", "120363000000000001@g.us"]),
                "targets[1]",
            ),
            (
                "schedule",
                serde_json::json!({"cron": "0 9 * *"}),
                "schedule.cron",
            ),
            ("account_id", serde_json::json!("Bad Id"), "account_id"),
            ("title", serde_json::json!(" "), "title"),
            (
                "parts",
                serde_json::json!([{"kind": "media", "media": "0".repeat(64), "caption": "x".repeat(1025)}]),
                "parts[0].caption",
            ),
        ];
        for (key, value, field) in cases {
            let mut body = valid();
            body[key] = value;
            let err = request(body).unwrap_err();
            assert_eq!(err.field, field, "{key}: {err}");
        }
    }

    #[test]
    fn unique_texts_is_refused_when_a_template_cannot_cover_the_targets() {
        let mut body = valid();
        body["unique_texts"] = serde_json::json!(true);
        body["parts"] = serde_json::json!([
            {"kind": "text", "text": "{Hi|Hello} team"},
            {"kind": "text", "text": "Standup at 9"},
        ]);
        // Two groups: the first part gives two texts, the second only one.
        let err = request(body.clone()).unwrap_err();
        assert_eq!(err.field, "parts[1].text");
        assert!(err.rule.contains("unique_texts"), "{}", err.rule);
        body["parts"][1]["text"] = serde_json::json!("Standup at {9|nine}");
        assert!(request(body.clone()).unwrap().unique_texts);
        body["targets"] = serde_json::json!([
            "120363000000000001@g.us",
            "120363000000000002@g.us",
            "120363000000000003@g.us"
        ]);
        assert_eq!(request(body).unwrap_err().field, "parts[0].text");
    }

    #[test]
    fn a_bad_template_names_its_part() {
        let mut body = valid();
        body["parts"] = serde_json::json!([{"kind": "text", "text": "Hi {nme}"}]);
        let err = request(body).unwrap_err();
        assert_eq!(err.field, "parts[0].text");
        assert!(err.rule.contains("unknown variable {nme}"), "{}", err.rule);
    }

    proptest! {
        #[test]
        fn duplicates_are_always_found(n in 2usize..50, dup_at in 0usize..49) {
            let dup_at = dup_at % (n - 1);
            let mut targets: Vec<String> = (0..n).map(|i| format!("1203630000{i:08}@g.us")).collect();
            targets[n - 1] = targets[dup_at].clone();
            let mut body = valid();
            body["targets"] = serde_json::json!(targets);
            let err = request(body).unwrap_err();
            prop_assert_eq!(err.field, format!("targets[{}]", n - 1));
        }
    }
}
