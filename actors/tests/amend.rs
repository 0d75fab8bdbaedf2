//! Recalling and editing a sent run on the simulated WhatsApp, on virtual
//! time: every message of every group once, in the run's order, at the
//! account's rate, resumed after a crash, refused past WhatsApp's window.

use chrono::{DateTime, Utc};
use herald_actors::delivery::account::{AmendRun, ControlError, InjectFault, Snapshot};
use herald_actors::delivery::amend::AmendAsk;
use herald_actors::delivery::engine::EngineConfig;
use herald_actors::delivery::outcome::message_id;
use herald_actors::domain::*;
use herald_actors::ports::{AmendStore, EventStore};
use herald_actors::simulator::{DeliveredContent, Delivery, SimConfig};
use herald_actors::world::{reminder, SimWorld};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

fn start() -> DateTime<Utc> {
    "2026-11-23T01:00:00Z".parse().unwrap()
}

fn all_day() -> WindowHours {
    WindowHours::parse(0, 24).unwrap()
}

fn text(s: &str) -> MessagePart {
    MessagePart::text(s).unwrap()
}

async fn world(cfg: EngineConfig) -> SimWorld {
    tokio::time::pause();
    let sim = SimConfig {
        latency: herald_actors::simulator::Latency::Fixed(Duration::from_millis(100)),
        // WhatsApp's own limit, so a burst over the account's rate shows.
        rate_limit_per_minute: Some(40),
        ..SimConfig::default()
    };
    SimWorld::start(sim, cfg, start())
}

async fn amend(
    w: &SimWorld,
    a: &AccountId,
    run: RunId,
    ask: AmendAsk,
) -> Result<Amendment, ControlError> {
    w.actor(a)
        .await
        .send(AmendRun { run_id: run, ask })
        .await
        .expect("actor alive")
}

/// Waits (virtual time) until the run's newest amendment has finished.
async fn finished(w: &SimWorld, run: RunId) -> Amendment {
    for _ in 0..20_000 {
        if let Some(a) = w.store.run_amendment(run).await.unwrap() {
            if a.is_finished() {
                return a;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("amendment of run {run} did not finish");
}

/// Revokes and edits the simulator delivered, by group, in order.
fn amendments_by_group(ds: &[Delivery]) -> HashMap<GroupJid, Vec<DeliveredContent>> {
    let mut out: HashMap<GroupJid, Vec<DeliveredContent>> = HashMap::new();
    for d in ds.iter().filter(|d| d.content.amends().is_some()) {
        out.entry(d.group.clone())
            .or_default()
            .push(d.content.clone());
    }
    out
}

#[actix_rt::test]
async fn a_recall_revokes_every_message_of_every_group_once_in_order_at_the_accounts_rate() {
    let w = world(EngineConfig::default()).await;
    let (a, groups) = w.add_account("a1", 60, AccountLimits::default()).await;
    let run = w
        .fire(&reminder(
            &a,
            "UTC",
            all_day(),
            vec![text("Standup at 09:00"), text("Agenda: the launch")],
            groups.clone(),
        ))
        .await;
    let done = w.wait_final(run, Duration::from_secs(3600)).await;
    assert_eq!(done.status, RunStatus::Success);

    let asked = amend(&w, &a, run, AmendAsk::recall())
        .await
        .expect("recall accepted");
    assert_eq!(asked.kind, AmendKind::Recall);
    assert_eq!(asked.progress.total, 60);
    let a_end = finished(&w, run).await;
    assert_eq!((a_end.progress.done, a_end.progress.total), (60, 60));
    assert_eq!(a_end.progress.settled(), 60);

    let ds = w.sim.deliveries(&a);
    let by_group = amendments_by_group(&ds);
    assert_eq!(by_group.len(), 60, "every group");
    for g in &groups {
        let want: Vec<DeliveredContent> = (0..2)
            .map(|p| DeliveredContent::Revoke {
                of: message_id(run, g, p),
            })
            .collect();
        assert_eq!(by_group[g], want, "both parts of {g}, once, in order");
    }
    // In the run's order of groups.
    let order: Vec<&GroupJid> = {
        let mut seen = HashSet::new();
        ds.iter()
            .filter(|d| d.content.amends().is_some())
            .map(|d| &d.group)
            .filter(|g| seen.insert(*g))
            .collect()
    };
    assert_eq!(order, groups.iter().collect::<Vec<_>>());
    // 120 messages, then 120 revokes, never over the limit in any minute.
    assert_eq!(w.sim.delivered(&a), 240);
    assert!(
        w.sim.max_in_any_60s(&a) <= 40,
        "{}",
        w.sim.max_in_any_60s(&a)
    );
    assert_eq!(w.sim.stats(&a).rate_limited, 0);
    assert_eq!(w.sim.duplicate_deliveries(), 0);

    let kinds: Vec<String> = w
        .store
        .events_after(0, 0)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.run_id == Some(run.0))
        .map(|e| e.kind)
        .collect();
    assert!(
        kinds.contains(&"run_recall_started".to_owned()),
        "{kinds:?}"
    );
    let end = kinds.iter().filter(|k| *k == "run_recall_finished").count();
    assert_eq!(end, 1, "{kinds:?}");

    // A second recall is its own amendment: every group again, with ids
    // of its own (WhatsApp ignores revokes of revoked messages).
    let again = amend(&w, &a, run, AmendAsk::recall())
        .await
        .expect("second recall");
    assert_ne!(again.id, asked.id);
}

#[actix_rt::test]
async fn a_recall_of_a_run_still_sending_stops_it_and_recalls_only_what_went() {
    let w = world(EngineConfig::default()).await;
    let (a, groups) = w.add_account("a1", 100, AccountLimits::default()).await;
    let run = w
        .fire(&reminder(
            &a,
            "UTC",
            all_day(),
            vec![text("x")],
            groups.clone(),
        ))
        .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    amend(&w, &a, run, AmendAsk::recall())
        .await
        .expect("recall accepted");
    let stopped = w.wait_final(run, Duration::from_secs(600)).await;
    assert_eq!(stopped.status, RunStatus::Cancelled);
    let end = finished(&w, run).await;
    let sent: Vec<Delivery> = w
        .sim
        .deliveries(&a)
        .into_iter()
        .filter(|d| d.content.amends().is_none())
        .collect();
    assert!(!sent.is_empty() && sent.len() < 100, "{}", sent.len());
    let revoked: HashSet<String> = w
        .sim
        .deliveries(&a)
        .iter()
        .filter_map(|d| d.content.amends().map(str::to_owned))
        .collect();
    // Every message that went is revoked; a group that got nothing, nothing.
    for d in &sent {
        assert!(revoked.contains(&d.message_id), "{} not revoked", d.group);
    }
    // Only the groups whose message went (or may have: none here, the
    // simulator answers every send) are recalled.
    assert_eq!(end.progress.done as usize, sent.len());
    assert_eq!(revoked.len(), sent.len());
    assert_eq!(end.progress.total, end.progress.done);
    assert!(w.sim.max_in_any_60s(&a) <= 40);
    // What was taken back does not go out again by a retry.
    let retry = w
        .actor(&a)
        .await
        .send(herald_actors::delivery::account::RetryRun { run_id: run })
        .await
        .unwrap();
    match retry {
        Err(ControlError::Conflict(why)) => assert!(why.contains("was recalled"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[actix_rt::test]
async fn a_recall_interrupted_by_a_crash_resumes_and_recalls_no_group_twice() {
    let w = world(EngineConfig::default()).await;
    let (a, groups) = w.add_account("a1", 80, AccountLimits::default()).await;
    let run = w
        .fire(&reminder(
            &a,
            "UTC",
            all_day(),
            vec![text("x")],
            groups.clone(),
        ))
        .await;
    w.wait_final(run, Duration::from_secs(3600)).await;
    let asked = amend(&w, &a, run, AmendAsk::recall()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(40)).await;
    let before = w.actor(&a).await;
    assert_eq!(
        before.send(Snapshot).await.unwrap().amending,
        Some(asked.id)
    );
    before.do_send(InjectFault { panic: true });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let midway = w.store.run_amendment(run).await.unwrap().unwrap();
    assert!(
        midway.progress.done > 0 && midway.progress.done < 80,
        "{:?}",
        midway.progress
    );
    let end = finished(&w, run).await;
    assert_eq!(end.progress.done, 80);
    let by_group = amendments_by_group(&w.sim.deliveries(&a));
    assert_eq!(by_group.len(), 80);
    assert!(by_group.values().all(|v| v.len() == 1), "each group once");
    assert_eq!(w.sim.duplicate_deliveries(), 0);
    // The restarted actor's bucket read the revokes of the last minute.
    assert!(
        w.sim.max_in_any_60s(&a) <= 40,
        "{}",
        w.sim.max_in_any_60s(&a)
    );
}

#[actix_rt::test]
async fn past_whatsapps_window_a_recall_or_an_edit_is_refused_naming_the_deadline() {
    let w = world(EngineConfig::default()).await;
    let (a, groups) = w.add_account("a1", 3, AccountLimits::default()).await;
    let run = w
        .fire(&reminder(&a, "UTC", all_day(), vec![text("x")], groups))
        .await;
    let done = w.wait_final(run, Duration::from_secs(600)).await;
    let ended = done.finished_at.unwrap();
    tokio::time::sleep(Duration::from_secs(16 * 60)).await;
    let edit = AmendAsk {
        kind: AmendKind::Edit,
        text: Some("y".into()),
        caption: None,
    };
    let deadline = |window: i64| {
        (ended + chrono::TimeDelta::seconds(window))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    match amend(&w, &a, run, edit).await {
        Err(ControlError::Conflict(why)) => {
            assert!(why.contains("too late to edit"), "{why}");
            assert!(why.contains("15 minutes"), "{why}");
            assert!(why.contains(&deadline(900)), "{why}");
        }
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(2 * 86_400)).await;
    match amend(&w, &a, run, AmendAsk::recall()).await {
        Err(ControlError::Conflict(why)) => {
            assert!(why.contains("2 days"), "{why}");
            assert!(why.contains(&deadline(172_800)), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        w.store.run_amendment(run).await.unwrap(),
        None,
        "nothing stored"
    );
    assert_eq!(w.sim.delivered(&a), 3, "nothing sent");
}

#[actix_rt::test]
async fn groups_past_the_window_midway_are_reported_too_old_and_not_sent() {
    let cfg = EngineConfig {
        amend_windows: AmendWindows {
            recall: Duration::from_secs(180),
            edit: EDIT_WINDOW,
        },
        ..EngineConfig::default()
    };
    let w = world(cfg).await;
    let (a, groups) = w.add_account("a1", 80, AccountLimits::default()).await;
    let run = w
        .fire(&reminder(&a, "UTC", all_day(), vec![text("x")], groups))
        .await;
    w.wait_final(run, Duration::from_secs(3600)).await;
    // The run took about two minutes: a minute and a half after its end,
    // its first groups are past the three minutes, its last are not.
    tokio::time::sleep(Duration::from_secs(90)).await;
    amend(&w, &a, run, AmendAsk::recall())
        .await
        .expect("within the window");
    let end = finished(&w, run).await;
    let p = end.progress;
    assert!(p.too_old > 0 && p.done > 0, "{p:?}");
    assert_eq!(p.too_old + p.done, 80, "{p:?}");
    let revoked = amendments_by_group(&w.sim.deliveries(&a)).len();
    assert_eq!(revoked as u32, p.done, "too-old groups get nothing");
    let targets = w.store.amend_targets(end.id, None, 0).await.unwrap();
    // The oldest are the too old: the run's first groups.
    let first_done = targets
        .iter()
        .position(|t| t.state == Some(AmendState::Done))
        .unwrap();
    assert!(targets[..first_done]
        .iter()
        .all(|t| t.state == Some(AmendState::TooOld)));
}

#[actix_rt::test]
async fn an_edit_replaces_each_text_part_and_each_caption_it_is_given() {
    let w = world(EngineConfig::default()).await;
    let (a, groups) = w.add_account("a1", 10, AccountLimits::default()).await;
    let picture = w.add_media(vec![7; 4_000], "image/png").await;
    let run = w
        .fire(&reminder(
            &a,
            "UTC",
            all_day(),
            vec![
                text("Standup at 09:00"),
                MessagePart::media(picture, Some("agenda")).unwrap(),
            ],
            groups.clone(),
        ))
        .await;
    assert_eq!(
        w.wait_final(run, Duration::from_secs(600)).await.status,
        RunStatus::Success
    );
    let refused = amend(
        &w,
        &a,
        run,
        AmendAsk {
            kind: AmendKind::Edit,
            text: None,
            caption: None,
        },
    )
    .await;
    assert!(
        matches!(&refused, Err(ControlError::Invalid(v)) if v.field == "text"),
        "{refused:?}"
    );
    let edit = AmendAsk {
        kind: AmendKind::Edit,
        text: Some("Standup at 10:30".into()),
        caption: None,
    };
    amend(&w, &a, run, edit).await.expect("edit accepted");
    assert_eq!(finished(&w, run).await.progress.done, 10);
    let by_group = amendments_by_group(&w.sim.deliveries(&a));
    for g in &groups {
        assert_eq!(
            by_group[g],
            vec![DeliveredContent::Edit {
                of: message_id(run, g, 0),
                text: "Standup at 10:30".into()
            }],
            "only the text part of {g}"
        );
    }
    let caption = AmendAsk {
        kind: AmendKind::Edit,
        text: None,
        caption: Some("agenda, v2".into()),
    };
    amend(&w, &a, run, caption).await.expect("caption edit");
    finished(&w, run).await;
    let by_group = amendments_by_group(&w.sim.deliveries(&a));
    for g in &groups {
        assert_eq!(
            by_group[g][1],
            DeliveredContent::Edit {
                of: message_id(run, g, 1),
                text: "agenda, v2".into()
            }
        );
    }
    assert_eq!(w.sim.duplicate_deliveries(), 0);
}
