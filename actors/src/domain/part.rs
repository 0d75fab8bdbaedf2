use super::{MediaId, Template, ValidationError};
use serde::{Deserialize, Serialize};

/// WhatsApp refuses text messages longer than this many characters.
pub const MAX_TEXT_CHARS: usize = 65_536;
/// WhatsApp truncates media captions past this many characters; we refuse
/// instead, so the operator never sees a silently cut reminder.
pub const MAX_CAPTION_CHARS: usize = 1024;
/// WhatsApp's poll limits: a question of at most 255 characters, 2 to 12
/// options of at most 100 characters each, no two alike.
pub const MAX_POLL_QUESTION_CHARS: usize = 255;
pub const MAX_POLL_OPTION_CHARS: usize = 100;
pub const MIN_POLL_OPTIONS: usize = 2;
pub const MAX_POLL_OPTIONS: usize = 12;

/// One message of a reminder. A group receives a reminder's parts strictly
/// in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MessagePart {
    Text {
        text: String,
    },
    Media {
        media: MediaId,
        caption: Option<String>,
    },
    /// A WhatsApp poll: the question is a template like a text; the
    /// options go out as written, because a vote names its options by a
    /// hash of their text and one group's votes must add up with another's.
    Poll {
        question: String,
        options: Vec<String>,
        /// Members may pick several options (otherwise one).
        multiple: bool,
    },
}

impl MessagePart {
    pub fn text(text: &str) -> Result<Self, ValidationError> {
        let n = text.chars().count();
        if text.trim().is_empty() {
            return Err(ValidationError::new("text", "must not be empty"));
        }
        if n > MAX_TEXT_CHARS {
            return Err(ValidationError::new(
                "text",
                format!("must be at most {MAX_TEXT_CHARS} characters (got {n})"),
            ));
        }
        check_template(text, "text", MAX_TEXT_CHARS)?;
        Ok(Self::Text {
            text: text.to_owned(),
        })
    }

    pub fn media(media: MediaId, caption: Option<&str>) -> Result<Self, ValidationError> {
        let caption = caption.filter(|c| !c.is_empty());
        if let Some(c) = caption {
            let n = c.chars().count();
            if n > MAX_CAPTION_CHARS {
                return Err(ValidationError::new(
                    "caption",
                    format!("must be at most {MAX_CAPTION_CHARS} characters (got {n})"),
                ));
            }
            check_template(c, "caption", MAX_CAPTION_CHARS)?;
        }
        Ok(Self::Media {
            media,
            caption: caption.map(str::to_owned),
        })
    }

    pub fn poll(
        question: &str,
        options: &[String],
        multiple: bool,
    ) -> Result<Self, ValidationError> {
        let n = question.chars().count();
        if question.trim().is_empty() {
            return Err(ValidationError::new("question", "must not be empty"));
        }
        if n > MAX_POLL_QUESTION_CHARS {
            return Err(ValidationError::new(
                "question",
                format!("must be at most {MAX_POLL_QUESTION_CHARS} characters (got {n})"),
            ));
        }
        check_template(question, "question", MAX_POLL_QUESTION_CHARS)?;
        if !(MIN_POLL_OPTIONS..=MAX_POLL_OPTIONS).contains(&options.len()) {
            return Err(ValidationError::new(
                "options",
                format!(
                    "must list {MIN_POLL_OPTIONS} to {MAX_POLL_OPTIONS} options (got {})",
                    options.len()
                ),
            ));
        }
        for (i, o) in options.iter().enumerate() {
            let field = format!("options[{i}]");
            let n = o.chars().count();
            if o.trim().is_empty() {
                return Err(ValidationError::new(field, "must not be empty"));
            }
            if n > MAX_POLL_OPTION_CHARS {
                return Err(ValidationError::new(
                    field,
                    format!("must be at most {MAX_POLL_OPTION_CHARS} characters (got {n})"),
                ));
            }
            // WhatsApp tells options apart by their text: two alike would
            // share their votes.
            if let Some(j) = options[..i].iter().position(|p| p.trim() == o.trim()) {
                return Err(ValidationError::new(
                    field,
                    format!("must differ from options[{j}] (both read {:?})", o.trim()),
                ));
            }
        }
        Ok(Self::Poll {
            question: question.to_owned(),
            options: options.to_vec(),
            multiple,
        })
    }

    /// The words a person reads first: a text, a caption, a poll's
    /// question (the part of it that is a template).
    pub fn written(&self) -> Option<&str> {
        match self {
            Self::Text { text } => Some(text),
            Self::Media { caption, .. } => caption.as_deref(),
            Self::Poll { question, .. } => Some(question),
        }
    }

    /// The field [`MessagePart::written`] comes from.
    pub fn written_field(&self) -> &'static str {
        match self {
            Self::Text { .. } => "text",
            Self::Media { .. } => "caption",
            Self::Poll { .. } => "question",
        }
    }

    /// The part's text, caption or question as a template (parsed when
    /// saved; a stored text that no longer parses is sent as written).
    pub fn template(&self) -> Option<Template> {
        Template::parse(self.written()?, self.written_field()).ok()
    }

    pub fn media_id(&self) -> Option<&MediaId> {
        match self {
            Self::Media { media, .. } => Some(media),
            Self::Text { .. } | Self::Poll { .. } => None,
        }
    }

    pub fn kind(&self) -> PartKind {
        match self {
            Self::Text { .. } => PartKind::Text,
            Self::Media { .. } => PartKind::Media,
            Self::Poll { .. } => PartKind::Poll,
        }
    }
}

/// What kind of message a part is, as stored and as an edit sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    Text,
    Media,
    Poll,
}

impl PartKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Media => "media",
            Self::Poll => "poll",
        }
    }
}

/// Text and captions are templates: refused here if they do not parse, or
/// if their longest rendering could pass WhatsApp's limit.
fn check_template(text: &str, field: &str, max: usize) -> Result<(), ValidationError> {
    let t = Template::parse(text, field)?;
    let longest = t.max_chars();
    if !t.is_plain() && longest > max {
        return Err(ValidationError::new(
            field,
            format!(
                "may render up to {longest} characters (variables count as 200), more than {max}"
            ),
        ));
    }
    Ok(())
}

/// The wire form, parsed through the constructors so limits always apply.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum RawPart {
    Text {
        text: String,
    },
    Media {
        media: String,
        caption: Option<String>,
    },
    Poll {
        question: String,
        options: Vec<String>,
        #[serde(default)]
        multiple: bool,
    },
}

impl<'de> Deserialize<'de> for MessagePart {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let parsed = match RawPart::deserialize(d)? {
            RawPart::Text { text } => Self::text(&text),
            RawPart::Media { media, caption } => {
                MediaId::parse(&media).and_then(|m| Self::media(m, caption.as_deref()))
            }
            RawPart::Poll {
                question,
                options,
                multiple,
            } => Self::poll(&question, &options, multiple),
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn media() -> MediaId {
        MediaId::of_bytes(b"picture")
    }

    #[test]
    fn text_limits() {
        assert!(MessagePart::text("Standup at 9").is_ok());
        assert_eq!(
            MessagePart::text("  ").unwrap_err().rule,
            "must not be empty"
        );
        assert!(MessagePart::text(&"x".repeat(MAX_TEXT_CHARS)).is_ok());
        let err = MessagePart::text(&"x".repeat(MAX_TEXT_CHARS + 1)).unwrap_err();
        assert_eq!(err.field, "text");
        assert!(err.rule.contains("65536"));
    }

    #[test]
    fn caption_counts_characters_not_bytes() {
        // 1024 multi-byte characters are fine; one more is not.
        assert!(MessagePart::media(media(), Some(&"é".repeat(1024))).is_ok());
        let err = MessagePart::media(media(), Some(&"é".repeat(1025))).unwrap_err();
        assert_eq!(err.field, "caption");
    }

    #[test]
    fn empty_caption_is_no_caption() {
        let p = MessagePart::media(media(), Some("")).unwrap();
        assert_eq!(
            p,
            MessagePart::Media {
                media: media(),
                caption: None
            }
        );
    }

    #[test]
    fn json_form_is_parsed_with_limits() {
        let ok: MessagePart = serde_json::from_str(r#"{"kind":"text","text":"hello"}"#).unwrap();
        assert_eq!(ok, MessagePart::text("hello").unwrap());
        let bad = serde_json::from_str::<MessagePart>(r#"{"kind":"media","media":"nope"}"#);
        assert!(bad.unwrap_err().to_string().contains("sha256"));
        let unknown =
            serde_json::from_str::<MessagePart>(r#"{"kind":"text","text":"a","extra":1}"#);
        assert!(unknown.is_err());
    }

    fn opts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_poll_is_refused_with_the_field_and_the_rule() {
        let ok = MessagePart::poll("Coming, {group_name}?", &opts(&["Yes", "No"]), false);
        assert!(ok.is_ok());
        let field_rule = |q: &str, o: &[&str]| {
            let e = MessagePart::poll(q, &opts(o), false).unwrap_err();
            (e.field, e.rule)
        };
        assert_eq!(field_rule(" ", &["a", "b"]).0, "question");
        let (f, r) = field_rule(&"q".repeat(256), &["a", "b"]);
        assert_eq!((f.as_str(), r.contains("255")), ("question", true));
        // A variable could render it past WhatsApp's limit.
        let (f, r) = field_rule(&format!("{}{{title}}", "q".repeat(240)), &["a", "b"]);
        assert_eq!(
            (f.as_str(), r.contains("may render")),
            ("question", true),
            "{r}"
        );
        assert_eq!(field_rule("Q", &["only"]).0, "options");
        let thirteen: Vec<String> = (0..13).map(|i| i.to_string()).collect();
        let e = MessagePart::poll("Q", &thirteen, true).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.rule.contains("got 13")),
            ("options", true)
        );
        assert_eq!(field_rule("Q", &["a", ""]).0, "options[1]");
        let (f, r) = field_rule("Q", &["a", &"x".repeat(101)]);
        assert_eq!((f.as_str(), r.contains("100")), ("options[1]", true));
        let (f, r) = field_rule("Q", &["Yes", "No", " Yes "]);
        assert_eq!(f, "options[2]");
        assert!(r.contains("options[0]"), "{r}");
    }

    #[test]
    fn a_poll_in_json_names_the_field_under_its_part() {
        let ok: MessagePart =
            serde_json::from_str(r#"{"kind":"poll","question":"Q?","options":["a","b"]}"#).unwrap();
        assert_eq!(
            ok,
            MessagePart::poll("Q?", &opts(&["a", "b"]), false).unwrap()
        );
        assert_eq!(ok.written(), Some("Q?"));
        assert_eq!(ok.kind(), PartKind::Poll);
        let bad = serde_json::from_str::<MessagePart>(
            r#"{"kind":"poll","question":"Q?","options":["a","a"]}"#,
        );
        assert!(bad.unwrap_err().to_string().contains("options[1]"));
    }

    proptest! {
        #[test]
        fn part_json_roundtrip(text in "[^\u{0}{}]{1,200}", cap in proptest::option::of("[a-z ]{1,100}")) {
            prop_assume!(!text.trim().is_empty());
            for p in [MessagePart::text(&text).unwrap(), MessagePart::media(media(), cap.as_deref()).unwrap()] {
                let back: MessagePart = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
                prop_assert_eq!(back, p);
            }
        }
    }
}
