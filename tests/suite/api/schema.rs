//! A small JSON Schema checker, enough for the OpenAPI document's subset
//! ($ref, allOf, anyOf, oneOf, const, enum, type, required, properties,
//! additionalProperties: false, items, minimum/maximum, min/maxItems), so
//! tests can check real answers against the documented schemas.

use super::helpers::TestApp;
use serde_json::Value;

pub fn check(doc: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let target = doc
            .pointer(r.trim_start_matches('#'))
            .ok_or_else(|| format!("{at}: dangling {r}"))?;
        return check(doc, target, v, at);
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            check(doc, s, v, at)?;
        }
    }
    if let Some(alts) = schema.get("oneOf").and_then(Value::as_array) {
        let errors: Vec<String> = alts
            .iter()
            .filter_map(|s| check(doc, s, v, at).err())
            .collect();
        if alts.len() - errors.len() != 1 {
            return Err(format!(
                "{at}: {} of {} oneOf alternatives match {v} ({errors:?})",
                alts.len() - errors.len(),
                alts.len()
            ));
        }
    }
    if let Some(alts) = schema.get("anyOf").and_then(Value::as_array) {
        let errors: Vec<String> = alts
            .iter()
            .filter_map(|s| check(doc, s, v, at).err())
            .collect();
        if errors.len() == alts.len() {
            return Err(format!(
                "{at}: no anyOf alternative matches {v} ({errors:?})"
            ));
        }
    }
    if let Some(c) = schema.get("const") {
        if c != v {
            return Err(format!("{at}: {v} is not {c}"));
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!("{at}: {v} is not one of {e:?}"));
        }
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.iter().any(|t| is_type(v, t)) {
            return Err(format!("{at}: {v} is not {types:?}"));
        }
    }
    if let Some(n) = v.as_f64() {
        if schema
            .get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n < m)
        {
            return Err(format!("{at}: {n} below minimum"));
        }
        if schema
            .get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n > m)
        {
            return Err(format!("{at}: {n} above maximum"));
        }
    }
    if let Value::Object(map) = v {
        if let Some(req) = schema.get("required").and_then(Value::as_array) {
            for k in req.iter().filter_map(Value::as_str) {
                if !map.contains_key(k) {
                    return Err(format!("{at}: missing {k}"));
                }
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, x) in map {
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(doc, s, x, &format!("{at}.{k}"))?,
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("{at}: {k} is not documented"))
                }
                None => {}
            }
        }
    }
    if let Value::Array(items) = v {
        if let Some(s) = schema.get("items") {
            for (i, x) in items.iter().enumerate() {
                check(doc, s, x, &format!("{at}[{i}]"))?;
            }
        }
        let n = items.len() as u64;
        if schema
            .get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
        {
            return Err(format!("{at}: fewer than minItems"));
        }
        if schema
            .get("maxItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| n > m)
        {
            return Err(format!("{at}: more than maxItems"));
        }
    }
    Ok(())
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => false,
    }
}

impl TestApp {
    /// Asserts `v` matches the documented component schema `name`.
    pub async fn assert_schema(&self, name: &str, v: &Value) {
        let doc = self.get("/openapi.json").await.json;
        let schema = serde_json::json!({ "$ref": format!("#/components/schemas/{name}") });
        if let Err(e) = check(&doc, &schema, v, name) {
            panic!("answer does not match the documented {name}: {e}\n{v:#}");
        }
    }
}
