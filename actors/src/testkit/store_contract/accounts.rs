//! Accounts: create, read, change, and what deleting one takes along.

use super::fixtures::{
    account, aid, assert_conflict, assert_not_found, at, media, new_account, reminder, run,
    snapshot, S,
};
use crate::domain::*;
use crate::ports::*;

// ---------------------------------------------------------------- accounts

pub async fn accounts_crud(s: S) {
    s.ping().await.expect("ping");
    assert!(s.list_accounts().await.unwrap().is_empty());

    let mut b = new_account("b-2");
    b.kind = GatewayKind::Whatsapp;
    b.state = AccountState::Pairing;
    b.limits = AccountLimits {
        max_per_minute: Some(20),
        group_concurrency: None,
        daily_cap: Some(5000),
        hourly_cap: Some(400),
        timezone: Some(TimeZone::parse("Asia/Kuala_Lumpur").unwrap()),
        new_number: true,
    };
    let created = s.create_account(&b, at(1)).await.unwrap();
    assert_eq!(
        created,
        Account {
            id: b.id.clone(),
            name: b.name.clone(),
            kind: GatewayKind::Whatsapp,
            state: AccountState::Pairing,
            state_reason: None,
            state_until: None,
            limits: b.limits.clone(),
            created_at: at(1),
            incident_at: None,
            standing: Standing::default(),
        }
    );
    // A state that ends by itself keeps its end; any other clears it.
    let banned = s
        .set_account_state_until(&b.id, AccountState::Banned, Some("banned"), Some(at(30)))
        .await
        .unwrap();
    assert_eq!(
        (banned.state, banned.state_until),
        (AccountState::Banned, Some(at(30)))
    );
    assert_eq!(
        s.get_account(&b.id).await.unwrap().unwrap().state_until,
        Some(at(30)),
        "a temporary ban's end is kept with the account"
    );
    let back = s
        .set_account_state(&b.id, AccountState::Pairing, None)
        .await
        .unwrap();
    assert_eq!(
        (back.state, back.state_until),
        (AccountState::Pairing, None)
    );
    s.record_incident(&b.id, at(2)).await.unwrap();
    assert_eq!(
        s.get_account(&b.id).await.unwrap().unwrap().incident_at,
        Some(at(2)),
        "an incident restarts the warm-up from its time"
    );
    s.record_incident(&b.id, at(1)).await.unwrap();
    let created = Account {
        incident_at: Some(at(1)),
        ..created
    };
    assert_eq!(s.get_account(&b.id).await.unwrap(), Some(created.clone()));
    assert_eq!(s.get_account(&aid("nobody")).await.unwrap(), None);

    // What WhatsApp says of the account: kept with it, with the event of a
    // change in the same write; a re-read that says the same writes none.
    let standing = Standing {
        timelock: Reading::Known {
            value: TimeLock {
                active: true,
                until: Some(at(40)),
                kind: Some("DEFAULT".into()),
            },
            read_at: at(3),
        },
        quota: Reading::Unknown {
            why: "unknown document id".into(),
            read_at: at(3),
        },
    };
    let event = NewEvent {
        at: at(3),
        kind: "account_standing",
        account_id: Some(b.id.clone()),
        run_id: None,
        data: serde_json::json!({"timelock": "active"}),
    };
    // Written over a standing that is not the stored one: refused, and
    // nothing changes (two readings at once tell a change once).
    let stale = Standing {
        quota: Reading::Unknown {
            why: "stale".into(),
            read_at: at(1),
        },
        ..Standing::default()
    };
    assert!(matches!(
        s.set_account_standing(&b.id, Some(&stale), &standing, Some(&event))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        s.get_account(&b.id).await.unwrap().unwrap().standing,
        Standing::default()
    );
    let told = s
        .set_account_standing(&b.id, Some(&Standing::default()), &standing, Some(&event))
        .await
        .unwrap()
        .expect("the change is told");
    assert_eq!(told.kind, "account_standing");
    assert_eq!(
        s.set_account_standing(&b.id, Some(&standing), &standing, None)
            .await
            .unwrap(),
        None
    );
    let created = Account {
        standing: standing.clone(),
        ..created
    };
    assert_eq!(s.get_account(&b.id).await.unwrap(), Some(created.clone()));
    assert!(s
        .list_accounts()
        .await
        .unwrap()
        .iter()
        .any(|a| a.id == b.id && a.standing == standing));
    assert!(matches!(
        s.set_account_standing(&aid("nobody"), None, &standing, None)
            .await,
        Err(StoreError::NotFound(_))
    ));

    let a = account(&s, "a-1").await;
    let ids: Vec<AccountId> = s
        .list_accounts()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, vec![a.clone(), b.id.clone()], "listed by id");

    // A taken id is a conflict and the first account stays as it was.
    let mut dup = new_account("b-2");
    dup.name = "Impostor".into();
    assert_conflict(s.create_account(&dup, at(2)).await);
    assert_eq!(s.get_account(&b.id).await.unwrap(), Some(created.clone()));

    let limits = AccountLimits {
        max_per_minute: Some(30),
        group_concurrency: Some(2),
        daily_cap: None,
        hourly_cap: Some(100),
        timezone: Some(TimeZone::parse("Europe/London").unwrap()),
        new_number: false,
    };
    let updated = s.update_account_limits(&a, &limits).await.unwrap();
    assert_eq!(updated.limits, limits);
    assert_eq!(s.get_account(&a).await.unwrap().unwrap().limits, limits);
    let cleared = s
        .update_account_limits(&a, &AccountLimits::default())
        .await
        .unwrap();
    assert_eq!(cleared.limits, AccountLimits::default());

    let banned = s
        .set_account_state(&a, AccountState::Banned, Some("temporary ban until 10:00"))
        .await
        .unwrap();
    assert_eq!(banned.state, AccountState::Banned);
    assert_eq!(
        banned.state_reason.as_deref(),
        Some("temporary ban until 10:00")
    );
    assert_eq!(s.get_account(&a).await.unwrap(), Some(banned));
    let back = s
        .set_account_state(&a, AccountState::Connected, None)
        .await
        .unwrap();
    assert_eq!(back.state, AccountState::Connected);
    assert_eq!(
        back.state_reason, None,
        "a new state without a reason clears it"
    );

    let ghost = aid("ghost");
    assert_not_found(s.update_account_limits(&ghost, &limits).await);
    assert_not_found(
        s.set_account_state(&ghost, AccountState::Connected, None)
            .await,
    );
    assert_not_found(s.delete_account(&ghost).await);
    assert_eq!(
        s.get_account(&ghost).await.unwrap(),
        None,
        "nothing created"
    );

    s.delete_account(&a).await.unwrap();
    assert_eq!(s.get_account(&a).await.unwrap(), None);
    assert_eq!(s.list_accounts().await.unwrap(), vec![created]);
}

/// Deleting `a` is refused as a conflict naming `what`, and writes nothing.
async fn refused_naming(s: &S, a: &AccountId, what: &str) {
    let before = snapshot(s).await;
    let e = s.delete_account(a).await;
    assert!(
        matches!(&e, Err(StoreError::Conflict(m)) if m.contains(what)),
        "{what} must hold the account: {e:?}"
    );
    assert_eq!(
        snapshot(s).await,
        before,
        "a delete refused for {what} wrote something"
    );
}

pub async fn account_delete_rules(s: S) {
    let a = account(&s, "sales-1").await;
    let m = media(&s, b"logo").await;
    let r = reminder(&s, &a, 3).await;
    let other = account(&s, "other").await;
    let kept = reminder(&s, &other, 1).await;
    s.put_upload_handle(
        &a,
        &m,
        &UploadHandle {
            handle: "h".into(),
            expires_at: at(60),
        },
    )
    .await
    .unwrap();

    for state in [ReminderState::Active, ReminderState::Paused] {
        s.set_reminder_state(r.id, state, at(1)).await.unwrap();
        let before = snapshot(&s).await;
        assert_conflict(s.delete_account(&a).await);
        assert_eq!(
            snapshot(&s).await,
            before,
            "refused delete ({state}) wrote something"
        );
    }

    s.set_reminder_state(r.id, ReminderState::Archived, at(2))
        .await
        .unwrap();
    let done = run(&s, &r, 0, RunStatus::Success).await;

    // A run or a recall the account's actor is carrying holds the account,
    // whichever daemon carries it: the store, not one daemon's actor, says.
    let busy = run(&s, &r, 1, RunStatus::Queued).await;
    let set = |status| RunUpdate {
        status: Some(status),
        expect: RunStatus::ALL.to_vec(),
        ..Default::default()
    };
    for status in [RunStatus::Queued, RunStatus::Running] {
        s.update_run(busy.id, &set(status)).await.unwrap();
        refused_naming(&s, &a, &format!("run {}", busy.id)).await;
    }
    s.update_run(busy.id, &set(RunStatus::Cancelled))
        .await
        .unwrap();
    let (recall, _) = s
        .create_amendment(
            &super::amend::ask(done.id, AmendKind::Recall, 3),
            &[],
            &super::amend::told(&a, done.id, "run_recall_started", 3),
        )
        .await
        .unwrap();
    refused_naming(&s, &a, &format!("amendment {}", recall.id)).await;
    s.finish_amendment(
        &[],
        recall.id,
        at(4),
        &super::amend::told(&a, done.id, "run_recall_finished", 4),
    )
    .await
    .unwrap();
    s.delete_account(&a).await.unwrap();
    assert_eq!(s.get_account(&a).await.unwrap(), None);
    assert_eq!(
        s.get_reminder(r.id).await.unwrap(),
        None,
        "archived reminder goes too"
    );
    let left = s.list_reminders(&ReminderFilter::default()).await.unwrap();
    assert_eq!(left, vec![kept], "other accounts' reminders stay");
    let runs = s
        .list_runs(&RunFilter {
            reminder_id: Some(r.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        runs.is_empty(),
        "runs of deleted reminders go too: {runs:?}"
    );

    // The id is free again, with no stale upload handle attached.
    account(&s, "sales-1").await;
    assert_eq!(s.get_upload_handle(&a, &m).await.unwrap(), None);
}
