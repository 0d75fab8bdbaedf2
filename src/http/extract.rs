//! Parsing at the edge: JSON bodies with a size limit and field-named
//! errors, query parameters that refuse unknown names, and path ids.

use super::errors::{ApiError, Kind};
use super::spec::{self, Param, Rule, Shape, Str};
use crate::service::Service;
use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::web::{Bytes, BytesMut};
use actix_web::{web, FromRequest, HttpRequest};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use herald_actors::domain::{AccountId, MediaId, RunId};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A request body type and the shape it is checked against first, so an
/// unknown, missing or mistyped field (at any depth) is named with its rule
/// in the answer, as the document states it (serde's own errors do not say
/// which field). serde's `deny_unknown_fields` stays on the types as the
/// final guard; the domain's parsers then apply what JSON Schema cannot
/// say.
pub trait JsonBody {
    const SHAPE: &'static Shape;
}

/// A JSON body of type `T`, read up to `control.max_json_bytes`.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned + JsonBody + 'static> FromRequest for Json<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let limit = req
            .app_data::<web::Data<Service>>()
            .map(|s| s.control().max_json_bytes)
            .unwrap_or(1 << 20);
        let content_type = check_json_content_type(req);
        let length = declared_length(req);
        let payload = payload.take();
        Box::pin(async move {
            content_type?;
            let bytes = read_limited(payload, length, limit as u64, "JSON body").await?;
            parse_json::<T>(&bytes).map(Json)
        })
    }
}

pub const JSON_CONTENT_TYPE_RULE: &str = "must be application/json (or a +json type)";

/// A JSON body must say so: `application/json` or any `…+json`. A missing
/// Content-Type is refused too: it is what a browser's `no-cors` request
/// from another site looks like (text/plain and form types are the only
/// ones it can send without asking first), and curl -d sends form encoding.
pub fn check_json_content_type(req: &HttpRequest) -> Result<(), ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("").to_ascii_lowercase());
    let essence = ct
        .as_deref()
        .map(|c| c.split(';').next().unwrap_or("").trim());
    match essence {
        Some(e) if e == "application/json" || e.ends_with("+json") => Ok(()),
        _ => {
            let mut err = ApiError::field_error(
                Kind::UnsupportedMedia,
                "Content-Type",
                JSON_CONTENT_TYPE_RULE,
            );
            err.detail = match essence {
                None => format!("Content-Type is missing: it {JSON_CONTENT_TYPE_RULE}"),
                Some(e) => format!("Content-Type {e:?}: it {JSON_CONTENT_TYPE_RULE}"),
            };
            Err(err)
        }
    }
}

pub fn declared_length(req: &HttpRequest) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Reads a body of at most `limit` bytes. A declared length over the limit
/// is refused before reading anything.
pub async fn read_limited<S, E>(
    mut payload: S,
    declared: Option<u64>,
    limit: u64,
    what: &str,
) -> Result<Bytes, ApiError>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let too_large = || {
        ApiError::new(
            Kind::TooLarge,
            format!("the {what} is larger than the limit of {limit} bytes"),
        )
    };
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).min(limit) as usize);
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(Kind::BadRequest, format!("could not read the body: {e}"))
        })?;
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Syntax errors are 400; a well-formed body that breaks a rule is 422.
pub fn parse_json<T: DeserializeOwned + JsonBody>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::new(
            Kind::BadRequest,
            "the body is empty; a JSON object is expected",
        ));
    }
    let mut value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(Kind::BadRequest, format!("the body is not valid JSON: {e}")))?;
    whole_floats_to_integers(&mut value);
    spec::check_object(&value, T::SHAPE, "")?;
    serde_json::from_value(value).map_err(serde_error)
}

/// What serde still refuses after the shape check: a rule deeper in the
/// body. The domain's parsers report "field: rule", which we keep.
fn serde_error(e: serde_json::Error) -> ApiError {
    let msg = e.to_string();
    if let Some(name) = between(&msg, "unknown field `", "`") {
        return ApiError::invalid(name, "is not a known field");
    }
    if let Some(name) = between(&msg, "missing field `", "`") {
        return ApiError::invalid(name, "is required");
    }
    match msg.split_once(": ") {
        Some((field, rule)) if !field.contains(' ') => ApiError::invalid(field, rule),
        _ => ApiError::invalid("", msg),
    }
}

/// `5.0` is the integer 5 to JSON Schema (and to JavaScript, which sends
/// it so): read it as 5, so the rules and serde see the number it is.
fn whole_floats_to_integers(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            // Within ±2^53 a float is exactly the integer it shows.
            if f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 {
                *v = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_floats_to_integers),
        Value::Object(map) => map.values_mut().for_each(whole_floats_to_integers),
        _ => {}
    }
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = &s[s.find(start)? + start.len()..];
    Some(&rest[..rest.find(end)?])
}

/// The path ids, declared once for the routes and the document.
pub const ACCOUNT_ID: Param = Param::new(
    "id",
    Rule::Str(Str::pattern(AccountId::PATTERN, AccountId::RULE)),
    "Account id",
);
pub const REMINDER_ID: Param = Param::new(
    "id",
    Rule::Int {
        min: 1,
        max: i64::MAX,
    },
    "Reminder id",
);
pub const RUN_ID: Param = Param::new(
    "id",
    Rule::Int {
        min: 1,
        max: i64::MAX,
    },
    "Run id",
);
pub const MEDIA_ID: Param = Param::new(
    "id",
    Rule::Str(Str::pattern(MediaId::PATTERN, MediaId::RULE)),
    "sha256 of the bytes, lowercase hex",
);

/// An account id from the path. A malformed id names no account: 404.
pub fn account_id(raw: &str) -> Result<AccountId, ApiError> {
    let raw = spec::path_value(&ACCOUNT_ID, "account", raw)?;
    AccountId::parse(raw).map_err(|_| ApiError::not_found(format!("account {raw:?}")))
}

/// A numeric id from the path (reminders, runs); malformed is 404 too.
pub fn numeric_id(raw: &str, what: &str) -> Result<i64, ApiError> {
    let param = if what == "run" { &RUN_ID } else { &REMINDER_ID };
    let raw = spec::path_value(param, what, raw)?;
    raw.parse::<i64>()
        .map_err(|_| ApiError::not_found(format!("{what} {raw:?}")))
}

/// A positive numeric id from the path (users, webhooks, deliveries);
/// anything else is 404, as no such record exists.
pub fn positive_id(raw: &str, what: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ApiError::not_found(format!("{what} {raw}")))
}

pub fn run_id(raw: &str) -> Result<RunId, ApiError> {
    numeric_id(raw, "run").map(RunId)
}

pub fn media_id(raw: &str) -> Result<MediaId, ApiError> {
    let raw = spec::path_value(&MEDIA_ID, "media", raw)?;
    MediaId::parse(raw).map_err(|_| ApiError::not_found(format!("media {raw:?}")))
}

/// `null` kept apart from "absent", for PATCH: `Some(None)` clears.
pub fn double_option<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    use serde::Deserialize;
    Option::<T>::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::spec::Field;
    use herald_actors::domain::ReminderRequest;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[allow(dead_code)]
        name: String,
        #[allow(dead_code)]
        #[serde(default, deserialize_with = "double_option")]
        cap: Option<Option<u32>>,
    }
    impl JsonBody for Body {
        const SHAPE: &'static Shape = &Shape {
            name: "Body",
            description: "",
            fields: &[
                Field::req("name", Rule::Str(Str::ANY), ""),
                Field::nullable("cap", Rule::Int { min: 0, max: 100 }, ""),
            ],
            example: None,
        };
    }

    fn err(json: &str) -> ApiError {
        parse_json::<Body>(json.as_bytes()).unwrap_err()
    }

    #[test]
    fn body_errors_name_the_field() {
        assert_eq!(err("{\"name\": 1").kind, Kind::BadRequest);
        assert_eq!(err("").kind, Kind::BadRequest);
        assert_eq!(err("[]").rule.unwrap(), "the body must be a JSON object");
        let e = err(r#"{"name":"a","colour":1}"#);
        assert_eq!(
            (e.kind, e.field.as_deref()),
            (Kind::Validation, Some("colour"))
        );
        assert_eq!(err(r#"{}"#).field.as_deref(), Some("name"));
        let e = err(r#"{"name":5}"#);
        assert_eq!(
            (e.field.unwrap(), e.rule.unwrap().as_str()),
            ("name".into(), "must be a string")
        );
        assert_eq!(
            err(r#"{"name":"a","cap":-1}"#).field.as_deref(),
            Some("cap")
        );
        assert_eq!(
            err(r#"{"name":"a","cap":1.5}"#).field.as_deref(),
            Some("cap")
        );
    }

    #[test]
    fn null_is_kept_apart_from_absent() {
        let b: Body = parse_json(br#"{"name":"a","cap":null}"#).unwrap();
        assert_eq!(b.cap, Some(None));
        let b: Body = parse_json(br#"{"name":"a"}"#).unwrap();
        assert_eq!(b.cap, None);
        let b: Body = parse_json(br#"{"name":"a","cap":7.0}"#).unwrap();
        assert_eq!(b.cap, Some(Some(7)));
    }

    #[test]
    fn nested_domain_errors_keep_their_path() {
        let body = serde_json::json!({
            "account_id": "a", "title": "t", "timezone": "UTC",
            "schedule": {"cron": "0 9 * * *"},
            "parts": [{"kind": "text", "text": "x"}],
            "targets": ["1@g.us", 7],
        });
        let e = parse_json::<ReminderRequest>(body.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("targets[1]"));
    }
}
