//! Runs by the names people use, and a run's groups as CSV: the API, the
//! console and the file a spreadsheet opens, read back by Python's `csv`
//! module (code nobody here wrote).

use crate::api::console::signed_in;
use crate::api::helpers::*;
use herald_actors::domain::AccountId;
use herald_actors::simulator::Simulator;
use serde_json::{json, Value};
use std::process::Command;

/// Names a spreadsheet trips on: a comma, quotes, a line break, and
/// letters outside Latin.
const NAMES: [&str; 3] = ["Team, East", "The \"A\" team\nKL", "Équipe 東京 · Дом"];
const TITLE: &str = "Rent, due \"Friday\"";

/// A run of `TITLE` from account "sales-1" (named "Sales line 1") to
/// groups 1 to 4, three of them named from `NAMES`, delivered.
async fn delivered_run(app: &TestApp) -> i64 {
    let r = app
        .post(
            "/v1/accounts",
            json!({"id": "sales-1", "name": "Sales line 1", "kind": "simulator"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let account = AccountId::parse("sales-1").unwrap();
    for (i, name) in NAMES.iter().enumerate() {
        let jid = Simulator::numbered_group(i + 1);
        app.state.simulator.set_group_name(&account, &jid, name);
    }
    // The directory syncs at most once a second.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let synced = app.post_empty("/v1/accounts/sales-1/groups/sync").await;
    assert_eq!(synced.status, 200, "{}", synced.text);
    let mut body = reminder_body("sales-1", &groups(4));
    body["title"] = json!(TITLE);
    let rid = app.create_reminder(body).await["id"].as_i64().unwrap();
    let fired = app.post_empty(&format!("/v1/reminders/{rid}/fire")).await;
    assert_eq!(fired.status, 202, "{}", fired.text);
    let run = fired.json["run_id"].as_i64().unwrap();
    app.wait_run(run, 30, |r| r["status"] == "success").await;
    run
}

#[actix_rt::test]
async fn runs_carry_their_reminders_title_and_accounts_name_everywhere() {
    let app = spawn_app_syncing_every_second().await;
    let run = delivered_run(&app).await;

    let listed = app.get("/v1/runs").await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    app.assert_schema("RunPage", &listed.json).await;
    let item = &listed.json["items"][0];
    assert_eq!(item["id"], run);
    assert_eq!(item["reminder_title"], TITLE);
    assert_eq!(item["account_name"], "Sales line 1");
    let one = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(one.status, 200, "{}", one.text);
    app.assert_schema("RunDetail", &one.json).await;
    assert_eq!(one.json["reminder_title"], TITLE);
    assert_eq!(one.json["account_name"], "Sales line 1");

    // The console names the run by its reminder, the id second.
    let mut b = signed_in(&app).await;
    let escaped = "Rent, due &quot;Friday&quot;";
    for path in ["/".to_owned(), "/runs".to_owned(), format!("/runs/{run}")] {
        let page = b.get(&path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.text);
        if path != "/" {
            assert!(
                page.text.contains(&format!("{escaped} · run {run}")),
                "{path} does not name the run by its reminder: {}",
                page.text
            );
            assert!(page.text.contains("Sales line 1"), "{path}: {}", page.text);
        }
    }
    let page = b.get(&format!("/runs/{run}")).await;
    assert!(
        page.text.contains(&format!("<title>{escaped} · run {run}")),
        "the page's title: {}",
        page.text
    );

    // A reminder no longer stored leaves its runs named by id.
    let archived = app
        .delete(&format!("/v1/reminders/{}", item["reminder_id"]))
        .await;
    assert!(archived.status < 300, "{}", archived.text);
    let after = app.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(after.status, 200, "{}", after.text);
    // Archiving keeps the reminder (and its title) in the store.
    assert_eq!(after.json["reminder_title"], TITLE);
}

#[actix_rt::test]
async fn a_runs_groups_download_as_csv_that_pythons_csv_module_reads_back() {
    let Some(python) = python3() else {
        eprintln!(
            "skipped: python3 is not installed (the CSV export is read back by its csv module)"
        );
        return;
    };
    let app = spawn_app_syncing_every_second().await;
    let run = delivered_run(&app).await;
    let mut b = signed_in(&app).await;
    let page = b.get(&format!("/runs/{run}")).await;
    assert!(
        page.text
            .contains(&format!("href=\"/runs/{run}/groups.csv\"")),
        "the run's page links its CSV: {}",
        page.text
    );
    // Receipts keep coming while the file is made: its counts lie between
    // what the API said just before and just after.
    let before = app.get(&format!("/v1/runs/{run}/targets?limit=500")).await;
    let csv = b.get(&format!("/runs/{run}/groups.csv")).await;
    assert_eq!(csv.status, 200, "{}", csv.text);
    assert_eq!(csv.content_type, "text/csv; charset=utf-8");
    assert!(csv.text.starts_with('\u{feff}'), "no byte-order mark");
    assert!(csv.text.contains("\r\n"), "RFC 4180 ends lines with CRLF");

    let file = app.data_dir.path().join("groups.csv");
    std::fs::write(&file, csv.text.as_bytes()).unwrap();
    let out = Command::new(python)
        .args([
            "-c",
            "import csv, json, sys\n\
             with open(sys.argv[1], encoding='utf-8-sig', newline='') as f:\n\
             \x20   print(json.dumps(list(csv.DictReader(f))))",
        ])
        .arg(&file)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();

    // Python reads what the API says of every group, field by field.
    let api = app.get(&format!("/v1/runs/{run}/targets?limit=500")).await;
    let targets = api.json["items"].as_array().unwrap();
    assert_eq!(rows.len(), targets.len());
    assert_eq!(rows.len(), 4);
    let text = |v: &Value| match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let earlier = before.json["items"].as_array().unwrap();
    for ((row, t), e) in rows.iter().zip(targets).zip(earlier) {
        assert_eq!(row["group"], t["group"]);
        assert_eq!(row["group_name"].as_str().unwrap(), text(&t["group_name"]));
        assert_eq!(row["status"], "sent");
        assert_eq!(row["position"].as_str().unwrap(), text(&t["position"]));
        assert_eq!(row["sent_at"].as_str().unwrap(), text(&t["sent_at"]));
        let reached: u64 = row["reached"].as_str().unwrap().parse().unwrap();
        let (low, high) = (&e["receipts"]["delivered"], &t["receipts"]["delivered"]);
        assert!(
            (low.as_u64().unwrap()..=high.as_u64().unwrap()).contains(&reached),
            "reached {reached}, the API said {low} then {high}"
        );
        assert_eq!(row["error"], "");
    }
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["group_name"].as_str().unwrap())
        .collect();
    for name in NAMES {
        assert!(
            names.contains(&name),
            "{name:?} did not round-trip: {names:?}"
        );
    }
}

/// Python 3, where the machine has it.
fn python3() -> Option<&'static str> {
    Command::new("python3")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "python3")
}
