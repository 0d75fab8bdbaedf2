use crate::api::helpers::*;
use serde_json::Value;
use std::collections::BTreeSet;

#[actix_rt::test]
async fn every_registered_route_is_documented_and_nothing_else() {
    let app = spawn_app().await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status, 200);
    let doc = r.json;
    assert_eq!(doc["openapi"], "3.1.0");
    let registered: BTreeSet<(String, String)> = herald::http::all_routes()
        .map(|r| (r.method.to_lowercase(), r.path.to_string()))
        .collect();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
        }
    }
    for route in &registered {
        assert!(
            documented.contains(route),
            "{route:?} is served but not documented"
        );
    }
    for route in &documented {
        assert!(
            registered.contains(route),
            "{route:?} is documented but not served"
        );
    }

    // And each is really answered by a handler (not the no-route fallback).
    for route in herald::http::all_routes() {
        let (method, path) = (route.method, route.path);
        if path == "/v1/events" {
            continue; // A stream: covered in events.rs.
        }
        let concrete = path.replace("{id}", "1");
        let r = app.send(method, &concrete, None, None, &[]).await;
        let detail = r.json["detail"].as_str().unwrap_or("");
        assert!(
            r.status != 405 && !detail.starts_with("no route"),
            "{method} {path}: {} {}",
            r.status,
            r.text
        );
    }
}

#[actix_rt::test]
async fn problems_match_the_documented_schema() {
    let app = spawn_app().await;
    let r = app.get("/v1/runs/999").await;
    app.assert_schema("Problem", &r.json).await;
    let r = app
        .post("/v1/reminders", serde_json::json!({"colour": 1}))
        .await;
    app.assert_schema("Problem", &r.json).await;
    assert!(matches!(r.json["field"], Value::String(_)));
}

#[actix_rt::test]
async fn every_example_in_the_document_matches_its_schema() {
    let app = spawn_app().await;
    let doc = app.get("/openapi.json").await.json;
    let mut seen = 0;
    for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
        for ex in schema["examples"].as_array().into_iter().flatten() {
            let at = format!("#/components/schemas/{name}");
            crate::api::schema::check(&doc, &serde_json::json!({ "$ref": at }), ex, name)
                .unwrap_or_else(|e| panic!("the example of {name}: {e}"));
            seen += 1;
        }
    }
    // Requests (from the rule tables) and answers both carry examples.
    for name in [
        "ReminderRequest",
        "CreateAccount",
        "Account",
        "Reminder",
        "Run",
        "Problem",
    ] {
        assert!(
            doc["components"]["schemas"][name]["examples"].is_array(),
            "{name} has no example"
        );
    }
    assert!(seen >= 6);
}
