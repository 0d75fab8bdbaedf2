//! The group directory: sync, filtered listings and pages, labels.

use super::fixtures::{account, aid, assert_not_found, at, group, groups, S};
use crate::domain::*;

// ---------------------------------------------------------------- groups

fn ginfo(i: usize, subject: &str) -> GroupInfo {
    GroupInfo {
        jid: group(i),
        subject: subject.into(),
        participants: 10 + i as u32,
        announce: false,
        is_admin: false,
        community: None,
    }
}

pub(super) fn label(s: &str) -> Label {
    Label::parse(s).expect("valid label")
}

pub(super) async fn page(s: &S, f: GroupFilter) -> GroupPage {
    s.list_groups(&f).await.expect("list groups")
}

pub async fn group_names_cover_left_groups_and_skip_unknown_ones(s: S) {
    let a = account(&s, "sales-1").await;
    let other = account(&s, "other").await;
    assert!(s.group_names(&a, &[group(0)]).await.unwrap().is_empty());
    let listed: Vec<_> = (0..3).map(|i| ginfo(i, &format!("Team {i}"))).collect();
    s.sync_groups(&a, &listed, at(1)).await.unwrap();
    s.sync_groups(&other, &[ginfo(0, "Someone else's")], at(1))
        .await
        .unwrap();
    // Group 2 is left; group 1 renamed.
    s.sync_groups(&a, &[ginfo(0, "Team 0"), ginfo(1, "Team one")], at(2))
        .await
        .unwrap();
    let names = s
        .group_names(&a, &[group(1), group(2), group(9), group(0)])
        .await
        .unwrap();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[&group(0)], "Team 0", "the account's own directory");
    assert_eq!(names[&group(1)], "Team one", "the latest sync's name");
    assert_eq!(names[&group(2)], "Team 2", "a left group keeps its name");
    assert!(!names.contains_key(&group(9)), "not in the directory");
    // Many at once (more than one statement's worth on SQL stores).
    let many: Vec<_> = (0..1200).map(group).collect();
    let names = s.group_names(&a, &many).await.unwrap();
    assert_eq!(names.len(), 3);
    let unknown = AccountId::parse("nobody").unwrap();
    assert!(s.group_names(&unknown, &many).await.unwrap().is_empty());
}

pub async fn group_directory_sync(s: S) {
    let a = account(&s, "sales-1").await;
    let other = account(&s, "other").await;
    assert_eq!(s.groups_synced_at(&a).await.unwrap(), None);
    let first: Vec<_> = (0..3).map(|i| ginfo(i, &format!("Team {i}"))).collect();
    let summary = s.sync_groups(&a, &first, at(1)).await.unwrap();
    assert_eq!(
        summary,
        GroupSyncSummary {
            added: 3,
            updated: 0,
            left: 0,
            total: 3
        }
    );
    assert_eq!(s.groups_synced_at(&a).await.unwrap(), Some(at(1)));
    s.set_group_labels(&a, &group(0), &[label("vip")])
        .await
        .unwrap();

    // Group 1 renamed and made admins-only, group 2 left, group 3 joined.
    let mut renamed = ginfo(1, "Team one");
    renamed.announce = true;
    let second = vec![ginfo(0, "Team 0"), renamed, ginfo(3, "Team 3")];
    let summary = s.sync_groups(&a, &second, at(2)).await.unwrap();
    assert_eq!(
        summary,
        GroupSyncSummary {
            added: 1,
            updated: 1,
            left: 1,
            total: 3
        }
    );
    let now = page(&s, GroupFilter::all_of(a.clone())).await;
    assert_eq!(now.total, 3);
    let jids: Vec<_> = now.items.iter().map(|g| g.info.jid.clone()).collect();
    assert_eq!(jids, vec![group(0), group(1), group(3)], "JID order");
    assert_eq!(
        now.items[0].labels,
        vec![label("vip")],
        "labels survive a sync"
    );
    assert_eq!(now.items[1].info.subject, "Team one");
    assert!(!now.items[1].can_post, "admins-only, not an admin");
    assert!(now.items.iter().all(|g| g.member && g.account_id == a));

    let with_left = page(
        &s,
        GroupFilter {
            include_left: true,
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    assert_eq!(with_left.total, 4);
    let gone = &with_left.items[2];
    assert_eq!((gone.info.jid.clone(), gone.member), (group(2), false));
    assert_eq!(gone.synced_at, at(2));

    // Rejoining counts as added; the other account's directory is its own.
    let summary = s.sync_groups(&a, &first, at(3)).await.unwrap();
    assert_eq!((summary.added, summary.left, summary.total), (1, 1, 3));
    assert_eq!(page(&s, GroupFilter::all_of(other.clone())).await.total, 0);
    assert_not_found(s.sync_groups(&aid("nobody"), &first, at(4)).await);
    assert_not_found(s.list_groups(&GroupFilter::all_of(aid("nobody"))).await);

    // The directory goes with its account.
    s.delete_account(&a).await.unwrap();
    account(&s, "sales-1").await;
    assert_eq!(page(&s, GroupFilter::all_of(a.clone())).await.total, 0);
    assert_eq!(s.groups_synced_at(&a).await.unwrap(), None);
}

pub async fn group_listing_filters_and_pages(s: S) {
    let a = account(&s, "sales-1").await;
    let mut all: Vec<_> = (0..25)
        .map(|i| {
            let name = if i % 5 == 0 {
                format!("KL Clients {i}")
            } else {
                format!("Penang team {i}")
            };
            ginfo(i, &name)
        })
        .collect();
    for g in all.iter_mut().filter(|g| g.participants % 2 == 0) {
        g.announce = true;
    }
    s.sync_groups(&a, &all, at(1)).await.unwrap();
    for i in [3usize, 7, 11] {
        s.set_group_labels(&a, &group(i), &[label("east"), label("weekly")])
            .await
            .unwrap();
    }

    let by_name = page(
        &s,
        GroupFilter {
            name: Some("kl clients".into()),
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    assert_eq!(by_name.total, 5, "case-insensitive substring");
    assert!(by_name
        .items
        .iter()
        .all(|g| g.info.subject.starts_with("KL Clients")));

    let postable = page(
        &s,
        GroupFilter {
            can_post: Some(true),
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    let expected = all.iter().filter(|g| g.can_post()).count() as u64;
    assert_eq!(postable.total, expected);
    assert!(postable.items.iter().all(|g| g.can_post));

    let east = page(
        &s,
        GroupFilter {
            label: Some(label("east")),
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    let jids: Vec<_> = east.items.iter().map(|g| g.info.jid.clone()).collect();
    assert_eq!(jids, vec![group(3), group(7), group(11)]);

    // Keyset pages of 10 visit every group once, in order; total is the
    // whole match on every page.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = page(
            &s,
            GroupFilter {
                after: after.clone(),
                limit: 10,
                ..GroupFilter::all_of(a.clone())
            },
        )
        .await;
        assert_eq!(p.total, 25);
        assert!(p.items.len() <= 10);
        if p.items.is_empty() {
            break;
        }
        after = p.items.last().map(|g| g.info.jid.clone());
        seen.extend(p.items.into_iter().map(|g| g.info.jid));
    }
    assert_eq!(seen, groups(0..25));

    // Filters combine.
    let both = page(
        &s,
        GroupFilter {
            name: Some("penang".into()),
            label: Some(label("weekly")),
            limit: 2,
            ..GroupFilter::all_of(a.clone())
        },
    )
    .await;
    assert_eq!(both.total, 3);
    assert_eq!(both.items.len(), 2);
}

pub async fn group_labels(s: S) {
    let a = account(&s, "sales-1").await;
    s.sync_groups(&a, &[ginfo(0, "A"), ginfo(1, "B")], at(1))
        .await
        .unwrap();
    let g = s
        .set_group_labels(&a, &group(1), &[label("west"), label("east")])
        .await
        .unwrap();
    assert_eq!(g.labels, vec![label("east"), label("west")], "sorted");
    assert_eq!(g.info.subject, "B");
    let g = s.set_group_labels(&a, &group(1), &[]).await.unwrap();
    assert!(g.labels.is_empty(), "an empty set clears them");
    let directory = || GroupFilter {
        include_left: true,
        ..GroupFilter::all_of(a.clone())
    };
    let before = page(&s, directory()).await;
    assert_not_found(
        s.set_group_labels(&a, &group(9), &[label("x")])
            .await
            .map(|_| ()),
    );
    assert_not_found(
        s.set_group_labels(&aid("nobody"), &group(0), &[label("x")])
            .await
            .map(|_| ()),
    );
    assert_eq!(page(&s, directory()).await, before, "a refused label wrote");
}
