//! API users (found by token hash, unique names, expiry, revocation that
//! ends their sign-ins) and the audit log (filters, newest-first pages,
//! pruning by age).

use super::fixtures::{at, S};
use crate::domain::*;
use crate::ports::*;

fn user(name: &str, role: Role, expires_at: Option<chrono::DateTime<chrono::Utc>>) -> NewApiUser {
    NewApiUser {
        name: name.into(),
        role,
        token_hash: format!("{:064x}", crate::domain::fnv64(name.as_bytes())),
        created_at: at(0),
        expires_at,
        created_by: "control.token".into(),
    }
}

pub async fn users_are_found_by_token_until_they_expire_or_are_revoked(s: S) {
    let ana = s
        .create_user(&user("ana", Role::Operator, None))
        .await
        .unwrap();
    let bo = s
        .create_user(&user("bo", Role::Viewer, Some(at(60))))
        .await
        .unwrap();
    assert!(bo.id > ana.id, "ids grow");
    assert_eq!(ana.role, Role::Operator);
    assert_eq!(bo.expires_at, Some(at(60)));
    // A second user of the same name is refused, and nothing is written.
    let mut twin = user("ana", Role::Admin, None);
    twin.token_hash = "f".repeat(64);
    assert!(matches!(
        s.create_user(&twin).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(s.list_users().await.unwrap(), vec![ana.clone(), bo.clone()]);
    assert_eq!(s.get_user(bo.id).await.unwrap(), bo);
    assert!(matches!(
        s.get_user(bo.id + 100).await,
        Err(StoreError::NotFound(_))
    ));

    let found = |hash: String, n: i64| {
        let s = s.clone();
        async move { s.user_by_token(&hash, at(n)).await.unwrap() }
    };
    assert_eq!(found(ana.token_hash.clone(), 1).await, Some(ana.clone()));
    assert_eq!(found(bo.token_hash.clone(), 59).await, Some(bo.clone()));
    assert_eq!(
        found(bo.token_hash.clone(), 60).await,
        None,
        "expired at its end"
    );
    assert_eq!(found("0".repeat(64), 1).await, None, "an unknown token");

    s.delete_user(ana.id).await.unwrap();
    assert_eq!(found(ana.token_hash.clone(), 1).await, None, "revoked");
    assert!(matches!(
        s.delete_user(ana.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.list_users().await.unwrap(), vec![bo]);
    // The name is free again once revoked.
    s.create_user(&user("ana", Role::Admin, None))
        .await
        .unwrap();
}

pub async fn revoking_a_user_ends_their_console_sessions(s: S) {
    let ana = s
        .create_user(&user("ana", Role::Operator, None))
        .await
        .unwrap();
    let sign_in = |n: u32, user_id: Option<i64>| ConsoleSession {
        id_hash: format!("{n:064x}"),
        csrf: format!("csrf-{n}"),
        expires_at: at(100),
        user_id,
        user_name: if user_id.is_some() {
            "ana"
        } else {
            "control.token"
        }
        .into(),
        role: if user_id.is_some() {
            Role::Operator
        } else {
            Role::Admin
        },
        token_mark: user_id.is_none().then(|| "mark".into()),
    };
    let hers = sign_in(1, Some(ana.id));
    let admins = sign_in(2, None);
    s.put_console_session(&hers, at(0), 10).await.unwrap();
    s.put_console_session(&admins, at(0), 10).await.unwrap();
    assert_eq!(
        s.get_console_session(&hers.id_hash, at(1)).await.unwrap(),
        Some(hers.clone()),
        "the session keeps who signed in and their role"
    );
    s.delete_user(ana.id).await.unwrap();
    assert_eq!(
        s.get_console_session(&hers.id_hash, at(1)).await.unwrap(),
        None
    );
    assert_eq!(
        s.get_console_session(&admins.id_hash, at(1)).await.unwrap(),
        Some(admins),
        "other sign-ins stay"
    );
}

fn entry(n: i64, actor: &str, operation: &str, resource: Option<&str>) -> NewAuditEntry {
    NewAuditEntry {
        at: at(n),
        actor: actor.into(),
        actor_id: (actor != "control.token").then_some(7),
        role: Some(Role::Operator),
        via: "api".into(),
        operation: operation.into(),
        method: "POST".into(),
        path: format!("/v1/{operation}"),
        resource: resource.map(Into::into),
        summary: format!("{{\"n\":{n}}}"),
        status: 201,
        remote: "127.0.0.1".into(),
        count: 1,
        forwarded_by: (n == 5).then(|| "n2".into()),
    }
}

pub async fn audit_entries_filter_page_newest_first_and_prune(s: S) {
    let mut ids = Vec::new();
    for n in 0..6 {
        let actor = if n % 2 == 0 { "ana" } else { "control.token" };
        let op = if n < 3 { "createReminder" } else { "stopRun" };
        let e = entry(n, actor, op, Some(&format!("{}", n % 3)));
        ids.push(s.append_audit(&e).await.unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow: {ids:?}");
    let all = s
        .list_audit(&AuditFilter::default(), None, 100)
        .await
        .unwrap();
    assert_eq!(all.len(), 6);
    assert_eq!(
        all[0].entry,
        entry(5, "control.token", "stopRun", Some("2"))
    );
    assert_eq!(all[5].id, ids[0], "newest first");
    // Pages of two, following before_id, give every entry once.
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let page = s
            .list_audit(&AuditFilter::default(), before, 2)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        seen.extend(page.iter().map(|e| e.id));
    }
    assert_eq!(seen, all.iter().map(|e| e.id).collect::<Vec<_>>());

    let only = |f: AuditFilter| {
        let s = s.clone();
        async move {
            s.list_audit(&f, None, 100)
                .await
                .unwrap()
                .iter()
                .map(|e| e.entry.at)
                .collect::<Vec<_>>()
        }
    };
    let by_actor = AuditFilter {
        actor: Some("ana".into()),
        ..Default::default()
    };
    assert_eq!(only(by_actor).await, vec![at(4), at(2), at(0)]);
    let by_op_and_resource = AuditFilter {
        operation: Some("stopRun".into()),
        resource: Some("1".into()),
        ..Default::default()
    };
    assert_eq!(only(by_op_and_resource).await, vec![at(4)]);
    let by_time = AuditFilter {
        since: Some(at(1)),
        until: Some(at(3)),
        ..Default::default()
    };
    assert_eq!(
        only(by_time).await,
        vec![at(2), at(1)],
        "since inclusive, until not"
    );

    // Pruning takes the oldest first, at most `limit` at a time.
    assert_eq!(s.prune_audit(at(3), 2).await.unwrap(), 2);
    assert_eq!(s.prune_audit(at(3), 2).await.unwrap(), 1);
    assert_eq!(s.prune_audit(at(3), 2).await.unwrap(), 0);
    assert_eq!(
        only(AuditFilter::default()).await,
        vec![at(5), at(4), at(3)]
    );

    // An attempt that proved no identity has no role, and counts the
    // attempts of its address and minute.
    let mut failed = entry(6, "(unauthenticated)", "failedAuthentication", None);
    failed.role = None;
    failed.actor_id = None;
    let failed_id = s.append_audit(&failed).await.unwrap();
    s.set_audit_count(failed_id, 41).await.unwrap();
    let back = s
        .list_audit(&AuditFilter::default(), None, 1)
        .await
        .unwrap();
    assert_eq!(back[0].id, failed_id);
    assert_eq!(back[0].entry.role, None);
    assert_eq!(back[0].entry.count, 41);
    assert!(matches!(
        s.set_audit_count(failed_id + 1000, 2).await,
        Err(StoreError::NotFound(_))
    ));
}
