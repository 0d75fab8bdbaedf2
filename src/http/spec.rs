//! The control port's rules as data.
//!
//! Every request body field, query parameter and path id is declared once,
//! as a [`Rule`]. The validator ([`check`], [`Params`]) and the OpenAPI
//! emitter ([`Rule::schema`], `openapi.rs`) both read that declaration, so
//! the document cannot promise what the server does not enforce, nor the
//! server refuse what the document allows (beyond what JSON Schema cannot
//! say: a referenced account must exist, a cron must match some date).
//! Each operation is an [`Op`] beside its handler; `v1_api!` registers the
//! handler and the document lists the operation from the same line.

use super::errors::ApiError;
use actix_web::{web, HttpRequest};
use herald_actors::domain::Role;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, OnceLock};

/// What a JSON value (or a query or path value, read as text) must be.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    Str(Str),
    /// A whole number in `min..=max`.
    Int {
        min: i64,
        max: i64,
    },
    Bool,
    Array(&'static Array),
    Object(&'static Shape),
    OneOf(&'static OneOf),
}

/// A string rule. Lengths count characters (code points), as JSON Schema's
/// `minLength`/`maxLength` do.
#[derive(Debug, Clone, Copy)]
pub struct Str {
    pub min: usize,
    pub max: usize,
    pub pattern: Option<Pattern>,
    pub choice: Option<Choice>,
    /// `date-time` and the like, for the document only.
    pub format: Option<&'static str>,
}

/// A regular expression (anchored, in the common subset of ECMA-262,
/// Python and `regex-lite`) and the rule said when a value misses it.
#[derive(Debug, Clone, Copy)]
pub struct Pattern {
    pub regex: &'static str,
    pub rule: &'static str,
}

/// A closed set of values.
#[derive(Debug, Clone, Copy)]
pub struct Choice {
    pub values: fn() -> &'static [&'static str],
    /// Said instead of listing every value (a long list such as timezones).
    pub rule: Option<&'static str>,
}

#[derive(Debug, Clone, Copy)]
pub struct Array {
    pub items: Rule,
    pub min: usize,
    pub max: usize,
    pub unique: bool,
    /// What the items are called in the rule: "must have 1–10 parts".
    pub noun: &'static str,
}

/// A JSON object with exactly these fields.
#[derive(Debug)]
pub struct Shape {
    /// Its component name in the document.
    pub name: &'static str,
    pub description: &'static str,
    pub fields: &'static [Field],
    /// A valid example (JSON text); a unit test parses each one.
    pub example: Option<&'static str>,
}

/// One of several shapes: told apart by the `tag` field's value when there
/// is one, else by which variant's first required field is present.
#[derive(Debug)]
pub struct OneOf {
    pub name: &'static str,
    pub description: &'static str,
    pub tag: Option<&'static str>,
    pub variants: &'static [&'static Shape],
}

#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: &'static str,
    pub rule: Rule,
    pub required: bool,
    /// `null` is accepted (and means "none" or "clear").
    pub nullable: bool,
    pub description: &'static str,
}

impl Field {
    pub const fn req(name: &'static str, rule: Rule, description: &'static str) -> Self {
        Self {
            name,
            rule,
            required: true,
            nullable: false,
            description,
        }
    }
    pub const fn opt(name: &'static str, rule: Rule, description: &'static str) -> Self {
        Self {
            name,
            rule,
            required: false,
            nullable: false,
            description,
        }
    }
    pub const fn nullable(name: &'static str, rule: Rule, description: &'static str) -> Self {
        Self {
            name,
            rule,
            required: false,
            nullable: true,
            description,
        }
    }
}

impl Str {
    pub const ANY: Str = Str {
        min: 0,
        max: usize::MAX,
        pattern: None,
        choice: None,
        format: None,
    };
    pub const fn len(min: usize, max: usize) -> Self {
        Self {
            min,
            max,
            ..Self::ANY
        }
    }
    pub const fn pattern(regex: &'static str, rule: &'static str) -> Self {
        Self {
            pattern: Some(Pattern { regex, rule }),
            ..Self::ANY
        }
    }
    pub const fn one_of(values: fn() -> &'static [&'static str]) -> Self {
        Self {
            choice: Some(Choice { values, rule: None }),
            ..Self::ANY
        }
    }
}

/// Text that is not only whitespace: the characters Rust's `trim` removes
/// (Unicode White_Space), listed so every regex engine agrees.
pub const NOT_BLANK: &str =
    "[^\\t\\n\\x0B\\x0C\\r \\x85\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]";

fn regex(pattern: &'static str) -> regex_lite::Regex {
    static CACHE: OnceLock<Mutex<HashMap<&'static str, regex_lite::Regex>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    cache
        .entry(pattern)
        .or_insert_with(|| regex_lite::Regex::new(pattern).expect("declared patterns compile"))
        .clone()
}

/// The rule a string breaks, if any.
pub fn check_str(s: &str, rule: &Str) -> Result<(), String> {
    let n = s.chars().count();
    if n < rule.min || n > rule.max {
        return Err(match (rule.min, rule.max) {
            (0, max) => format!("must be at most {max} characters"),
            (min, usize::MAX) => format!("must be at least {min} characters"),
            (min, max) => format!("must be {min}–{max} characters"),
        });
    }
    if let Some(p) = &rule.pattern {
        if !regex(p.regex).is_match(s) {
            return Err(p.rule.to_owned());
        }
    }
    if let Some(c) = &rule.choice {
        let values = (c.values)();
        if !values.contains(&s) {
            return Err(match c.rule {
                Some(r) => r.to_owned(),
                None => format!("must be one of: {}", values.join(", ")),
            });
        }
    }
    Ok(())
}

fn int_rule(min: i64, max: i64) -> String {
    if max == i64::MAX {
        format!("must be a whole number, {min} or more")
    } else {
        format!("must be {min}–{max}")
    }
}

/// Checks a JSON value against its rule; the error names the path of the
/// first value that breaks one (`targets[3]`, `parts[0].caption`).
pub fn check(v: &Value, rule: &Rule, at: &str) -> Result<(), ApiError> {
    let fail = |rule: String| Err(ApiError::invalid(at, rule));
    match rule {
        Rule::Str(s) => match v {
            Value::String(x) => check_str(x, s).or_else(fail),
            _ => fail("must be a string".into()),
        },
        Rule::Int { min, max } => match v.as_i64() {
            Some(n) if (*min..=*max).contains(&n) => Ok(()),
            Some(_) => fail(int_rule(*min, *max)),
            // A u64 beyond i64 is out of every range we declare.
            None if v.is_u64() => fail(int_rule(*min, *max)),
            None => fail("must be a whole number".into()),
        },
        Rule::Bool => match v {
            Value::Bool(_) => Ok(()),
            _ => fail("must be true or false".into()),
        },
        Rule::Array(a) => {
            let Value::Array(items) = v else {
                return fail("must be an array".into());
            };
            for (i, x) in items.iter().enumerate() {
                check(x, &a.items, &format!("{at}[{i}]"))?;
            }
            if items.len() < a.min || items.len() > a.max {
                return fail(format!("must have {}–{} {}", a.min, a.max, a.noun));
            }
            if a.unique {
                let mut seen = HashMap::with_capacity(items.len());
                for (i, x) in items.iter().enumerate() {
                    if let Some(j) = seen.insert(x.to_string(), i) {
                        return Err(ApiError::invalid(
                            format!("{at}[{i}]"),
                            format!("repeats {at}[{j}]: each item at most once"),
                        ));
                    }
                }
            }
            Ok(())
        }
        Rule::Object(shape) => check_object(v, shape, at),
        Rule::OneOf(one) => {
            let Value::Object(map) = v else {
                return fail("must be a JSON object".into());
            };
            let variant = match one.tag {
                Some(tag) => {
                    let tags: Vec<&str> = one.variants.iter().map(|s| tag_of(s, tag)).collect();
                    let at_tag = join(at, tag);
                    match map.get(tag) {
                        None => return Err(ApiError::invalid(at_tag, "is required")),
                        Some(Value::String(t)) if tags.contains(&t.as_str()) => one
                            .variants
                            .iter()
                            .find(|s| tag_of(s, tag) == t.as_str())
                            .expect("tag found"),
                        Some(_) => {
                            return Err(ApiError::invalid(
                                at_tag,
                                format!("must be one of: {}", tags.join(", ")),
                            ))
                        }
                    }
                }
                None => {
                    let keys: Vec<&str> = one.variants.iter().map(|s| s.fields[0].name).collect();
                    let present: Vec<_> = one
                        .variants
                        .iter()
                        .filter(|s| map.contains_key(s.fields[0].name))
                        .collect();
                    match present[..] {
                        [only] => only,
                        _ => return fail(format!("must have exactly one of: {}", keys.join(", "))),
                    }
                }
            };
            check_object(v, variant, at)
        }
    }
}

/// The constant a tagged variant's tag field holds.
fn tag_of(shape: &Shape, tag: &str) -> &'static str {
    shape
        .fields
        .iter()
        .find(|f| f.name == tag)
        .and_then(|f| match f.rule {
            Rule::Str(Str {
                choice: Some(c), ..
            }) => (c.values)().first().copied(),
            _ => None,
        })
        .expect("a tagged variant declares its tag as a one-value choice")
}

fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    }
}

pub fn check_object(v: &Value, shape: &Shape, at: &str) -> Result<(), ApiError> {
    let Value::Object(map) = v else {
        let what = if at.is_empty() { "the body" } else { "" };
        return Err(ApiError::invalid(
            at,
            format!("{what} must be a JSON object")
                .trim_start()
                .to_owned(),
        ));
    };
    for key in map.keys() {
        if !shape.fields.iter().any(|f| f.name == key) {
            let known: Vec<_> = shape.fields.iter().map(|f| f.name).collect();
            return Err(ApiError::invalid(
                join(at, key),
                format!("is not a known field (known: {})", known.join(", ")),
            ));
        }
    }
    for f in shape.fields {
        match map.get(f.name) {
            None if f.required => return Err(ApiError::invalid(join(at, f.name), "is required")),
            None => {}
            Some(Value::Null) if f.nullable => {}
            Some(x) => check(x, &f.rule, &join(at, f.name))?,
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------
// The document side: each rule as a JSON Schema.

fn component(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

impl Rule {
    /// The JSON Schema of this rule; objects are `$ref`s to components
    /// (collected by [`Rule::components`]).
    pub fn schema(&self) -> Value {
        match self {
            Rule::Str(s) => {
                let mut o = json!({ "type": "string" });
                if s.min > 0 {
                    o["minLength"] = s.min.into();
                }
                if s.max != usize::MAX {
                    o["maxLength"] = s.max.into();
                }
                if let Some(p) = &s.pattern {
                    o["pattern"] = p.regex.into();
                }
                if let Some(c) = &s.choice {
                    o["enum"] = json!((c.values)());
                }
                if let Some(f) = s.format {
                    o["format"] = f.into();
                }
                o
            }
            // The maximum is always stated: a generator would otherwise
            // try numbers beyond i64.
            Rule::Int { min, max } => json!({ "type": "integer", "minimum": min, "maximum": max }),
            Rule::Bool => json!({ "type": "boolean" }),
            Rule::Array(a) => {
                let mut o = json!({ "type": "array", "items": a.items.schema(),
                                    "minItems": a.min, "maxItems": a.max });
                if a.unique {
                    o["uniqueItems"] = true.into();
                }
                o
            }
            Rule::Object(shape) => component(shape.name),
            Rule::OneOf(one) => component(one.name),
        }
    }

    /// The named components this rule needs, into `out`.
    pub fn components(&self, out: &mut BTreeMap<String, Value>) {
        match self {
            Rule::Array(a) => a.items.components(out),
            Rule::Object(shape) => shape.components(out),
            Rule::OneOf(one) => {
                if out.contains_key(one.name) {
                    return;
                }
                let variants: Vec<Value> = one.variants.iter().map(|s| s.inline(one.tag)).collect();
                out.insert(
                    one.name.to_owned(),
                    json!({ "description": one.description, "oneOf": variants }),
                );
                for s in one.variants {
                    for f in s.fields {
                        f.rule.components(out);
                    }
                }
            }
            Rule::Str(_) | Rule::Int { .. } | Rule::Bool => {}
        }
    }
}

impl Shape {
    pub fn components(&self, out: &mut BTreeMap<String, Value>) {
        if out.contains_key(self.name) {
            return;
        }
        let mut schema = self.inline(None);
        schema["description"] = self.description.into();
        if let Some(ex) = self.example {
            schema["examples"] =
                json!([serde_json::from_str::<Value>(ex).expect("example is JSON")]);
        }
        out.insert(self.name.to_owned(), schema);
        for f in self.fields {
            f.rule.components(out);
        }
    }

    /// The object schema itself; the `tag` field, if any, as a `const`.
    fn inline(&self, tag: Option<&str>) -> Value {
        let mut props = Map::new();
        for f in self.fields {
            let mut s = if Some(f.name) == tag {
                json!({ "const": tag_of(self, f.name) })
            } else {
                f.rule.schema()
            };
            if f.nullable {
                s = match f.rule {
                    // A `$ref` cannot take a sibling type: a oneOf with null.
                    Rule::Object(_) | Rule::OneOf(_) => json!({ "oneOf": [s, { "type": "null" }] }),
                    _ => {
                        let t = s["type"].as_str().expect("typed").to_owned();
                        s["type"] = json!([t, "null"]);
                        // An enum lists every allowed value: null too.
                        if let Some(Value::Array(values)) = s.get_mut("enum") {
                            values.push(Value::Null);
                        }
                        s
                    }
                };
            }
            if !f.description.is_empty() {
                match s.as_object_mut() {
                    Some(o) if !o.contains_key("$ref") => {
                        o.insert("description".into(), f.description.into());
                    }
                    _ => s = json!({ "allOf": [s], "description": f.description }),
                }
            }
            props.insert(f.name.into(), s);
        }
        let required: Vec<&str> = self
            .fields
            .iter()
            .filter(|f| f.required)
            .map(|f| f.name)
            .collect();
        let mut o = json!({ "type": "object", "additionalProperties": false, "properties": props });
        if !required.is_empty() {
            o["required"] = json!(required);
        }
        o
    }
}

// ---------------------------------------------------------------------
// Operations.

/// A path or query parameter.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub rule: Rule,
    pub description: &'static str,
    /// What an absent query parameter means (for the document).
    pub default: Option<i64>,
}

impl Param {
    pub const fn new(name: &'static str, rule: Rule, description: &'static str) -> Self {
        Self {
            name,
            rule,
            description,
            default: None,
        }
    }
    pub const fn default(mut self, value: i64) -> Self {
        self.default = Some(value);
        self
    }

    /// A query or path value, read as text, against the rule.
    pub fn check_text(&self, raw: &str) -> Result<(), String> {
        match &self.rule {
            Rule::Str(s) => check_str(raw, s),
            Rule::Int { min, max } => match raw.parse::<i64>() {
                // Only plain digits: `+5` and ` 5` are not what the document says.
                Ok(n) if raw.bytes().all(|b| b.is_ascii_digit() || b == b'-') => {
                    if (*min..=*max).contains(&n) {
                        Ok(())
                    } else {
                        Err(int_rule(*min, *max))
                    }
                }
                _ => Err("must be a whole number".into()),
            },
            _ => Err("is not a text parameter".into()),
        }
    }
}

/// The request body an operation takes.
#[derive(Debug, Clone, Copy)]
pub enum Body {
    None,
    /// JSON of this shape (`application/json` or `+json`).
    Json(&'static Shape),
    /// JSON of this shape, or no body at all.
    OptionalJson(&'static Shape),
    /// Raw bytes of any type (media uploads).
    Bytes,
}

/// Where an answer's schema comes from: the type the handler answers with
/// (registered in the document's generator, which returns a `$ref` to it).
pub type SchemaOf = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

/// Answers that are not JSON written from a type, their schemas stated.
macro_rules! stated {
    ($($(#[$m:meta])* $ty:ident $schema:tt)+) => {$(
        $(#[$m])*
        pub struct $ty;

        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!($schema)
            }
        }
    )+};
}

stated! {
    /// A PNG image.
    Png { "type": "string", "format": "binary" }
    /// The OpenAPI document itself.
    Document { "type": "object", "description": "An OpenAPI 3.1 document" }
    /// Prometheus's text exposition.
    Metrics { "type": "string", "description": "OpenMetrics text" }
}

/// What a success answers.
#[derive(Debug, Clone, Copy)]
pub struct Success {
    pub status: u16,
    pub description: &'static str,
    /// The answer's type, with this media type; `None`: no body.
    pub schema: Option<SchemaOf>,
    pub media: &'static str,
    /// Carries `ETag` (edits take it back as `If-Match`).
    pub etag: bool,
    /// Carries `Location` naming what was created.
    pub location: bool,
}

impl Success {
    /// Answers a `T` as JSON: the document states `T`'s schema, derived
    /// from the same serde attributes that write the answer.
    pub const fn json<T: schemars::JsonSchema>(status: u16, description: &'static str) -> Self {
        Self {
            status,
            description,
            schema: Some(schemars::SchemaGenerator::subschema_for::<T>),
            media: "application/json",
            etag: false,
            location: false,
        }
    }
    pub const fn etag(mut self) -> Self {
        self.etag = true;
        self
    }
    pub const fn location(mut self) -> Self {
        self.location = true;
        self
    }
    pub const fn media(mut self, media: &'static str) -> Self {
        self.media = media;
        self
    }
    /// No body, with its own description.
    pub const fn no_content(description: &'static str) -> Self {
        Self {
            description,
            ..Self::NO_CONTENT
        }
    }
    pub const NO_CONTENT: Success = Success {
        status: 204,
        description: "Done; no body",
        schema: None,
        media: "",
        etag: false,
        location: false,
    };
}

/// One operation, declared beside its handler.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub id: &'static str,
    pub summary: &'static str,
    pub description: &'static str,
    pub path: &'static [Param],
    pub query: &'static [Param],
    /// Request headers the operation reads (besides `If-Match`).
    pub headers: &'static [Param],
    pub body: Body,
    /// Takes `If-Match` (412 on a stale version).
    pub if_match: bool,
    pub ok: Success,
    /// Statuses particular to this operation (409, 503, …). Those that
    /// follow from its declaration (400 for a query, 404 for a path id,
    /// 413/415/422 for a body, 401/403/429 on /v1) are added by the emitter.
    pub errors: &'static [u16],
    /// The least role that may perform it, its service operation's;
    /// `None`: open to anyone (the probes, the document).
    pub role: Option<Role>,
    /// The service operation this route performs, whose role it takes: the
    /// route's authority mints that operation's proof ([`crate::service::Allowed`]).
    /// Every `/v1` route performs one; a route without one serves nothing.
    pub performs: Option<&'static crate::service::Operation>,
    /// A signed-in console session may stand in for the bearer token (the
    /// event stream the console's pages follow, which `EventSource` opens
    /// without headers).
    pub session_cookie: bool,
}

impl Op {
    pub const fn new(id: &'static str, summary: &'static str, ok: Success) -> Self {
        Self {
            id,
            summary,
            description: "",
            path: &[],
            query: &[],
            headers: &[],
            body: Body::None,
            if_match: false,
            ok,
            errors: &[],
            role: None,
            performs: None,
            session_cookie: false,
        }
    }
    /// Performs a service operation, and needs the role it declares.
    pub const fn performs(mut self, op: &'static crate::service::Operation) -> Self {
        self.role = Some(op.role);
        self.performs = Some(op);
        self
    }
    /// A console session may read it without the bearer token.
    pub const fn session_cookie(mut self) -> Self {
        self.session_cookie = true;
        self
    }
    /// Changes what it stores: its service operation is not a read (a
    /// viewer's POSTs, such as a preview, only read).
    pub fn writes(&self) -> bool {
        self.performs.is_some_and(|op| !op.reads)
    }
    pub const fn describe(mut self, d: &'static str) -> Self {
        self.description = d;
        self
    }
    pub const fn path(mut self, p: &'static [Param]) -> Self {
        self.path = p;
        self
    }
    pub const fn query(mut self, q: &'static [Param]) -> Self {
        self.query = q;
        self
    }
    pub const fn headers(mut self, h: &'static [Param]) -> Self {
        self.headers = h;
        self
    }
    pub const fn body(mut self, b: Body) -> Self {
        self.body = b;
        self
    }
    pub const fn if_match(mut self) -> Self {
        self.if_match = true;
        self
    }
    pub const fn errors(mut self, e: &'static [u16]) -> Self {
        self.errors = e;
        self
    }
}

/// Query parameters checked against an operation's declaration: only the
/// declared ones are accepted, each at most once, each against its rule.
pub struct Params {
    op: &'static Op,
    map: BTreeMap<String, String>,
}

impl Params {
    pub fn of(req: &HttpRequest, op: &'static Op) -> Result<Self, ApiError> {
        let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
            .map_err(|e| ApiError::bad_param("query", format!("is malformed: {e}")))?;
        let mut map = BTreeMap::new();
        for (k, v) in pairs.into_inner() {
            let Some(param) = op.query.iter().find(|p| p.name == k) else {
                let known: Vec<_> = op.query.iter().map(|p| p.name).collect();
                let known = if known.is_empty() {
                    "this route takes none".to_owned()
                } else {
                    format!("known: {}", known.join(", "))
                };
                return Err(ApiError::bad_param(
                    k,
                    format!("is not a known parameter ({known})"),
                ));
            };
            param
                .check_text(&v)
                .map_err(|rule| ApiError::bad_param(k.clone(), rule))?;
            if map.insert(k.clone(), v).is_some() {
                return Err(ApiError::bad_param(k, "must be given at most once"));
            }
        }
        Ok(Self { op, map })
    }

    fn declared(&self, name: &str) -> &'static Param {
        self.op
            .query
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{}: query parameter {name} is not declared", self.op.id))
    }

    /// A text parameter, already checked against its rule.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.declared(name);
        self.map.get(name).map(String::as_str)
    }

    /// A text parameter parsed into a type whose rule the check enforced
    /// (an enum, an id); a parse failure is still reported, never hidden.
    pub fn parsed<T, E: std::fmt::Display>(
        &self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<Option<T>, ApiError> {
        self.text(name)
            .map(|s| parse(s).map_err(|e| ApiError::bad_param(name, e.to_string())))
            .transpose()
    }

    /// An integer parameter, in its declared range.
    pub fn int(&self, name: &str) -> Option<i64> {
        let p = self.declared(name);
        debug_assert!(matches!(p.rule, Rule::Int { .. }));
        self.map.get(name).map(|s| s.parse().expect("checked"))
    }
}

/// A path parameter checked against its declaration. A value that breaks
/// the rule names nothing that exists: 404, saying the rule.
pub fn path_value<'a>(param: &Param, what: &str, raw: &'a str) -> Result<&'a str, ApiError> {
    match param.check_text(raw) {
        Ok(()) => Ok(raw),
        Err(rule) => {
            let mut e = ApiError::not_found(format!("{what} {raw:?}"));
            e.field = Some(param.name.into());
            e.rule = Some(rule);
            Err(e)
        }
    }
}
