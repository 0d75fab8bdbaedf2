//! The run's charts against a real run on the simulator: the numbers the
//! API answers are the store's own sent-at times, minute by minute, and
//! the page's per-minute chart never draws a bar above the limit line.

use crate::api::console::signed_in;
use crate::api::helpers::*;
use chrono::{DateTime, DurationRound, Utc};
use serde_json::json;
use std::collections::BTreeMap;

/// The bars' tops (filled in the console's accent) and the limit line's
/// height in an SVG's pixels; y grows downwards.
fn bars_and_limit(svg: &str) -> (Vec<f64>, f64) {
    let attr = |el: &str, name: &str| -> Option<String> {
        let key = format!(" {name}=\"");
        let at = el.find(&key)? + key.len();
        Some(el[at..at + el[at..].find('"')?].to_owned())
    };
    let mut bars = Vec::new();
    let mut limit = None;
    for el in svg.split('<') {
        if el.starts_with("rect ") && attr(el, "fill").as_deref() == Some("#0B6E4F") {
            bars.push(attr(el, "y").unwrap().parse().unwrap());
        }
        if el.starts_with("polyline ") && attr(el, "stroke").as_deref() == Some("#B42318") {
            let points = attr(el, "points").unwrap();
            let y = points.split_whitespace().next().unwrap();
            limit = Some(y.split(',').nth(1).unwrap().parse().unwrap());
        }
    }
    (bars, limit.expect("the limit line"))
}

/// The figure `id` of a console page, whole.
fn figure_of<'p>(page: &'p str, id: &str) -> &'p str {
    let start = page
        .find(&format!(r#"<figure id="{id}""#))
        .unwrap_or_else(|| panic!("no figure {id}: {page}"));
    &page[start..start + page[start..].find("</figure>").unwrap()]
}

#[actix_rt::test]
async fn a_run_paced_at_its_limit_is_drawn_under_the_line_from_the_stores_own_times() {
    let app = spawn_app_with_token().await;
    app.add_account("pace").await;
    let r = app
        .patch(
            "/v1/accounts/pace",
            json!({"max_per_minute": 3, "daily_cap": 500}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let rid = app.create_reminder(reminder_body("pace", &groups(5))).await["id"]
        .as_i64()
        .unwrap();
    let fired = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(fired.status, 202, "{}", fired.text);
    let run = fired.json["run_id"].as_i64().unwrap();
    // Three in the first minute, two a minute later.
    app.wait_run(run, 150, |r| r["status"] == "success").await;

    let t = app.get(&format!("/v1/runs/{run}/timeline")).await;
    assert_eq!(t.status, 200, "{}", t.text);
    app.assert_schema("RunTimeline", &t.json).await;
    assert_eq!(t.json["max_per_minute"], 3);
    let minutes = t.json["minutes"].as_array().unwrap();
    let drawn: BTreeMap<String, u64> = minutes
        .iter()
        .filter(|m| m["messages"].as_u64().unwrap() > 0)
        .map(|m| {
            let at: DateTime<Utc> = m["minute"].as_str().unwrap().parse().unwrap();
            (at.to_rfc3339(), m["messages"].as_u64().unwrap())
        })
        .collect();
    // The store's own sent-at times, bucketed by minute here.
    let targets = app.get(&format!("/v1/runs/{run}/targets?limit=500")).await;
    let mut stored: BTreeMap<String, u64> = BTreeMap::new();
    for t in targets.json["items"].as_array().unwrap() {
        let at: DateTime<Utc> = t["sent_at"].as_str().unwrap().parse().unwrap();
        let minute = at.duration_trunc(chrono::Duration::minutes(1)).unwrap();
        *stored.entry(minute.to_rfc3339()).or_default() += t["parts_sent"].as_u64().unwrap();
    }
    assert_eq!(drawn, stored, "the timeline is the store's sent-at times");
    assert_eq!(stored.values().sum::<u64>(), 5);
    assert!(
        stored.values().all(|n| *n <= 3),
        "over the limit: {stored:?}"
    );
    assert!(stored.len() >= 2, "five at three a minute span two minutes");
    assert_eq!(
        t.json["reach"].as_array().unwrap().last().unwrap()["sent"],
        5
    );

    let mut b = signed_in(&app).await;
    let page = b.get(&format!("/runs/{run}")).await;
    assert_eq!(page.status, 200, "{}", page.text);
    let figure = figure_of(&page.text, "chart-pace");
    let (bars, limit) = bars_and_limit(figure);
    assert_eq!(bars.len(), minutes.len(), "a bar a minute: {figure}");
    assert!(
        bars.iter().all(|y| *y >= limit - 0.5),
        "{bars:?} above {limit}"
    );
    assert!(
        bars.iter().any(|y| (y - limit).abs() <= 1.0),
        "a full minute reaches the line: {bars:?} vs {limit}"
    );
    assert!(
        figure.contains("5 in ") && figure.contains("against the account's limit of 3 a minute"),
        "{figure}"
    );
    assert!(page.text.contains(r#"<figure id="chart-reach""#));

    let none = app.get("/v1/runs/999999/timeline").await;
    assert_problem(&none, 404, None);

    // The account's 30 days hold the same five messages, under its cap.
    let h = app.get("/v1/accounts/pace/history").await;
    assert_eq!(h.status, 200, "{}", h.text);
    app.assert_schema("AccountHistory", &h.json).await;
    let days = h.json["days"].as_array().unwrap();
    assert_eq!(days.len(), 30);
    let sent: u64 = days.iter().map(|d| d["messages"].as_u64().unwrap()).sum();
    assert_eq!(sent, 5);
    assert_eq!(days[29]["ceiling"], 500);
    assert_eq!(days[29]["ceiling_by"], "daily_cap");
    let page = b.get("/accounts/pace").await;
    assert_eq!(page.status, 200, "{}", page.text);
    let figure = figure_of(&page.text, "chart-days");
    assert_eq!(
        figure.matches(r##"fill="#0B6E4F""##).count(),
        30,
        "a bar a day"
    );
    assert!(figure.contains("5 in all"), "{figure}");
    assert!(
        figure.contains("today's ceiling is its daily cap of 500"),
        "{figure}"
    );
    assert_problem(&app.get("/v1/accounts/nobody/history").await, 404, None);

    // Disabled a while, then enabled: a stretch outside `connected`, shaded.
    assert!(
        h.json["states"].as_array().unwrap().is_empty(),
        "{}",
        h.text
    );
    let off = app.post_empty("/v1/accounts/pace/disable").await;
    assert!(off.status < 300, "{}", off.text);
    let on = app.post_empty("/v1/accounts/pace/enable").await;
    assert!(on.status < 300, "{}", on.text);
    let h = app.get("/v1/accounts/pace/history").await;
    app.assert_schema("AccountHistory", &h.json).await;
    let states = h.json["states"].as_array().unwrap();
    assert_eq!(states.len(), 1, "{}", h.text);
    assert_eq!(states[0]["state"], "disabled");
    assert!(states[0]["until"].is_string(), "it ended: {}", h.text);
    let page = b.get("/accounts/pace").await;
    // Disabled for a moment: seconds, in words.
    let caption = figure_of(&page.text, "chart-days");
    assert!(
        caption.contains("; not connected for ")
            && caption.contains(" second")
            && caption.contains(" in 1 stretch (shaded: disabled)"),
        "{caption}"
    );
}

#[actix_rt::test]
async fn the_overview_draws_the_next_24_hours_the_api_lists() {
    let app = spawn_app_with_token().await;
    app.add_account("day").await;
    let mut body = reminder_body("day", &groups(3));
    body["schedule"] = json!({"cron": "0 * * * *"});
    let rid = app.create_reminder(body).await["id"].as_i64().unwrap();

    let u = app.get("/v1/upcoming").await;
    assert_eq!(u.status, 200, "{}", u.text);
    app.assert_schema("Upcoming", &u.json).await;
    let fires: Vec<_> = u.json["fires"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["reminder_id"] == rid)
        .collect();
    // Hourly, all day in UTC: 24 fires in the next 24 hours, 3 groups each.
    assert_eq!(fires.len(), 24, "{}", u.text);
    assert!(fires
        .iter()
        .all(|f| f["groups"] == 3 && f["account_id"] == "day"));

    let mut b = signed_in(&app).await;
    let page = b.get("/").await;
    assert_eq!(page.status, 200, "{}", page.text);
    let figure = figure_of(&page.text, "chart-upcoming");
    assert!(
        figure.contains("(UTC): 24 fires naming 72 groups on 1 account;"),
        "{figure}"
    );
    // A bar an hour that fires, in the account's colour, and its legend.
    let bars = figure.matches(r##"fill="#0B6E4F""##).count();
    assert_eq!(bars, 24 + 1, "{figure}");
}
