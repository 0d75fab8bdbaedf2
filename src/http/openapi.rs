//! `GET /openapi.json`: the OpenAPI 3.1 document of the control port,
//! generated from the code that serves it.
//!
//! Paths, operations, parameters, request bodies, statuses and every
//! request constraint come from the route table (`v1_api!` in `mod.rs`)
//! and the rule tables beside the handlers (`spec`), which the validator
//! reads too. The answers' schemas are derived (schemars) from the types
//! the handlers answer with, from the same serde attributes that write
//! the JSON; the tests and schemathesis check real answers against them.

use super::errors::{Kind, Problem};
use super::routes::{all_routes, Route};
use super::spec::{Body, Param};
use crate::service::Service;
use crate::settings::ControlSettings;
use actix_web::{web, HttpResponse};
use schemars::generate::SchemaSettings;
use schemars::SchemaGenerator;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

pub async fn serve(service: web::Data<Service>) -> HttpResponse {
    HttpResponse::Ok().json(document(service.control()))
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// Schemas as JSON Schema 2020-12 (OpenAPI 3.1's dialect) of what the
/// types serialize to, each type once under `components/schemas`.
fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .for_serialize()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .with_transform(unwrap_descriptions)
        .into_generator()
}

/// A description comes from a doc comment wrapped for the source: its
/// lines joined into one, paragraphs kept.
fn unwrap_descriptions(schema: &mut schemars::Schema) {
    if let Some(Value::String(d)) = schema.get_mut("description") {
        *d = d
            .split("\n\n")
            .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("\n\n");
    }
    schemars::transform::transform_subschemas(&mut unwrap_descriptions, schema);
}

fn param(p: &Param, location: &str) -> Value {
    let mut schema = p.rule.schema();
    if let Some(d) = p.default {
        schema["default"] = d.into();
    }
    json!({ "name": p.name, "in": location, "required": location == "path",
            "description": p.description, "schema": schema })
}

/// The statuses an operation can answer, from what it declares.
fn statuses(route: &Route) -> BTreeSet<u16> {
    let op = route.op;
    let mut out: BTreeSet<u16> = op.errors.iter().copied().collect();
    out.insert(op.ok.status);
    // The Host rule applies to every route.
    out.insert(403);
    if route.path.starts_with("/v1/") {
        out.insert(401);
    }
    // Every route counts against the per-client rate limit.
    out.insert(429);
    if !op.path.is_empty() {
        // A path parameter can carry a spelling the canonical-path rule
        // refuses (`%5C`, `%2F`) before the route runs.
        out.extend([400, 404]);
    }
    if !op.query.is_empty() || !op.headers.is_empty() {
        out.insert(400);
    }
    match op.body {
        Body::None => {}
        Body::Json(_) | Body::OptionalJson(_) => out.extend([400, 413, 415, 422]),
        Body::Bytes => out.extend([400, 413, 415, 422]),
    }
    if op.if_match {
        out.extend([400, 412]);
    }
    out
}

fn operation(route: &Route, schemas: &mut SchemaGenerator) -> Value {
    let op = route.op;
    let mut params: Vec<Value> = op.path.iter().map(|p| param(p, "path")).collect();
    params.extend(op.query.iter().map(|p| param(p, "query")));
    if op.if_match {
        params.push(param(&super::etag::IF_MATCH, "header"));
    }
    params.extend(op.headers.iter().map(|p| param(p, "header")));
    let mut responses = Map::new();
    for code in statuses(route) {
        let value = if code == op.ok.status {
            let ok = &op.ok;
            let mut r = json!({ "description": ok.description });
            if let Some(schema_of) = ok.schema {
                r["content"] = json!({ ok.media: { "schema": schema_of(schemas) } });
            }
            let mut headers = Map::new();
            if ok.etag {
                headers.insert("ETag".into(), json!({
                    "description": "The record's version; send it back as `If-Match` to edit only that version",
                    "schema": { "type": "string" } }));
            }
            if ok.location {
                headers.insert("Location".into(), json!({
                    "description": "Where the created resource is", "schema": { "type": "string" } }));
            }
            if !headers.is_empty() {
                r["headers"] = headers.into();
            }
            r
        } else {
            json!({ "$ref": format!("#/components/responses/Problem{code}") })
        };
        responses.insert(code.to_string(), value);
    }
    // Each operation says the least role that may call it, as an
    // extension field for tools and in the text for people.
    let description = match route.role {
        Some(role) if op.description.is_empty() => format!("Requires the `{role}` role."),
        Some(role) => format!("Requires the `{role}` role. {}", op.description),
        None => op.description.to_owned(),
    };
    let mut o = json!({
        "operationId": op.id,
        "summary": op.summary,
        "description": description,
        "parameters": params,
        "responses": responses,
        "security": if route.path.starts_with("/v1/") { json!([{ "bearer": [] }]) } else { json!([]) },
    });
    if let Some(role) = route.role {
        o["x-required-role"] = json!(role.as_str());
    }
    match op.body {
        Body::None => {}
        Body::Json(shape) | Body::OptionalJson(shape) => {
            o["requestBody"] = json!({
                "required": matches!(op.body, Body::Json(_)),
                "content": { "application/json": { "schema": schema_ref(shape.name) } },
            });
        }
        Body::Bytes => {
            o["requestBody"] = json!({ "required": true,
                "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } });
        }
    }
    o
}

/// The whole document for these settings (limits shown are the configured ones).
pub fn document(control: &ControlSettings) -> Value {
    let max_json = control.max_json_bytes;
    let mut paths = Map::new();
    let mut answers = generator();
    for route in all_routes() {
        let item = paths.entry(route.path).or_insert_with(|| json!({}));
        item[route.method.to_lowercase()] = operation(route, &mut answers);
    }
    let problem = answers.subschema_for::<Problem>();
    let mut schemas = answers.take_definitions(true);
    add_examples(&mut schemas);
    // The shapes an answer shows as a request gives them are stated by the
    // rules that parse the request.
    schemas.extend(requests());

    let mut problem_responses = Map::new();
    for kind in Kind::ALL {
        let code = kind.status().as_u16();
        // Several kinds share a status (400, 403): the response names each.
        let mut description = format!("{} (`type` {})", kind.title(), kind.type_uri());
        if let Some(earlier) = problem_responses.get(&format!("Problem{code}")) {
            description = format!(
                "{}; or {description}",
                earlier["description"].as_str().unwrap_or("")
            );
        }
        let mut r = json!({
            "description": description,
            "content": { "application/problem+json": { "schema": problem } },
        });
        if matches!(code, 429 | 503) {
            r["headers"] = json!({ "Retry-After": {
                "description": "Seconds to wait before trying again", "schema": { "type": "string" } } });
        }
        problem_responses.insert(format!("Problem{code}"), r);
    }

    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Herald control port",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!("Administer Herald: accounts, media, reminders, runs and live events. JSON in and out; JSON bodies up to {max_json} bytes (`control.max_json_bytes`) with Content-Type application/json; unknown fields and query parameters are refused. Every rejection is `application/problem+json` with `type`, `title`, `status`, `detail`, and for a bad field `field` and `rule`. Every /v1 route needs `Authorization: Bearer <token>` (the generated token is in <data_dir>/control.token). Lists are paged by key: pass the page's `next_…` value back. Requests beyond `control.rate_limit_per_second` per client (an IPv6 client: its /64), on every route, are answered 429 with Retry-After."),
        },
        "servers": [{ "url": "/" }],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "responses": problem_responses,
            "schemas": schemas,
        },
    })
}

/// The request bodies' shapes, from the rule tables.
fn requests() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for route in all_routes() {
        if let Body::Json(shape) | Body::OptionalJson(shape) = route.op.body {
            shape.components(&mut out);
        }
    }
    out
}

/// Examples of the main answers, by schema name (here rather than on the
/// types: a type flattened into another would pass its example on, and the
/// other's would lack its own fields).
fn add_examples(schemas: &mut Map<String, Value>) {
    let examples = [
        (
            "Account",
            json!({
                "id": "sales-1", "name": "Sales line 1", "kind": "simulator", "state": "connected",
                "state_reason": null, "state_until": null,
                "limits": { "max_per_minute": 20, "group_concurrency": null, "daily_cap": 500, "hourly_cap": null, "timezone": "Asia/Kuala_Lumpur", "new_number": false },
                "effective_limits": { "max_per_minute": 20, "group_concurrency": 3 },
                "created_at": "2026-11-23T04:00:00Z", "incident_at": null,
                "standing": {
                    "timelock": { "reading": "known", "active": false, "until": null, "kind": null, "read_at": "2026-11-23T04:00:05Z" },
                    "quota": { "reading": "known", "status": "first_warning", "used": 41, "total": 50,
                               "cycle_start": "2026-11-20T00:00:00Z", "cycle_end": "2026-11-27T00:00:00Z",
                               "read_at": "2026-11-23T04:00:05Z" },
                },
            }),
        ),
        (
            "Reminder",
            json!({
                "id": 7, "state": "active", "account_id": "sales-1", "title": "Monday standup",
                "timezone": "Asia/Kuala_Lumpur", "schedule": { "cron": "0 9 * * 1" },
                "window": { "start_hour": 8, "end_hour": 18 }, "resume_next_window": false,
                "parts": [{ "kind": "text", "text": "Standup in 10 minutes" }],
                "targets": ["120363000000000001@g.us", "120363000000000002@g.us"],
                "select": null, "unique_texts": false,
                "created_at": "2026-11-23T04:00:00Z", "updated_at": "2026-11-23T04:00:00Z",
            }),
        ),
        (
            "Run",
            json!({
                "id": 12, "reminder_id": 7, "account_id": "sales-1",
                "reminder_title": "Monday standup", "account_name": "Sales line 1",
                "scheduled_for": "2026-11-23T01:00:00Z", "window_end_at": "2026-11-23T10:00:00Z",
                "status": "success", "forecast": "forecast: all 2 groups fit before 18:00 (Asia/Kuala_Lumpur), expected to finish at 09:00",
                "error_summary": null,
                "counts": { "pending": 0, "sending": 0, "sent": 2, "failed": 0, "skipped": 0 },
                "created_at": "2026-11-23T01:00:00Z", "started_at": "2026-11-23T01:00:00Z",
                "finished_at": "2026-11-23T01:00:03Z", "stop_requested_at": null,
            }),
        ),
        (
            "Group",
            json!({
                "account_id": "sales-1", "jid": "120363000000000042@g.us", "subject": "Clients KL",
                "participants": 87, "announce": false, "is_admin": false, "community": null,
                "can_post": true, "labels": ["clients", "kl-east"], "member": true,
                "synced_at": "2026-11-23T04:00:00Z",
            }),
        ),
    ];
    for (name, example) in examples {
        if let Some(schema) = schemas.get_mut(name).and_then(Value::as_object_mut) {
            schema.insert("examples".into(), json!([example]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;
    use herald_actors::domain::REQUEST_SHAPES;
    use std::collections::HashMap;

    fn doc() -> Value {
        document(&Settings::load_from(None, &HashMap::new()).unwrap().control)
    }

    #[test]
    fn every_route_and_path_parameter_is_documented() {
        let doc = doc();
        for route in super::super::all_routes() {
            let op = &doc["paths"][route.path][route.method.to_lowercase()];
            assert!(
                op.is_object(),
                "{} {} is not documented",
                route.method,
                route.path
            );
            let params = op["parameters"].as_array().unwrap();
            for seg in route.path.split('/').filter(|s| s.starts_with('{')) {
                let name = seg.trim_matches(|c| c == '{' || c == '}');
                assert!(
                    params
                        .iter()
                        .any(|p| p["in"] == "path" && p["name"] == name),
                    "{} {}: path parameter {name}",
                    route.method,
                    route.path
                );
            }
            // A path parameter can carry what the canonical-path rule
            // refuses (`%5C`): 400 is a documented answer wherever there
            // is one; and every route is rate limited.
            if route.path.contains('{') {
                assert!(
                    op["responses"]["400"].is_object(),
                    "{} {} does not list 400",
                    route.method,
                    route.path
                );
            }
            assert!(
                op["responses"]["429"].is_object(),
                "{} {}",
                route.method,
                route.path
            );
        }
    }

    #[test]
    fn every_v1_operation_shows_the_role_it_needs() {
        let doc = doc();
        for route in super::super::all_routes() {
            let op = &doc["paths"][route.path][route.method.to_lowercase()];
            let what = format!("{} {}", route.method, route.path);
            match route.role {
                Some(role) => {
                    assert_eq!(op["x-required-role"], role.as_str(), "{what}");
                    let text = op["description"].as_str().unwrap();
                    assert!(
                        text.starts_with(&format!("Requires the `{role}` role.")),
                        "{what}: {text}"
                    );
                    assert!(op["responses"]["403"].is_object(), "{what}: 403 documented");
                }
                None => {
                    assert!(!route.path.starts_with("/v1"), "{what} has no role");
                    assert!(op.get("x-required-role").is_none(), "{what}");
                }
            }
        }
    }

    /// Every answer's schema, as the document's generator derives it.
    fn derived() -> Map<String, Value> {
        let mut g = generator();
        for route in super::super::all_routes() {
            if let Some(schema_of) = route.op.ok.schema {
                schema_of(&mut g);
            }
        }
        g.subschema_for::<Problem>();
        g.take_definitions(true)
    }

    #[test]
    fn answers_share_with_requests_only_the_shapes_requests_state() {
        let (derived, requests, doc) = (derived(), requests(), doc());
        let shared: BTreeSet<&str> = derived
            .keys()
            .filter(|n| requests.contains_key(*n))
            .map(String::as_str)
            .collect();
        assert_eq!(shared, REQUEST_SHAPES.iter().copied().collect());
        for name in REQUEST_SHAPES {
            assert_eq!(
                doc["components"]["schemas"][name], requests[*name],
                "{name} is stated by the request's rules"
            );
        }
    }

    #[test]
    fn no_two_answer_types_share_a_name() {
        // The generator names a second type of a taken name `Name2`.
        let derived = derived();
        for name in derived.keys() {
            let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
            assert!(
                base == name || !derived.contains_key(base),
                "two types are both called {base}: rename one (#[schemars(rename)])"
            );
        }
        for name in [
            "Account",
            "AccountDetail",
            "Reminder",
            "ReminderDetail",
            "Run",
            "RunDetail",
            "Problem",
            "Event",
        ] {
            assert!(derived.contains_key(name), "{name} is derived");
        }
    }

    #[test]
    fn every_reference_resolves_and_every_example_is_valid() {
        let doc = doc();
        fn walk(doc: &Value, v: &Value) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        assert!(
                            doc.pointer(r.trim_start_matches('#')).is_some(),
                            "dangling {r}"
                        );
                    }
                    m.values().for_each(|x| walk(doc, x));
                }
                Value::Array(a) => a.iter().for_each(|x| walk(doc, x)),
                _ => {}
            }
        }
        walk(&doc, &doc);
        // Request examples pass the same check the server makes.
        for route in super::super::all_routes() {
            if let Body::Json(shape) | Body::OptionalJson(shape) = route.op.body {
                let ex: Value = serde_json::from_str(shape.example.expect("an example")).unwrap();
                super::super::spec::check_object(&ex, shape, "")
                    .unwrap_or_else(|e| panic!("{}: {e}", shape.name));
            }
        }
    }
}
