//! `GET /openapi.json`: the OpenAPI 3.1 document of the control port,
//! generated from the code that serves it.
//!
//! Paths, operations, parameters, request bodies, statuses and every
//! request constraint come from the route table (`v1_api!` in `mod.rs`)
//! and the rule tables beside the handlers (`spec`), which the validator
//! reads too. The answers' schemas are data here; the tests and
//! schemathesis check real answers against them.

use super::errors::Kind;
use super::routes::{all_routes, Route};
use super::spec::{Body, Param};
use crate::settings::Settings;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use herald_actors::domain::{
    webhook_type_names, AccountState, GatewayKind, ReminderState, Role, RunStatus, TargetStatus,
};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

pub async fn serve(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(document(&state.settings))
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn or_null(schema: Value) -> Value {
    json!({ "oneOf": [schema, { "type": "null" }] })
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
        out.extend([401, 429]);
    }
    if !op.path.is_empty() {
        out.insert(404);
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

fn operation(route: &Route) -> Value {
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
            if !ok.schema.is_empty() {
                r["content"] = json!({ ok.media: { "schema": schema_ref(ok.schema) } });
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
pub fn document(settings: &Settings) -> Value {
    let max_json = settings.control.max_json_bytes;
    let mut paths = Map::new();
    let mut components: BTreeMap<String, Value> = BTreeMap::new();
    for route in all_routes() {
        let item = paths.entry(route.path).or_insert_with(|| json!({}));
        item[route.method.to_lowercase()] = operation(route);
        if let Body::Json(shape) | Body::OptionalJson(shape) = route.op.body {
            shape.components(&mut components);
        }
    }
    let mut schemas = response_schemas();
    for (name, schema) in components {
        schemas[name] = schema;
    }

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
            "content": { "application/problem+json": { "schema": schema_ref("Problem") } },
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
            "description": format!("Administer Herald: accounts, media, reminders, runs and live events. JSON in and out; JSON bodies up to {max_json} bytes (`control.max_json_bytes`) with Content-Type application/json; unknown fields and query parameters are refused. Every rejection is `application/problem+json` with `type`, `title`, `status`, `detail`, and for a bad field `field` and `rule`. Every /v1 route needs `Authorization: Bearer <token>` (the generated token is in <data_dir>/control.token). Lists are paged by key: pass the page's `next_…` value back. Requests beyond `control.rate_limit_per_second` per client are answered 429 with Retry-After."),
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

/// The answers' schemas. Requests are generated from the rule tables;
/// answers are checked against these by the tests and by schemathesis
/// (`response_schema_conformance`) on every operation.
fn response_schemas() -> Value {
    let ts = json!({ "type": "string", "format": "date-time" });
    let ts_or_null = json!({ "type": ["string", "null"], "format": "date-time" });
    let mut all = json!({
        "Problem": {
            "type": "object",
            "required": ["type", "title", "status", "detail"],
            "properties": {
                "type": { "type": "string", "enum": Kind::ALL.iter().map(|k| k.type_uri()).collect::<Vec<_>>() },
                "title": { "type": "string" },
                "status": { "type": "integer" },
                "detail": { "type": "string" },
                "field": { "type": "string", "description": "The refused field, as a path: `window.end_hour`, `targets[3]`" },
                "rule": { "type": "string", "description": "What the field must be, e.g. \"must be 0–24\"" },
                "offenders": {
                    "type": "array",
                    "description": "An import's entries that name no group the account is in, or several (every one; `rule` lists the first 50)",
                    "items": {
                        "type": "object",
                        "required": ["index", "entry", "matches"],
                        "properties": {
                            "index": { "type": "integer", "minimum": 0 },
                            "entry": { "type": "string" },
                            "matches": { "type": "integer", "minimum": 0, "description": "Groups the name matches: 0, or 2 and more" },
                        },
                    },
                },
            },
            "examples": [{
                "type": "urn:herald:problem:validation", "title": "Invalid request", "status": 422,
                "detail": "window.end_hour: must be 0–24", "field": "window.end_hour", "rule": "must be 0–24",
            }],
        },
        "Pairing": {
            "type": "object",
            "required": ["account_id", "state", "since"],
            "properties": {
                "account_id": { "type": "string" },
                "state": { "type": "string", "enum": ["idle", "connecting", "waiting_qr", "waiting_pair_code", "paired", "failed", "logged_out"] },
                "since": ts,
                "phone": { "type": "string" },
                "qr": { "type": "string", "description": "The QR payload (waiting_qr)" },
                "qr_text": { "type": "string", "description": "The QR drawn for a terminal (waiting_qr)" },
                "qr_png": { "type": "string", "description": "Where the PNG of the QR is served (waiting_qr)" },
                "pair_code": { "type": "string", "description": "The code to type on the phone (waiting_pair_code)" },
                "expires_at": ts,
                "jid": { "type": "string" },
                "reason": { "type": "string" },
            },
        },
        "AccountLimits": {
            "type": "object",
            "required": ["max_per_minute", "group_concurrency", "daily_cap", "hourly_cap", "timezone", "new_number"],
            "properties": {
                "max_per_minute": { "type": ["integer", "null"] },
                "group_concurrency": { "type": ["integer", "null"] },
                "daily_cap": { "type": ["integer", "null"] },
                "hourly_cap": { "type": ["integer", "null"] },
                "timezone": { "type": ["string", "null"] },
                "new_number": { "type": "boolean", "description": "Held to the warm-up ramp" },
            },
        },
        "Account": {
            "type": "object",
            "examples": [{
                "id": "sales-1", "name": "Sales line 1", "kind": "simulator", "state": "connected",
                "state_reason": null,
                "limits": { "max_per_minute": 20, "group_concurrency": null, "daily_cap": 500, "hourly_cap": null, "timezone": "Asia/Kuala_Lumpur", "new_number": false },
                "effective_limits": { "max_per_minute": 20, "group_concurrency": 3 },
                "created_at": "2026-11-23T04:00:00Z",
            }],
            "required": ["id", "name", "kind", "state", "state_reason", "limits", "effective_limits", "created_at"],
            "properties": {
                "id": { "type": "string" },
                "name": { "type": "string" },
                "kind": { "type": "string", "enum": GatewayKind::NAMES },
                "state": { "type": "string", "enum": AccountState::NAMES },
                "state_reason": { "type": ["string", "null"] },
                "state_until": { "type": ["string", "null"], "format": "date-time", "description": "When a temporary ban or a cool-down ends by itself: the account's queue resumes then" },
                "limits": schema_ref("AccountLimits"),
                "effective_limits": {
                    "type": "object",
                    "required": ["max_per_minute", "group_concurrency"],
                    "properties": {
                        "max_per_minute": { "type": "integer" },
                        "group_concurrency": { "type": "integer" },
                    },
                },
                "notice": { "type": "string", "description": "Present on WhatsApp accounts while they wait to be paired: how to pair them" },
                "created_at": ts,
                "incident_at": { "type": ["string", "null"], "format": "date-time", "description": "The last account-level signal (rate limit, lock, ban); the warm-up ramp restarts from it" },
            },
        },
        "AccountSnapshot": {
            "type": "object",
            "required": ["account_id", "queue_depth", "queued", "current_run", "paused", "per_minute", "tokens", "slowed", "halted", "cached_uploads", "amending"],
            "properties": {
                "account_id": { "type": "string" },
                "queue_depth": { "type": "integer" },
                "queued": { "type": "array", "items": { "type": "integer" } },
                "current_run": { "type": ["integer", "null"] },
                "paused": { "type": "boolean" },
                "per_minute": { "type": "integer", "description": "The bucket's current rate (lower while slowed after a rate limit)" },
                "tokens": { "type": "number" },
                "slowed": { "type": "boolean" },
                "halted": { "type": ["string", "null"], "description": "Why the account's queue is stopped" },
                "cached_uploads": { "type": "integer" },
                "amending": { "type": ["integer", "null"], "description": "The recall or edit under way (its amendment id)" },
            },
        },
        "AccountDetail": {
            "allOf": [schema_ref("Account"), {
                "type": "object",
                "required": ["live"],
                "properties": { "live": or_null(schema_ref("AccountSnapshot")) },
            }],
        },
        "Media": {
            "type": "object",
            "required": ["id", "mime", "size", "filename", "created_at"],
            "properties": {
                "id": { "type": "string", "pattern": "^[0-9a-f]{64}$" },
                "mime": { "type": "string", "enum": super::media::ACCEPTED },
                "size": { "type": "integer" },
                "filename": { "type": ["string", "null"] },
                "created_at": ts,
            },
        },
        "Reminder": {
            "type": "object",
            "examples": [{
                "id": 7, "state": "active", "account_id": "sales-1", "title": "Monday standup",
                "timezone": "Asia/Kuala_Lumpur", "schedule": { "cron": "0 9 * * 1" },
                "window": { "start_hour": 8, "end_hour": 18 }, "resume_next_window": false,
                "parts": [{ "kind": "text", "text": "Standup in 10 minutes" }],
                "targets": ["120363000000000001@g.us", "120363000000000002@g.us"],
                "created_at": "2026-11-23T04:00:00Z", "updated_at": "2026-11-23T04:00:00Z",
            }],
            "required": ["id", "state", "account_id", "title", "timezone", "schedule", "window", "resume_next_window", "parts", "targets", "created_at", "updated_at"],
            "properties": {
                "id": { "type": "integer" },
                "state": { "type": "string", "enum": ReminderState::NAMES },
                "account_id": { "type": "string" },
                "title": { "type": "string" },
                "timezone": { "type": "string" },
                "schedule": schema_ref("Schedule"),
                "window": schema_ref("Window"),
                "resume_next_window": { "type": "boolean" },
                "unique_texts": { "type": "boolean" },
                "parts": { "type": "array", "items": schema_ref("Part") },
                "targets": { "type": "array", "items": { "type": "string" } },
                "select": or_null(schema_ref("TargetSelector")),
                "preflight": schema_ref("Preflight"),
                "created_at": ts,
                "updated_at": ts,
            },
        },
        "ReminderDetail": {
            "allOf": [schema_ref("Reminder"), {
                "type": "object",
                "required": ["next_fires", "next_due"],
                "properties": {
                    "next_fires": { "type": "array", "items": {
                        "type": "object", "required": ["at", "local", "dst_note"],
                        "properties": { "at": ts, "local": { "type": "string", "description": "RFC 3339 in the reminder's timezone" },
                            "dst_note": { "type": ["string", "null"], "description": "What a daylight-saving change does to this time: the instant a skipped time moves to, or both offsets of a repeated time and which one fires" } } } },
                    "next_due": or_null(json!({
                        "type": "object", "required": ["occurrence", "sends_at"],
                        "properties": { "occurrence": ts, "sends_at": ts } })),
                },
            }],
        },
        "FireResult": {
            "type": "object",
            "required": ["run_id", "status", "scheduled_for"],
            "properties": {
                "run_id": { "type": "integer" },
                "status": { "type": "string", "enum": RunStatus::NAMES },
                "scheduled_for": ts,
            },
        },
        "Preview": {
            "type": "object",
            "required": ["scheduled_for", "samples", "distinct", "targets"],
            "properties": {
                "scheduled_for": ts,
                "samples": { "type": "array", "items": { "type": "object", "required": ["group", "parts"], "properties": {
                    "group": { "type": "string" },
                    "parts": { "type": "array", "items": { "type": ["string", "null"] }, "description": "Each part's text or caption; null for a picture without one" },
                } } },
                "distinct": { "type": "array", "items": { "type": "integer" }, "description": "Per part: different texts over all the groups" },
                "targets": { "type": "integer" },
            },
        },
        "Forecast": {
            "type": "object",
            "required": ["from", "start", "window_close", "groups", "parts_per_group", "messages", "per_minute", "groups_fit", "fits", "expected_finish", "text", "preflight"],
            "properties": {
                "from": { "type": "string", "enum": ["now", "next"] },
                "start": ts,
                "window_close": ts,
                "groups": { "type": "integer" },
                "parts_per_group": { "type": "integer" },
                "messages": { "type": "integer" },
                "per_minute": { "type": "integer" },
                "groups_fit": { "type": "integer" },
                "fits": { "type": "boolean" },
                "expected_finish": ts,
                "text": { "type": "string" },
                "preflight": schema_ref("Preflight"),
            },
        },
        "ResolvedGroups": {
            "type": "object",
            "required": ["targets"],
            "properties": { "targets": { "type": "array", "items": { "type": "string" } } },
        },
        "Preflight": {
            "type": "object",
            "required": ["directory_synced_at", "groups", "refused"],
            "description": "What the account's group directory says about a reminder's groups now. A never-synced directory (`directory_synced_at` null) refuses nothing and a selector picks nothing; a run fails each refused group up front with its reason instead of sending to it.",
            "properties": {
                "directory_synced_at": ts_or_null,
                "groups": { "type": "integer", "description": "The groups a run started now would have" },
                "refused": { "type": "array", "items": {
                    "type": "object", "required": ["group", "reason"],
                    "properties": { "group": { "type": "string" }, "reason": { "type": "string" } },
                } },
            },
        },
        "TargetCounts": {
            "type": "object",
            "required": ["pending", "sending", "sent", "failed", "skipped"],
            "properties": {
                "pending": { "type": "integer" }, "sending": { "type": "integer" },
                "sent": { "type": "integer" }, "failed": { "type": "integer" },
                "skipped": { "type": "integer" },
            },
        },
        "Run": {
            "type": "object",
            "examples": [{
                "id": 12, "reminder_id": 7, "account_id": "sales-1",
                "scheduled_for": "2026-11-23T01:00:00Z", "window_end_at": "2026-11-23T10:00:00Z",
                "status": "success", "forecast": "forecast: all 2 groups fit before 18:00 (Asia/Kuala_Lumpur), expected to finish at 09:00",
                "error_summary": null,
                "counts": { "pending": 0, "sending": 0, "sent": 2, "failed": 0, "skipped": 0 },
                "created_at": "2026-11-23T01:00:00Z", "started_at": "2026-11-23T01:00:00Z",
                "finished_at": "2026-11-23T01:00:03Z", "stop_requested_at": null,
            }],
            "required": ["id", "reminder_id", "account_id", "scheduled_for", "window_end_at", "status", "forecast", "error_summary", "counts", "created_at", "started_at", "finished_at", "stop_requested_at"],
            "properties": {
                "id": { "type": "integer" },
                "reminder_id": { "type": "integer" },
                "account_id": { "type": "string" },
                "scheduled_for": ts,
                "window_end_at": ts_or_null,
                "status": { "type": "string", "enum": RunStatus::NAMES },
                "forecast": { "type": ["string", "null"] },
                "error_summary": { "type": ["string", "null"], "description": "The summary, e.g. why a run ended partial" },
                "counts": schema_ref("TargetCounts"),
                "created_at": ts,
                "started_at": ts_or_null,
                "finished_at": ts_or_null,
                "stop_requested_at": { "type": ["string", "null"], "format": "date-time", "description": "When the operator stopped the run while it was sending; it ends cancelled" },
            },
        },
        "RunDetail": {
            "allOf": [schema_ref("Run"), {
                "type": "object", "required": ["delivered", "receipts", "amendment"],
                "properties": {
                    "delivered": { "type": "string", "description": "\"X of Y delivered\"" },
                    "receipts": schema_ref("RunReceipts"),
                    "amendment": or_null(schema_ref("Amendment")),
                },
            }],
        },
        "RunTarget": {
            "type": "object",
            "required": ["id", "run_id", "position", "group", "group_name", "status", "parts_sent", "message_id", "attempts", "error", "sent_at", "latency_ms", "chosen_by", "receipts"],
            "properties": {
                "id": { "type": "integer" },
                "run_id": { "type": "integer" },
                "position": { "type": "integer" },
                "group": { "type": "string" },
                "group_name": { "type": ["string", "null"], "description": "The group's name in the account's directory; null for a group it never listed" },
                "status": { "type": "string", "enum": TargetStatus::NAMES },
                "parts_sent": { "type": "integer" },
                "message_id": { "type": ["string", "null"] },
                "attempts": { "type": "integer" },
                "error": { "type": ["string", "null"] },
                "sent_at": ts_or_null,
                "latency_ms": { "type": ["integer", "null"] },
                "chosen_by": { "type": "string", "description": "How the group was chosen: `explicit`, `all`, `label:<label>` or `name:<pattern>`" },
                "receipts": schema_ref("TargetReceipts"),
            },
        },
        "ControlResult": {
            "type": "object",
            "required": ["run_id", "action", "status"],
            "properties": {
                "run_id": { "type": "integer" },
                "action": { "type": "string", "enum": ["stop", "pause", "resume", "retry"] },
                "status": { "type": "string", "enum": RunStatus::NAMES, "description": "The status right after the request; a run in flight reaches its new status shortly after" },
                "requeued": { "type": "integer", "description": "retry only: groups queued again" },
            },
        },
        "Event": {
            "type": "object",
            "required": ["id", "at", "kind", "account_id", "run_id", "data"],
            "properties": {
                "id": { "type": "integer" },
                "at": ts,
                "kind": { "type": "string" },
                "account_id": { "type": ["string", "null"] },
                "run_id": { "type": ["integer", "null"] },
                "data": { "type": "object" },
            },
        },
        "AccountPage": {
            "type": "object",
            "required": ["items", "next_after"],
            "properties": {
                "items": { "type": "array", "items": schema_ref("Account") },
                "next_after": { "type": ["string", "null"], "description": "Pass as `after` for the next page; null on the last" },
            },
        },
        "ReminderSummary": {
            "type": "object",
            "required": ["id", "state", "account_id", "title", "timezone", "schedule", "window", "resume_next_window", "parts", "targets", "created_at", "updated_at"],
            "description": "A reminder without its parts and targets, which are counted",
            "properties": {
                "id": { "type": "integer" },
                "state": { "type": "string", "enum": ReminderState::NAMES },
                "account_id": { "type": "string" },
                "title": { "type": "string" },
                "timezone": { "type": "string" },
                "schedule": schema_ref("Schedule"),
                "window": schema_ref("Window"),
                "resume_next_window": { "type": "boolean" },
                "parts": { "type": "integer", "description": "How many parts" },
                "targets": { "type": "integer", "description": "How many groups" },
                "created_at": ts,
                "updated_at": ts,
            },
        },
        "ReminderPage": {
            "type": "object",
            "required": ["items", "next_after"],
            "properties": {
                "items": { "type": "array", "items": schema_ref("ReminderSummary") },
                "next_after": { "type": ["integer", "null"], "description": "Pass as `after` for the next page; null on the last" },
            },
        },
        "RunPage": {
            "type": "object",
            "required": ["items", "next_before_id"],
            "properties": {
                "items": { "type": "array", "items": schema_ref("Run") },
                "next_before_id": { "type": ["integer", "null"] },
            },
        },
        "TargetPage": {
            "type": "object",
            "required": ["items", "next_after"],
            "properties": {
                "items": { "type": "array", "items": schema_ref("RunTarget") },
                "next_after": { "type": ["integer", "null"] },
            },
        },
        "Health": {
            "type": "object",
            "required": ["status"],
            "properties": { "status": { "type": "string", "enum": ["ok", "unavailable"] }, "error": { "type": "string" } },
        },
        "Ready": {
            "type": "object",
            "required": ["ready"],
            "properties": { "ready": { "type": "boolean" } },
        },
        "Document": { "type": "object", "description": "An OpenAPI 3.1 document" },
        "Metrics": { "type": "string", "description": "OpenMetrics text" },
        "EventStream": {
            "type": "object",
            "description": "One server-sent event: `id`, `event` (the kind) and `data`, an Event as JSON",
            "required": ["id", "event", "data"],
            "properties": {
                "id": { "type": "string", "pattern": "^[0-9]+$" },
                "event": { "type": "string" },
                "data": { "type": "string", "contentMediaType": "application/json", "contentSchema": schema_ref("Event") },
            },
        },
        "Png": { "type": "string", "format": "binary" },
    });
    // Users and the audit log, in a second literal: one would be too deep
    // for `json!`'s recursion.
    let people = json!({
        "TargetReceipts": {
            "type": "object",
            "description": "Who has the group's message and who read it, from WhatsApp's receipts: distinct participants (not devices), never more than the group's others",
            "required": ["delivered", "read", "first_receipt_at", "last_receipt_at"],
            "properties": {
                "delivered": { "type": "integer", "description": "Participants with the message on at least one device" },
                "read": { "type": "integer", "description": "Participants who read (or played) it" },
                "first_receipt_at": { "type": ["string", "null"], "format": "date-time" },
                "last_receipt_at": { "type": ["string", "null"], "format": "date-time" },
            },
        },
        "RunReceipts": {
            "type": "object",
            "description": "The run's receipts over its groups",
            "required": ["groups_delivered", "groups_read", "delivered", "read", "first_receipt_at", "last_receipt_at"],
            "properties": {
                "groups_delivered": { "type": "integer", "description": "Groups where at least one participant has the message" },
                "groups_read": { "type": "integer", "description": "Groups where at least one participant read it" },
                "delivered": { "type": "integer", "description": "Participants reached, summed over the groups" },
                "read": { "type": "integer", "description": "Participants who read it, summed over the groups" },
                "first_receipt_at": { "type": ["string", "null"], "format": "date-time" },
                "last_receipt_at": { "type": ["string", "null"], "format": "date-time" },
            },
        },
        "User": {
            "type": "object",
            "required": ["id", "name", "role", "created_at", "expires_at", "created_by"],
            "properties": {
                "id": { "type": "integer" },
                "name": { "type": "string" },
                "role": { "type": "string", "enum": Role::NAMES },
                "created_at": ts,
                "expires_at": { "type": ["string", "null"], "format": "date-time" },
                "created_by": { "type": "string" },
            },
        },
        "NewUser": {
            "type": "object",
            "required": ["id", "name", "role", "created_at", "expires_at", "created_by", "token"],
            "properties": {
                "id": { "type": "integer" },
                "name": { "type": "string" },
                "role": { "type": "string", "enum": Role::NAMES },
                "created_at": ts,
                "expires_at": { "type": ["string", "null"], "format": "date-time" },
                "created_by": { "type": "string" },
                "token": { "type": "string", "description": "The bearer token, shown this once" },
            },
        },
        "UserList": {
            "type": "object",
            "required": ["items"],
            "properties": { "items": { "type": "array", "items": schema_ref("User") } },
        },
        "AuditEntry": {
            "type": "object",
            "required": ["id", "at", "actor", "actor_id", "role", "via", "operation", "method", "path", "resource", "summary", "status", "remote", "count"],
            "properties": {
                "id": { "type": "integer" },
                "at": ts,
                "actor": { "type": "string", "description": "The user's name; `control.token` for the daemon's own token" },
                "actor_id": { "type": ["integer", "null"] },
                "role": { "type": ["string", "null"], "enum": Role::NAMES.iter().map(|r| json!(r)).chain([Value::Null]).collect::<Vec<_>>(), "description": "null for an attempt that proved no identity (a wrong token, a failed sign-in)" },
                "via": { "type": "string", "enum": ["api", "console"] },
                "operation": { "type": "string", "description": "The operation id of this document" },
                "method": { "type": "string" },
                "path": { "type": "string" },
                "resource": { "type": ["string", "null"] },
                "summary": { "type": "string", "description": "The request body, compact and cut short; secrets left out" },
                "status": { "type": "integer" },
                "remote": { "type": "string", "description": "The client's address (the one a trusted proxy names), or `unix`" },
                "count": { "type": "integer", "minimum": 1, "description": "Attempts this entry stands for: 1 for a write; failed authentications and sign-ins are counted per address and minute" },
            },
        },
        "AuditPage": {
            "type": "object",
            "required": ["items", "next_before_id"],
            "properties": {
                "items": { "type": "array", "items": schema_ref("AuditEntry") },
                "next_before_id": { "type": ["integer", "null"] },
            },
        },
    });
    let hooks = json!({
        "Webhook": {
            "type": "object",
            "required": ["id", "url", "types", "description", "enabled", "disabled_reason", "failing_since", "old_secret_until", "created_at"],
            "properties": {
                "id": { "type": "integer" },
                "url": { "type": "string" },
                "types": { "type": "array", "items": { "type": "string", "enum": webhook_type_names() } },
                "description": { "type": "string" },
                "enabled": { "type": "boolean" },
                "disabled_reason": { "type": ["string", "null"], "description": "Why Herald disabled it: its receiver failed for too long" },
                "failing_since": { "type": ["string", "null"], "format": "date-time" },
                "old_secret_until": { "type": ["string", "null"], "format": "date-time", "description": "While an earlier secret still signs beside the current one (the latest end, when several do)" },
                "created_at": { "type": "string", "format": "date-time" },
            },
        },
        "NewWebhook": {
            "allOf": [schema_ref("Webhook"), {
                "type": "object",
                "required": ["secret"],
                "properties": { "secret": { "type": "string", "description": "`whsec_…`, shown this once" } },
            }],
        },
        "WebhookList": {
            "type": "object",
            "required": ["items"],
            "properties": { "items": { "type": "array", "items": schema_ref("Webhook") } },
        },
        "Delivery": {
            "type": "object",
            "required": ["id", "webhook_id", "event_id", "type", "webhook_message_id", "status", "attempts", "next_attempt_at", "last_attempt_at", "last_status", "last_error", "created_at"],
            "properties": {
                "id": { "type": "integer" },
                "webhook_id": { "type": "integer" },
                "event_id": { "type": "integer" },
                "type": { "type": "string" },
                "webhook_message_id": { "type": "string", "description": "The `webhook-id` header: the same on every retry" },
                "status": { "type": "string", "enum": ["pending", "held", "delivered", "failed"], "description": "held: waiting while the subscription is disabled" },
                "attempts": { "type": "integer" },
                "next_attempt_at": { "type": "string", "format": "date-time" },
                "last_attempt_at": { "type": ["string", "null"], "format": "date-time" },
                "last_status": { "type": ["integer", "null"] },
                "last_error": { "type": ["string", "null"] },
                "created_at": { "type": "string", "format": "date-time" },
            },
        },
        "DeliveryPage": {
            "type": "object",
            "required": ["items", "next_before_id"],
            "properties": {
                "items": { "type": "array", "items": schema_ref("Delivery") },
                "next_before_id": { "type": ["integer", "null"] },
            },
        },
    });
    for more in [people, hooks] {
        if let (Some(all), Value::Object(more)) = (all.as_object_mut(), more) {
            all.extend(more);
        }
    }
    for more in [group_schemas(), amendment_schemas()] {
        if let (Some(map), Value::Object(more)) = (all.as_object_mut(), more) {
            map.extend(more);
        }
    }
    all
}

/// Recalls and edits of sent runs (apart: one `json!` has a recursion limit).
fn amendment_schemas() -> Value {
    let ts = json!({ "type": "string", "format": "date-time" });
    let ts_or_null = json!({ "type": ["string", "null"], "format": "date-time" });
    json!({
        "Amendment": {
            "type": "object",
            "description": "A recall (delete for everyone) or an edit of a sent run, with its progress over the groups the run sent to",
            "required": ["id", "run_id", "kind", "requested_at", "window_secs", "finished_at", "progress"],
            "properties": {
                "id": { "type": "integer" },
                "run_id": { "type": "integer" },
                "kind": { "type": "string", "enum": ["recall", "edit"] },
                "edits": { "type": "array", "description": "edit only: each part's new text (null: left as it is)", "items": { "type": ["string", "null"] } },
                "requested_at": ts,
                "window_secs": { "type": "integer", "description": "A group whose messages were sent longer ago than this was too old" },
                "finished_at": ts_or_null,
                "progress": schema_ref("AmendProgress"),
            },
        },
        "AmendProgress": {
            "type": "object",
            "description": "Groups by where they stand; `total` counts the groups the run sent at least one message to",
            "required": ["total", "done", "too_old", "failed", "sending"],
            "properties": {
                "total": { "type": "integer" },
                "done": { "type": "integer" },
                "too_old": { "type": "integer", "description": "Past WhatsApp's window when reached" },
                "failed": { "type": "integer", "description": "WhatsApp refused it for the group (the account left it)" },
                "sending": { "type": "integer", "description": "Marked before the wire, not yet after" },
            },
        },
        "AmendmentResult": {
            "type": "object",
            "required": ["run_id", "amendment"],
            "properties": {
                "run_id": { "type": "integer" },
                "amendment": schema_ref("Amendment"),
            },
        },
    })
}

/// The group directory's answers (apart: one `json!` has a recursion limit).
fn group_schemas() -> Value {
    let ts = json!({ "type": "string", "format": "date-time" });
    json!({
        "Group": {
            "type": "object",
            "examples": [{
                "account_id": "sales-1", "jid": "120363000000000042@g.us", "subject": "Clients KL",
                "participants": 87, "announce": false, "is_admin": false, "community": null,
                "can_post": true, "labels": ["clients", "kl-east"], "member": true,
                "synced_at": "2026-11-23T04:00:00Z",
            }],
            "required": ["account_id", "jid", "subject", "participants", "announce", "is_admin", "community", "can_post", "labels", "member", "synced_at"],
            "description": "A group in an account's directory, as of its last sync",
            "properties": {
                "account_id": { "type": "string" },
                "jid": { "type": "string" },
                "subject": { "type": "string", "description": "The group's name" },
                "participants": { "type": "integer", "minimum": 0 },
                "announce": { "type": "boolean", "description": "Only admins may post" },
                "is_admin": { "type": "boolean", "description": "This account is an admin of the group" },
                "community": { "type": ["string", "null"], "description": "The community the group belongs to" },
                "can_post": { "type": "boolean", "description": "This account may post: the group is open, or the account is an admin" },
                "labels": { "type": "array", "items": { "type": "string" } },
                "member": { "type": "boolean", "description": "false once a sync no longer lists it (the account left); its labels are kept" },
                "synced_at": ts,
            },
        },
        "GroupPage": {
            "type": "object",
            "required": ["items", "total", "next_after"],
            "properties": {
                "items": { "type": "array", "items": schema_ref("Group") },
                "total": { "type": "integer", "minimum": 0, "description": "Groups matching the filters, over all pages" },
                "next_after": { "type": ["string", "null"], "description": "Pass as `after` for the next page; null on the last" },
            },
        },
        "GroupSync": {
            "type": "object",
            "required": ["added", "updated", "left", "total", "synced_at"],
            "properties": {
                "added": { "type": "integer", "minimum": 0, "description": "Groups new to the directory, or back after leaving" },
                "updated": { "type": "integer", "minimum": 0, "description": "Groups whose name, size or posting rights changed" },
                "left": { "type": "integer", "minimum": 0, "description": "Groups the account is no longer in" },
                "total": { "type": "integer", "minimum": 0, "description": "Groups the account is in now" },
                "synced_at": { "type": ["string", "null"], "format": "date-time" },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn doc() -> Value {
        document(&Settings::load_from(None, &HashMap::new()).unwrap())
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
