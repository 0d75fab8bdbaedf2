use super::*;
use crate::ports::{Heard, TokioClock};
use crate::testkit::gateway_contract::{self, ContractSetup};
use std::sync::atomic::AtomicUsize;
use tokio::time::{sleep, Instant};

fn t0() -> DateTime<Utc> {
    "2026-05-11T01:00:00Z".parse().unwrap()
}

fn acct(s: &str) -> AccountId {
    AccountId::parse(s).unwrap()
}

/// Must be called inside the (paused) runtime: the clock starts at t0 now.
fn simulator(config: SimConfig) -> Arc<Simulator> {
    Arc::new(Simulator::new(
        config,
        Arc::new(TokioClock::starting_at(t0())),
    ))
}

fn text(s: &str) -> OutgoingMessage {
    OutgoingMessage::Text(s.to_owned())
}

fn picture(len: usize) -> (MediaId, Arc<[u8]>) {
    let bytes: Arc<[u8]> = (0..len).map(|i| (i % 251) as u8).collect();
    (MediaId::of_bytes(&bytes), bytes)
}

fn media(h: &UploadHandle, caption: Option<&str>) -> OutgoingMessage {
    OutgoingMessage::Media {
        upload: h.clone(),
        mime: "image/png".into(),
        caption: caption.map(str::to_owned),
    }
}

#[tokio::test(start_paused = true)]
async fn a_send_with_an_older_lease_epoch_than_one_seen_is_refused_unsent() {
    let sim = simulator(SimConfig::instant());
    let a = acct("fenced");
    let groups = sim.add_numbered_groups(&a, 3);
    let fence = |node: &str, epoch| crate::domain::Fence {
        account: a.clone(),
        node: node.into(),
        epoch,
    };
    let old = fence("n1", 4);
    let new = fence("n2", 5);
    sim.send_fenced(&a, &groups[0], &text("hi"), "m0", Some(&old))
        .await
        .unwrap();
    sim.send_fenced(&a, &groups[1], &text("hi"), "m1", Some(&new))
        .await
        .unwrap();
    // The old owner wakes up late: its send is refused and not delivered.
    let refused = sim
        .send_fenced(&a, &groups[2], &text("hi"), "m2", Some(&old))
        .await;
    assert_eq!(refused, Err(GatewayError::Fenced { sent: 4, seen: 5 }));
    // An unfenced send (single daemon) is not held to epochs.
    sim.send(&a, &groups[2], &text("hi"), "m3").await.unwrap();
    let ids: Vec<_> = sim.log().into_iter().map(|d| d.message_id).collect();
    assert_eq!(ids, ["m0", "m1", "m3"]);
    assert_eq!(sim.stats(&a).fenced, 1);
    assert_eq!(sim.fence_epoch(&a), Some(5));
}

#[tokio::test(start_paused = true)]
async fn a_claimed_epoch_refuses_the_old_owner_before_the_new_one_sends() {
    let sim = simulator(SimConfig::instant());
    let a = acct("claimed");
    let groups = sim.add_numbered_groups(&a, 2);
    let fence = |node: &str, epoch| crate::domain::Fence {
        account: a.clone(),
        node: node.into(),
        epoch,
    };
    sim.send_fenced(&a, &groups[0], &text("hi"), "m0", Some(&fence("n1", 4)))
        .await
        .unwrap();
    // n2 takes the lease and claims it before its first send; n1's
    // request, held up while n1 was paused, arrives after the claim.
    sim.claim_fence(&fence("n2", 5)).await.unwrap();
    let late = sim
        .send_fenced(&a, &groups[1], &text("hi"), "m1", Some(&fence("n1", 4)))
        .await;
    assert_eq!(late, Err(GatewayError::Fenced { sent: 4, seen: 5 }));
    assert_eq!(sim.log().len(), 1, "the late send was not delivered");
    // A claim older than an epoch seen is refused, and changes nothing.
    assert_eq!(
        sim.claim_fence(&fence("n1", 4)).await,
        Err(GatewayError::Fenced { sent: 4, seen: 5 })
    );
    assert_eq!(sim.fence_epoch(&a), Some(5));
    // Claiming the same epoch again (a second run of the owner) is fine.
    sim.claim_fence(&fence("n2", 5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_journal_carries_deliveries_ids_and_uploads_across_a_restart() {
    let dir = std::env::temp_dir().join(format!("herald-sim-journal-{}", std::process::id()));
    let path = dir.join("journal.jsonl");
    let _ = std::fs::remove_file(&path);
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(t0()));
    let a = acct("journal");
    let config = SimConfig {
        latency: Latency::Zero,
        upload_bytes_per_sec: None,
        ..SimConfig::default()
    };
    let (pic, bytes) = picture(1000);
    let handle = {
        let sim = Simulator::with_journal(config.clone(), clock.clone(), &path).unwrap();
        let groups = sim.add_numbered_groups(&a, 3);
        let h = sim.upload(&a, &pic, "image/png", bytes).await.unwrap();
        assert_eq!(sim.send(&a, &groups[0], &text("hi"), "3EB0A").await, OK);
        assert_eq!(
            sim.send(&a, &groups[1], &media(&h, Some("c")), "3EB0B")
                .await,
            OK
        );
        h
    };
    // A new process: same journal, groups configured again as at start-up.
    let sim = Simulator::with_journal(config, clock, &path).unwrap();
    let groups = sim.add_numbered_groups(&a, 3);
    assert_eq!(sim.delivered(&a), 2);
    assert_eq!(sim.uploads(&a), 1);
    assert_eq!(
        sim.send(&a, &groups[0], &text("hi"), "3EB0A").await,
        DUP,
        "accepted id remembered"
    );
    assert_eq!(
        sim.send(&a, &groups[2], &media(&handle, None), "3EB0C")
            .await,
        OK,
        "upload still valid"
    );
    // Content already delivered, under a new id, counts as a double send.
    assert_eq!(sim.send(&a, &groups[0], &text("hi"), "3EB0D").await, OK);
    assert_eq!(sim.duplicate_deliveries(), 1);
    let log = read_journal(&path).unwrap();
    assert_eq!(log.len(), 4);
    assert!(
        log.windows(2).all(|w| w[0].seq < w[1].seq),
        "sequence continues"
    );
    // A torn last line (a crash mid-write) is ignored, not fatal.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"{\"kind\":\"deliv")
        .unwrap();
    assert_eq!(read_journal(&path).unwrap().len(), 4);
    // Reopening drops the torn line; later deliveries are readable again.
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(t0()));
    let config = SimConfig {
        latency: Latency::Zero,
        ..SimConfig::default()
    };
    let sim = Simulator::with_journal(config, clock, &path).unwrap();
    sim.add_numbered_groups(&a, 3);
    assert_eq!(sim.send(&a, &groups[1], &text("later"), "3EB0E").await, OK);
    assert_eq!(read_journal(&path).unwrap().len(), 5);
    let _ = std::fs::remove_dir_all(&dir);
}

const OK: Result<SendReceipt, GatewayError> = Ok(SendReceipt { duplicate: false });
const DUP: Result<SendReceipt, GatewayError> = Ok(SendReceipt { duplicate: true });

struct SimSetup {
    sim: Arc<Simulator>,
    next: AtomicUsize,
}

#[async_trait]
impl ContractSetup for SimSetup {
    async fn account_with_groups(&self, n: usize) -> (AccountId, Vec<GroupJid>) {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let account = acct(&format!("contract-{i}"));
        let groups = self.sim.add_numbered_groups(&account, n);
        (account, groups)
    }

    async fn expire_uploads(&self, account: &AccountId) -> bool {
        self.sim.expire_uploads(account);
        true
    }
}

fn contract_setup(sim: &Arc<Simulator>) -> SimSetup {
    SimSetup {
        sim: sim.clone(),
        next: AtomicUsize::new(0),
    }
}

#[tokio::test(start_paused = true)]
async fn the_simulator_passes_the_gateway_contract() {
    let sim = simulator(SimConfig::default());
    gateway_contract::run_all(sim.as_ref(), &contract_setup(&sim)).await;
    assert_eq!(sim.duplicate_deliveries(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_contracts_single_upload_really_feeds_every_group() {
    let sim = simulator(SimConfig::default());
    let setup = contract_setup(&sim);
    gateway_contract::one_upload_serves_many_groups(sim.as_ref(), &setup).await;
    let a = acct("contract-0");
    assert_eq!(sim.uploads(&a), 1);
    let log = sim.deliveries(&a);
    assert_eq!(log.len(), 5);
    assert!(log.iter().all(|d| d.content_key == log[0].content_key));
    let groups: HashSet<_> = log.iter().map(|d| &d.group).collect();
    assert_eq!(groups.len(), 5);
}

#[tokio::test(start_paused = true)]
async fn latency_and_upload_time_pass_on_virtual_time() {
    let sim = simulator(SimConfig {
        latency: Latency::Fixed(Duration::from_millis(250)),
        upload_bytes_per_sec: Some(1_000_000),
        ..SimConfig::default()
    });
    let a = acct("sales");
    let groups = sim.add_numbered_groups(&a, 1);

    let start = Instant::now();
    assert_eq!(sim.send(&a, &groups[0], &text("hi"), "m1").await, OK);
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    // Accepted on arrival: the log has the time of the call.
    assert_eq!(sim.deliveries(&a)[0].at, t0());

    let (id, bytes) = picture(2_500_000);
    let start = Instant::now();
    let h = sim.upload(&a, &id, "image/png", bytes).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(2_500 + 250));
    assert_eq!(
        h.expires_at,
        t0() + Duration::from_millis(250 + 2_750) + Duration::from_secs(7 * 24 * 3600)
    );
    assert_eq!(sim.uploads(&a), 1);
    assert_eq!(sim.upload_bytes(&a), 2_500_000);

    let uniform = simulator(SimConfig::default());
    let b = acct("support");
    let groups = uniform.add_numbered_groups(&b, 1);
    let mut seen = HashSet::new();
    for i in 0..50 {
        let start = Instant::now();
        let got = uniform
            .send(&b, &groups[0], &text("x"), &format!("u{i}"))
            .await;
        assert_eq!(got, OK);
        let took = start.elapsed();
        assert!(
            (Duration::from_millis(80)..=Duration::from_millis(400)).contains(&took),
            "{took:?}"
        );
        seen.insert(took);
    }
    assert!(seen.len() > 10, "latency varies: {seen:?}");
}

#[tokio::test(start_paused = true)]
async fn sending_too_fast_is_rate_limited_then_banned_until_the_ban_ends() {
    let sim = simulator(SimConfig {
        rate_limit_per_minute: Some(5),
        ban_after_refusals: Some(3),
        ban_duration: Duration::from_secs(3600),
        ..SimConfig::instant()
    });
    let a = acct("sales");
    let g = sim.add_numbered_groups(&a, 1).remove(0);
    let mut n = 0;
    let mut send = || {
        n += 1;
        let sim = sim.clone();
        let (a, g) = (a.clone(), g.clone());
        async move { sim.send(&a, &g, &text("x"), &format!("m{n}")).await }
    };

    for _ in 0..5 {
        assert_eq!(send().await, OK);
        sleep(Duration::from_secs(10)).await;
    }
    // t = 50 s: the window (−10 s, 50 s] is full until the t = 0 send leaves it.
    let limited = GatewayError::RateLimited {
        retry_after: Some(Duration::from_secs(10)),
    };
    assert_eq!(send().await, Err(limited.clone()));
    sleep(Duration::from_secs(10)).await;
    assert_eq!(send().await, OK, "room again at t = 60 s");
    // Pushing on: the second refusal is a warning, the third a ban.
    assert_eq!(send().await, Err(limited));
    let until = t0() + Duration::from_secs(60 + 3600);
    let banned = GatewayError::Banned { until: Some(until) };
    assert_eq!(send().await, Err(banned.clone()));
    assert_eq!(sim.banned_until(&a), Some(until));

    // During the ban every request fails, uploads too, and nothing counts.
    sleep(Duration::from_secs(1800)).await;
    assert_eq!(send().await, Err(banned.clone()));
    let (id, bytes) = picture(10);
    assert_eq!(sim.upload(&a, &id, "image/png", bytes).await, Err(banned));

    sleep(Duration::from_secs(1800)).await;
    assert_eq!(sim.banned_until(&a), None);
    assert_eq!(send().await, OK, "the ban has ended");
    let stats = sim.stats(&a);
    assert_eq!((stats.delivered, stats.rate_limited, stats.bans), (7, 3, 1));
    assert!(sim.max_in_any_60s(&a) <= 5);
}

#[tokio::test(start_paused = true)]
async fn refusals_spread_over_more_than_a_minute_do_not_ban() {
    let sim = simulator(SimConfig {
        rate_limit_per_minute: Some(2),
        ban_after_refusals: Some(2),
        ..SimConfig::instant()
    });
    let a = acct("sales");
    let g = sim.add_numbered_groups(&a, 1).remove(0);
    for round in 0..3 {
        for i in 0..2 {
            let id = format!("ok-{round}-{i}");
            assert_eq!(sim.send(&a, &g, &text("x"), &id).await, OK);
        }
        let id = format!("over-{round}");
        let got = sim.send(&a, &g, &text("x"), &id).await;
        assert!(
            matches!(got, Err(GatewayError::RateLimited { .. })),
            "{got:?}"
        );
        sleep(Duration::from_secs(61)).await;
    }
    assert_eq!(sim.stats(&a).bans, 0);
}

#[tokio::test(start_paused = true)]
async fn a_message_id_is_delivered_once_per_account() {
    let sim = simulator(SimConfig::default());
    let (a, b) = (acct("sales"), acct("support"));
    let ga = sim.add_numbered_groups(&a, 2);
    let gb = sim.add_numbered_groups(&b, 1);
    assert_eq!(sim.send(&a, &ga[0], &text("hi"), "m1").await, OK);
    assert_eq!(sim.send(&a, &ga[0], &text("hi"), "m1").await, DUP);
    // The id is the account's, whatever the group or content.
    assert_eq!(sim.send(&a, &ga[1], &text("other"), "m1").await, DUP);
    // Another account has its own ids.
    assert_eq!(sim.send(&b, &gb[0], &text("hi"), "m1").await, OK);
    assert_eq!(sim.deliveries(&a).len(), 1);
    assert_eq!(sim.stats(&a).dedup_hits, 2);
    let log = sim.log();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0].account.as_str(), log[1].account.as_str()),
        ("sales", "support")
    );
    assert!(log[0].seq < log[1].seq);
    assert_eq!(sim.duplicate_deliveries(), 0);
}

/// Whether each of 200 sends failed, and how long each took.
async fn transient_pattern(seed: u64) -> (Vec<bool>, Vec<Duration>, u64) {
    let sim = simulator(SimConfig {
        transient_failure_rate: 0.25,
        rate_limit_per_minute: None,
        seed,
        ..SimConfig::default()
    });
    let a = acct("sales");
    let g = sim.add_numbered_groups(&a, 1).remove(0);
    let mut failed = Vec::new();
    let mut took = Vec::new();
    for i in 0..200 {
        let start = Instant::now();
        failed.push(match sim.send(&a, &g, &text("x"), &format!("m{i}")).await {
            Ok(r) => {
                assert!(!r.duplicate);
                false
            }
            Err(GatewayError::Transient(_)) => true,
            Err(e) => panic!("unexpected {e}"),
        });
        took.push(start.elapsed());
    }
    (failed, took, sim.delivered(&a))
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_deterministic_under_a_seed() {
    let (first, took, delivered) = transient_pattern(7).await;
    let (again, took_again, _) = transient_pattern(7).await;
    assert_eq!(first, again);
    assert_eq!(took, took_again);
    let failures = first.iter().filter(|f| **f).count();
    assert!(
        (25..=75).contains(&failures),
        "{failures} of 200 at p = 0.25"
    );
    assert_eq!(
        delivered,
        200 - failures as u64,
        "a failed send delivers nothing"
    );
    let (other, _, _) = transient_pattern(8).await;
    assert_ne!(first, other, "another seed, another pattern");
}

#[tokio::test(start_paused = true)]
async fn a_reconnect_holds_ready_and_sends_until_the_socket_is_back() {
    let sim = simulator(SimConfig::instant());
    let a = acct("a1");
    let g = sim.add_numbered_groups(&a, 1).remove(0);
    let up = Instant::now();
    sim.ready(&a).await.unwrap();
    assert_eq!(up.elapsed(), Duration::ZERO, "a connected socket is ready");
    let start = Instant::now();
    sim.reconnecting_for(&a, Duration::from_secs(30));
    sim.ready(&a).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(30), "ready waits");
    sim.reconnecting_for(&a, Duration::from_secs(10));
    let held = Instant::now();
    sim.send(&a, &g, &text("hi"), "m1").await.unwrap();
    assert_eq!(held.elapsed(), Duration::from_secs(10), "send is held");
    let d = &sim.deliveries(&a)[0];
    assert_eq!(
        d.at,
        t0() + chrono::Duration::seconds(40),
        "leaves when back"
    );
}

#[tokio::test(start_paused = true)]
async fn the_group_list_shows_names_posting_rights_and_leaves() {
    let sim = simulator(SimConfig::instant());
    let a = acct("a1");
    let g = sim.add_numbered_groups(&a, 4);
    sim.set_group_name(&a, &g[0], "Clients KL");
    sim.set_group_access(&a, &g[1], GroupAccess::AdminsOnly);
    sim.set_group_access(&a, &g[2], GroupAccess::AdminsOnly);
    sim.set_group_admin(&a, &g[2], true);
    sim.set_group_access(&a, &g[3], GroupAccess::NotParticipant);
    let listed = sim.list_groups(&a).await.unwrap();
    assert_eq!(listed.len(), 3, "a group the account left is not listed");
    assert_eq!(listed[0].subject, "Clients KL");
    assert!(listed[0].can_post());
    assert!(listed[1].announce && !listed[1].can_post());
    assert!(listed[2].announce && listed[2].is_admin && listed[2].can_post());
    assert_ne!(listed[1].subject, listed[2].subject);
    // What the list says about posting is what a send finds.
    let id = |i: usize| format!("m{i}");
    assert_eq!(
        sim.send(&a, &g[1], &text("x"), &id(1)).await,
        Err(GatewayError::NotAllowed)
    );
    assert!(sim.send(&a, &g[2], &text("x"), &id(2)).await.is_ok());
    sim.log_out(&a);
    assert_eq!(sim.list_groups(&a).await, Err(GatewayError::LoggedOut));
}

#[tokio::test(start_paused = true)]
async fn injected_failures_and_account_states() {
    let sim = simulator(SimConfig::instant());
    let a = acct("sales");
    let g = sim.add_numbered_groups(&a, 3);
    let blip = GatewayError::Transient("socket closed".into());
    sim.fail_next(&a, 2, blip.clone());
    assert_eq!(
        sim.send(&a, &g[0], &text("x"), "m1").await,
        Err(blip.clone())
    );
    assert_eq!(sim.send(&a, &g[0], &text("x"), "m1").await, Err(blip));
    assert_eq!(sim.send(&a, &g[0], &text("x"), "m1").await, OK);

    sim.set_group_access(&a, &g[1], GroupAccess::AdminsOnly);
    sim.set_group_access(&a, &g[2], GroupAccess::NotParticipant);
    assert_eq!(
        sim.send(&a, &g[1], &text("x"), "m2").await,
        Err(GatewayError::NotAllowed)
    );
    assert_eq!(
        sim.send(&a, &g[2], &text("x"), "m3").await,
        Err(GatewayError::NotParticipant)
    );
    sim.remove_group(&a, &g[2]);
    assert_eq!(
        sim.send(&a, &g[2], &text("x"), "m3").await,
        Err(GatewayError::GroupNotFound)
    );

    sim.log_out(&a);
    assert_eq!(
        sim.send(&a, &g[0], &text("x"), "m4").await,
        Err(GatewayError::LoggedOut)
    );
    let (id, bytes) = picture(10);
    assert_eq!(
        sim.upload(&a, &id, "image/png", bytes.clone()).await,
        Err(GatewayError::LoggedOut)
    );
    sim.reconnect(&a);
    assert_eq!(sim.send(&a, &g[0], &text("x"), "m4").await, OK);

    sim.ban_for(&a, Duration::from_secs(600));
    let until = Some(t0() + Duration::from_secs(600));
    assert_eq!(
        sim.send(&a, &g[0], &text("x"), "m5").await,
        Err(GatewayError::Banned { until })
    );

    let stranger = acct("never-paired");
    assert_eq!(
        sim.send(&stranger, &g[0], &text("x"), "m1").await,
        Err(GatewayError::LoggedOut)
    );
    assert_eq!(
        sim.upload(&stranger, &id, "image/png", bytes).await,
        Err(GatewayError::LoggedOut)
    );
    assert_eq!(sim.delivered(&a), 2);
}

#[tokio::test(start_paused = true)]
async fn upload_handles_expire_and_belong_to_their_account() {
    let sim = simulator(SimConfig {
        upload_ttl: Duration::from_secs(24 * 3600),
        ..SimConfig::instant()
    });
    let (a, b) = (acct("sales"), acct("support"));
    let g = sim.add_numbered_groups(&a, 1).remove(0);
    sim.add_numbered_groups(&b, 1);
    let (id, bytes) = picture(1000);
    let h = sim.upload(&a, &id, "image/png", bytes).await.unwrap();
    assert_eq!(h.expires_at, t0() + Duration::from_secs(24 * 3600));
    assert_eq!(
        sim.send(&b, &g, &media(&h, None), "m0").await,
        Err(GatewayError::MediaExpired),
        "another account cannot use it"
    );

    sleep(Duration::from_secs(24 * 3600 - 1)).await;
    assert_eq!(sim.send(&a, &g, &media(&h, Some("hi")), "m1").await, OK);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        sim.send(&a, &g, &media(&h, Some("hi")), "m2").await,
        Err(GatewayError::MediaExpired)
    );
    let d = &sim.deliveries(&a)[0];
    assert_eq!(
        d.content,
        DeliveredContent::Media {
            media: id,
            mime: "image/png".into(),
            caption: Some("hi".into())
        }
    );
    assert_eq!((sim.uploads(&a), sim.upload_bytes(&a)), (1, 1000));
    assert_eq!(sim.uploads(&b), 0);
}

/// Sends `n` texts from `account`, `gap` apart.
async fn paced(sim: &Simulator, account: &AccountId, n: usize, gap: Duration) {
    let g = sim.add_numbered_groups(account, n);
    for (i, group) in g.iter().enumerate() {
        if i > 0 {
            sleep(gap).await;
        }
        let got = sim.send(account, group, &text("x"), &format!("m{i}")).await;
        assert_eq!(got, OK);
    }
}

#[tokio::test(start_paused = true)]
async fn max_in_any_60s_counts_a_half_open_window() {
    let sim = simulator(SimConfig::instant());
    let (a, b, c) = (acct("a"), acct("b"), acct("c"));
    paced(&sim, &a, 41, Duration::from_millis(1500)).await;
    // The 41st send is at exactly 60 s: outside [0, 60 s).
    assert_eq!(sim.deliveries(&a)[40].at, t0() + Duration::from_secs(60));
    assert_eq!(sim.max_in_any_60s(&a), 40);
    paced(&sim, &b, 41, Duration::from_millis(1400)).await;
    assert_eq!(sim.max_in_any_60s(&b), 41);
    assert_eq!(sim.max_in_any_60s(&c), 0);
    assert_eq!(sim.max_in_any_60s(&acct("nobody")), 0);
}

#[tokio::test(start_paused = true)]
async fn a_sender_that_honours_retry_after_stays_under_the_limit() {
    let sim = simulator(SimConfig {
        rate_limit_per_minute: Some(40),
        ban_after_refusals: None,
        ..SimConfig::default()
    });
    let a = acct("sales");
    let groups = sim.add_numbered_groups(&a, 300);
    for (i, g) in groups.iter().enumerate() {
        loop {
            match sim.send(&a, g, &text("x"), &format!("m{i}")).await {
                Ok(_) => break,
                Err(GatewayError::RateLimited { retry_after }) => {
                    sleep(retry_after.expect("the simulator always says when")).await
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert_eq!(sim.delivered(&a), 300);
    assert_eq!(sim.max_in_any_60s(&a), 40);
}

#[tokio::test(start_paused = true)]
async fn duplicate_deliveries_catch_a_resend_under_a_new_id() {
    let sim = simulator(SimConfig::instant());
    let a = acct("sales");
    let g = sim.add_numbered_groups(&a, 2);
    assert_eq!(sim.send(&a, &g[0], &text("hello"), "r1-g0-p0").await, OK);
    assert_eq!(sim.send(&a, &g[1], &text("hello"), "r1-g1-p0").await, OK);
    assert_eq!(sim.duplicate_deliveries(), 0, "same text, other group");
    assert_eq!(sim.send(&a, &g[0], &text("hello"), "r1-g0-p0").await, DUP);
    assert_eq!(sim.duplicate_deliveries(), 0, "same id is caught by dedup");
    assert_eq!(
        sim.send(&a, &g[0], &text("hello"), "r1-g0-p0-retry").await,
        OK
    );
    assert_eq!(sim.duplicate_deliveries(), 1);

    // Media is keyed by what it shows, not by the upload handle.
    let (id, bytes) = picture(100);
    let h1 = sim
        .upload(&a, &id, "image/png", bytes.clone())
        .await
        .unwrap();
    let h2 = sim.upload(&a, &id, "image/png", bytes).await.unwrap();
    assert_ne!(h1.handle, h2.handle);
    assert_eq!(sim.send(&a, &g[0], &media(&h1, Some("hi")), "p1").await, OK);
    assert_eq!(
        sim.send(&a, &g[0], &media(&h1, Some("bye")), "p2").await,
        OK
    );
    assert_eq!(sim.duplicate_deliveries(), 1);
    assert_eq!(sim.send(&a, &g[0], &media(&h2, Some("hi")), "p3").await, OK);
    assert_eq!(sim.duplicate_deliveries(), 2);
    assert_eq!(sim.stats(&a).duplicate_deliveries, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instant_config_sends_20k_across_100_accounts_quickly() {
    let sim = Arc::new(Simulator::new(
        SimConfig::instant(),
        Arc::new(crate::ports::SystemClock),
    ));
    let accounts: Vec<AccountId> = (0..100).map(|i| acct(&format!("acct-{i}"))).collect();
    for a in &accounts {
        sim.add_numbered_groups(a, 200);
    }
    let start = std::time::Instant::now();
    let tasks: Vec<_> = accounts
        .iter()
        .cloned()
        .map(|a| {
            let sim = sim.clone();
            tokio::spawn(async move {
                let msg = text("Standup in 10 minutes");
                for i in 0..200 {
                    let g = Simulator::numbered_group(i);
                    let got = sim.send(&a, &g, &msg, &format!("{a}-{i}")).await;
                    assert_eq!(got, OK);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let took = start.elapsed();
    let rate = 20_000.0 / took.as_secs_f64();
    println!("simulator: 20000 sends in {took:?} ({rate:.0}/s)");
    assert_eq!(sim.total_delivered(), 20_000);
    assert_eq!(sim.duplicate_deliveries(), 0);
    assert!(rate > 20_000.0, "{rate:.0} sends/s");
}

#[tokio::test(start_paused = true)]
async fn a_delivered_message_gets_each_other_members_receipt_and_the_readers_later() {
    let (sink, mut inbox) = ReceiptSink::channel(10_000);
    let config = SimConfig {
        receipts: Some(SimReceipts {
            read_share: 0.5,
            read_after: Duration::from_secs(30),
            repeat_every: 0,
        }),
        ..SimConfig::instant()
    };
    let sim = Arc::new(
        Simulator::new(config, Arc::new(TokioClock::starting_at(t0()))).with_receipts(sink),
    );
    let a = acct("receipts");
    let groups = sim.add_numbered_groups(&a, 2);
    sim.send(&a, &groups[0], &text("hi"), "3EB0MSG0")
        .await
        .unwrap();
    // A resend of an accepted id is a duplicate: no second set.
    sim.send(&a, &groups[0], &text("hi"), "3EB0MSG0")
        .await
        .unwrap();
    let others = sim_participants(&groups[0]) - 1;
    let mut now = Vec::new();
    while let Ok(Heard::Receipt(r)) = inbox.try_recv() {
        now.push(r);
    }
    assert_eq!(now.len(), others as usize);
    assert!(now.iter().all(|r| r.kind == ReceiptKind::Delivered
        && r.chat == groups[0]
        && r.message_id == "3EB0MSG0"
        && r.account == a
        && r.at == t0()));
    let distinct: HashSet<&str> = now.iter().map(|r| r.participant.as_str()).collect();
    assert_eq!(distinct.len(), others as usize);
    // The readers come after the wait, stamped then.
    sleep(Duration::from_secs(29)).await;
    assert!(inbox.try_recv().is_err());
    sleep(Duration::from_secs(2)).await;
    let mut read = Vec::new();
    while let Ok(Heard::Receipt(r)) = inbox.try_recv() {
        read.push(r);
    }
    assert_eq!(read.len(), (f64::from(others) * 0.5).ceil() as usize);
    assert!(read
        .iter()
        .all(|r| r.kind == ReceiptKind::Read && r.at == t0() + chrono::Duration::seconds(30)));
}

#[tokio::test(start_paused = true)]
async fn without_a_plan_or_a_sink_no_receipts() {
    let (sink, mut inbox) = ReceiptSink::channel(10);
    let sim = Arc::new(
        Simulator::new(
            SimConfig::instant(),
            Arc::new(TokioClock::starting_at(t0())),
        )
        .with_receipts(sink),
    );
    let a = acct("quiet");
    let groups = sim.add_numbered_groups(&a, 1);
    sim.send(&a, &groups[0], &text("hi"), "3EB0Q")
        .await
        .unwrap();
    sleep(Duration::from_secs(3600)).await;
    assert!(inbox.try_recv().is_err());
}
