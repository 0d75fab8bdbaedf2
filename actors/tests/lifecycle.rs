//! The run lifecycle's promises, one scripted scenario each, on the
//! simulated WhatsApp and virtual time. Each is a way a run used to
//! strand, send twice, go over the limit or misread its window; the
//! seeded simulation (`tests/chaos.rs`) looks for the ones nobody wrote
//! down.

use chrono::{DateTime, Utc};
use herald_actors::delivery::account::{InjectFault, PauseRun, ResumeRun, RetryRun, StopRun};
use herald_actors::delivery::engine::EngineConfig;
use herald_actors::domain::*;
use herald_actors::messages::RunDue;
use herald_actors::ports::{AccountStore, GatewayError, ReminderStore, RunStore};
use herald_actors::simulator::{Latency, SimConfig};
use herald_actors::supervisor::AccountUpdated;
use herald_actors::world::{reminder, SimWorld};
use std::time::Duration;

fn text(s: &str) -> MessagePart {
    MessagePart::text(s).unwrap()
}

fn hours(start: i64, end: i64) -> WindowHours {
    WindowHours::parse(start, end).unwrap()
}

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn world_at(start: DateTime<Utc>, cfg: EngineConfig) -> SimWorld {
    tokio::time::pause();
    let sim = SimConfig {
        latency: Latency::Fixed(Duration::from_millis(100)),
        ..SimConfig::default()
    };
    SimWorld::start(sim, cfg, start)
}

fn limit(per_minute: u32) -> AccountLimits {
    AccountLimits {
        max_per_minute: Some(per_minute),
        ..Default::default()
    }
}

/// Issue scenario 1: pause and stop of a queued run check its status
/// before anything else; a paused queued run resumes and finishes.
#[actix_rt::test]
async fn a_queued_run_can_be_paused_resumed_and_stopped_without_stranding() {
    let w = world_at(at("2026-11-23T01:00:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 40, limit(40)).await;
    let first = w
        .fire(&reminder(
            &a,
            "UTC",
            hours(0, 24),
            vec![text("1")],
            groups.clone(),
        ))
        .await;
    let second = w
        .fire(&reminder(
            &a,
            "UTC",
            hours(0, 24),
            vec![text("2")],
            groups.clone(),
        ))
        .await;
    let third = w
        .fire(&reminder(
            &a,
            "UTC",
            hours(0, 24),
            vec![text("3")],
            groups.clone(),
        ))
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let addr = w.actor(&a).await;
    addr.send(PauseRun { run_id: second })
        .await
        .unwrap()
        .unwrap();
    addr.send(StopRun { run_id: third }).await.unwrap().unwrap();
    // A second stop is a conflict naming the status, not a silent success.
    let again = addr.send(StopRun { run_id: third }).await.unwrap();
    assert!(format!("{again:?}").contains("cancelled"), "{again:?}");
    assert_eq!(
        w.wait_final(first, Duration::from_secs(600)).await.status,
        RunStatus::Success
    );
    let stopped = w.store.get_run(third).await.unwrap().unwrap();
    assert_eq!(stopped.status, RunStatus::Cancelled);
    assert_eq!(
        stopped.counts.skipped, 40,
        "a stopped queued run lists its groups"
    );
    assert_eq!(
        w.store.get_run(second).await.unwrap().unwrap().status,
        RunStatus::Paused,
        "a paused run waits for the operator"
    );
    addr.send(ResumeRun { run_id: second })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        w.wait_final(second, Duration::from_secs(600)).await.status,
        RunStatus::Success
    );
    assert_eq!(w.sim.delivered(&a), 80);
}

/// Issue scenario 3: stopping a paused run finishes its targets, so a
/// retry finds them and sends only what is left.
#[actix_rt::test]
async fn stopping_a_paused_run_leaves_no_pending_target_and_retry_sends_the_rest() {
    let w = world_at(at("2026-11-23T01:00:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 30, limit(30)).await;
    let run = w
        .fire(&reminder(&a, "UTC", hours(0, 24), vec![text("x")], groups))
        .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let addr = w.actor(&a).await;
    addr.send(PauseRun { run_id: run }).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    addr.send(StopRun { run_id: run }).await.unwrap().unwrap();
    let stopped = w.wait_final(run, Duration::from_secs(60)).await;
    assert_eq!(stopped.status, RunStatus::Cancelled);
    assert_eq!(stopped.counts.pending + stopped.counts.sending, 0);
    let sent = stopped.counts.sent;
    assert!(sent > 0 && sent < 30, "sent {sent}");
    let n = addr.send(RetryRun { run_id: run }).await.unwrap().unwrap();
    assert_eq!(n, 30 - sent);
    let done = w.wait_final(run, Duration::from_secs(600)).await;
    assert_eq!(done.status, RunStatus::Success);
    assert_eq!(w.sim.delivered(&a), 30);
    assert_eq!(w.sim.duplicate_deliveries(), 0);
}

/// Issue scenario 4: a run resumed after downtime keeps the window it was
/// fired into; yesterday's remainder does not go out in today's window.
#[actix_rt::test]
async fn a_run_resumed_after_downtime_keeps_the_window_of_its_day() {
    // 09:30 UTC today; the run was fired at 09:00 yesterday, window 9–10.
    let w = world_at(at("2026-11-23T09:30:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 10, limit(40)).await;
    let spec = reminder(&a, "UTC", hours(9, 10), vec![text("x")], groups);
    let r = w.store.create_reminder(&spec, w.clock.now()).await.unwrap();
    let yesterday = at("2026-11-22T09:00:00Z");
    let run = w
        .store
        .create_run(r.id, &a, yesterday, RunStatus::Queued, None, yesterday)
        .await
        .unwrap()
        .run
        .id;
    w.supervisor.do_send(RunDue {
        run_id: run,
        account_id: a.clone(),
    });
    let done = w.wait_final(run, Duration::from_secs(600)).await;
    assert_eq!(w.sim.delivered(&a), 0, "nothing outside yesterday's window");
    assert_eq!(done.window_end_at, Some(at("2026-11-22T10:00:00Z")));
    assert_eq!(done.counts.skipped, 10);
}

/// Issue scenario 5: 0–24 is "no window": a run fired at 23:45 goes on
/// past local midnight and delivers everything.
#[actix_rt::test]
async fn an_all_day_run_fired_before_midnight_delivers_past_it() {
    let w = world_at(at("2026-11-23T23:45:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 1000, limit(40)).await;
    let run = w
        .fire(&reminder(&a, "UTC", hours(0, 24), vec![text("x")], groups))
        .await;
    let done = w.wait_final(run, Duration::from_secs(3 * 3600)).await;
    assert_eq!(done.status, RunStatus::Success, "{:?}", done.error_summary);
    assert_eq!(w.sim.delivered(&a), 1000);
}

/// Issue scenario 6: a restarted actor rebuilds its bucket from the
/// account's own limit and its recent sends.
#[actix_rt::test]
async fn an_actor_restart_never_exceeds_the_accounts_own_limit() {
    let w = world_at(at("2026-11-23T01:00:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 4, limit(1)).await;
    let run = w
        .fire(&reminder(&a, "UTC", hours(0, 24), vec![text("x")], groups))
        .await;
    // Right after the first send, the actor dies as a bug would kill it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while w.sim.delivered(&a) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(w.sim.delivered(&a), 1);
    w.actor(&a).await.do_send(InjectFault { panic: false });
    let done = w.wait_final(run, Duration::from_secs(900)).await;
    assert_eq!(done.status, RunStatus::Success);
    assert_eq!(w.sim.max_in_any_60s(&a), 1, "two sends inside a minute");
}

/// Issue scenario 7: a lower limit reaches the run in flight, and the
/// minute already under way counts against it.
#[actix_rt::test]
async fn a_lower_limit_applies_to_the_run_in_flight() {
    let w = world_at(at("2026-11-23T01:00:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 60, limit(60)).await;
    let run = w
        .fire(&reminder(&a, "UTC", hours(0, 24), vec![text("x")], groups))
        .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let before = w.sim.delivered(&a);
    assert!(before >= 10, "sent {before} at 60/min");
    w.store.update_account_limits(&a, &limit(6)).await.unwrap();
    let changed = w.clock.now();
    w.supervisor.do_send(AccountUpdated(a.clone()));
    tokio::time::sleep(Duration::from_secs(120)).await;
    // Counting the sends before the change: any 60 s window that ends
    // after it holds at most six.
    let after: Vec<_> = w
        .sim
        .deliveries(&a)
        .into_iter()
        .filter(|d| d.at > changed + chrono::Duration::seconds(1))
        .collect();
    assert!(!after.is_empty(), "the run went on");
    for d in &after {
        let in_window = w
            .sim
            .deliveries(&a)
            .iter()
            .filter(|e| e.at <= d.at && d.at - e.at < chrono::Duration::seconds(60))
            .count();
        assert!(
            in_window <= 6,
            "{in_window} sends in the minute before {}",
            d.at
        );
    }
    // Disable: the run stops sending and waits, it is not failed.
    w.store
        .set_account_state(&a, AccountState::Disabled, Some("disabled by operator"))
        .await
        .unwrap();
    w.supervisor.do_send(AccountUpdated(a.clone()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let frozen = w.sim.delivered(&a);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(w.sim.delivered(&a), frozen, "a disabled account sent");
    let waiting = w.store.get_run(run).await.unwrap().unwrap();
    assert!(!waiting.status.is_final(), "{}", waiting.status);
    assert_eq!(waiting.counts.failed, 0);
}

/// Issue scenario 8: an outage pauses delivery instead of burning every
/// group's attempts.
#[actix_rt::test]
async fn an_outage_burns_no_target() {
    let w = world_at(at("2026-11-23T01:00:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 20, limit(40)).await;
    w.sim.fail_next(
        &a,
        200,
        GatewayError::Unreachable("connection refused".into()),
    );
    let run = w
        .fire(&reminder(&a, "UTC", hours(0, 24), vec![text("x")], groups))
        .await;
    let done = w.wait_final(run, Duration::from_secs(6 * 3600)).await;
    assert_eq!(done.status, RunStatus::Success, "{:?}", done.error_summary);
    assert_eq!(done.counts.failed, 0);
    assert_eq!(w.sim.delivered(&a), 20);
}

/// Issue scenario 9: a paused run gives its `fire_concurrency` permit
/// back, so another account's run goes ahead.
#[actix_rt::test]
async fn a_paused_run_holds_no_concurrency_permit() {
    let cfg = EngineConfig {
        fire_concurrency: 1,
        ..EngineConfig::default()
    };
    let w = world_at(at("2026-11-23T01:00:00Z"), cfg);
    let (a, ga) = w.add_account("a1", 30, limit(30)).await;
    let (b, gb) = w.add_account("b1", 10, limit(30)).await;
    let paused = w
        .fire(&reminder(&a, "UTC", hours(0, 24), vec![text("a")], ga))
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    w.actor(&a)
        .await
        .send(PauseRun { run_id: paused })
        .await
        .unwrap()
        .unwrap();
    let other = w
        .fire(&reminder(&b, "UTC", hours(0, 24), vec![text("b")], gb))
        .await;
    let done = w.wait_final(other, Duration::from_secs(600)).await;
    assert_eq!(done.status, RunStatus::Success);
    assert_eq!(
        w.store.get_run(paused).await.unwrap().unwrap().status,
        RunStatus::Paused
    );
}

/// Issue scenario 11: an upload that keeps expiring is bounded by the
/// group's attempts, not retried forever.
#[actix_rt::test]
async fn media_that_keeps_expiring_ends_in_bounded_attempts() {
    let cfg = EngineConfig::default();
    let attempts = u64::from(cfg.max_attempts);
    let w = world_at(at("2026-11-23T01:00:00Z"), cfg);
    let (a, groups) = w.add_account("a1", 2, limit(40)).await;
    let pic = w.add_media(vec![9u8; 10_000], "image/png").await;
    w.sim.fail_next(&a, 1000, GatewayError::MediaExpired);
    let run = w
        .fire(&reminder(
            &a,
            "UTC",
            hours(0, 24),
            vec![MessagePart::media(pic, None).unwrap()],
            groups,
        ))
        .await;
    let done = w.wait_final(run, Duration::from_secs(3600)).await;
    assert!(done.status.is_final(), "{}", done.status);
    assert_eq!(done.counts.failed, 2);
    // One upload before the run, then at most one per failed attempt.
    assert!(
        w.sim.uploads(&a) <= 1 + 2 * attempts,
        "{} uploads",
        w.sim.uploads(&a)
    );
}

/// Issue scenario 12: a reminder with a run that has not ended cannot be
/// edited; the run sends what the reminder said when it fired.
#[actix_rt::test]
async fn a_reminder_with_a_live_run_refuses_edits() {
    let w = world_at(at("2026-11-23T01:00:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 5, limit(40)).await;
    let spec = reminder(&a, "UTC", hours(9, 10), vec![text("as fired")], groups);
    let r = w.store.create_reminder(&spec, w.clock.now()).await.unwrap();
    // Fired outside its window: scheduled until 09:00.
    w.store
        .create_run(
            r.id,
            &a,
            w.clock.now(),
            RunStatus::Scheduled,
            None,
            w.clock.now(),
        )
        .await
        .unwrap();
    let mut edited = spec.clone();
    edited.parts = vec![text("edited")];
    let refused = w.store.update_reminder(r.id, &edited, w.clock.now()).await;
    assert!(refused.is_err(), "edit accepted under a scheduled run");
    let stored = w.store.get_reminder(r.id).await.unwrap().unwrap();
    assert_eq!(stored.spec.parts, spec.parts, "a refused edit wrote");
}

/// Issue scenario 3, parked: a run parked at its window's close (resume
/// next window) and then stopped finishes its targets, so a retry finds
/// them and sends the rest inside the next window.
#[actix_rt::test]
async fn stopping_a_parked_run_leaves_no_pending_target_and_retry_sends_the_rest() {
    let w = world_at(at("2026-11-23T01:59:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 100, limit(40)).await;
    let spec = NewReminder::new(
        a.clone(),
        "parked",
        TimeZone::parse("UTC").unwrap(),
        Schedule::once("2000-01-01T00:00").unwrap(),
        hours(1, 2),
        true,
        vec![text("x")],
        groups,
    )
    .unwrap();
    let run = w.fire(&spec).await;
    let parked = w
        .wait_status(run, RunStatus::Parked, Duration::from_secs(120))
        .await;
    assert_eq!(parked.status, RunStatus::Parked, "parked at 02:00");
    let sent = w.sim.delivered(&a) as u32;
    assert!(sent > 0 && sent < 100, "sent {sent} before 02:00");
    let addr = w.actor(&a).await;
    addr.send(StopRun { run_id: run }).await.unwrap().unwrap();
    let stopped = w.wait_final(run, Duration::from_secs(60)).await;
    assert_eq!(stopped.status, RunStatus::Cancelled);
    assert_eq!(
        stopped.counts.pending + stopped.counts.sending,
        0,
        "a stopped parked run strands no target"
    );
    assert_eq!(stopped.counts.skipped, 100 - sent);
    let n = addr.send(RetryRun { run_id: run }).await.unwrap().unwrap();
    assert_eq!(n, 100 - sent);
    let done = w.wait_final(run, Duration::from_secs(30 * 3600)).await;
    assert_eq!(done.status, RunStatus::Success, "{:?}", done.error_summary);
    assert_eq!(w.sim.delivered(&a), 100);
    assert_eq!(w.sim.duplicate_deliveries(), 0);
    for d in w.sim.deliveries(&a) {
        let h = d.at.format("%H").to_string();
        assert_eq!(h, "01", "delivered outside 01–02 UTC at {}", d.at);
    }
}

/// Issue scenario 6, between runs: an actor restarted while idle rebuilds
/// its bucket from the account's limit and last send, however long it
/// idled at the default rate before its next run.
#[actix_rt::test]
async fn an_actor_restarted_between_runs_waits_out_the_accounts_last_minute() {
    let w = world_at(at("2026-11-23T01:00:00Z"), EngineConfig::default());
    let (a, groups) = w.add_account("a1", 2, limit(1)).await;
    let first = w
        .fire(&reminder(
            &a,
            "UTC",
            hours(0, 24),
            vec![text("x")],
            vec![groups[0].clone()],
        ))
        .await;
    assert_eq!(
        w.wait_final(first, Duration::from_secs(300)).await.status,
        RunStatus::Success
    );
    w.actor(&a).await.do_send(InjectFault { panic: false });
    // The new actor idles long enough to fill a bucket at the default rate.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let second = w
        .fire(&reminder(
            &a,
            "UTC",
            hours(0, 24),
            vec![text("y")],
            vec![groups[1].clone()],
        ))
        .await;
    assert_eq!(
        w.wait_final(second, Duration::from_secs(300)).await.status,
        RunStatus::Success
    );
    assert_eq!(w.sim.delivered(&a), 2);
    assert_eq!(w.sim.max_in_any_60s(&a), 1, "two sends inside a minute");
}

/// Issue scenario 10: a token is taken only once the gateway can write,
/// so the sends waiting out a reconnect leave at the account's pace, not
/// back to back when the socket is back.
#[actix_rt::test]
async fn sends_waiting_out_a_reconnect_leave_at_the_accounts_pace() {
    // Regular pacing: the spacing read below is then the limit's own.
    let cfg = EngineConfig {
        pace_jitter: 0.0,
        ..EngineConfig::default()
    };
    let w = world_at(at("2026-11-23T01:00:00Z"), cfg);
    let limits = AccountLimits {
        max_per_minute: Some(60),
        group_concurrency: Some(4),
        ..Default::default()
    };
    let (a, groups) = w.add_account("a1", 40, limits).await;
    let run = w
        .fire(&reminder(&a, "UTC", hours(0, 24), vec![text("x")], groups))
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while w.sim.delivered(&a) < 10 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w.sim.reconnecting_for(&a, Duration::from_secs(30));
    let done = w.wait_final(run, Duration::from_secs(600)).await;
    assert_eq!(done.status, RunStatus::Success);
    let mut at: Vec<_> = w.sim.deliveries(&a).iter().map(|d| d.at).collect();
    at.sort();
    assert_eq!(at.len(), 40);
    // At 60/min a token comes once a second; the simulator's latency is
    // fixed, so deliveries keep that spacing.
    let closest = at.windows(2).map(|p| p[1] - p[0]).min().unwrap();
    assert!(
        closest >= chrono::Duration::milliseconds(990),
        "two sends {} ms apart",
        closest.num_milliseconds()
    );
}
