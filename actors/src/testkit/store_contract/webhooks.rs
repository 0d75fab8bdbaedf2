//! Webhook subscriptions and deliveries: one delivery per matching enabled
//! subscription, made with its event; claims that keep two daemons apart
//! and lapse; attempts, retries, giving up, and a subscription disabled
//! after failing too long.

use super::fixtures::{at, S};
use crate::domain::*;
use crate::ports::*;
use std::time::Duration;

fn hook(types: &[&str], enabled: bool) -> NewWebhook {
    NewWebhook {
        url: "https://hooks.example.com/herald".into(),
        types: types.iter().map(|t| (*t).to_owned()).collect(),
        description: "ops".into(),
        enabled,
        secret: "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=".into(),
        created_at: at(0),
    }
}

fn event(kind: &'static str, n: i64) -> NewEvent {
    NewEvent {
        at: at(n),
        kind,
        account_id: None,
        run_id: Some(RunId(n)),
        data: serde_json::json!({"n": n}),
    }
}

pub async fn webhook_deliveries_are_made_with_their_event_for_matching_subscriptions(s: S) {
    let runs = s
        .create_webhook(&hook(&["run.started", "run.finished"], true))
        .await
        .unwrap();
    let off = s
        .create_webhook(&hook(&["run.started"], false))
        .await
        .unwrap();
    let every = s
        .create_webhook(&hook(webhook_type_names(), true))
        .await
        .unwrap();
    assert_eq!(s.get_webhook(runs.id).await.unwrap(), runs);
    assert_eq!(runs.types, ["run.started", "run.finished"]);
    let kinds: Vec<&'static str> = WEBHOOK_TYPES.iter().map(|(_, k)| *k).collect();
    let news: Vec<NewEvent> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| event(k, i as i64 + 1))
        .chain([event("not_for_webhooks", 9)])
        .collect();
    let stored = s.append_events(&news).await.unwrap();
    let of = |id: i64| {
        let s = s.clone();
        async move {
            let mut d = s.list_deliveries(id, None, 100).await.unwrap();
            d.reverse();
            d
        }
    };
    let mine = of(runs.id).await;
    assert_eq!(
        mine.iter()
            .map(|d| d.event_type.as_str())
            .collect::<Vec<_>>(),
        ["run.started", "run.finished"]
    );
    assert!(mine
        .iter()
        .all(|d| d.status == DeliveryStatus::Pending && d.attempts == 0));
    assert_eq!(mine[0].event_id, stored[0].id);
    assert_eq!(mine[0].next_attempt_at, stored[0].at, "due at once");
    assert!(
        of(off.id).await.is_empty(),
        "a disabled subscription gets nothing"
    );
    // The database's mapping of types to event kinds is the code's.
    let all = of(every.id).await;
    let pairs: Vec<(String, i64)> = all
        .iter()
        .map(|d| (d.event_type.clone(), d.event_id))
        .collect();
    let want: Vec<(String, i64)> = WEBHOOK_TYPES
        .iter()
        .zip(&stored)
        .map(|((t, _), e)| ((*t).to_owned(), e.id))
        .collect();
    assert_eq!(pairs, want);

    // Deleting a subscription takes its deliveries.
    s.delete_webhook(every.id).await.unwrap();
    assert!(matches!(
        s.get_webhook(every.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(of(every.id).await.is_empty());
    assert!(matches!(
        s.delete_webhook(every.id).await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn webhook_claims_attempts_retries_and_disabling(s: S) {
    let w = s
        .create_webhook(&hook(&["run.finished"], true))
        .await
        .unwrap();
    assert_eq!(
        s.webhook_backlog(at(0)).await.unwrap(),
        WebhookBacklog::default()
    );
    s.append_event(&event("run_finished", 1)).await.unwrap();
    s.append_event(&event("run_finished", 2)).await.unwrap();
    let backlog = |now: i64| {
        let s = s.clone();
        async move { s.webhook_backlog(at(now)).await.unwrap() }
    };
    assert_eq!(
        (backlog(1).await.pending, backlog(1).await.oldest_due_at),
        (2, Some(at(1))),
        "both pending; only the first due at 1"
    );
    let claim = |node: &'static str, now: i64| {
        let s = s.clone();
        async move {
            s.claim_deliveries(node, at(now), at(now + 1), 10)
                .await
                .unwrap()
        }
    };
    let a = claim("a", 2).await;
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].webhook, w);
    assert_eq!(a[0].event.data, serde_json::json!({"n": 1}));
    assert!(claim("b", 2).await.is_empty(), "claimed by a");
    // a dies; its claim lapses and b takes the deliveries up.
    let b = claim("b", 3).await;
    assert_eq!(b.len(), 2);
    let (d1, d2) = (b[0].delivery.id, b[1].delivery.id);
    let delivered = AttemptOutcome::Delivered { status: 204 };
    assert!(
        matches!(
            s.finish_attempt(d1, "a", &delivered, at(3), Duration::MAX)
                .await,
            Err(StoreError::Conflict(_))
        ),
        "a lost its claim: its late answer is not recorded"
    );
    s.finish_attempt(d1, "b", &delivered, at(3), Duration::MAX)
        .await
        .unwrap();
    let retry = AttemptOutcome::Retry {
        status: Some(503),
        error: "busy".into(),
        next_attempt_at: at(10),
    };
    s.finish_attempt(d2, "b", &retry, at(3), Duration::from_secs(3600))
        .await
        .unwrap();
    let list = s.list_deliveries(w.id, None, 10).await.unwrap();
    let got = |id: i64| list.iter().find(|d| d.id == id).unwrap().clone();
    assert_eq!(got(d1).status, DeliveryStatus::Delivered);
    assert_eq!((got(d1).attempts, got(d1).last_status), (1, Some(204)));
    let r = got(d2);
    assert_eq!(
        (
            r.status,
            r.attempts,
            r.last_status,
            r.last_error.as_deref(),
            r.next_attempt_at
        ),
        (DeliveryStatus::Pending, 1, Some(503), Some("busy"), at(10))
    );
    assert_eq!(
        s.get_webhook(w.id).await.unwrap().failing_since,
        Some(at(3))
    );
    assert_eq!(
        backlog(3).await,
        WebhookBacklog {
            pending: 1,
            oldest_due_at: None
        },
        "one delivered; the other retries at 10"
    );
    assert_eq!(backlog(12).await.oldest_due_at, Some(at(10)));
    assert!(
        claim("b", 9).await.is_empty(),
        "not before its next attempt"
    );
    assert_eq!(claim("b", 10).await.len(), 1);
    // Failing for longer than allowed: the last attempt gives up and the
    // subscription is disabled, with the reason.
    let gave_up = AttemptOutcome::GaveUp {
        status: None,
        error: "connection refused".into(),
    };
    s.finish_attempt(d2, "b", &gave_up, at(70), Duration::from_secs(3600))
        .await
        .unwrap();
    let off = s.get_webhook(w.id).await.unwrap();
    assert!(!off.enabled);
    let reason = off.disabled_reason.unwrap();
    assert!(reason.contains("connection refused"), "{reason}");
    assert_eq!(
        s.list_deliveries(w.id, None, 10).await.unwrap()[0].status,
        DeliveryStatus::Failed
    );
    assert_eq!(backlog(70).await, WebhookBacklog::default(), "given up");
    s.append_event(&event("run_finished", 71)).await.unwrap();
    assert_eq!(s.list_deliveries(w.id, None, 10).await.unwrap().len(), 2);
    // Enabled again by the operator: the streak and reason are cleared,
    // and a manual retry makes the failed delivery due now.
    let on = s
        .update_webhook(
            w.id,
            &WebhookPatch {
                enabled: Some(true),
                description: Some("ops, again".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(on.enabled && on.disabled_reason.is_none() && on.failing_since.is_none());
    assert_eq!(
        (on.url.as_str(), on.description.as_str()),
        (w.url.as_str(), "ops, again")
    );
    let again = s.retry_delivery(w.id, d2, at(80)).await.unwrap();
    assert_eq!(
        (again.status, again.next_attempt_at),
        (DeliveryStatus::Pending, at(80))
    );
    assert!(matches!(
        s.retry_delivery(w.id + 1, d2, at(80)).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(claim("c", 80).await[0].delivery.id, d2);

    // A ping: a delivery of a stored event, made by hand.
    let ping = s.append_event(&event("webhook_ping", 81)).await.unwrap();
    let d = s
        .add_delivery(w.id, ping.id, PING_TYPE, at(81))
        .await
        .unwrap();
    assert_eq!(
        (d.event_type.as_str(), d.status),
        (PING_TYPE, DeliveryStatus::Pending)
    );

    // Rotation: the new secret signs, the old one beside it until the
    // overlap ends.
    let r = s
        .rotate_webhook_secret(w.id, "whsec_bmV3LW5ldy1uZXc=", at(100))
        .await
        .unwrap();
    assert_eq!(r.old_secret.as_deref(), Some(w.secret.as_str()));
    assert_eq!(
        r.signing_secrets(at(99)),
        ["whsec_bmV3LW5ldy1uZXc=", w.secret.as_str()]
    );
    assert_eq!(r.signing_secrets(at(100)), ["whsec_bmV3LW5ldy1uZXc="]);
}
