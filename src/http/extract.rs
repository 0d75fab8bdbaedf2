//! Parsing at the edge: JSON bodies with a size limit and field-named
//! errors, query parameters that refuse unknown names, and path ids.

use super::errors::{ApiError, Kind};
use crate::state::AppState;
use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::web::{Bytes, BytesMut};
use actix_web::{web, FromRequest, HttpRequest};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use herald_actors::domain::{AccountId, RunId};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::str::FromStr;

/// The JSON type a top-level field must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Str,
    /// A whole number ≥ 0.
    UInt,
    Bool,
    Object,
    Array(&'static Ty),
}

/// One top-level field of a request body.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: &'static str,
    pub ty: Ty,
    pub required: bool,
    /// `null` is accepted (and means "none" or "clear").
    pub nullable: bool,
}

impl Field {
    pub const fn req(name: &'static str, ty: Ty) -> Self {
        Self {
            name,
            ty,
            required: true,
            nullable: false,
        }
    }
    pub const fn opt(name: &'static str, ty: Ty) -> Self {
        Self {
            name,
            ty,
            required: false,
            nullable: false,
        }
    }
    pub const fn nullable(name: &'static str, ty: Ty) -> Self {
        Self {
            name,
            ty,
            required: false,
            nullable: true,
        }
    }
}

/// The top-level shape of a request body. Checked before serde so that an
/// unknown, missing or mistyped field is named in the answer (serde's own
/// type errors do not say which field). serde's `deny_unknown_fields`
/// stays on the types as the final guard. The OpenAPI document is checked
/// against these tables in a unit test.
pub trait Shape {
    const FIELDS: &'static [Field];
}

/// A JSON body of type `T`, read up to `control.max_json_bytes`.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned + Shape + 'static> FromRequest for Json<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let limit = req
            .app_data::<web::Data<AppState>>()
            .map(|s| s.settings.control.max_json_bytes)
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
pub fn parse_json<T: DeserializeOwned + Shape>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::new(
            Kind::BadRequest,
            "the body is empty; a JSON object is expected",
        ));
    }
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(Kind::BadRequest, format!("the body is not valid JSON: {e}")))?;
    check_shape(&value, T::FIELDS)?;
    serde_json::from_value(value).map_err(serde_error)
}

fn check_shape(value: &Value, fields: &[Field]) -> Result<(), ApiError> {
    let Value::Object(map) = value else {
        return Err(ApiError::invalid("", "the body must be a JSON object"));
    };
    for key in map.keys() {
        if !fields.iter().any(|f| f.name == key) {
            let known: Vec<_> = fields.iter().map(|f| f.name).collect();
            return Err(ApiError::invalid(
                key.clone(),
                format!("is not a known field (known: {})", known.join(", ")),
            ));
        }
    }
    for f in fields {
        match map.get(f.name) {
            None if f.required => return Err(ApiError::invalid(f.name, "is required")),
            None => {}
            Some(Value::Null) if f.nullable => {}
            Some(v) => check_type(v, f.ty, f.name)?,
        }
    }
    Ok(())
}

fn check_type(v: &Value, ty: Ty, at: &str) -> Result<(), ApiError> {
    let ok = match ty {
        Ty::Str => v.is_string(),
        Ty::UInt => v.is_u64(),
        Ty::Bool => v.is_boolean(),
        Ty::Object => v.is_object(),
        Ty::Array(item) => match v {
            Value::Array(items) => {
                for (i, x) in items.iter().enumerate() {
                    check_type(x, *item, &format!("{at}[{i}]"))?;
                }
                true
            }
            _ => false,
        },
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(at, type_rule(ty)))
    }
}

pub fn type_rule(ty: Ty) -> &'static str {
    match ty {
        Ty::Str => "must be a string",
        Ty::UInt => "must be a whole number, 0 or more",
        Ty::Bool => "must be true or false",
        Ty::Object => "must be a JSON object",
        Ty::Array(Ty::Str) => "must be an array of strings",
        Ty::Array(Ty::Object) => "must be an array of objects",
        Ty::Array(_) => "must be an array",
    }
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

fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = &s[s.find(start)? + start.len()..];
    Some(&rest[..rest.find(end)?])
}

/// Query parameters, parsed one by one; names nobody asked for are refused
/// so a typo (`?stauts=`) is not silently ignored.
pub struct Params {
    map: BTreeMap<String, String>,
}

impl Params {
    pub fn from_request(req: &HttpRequest) -> Result<Self, ApiError> {
        let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
            .map_err(|e| ApiError::bad_param("query", format!("is malformed: {e}")))?;
        let mut map = BTreeMap::new();
        for (k, v) in pairs.into_inner() {
            if map.insert(k.clone(), v).is_some() {
                return Err(ApiError::bad_param(k, "must be given at most once"));
            }
        }
        Ok(Self { map })
    }

    /// Takes a parameter, parsing it with `parse`; an empty value is absent.
    pub fn take<T, E: std::fmt::Display>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<Option<T>, ApiError> {
        match self.map.remove(name) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => parse(&v)
                .map(Some)
                .map_err(|e| ApiError::bad_param(name, rule_of(e.to_string()))),
        }
    }

    pub fn take_num<T>(&mut self, name: &str, min: T, max: T) -> Result<Option<T>, ApiError>
    where
        T: FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        let rule = format!("must be a whole number from {min} to {max}");
        self.take(name, |s| match s.parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(n),
            _ => Err(rule.clone()),
        })
    }

    /// Refuses whatever was not taken.
    pub fn finish(self, known: &[&str]) -> Result<(), ApiError> {
        match self.map.into_keys().next() {
            None => Ok(()),
            Some(k) => Err(ApiError::bad_param(
                k,
                format!("is not a known parameter (known: {})", known.join(", ")),
            )),
        }
    }
}

/// The domain's enum parsers say "RunStatus: must be one of …"; the
/// parameter name already says which.
fn rule_of(msg: String) -> String {
    match msg.split_once(": ") {
        Some((head, rule)) if !head.contains(' ') => rule.to_owned(),
        _ => msg,
    }
}

/// An account id from the path. A malformed id names no account: 404.
pub fn account_id(raw: &str) -> Result<AccountId, ApiError> {
    AccountId::parse(raw).map_err(|_| ApiError::not_found(format!("account {raw:?}")))
}

/// A numeric id from the path (reminders, runs); malformed is 404 too.
pub fn numeric_id(raw: &str, what: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ApiError::not_found(format!("{what} {raw:?}")))
}

pub fn run_id(raw: &str) -> Result<RunId, ApiError> {
    numeric_id(raw, "run").map(RunId)
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
    impl Shape for Body {
        const FIELDS: &'static [Field] = &[
            Field::req("name", Ty::Str),
            Field::nullable("cap", Ty::UInt),
        ];
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
    }

    #[test]
    fn null_is_kept_apart_from_absent() {
        let b: Body = parse_json(br#"{"name":"a","cap":null}"#).unwrap();
        assert_eq!(b.cap, Some(None));
        let b: Body = parse_json(br#"{"name":"a"}"#).unwrap();
        assert_eq!(b.cap, None);
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
