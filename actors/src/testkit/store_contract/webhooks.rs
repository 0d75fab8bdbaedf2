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
        .rotate_webhook_secret(w.id, "whsec_bmV3LW5ldy1uZXc=", at(90), at(100))
        .await
        .unwrap();
    assert_eq!(
        r.previous_secrets,
        [PreviousSecret {
            secret: w.secret.clone(),
            until: at(100)
        }]
    );
    assert_eq!(
        r.signing_secrets(at(99)),
        ["whsec_bmV3LW5ldy1uZXc=", w.secret.as_str()]
    );
    assert_eq!(r.signing_secrets(at(100)), ["whsec_bmV3LW5ldy1uZXc="]);
    assert_eq!(s.get_webhook(w.id).await.unwrap(), r);
}

/// Disabled by an admin: the deliveries waiting for the subscription are
/// held (a visible status), an attempt in flight can no longer be
/// recorded, nothing is claimed, a ping or a manual retry is held too;
/// enabled again, they are pending and go out.
pub async fn a_disabled_webhook_holds_its_deliveries_until_enabled(s: S) {
    let w = s
        .create_webhook(&hook(&["run.finished"], true))
        .await
        .unwrap();
    s.append_event(&event("run_finished", 1)).await.unwrap();
    s.append_event(&event("run_finished", 2)).await.unwrap();
    let in_flight = s.claim_deliveries("a", at(2), at(100), 1).await.unwrap();
    assert_eq!(in_flight.len(), 1);
    let statuses = |s: S| async move {
        let mut d = s.list_deliveries(w.id, None, 100).await.unwrap();
        d.reverse();
        d.iter().map(|d| d.status).collect::<Vec<_>>()
    };
    let off = WebhookPatch {
        enabled: Some(false),
        ..Default::default()
    };
    assert!(!s.update_webhook(w.id, &off).await.unwrap().enabled);
    assert_eq!(
        statuses(s.clone()).await,
        [DeliveryStatus::Held, DeliveryStatus::Held]
    );
    assert_eq!(DeliveryStatus::Held.as_str(), "held");
    assert_eq!(DeliveryStatus::parse("held"), Some(DeliveryStatus::Held));
    let delivered = AttemptOutcome::Delivered { status: 200 };
    assert!(
        matches!(
            s.finish_attempt(
                in_flight[0].delivery.id,
                "a",
                &delivered,
                at(3),
                Duration::MAX
            )
            .await,
            Err(StoreError::Conflict(_))
        ),
        "the claim went with the hold"
    );
    assert!(s
        .claim_deliveries("b", at(200), at(300), 10)
        .await
        .unwrap()
        .is_empty());
    // No new deliveries while disabled; a ping or a retry by hand is held.
    s.append_event(&event("run_finished", 3)).await.unwrap();
    let ping = s.append_event(&event("webhook_ping", 4)).await.unwrap();
    let p = s
        .add_delivery(w.id, ping.id, PING_TYPE, at(4))
        .await
        .unwrap();
    assert_eq!(p.status, DeliveryStatus::Held);
    let first = in_flight[0].delivery.id;
    let again = s.retry_delivery(w.id, first, at(5)).await.unwrap();
    assert_eq!(again.status, DeliveryStatus::Held);
    assert!(s
        .claim_deliveries("b", at(200), at(300), 10)
        .await
        .unwrap()
        .is_empty());
    // Enabled again: every held delivery is pending, and goes out.
    let on = WebhookPatch {
        enabled: Some(true),
        ..Default::default()
    };
    s.update_webhook(w.id, &on).await.unwrap();
    assert_eq!(statuses(s.clone()).await, [DeliveryStatus::Pending; 3]);
    let due = s.claim_deliveries("b", at(200), at(300), 10).await.unwrap();
    assert_eq!(due.len(), 3);
    for d in due {
        s.finish_attempt(d.delivery.id, "b", &delivered, at(201), Duration::MAX)
            .await
            .unwrap();
    }
    assert_eq!(statuses(s.clone()).await, [DeliveryStatus::Delivered; 3]);
}

/// Disabled by the sender after failing too long: the subscription's other
/// deliveries, waiting for a retry or in flight, are held with it.
pub async fn a_webhook_the_sender_disables_holds_the_rest(s: S) {
    let w = s
        .create_webhook(&hook(&["run.finished"], true))
        .await
        .unwrap();
    for n in 1..=3 {
        s.append_event(&event("run_finished", n)).await.unwrap();
    }
    let due = s
        .claim_deliveries("a", at(3), at(10_000), 10)
        .await
        .unwrap();
    let ids: Vec<i64> = due.iter().map(|d| d.delivery.id).collect();
    assert_eq!(ids.len(), 3);
    let hour = Duration::from_secs(3600);
    let retry = AttemptOutcome::Retry {
        status: Some(502),
        error: "bad gateway".into(),
        next_attempt_at: at(20),
    };
    s.finish_attempt(ids[0], "a", &retry, at(4), hour)
        .await
        .unwrap();
    let gave_up = AttemptOutcome::GaveUp {
        status: Some(502),
        error: "bad gateway".into(),
    };
    s.finish_attempt(ids[1], "a", &gave_up, at(7300), hour)
        .await
        .unwrap();
    assert!(!s.get_webhook(w.id).await.unwrap().enabled);
    let list = s.list_deliveries(w.id, None, 10).await.unwrap();
    let status = |id: i64| list.iter().find(|d| d.id == id).unwrap().status;
    assert_eq!(
        [status(ids[0]), status(ids[1]), status(ids[2])],
        [
            DeliveryStatus::Held,
            DeliveryStatus::Failed,
            DeliveryStatus::Held
        ]
    );
    let delivered = AttemptOutcome::Delivered { status: 200 };
    assert!(matches!(
        s.finish_attempt(ids[2], "a", &delivered, at(7301), hour)
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert!(s
        .claim_deliveries("b", at(20_000), at(20_100), 10)
        .await
        .unwrap()
        .is_empty());
    let on = WebhookPatch {
        enabled: Some(true),
        ..Default::default()
    };
    s.update_webhook(w.id, &on).await.unwrap();
    let due = s
        .claim_deliveries("b", at(20_000), at(20_100), 10)
        .await
        .unwrap();
    let mut again: Vec<i64> = due.iter().map(|d| d.delivery.id).collect();
    again.sort();
    assert_eq!(again, [ids[0], ids[2]]);
}

/// A second rotation inside the first one's overlap: every earlier secret
/// goes on signing until its own end; ended ones are dropped at the next
/// rotation; at most MAX_SIGNING_SECRETS sign at once.
pub async fn a_second_rotation_keeps_the_first_secret_until_its_own_end(s: S) {
    let w = s
        .create_webhook(&hook(&["run.finished"], true))
        .await
        .unwrap();
    let s0 = w.secret.clone();
    let (s1, s2) = ("whsec_b25lLW9uZS1vbmU=", "whsec_dHdvLXR3by10d28=");
    let r1 = s
        .rotate_webhook_secret(w.id, s1, at(10), at(100))
        .await
        .unwrap();
    assert_eq!(r1.signing_secrets(at(50)), [s1, s0.as_str()]);
    // The second rotation's overlap ends before the first one's.
    s.rotate_webhook_secret(w.id, s2, at(20), at(60))
        .await
        .unwrap();
    let r2 = s.get_webhook(w.id).await.unwrap();
    assert_eq!(r2.secret, s2);
    assert_eq!(r2.signing_secrets(at(50)), [s2, s1, s0.as_str()]);
    assert_eq!(
        r2.signing_secrets(at(70)),
        [s2, s0.as_str()],
        "the first secret signs until its own end"
    );
    assert_eq!(r2.signing_secrets(at(100)), [s2]);
    assert_eq!(r2.overlap_until(at(50)), Some(at(100)));
    assert_eq!(r2.overlap_until(at(100)), None);
    // Ended overlaps are dropped by the next rotation.
    let r3 = s
        .rotate_webhook_secret(w.id, "whsec_dGhyZWUtdGhyZWU=", at(100), at(100))
        .await
        .unwrap();
    assert_eq!(r3.previous_secrets.len(), 1, "{:?}", r3.previous_secrets);
    assert_eq!(r3.signing_secrets(at(100)), ["whsec_dGhyZWUtdGhyZWU="]);
    // Rotations inside overlaps add up to MAX_SIGNING_SECRETS, then are
    // refused, changing nothing.
    let mut made = 0;
    let refused = loop {
        let secret = format!("whsec_{made:08}");
        match s
            .rotate_webhook_secret(w.id, &secret, at(200), at(1000))
            .await
        {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 20, "never refused");
    };
    assert_eq!(made, MAX_SIGNING_SECRETS - 1);
    assert!(
        matches!(&refused, StoreError::Conflict(m) if m.contains("secrets signing")),
        "{refused:?}"
    );
    let last = s.get_webhook(w.id).await.unwrap();
    assert_eq!(last.secret, format!("whsec_{:08}", made - 1));
    assert_eq!(last.signing_secrets(at(500)).len(), MAX_SIGNING_SECRETS);
    assert!(matches!(
        s.rotate_webhook_secret(w.id + 100, s1, at(200), at(300))
            .await,
        Err(StoreError::NotFound(_))
    ));
}
