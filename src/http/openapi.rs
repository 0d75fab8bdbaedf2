//! `GET /openapi.json`: the OpenAPI 3.1 document of the control port.
//!
//! Written by hand as JSON, with limits and enums taken from the code that
//! enforces them. Tests keep it honest: every registered route must be
//! documented (tests/api/openapi.rs), request schemas must list exactly the
//! fields the server's shape tables accept (below), and the tests validate
//! real answers against the response schemas.

use super::accounts::{
    CreateAccount, PatchAccount, DAILY_CAP, GROUP_CONCURRENCY, MAX_NAME_CHARS, PAIRING_NOTICE,
    PER_MINUTE,
};
use super::errors::Kind;
use super::extract::{Field, Shape, Ty};
use super::media::{ACCEPTED, MAX_FILENAME_CHARS};
use super::{events, runs};
use crate::settings::Settings;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use herald_actors::domain::{
    AccountState, GatewayKind, ReminderRequest, ReminderState, RunStatus, TargetStatus,
    MAX_CAPTION_CHARS, MAX_PARTS, MAX_TARGETS, MAX_TEXT_CHARS, MAX_TITLE_CHARS,
};
use serde_json::{json, Map, Value};

pub async fn serve(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(document(&state.settings))
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn or_null(schema: Value) -> Value {
    json!({ "oneOf": [schema, { "type": "null" }] })
}

fn names<T: ToString>(all: &[T]) -> Vec<String> {
    all.iter().map(ToString::to_string).collect()
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

fn answer(description: &str, schema: Value) -> Value {
    json!({ "description": description, "content": json_content(schema) })
}

fn path_id(description: &str) -> Value {
    json!({ "name": "id", "in": "path", "required": true, "description": description,
            "schema": { "type": "string" } })
}

fn query(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description,
            "schema": schema })
}

/// One operation: `ok` is (status, response), `errors` the problem statuses
/// it can answer besides 401 (added to every `/v1` operation).
fn op(
    summary: &str,
    description: &str,
    params: Value,
    body: Option<Value>,
    ok: (u16, Value),
    errors: &[u16],
) -> Value {
    let mut responses = Map::new();
    responses.insert(ok.0.to_string(), ok.1);
    for code in errors {
        responses.insert(
            code.to_string(),
            json!({ "$ref": format!("#/components/responses/Problem{code}") }),
        );
    }
    let mut o = json!({
        "summary": summary,
        "description": description,
        "parameters": params,
        "responses": responses,
    });
    if let Some(b) = body {
        o["requestBody"] = b;
    }
    o
}

/// A 200 that carries the record's `ETag`, for `If-Match` on edits.
fn with_etag(mut response: Value) -> Value {
    response["headers"] = json!({ "ETag": {
        "description": "The record's version; send it back as `If-Match` to edit only that version",
        "schema": { "type": "string" },
    }});
    response
}

fn json_body(schema: &str) -> Option<Value> {
    Some(json!({ "required": true, "content": json_content(schema_ref(schema)) }))
}

/// The whole document for these settings (limits shown are the configured ones).
pub fn document(settings: &Settings) -> Value {
    let max_json = settings.control.max_json_bytes;
    let max_media = settings.media.max_bytes;
    let account_id = path_id("Account id");
    let reminder_id = path_id("Reminder id");
    let run_id = path_id("Run id");
    let if_match = json!({ "name": "If-Match", "in": "header", "required": false,
        "description": "The `ETag` of the version you read: the edit applies only while it is current (else 412). `*` matches any version.",
        "schema": { "type": "string" } });
    let run_status = json!({ "type": "string", "enum": names(RunStatus::ALL) });
    let target_status = json!({ "type": "string", "enum": names(TargetStatus::ALL) });

    let mut paths = json!({
        "/healthz": { "get": op("Liveness", "The process answers and the database answers.",
            json!([]), None, (200, answer("Alive", json!({"type": "object"}))), &[503]) },
        "/readyz": { "get": op("Readiness", "Started and not draining (503 during shutdown).",
            json!([]), None, (200, answer("Ready", json!({"type": "object"}))), &[503]) },
        "/openapi.json": { "get": op("This document", "", json!([]), None,
            (200, answer("The OpenAPI document", json!({"type": "object"}))), &[]) },
        "/metrics": { "get": op("Prometheus metrics",
            "Prometheus text exposition with per-account labels. Open, like the probes.",
            json!([]), None,
            (200, json!({ "description": "Metrics", "content": { "text/plain": { "schema": { "type": "string" } } } })),
            &[]) },

        "/v1/accounts": {
            "get": op("List accounts", "Every account, ordered by id.", json!([]), None,
                (200, answer("Accounts", json!({ "type": "object", "required": ["items"],
                    "properties": { "items": { "type": "array", "items": schema_ref("Account") } } }))),
                &[]),
            "post": op("Add an account",
                &format!("A `simulator` account is created `connected` and can send at once. A `whatsapp` account is created in state `pairing`: {PAIRING_NOTICE}"),
                json!([]), json_body("CreateAccount"),
                (201, answer("Created; `Location` names it", schema_ref("Account"))),
                &[400, 409, 413, 415, 422]),
        },
        "/v1/accounts/{id}": {
            "get": op("One account with its live state",
                "The row plus the account actor's live view (`live`): queue depth, current run, tokens, rate, why it is halted. `live` is null if the actor does not answer within 2 s.",
                json!([account_id]), None, (200, with_etag(answer("The account", schema_ref("AccountDetail")))), &[404]),
            "patch": op("Change per-account limits",
                "Each field: left out = unchanged, `null` = back to the daemon's setting, a number = override. Applies to runs that start afterwards.",
                json!([account_id, if_match.clone()]), json_body("PatchAccount"),
                (200, with_etag(answer("The account", schema_ref("Account")))), &[400, 404, 412, 413, 415, 422]),
            "delete": op("Remove an account",
                "Refused (409) while it has reminders that are not archived, or runs queued or in flight. Archived reminders and their runs go with it.",
                json!([account_id]), None, (204, json!({ "description": "Removed" })), &[404, 409]),
        },
        "/v1/accounts/{id}/disable": { "post": op("Disable an account",
            "State `disabled`: its queue stops; runs wait until it is enabled.",
            json!([account_id]), None, (200, answer("The account", schema_ref("Account"))), &[404]) },
        "/v1/accounts/{id}/enable": { "post": op("Enable an account",
            "A simulator account becomes `connected`. A WhatsApp account goes back to `pairing` (this build cannot pair, so it is never marked connected).",
            json!([account_id]), None, (200, answer("The account", schema_ref("Account"))), &[404]) },

        "/v1/accounts/{id}/pair": {
            "post": op("Start pairing a WhatsApp account",
                "Body optional: none or `{}` pairs by QR code; `{\"phone\": \"+60…\"}` asks for a pair code to type on that phone. Answers the pairing state once WhatsApp has answered (at most the gateway's connect timeout). 409 if the account is already paired or is not a WhatsApp account; 503 if WhatsApp cannot be reached; 404 in a build without the `whatsapp` feature.",
                json!([account_id]),
                Some(json!({ "required": false, "content": json_content(schema_ref("PairRequest")) })),
                (200, answer("The pairing state", schema_ref("Pairing"))), &[400, 404, 409, 422, 503]),
            "get": op("Pairing state", "With the QR as terminal text while one waits to be scanned.",
                json!([account_id]), None, (200, answer("The pairing state", schema_ref("Pairing"))), &[404, 409]),
        },
        "/v1/accounts/{id}/pair/qr.png": { "get": op("The pairing QR as PNG",
            "404 when no QR is waiting to be scanned.",
            json!([account_id]), None,
            (200, json!({ "description": "The QR code", "content": { "image/png": { "schema": { "type": "string", "format": "binary" } } } })),
            &[404, 409]) },

        "/v1/media": { "post": {
            "summary": "Upload a picture",
            "description": format!("The raw image bytes as the body (any or no Content-Type: the type is read from the bytes). Accepted: {}. At most {max_media} bytes (`media.max_bytes`). Idempotent: the id is the sha256 of the bytes.", ACCEPTED.join(", ")),
            "parameters": [query("filename", &format!("Original file name, 1–{MAX_FILENAME_CHARS} characters, no path separators"), json!({"type": "string"}))],
            "requestBody": { "required": true, "content": { "*/*": { "schema": { "type": "string", "format": "binary" } } } },
            "responses": {
                "201": answer("Stored; `Location` names it", schema_ref("Media")),
                "400": { "$ref": "#/components/responses/Problem400" },
                "413": { "$ref": "#/components/responses/Problem413" },
                "415": { "$ref": "#/components/responses/Problem415" },
                "422": { "$ref": "#/components/responses/Problem422" },
            },
        } },
        "/v1/media/{id}": { "get": op("Media metadata", "", json!([path_id("sha256 of the bytes, lowercase hex")]), None,
            (200, answer("The media", schema_ref("Media"))), &[404]) },

        "/v1/reminders": {
            "get": op("List reminders", "", json!([
                    query("account_id", "Only this account's", json!({"type": "string"})),
                    query("state", "Only in this state", json!({"type": "string", "enum": names(ReminderState::ALL)})),
                ]), None,
                (200, answer("Reminders", json!({ "type": "object", "required": ["items"],
                    "properties": { "items": { "type": "array", "items": schema_ref("Reminder") } } }))),
                &[400]),
            "post": op("Create a reminder",
                "Validated field by field; a 422 names the field (`targets[3]`, `window.end_hour`, `parts[0].caption`) and the rule. The account and any media must exist.",
                json!([]), json_body("ReminderRequest"),
                (201, answer("Created; `Location` names it", schema_ref("Reminder"))),
                &[400, 413, 415, 422]),
        },
        "/v1/reminders/{id}": {
            "get": op("One reminder with its next fire times",
                "`next_fires`: the schedule's next 5 occurrences in its timezone. `next_due`: what the scheduler holds (the send time moves to the window's opening when an occurrence falls outside the window).",
                json!([reminder_id]), None, (200, with_etag(answer("The reminder", schema_ref("ReminderDetail")))), &[404]),
            "put": op("Replace a reminder",
                "Refused (409) while one of its runs is scheduled, queued, running, paused or parked; refused (412) if `If-Match` names a version that is no longer current.",
                json!([reminder_id, if_match.clone()]), json_body("ReminderRequest"),
                (200, with_etag(answer("The reminder", schema_ref("Reminder")))), &[400, 404, 409, 412, 413, 415, 422]),
            "delete": op("Archive a reminder",
                "It stops firing; its runs stay. Runs already queued or in flight go on (stop them through /v1/runs/{id}/stop).",
                json!([reminder_id]), None, (204, json!({ "description": "Archived" })), &[404]),
        },
        "/v1/reminders/{id}/pause": { "post": op("Pause a reminder", "Idempotent. 409 if archived.",
            json!([reminder_id]), None, (200, answer("The reminder", schema_ref("Reminder"))), &[404, 409]) },
        "/v1/reminders/{id}/resume": { "post": op("Resume a reminder", "Idempotent. 409 if archived.",
            json!([reminder_id]), None, (200, answer("The reminder", schema_ref("Reminder"))), &[404, 409]) },
        "/v1/reminders/{id}/fire": { "post": op("Fire now",
            "Creates a run for now (to the second). Inside the delivery window it is queued at once (`queued`); outside, it waits for the window to open (`scheduled`). 409 unless the reminder is active.",
            json!([reminder_id]), None, (202, answer("Accepted; `Location` names the run", schema_ref("FireResult"))), &[404, 409, 503]) },
        "/v1/reminders/{id}/forecast": { "post": op("Dry-run forecast",
            "Would the groups fit the window at the account's rate? From now (or the window's opening) or from the next due time, to that window's close. Nothing is written; no body.",
            json!([reminder_id, query("from", "Start now (default) or at the next due time", json!({"type": "string", "enum": ["now", "next"]}))]),
            None, (200, answer("The estimate", schema_ref("Forecast"))), &[400, 404, 409]) },

        "/v1/runs": { "get": op("List runs", "Newest first. For the next page pass `before_id` = `next_before_id`.",
            json!([
                query("reminder_id", "Only this reminder's", json!({"type": "integer", "minimum": 1})),
                query("account_id", "Only this account's", json!({"type": "string"})),
                query("status", "Only in this status", run_status.clone()),
                query("before_id", "Only runs with a smaller id", json!({"type": "integer", "minimum": 1})),
                query("limit", "Page size", json!({"type": "integer", "minimum": 1, "maximum": runs::MAX_RUNS, "default": runs::DEFAULT_LIMIT})),
            ]), None,
            (200, answer("A page of runs", json!({ "type": "object", "required": ["items", "next_before_id"],
                "properties": { "items": { "type": "array", "items": schema_ref("Run") },
                                "next_before_id": { "type": ["integer", "null"] } } }))),
            &[400]) },
        "/v1/runs/{id}": { "get": op("One run", "Counts by status, the forecast made at its start, the summary.",
            json!([run_id]), None, (200, answer("The run", schema_ref("RunDetail"))), &[404]) },
        "/v1/runs/{id}/targets": { "get": op("A run's groups", "In order of position. For the next page pass `after` = `next_after`.",
            json!([run_id,
                query("status", "Only in this status", target_status.clone()),
                query("after", "Only positions after this one", json!({"type": "integer", "minimum": 0})),
                query("limit", "Page size", json!({"type": "integer", "minimum": 1, "maximum": runs::MAX_TARGETS, "default": runs::DEFAULT_LIMIT})),
            ]), None,
            (200, answer("A page of targets", json!({ "type": "object", "required": ["items", "next_after"],
                "properties": { "items": { "type": "array", "items": schema_ref("RunTarget") },
                                "next_after": { "type": ["integer", "null"] } } }))),
            &[400, 404]) },
        "/v1/runs/{id}/stop": { "post": op("Stop a run",
            "Remaining groups are skipped (\"stopped by operator\"); parts in flight finish. A queued, scheduled or paused run is cancelled at once. 409 if it already ended.",
            json!([run_id]), None, (202, answer("Accepted", schema_ref("ControlResult"))), &[404, 409, 503]) },
        "/v1/runs/{id}/pause": { "post": op("Pause a run",
            "Parts in flight finish, nothing new is sent until resumed. 409 unless queued or running.",
            json!([run_id]), None, (202, answer("Accepted", schema_ref("ControlResult"))), &[404, 409, 503]) },
        "/v1/runs/{id}/resume": { "post": op("Resume a paused run", "409 unless paused.",
            json!([run_id]), None, (202, answer("Accepted", schema_ref("ControlResult"))), &[404, 409, 503]) },
        "/v1/runs/{id}/retry": { "post": op("Retry a run's unsent groups",
            "Failed and skipped groups of a partial, failed or cancelled run go again: same run, same message ids, so nothing is delivered twice. `requeued` says how many.",
            json!([run_id]), None, (202, answer("Accepted", schema_ref("ControlResult"))), &[404, 409, 503]) },

        "/v1/events": { "get": {
            "summary": "Server-sent events",
            "description": format!("`text/event-stream`. Each event is `id: <id>`, `event: <kind>`, `data: <Event as JSON>`. Stored events after `after` (or the `Last-Event-ID` header) are replayed first, then live ones follow; without either only live events are sent. A comment line is sent every {} s to keep the connection alive. Kinds include run_queued, run_scheduled, run_started, run_progress, run_finished (data.delivered = \"X of Y delivered\"), run_missed, run_parked, account_state, window_closed.", events::KEEP_ALIVE.as_secs()),
            "parameters": [
                query("after", "Replay stored events with a larger id first", json!({"type": "integer", "minimum": 0})),
                { "name": "Last-Event-ID", "in": "header", "required": false,
                  "description": "Sent by EventSource on reconnect; same as `after`", "schema": { "type": "integer", "minimum": 0 } },
            ],
            "responses": {
                "200": { "description": "The stream", "content": { "text/event-stream": { "schema": { "type": "string" } } } },
                "400": { "$ref": "#/components/responses/Problem400" },
            },
        } },
    });

    // Every /v1 operation needs the bearer token and can answer 401.
    let open = json!([]);
    let token = json!([{ "bearer": [] }]);
    for (path, item) in paths.as_object_mut().expect("paths is an object") {
        for op in item.as_object_mut().expect("path item").values_mut() {
            if path.starts_with("/v1/") {
                op["security"] = token.clone();
                op["responses"]["401"] = json!({ "$ref": "#/components/responses/Problem401" });
            } else {
                op["security"] = open.clone();
            }
        }
    }

    let mut problem_responses = Map::new();
    for kind in Kind::ALL {
        let code = kind.status().as_u16();
        problem_responses.insert(
            format!("Problem{code}"),
            json!({
                "description": format!("{} (`type` {})", kind.title(), kind.type_uri()),
                "content": { "application/problem+json": { "schema": schema_ref("Problem") } },
            }),
        );
    }

    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Herald control port",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!("Administer Herald: accounts, media, reminders, runs and live events. JSON in and out; JSON bodies up to {max_json} bytes (`control.max_json_bytes`); unknown fields and query parameters are refused. Every rejection is `application/problem+json` with `type`, `title`, `status`, `detail`, and for a bad field `field` and `rule`. When a token is configured every /v1 route needs `Authorization: Bearer <token>`."),
        },
        "servers": [{ "url": "/" }],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "responses": problem_responses,
            "schemas": schemas(),
        },
    })
}

fn schemas() -> Value {
    let ts = json!({ "type": "string", "format": "date-time" });
    let ts_or_null = json!({ "type": ["string", "null"], "format": "date-time" });
    let limit = |(min, max): (u64, u64), what: &str| json!({ "type": ["integer", "null"], "minimum": min, "maximum": max, "description": what });
    json!({
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
            },
        },
        "CreateAccount": {
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "kind"],
            "properties": {
                "id": { "type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$" },
                "name": { "type": ["string", "null"], "maxLength": MAX_NAME_CHARS, "description": "Defaults to the id" },
                "kind": { "type": "string", "enum": names(GatewayKind::ALL) },
                "max_per_minute": limit(PER_MINUTE, "Messages per minute override"),
                "group_concurrency": limit(GROUP_CONCURRENCY, "Groups in flight override"),
                "daily_cap": limit(DAILY_CAP, "Daily message cap; stored, not yet enforced by the engine"),
            },
        },
        "PatchAccount": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "max_per_minute": limit(PER_MINUTE, "null clears the override"),
                "group_concurrency": limit(GROUP_CONCURRENCY, "null clears the override"),
                "daily_cap": limit(DAILY_CAP, "null clears the cap; not yet enforced by the engine"),
            },
        },
        "PairRequest": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "phone": { "type": ["string", "null"], "description": "International number of the phone to pair with a code; without it, a QR code" },
            },
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
            "required": ["max_per_minute", "group_concurrency", "daily_cap"],
            "properties": {
                "max_per_minute": { "type": ["integer", "null"] },
                "group_concurrency": { "type": ["integer", "null"] },
                "daily_cap": { "type": ["integer", "null"] },
            },
        },
        "Account": {
            "type": "object",
            "required": ["id", "name", "kind", "state", "state_reason", "limits", "effective_limits", "created_at"],
            "properties": {
                "id": { "type": "string" },
                "name": { "type": "string" },
                "kind": { "type": "string", "enum": names(GatewayKind::ALL) },
                "state": { "type": "string", "enum": names(AccountState::ALL) },
                "state_reason": { "type": ["string", "null"] },
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
            },
        },
        "AccountSnapshot": {
            "type": "object",
            "required": ["account_id", "queue_depth", "queued", "current_run", "paused", "per_minute", "tokens", "slowed", "halted", "cached_uploads"],
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
                "mime": { "type": "string", "enum": ACCEPTED },
                "size": { "type": "integer" },
                "filename": { "type": ["string", "null"] },
                "created_at": ts,
            },
        },
        "Schedule": {
            "oneOf": [
                { "type": "object", "additionalProperties": false, "required": ["at"],
                  "properties": { "at": { "type": "string", "description": "One-shot local date-time, e.g. 2026-12-01T09:00 (no offset: the reminder's timezone applies)" } } },
                { "type": "object", "additionalProperties": false, "required": ["cron"],
                  "properties": { "cron": { "type": "string", "description": "5 fields: minute hour day-of-month month day-of-week, in the reminder's timezone" } } },
            ],
        },
        "Window": {
            "type": "object",
            "additionalProperties": false,
            "required": ["start_hour", "end_hour"],
            "description": "Delivery hours in the reminder's timezone. start > end crosses midnight; 0–24 is all day. Default 06–18.",
            "properties": {
                "start_hour": { "type": "integer", "minimum": 0, "maximum": 23 },
                "end_hour": { "type": "integer", "minimum": 0, "maximum": 24 },
            },
        },
        "Part": {
            "oneOf": [
                { "type": "object", "additionalProperties": false, "required": ["kind", "text"],
                  "properties": { "kind": { "const": "text" }, "text": { "type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS } } },
                { "type": "object", "additionalProperties": false, "required": ["kind", "media"],
                  "properties": { "kind": { "const": "media" }, "media": { "type": "string", "pattern": "^[0-9a-f]{64}$" },
                                  "caption": { "type": ["string", "null"], "maxLength": MAX_CAPTION_CHARS } } },
            ],
        },
        "ReminderRequest": {
            "type": "object",
            "additionalProperties": false,
            "required": ["account_id", "title", "timezone", "schedule", "parts", "targets"],
            "properties": {
                "account_id": { "type": "string" },
                "title": { "type": "string", "minLength": 1, "maxLength": MAX_TITLE_CHARS },
                "timezone": { "type": "string", "description": "IANA name such as Asia/Kuala_Lumpur, or UTC" },
                "schedule": schema_ref("Schedule"),
                "window": or_null(schema_ref("Window")),
                "resume_next_window": { "type": "boolean", "default": false, "description": "When the window closes with groups left, resume at the next opening instead of ending partial" },
                "parts": { "type": "array", "minItems": 1, "maxItems": MAX_PARTS, "items": schema_ref("Part") },
                "targets": { "type": "array", "minItems": 1, "maxItems": MAX_TARGETS, "uniqueItems": true,
                             "items": { "type": "string", "pattern": "^[0-9]+(-[0-9]+)?@g\\.us$" } },
            },
        },
        "Reminder": {
            "type": "object",
            "required": ["id", "state", "account_id", "title", "timezone", "schedule", "window", "resume_next_window", "parts", "targets", "created_at", "updated_at"],
            "properties": {
                "id": { "type": "integer" },
                "state": { "type": "string", "enum": names(ReminderState::ALL) },
                "account_id": { "type": "string" },
                "title": { "type": "string" },
                "timezone": { "type": "string" },
                "schedule": schema_ref("Schedule"),
                "window": schema_ref("Window"),
                "resume_next_window": { "type": "boolean" },
                "parts": { "type": "array", "items": schema_ref("Part") },
                "targets": { "type": "array", "items": { "type": "string" } },
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
                        "type": "object", "required": ["at", "local"],
                        "properties": { "at": ts, "local": { "type": "string", "description": "RFC 3339 in the reminder's timezone" } } } },
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
                "status": { "type": "string", "enum": names(RunStatus::ALL) },
                "scheduled_for": ts,
            },
        },
        "Forecast": {
            "type": "object",
            "required": ["from", "start", "window_close", "groups", "parts_per_group", "messages", "per_minute", "groups_fit", "fits", "expected_finish", "text"],
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
            "required": ["id", "reminder_id", "account_id", "scheduled_for", "window_end_at", "status", "forecast", "error_summary", "counts", "created_at", "started_at", "finished_at", "stop_requested_at"],
            "properties": {
                "id": { "type": "integer" },
                "reminder_id": { "type": "integer" },
                "account_id": { "type": "string" },
                "scheduled_for": ts,
                "window_end_at": ts_or_null,
                "status": { "type": "string", "enum": names(RunStatus::ALL) },
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
                "type": "object", "required": ["delivered"],
                "properties": { "delivered": { "type": "string", "description": "\"X of Y delivered\"" } },
            }],
        },
        "RunTarget": {
            "type": "object",
            "required": ["id", "run_id", "position", "group", "status", "parts_sent", "message_id", "attempts", "error", "sent_at", "latency_ms"],
            "properties": {
                "id": { "type": "integer" },
                "run_id": { "type": "integer" },
                "position": { "type": "integer" },
                "group": { "type": "string" },
                "status": { "type": "string", "enum": names(TargetStatus::ALL) },
                "parts_sent": { "type": "integer" },
                "message_id": { "type": ["string", "null"] },
                "attempts": { "type": "integer" },
                "error": { "type": ["string", "null"] },
                "sent_at": ts_or_null,
                "latency_ms": { "type": ["integer", "null"] },
            },
        },
        "ControlResult": {
            "type": "object",
            "required": ["run_id", "action", "status"],
            "properties": {
                "run_id": { "type": "integer" },
                "action": { "type": "string", "enum": ["stop", "pause", "resume", "retry"] },
                "status": { "type": "string", "enum": names(RunStatus::ALL), "description": "The status right after the request; a run in flight reaches its new status shortly after" },
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
    })
}

/// The request schema a shape table must match, by name.
pub const BODY_SCHEMAS: &[(&str, &[Field])] = &[
    ("CreateAccount", CreateAccount::FIELDS),
    ("PatchAccount", PatchAccount::FIELDS),
    ("ReminderRequest", ReminderRequest::FIELDS),
];

/// The JSON Schema type names a shape type allows.
pub fn schema_types(ty: Ty) -> &'static [&'static str] {
    match ty {
        Ty::Str => &["string"],
        Ty::UInt => &["integer"],
        Ty::Bool => &["boolean"],
        Ty::Object => &["object"],
        Ty::Array(_) => &["array"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    fn doc() -> Value {
        document(&Settings::load_from(None, &HashMap::new()).unwrap())
    }

    fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => doc
                .pointer(r.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("dangling {r}")),
            None => schema,
        }
    }

    /// The types a property schema allows (following one `$ref` or `oneOf`).
    fn allowed_types(doc: &Value, schema: &Value) -> BTreeSet<String> {
        let schema = resolve(doc, schema);
        if let Some(alts) = schema.get("oneOf").and_then(Value::as_array) {
            return alts.iter().flat_map(|a| allowed_types(doc, a)).collect();
        }
        match &schema["type"] {
            Value::String(t) => [t.clone()].into(),
            Value::Array(ts) => ts.iter().map(|t| t.as_str().unwrap().to_owned()).collect(),
            _ => BTreeSet::new(),
        }
    }

    #[test]
    fn request_schemas_match_what_the_server_accepts() {
        let doc = doc();
        for (name, fields) in BODY_SCHEMAS {
            let schema = &doc["components"]["schemas"][name];
            assert_eq!(schema["additionalProperties"], false, "{name}");
            let props = schema["properties"].as_object().unwrap();
            let documented: BTreeSet<_> = props.keys().cloned().collect();
            let accepted: BTreeSet<_> = fields.iter().map(|f| f.name.to_owned()).collect();
            assert_eq!(documented, accepted, "{name}: properties");
            let required: BTreeSet<_> = schema["required"]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default();
            let needed: BTreeSet<_> = fields
                .iter()
                .filter(|f| f.required)
                .map(|f| f.name.to_owned())
                .collect();
            assert_eq!(required, needed, "{name}: required");
            for f in *fields {
                let types = allowed_types(&doc, &props[f.name]);
                for t in schema_types(f.ty) {
                    assert!(
                        types.contains(*t),
                        "{name}.{}: {t} not in {types:?}",
                        f.name
                    );
                }
                assert_eq!(
                    types.contains("null"),
                    f.nullable,
                    "{name}.{}: null",
                    f.name
                );
            }
        }
    }

    #[test]
    fn every_route_and_path_parameter_is_documented() {
        let doc = doc();
        for (method, path) in super::super::all_routes() {
            let op = &doc["paths"][path][method.to_lowercase()];
            assert!(op.is_object(), "{method} {path} is not documented");
            let params = op["parameters"].as_array().unwrap();
            for seg in path.split('/').filter(|s| s.starts_with('{')) {
                let name = seg.trim_matches(|c| c == '{' || c == '}');
                assert!(
                    params
                        .iter()
                        .any(|p| p["in"] == "path" && p["name"] == name),
                    "{method} {path}: path parameter {name}"
                );
            }
        }
    }

    #[test]
    fn every_reference_resolves() {
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
    }
}
