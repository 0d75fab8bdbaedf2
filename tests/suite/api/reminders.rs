use crate::api::helpers::*;
use serde_json::{json, Value};

#[actix_rt::test]
async fn create_get_list_and_replace() {
    let app = spawn_app().await;
    app.add_account("a1").await;
    app.add_account("a2").await;
    let mut body = reminder_body("a1", &groups(3));
    body["schedule"] = json!({"cron": "0 9 * * *"});
    body["timezone"] = json!("Asia/Kuala_Lumpur");
    let created = app.create_reminder(body.clone()).await;
    let id = created["id"].as_i64().unwrap();
    assert_eq!(created["state"], "active");
    assert_eq!(created["schedule"], json!({"cron": "0 9 * * *"}));
    assert_eq!(created["window"], json!({"start_hour": 0, "end_hour": 24}));
    app.assert_schema("Reminder", &created).await;
    app.create_reminder(reminder_body("a2", &groups(1))).await;

    // The next five 09:00s in Kuala Lumpur, and the scheduler's view.
    let mut detail = Value::Null;
    for _ in 0..40 {
        detail = app.get(&format!("/v1/reminders/{id}")).await.json;
        if !detail["next_due"].is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    app.assert_schema("ReminderDetail", &detail).await;
    let fires = detail["next_fires"].as_array().unwrap();
    assert_eq!(fires.len(), 5);
    for f in fires {
        let local = f["local"].as_str().unwrap();
        assert!(local.ends_with("T09:00:00+08:00"), "{local}");
        assert!(f["at"].as_str().unwrap().contains("T01:00:00"), "{f}");
    }
    // The same minute (the scheduler's cursor may carry a fraction of a second).
    let due = detail["next_due"]["occurrence"].as_str().unwrap();
    assert_eq!(due[..16], fires[0]["at"].as_str().unwrap()[..16]);

    let only_a1 = app.get("/v1/reminders?account_id=a1").await;
    assert_eq!(only_a1.json["items"].as_array().unwrap().len(), 1);
    let all = app.get("/v1/reminders").await;
    assert_eq!(all.json["items"].as_array().unwrap().len(), 2);
    assert_problem(
        &app.get("/v1/reminders?state=sleeping").await,
        400,
        Some("state"),
    );
    assert_problem(
        &app.get("/v1/reminders?acount_id=a1").await,
        400,
        Some("acount_id"),
    );

    body["title"] = json!("Daily standup");
    body["targets"] = json!(groups(4));
    let r = app.put(&format!("/v1/reminders/{id}"), body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["title"], "Daily standup");
    assert_eq!(r.json["targets"].as_array().unwrap().len(), 4);
    assert_problem(
        &app.put("/v1/reminders/999", reminder_body("a1", &groups(1)))
            .await,
        404,
        None,
    );
}

#[actix_rt::test]
async fn every_rejected_reminder_names_its_field_and_stores_nothing() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let existing = app.create_reminder(reminder_body("acc", &groups(2))).await;
    let existing_path = format!("/v1/reminders/{}", existing["id"]);
    let valid = reminder_body("acc", &groups(2));
    let with = |key: &str, v: Value| {
        let mut b = valid.clone();
        b[key] = v;
        b
    };
    let unknown_media = "ab".repeat(32);
    let cases: Vec<(&str, Value, u16, &str, Option<&str>)> = vec![
        (
            "bad timezone",
            with("timezone", json!("Mars/Olympus")),
            422,
            "timezone",
            None,
        ),
        (
            "offset timezone",
            with("timezone", json!("+08:00")),
            422,
            "timezone",
            None,
        ),
        (
            "window out of range",
            with("window", json!({"start_hour": 6, "end_hour": 25})),
            422,
            "window.end_hour",
            Some("must be 0–24"),
        ),
        (
            "window start out of range",
            with("window", json!({"start_hour": 24, "end_hour": 6})),
            422,
            "window.start_hour",
            Some("must be 0–23"),
        ),
        (
            "JID without @g.us",
            with("targets", json!([group(1), "60123456789@s.whatsapp.net"])),
            422,
            "targets[1]",
            None,
        ),
        (
            "empty parts",
            with("parts", json!([])),
            422,
            "parts",
            Some("must have 1–10 parts"),
        ),
        (
            "empty targets",
            with("targets", json!([])),
            422,
            "targets",
            None,
        ),
        (
            "duplicate target",
            with("targets", json!([group(1), group(2), group(1)])),
            422,
            "targets[2]",
            None,
        ),
        (
            "unknown account",
            with("account_id", json!("nobody")),
            422,
            "account_id",
            Some("account nobody does not exist"),
        ),
        (
            "unknown media",
            with("parts", json!([{"kind": "media", "media": unknown_media}])),
            422,
            "parts[0].media",
            None,
        ),
        (
            "empty text",
            with("parts", json!([{"kind": "text", "text": "  "}])),
            422,
            "parts[0].text",
            Some("must not be empty"),
        ),
        (
            "bad cron",
            with("schedule", json!({"cron": "0 9 * *"})),
            422,
            "schedule.cron",
            None,
        ),
        (
            "unknown field",
            with("priority", json!("high")),
            422,
            "priority",
            None,
        ),
        (
            "targets not strings",
            with("targets", json!([group(1), 5])),
            422,
            "targets[1]",
            None,
        ),
        (
            "title not a string",
            with("title", json!(["x"])),
            422,
            "title",
            Some("must be a string"),
        ),
        (
            "unknown template variable",
            with("parts", json!([{"kind": "text", "text": "Hi {nme}"}])),
            422,
            "parts[0].text",
            None,
        ),
        (
            "unique texts a plain text cannot give",
            with("unique_texts", json!(true)),
            422,
            "parts[0].text",
            None,
        ),
    ];
    let before = app.snapshot().await;
    for (what, body, status, field, rule) in &cases {
        for (method, path) in [("POST", "/v1/reminders"), ("PUT", existing_path.as_str())] {
            let r = app.json(method, path, body.clone()).await;
            assert_problem(&r, *status, Some(field));
            if let Some(rule) = rule {
                assert_eq!(r.json["rule"], *rule, "{what}");
            }
        }
    }
    let mut missing = valid.clone();
    missing.as_object_mut().unwrap().remove("schedule");
    assert_problem(
        &app.post("/v1/reminders", missing).await,
        422,
        Some("schedule"),
    );
    assert_eq!(app.snapshot().await, before);
}

#[actix_rt::test]
async fn pause_resume_and_archive() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let id = app.create_reminder(reminder_body("acc", &groups(1))).await["id"].clone();
    let path = format!("/v1/reminders/{id}");
    let r = app.post_empty(&format!("{path}/pause")).await;
    assert_eq!((r.status, r.json["state"].as_str()), (200, Some("paused")));
    // Idempotent.
    let r = app.post_empty(&format!("{path}/pause")).await;
    assert_eq!((r.status, r.json["state"].as_str()), (200, Some("paused")));
    // A paused reminder does not fire.
    assert_problem(&app.post_empty(&format!("{path}/fire")).await, 409, None);
    let r = app.post_empty(&format!("{path}/resume")).await;
    assert_eq!((r.status, r.json["state"].as_str()), (200, Some("active")));

    assert_eq!(app.delete(&path).await.status, 204);
    let r = app.get(&path).await;
    assert_eq!(r.json["state"], "archived");
    assert_eq!(r.json["next_fires"], json!([]));
    assert_problem(&app.post_empty(&format!("{path}/resume")).await, 409, None);
    let archived = app.get("/v1/reminders?state=archived").await;
    assert_eq!(archived.json["items"].as_array().unwrap().len(), 1);
    for action in ["pause", "resume", "fire", "forecast"] {
        assert_problem(
            &app.post_empty(&format!("/v1/reminders/77/{action}")).await,
            404,
            None,
        );
    }
    assert_problem(&app.get("/v1/reminders/abc").await, 404, None);
}

#[actix_rt::test]
async fn forecast_is_a_dry_run_at_the_accounts_rate() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let mut body = reminder_body("acc", &groups(5));
    body["parts"] = json!([
        {"kind": "text", "text": "one"},
        {"kind": "text", "text": "two"},
    ]);
    let id = app.create_reminder(body).await["id"].clone();
    let r = app
        .post_empty(&format!("/v1/reminders/{id}/forecast"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    app.assert_schema("Forecast", &r.json).await;
    assert_eq!(r.json["from"], "now");
    assert_eq!(r.json["groups"], 5);
    assert_eq!(r.json["parts_per_group"], 2);
    assert_eq!(r.json["messages"], 10);
    assert_eq!(r.json["per_minute"], 40);

    app.patch("/v1/accounts/acc", json!({"max_per_minute": 600}))
        .await;
    let r = app
        .post_empty(&format!("/v1/reminders/{id}/forecast?from=next"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["per_minute"], 600);
    assert_eq!(r.json["start"], "2099-01-05T09:00:00Z");
    assert_eq!(r.json["window_close"], "2099-01-06T00:00:00Z");
    assert_eq!(r.json["fits"], true);
    // Ten messages at 600/min would take a second; typing before each
    // message with three groups in flight makes it a few.
    let finish = r.json["expected_finish"].as_str().unwrap();
    assert!(finish.starts_with("2099-01-05T09:00:0"), "{finish}");
    assert!(r.json["text"]
        .as_str()
        .unwrap()
        .starts_with("forecast: all 5 groups fit"));

    assert_problem(
        &app.post_empty(&format!("/v1/reminders/{id}/forecast?from=later"))
            .await,
        400,
        Some("from"),
    );
    // Nothing was written.
    let runs = app.get("/v1/runs").await;
    assert_eq!(runs.json["items"], json!([]));
}

#[actix_rt::test]
async fn preview_renders_what_the_first_groups_would_get() {
    let app = spawn_app().await;
    app.add_account("acc").await;
    let mut body = reminder_body("acc", &groups(30));
    body["unique_texts"] = json!(true);
    body["parts"] = json!([{"kind": "text", "text": "{Hi|Hello|Hey} {team|all|folks|everyone} {at|from} {time}{.|!}"}]);
    let created = app.create_reminder(body).await;
    assert_eq!(created["unique_texts"], true);
    let id = created["id"].as_i64().unwrap();
    let r = app
        .post_empty(&format!("/v1/reminders/{id}/preview?samples=3"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    app.assert_schema("Preview", &r.json).await;
    let samples = r.json["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 3);
    let first = samples[0]["parts"][0].as_str().unwrap();
    assert!(!first.contains('{'), "{first}");
    assert_eq!(r.json["distinct"], json!([30]), "every group its own text");
    assert_eq!(r.json["targets"], 30);
    assert_problem(
        &app.post_empty(&format!("/v1/reminders/{id}/preview?samples=0"))
            .await,
        400,
        Some("samples"),
    );
    assert_problem(
        &app.post_empty("/v1/reminders/999/preview").await,
        404,
        None,
    );
}

/// 01:30 on 31 October 2027 happens twice in London (02:00 BST goes back
/// to 01:00 GMT): `fold` or an offset in `at` picks which one fires, the
/// stored reminder says which, and a wrong choice is refused naming it.
#[actix_rt::test]
async fn a_repeated_local_time_fires_at_the_interpretation_picked() {
    let app = spawn_app().await;
    app.add_account("a1").await;
    let fires_at = |schedule: Value| {
        let app = &app;
        async move {
            let mut body = reminder_body("a1", &groups(1));
            body["timezone"] = json!("Europe/London");
            body["schedule"] = schedule;
            let r = app.create_reminder(body).await;
            app.assert_schema("Reminder", &r).await;
            let d = app.get(&format!("/v1/reminders/{}", r["id"])).await.json;
            app.assert_schema("ReminderDetail", &d).await;
            let first = &d["next_fires"][0];
            (
                r["schedule"].clone(),
                first["at"].as_str().unwrap().to_owned(),
                first["local"].as_str().unwrap().to_owned(),
                first["dst_note"].clone(),
            )
        }
    };
    let (stored, at, local, note) =
        fires_at(json!({"at": "2027-10-31T01:30", "fold": "later"})).await;
    assert_eq!(
        note,
        "clocks go back that night: 01:30 happens twice, and it fires once, at the second \
         (+00:00; the first is +01:00)"
    );
    assert_eq!(
        stored,
        json!({"at": "2027-10-31T01:30:00", "fold": "later"})
    );
    assert_eq!(
        (at.as_str(), local.as_str()),
        ("2027-10-31T01:30:00Z", "2027-10-31T01:30:00+00:00")
    );
    let (stored, at, local, _) =
        fires_at(json!({"at": "2027-10-31T01:30", "fold": "earlier"})).await;
    assert_eq!(stored, json!({"at": "2027-10-31T01:30:00"}));
    assert_eq!(
        (at.as_str(), local.as_str()),
        ("2027-10-31T00:30:00Z", "2027-10-31T01:30:00+01:00")
    );
    // An explicit offset settles into the fold it names.
    let (stored, at, _, _) = fires_at(json!({"at": "2027-10-31T01:30+00:00"})).await;
    assert_eq!(
        stored,
        json!({"at": "2027-10-31T01:30:00", "fold": "later"})
    );
    assert_eq!(at, "2027-10-31T01:30:00Z");
    // Without either, the first, as before.
    let (_, at, _, _) = fires_at(json!({"at": "2027-10-31T01:30"})).await;
    assert_eq!(at, "2027-10-31T00:30:00Z");

    let before = app.snapshot().await;
    for (schedule, field, rule) in [
        (
            json!({"at": "2027-10-31T01:30+05:00"}),
            "schedule.at",
            "it is +01:00 or +00:00",
        ),
        (
            json!({"at": "2027-03-28T01:30+00:00"}),
            "schedule.at",
            "does not exist in Europe/London",
        ),
        (
            json!({"at": "2027-10-31T01:30", "fold": "second"}),
            "schedule.fold",
            "earlier",
        ),
        (
            json!({"cron": "30 1 * * *", "fold": "later"}),
            "schedule.fold",
            "not a known field (known: cron)",
        ),
        (
            json!({"at": "2027-10-31T01:30Z", "fold": "later"}),
            "schedule.fold",
            "not both",
        ),
    ] {
        let mut body = reminder_body("a1", &groups(1));
        body["timezone"] = json!("Europe/London");
        body["schedule"] = schedule.clone();
        let r = app.post("/v1/reminders", body).await;
        assert_problem(&r, 422, Some(field));
        assert!(r.text.contains(rule), "{schedule}: {}", r.text);
    }
    assert_eq!(
        app.snapshot().await,
        before,
        "a refused reminder stores nothing"
    );
}

/// WhatsApp's word on the account before a run: a time-lock that ends
/// after the window closes is named by the forecast, the preview and the
/// fire's answer ("nothing will be sent"); one that ends inside it delays
/// the forecast's start to its end.
#[actix_rt::test]
async fn a_time_lock_past_the_window_is_named_before_the_run() {
    use herald_actors::domain::*;
    let app = spawn_app().await;
    app.add_account("acc").await;
    let now = chrono::Utc::now();
    let mut body = reminder_body("acc", &groups(5));
    // Today's window, closing two hours from now (or tomorrow's, late in
    // the day): the lock below ends a day later.
    body["window"] = json!({"start_hour": 0, "end_hour": 24});
    let id = app.create_reminder(body).await["id"].clone();
    let lock = |until: chrono::DateTime<chrono::Utc>| Standing {
        timelock: locked_until(until, now),
        quota: Reading::Never,
    };
    let acc = AccountId::parse("acc").unwrap();
    app.state
        .store
        .set_account_standing(&acc, None, &lock(now + chrono::Duration::days(2)), None)
        .await
        .unwrap();
    let f = app
        .post_empty(&format!("/v1/reminders/{id}/forecast"))
        .await;
    assert_eq!(f.status, 200, "{}", f.text);
    let text = f.json["text"].as_str().unwrap();
    assert!(
        text.starts_with("WhatsApp time-locked this account's reach-out until")
            && text.ends_with("after the window closes at 00:00 UTC: nothing will be sent"),
        "{text}"
    );
    assert_eq!(f.json["groups_fit"], 0);
    assert_eq!(f.json["fits"], false);
    let p = app.post_empty(&format!("/v1/reminders/{id}/preview")).await;
    assert_eq!(p.status, 200, "{}", p.text);
    app.assert_schema("Preview", &p.json).await;
    assert!(
        p.json["held_back"]
            .as_str()
            .is_some_and(|h| h.contains("nothing will be sent")),
        "{}",
        p.text
    );
    // A lock that ends inside the window: the forecast starts then.
    let soon = now + chrono::Duration::minutes(30);
    if (soon + chrono::Duration::minutes(30)).date_naive() == now.date_naive() {
        app.state
            .store
            .set_account_standing(&acc, None, &lock(soon), None)
            .await
            .unwrap();
        let f = app
            .post_empty(&format!("/v1/reminders/{id}/forecast"))
            .await;
        let text = f.json["text"].as_str().unwrap();
        assert!(
            text.contains("nothing leaves before then; forecast: all 5 groups fit"),
            "{text}"
        );
        let finish: chrono::DateTime<chrono::Utc> =
            serde_json::from_value(f.json["expected_finish"].clone()).unwrap();
        assert!(finish >= soon, "{finish} before the lock's end {soon}");
    }
    // Firing says so in its answer.
    app.state
        .store
        .set_account_standing(&acc, None, &lock(now + chrono::Duration::days(2)), None)
        .await
        .unwrap();
    let fired = app.post_empty(&format!("/v1/reminders/{id}/fire")).await;
    assert_eq!(fired.status, 202, "{}", fired.text);
    assert!(
        fired.json["held_back"]
            .as_str()
            .is_some_and(|h| h.contains("nothing will be sent")),
        "{}",
        fired.text
    );
}
