//! Ban-safety end to end on the simulated WhatsApp and virtual time:
//! caps and warm-up across local days and a DST change, every account
//! signal through the simulator, typing, varied texts, and the risk model.

use chrono::{DateTime, Utc};
use herald_actors::delivery::caps::Warmup;
use herald_actors::delivery::engine::{EngineConfig, TypingConfig};
use herald_actors::domain::*;
use herald_actors::ports::{AccountStore, EventStore, GatewayError, GroupStore, Metrics, RunStore};
use herald_actors::simulator::risk::RiskModel;
use herald_actors::simulator::{DeliveredContent, Latency, SimConfig};
use herald_actors::world::{reminder, SimWorld};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn text(s: &str) -> MessagePart {
    MessagePart::text(s).unwrap()
}

fn sim() -> SimConfig {
    SimConfig {
        latency: Latency::Fixed(Duration::from_millis(100)),
        ..SimConfig::default()
    }
}

fn world(start: DateTime<Utc>, cfg: EngineConfig) -> SimWorld {
    tokio::time::pause();
    SimWorld::start(sim(), cfg, start)
}

fn cfg() -> EngineConfig {
    EngineConfig {
        seed: 7,
        ..EngineConfig::default()
    }
}

fn limits(daily: Option<u32>, hourly: Option<u32>, tz: &str) -> AccountLimits {
    AccountLimits {
        daily_cap: daily,
        hourly_cap: hourly,
        timezone: Some(TimeZone::parse(tz).unwrap()),
        ..Default::default()
    }
}

/// Deliveries per local calendar day.
fn per_local_day(w: &SimWorld, a: &AccountId, tz: &str) -> Vec<(String, usize)> {
    let tz = TimeZone::parse(tz).unwrap();
    let mut days: Vec<(String, usize)> = Vec::new();
    for d in w.sim.deliveries(a) {
        let day = d.at.with_timezone(&tz.tz()).format("%Y-%m-%d").to_string();
        match days.last_mut() {
            Some((k, n)) if *k == day => *n += 1,
            _ => days.push((day, 1)),
        }
    }
    days
}

/// Waits until the run is parked (or final), returning it.
async fn wait_parked(w: &SimWorld, run: RunId) -> Run {
    w.wait_status(run, RunStatus::Parked, Duration::from_secs(48 * 3600))
        .await
}

#[actix_rt::test]
async fn a_daily_cap_defers_the_rest_to_the_next_local_day() {
    // 22:00 in Kuala Lumpur; an all-day window.
    let w = world(at("2026-11-23T14:00:00Z"), cfg());
    let (a, groups) = w
        .add_account("a1", 80, limits(Some(50), None, "Asia/Kuala_Lumpur"))
        .await;
    let run = w
        .fire(&reminder(
            &a,
            "Asia/Kuala_Lumpur",
            WindowHours::parse(0, 24).unwrap(),
            vec![text("hello")],
            groups,
        ))
        .await;
    let parked = wait_parked(&w, run).await;
    assert_eq!(parked.status, RunStatus::Parked);
    assert_eq!(parked.counts.sent, 50);
    assert_eq!(
        parked.error_summary.as_deref(),
        Some("daily cap reached: 50 sent today; the rest resumes at 00:00 Asia/Kuala_Lumpur on Tue 24 Nov")
    );
    assert!(parked
        .forecast
        .unwrap()
        .contains("at its daily cap of 50, 50 of 80 groups today; all by Tuesday 24 Nov"));
    let done = w.wait_final(run, Duration::from_secs(24 * 3600)).await;
    assert_eq!(done.status, RunStatus::Success, "{:?}", done.error_summary);
    assert_eq!(
        done.error_summary.as_deref(),
        Some("80 of 80 delivered; deferred on the way (daily cap reached: 50 sent today; the rest resumes at 00:00 Asia/Kuala_Lumpur on Tue 24 Nov).")
    );
    assert_eq!(
        per_local_day(&w, &a, "Asia/Kuala_Lumpur"),
        vec![("2026-11-23".into(), 50), ("2026-11-24".into(), 30)]
    );
    assert!(w.sim.deliveries(&a)[50].at >= at("2026-11-23T16:00:00Z"));
}

#[actix_rt::test]
async fn a_capped_run_waits_for_its_next_window_with_resume_next_window() {
    // 17:00 KL, window 06–18: the cap resets at midnight, after the close,
    // so the rest waits for 06:00 the next day.
    let w = world(at("2026-11-23T09:00:00Z"), cfg());
    let (a, groups) = w
        .add_account("a1", 120, limits(Some(50), None, "Asia/Kuala_Lumpur"))
        .await;
    let mut spec = reminder(
        &a,
        "Asia/Kuala_Lumpur",
        WindowHours::default(),
        vec![text("hello")],
        groups,
    );
    spec.resume_next_window = true;
    let run = w.fire(&spec).await;
    let parked = wait_parked(&w, run).await;
    assert_eq!(
        parked.error_summary.as_deref(),
        Some("daily cap reached: 50 sent today; the rest resumes at 06:00 Asia/Kuala_Lumpur on Tue 24 Nov")
    );
    let done = w.wait_final(run, Duration::from_secs(72 * 3600)).await;
    assert_eq!(done.status, RunStatus::Success, "{:?}", done.error_summary);
    assert_eq!(
        per_local_day(&w, &a, "Asia/Kuala_Lumpur"),
        vec![
            ("2026-11-23".into(), 50),
            ("2026-11-24".into(), 50),
            ("2026-11-25".into(), 20)
        ]
    );
    // Never outside the window.
    let tz = TimeZone::parse("Asia/Kuala_Lumpur").unwrap();
    for d in w.sim.deliveries(&a) {
        let hour = d.at.with_timezone(&tz.tz()).format("%H").to_string();
        assert!(("06".."18").contains(&hour.as_str()), "{}", d.at);
    }
}

#[actix_rt::test]
async fn a_cap_that_resets_after_the_close_ends_the_run_with_the_reason() {
    let w = world(at("2026-11-23T09:00:00Z"), cfg());
    let (a, groups) = w
        .add_account("a1", 80, limits(Some(50), None, "Asia/Kuala_Lumpur"))
        .await;
    let run = w
        .fire(&reminder(
            &a,
            "Asia/Kuala_Lumpur",
            WindowHours::default(),
            vec![text("hello")],
            groups,
        ))
        .await;
    let done = w.wait_final(run, Duration::from_secs(6 * 3600)).await;
    assert_eq!(done.status, RunStatus::Partial);
    assert_eq!((done.counts.sent, done.counts.skipped), (50, 30));
    let summary = done.error_summary.unwrap();
    assert!(
        summary.starts_with("daily cap reached: 50 sent today; it resets at 00:00 Asia/Kuala_Lumpur on Tue 24 Nov, after the window closes. 50 of 80 groups delivered."),
        "{summary}"
    );
    let skipped = w
        .store
        .list_targets(run, Some(TargetStatus::Skipped), None, 1)
        .await
        .unwrap();
    assert!(skipped[0]
        .error
        .as_deref()
        .unwrap()
        .starts_with("daily cap reached"));
}

#[actix_rt::test]
async fn the_daily_cap_follows_local_days_across_a_dst_change() {
    // New York springs forward on Sunday 8 March 2026: that local day is
    // 23 hours long. Start Saturday 23:00 EST (04:00Z), cap 30 a day, an
    // all-day window held open for two days.
    let w = world(
        at("2026-03-08T04:00:00Z"),
        EngineConfig {
            all_day_horizon: Duration::from_secs(48 * 3600),
            ..cfg()
        },
    );
    let (a, groups) = w
        .add_account("a1", 100, limits(Some(30), None, "America/New_York"))
        .await;
    let run = w
        .fire(&reminder(
            &a,
            "America/New_York",
            WindowHours::parse(0, 24).unwrap(),
            vec![text("hello")],
            groups,
        ))
        .await;
    let done = w.wait_final(run, Duration::from_secs(60 * 3600)).await;
    assert_eq!(done.status, RunStatus::Partial);
    assert_eq!(
        per_local_day(&w, &a, "America/New_York"),
        vec![
            ("2026-03-07".into(), 30),
            ("2026-03-08".into(), 30),
            ("2026-03-09".into(), 30)
        ]
    );
    let sends = w.sim.deliveries(&a);
    // The 8th starts at its local midnight, 05:00Z (still EST)…
    assert!(
        sends[30].at >= at("2026-03-08T05:00:00Z") && sends[30].at < at("2026-03-08T05:05:00Z"),
        "{}",
        sends[30].at
    );
    // …and the 9th 23 hours later, at 04:00Z (EDT).
    assert!(
        sends[60].at >= at("2026-03-09T04:00:00Z") && sends[60].at < at("2026-03-09T04:05:00Z"),
        "{}",
        sends[60].at
    );
    // The next reset (04:00Z on the 10th) is the window's end: the rest
    // is skipped with the reason.
    assert!(done.error_summary.unwrap().starts_with(
        "daily cap reached: 30 sent today; it resets at 00:00 America/New_York on Tue 10 Mar"
    ));
    assert!(w.sim.max_in_any_60s(&a) <= 40);
}

#[actix_rt::test]
async fn the_hourly_cap_defers_to_the_next_local_hour() {
    let w = world(at("2026-11-23T01:00:00Z"), cfg());
    let (a, groups) = w
        .add_account("a1", 25, limits(None, Some(10), "Asia/Kuala_Lumpur"))
        .await;
    let run = w
        .fire(&reminder(
            &a,
            "Asia/Kuala_Lumpur",
            WindowHours::default(),
            vec![text("hello")],
            groups,
        ))
        .await;
    let parked = wait_parked(&w, run).await;
    assert_eq!(
        parked.error_summary.as_deref(),
        Some("hourly cap reached: 10 sent this hour; the rest resumes at 10:00 Asia/Kuala_Lumpur")
    );
    let done = w.wait_final(run, Duration::from_secs(4 * 3600)).await;
    assert_eq!(done.status, RunStatus::Success);
    let hours: Vec<u32> = w
        .sim
        .deliveries(&a)
        .iter()
        .map(|d| chrono::Timelike::hour(&d.at))
        .collect();
    for h in [1, 2] {
        assert_eq!(hours.iter().filter(|x| **x == h).count(), 10, "hour {h}");
    }
}

#[actix_rt::test]
async fn the_warm_up_ramp_holds_a_new_account_and_restarts_after_an_incident() {
    let w = world(
        at("2026-11-23T01:00:00Z"),
        EngineConfig {
            warmup: Some(Warmup::parse("0:20,2:40,5:unlimited", "warmup").unwrap()),
            ..cfg()
        },
    );
    let (a, groups) = w
        .add_account(
            "a1",
            100,
            AccountLimits {
                new_number: true,
                ..limits(None, None, "Asia/Kuala_Lumpur")
            },
        )
        .await;
    let run = w
        .fire(&reminder(
            &a,
            "Asia/Kuala_Lumpur",
            WindowHours::parse(0, 24).unwrap(),
            vec![text("hello")],
            groups.clone(),
        ))
        .await;
    let parked = wait_parked(&w, run).await;
    assert!(
        parked
            .error_summary
            .as_deref()
            .unwrap()
            .starts_with("warm-up ceiling reached: 20 of 20 sent today (warm-up day 0)"),
        "{:?}",
        parked.error_summary
    );
    assert!(
        parked
            .forecast
            .as_deref()
            .unwrap()
            .contains("at this account's warm-up day 0, 20 of 100 groups today"),
        "{:?}",
        parked.forecast
    );
    // Day 1 still 20; the all-day horizon ends the run on day 1.
    let done = w.wait_final(run, Duration::from_secs(48 * 3600)).await;
    assert!(done.status.is_final());
    let days = per_local_day(&w, &a, "Asia/Kuala_Lumpur");
    assert_eq!(days[0].1, 20);
    assert_eq!(days[1].1, 20);
    // An incident puts the ramp back to day 0.
    let acct = w.store.get_account(&a).await.unwrap().unwrap();
    assert_eq!(acct.ramp_start(), acct.created_at);
    w.store.record_incident(&a, w.clock.now()).await.unwrap();
    let acct = w.store.get_account(&a).await.unwrap().unwrap();
    assert_eq!(acct.ramp_start(), w.clock.now());
}

/// Sends on day 0 of a 60-group run by an account not marked as a new
/// number, under a 20-a-day ramp.
async fn day_zero_sends_of_a_seasoned_account(warmup_all: bool) -> usize {
    let w = world(
        at("2026-11-23T01:00:00Z"),
        EngineConfig {
            warmup: Some(Warmup::parse("0:20,2:40,5:unlimited", "warmup").unwrap()),
            warmup_all,
            ..cfg()
        },
    );
    let (a, groups) = w
        .add_account("seasoned", 60, limits(None, None, "UTC"))
        .await;
    let run = w
        .fire(&reminder(
            &a,
            "UTC",
            WindowHours::parse(0, 24).unwrap(),
            vec![text("hello")],
            groups,
        ))
        .await;
    let done = w.wait_final(run, Duration::from_secs(48 * 3600)).await;
    assert!(done.status.is_final());
    per_local_day(&w, &a, "UTC")[0].1
}

/// The ramp is for new numbers: an account not marked as one sends its
/// whole run on day 0...
#[actix_rt::test]
async fn the_warm_up_ramp_leaves_an_account_that_is_not_a_new_number() {
    assert_eq!(day_zero_sends_of_a_seasoned_account(false).await, 60);
}

/// ...unless the daemon holds every account to it.
#[actix_rt::test]
async fn the_warm_up_ramp_holds_every_account_when_told_to() {
    assert_eq!(day_zero_sends_of_a_seasoned_account(true).await, 20);
}

/// Counts account signals by label, as `/metrics` does.
#[derive(Default)]
struct Signals(Mutex<HashMap<&'static str, u32>>);

impl Metrics for Signals {
    fn account_signal(&self, _account: &AccountId, signal: &'static str) {
        *self.0.lock().unwrap().entry(signal).or_default() += 1;
    }
}

#[actix_rt::test]
async fn every_account_signal_pauses_counts_and_resumes() {
    let cases: Vec<(Vec<GatewayError>, &str, AccountState, &str)> = vec![
        (
            vec![
                GatewayError::Restricted {
                    code: 463,
                    retry_after: None,
                };
                3
            ],
            "reach_out_locked_463",
            AccountState::CoolingDown,
            "WhatsApp kept time-locking the account's reach-out (463): cooling down until",
        ),
        (
            vec![
                GatewayError::Restricted {
                    code: 479,
                    retry_after: None,
                };
                3
            ],
            "refused_479",
            AccountState::CoolingDown,
            "WhatsApp kept refusing the account's messages (479): cooling down until",
        ),
        (
            vec![
                GatewayError::RateLimited {
                    retry_after: Some(Duration::from_secs(1))
                };
                3
            ],
            "rate_limit_repeated",
            AccountState::CoolingDown,
            "WhatsApp kept answering rate-overlimit (429) despite the back-off: cooling down until",
        ),
        (
            vec![GatewayError::Transient("socket reset".into()); 4],
            "repeated_failures",
            AccountState::CoolingDown,
            "sends kept failing: cooling down until",
        ),
        (
            vec![GatewayError::Banned {
                until: Some(at("2026-11-23T03:00:00Z")),
            }],
            "temporary_ban",
            AccountState::Banned,
            "Account temporarily banned by WhatsApp until",
        ),
    ];
    tokio::time::pause();
    for (errors, label, state, reason) in cases {
        let metrics = Arc::new(Signals::default());
        let start = at("2026-11-23T01:00:00Z");
        let w = SimWorld::start_with(
            sim(),
            EngineConfig {
                group_concurrency: 1,
                // Below max_attempts, so the group is not given up first.
                breaker: herald_actors::delivery::signals::BreakerConfig {
                    failure_trip: 4,
                    ..Default::default()
                },
                ..cfg()
            },
            Arc::new(herald_actors::ports::TokioClock::starting_at(start)),
            metrics.clone(),
        );
        let (a, groups) = w.add_account("a1", 20, AccountLimits::default()).await;
        let n = errors.len();
        for e in errors {
            w.sim.fail_next(&a, 1, e);
        }
        let run = w
            .fire(&reminder(
                &a,
                "Asia/Kuala_Lumpur",
                WindowHours::parse(0, 24).unwrap(),
                vec![text("hello")],
                groups,
            ))
            .await;
        // Paused: the account says why, the run waits in its queue.
        let mut acct = w.store.get_account(&a).await.unwrap().unwrap();
        for _ in 0..600 {
            if acct.state == state {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            acct = w.store.get_account(&a).await.unwrap().unwrap();
        }
        assert_eq!(acct.state, state, "{label}");
        let why = acct.state_reason.clone().unwrap();
        assert!(why.starts_with(reason), "{label}: {why}");
        assert!(acct.incident_at.is_some(), "{label}: the warm-up restarts");
        let counted = metrics.0.lock().unwrap().get(label).copied();
        let expect = if label.starts_with("re") && label != "repeated_failures" {
            n as u32
        } else {
            1
        };
        assert_eq!(
            counted,
            Some(expect),
            "{label}: {:?}",
            metrics.0.lock().unwrap()
        );
        let queued = w.store.get_run(run).await.unwrap().unwrap();
        assert_eq!(queued.status, RunStatus::Queued, "{label}");
        // It resumes by itself when the cool-down (or the ban) ends.
        let done = w.wait_final(run, Duration::from_secs(6 * 3600)).await;
        assert_eq!(
            done.status,
            RunStatus::Success,
            "{label}: {:?}",
            done.error_summary
        );
        assert_eq!(w.sim.delivered(&a), 20, "{label}");
        let acct = w.store.get_account(&a).await.unwrap().unwrap();
        assert_eq!(acct.state, AccountState::Connected, "{label}");
        let _ = n;
    }
}

#[actix_rt::test]
async fn a_single_rate_limit_only_slows_the_account() {
    tokio::time::pause();
    let metrics = Arc::new(Signals::default());
    let w = SimWorld::start_with(
        sim(),
        cfg(),
        Arc::new(herald_actors::ports::TokioClock::starting_at(at(
            "2026-11-23T01:00:00Z",
        ))),
        metrics.clone(),
    );
    let (a, groups) = w.add_account("a1", 10, AccountLimits::default()).await;
    w.sim.fail_next(
        &a,
        1,
        GatewayError::RateLimited {
            retry_after: Some(Duration::from_secs(5)),
        },
    );
    let run = w
        .fire(&reminder(
            &a,
            "UTC",
            WindowHours::parse(0, 24).unwrap(),
            vec![text("hello")],
            groups,
        ))
        .await;
    let done = w.wait_final(run, Duration::from_secs(3600)).await;
    assert_eq!(done.status, RunStatus::Success);
    let acct = w.store.get_account(&a).await.unwrap().unwrap();
    assert_eq!(
        (acct.state, acct.incident_at),
        (AccountState::Connected, None)
    );
    assert_eq!(metrics.0.lock().unwrap().get("rate_limit"), Some(&1));
}

#[actix_rt::test]
async fn each_message_is_preceded_by_typing_and_groups_get_their_own_text() {
    let w = world(at("2026-11-23T01:00:00Z"), cfg());
    let (a, groups) = w.add_account("a1", 60, AccountLimits::default()).await;
    let spec = reminder(
        &a,
        "Asia/Kuala_Lumpur",
        WindowHours::default(),
        vec![text("{Hi|Hello|Hey|Dear all} {team|all|folks|everyone}, standup at {time} {today|this morning}{.|!}")],
        groups,
    )
    .with_unique_texts(true)
    .unwrap();
    let run = w.fire(&spec).await;
    let done = w.wait_final(run, Duration::from_secs(3600)).await;
    assert_eq!(done.status, RunStatus::Success);
    let stats = w.sim.stats(&a);
    assert_eq!(
        stats.typing, stats.delivered,
        "one typing presence per message"
    );
    let texts: HashSet<String> = w
        .sim
        .deliveries(&a)
        .into_iter()
        .map(|d| match d.content {
            DeliveredContent::Text(t) => t,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(texts.len(), 60, "no two groups got the same text");
    assert!(texts.iter().all(|t| t.contains("standup at 09:00")));
    // Gaps between sends vary: not machine-regular.
    let times: Vec<_> = w.sim.deliveries(&a).iter().map(|d| d.at).collect();
    let gaps: HashSet<i64> = times
        .windows(2)
        .map(|p| (p[1] - p[0]).num_milliseconds())
        .collect();
    assert!(gaps.len() > 20, "{} distinct gaps", gaps.len());
    assert!(w.sim.max_in_any_60s(&a) <= 40);
}

/// The risk model on a few hundred groups: Herald's old behaviour
/// (identical bytes, machine-regular, no typing) is banned; the new one
/// is not.
#[actix_rt::test]
async fn the_risk_model_bans_bot_like_sending_and_spares_human_pacing() {
    tokio::time::pause();
    for human in [false, true] {
        let sim = SimConfig {
            risk: Some(RiskModel::default()),
            ..sim()
        };
        let engine = if human {
            cfg()
        } else {
            EngineConfig {
                pace_jitter: 0.0,
                typing: TypingConfig::OFF,
                ..cfg()
            }
        };
        let w = SimWorld::start(sim, engine, at("2026-11-23T01:00:00Z"));
        let (a, groups) = w.add_account("a1", 300, AccountLimits::default()).await;
        let body = if human {
            "{Hi|Hello|Hey|Dear all} {team|all|folks|everyone}, {standup|sync|check-in} {starts |}at {time} {today|this morning}{.|!| :)}"
        } else {
            "Standup at 09:30"
        };
        let spec = reminder(
            &a,
            "Asia/Kuala_Lumpur",
            WindowHours::default(),
            vec![text(body)],
            groups,
        )
        .with_unique_texts(human)
        .unwrap();
        let run = w.fire(&spec).await;
        let done = w.wait_final(run, Duration::from_secs(30 * 3600)).await;
        let stats = w.sim.stats(&a);
        if human {
            assert_eq!(
                (stats.bans, stats.warnings),
                (0, 0),
                "{:?}",
                w.sim.risk_log(&a)
            );
            assert_eq!(done.status, RunStatus::Success);
        } else {
            assert_eq!(stats.bans, 1, "{:?}", w.sim.risk_log(&a));
            assert!(stats.warnings >= 1);
            assert_ne!(done.status, RunStatus::Success);
            let acct = w.store.get_account(&a).await.unwrap().unwrap();
            assert!(acct.incident_at.is_some());
        }
    }
}

/// `{group_name}` is each group's name from the account's directory; an
/// account whose directory was never synced gets the fallback.
#[actix_rt::test]
async fn group_names_come_from_the_directory() {
    let w = world(at("2026-11-23T01:00:00Z"), cfg());
    let (a, groups) = w.add_account("a1", 2, AccountLimits::default()).await;
    let (b, unsynced) = w.add_account("b1", 1, AccountLimits::default()).await;
    w.sim.set_group_name(&a, &groups[0], "Clients KL");
    let listed = herald_actors::ports::Gateway::list_groups(&*w.sim, &a)
        .await
        .unwrap();
    w.store
        .sync_groups(&a, &listed, w.clock.now())
        .await
        .unwrap();
    let mut runs = Vec::new();
    for (acct, targets) in [(&a, groups.clone()), (&b, unsynced.clone())] {
        let spec = reminder(
            acct,
            "UTC",
            WindowHours::parse(0, 24).unwrap(),
            vec![text("Good morning, {group_name}")],
            targets,
        );
        runs.push(w.fire(&spec).await);
    }
    for run in runs {
        assert_eq!(
            w.wait_final(run, Duration::from_secs(600)).await.status,
            RunStatus::Success
        );
    }
    let text_of = |acct: &AccountId, group: &GroupJid| -> String {
        w.sim
            .deliveries(acct)
            .into_iter()
            .find(|d| &d.group == group)
            .map(|d| match d.content {
                DeliveredContent::Text(t) => t,
                other => panic!("{other:?}"),
            })
            .expect("delivered")
    };
    assert_eq!(text_of(&a, &groups[0]), "Good morning, Clients KL");
    assert_eq!(text_of(&a, &groups[1]), "Good morning, Group 0001");
    assert_eq!(text_of(&b, &unsynced[0]), "Good morning, everyone");
}

/// A ban recorded before the account's actor started (by another daemon
/// that owned the account, or an earlier start of this one) still ends
/// when it said: the queue resumes by itself, not when the operator
/// next touches the account.
#[actix_rt::test]
async fn a_ban_recorded_before_the_actor_started_ends_on_time() {
    let start = at("2026-05-04T02:00:00Z");
    let w = world(start, cfg());
    let (a, groups) = w.add_account("banned", 3, AccountLimits::default()).await;
    let until = start + chrono::Duration::minutes(30);
    w.store
        .set_account_state_until(
            &a,
            AccountState::Banned,
            Some("Account temporarily banned by WhatsApp"),
            Some(until),
        )
        .await
        .unwrap();
    let spec = reminder(
        &a,
        "UTC",
        WindowHours::parse(0, 24).unwrap(),
        vec![text("Standup at ten")],
        groups,
    );
    let run = w.fire(&spec).await;
    let done = w.wait_final(run, Duration::from_secs(2 * 3600)).await;
    assert_eq!(done.status, RunStatus::Success, "{done:?}");
    let first = w.sim.deliveries(&a)[0].at;
    assert!(
        first >= until,
        "sent at {first}, before the ban ended at {until}"
    );
    assert!(
        first < until + chrono::Duration::minutes(2),
        "sent at {first}, long after the ban ended at {until}"
    );
    let account = w.store.get_account(&a).await.unwrap().unwrap();
    assert_eq!(
        (account.state, account.state_until),
        (AccountState::Connected, None)
    );
}

/// WhatsApp's word, not a guess: a run time-locked mid-run (a 463 whose
/// lock the time-lock query says ends at a given instant) pauses the
/// account until exactly that instant, sends nothing meanwhile, keeps the
/// lock as the account's standing, and finishes by itself afterwards with
/// no group twice.
#[actix_rt::test]
async fn a_time_lock_pauses_the_account_until_whatsapps_end_then_the_run_finishes() {
    let start = at("2026-11-23T01:00:00Z");
    let w = world(start, cfg());
    let (a, groups) = w.add_account("a1", 60, AccountLimits::default()).await;
    let groups: Vec<GroupJid> = groups.into_iter().take(30).collect();
    let run = w
        .fire(&reminder(
            &a,
            "Asia/Kuala_Lumpur",
            WindowHours::parse(0, 24).unwrap(),
            vec![text("standup moved to 10:00")],
            groups.clone(),
        ))
        .await;
    // A third of the way in, WhatsApp time-locks the account for 25 min.
    while w.sim.deliveries(&a).len() < 10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let locked_at = w.clock.now();
    let until = locked_at + chrono::Duration::minutes(25);
    w.sim.time_lock(&a, until);
    let done = w.wait_final(run, Duration::from_secs(3 * 3600)).await;
    assert_eq!(done.status, RunStatus::Success, "{done:?}");
    let ds = w.sim.deliveries(&a);
    let distinct: HashSet<&GroupJid> = ds.iter().map(|d| &d.group).collect();
    assert_eq!((ds.len(), distinct.len()), (30, 30), "every group once");
    // Nothing between the lock and its end; the first send after it goes
    // within pacing of the end (the bucket starts again), not an hour later.
    let after: Vec<DateTime<Utc>> = ds.iter().map(|d| d.at).filter(|t| *t > locked_at).collect();
    assert!(
        after.iter().all(|t| *t >= until),
        "a send inside the lock: {after:?} (until {until})"
    );
    let first = *after.first().expect("sends after the lock");
    assert!(
        first - until <= chrono::Duration::seconds(5),
        "resumed at {first}, the lock ended at {until}"
    );
    // The lock is the account's standing, read from WhatsApp.
    let account = w.store.get_account(&a).await.unwrap().unwrap();
    let lock = account.standing.timelock.known().expect("read").clone();
    assert_eq!((lock.active, lock.until), (true, Some(until)));
    let events = w.store.events_after(0, 10_000).await.unwrap();
    assert!(
        events.iter().any(|e| e.kind == "account_standing"),
        "the change was told"
    );
    let paused = events
        .iter()
        .find(|e| e.kind == "account_signal" && e.data["signal"] == "reach_out_locked_463")
        .expect("the pause was told");
    assert_eq!(paused.data["timelock_until"], serde_json::json!(until));
    assert!(paused.data["reason"]
        .as_str()
        .unwrap()
        .contains("WhatsApp time-locked this account's reach-out until"));
}
