use crate::api::helpers::*;
use serde_json::{json, Value};

fn status(v: &Value) -> &str {
    v["status"].as_str().unwrap()
}

#[actix_rt::test]
async fn a_run_is_paused_resumed_stopped_and_retried() {
    let app = spawn_app().await;
    let (rid, run) = slow_run(&app, 30).await;
    let path = format!("/v1/runs/{run}");
    app.wait_run(run, 5, |r| status(r) == "running").await;

    let r = app.post_empty(&format!("{path}/pause")).await;
    assert_eq!(r.status, 202, "{}", r.text);
    app.assert_schema("ControlResult", &r.json).await;
    assert_eq!(r.json["action"], "pause");
    app.wait_run(run, 5, |r| status(r) == "paused").await;
    assert_problem(&app.post_empty(&format!("{path}/pause")).await, 409, None);
    // Its reminder cannot be edited while a run is unfinished.
    let before = app.snapshot().await;
    let r = app
        .put(
            &format!("/v1/reminders/{rid}"),
            reminder_body("slow", &groups(2)),
        )
        .await;
    assert_problem(&r, 409, None);
    assert_eq!(app.snapshot().await, before);

    assert_eq!(app.post_empty(&format!("{path}/resume")).await.status, 202);
    app.wait_run(run, 5, |r| status(r) == "running").await;
    assert_problem(&app.post_empty(&format!("{path}/resume")).await, 409, None);
    assert_problem(&app.post_empty(&format!("{path}/retry")).await, 409, None);

    assert_eq!(app.post_empty(&format!("{path}/stop")).await.status, 202);
    let done = app.wait_run(run, 10, |r| status(r) == "cancelled").await;
    app.assert_schema("RunDetail", &done).await;
    assert!(done["error_summary"]
        .as_str()
        .unwrap()
        .starts_with("Stopped by operator."));
    assert!(done["counts"]["skipped"].as_u64().unwrap() > 0);
    assert_eq!(
        done["delivered"],
        format!("{} of 30 delivered", done["counts"]["sent"])
    );
    assert_problem(&app.post_empty(&format!("{path}/stop")).await, 409, None);

    // Retry sends the unsent groups again, under the same run.
    let r = app.post_empty(&format!("{path}/retry")).await;
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.json["requeued"], done["counts"]["skipped"]);
    app.wait_run(run, 5, |r| ["queued", "running"].contains(&status(r)))
        .await;
    app.post_empty(&format!("{path}/stop")).await;
    app.wait_run(run, 10, |r| status(r) == "cancelled").await;
}

#[actix_rt::test]
async fn runs_and_targets_are_listed_and_paged() {
    let app = spawn_app().await;
    let (rid, run) = slow_run(&app, 12).await;
    app.post_empty(&format!("/v1/runs/{run}/stop")).await;
    app.wait_run(run, 10, |r| status(r) == "cancelled").await;

    let list = app.get(&format!("/v1/runs?reminder_id={rid}")).await;
    assert_eq!(list.status, 200, "{}", list.text);
    assert_eq!(list.json["items"][0]["id"], run);
    assert!(list.json["next_before_id"].is_null());
    for q in ["account_id=slow", "status=cancelled", "limit=1"] {
        let r = app.get(&format!("/v1/runs?{q}")).await;
        assert_eq!(r.json["items"].as_array().unwrap().len(), 1, "{q}");
    }
    let r = app.get("/v1/runs?limit=1").await;
    assert_eq!(r.json["next_before_id"], run);
    let r = app.get(&format!("/v1/runs?before_id={run}")).await;
    assert_eq!(r.json["items"], json!([]));
    assert_eq!(
        app.get("/v1/runs?status=success").await.json["items"],
        json!([])
    );
    for (q, field) in [
        ("status=done", "status"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("before_id=x", "before_id"),
        ("reminder=1", "reminder"),
    ] {
        assert_problem(&app.get(&format!("/v1/runs?{q}")).await, 400, Some(field));
    }

    // Targets, five at a time, in position order.
    let mut seen = Vec::new();
    let mut after: Option<u64> = None;
    loop {
        let q = match after {
            Some(a) => format!("/v1/runs/{run}/targets?limit=5&after={a}"),
            None => format!("/v1/runs/{run}/targets?limit=5"),
        };
        let page = app.get(&q).await;
        assert_eq!(page.status, 200, "{}", page.text);
        for t in page.json["items"].as_array().unwrap() {
            app.assert_schema("RunTarget", t).await;
            seen.push(t["group"].as_str().unwrap().to_owned());
        }
        match page.json["next_after"].as_u64() {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, groups(12));
    let skipped = app
        .get(&format!("/v1/runs/{run}/targets?status=skipped&limit=100"))
        .await;
    for t in skipped.json["items"].as_array().unwrap() {
        assert_eq!(t["error"], "stopped by operator");
    }
    assert_problem(
        &app.get(&format!("/v1/runs/{run}/targets?status=lost"))
            .await,
        400,
        Some("status"),
    );
}

#[actix_rt::test]
async fn unknown_runs_are_404_for_every_action() {
    let app = spawn_app().await;
    assert_problem(&app.get("/v1/runs/4242").await, 404, None);
    assert_problem(&app.get("/v1/runs/4242/targets").await, 404, None);
    assert_problem(&app.get("/v1/runs/nope").await, 404, None);
    for action in ["stop", "pause", "resume", "retry"] {
        assert_problem(
            &app.post_empty(&format!("/v1/runs/4242/{action}")).await,
            404,
            None,
        );
    }
}

/// The simulated groups' receipts, counted: each group's other members
/// reached, a share of them readers, in the run and its groups; once the
/// run has settled its counts are reported once as `run_receipts`.
#[actix_rt::test]
async fn a_runs_receipts_show_in_the_run_its_groups_and_one_event() {
    let app = spawn_app_with(&[
        ("HERALD_SIMULATOR__READ_SHARE", "0.5"),
        ("HERALD_SIMULATOR__READ_AFTER_SECS", "1"),
        ("HERALD_RECEIPTS__SETTLE_AFTER_SECS", "2"),
        ("HERALD_RECEIPTS__CHECK_EVERY_SECS", "1"),
    ])
    .await;
    app.add_account("acme").await;
    let rem = app.create_reminder(reminder_body("acme", &groups(4))).await;
    let rid = rem["id"].as_i64().unwrap();
    let fired = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(fired.status, 202, "{}", fired.text);
    let run = fired.json["run_id"].as_i64().unwrap();
    let others = |g: &str| {
        let jid = herald_actors::domain::GroupJid::parse(g).unwrap();
        u64::from(herald_actors::simulator::sim_participants(&jid) - 1)
    };
    let readers = |g: &str| (others(g) as f64 * 0.5).ceil() as u64;
    let want_read: u64 = groups(4).iter().map(|g| readers(g)).sum();
    let done = app
        .wait_run(run, 20, |r| {
            status(r) == "success" && r["receipts"]["read"].as_u64() == Some(want_read)
        })
        .await;
    app.assert_schema("RunDetail", &done).await;
    let r = &done["receipts"];
    assert_eq!(
        (r["groups_delivered"].as_u64(), r["groups_read"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(
        r["delivered"].as_u64(),
        Some(groups(4).iter().map(|g| others(g)).sum())
    );
    let targets = app.get(&format!("/v1/runs/{run}/targets")).await;
    for t in targets.json["items"].as_array().unwrap() {
        app.assert_schema("RunTarget", t).await;
        let g = t["group"].as_str().unwrap();
        assert_eq!(t["receipts"]["delivered"].as_u64(), Some(others(g)), "{t}");
        assert_eq!(t["receipts"]["read"].as_u64(), Some(readers(g)), "{t}");
        assert!(
            t["receipts"]["first_receipt_at"].as_str() <= t["receipts"]["last_receipt_at"].as_str()
        );
        // Read a second after delivery: the first read is after the first
        // receipt, and never after the last.
        let first_read = t["receipts"]["first_read_at"].as_str().expect("read");
        assert!(t["receipts"]["first_receipt_at"].as_str().unwrap() <= first_read);
        assert!(first_read <= t["receipts"]["last_receipt_at"].as_str().unwrap());
    }
    // The run's read curve ends with every group read.
    let t = app.get(&format!("/v1/runs/{run}/timeline")).await;
    app.assert_schema("RunTimeline", &t.json).await;
    let last = t.json["reach"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            last["sent"].as_u64(),
            last["reached"].as_u64(),
            last["read"].as_u64()
        ),
        (Some(4), Some(4), Some(4)),
        "{}",
        t.text
    );

    // Settled: one event with the same counts, on the stream.
    let events = app
        .read_events("/v1/events?after=0", &[], 15, |evs| {
            evs.iter().any(|e| e.kind == "run_receipts")
        })
        .await;
    let reported: Vec<_> = events.iter().filter(|e| e.kind == "run_receipts").collect();
    assert_eq!(reported.len(), 1, "{events:?}");
    let data = &reported[0].data["data"];
    assert_eq!(data["run_id"], run);
    assert_eq!(data["groups"], 4);
    assert_eq!(data["receipts"], done["receipts"]);
    // Further sweeps report nothing more.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let stored = app.state.store.events_after(0, 0).await.unwrap();
    assert_eq!(
        stored.iter().filter(|e| e.kind == "run_receipts").count(),
        1
    );
}

/// A finished run recalled, then corrected, through `/v1`: each a 202 with
/// the amendment, its progress in the run until every group is done, the
/// simulated groups' revokes and edits of the run's own message ids, one
/// at a time per run, and the events that open and close each.
#[actix_rt::test]
async fn a_run_is_edited_then_recalled_in_every_group() {
    let app = spawn_app().await;
    app.add_account("acme").await;
    let rem = app.create_reminder(reminder_body("acme", &groups(4))).await;
    let rid = rem["id"].as_i64().unwrap();
    let fired = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    let run = fired.json["run_id"].as_i64().unwrap();
    app.wait_run(run, 20, |r| status(r) == "success").await;
    let path = format!("/v1/runs/{run}");
    let open = |r: &Value| r["amendment"]["finished_at"].is_null();

    // Nothing this run can take: 409 naming the field (the body itself is
    // well formed); a blank text is the body's own 422. Stored data untouched.
    let before = app.snapshot().await;
    assert_problem(
        &app.post(&format!("{path}/edit"), json!({})).await,
        409,
        Some("text"),
    );
    assert_problem(
        &app.post(&format!("{path}/edit"), json!({"caption": "new"}))
            .await,
        409,
        Some("caption"),
    );
    assert_problem(
        &app.post(&format!("{path}/edit"), json!({"text": "  "}))
            .await,
        422,
        Some("text"),
    );
    assert_eq!(app.snapshot().await, before);

    let r = app
        .post(
            &format!("{path}/edit"),
            json!({"text": "Standup moved to 10:30"}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    app.assert_schema("AmendmentResult", &r.json).await;
    assert_eq!(r.json["amendment"]["kind"], "edit");
    // One at a time: the edit is under way (4 groups take seconds).
    assert_problem(&app.post_empty(&format!("{path}/recall")).await, 409, None);
    let edited = app.wait_run(run, 20, |r| !open(r)).await;
    app.assert_schema("RunDetail", &edited).await;
    assert_eq!(edited["amendment"]["progress"]["done"], 4);

    let r = app.post_empty(&format!("{path}/recall")).await;
    assert_eq!(r.status, 202, "{}", r.text);
    let recalled = app
        .wait_run(run, 20, |r| r["amendment"]["kind"] == "recall" && !open(r))
        .await;
    let p = &recalled["amendment"]["progress"];
    assert_eq!(
        (p["total"].as_u64(), p["done"].as_u64()),
        (Some(4), Some(4))
    );
    // The recall over time, as the run's chart draws it.
    let t = app.get(&format!("{path}/timeline")).await;
    assert_eq!(t.status, 200, "{}", t.text);
    app.assert_schema("RunTimeline", &t.json).await;
    let a = &t.json["amendment"];
    assert_eq!(
        (a["kind"].as_str(), a["total"].as_u64()),
        (Some("recall"), Some(4))
    );
    let last = a["points"].as_array().unwrap().last().unwrap();
    assert_eq!(
        (last["done"].as_u64(), last["settled"].as_u64()),
        (Some(4), Some(4))
    );

    let acme = herald_actors::domain::AccountId::parse("acme").unwrap();
    let sent = app.state.simulator.deliveries(&acme);
    let amended: Vec<_> = sent
        .iter()
        .filter(|d| d.content.amends().is_some())
        .collect();
    assert_eq!(amended.len(), 8, "an edit and a revoke per group");
    for d in sent.iter().filter(|d| d.content.amends().is_none()) {
        let of: Vec<_> = amended
            .iter()
            .filter(|a| a.content.amends() == Some(d.message_id.as_str()))
            .map(|a| &a.content)
            .collect();
        assert_eq!(of.len(), 2, "{}: {of:?}", d.group);
        assert!(matches!(
            of[0],
            herald_actors::simulator::DeliveredContent::Edit { text, .. } if text == "Standup moved to 10:30"
        ));
        assert!(matches!(
            of[1],
            herald_actors::simulator::DeliveredContent::Revoke { .. }
        ));
    }

    let events = app
        .read_events("/v1/events?after=0", &[], 10, |evs| {
            evs.iter().any(|e| e.kind == "run_recall_finished")
        })
        .await;
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e.kind.starts_with("run_edit") || e.kind.starts_with("run_recall"))
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(
        kinds,
        [
            "run_edit_started",
            "run_edit_finished",
            "run_recall_started",
            "run_recall_finished"
        ]
    );
    for action in ["recall", "edit"] {
        assert_problem(
            &app.post(&format!("/v1/runs/4242/{action}"), json!({"text": "x"}))
                .await,
            404,
            None,
        );
    }
}
