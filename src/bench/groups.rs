//! `herald bench groups`: how fast an account's group directory answers
//! the control port's searches, over the real store: one account with N
//! groups, then first pages of name searches, label filters and the plain
//! listing, and the p50/p99 of each query.

use super::percentile;
use crate::store::SqlStore;
use chrono::Utc;
use herald_actors::domain::*;
use herald_actors::ports::{AccountStore, GroupStore, NewAccount, StoreBase};
use std::time::Instant;

/// Searches per kind of query.
const ROUNDS: usize = 200;
/// The control port's default page.
const PAGE: u32 = 100;

pub async fn run(db_url: &str, groups: usize) -> anyhow::Result<String> {
    super::on_scratch_store(db_url, async |store: &SqlStore| drive(store, groups).await).await
}

async fn drive(store: &SqlStore, n: usize) -> anyhow::Result<String> {
    let now = Utc::now();
    let account = AccountId::parse("bench-groups")?;
    store
        .create_account(
            &NewAccount {
                id: account.clone(),
                name: "bench".into(),
                kind: GatewayKind::Simulator,
                state: AccountState::Connected,
                limits: AccountLimits::default(),
            },
            now,
        )
        .await?;
    let listed: Vec<GroupInfo> = (0..n)
        .map(|i| GroupInfo {
            jid: GroupJid::parse(&format!("120363{i:012}@g.us")).expect("valid jid"),
            // Names an operator would search: a region and a number.
            subject: format!("{} team {i:05}", ["KL", "Penang", "Johor", "Sabah"][i % 4]),
            participants: 10 + (i % 200) as u32,
            announce: i % 10 == 0,
            is_admin: false,
            community: None,
        })
        .collect();
    let synced = Instant::now();
    store.sync_groups(&account, &listed, now).await?;
    let sync_ms = synced.elapsed().as_secs_f64() * 1000.0;
    let weekly = Label::parse("weekly")?;
    for g in listed.iter().step_by(7) {
        store
            .set_group_labels(&account, &g.jid, std::slice::from_ref(&weekly))
            .await?;
    }
    let base = GroupFilter {
        limit: PAGE,
        ..GroupFilter::all_of(account.clone())
    };
    let kinds: [(&str, GroupFilter); 3] = [
        (
            "name",
            GroupFilter {
                name: Some("penang team 0".into()),
                ..base.clone()
            },
        ),
        (
            "label",
            GroupFilter {
                label: Some(weekly.clone()),
                can_post: Some(true),
                ..base.clone()
            },
        ),
        ("all", base.clone()),
    ];
    let mut parts = vec![format!(
        "groups: backend={} groups={n} sync_ms={sync_ms:.0}",
        store.backend()
    )];
    let mut worst_p99: f64 = 0.0;
    for (kind, filter) in kinds {
        let mut times = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let t = Instant::now();
            let page = store.list_groups(&filter).await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(!page.items.is_empty(), "{kind}: the search found nothing");
        }
        let p99 = percentile(&mut times, 0.99);
        worst_p99 = worst_p99.max(p99);
        parts.push(format!(
            "{kind}_p50_ms={:.2} {kind}_p99_ms={p99:.2}",
            percentile(&mut times, 0.5)
        ));
    }
    parts.push(format!("list_p99_ms={worst_p99:.2}"));
    Ok(parts.join(" "))
}
