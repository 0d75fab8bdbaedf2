//! The group directory in memory: [`GroupStore`].

use super::{take_limit, MemoryStore};
use crate::domain::*;
use crate::ports::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::{HashMap, HashSet};

#[async_trait]
impl GroupStore for MemoryStore {
    async fn sync_groups(
        &self,
        account: &AccountId,
        groups: &[GroupInfo],
        now: DateTime<Utc>,
    ) -> StoreResult<GroupSyncSummary> {
        Self::injected(&self.sync_faults)?;
        let mut g = self.lock()?;
        g.account_mut(account)?;
        let dir = g.groups.entry(account.clone()).or_default();
        let mut summary = GroupSyncSummary::default();
        let listed: HashSet<&GroupJid> = groups.iter().map(|i| &i.jid).collect();
        for info in groups {
            match dir.get_mut(&info.jid) {
                Some(known) => {
                    if !known.member {
                        summary.added += 1;
                    } else if known.info != *info {
                        summary.updated += 1;
                    }
                    known.info = info.clone();
                    known.can_post = info.can_post();
                    known.member = true;
                    known.synced_at = now;
                }
                None => {
                    summary.added += 1;
                    dir.insert(
                        info.jid.clone(),
                        Group {
                            account_id: account.clone(),
                            info: info.clone(),
                            can_post: info.can_post(),
                            labels: Vec::new(),
                            member: true,
                            synced_at: now,
                        },
                    );
                }
            }
        }
        for known in dir.values_mut() {
            if known.member && !listed.contains(&known.info.jid) {
                known.member = false;
                known.synced_at = now;
                summary.left += 1;
            }
        }
        summary.total = dir.values().filter(|g| g.member).count() as u32;
        g.group_syncs.insert(account.clone(), now);
        Ok(summary)
    }

    async fn list_groups(&self, f: &GroupFilter) -> StoreResult<GroupPage> {
        let g = self.lock()?;
        if !g.accounts.contains_key(&f.account_id) {
            return Err(StoreError::NotFound(format!("account {}", f.account_id)));
        }
        let name = f.name.as_deref().map(fold_name);
        let matching = g
            .groups
            .get(&f.account_id)
            .into_iter()
            .flat_map(|dir| dir.values())
            .filter(|grp| f.include_left || grp.member)
            .filter(|grp| f.can_post.is_none_or(|c| grp.can_post == c))
            .filter(|grp| f.label.as_ref().is_none_or(|l| grp.labels.contains(l)))
            .filter(|grp| {
                name.as_deref()
                    .is_none_or(|n| fold_name(&grp.info.subject).contains(n))
            });
        let (mut items, mut total) = (Vec::new(), 0u64);
        for grp in matching {
            total += 1;
            if f.after.as_ref().is_none_or(|a| grp.info.jid > *a)
                && items.len() < take_limit(f.limit)
            {
                items.push(grp.clone());
            }
        }
        Ok(GroupPage { items, total })
    }

    async fn set_group_labels(
        &self,
        account: &AccountId,
        group: &GroupJid,
        labels: &[Label],
    ) -> StoreResult<Group> {
        let mut g = self.lock()?;
        let known = g
            .groups
            .get_mut(account)
            .and_then(|dir| dir.get_mut(group))
            .ok_or_else(|| StoreError::NotFound(format!("group {group} of account {account}")))?;
        let mut labels = labels.to_vec();
        labels.sort();
        labels.dedup();
        known.labels = labels;
        Ok(known.clone())
    }

    async fn groups_synced_at(&self, account: &AccountId) -> StoreResult<Option<DateTime<Utc>>> {
        let g = self.lock()?;
        if !g.accounts.contains_key(account) {
            return Err(StoreError::NotFound(format!("account {account}")));
        }
        Ok(g.group_syncs.get(account).copied())
    }

    async fn group_names(
        &self,
        account: &AccountId,
        groups: &[GroupJid],
    ) -> StoreResult<HashMap<GroupJid, String>> {
        let g = self.lock()?;
        let Some(dir) = g.groups.get(account) else {
            return Ok(HashMap::new());
        };
        Ok(groups
            .iter()
            .filter_map(|jid| dir.get(jid).map(|k| (jid.clone(), k.info.subject.clone())))
            .collect())
    }
}
