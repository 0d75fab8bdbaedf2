//! The console in a real browser: headless Chromium driven through
//! chromedriver (WebDriver). Skipped, saying so, where either is missing;
//! with `HERALD_REQUIRE_CHROMIUM=1` (CI) a missing browser fails instead.
//!
//! `HERALD_CONSOLE_SCREENSHOTS=<dir>` also writes a PNG of each page at
//! desktop and phone width there.

use crate::api::helpers::*;
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| PathBuf::from(dir).join(name))
        .find(|p| p.is_file())
}

/// chromedriver on a free port, ended when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The driver and a headless browser session, or `None` (skip) when
/// Chromium or chromedriver is not installed.
async fn browser() -> Option<(Driver, Client)> {
    let chromium = on_path("chromium").or_else(|| on_path("chromium-browser"));
    let driver = on_path("chromedriver");
    let (Some(chromium), Some(driver)) = (chromium, driver) else {
        let why = "chromium and chromedriver are needed (Debian: apt-get install chromium chromium-driver)";
        if std::env::var("HERALD_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
            panic!("HERALD_REQUIRE_CHROMIUM=1 but {why}");
        }
        eprintln!("SKIPPED: the console's browser test: {why}");
        return None;
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver { child, port };
    let url = format!("http://127.0.0.1:{}", driver.port);
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            // No sandbox: CI runs as root, where Chromium's sandbox refuses to start.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"],
            // The operator said yes to the console's notifications.
            "prefs": { "profile.default_content_setting_values.notifications": 1 },
        }),
    );
    // chromedriver takes a moment to listen.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(c) => return Some((driver, c)),
            Err(e) if std::time::Instant::now() > deadline => {
                panic!("chromedriver did not answer: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn css(c: &Client, sel: &str) -> fantoccini::elements::Element {
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(sel))
        .await
        .unwrap_or_else(|e| panic!("{sel}: {e}"))
}

/// The element's text; found again while a click's navigation replaces
/// the page under it (a stale element).
async fn text_of(c: &Client, sel: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match css(c, sel).await.text().await {
            Ok(t) => return t,
            Err(e) if std::time::Instant::now() > deadline => panic!("{sel}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Polls the page (without reloading it) until `sel`'s text is `want`.
async fn until_text(c: &Client, sel: &str, want: &str, secs: u64) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    let mut seen = Vec::new();
    loop {
        let t = text_of(c, sel).await;
        if seen.last() != Some(&t) {
            seen.push(t.clone());
        }
        if t == want {
            return seen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sel} never read {want:?}; it read {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One press of the Tab key, as a person would give it.
async fn tab(c: &Client) -> String {
    const TAB: char = '\u{e004}';
    let keys = KeyActions::new("keyboard".into())
        .then(KeyAction::Down { value: TAB })
        .then(KeyAction::Up { value: TAB });
    c.perform_actions(keys).await.unwrap();
    c.active_element().await.unwrap().text().await.unwrap()
}

/// Another site, on another port: one page with a form that posts to
/// `target` (with a made-up CSRF value), as a hostile page would. Answers
/// the page's URL; the server thread lives as long as the test.
fn evil_site(target: &str) -> String {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let page = format!(
        "<!DOCTYPE html><html><body><form method=post action=\"{target}\">\
         <input type=hidden name=csrf value=guess>\
         <button id=go type=submit>Win a prize</button></form></body></html>"
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    format!("http://127.0.0.1:{port}/")
}

async fn screenshot(c: &Client, name: &str) {
    screenshot_at(c, None, name).await;
}

/// A screenshot with `at` (a CSS selector) scrolled to the window's top.
async fn screenshot_at(c: &Client, at: Option<&str>, name: &str) {
    let Ok(dir) = std::env::var("HERALD_CONSOLE_SCREENSHOTS") else {
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    for (width, height, label) in [(1280, 1000, "desktop"), (390, 844, "phone")] {
        c.set_window_size(width, height).await.unwrap();
        if let Some(at) = at {
            c.execute(
                "document.querySelector(arguments[0]).scrollIntoView()",
                vec![json!(at)],
            )
            .await
            .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        let png = c.screenshot().await.unwrap();
        std::fs::write(format!("{dir}/{name}-{label}.png"), png).unwrap();
    }
    c.set_window_size(1280, 1000).await.unwrap();
}

#[actix_rt::test]
async fn in_chromium_a_reminder_by_label_fires_and_its_run_page_follows_it_live() {
    let t0 = std::time::Instant::now();
    let Some((_driver, c)) = browser().await else {
        return;
    };
    eprintln!("browser up after {:?}", t0.elapsed());
    // WhatsApp accounts pair against the fake WhatsApp Web server (started
    // off this runtime: it blocks on one of its own).
    let fake = std::thread::spawn(crate::api::fake_whatsapp::FakeWhatsApp::start)
        .join()
        .unwrap();
    let app = spawn_app_with(&[
        ("HERALD_CONTROL__TOKEN", TOKEN),
        ("HERALD_WHATSAPP__SERVER_URL", &fake.url()),
        ("HERALD_WHATSAPP__VERSION", "2.3000.1027000000"),
        // Simulated members vote on a poll 12 s after it reaches them.
        ("HERALD_SIMULATOR__VOTE_AFTER_SECS", "12"),
    ])
    .await;
    let base = app.base.clone();

    // Sign in: a wrong token first.
    c.goto(&format!("{base}/")).await.unwrap();
    css(&c, "#token").await.send_keys("not-it").await.unwrap();
    css(&c, "form button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    assert!(text_of(&c, ".error")
        .await
        .contains("not this daemon's token"));
    screenshot(&c, "sign-in").await;
    css(&c, "#token").await.send_keys(TOKEN).await.unwrap();
    css(&c, "form button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    until_text(&c, "main h1", "Overview", 10).await;
    // The keyboard: first the way past the navigation, then the sections.
    assert_eq!(tab(&c).await, "Skip to content");
    assert_eq!(tab(&c).await, "Overview");
    assert_eq!(tab(&c).await, "Accounts");

    // A simulated account through its form; label four of its groups.
    c.goto(&format!("{base}/accounts")).await.unwrap();
    css(&c, "#acc-id").await.send_keys("sales-1").await.unwrap();
    css(&c, "form[action='/accounts'] button")
        .await
        .click()
        .await
        .unwrap();
    until_text(&c, "main h1", "Account sales-1", 10).await;
    for i in [3, 4, 7, 9] {
        let r = app
            .put(
                &format!("/v1/accounts/sales-1/groups/{}/labels", group(i)),
                json!({"labels": ["east"]}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }

    // The reminder form: a bad window first, refused beside its field.
    c.goto(&format!("{base}/reminders/new")).await.unwrap();
    css(&c, "#title")
        .await
        .send_keys("East standup")
        .await
        .unwrap();
    css(&c, "#text")
        .await
        .send_keys("Standup at 10")
        .await
        .unwrap();
    css(&c, "input[name=kind][value=cron]")
        .await
        .click()
        .await
        .unwrap();
    css(&c, "#cron")
        .await
        .send_keys("0 9 * * 1-5")
        .await
        .unwrap();
    let start = css(&c, "#start_hour").await;
    start.clear().await.unwrap();
    start.send_keys("0").await.unwrap();
    let end = css(&c, "#end_hour").await;
    end.clear().await.unwrap();
    end.send_keys("0").await.unwrap();
    css(&c, "input[name=labels][value=east]")
        .await
        .click()
        .await
        .unwrap();
    // A picture, uploaded by the page's script when chosen.
    let png = app.data_dir.path().join("poster.png");
    std::fs::write(&png, tiny_png()).unwrap();
    css(&c, "#picture")
        .await
        .send_keys(png.to_str().unwrap())
        .await
        .unwrap();
    css(&c, "#picture-state[data-ready=true]").await;
    css(&c, "#reminder-form .actions > button:not([name=preview])")
        .await
        .click()
        .await
        .unwrap();
    let note = text_of(&c, "#err-window").await;
    assert!(note.contains("window"), "{note}");
    assert_eq!(
        app.get("/v1/reminders").await.json["items"],
        json!([]),
        "nothing stored"
    );
    screenshot(&c, "reminder-form-refused").await;

    // Fixed: all day.
    let end = css(&c, "#end_hour").await;
    end.clear().await.unwrap();
    end.send_keys("24").await.unwrap();
    // The refused form kept the choices; the picture id came back with it.
    assert_eq!(
        css(&c, "input[name=labels][value=east]")
            .await
            .prop("checked")
            .await
            .unwrap()
            .as_deref(),
        Some("true")
    );
    css(&c, "#reminder-form .actions > button:not([name=preview])")
        .await
        .click()
        .await
        .unwrap();
    until_text(&c, "main h1", "East standup", 10).await;
    let forecast = text_of(&c, "#forecast-text").await;
    assert!(!forecast.is_empty());
    screenshot(&c, "reminder").await;

    // Fire it, and watch the run page count up without reloading.
    css(&c, "form[action$='/fire'] button")
        .await
        .click()
        .await
        .unwrap();
    css(&c, "#run[data-run]").await;
    eprintln!("run page open after {:?}", t0.elapsed());
    c.execute("window.__same_page = true;", vec![])
        .await
        .unwrap();
    let seen = until_text(&c, "#run-delivered", "4 of 4 delivered", 60).await;
    let notice = text_of(&c, "#notices .notice").await;
    assert!(
        notice.contains("ended")
            && notice.contains("success")
            && notice.contains("4 of 4 delivered"),
        "{notice}"
    );
    // The groups' table follows at the end, still without a reload.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while text_of(&c, "#targets").await.contains("pending") {
        assert!(
            std::time::Instant::now() < deadline,
            "the groups stayed pending"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(text_of(&c, "#targets").await.matches("sent").count(), 4);
    let same = c
        .execute("return window.__same_page === true;", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!(true), "the page was not reloaded");
    eprintln!(
        "run page read, in turn: {seen:?}; done after {:?}",
        t0.elapsed()
    );
    let run = app.get("/v1/runs?limit=1").await.json["items"][0].clone();
    eprintln!("the run: {run}");
    // No request of the page waited on a connection: the streams of the
    // pages visited before had let theirs go (a browser keeps six per host).
    let slow = c
        .execute(
            "return performance.getEntriesByType('resource')\
               .filter(e => e.responseEnd - e.startTime > 5000).map(e => e.name);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(slow, json!([]), "requests stalled");
    assert!(
        seen.len() >= 2,
        "the count moved while the page was open: {seen:?}"
    );
    assert_eq!(run["status"], "success");
    assert_eq!(run["counts"]["sent"], 4);
    screenshot(&c, "run").await;

    // A poll's answers come in while its page is open (the simulator's
    // members vote 12 s after the send): the chart follows, no reload.
    // (Named to sort after the account the reminder form picks first.)
    app.add_account("vote-1").await;
    let mut body = reminder_body("vote-1", &(1..=4).map(group).collect::<Vec<_>>());
    body["parts"] = json!([{"kind": "poll", "question": "Who drives on Saturday?",
                            "options": ["Me", "Not me", "Maybe"], "multiple": false}]);
    let poll = app.create_reminder(body).await;
    let poll_run = app.fire(&poll["id"]).await;
    // Opened once the run has begun (its polls are known from then on).
    app.wait_run(poll_run, 30, |r| r["counts"]["sent"].as_u64() >= Some(1))
        .await;
    c.goto(&format!("{base}/runs/{poll_run}")).await.unwrap();
    css(&c, "#poll-0 svg").await;
    c.execute("window.__same_page = true;", vec![])
        .await
        .unwrap();
    let voters = |caption: &str| -> u64 {
        let (_, tail) = caption.split_once(": ").unwrap_or(("", caption));
        tail.split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let first = text_of(&c, "#poll-0-caption").await;
    assert_eq!(voters(&first), 0, "votes come 12 s after the send: {first}");
    let table = text_of(&c, "#poll-groups").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    let caption = loop {
        let t = text_of(&c, "#poll-0-caption").await;
        // The bars and the groups' counts both follow.
        if voters(&t) > 0 && text_of(&c, "#poll-groups").await != table {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no votes on the page: {t}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let same = c
        .execute("return window.__same_page === true;", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!(true), "the page was not reloaded");
    let answer = app.get(&format!("/v1/runs/{poll_run}/poll")).await.json;
    assert!(
        voters(&caption) <= answer["polls"][0]["voters"].as_u64().unwrap(),
        "{caption} / {answer}"
    );
    screenshot_at(&c, Some("#polls"), "run-poll").await;

    // Stop a run mid-way from its page: a slow one, 30 groups at 2 a
    // minute, is still sending when the button is pressed.
    app.add_account_with("slow-1", json!({"max_per_minute": 2}))
        .await;
    let slow = app
        .create_reminder(reminder_body(
            "slow-1",
            &(0..30).map(group).collect::<Vec<_>>(),
        ))
        .await;
    let slow_id = slow["id"].as_i64().unwrap();
    let slow_run = app.fire(&slow["id"]).await;
    // A group sent first, so its chart has a bar (2 a minute are spread
    // over the minute, not sent at once).
    app.wait_run(slow_run, 60, |r| {
        r["status"] == "running" && r["counts"]["sent"].as_u64() >= Some(1)
    })
    .await;
    c.goto(&format!("{base}/runs/{slow_run}")).await.unwrap();
    css(&c, "form[action$='/stop'] button")
        .await
        .click()
        .await
        .unwrap();
    until_text(&c, "#run-status", "cancelled", 20).await;
    let stopped = app.get(&format!("/v1/runs/{slow_run}")).await.json;
    assert_eq!(stopped["status"], "cancelled", "{stopped}");
    assert!(
        stopped["counts"]["sent"].as_u64().unwrap() < 30,
        "stopped mid-way: {stopped}"
    );
    screenshot(&c, "run-stopped").await;
    // Its charts, drawn when the page loads: a run paced at its limit of 2
    // a minute, then stopped.
    c.goto(&format!("{base}/runs/{slow_run}")).await.unwrap();
    css(&c, "#chart-pace svg").await;
    css(&c, "#chart-reach svg").await;
    let caption = text_of(&c, "#chart-pace-caption").await;
    assert!(
        caption.contains("against the account's limit of 2 a minute"),
        "{caption}"
    );
    screenshot_at(&c, Some("#over-time"), "run-charts").await;

    // A page on another site posts a form at the console: the browser
    // sends no session cookie with it (SameSite=Strict) and its Origin is
    // not the console's, so nothing fires.
    let runs_before = app.get("/v1/runs?limit=100").await.json["items"]
        .as_array()
        .unwrap()
        .len();
    let evil = evil_site(&format!("{base}/reminders/{slow_id}/fire"));
    c.goto(&evil).await.unwrap();
    css(&c, "#go").await.click().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let runs_after = app.get("/v1/runs?limit=100").await.json["items"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(runs_after, runs_before, "the cross-site post fired nothing");
    assert!(
        !c.current_url().await.unwrap().as_str().contains("/runs/"),
        "no run page was reached"
    );

    // Notifications: a run that ends short is announced by the browser
    // (Chromium granted the permission), not only in an open page.
    c.goto(&format!("{base}/")).await.unwrap();
    until_text(&c, "main h1", "Overview", 10).await;
    let permission = c
        .execute("return Notification.permission;", vec![])
        .await
        .unwrap();
    assert_eq!(permission, json!("granted"));
    // Record each notification on its way to the real one.
    c.execute(
        r#"const Real = window.Notification; window.__shown = [];
           window.Notification = function (title, o) {
             window.__shown.push(title + " | " + ((o && o.body) || ""));
             return new Real(title, o);
           };
           Object.defineProperty(window.Notification, "permission", { get: () => Real.permission });"#,
        vec![],
    )
    .await
    .unwrap();
    let sales = herald_actors::domain::AccountId::parse("sales-1").unwrap();
    app.state.simulator.set_group_access(
        &sales,
        &herald_actors::simulator::Simulator::numbered_group(2),
        herald_actors::simulator::GroupAccess::NotParticipant,
    );
    let short = app
        .create_reminder(reminder_body("sales-1", &[group(1), group(2)]))
        .await;
    let short_run = app.fire(&short["id"]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let shown = loop {
        let shown = c.execute("return window.__shown;", vec![]).await.unwrap();
        if shown.as_array().is_some_and(|a| !a.is_empty()) {
            break shown;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no notification; the run: {}",
            app.get(&format!("/v1/runs/{short_run}")).await.text
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        shown,
        json!([format!(
            "Standup · run {short_run} ended partial | 1 of 2 delivered"
        )])
    );

    // A one-shot time that happens twice: the form picks the second.
    c.goto(&format!("{base}/reminders/new")).await.unwrap();
    css(&c, "#title")
        .await
        .send_keys("Night shift")
        .await
        .unwrap();
    css(&c, "#text").await.send_keys("Handover").await.unwrap();
    let tz = css(&c, "#timezone").await;
    tz.clear().await.unwrap();
    tz.send_keys("Europe/London").await.unwrap();
    for (sel, v) in [("#start_hour", "0"), ("#end_hour", "24")] {
        let el = css(&c, sel).await;
        el.clear().await.unwrap();
        el.send_keys(v).await.unwrap();
    }
    c.execute(
        "document.querySelector('#at').value = '2027-10-31T01:30';",
        vec![],
    )
    .await
    .unwrap();
    css(&c, "#fold option[value=later]")
        .await
        .click()
        .await
        .unwrap();
    css(&c, "input[name=labels][value=east]")
        .await
        .click()
        .await
        .unwrap();
    css(&c, "#reminder-form button[name=preview]")
        .await
        .click()
        .await
        .unwrap();
    let times = text_of(&c, "#next-times").await;
    assert!(
        times.contains("at the second (+00:00; the first is +01:00)"),
        "{times}"
    );
    screenshot(&c, "reminder-dst-choice").await;
    css(&c, "#reminder-form .actions > button:not([name=preview])")
        .await
        .click()
        .await
        .unwrap();
    until_text(&c, "main h1", "Night shift", 10).await;
    let items = app.get("/v1/reminders").await.json["items"].clone();
    let night = items
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["title"] == "Night shift")
        .expect("saved")
        .clone();
    assert_eq!(
        night["schedule"],
        json!({"at": "2027-10-31T01:30:00", "fold": "later"})
    );

    // The pair page's phone form: a number WhatsApp cannot take is refused
    // beside its rule, before anything dials out.
    let r = app
        .post("/v1/accounts", json!({"id": "wa-1", "kind": "whatsapp"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    c.goto(&format!("{base}/accounts/wa-1/pair")).await.unwrap();
    css(&c, "#phone").await.send_keys("12ab").await.unwrap();
    screenshot(&c, "pair").await;
    css(&c, "#pair-by-phone button")
        .await
        .click()
        .await
        .unwrap();
    let refused = text_of(&c, "main").await;
    assert!(
        refused.contains("phone") && refused.contains("digits"),
        "{refused}"
    );
    // A number it can take: the real client asks WhatsApp (the fake
    // server) for a pair code, the page shows it, the phone's user types
    // it, and the page follows the account to paired.
    c.goto(&format!("{base}/accounts/wa-1/pair")).await.unwrap();
    css(&c, "#phone")
        .await
        .send_keys("+1 555 000 1111")
        .await
        .unwrap();
    css(&c, "#pair-by-phone button")
        .await
        .click()
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let code = loop {
        let shown = match c.find(Locator::Css("#pair-code")).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if let Some(code) = shown.strip_prefix("Pair code: ") {
            break code.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no pair code shown: {:?}",
            text_of(&c, "main").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        code.chars().filter(char::is_ascii_alphanumeric).count(),
        8,
        "{code}"
    );
    screenshot(&c, "pair-code").await;
    fake.enter_pair_code(&code).unwrap();
    until_text(&c, "#pair-state", "Pairing: paired", 30).await;
    assert!(
        !fake.linked().is_empty(),
        "the fake phone linked Herald's device"
    );

    // What WhatsApp says of an account, as the store keeps it: a time-lock
    // that holds and a quota at its second warning, on the account's page
    // and among the overview's accounts needing attention.
    {
        use herald_actors::domain::*;
        let now = chrono::Utc::now();
        let until = now + chrono::Duration::hours(2);
        let standing = Standing {
            timelock: locked_until(until, now),
            quota: quota_at(QuotaStatus::SecondWarning, 46, 50, now),
        };
        let sales = AccountId::parse("sales-1").unwrap();
        app.state
            .store
            .set_account_standing(&sales, None, &standing, None)
            .await
            .unwrap();
        c.goto(&format!("{base}/accounts/sales-1")).await.unwrap();
        let lock = text_of(&c, "#standing-timelock").await;
        assert!(lock.contains("time-locked until"), "{lock}");
        let quota = text_of(&c, "#standing-quota").await;
        assert!(quota.contains("second warning, 46 of 50 used"), "{quota}");
        screenshot(&c, "account-standing").await;
        css(&c, "#chart-days svg").await;
        screenshot_at(&c, Some("#days"), "account-days").await;
        c.goto(&format!("{base}/")).await.unwrap();
        let attention = text_of(&c, "#attention ~ ul").await;
        assert!(
            attention.contains("time-locked by WhatsApp until")
                && attention.contains("new-chat quota second warning (46 of 50 used)"),
            "{attention}"
        );
        screenshot(&c, "overview-standing").await;
    }

    // A run that ends partial at its window: 8 groups at 4 a minute, whose
    // window closes 35 s after it resumes. The reminder's window is whole
    // hours; the run is paused at once and its close brought forward in the
    // store, so the test waits seconds, not for an hour to turn. The sends,
    // the close and the skips are the engine's own.
    app.add_account_with("late-1", json!({"max_per_minute": 4}))
        .await;
    let late = app
        .create_reminder(reminder_body(
            "late-1",
            &(0..8).map(group).collect::<Vec<_>>(),
        ))
        .await;
    let late_run = app.fire(&late["id"]).await;
    let paused = app.post_empty(&format!("/v1/runs/{late_run}/pause")).await;
    assert_eq!(paused.status, 202, "{}", paused.text);
    app.wait_run(late_run, 20, |r| r["status"] == "paused")
        .await;
    let close = chrono::Utc::now() + chrono::Duration::seconds(35);
    app.state
        .store
        .update_run(
            herald_actors::domain::RunId(late_run),
            &herald_actors::ports::RunUpdate {
                window_end_at: Some(close),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let resumed = app.post_empty(&format!("/v1/runs/{late_run}/resume")).await;
    assert_eq!(resumed.status, 202, "{}", resumed.text);
    let ended = app
        .wait_run(late_run, 90, |r| r["finished_at"].is_string())
        .await;
    assert_eq!(ended["status"], "partial", "{ended}");
    let sent = ended["counts"]["sent"].as_u64().unwrap();
    assert!((1..8).contains(&sent), "{ended}");
    c.goto(&format!("{base}/runs/{late_run}")).await.unwrap();
    let caption = text_of(&c, "#chart-pace-caption").await;
    assert!(caption.contains("the window closed at"), "{caption}");
    screenshot(&c, "run-partial").await;
    screenshot_at(&c, Some("#over-time"), "run-partial-charts").await;

    // An account whose breaker opens: three rate limits in a row cool it
    // down; its page says so, and its 30 days draw the cool-down as a band.
    app.add_account("flaky-1").await;
    let flaky = herald_actors::domain::AccountId::parse("flaky-1").unwrap();
    app.state.simulator.fail_next(
        &flaky,
        3,
        herald_actors::ports::GatewayError::RateLimited {
            retry_after: Some(Duration::from_millis(200)),
        },
    );
    let rem = app
        .create_reminder(reminder_body("flaky-1", &[group(0)]))
        .await;
    app.fire(&rem["id"]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let a = app.get("/v1/accounts/flaky-1").await.json;
        if a["state"] == "cooling_down" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no cool-down: {a}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let h = app.get("/v1/accounts/flaky-1/history").await.json;
    let band = h["states"].as_array().unwrap().last().cloned();
    assert_eq!(
        band.as_ref().map(|b| &b["state"]),
        Some(&json!("cooling_down")),
        "{h}"
    );
    c.goto(&format!("{base}/accounts/flaky-1")).await.unwrap();
    css(&c, "#chart-days svg").await;
    let caption = text_of(&c, "#chart-days-caption").await;
    assert!(caption.contains("cooling down"), "{caption}");
    screenshot(&c, "account-breaker").await;
    for (path, name) in [
        ("/", "overview"),
        ("/accounts", "accounts"),
        ("/reminders", "reminders"),
        ("/runs", "runs"),
        ("/users", "users"),
        ("/audit", "audit"),
    ] {
        c.goto(&format!("{base}{path}")).await.unwrap();
        css(&c, "main h1").await;
        screenshot(&c, name).await;
    }
    c.close().await.unwrap();
    eprintln!("browser closed after {:?}", t0.elapsed());
}
