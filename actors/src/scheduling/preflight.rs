//! Pre-flight: which of a reminder's groups its account is not in or may
//! not post to, read from the account's group directory before anything
//! is sent. Only a directory that has been synced is believed: a
//! never-synced one refuses nothing (and says so).

use crate::domain::*;
use crate::ports::{Store, StoreResult};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::HashMap;

/// A group the account cannot deliver to, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Refusal {
    pub group: GroupJid,
    pub reason: String,
}

/// What the account's group directory says about a reminder's groups
/// right now. A never-synced directory refuses nothing and a selector
/// picks nothing; a run fails each refused group up front with its reason
/// instead of sending to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Preflight {
    /// When the directory was last synced; `None`: never, so nothing is
    /// refused and a selector picks nothing.
    pub directory_synced_at: Option<DateTime<Utc>>,
    /// The groups a run started now would have, with how each was chosen.
    #[serde(skip)]
    pub targets: Vec<(GroupJid, String)>,
    /// How many that is.
    pub groups: usize,
    /// Those the account is not in or may not post to.
    pub refused: Vec<Refusal>,
}

pub const NOT_MEMBER: &str = "The account is not in this group (per its group directory)";
pub const CANNOT_POST: &str =
    "Only admins may post in this group and the account is not one (per its group directory)";

/// Resolves the reminder's groups against its account's directory and
/// lists those it cannot deliver to.
pub async fn preflight(store: &dyn Store, spec: &NewReminder) -> StoreResult<Preflight> {
    let synced = store.groups_synced_at(&spec.account_id).await?;
    let directory = if synced.is_some() {
        let mut all = GroupFilter::all_of(spec.account_id.clone());
        all.include_left = true;
        store.list_groups(&all).await?.items
    } else {
        Vec::new()
    };
    Ok(check(spec, synced, &directory))
}

/// Resolves and stores a run's groups, once: the reminder's explicit JIDs
/// and what its selector picks from the directory now, each with how it
/// was chosen. Groups the directory says the account cannot deliver to
/// fail at once with the reason, before a token is spent on them. A run
/// that already has targets keeps them (the store writes a run's groups
/// only once), so a late or repeated call changes nothing. Answers the
/// run's targets, empty if the reminder picks no group.
pub async fn freeze_targets(
    store: &dyn Store,
    run: RunId,
    spec: &NewReminder,
) -> StoreResult<Vec<RunTarget>> {
    let existing = store.list_targets(run, None, None, u32::MAX).await?;
    if !existing.is_empty() {
        return Ok(existing);
    }
    let pre = preflight(store, spec).await?;
    store.create_chosen_targets(run, &pre.targets).await?;
    let targets = store.list_targets(run, None, None, u32::MAX).await?;
    if pre.refused.is_empty() {
        return Ok(targets);
    }
    let reasons: HashMap<&GroupJid, &str> = pre
        .refused
        .iter()
        .map(|r| (&r.group, r.reason.as_str()))
        .collect();
    // Only pending ones: if another caller froze the run first, its
    // targets may already be on their way.
    let failed: Vec<Transition> = targets
        .iter()
        .filter(|t| t.status == TargetStatus::Pending)
        .filter_map(|t| {
            reasons.get(&t.group).map(|why| Transition::Failed {
                target_id: t.id,
                error: (*why).to_owned(),
            })
        })
        .collect();
    store.apply_transitions(&failed).await?;
    store.list_targets(run, None, None, u32::MAX).await
}

/// Why a run has no group to send to, for its failure summary.
pub fn nothing_picked(synced: Option<DateTime<Utc>>) -> String {
    match synced {
        None => "The reminder's selector picked no group: the account's group directory \
                 has never been synced (POST /v1/accounts/{id}/groups/sync)."
            .to_owned(),
        Some(at) => format!(
            "The reminder's selector picked no group from the account's group directory \
             (last synced {}).",
            at.format("%Y-%m-%d %H:%M UTC")
        ),
    }
}

/// [`preflight`] on a directory already read.
pub fn check(spec: &NewReminder, synced: Option<DateTime<Utc>>, directory: &[Group]) -> Preflight {
    let targets = resolve_targets(&spec.targets, spec.select.as_ref(), directory, MAX_TARGETS);
    let refused = if synced.is_some() {
        let by_jid: HashMap<&GroupJid, &Group> =
            directory.iter().map(|g| (&g.info.jid, g)).collect();
        targets
            .iter()
            .filter_map(|(jid, _)| {
                let reason = match by_jid.get(jid) {
                    None => NOT_MEMBER,
                    Some(g) if !g.member => NOT_MEMBER,
                    Some(g) if !g.can_post => CANNOT_POST,
                    Some(_) => return None,
                };
                Some(Refusal {
                    group: jid.clone(),
                    reason: reason.to_owned(),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    Preflight {
        directory_synced_at: synced,
        groups: targets.len(),
        targets,
        refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jid(n: u32) -> GroupJid {
        GroupJid::parse(&format!("1203630000{n:08}@g.us")).unwrap()
    }

    fn group(n: u32, member: bool, can_post: bool) -> Group {
        Group {
            account_id: AccountId::parse("acc").unwrap(),
            info: GroupInfo {
                jid: jid(n),
                subject: format!("Group {n}"),
                participants: 3,
                announce: !can_post,
                is_admin: false,
                community: None,
            },
            can_post,
            labels: vec![],
            member,
            synced_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    fn spec(targets: Vec<GroupJid>, select: Option<TargetSelector>) -> NewReminder {
        let mut r = NewReminder::new(
            AccountId::parse("acc").unwrap(),
            "t",
            TimeZone::parse("UTC").unwrap(),
            Schedule::once("2099-01-01T09:00").unwrap(),
            WindowHours::default(),
            false,
            vec![MessagePart::text("hi").unwrap()],
            vec![jid(99)],
        )
        .unwrap();
        r.targets = targets;
        r.select = select;
        r
    }

    #[test]
    fn a_synced_directory_refuses_groups_left_unknown_or_admins_only() {
        let dir = [
            group(1, true, true),
            group(2, false, true),
            group(3, true, false),
        ];
        let r = spec(vec![jid(1), jid(2), jid(3), jid(4)], None);
        let p = check(&r, Some(chrono::DateTime::UNIX_EPOCH), &dir);
        assert_eq!(p.groups, 4);
        let got: Vec<_> = p
            .refused
            .iter()
            .map(|r| (r.group.clone(), r.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (jid(2), NOT_MEMBER),
                (jid(3), CANNOT_POST),
                (jid(4), NOT_MEMBER)
            ]
        );
        // A selector picks members only, so only posting rights refuse.
        let all = TargetSelector {
            all: true,
            ..Default::default()
        };
        let p = check(
            &spec(vec![], Some(all)),
            Some(chrono::DateTime::UNIX_EPOCH),
            &dir,
        );
        assert_eq!(p.groups, 2);
        assert_eq!(p.refused.len(), 1);
    }

    #[test]
    fn a_never_synced_directory_refuses_nothing() {
        let r = spec(vec![jid(1), jid(2)], None);
        let p = check(&r, None, &[]);
        assert_eq!((p.groups, p.refused.len()), (2, 0));
        assert_eq!(p.directory_synced_at, None);
    }
}
