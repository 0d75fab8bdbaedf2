//! The group directory aggregate: `account_groups`, `group_labels` and
//! `group_syncs`. The [`Store`](herald_actors::ports::Store) methods in
//! `mod.rs` delegate here.

use super::rows::{trunc, RowGet, Ts};
use super::{be, corrupt, not_found, to_u32, SqlStore};
use super::{read, tx};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::*;
use std::collections::HashMap;

const GROUP_COLS: &str = "account_id, jid, subject, participants, announce, is_admin, can_post, \
     community, member, synced_at";

/// `%`, `_` and the escape itself are literal in a name search.
fn like_pattern(name: &str) -> String {
    let mut p = String::with_capacity(name.len() + 2);
    p.push('%');
    for c in fold_name(name).chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// The WHERE clause of a listing (without paging) and its binds after
/// `$1` = account id; returns (clause, next placeholder number).
fn filter_clause(f: &GroupFilter) -> (String, Vec<Bind>) {
    let mut sql = String::from("g.account_id = $1");
    let mut binds = Vec::new();
    let mut next = |sql: &mut String, cond: &str, b: Bind| {
        binds.push(b);
        sql.push_str(&cond.replace('?', &format!("${}", binds.len() + 1)));
    };
    if !f.include_left {
        sql.push_str(" AND g.member = TRUE");
    }
    if let Some(c) = f.can_post {
        next(&mut sql, " AND g.can_post = ?", Bind::Flag(c));
    }
    if let Some(n) = &f.name {
        next(
            &mut sql,
            " AND g.subject_fold LIKE ? ESCAPE '\\'",
            Bind::Text(like_pattern(n)),
        );
    }
    if let Some(l) = &f.label {
        next(
            &mut sql,
            " AND EXISTS (SELECT 1 FROM group_labels l WHERE l.account_id = g.account_id \
             AND l.jid = g.jid AND l.label = ?)",
            Bind::Text(l.as_str().to_owned()),
        );
    }
    (sql, binds)
}

enum Bind {
    Text(String),
    Flag(bool),
}

/// Binds `binds` in order onto a query of either backend.
macro_rules! bind_all {
    ($q:expr, $binds:expr) => {{
        let mut q = $q;
        for b in $binds {
            q = match b {
                Bind::Text(t) => q.bind(t.clone()),
                Bind::Flag(v) => q.bind(*v),
            };
        }
        q
    }};
}

fn group_from<R: RowGet>(r: &R, labels: Vec<Label>) -> StoreResult<Group> {
    let jid = |col: &str| -> StoreResult<GroupJid> {
        GroupJid::parse(&r.text(col)?).map_err(|e| corrupt("group jid", e))
    };
    let community = r
        .opt_text("community")?
        .map(|c| GroupJid::parse(&c).map_err(|e| corrupt("community jid", e)))
        .transpose()?;
    Ok(Group {
        account_id: AccountId::parse(&r.text("account_id")?)
            .map_err(|e| corrupt("group account", e))?,
        info: GroupInfo {
            jid: jid("jid")?,
            subject: r.text("subject")?,
            participants: to_u32(r.int("participants")?, "participants")?,
            announce: r.flag("announce")?,
            is_admin: r.flag("is_admin")?,
            community,
        },
        can_post: r.flag("can_post")?,
        labels,
        member: r.flag("member")?,
        synced_at: r.ts("synced_at")?,
    })
}

impl SqlStore {
    pub(super) async fn sync_groups_sql(
        &self,
        account: &AccountId,
        groups: &[GroupInfo],
        now: DateTime<Utc>,
    ) -> StoreResult<GroupSyncSummary> {
        let now = trunc(now);
        let mut summary = GroupSyncSummary::default();
        tx!(self, tx => {
            let exists = sqlx::query("SELECT 1 AS one FROM accounts WHERE id = $1")
                .bind(account.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?;
            if exists.is_none() {
                return Err(not_found(format!("account {account}")));
            }
            let sql = format!("SELECT {GROUP_COLS} FROM account_groups g WHERE account_id = $1");
            let known: HashMap<GroupJid, Group> = sqlx::query(&sql)
                .bind(account.as_str())
                .fetch_all(&mut *tx)
                .await
                .map_err(be)?
                .iter()
                .map(|r| group_from(r, Vec::new()).map(|g| (g.info.jid.clone(), g)))
                .collect::<StoreResult<_>>()?;
            let listed: std::collections::HashSet<&GroupJid> =
                groups.iter().map(|g| &g.jid).collect();
            for gone in known.values().filter(|g| g.member && !listed.contains(&g.info.jid)) {
                sqlx::query(
                    "UPDATE account_groups SET member = FALSE, synced_at = $3 \
                     WHERE account_id = $1 AND jid = $2",
                )
                .bind(account.as_str())
                .bind(gone.info.jid.as_str())
                .bind(Ts(now))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
                summary.left += 1;
            }
            for info in groups {
                match known.get(&info.jid) {
                    Some(k) if k.member && k.info == *info => continue,
                    Some(k) if k.member => summary.updated += 1,
                    _ => summary.added += 1,
                }
                sqlx::query(
                    "INSERT INTO account_groups (account_id, jid, subject, subject_fold, \
                     participants, announce, is_admin, can_post, community, member, synced_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, TRUE, $10) \
                     ON CONFLICT (account_id, jid) DO UPDATE SET subject = excluded.subject, \
                     subject_fold = excluded.subject_fold, participants = excluded.participants, \
                     announce = excluded.announce, is_admin = excluded.is_admin, \
                     can_post = excluded.can_post, community = excluded.community, \
                     member = TRUE, synced_at = excluded.synced_at",
                )
                .bind(account.as_str())
                .bind(info.jid.as_str())
                .bind(&info.subject)
                .bind(fold_name(&info.subject))
                .bind(i64::from(info.participants))
                .bind(info.announce)
                .bind(info.is_admin)
                .bind(info.can_post())
                .bind(info.community.as_ref().map(|c| c.as_str().to_owned()))
                .bind(Ts(now))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            // Every group still listed was seen by this sync.
            sqlx::query(
                "UPDATE account_groups SET synced_at = $2 WHERE account_id = $1 AND member = TRUE",
            )
            .bind(account.as_str())
            .bind(Ts(now))
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            sqlx::query(
                "INSERT INTO group_syncs (account_id, synced_at) VALUES ($1, $2) \
                 ON CONFLICT (account_id) DO UPDATE SET synced_at = excluded.synced_at",
            )
            .bind(account.as_str())
            .bind(Ts(now))
            .execute(&mut *tx)
            .await
            .map_err(be)?;
        });
        summary.total = u32::try_from(listed_count(groups)).unwrap_or(u32::MAX);
        Ok(summary)
    }

    pub(super) async fn list_groups_sql(&self, f: &GroupFilter) -> StoreResult<GroupPage> {
        let (clause, binds) = filter_clause(f);
        let count_sql = format!("SELECT COUNT(*) AS n FROM account_groups g WHERE {clause}");
        let mut page_clause = clause.clone();
        let mut page_binds: Vec<&Bind> = binds.iter().collect();
        let after = f.after.as_ref().map(|a| Bind::Text(a.as_str().to_owned()));
        if let Some(a) = &after {
            page_binds.push(a);
            page_clause.push_str(&format!(" AND g.jid > ${}", page_binds.len() + 1));
        }
        let limit = if f.limit == 0 || f.limit == u32::MAX {
            String::new()
        } else {
            format!(" LIMIT {}", f.limit)
        };
        let page_sql = format!(
            "SELECT {GROUP_COLS} FROM account_groups g WHERE {page_clause} ORDER BY g.jid{limit}"
        );
        read!(self, p => {
            let exists = sqlx::query("SELECT 1 AS one FROM accounts WHERE id = $1")
                .bind(f.account_id.as_str())
                .fetch_optional(p)
                .await
                .map_err(be)?;
            if exists.is_none() {
                return Err(not_found(format!("account {}", f.account_id)));
            }
            let total = bind_all!(sqlx::query(&count_sql).bind(f.account_id.as_str()), &binds)
                .fetch_one(p)
                .await
                .map_err(be)?
                .int("n")?;
            let rows = bind_all!(
                sqlx::query(&page_sql).bind(f.account_id.as_str()),
                page_binds.iter().copied()
            )
            .fetch_all(p)
            .await
            .map_err(be)?;
            let mut labels = self.labels_of(&f.account_id, &rows).await?;
            let items = rows
                .iter()
                .map(|r| {
                    let jid = r.text("jid")?;
                    group_from(r, labels.remove(&jid).unwrap_or_default())
                })
                .collect::<StoreResult<Vec<_>>>()?;
            Ok(GroupPage {
                items,
                total: u64::try_from(total).map_err(|e| corrupt("group count", e))?,
            })
        })
    }

    /// The labels of the groups in `rows`, by JID, each list sorted.
    async fn labels_of<R: RowGet>(
        &self,
        account: &AccountId,
        rows: &[R],
    ) -> StoreResult<HashMap<String, Vec<Label>>> {
        let mut out: HashMap<String, Vec<Label>> = HashMap::new();
        if rows.is_empty() {
            return Ok(out);
        }
        let (first, last) = (rows[0].text("jid")?, rows[rows.len() - 1].text("jid")?);
        // One range read covers the page (rows are in JID order).
        read!(self, p => {
            let found = sqlx::query(
                "SELECT jid, label FROM group_labels WHERE account_id = $1 \
                 AND jid >= $2 AND jid <= $3 ORDER BY jid, label",
            )
            .bind(account.as_str())
            .bind(&first)
            .bind(&last)
            .fetch_all(p)
            .await
            .map_err(be)?;
            for r in &found {
                let label = Label::parse(&r.text("label")?).map_err(|e| corrupt("label", e))?;
                out.entry(r.text("jid")?).or_default().push(label);
            }
        });
        Ok(out)
    }

    pub(super) async fn set_group_labels_sql(
        &self,
        account: &AccountId,
        group: &GroupJid,
        labels: &[Label],
    ) -> StoreResult<Group> {
        let mut labels = labels.to_vec();
        labels.sort();
        labels.dedup();
        let sql =
            format!("SELECT {GROUP_COLS} FROM account_groups g WHERE account_id = $1 AND jid = $2");
        tx!(self, tx => {
            let row = sqlx::query(&sql)
                .bind(account.as_str())
                .bind(group.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?
                .ok_or_else(|| not_found(format!("group {group} of account {account}")))?;
            sqlx::query("DELETE FROM group_labels WHERE account_id = $1 AND jid = $2")
                .bind(account.as_str())
                .bind(group.as_str())
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            for l in &labels {
                sqlx::query("INSERT INTO group_labels (account_id, jid, label) VALUES ($1, $2, $3)")
                    .bind(account.as_str())
                    .bind(group.as_str())
                    .bind(l.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
            group_from(&row, labels)
        })
    }

    pub(super) async fn group_names_sql(
        &self,
        account: &AccountId,
        groups: &[GroupJid],
    ) -> StoreResult<HashMap<GroupJid, String>> {
        let mut names = HashMap::with_capacity(groups.len());
        // A page of run targets at a time; chunks keep each statement under
        // either backend's bind limit whatever the caller passes.
        for chunk in groups.chunks(500) {
            let marks: Vec<String> = (2..chunk.len() + 2).map(|n| format!("${n}")).collect();
            let sql = format!(
                "SELECT jid, subject FROM account_groups WHERE account_id = $1 AND jid IN ({})",
                marks.join(", ")
            );
            let rows = read!(self, p => {
                let mut q = sqlx::query(&sql).bind(account.as_str());
                for g in chunk {
                    q = q.bind(g.as_str());
                }
                q.fetch_all(p).await.map_err(be)?
                    .iter()
                    .map(|r| Ok((r.text("jid")?, r.text("subject")?)))
                    .collect::<StoreResult<Vec<_>>>()
            })?;
            for (jid, subject) in rows {
                let jid = GroupJid::parse(&jid).map_err(|e| corrupt("group jid", e))?;
                names.insert(jid, subject);
            }
        }
        Ok(names)
    }

    pub(super) async fn groups_synced_at_sql(
        &self,
        account: &AccountId,
    ) -> StoreResult<Option<DateTime<Utc>>> {
        read!(self, p => {
            let row = sqlx::query(
                "SELECT a.id, s.synced_at FROM accounts a \
                 LEFT JOIN group_syncs s ON s.account_id = a.id WHERE a.id = $1",
            )
            .bind(account.as_str())
            .fetch_optional(p)
            .await
            .map_err(be)?
            .ok_or_else(|| not_found(format!("account {account}")))?;
            row.opt_ts("synced_at")
        })
    }
}

/// Distinct JIDs in a gateway's list (a list never names one twice, but
/// the count must not trust that).
fn listed_count(groups: &[GroupInfo]) -> usize {
    groups
        .iter()
        .map(|g| &g.jid)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

#[async_trait]
impl GroupStore for SqlStore {
    // ------------------------------------------------------------ groups

    async fn sync_groups(
        &self,
        account: &AccountId,
        groups: &[GroupInfo],
        now: DateTime<Utc>,
    ) -> StoreResult<GroupSyncSummary> {
        self.sync_groups_sql(account, groups, now).await
    }

    async fn list_groups(&self, f: &GroupFilter) -> StoreResult<GroupPage> {
        self.list_groups_sql(f).await
    }

    async fn set_group_labels(
        &self,
        account: &AccountId,
        group: &GroupJid,
        labels: &[Label],
    ) -> StoreResult<Group> {
        self.set_group_labels_sql(account, group, labels).await
    }

    async fn groups_synced_at(&self, account: &AccountId) -> StoreResult<Option<DateTime<Utc>>> {
        self.groups_synced_at_sql(account).await
    }

    async fn group_names(
        &self,
        account: &AccountId,
        groups: &[GroupJid],
    ) -> StoreResult<HashMap<GroupJid, String>> {
        self.group_names_sql(account, groups).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_search_treats_wildcards_as_text() {
        assert_eq!(like_pattern("KL 50%_off"), "%kl 50\\%\\_off%");
        assert_eq!(like_pattern("a\\b"), "%a\\\\b%");
    }

    #[test]
    fn filter_placeholders_follow_the_account_id() {
        let f = GroupFilter {
            name: Some("x".into()),
            can_post: Some(true),
            label: Some(Label::parse("east").unwrap()),
            ..GroupFilter::all_of(AccountId::parse("a").unwrap())
        };
        let (sql, binds) = filter_clause(&f);
        assert_eq!(binds.len(), 3);
        for n in 2..=4 {
            assert!(sql.contains(&format!("${n}")), "{sql}");
        }
        assert!(!sql.contains("$5"), "{sql}");
    }
}
