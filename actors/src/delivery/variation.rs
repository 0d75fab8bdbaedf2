//! The texts a run sends: each part's template rendered per (run, group),
//! or, for a reminder with `unique_texts`, per target position so no two
//! groups get the same bytes. One place for the run and the preview, so
//! what an operator previews is what the groups get.

use crate::domain::*;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::HashMap;

/// A run's renderings, fixed by (run, scheduled time, target count): a
/// resend after a crash recomputes the same texts.
pub struct RunTexts {
    run: RunId,
    scheduled_for: DateTime<Utc>,
    /// Each part's template; `None` for plain text (sent as written).
    templates: Vec<Option<Template>>,
    /// With `unique_texts`: each templated part's texts by position.
    unique: HashMap<u32, Vec<String>>,
    /// Group subjects from the account's directory, for `{group_name}`.
    names: HashMap<GroupJid, String>,
}

impl RunTexts {
    pub fn new(
        spec: &NewReminder,
        run: RunId,
        scheduled_for: DateTime<Utc>,
        targets: usize,
    ) -> Self {
        let templates: Vec<Option<Template>> = spec
            .parts
            .iter()
            .map(|p| p.template().filter(|t| !t.is_plain()))
            .collect();
        let mut texts = Self {
            run,
            scheduled_for,
            templates,
            unique: HashMap::new(),
            names: HashMap::new(),
        };
        if spec.unique_texts {
            let vars = texts.vars(spec);
            let unique = texts
                .templates
                .iter()
                .enumerate()
                .filter_map(|(i, t)| {
                    let t = t.as_ref()?;
                    Some((i as u32, t.unique_texts(run, i as u32, targets, &vars)))
                })
                .collect();
            texts.unique = unique;
        }
        texts
    }

    /// Whether any part says `{group_name}`: only then are the account's
    /// group names worth reading.
    pub fn wants_group_names(&self) -> bool {
        self.templates
            .iter()
            .flatten()
            .any(Template::uses_group_name)
    }

    /// The groups' names from the account's directory; a group it does
    /// not know gets the fallback.
    pub fn with_names(mut self, names: HashMap<GroupJid, String>) -> Self {
        self.names = names;
        self
    }

    /// Variables are fixed by the run (its scheduled time, not the clock).
    fn vars<'a>(&self, spec: &'a NewReminder) -> RenderVars<'a> {
        RenderVars {
            scheduled_for: self.scheduled_for,
            timezone: &spec.timezone,
            title: &spec.title,
            group_name: None,
        }
    }

    /// The text (or caption) the group at `position` gets for `part`.
    pub fn text(
        &self,
        spec: &NewReminder,
        position: u32,
        group: &GroupJid,
        part: u32,
    ) -> Option<String> {
        let written = spec.parts.get(part as usize)?.written()?;
        let Some(template) = &self.templates[part as usize] else {
            return Some(written.to_owned());
        };
        if let Some(text) = self
            .unique
            .get(&part)
            .and_then(|texts| texts.get(position as usize))
        {
            return Some(text.clone());
        }
        let pick = Pick {
            run: self.run,
            group,
            part,
            position,
            unique: false,
        };
        let vars = RenderVars {
            group_name: self.names.get(group).map(String::as_str),
            ..self.vars(spec)
        };
        Some(template.render(&pick, &vars))
    }
}

/// The names `{group_name}` takes: the account's groups in its directory
/// (synced from WhatsApp, never queried from the send path).
pub async fn directory_names(
    store: &dyn crate::ports::Store,
    account: &AccountId,
) -> crate::ports::StoreResult<HashMap<GroupJid, String>> {
    let mut all = GroupFilter::all_of(account.clone());
    all.include_left = true;
    Ok(store
        .list_groups(&all)
        .await?
        .items
        .into_iter()
        .map(|g| (g.info.jid, g.info.subject))
        .collect())
}

/// One group's messages in a preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PreviewSample {
    pub group: GroupJid,
    /// Per part: the text or caption it would carry (`None`: a picture
    /// without caption).
    pub parts: Vec<Option<String>>,
}

/// What the first `samples` groups of a run of `spec` scheduled for
/// `scheduled_for` would receive (a run id of 0 stands for "a run": the
/// wording of a real run differs, its variety does not), and how many
/// distinct texts each part gives over all its targets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Preview {
    pub samples: Vec<PreviewSample>,
    /// Per part: distinct texts over all the reminder's targets.
    pub distinct: Vec<usize>,
    pub targets: usize,
}

pub fn preview(
    spec: &NewReminder,
    run: RunId,
    scheduled_for: DateTime<Utc>,
    samples: usize,
    names: HashMap<GroupJid, String>,
) -> Preview {
    let texts = RunTexts::new(spec, run, scheduled_for, spec.targets.len()).with_names(names);
    let render = |i: usize, g: &GroupJid| -> Vec<Option<String>> {
        (0..spec.parts.len() as u32)
            .map(|p| texts.text(spec, i as u32, g, p))
            .collect()
    };
    let distinct = (0..spec.parts.len() as u32)
        .map(|p| {
            spec.targets
                .iter()
                .enumerate()
                .filter_map(|(i, g)| texts.text(spec, i as u32, g, p))
                .collect::<std::collections::HashSet<_>>()
                .len()
        })
        .collect();
    Preview {
        samples: spec
            .targets
            .iter()
            .enumerate()
            .take(samples)
            .map(|(i, g)| PreviewSample {
                group: g.clone(),
                parts: render(i, g),
            })
            .collect(),
        distinct,
        targets: spec.targets.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str, n: usize, unique: bool) -> NewReminder {
        let targets = (0..n)
            .map(|i| GroupJid::parse(&format!("120363{i:012}@g.us")).unwrap())
            .collect();
        NewReminder::new(
            AccountId::parse("a1").unwrap(),
            "Standup",
            TimeZone::parse("Asia/Kuala_Lumpur").unwrap(),
            Schedule::once("2026-12-01T09:00").unwrap(),
            WindowHours::default(),
            false,
            vec![MessagePart::text(text).unwrap()],
            targets,
        )
        .unwrap()
        .with_unique_texts(unique)
        .unwrap()
    }

    fn at() -> DateTime<Utc> {
        "2026-12-01T01:00:00Z".parse().unwrap()
    }

    #[test]
    fn preview_shows_what_groups_get_and_how_varied() {
        let s = spec("{Hi|Hello|Hey} team, standup at {time}", 30, false);
        let p = preview(&s, RunId(0), at(), 3, HashMap::new());
        assert_eq!(p.samples.len(), 3);
        assert!(p.samples[0].parts[0]
            .as_deref()
            .unwrap()
            .ends_with("team, standup at 09:00"));
        assert!(p.distinct[0] > 1 && p.distinct[0] <= 3);
        let u = spec(
            "{Hi|Hello|Hey} {team|all|folks|everyone} at {time}",
            12,
            true,
        );
        let p = preview(&u, RunId(0), at(), 12, HashMap::new());
        assert_eq!(p.distinct, vec![12]);
    }

    #[test]
    fn the_same_run_renders_the_same_for_a_resend() {
        let s = spec("{Hi|Hello|Hey} {team|all}", 6, true);
        let a = RunTexts::new(&s, RunId(5), at(), 6);
        let b = RunTexts::new(&s, RunId(5), at(), 6);
        for (i, g) in s.targets.iter().enumerate() {
            assert_eq!(a.text(&s, i as u32, g, 0), b.text(&s, i as u32, g, 0));
        }
    }
}
