//! The audit trail of one write through `/v1` or the console: who, when,
//! what and from where, written after the write answers, with its
//! status. A refused write (403) is recorded too, so an attempt beyond a
//! role is on the trail. Reads are not recorded.

use super::errors::ApiError;
use super::forward::AnsweredElsewhere;
use super::principal::Principal;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::{web, HttpMessage};
use chrono::Utc;
use herald_actors::domain::NewAuditEntry;
use herald_actors::ports::IdentityStore;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// A request body this small is read into the summary; a larger one (a
/// picture) is summarised by its type and size.
const SUMMARY_BODY_MAX: u64 = 16 * 1024;
/// The summary's length in characters, at most.
const SUMMARY_CHARS: usize = 400;
/// Strings in a summary are cut to this many characters.
const SUMMARY_STRING_CHARS: usize = 80;
/// Fields never copied into the audit log.
const SECRET_FIELDS: &[&str] = &["csrf", "token", "secret", "password"];

/// Where the trail is written: the audit log's store.
pub struct Log(Arc<dyn IdentityStore>);

impl Log {
    pub fn new(store: Arc<dyn IdentityStore>) -> Self {
        Self(store)
    }
}

/// One write on its way to the audit log.
pub struct Trail {
    store: Option<Arc<dyn IdentityStore>>,
    entry: NewAuditEntry,
}

impl Trail {
    /// A write by `who` through `via` (`api` or `console`) that is, or
    /// performs, the `/v1` operation `operation`.
    pub fn new(
        req: &ServiceRequest,
        via: &str,
        operation: &str,
        resource: Option<String>,
        who: &Principal,
    ) -> Self {
        let remote = super::peer::remote_of(req.request());
        Self {
            store: req.app_data::<web::Data<Log>>().map(|l| l.0.clone()),
            entry: NewAuditEntry {
                at: Utc::now(),
                actor: who.name.clone(),
                actor_id: who.user_id,
                role: Some(who.role),
                via: via.into(),
                operation: operation.into(),
                method: req.method().to_string(),
                path: super::attempts::bounded_path(req.path()),
                resource,
                summary: String::new(),
                status: 0,
                remote,
                count: 1,
                forwarded_by: None,
            },
        }
    }

    /// Names the daemon that forwarded the write here, if one did.
    pub fn forwarded_by(mut self, node: Option<String>) -> Self {
        self.entry.forwarded_by = node;
        self
    }

    /// Reads a small JSON or form body into the summary and puts it back
    /// for the handler; other bodies are described by type and size.
    pub async fn read_body(&mut self, mut req: ServiceRequest) -> ServiceRequest {
        let kind = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let length = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let json = kind.starts_with("application/json") || kind.contains("+json");
        let form = kind.starts_with("application/x-www-form-urlencoded");
        self.entry.summary = match length {
            None | Some(0) => String::new(),
            Some(n) if (json || form) && n <= SUMMARY_BODY_MAX => {
                match req.extract::<web::Bytes>().await {
                    Ok(bytes) => {
                        let summary = summarize(&bytes, form);
                        req.set_payload(bytes.into());
                        summary
                    }
                    Err(_) => format!("{kind}, {n} bytes (unreadable)"),
                }
            }
            Some(n) => format!("{kind}, {n} bytes"),
        };
        req
    }

    /// Records the write as it ended: the status it answered, or the
    /// error the route failed with (one entry either way), unless another
    /// daemon answered it and audited it there.
    pub async fn outcome<B>(self, res: &Result<ServiceResponse<B>, actix_web::Error>) {
        match res {
            Ok(res)
                if res
                    .request()
                    .extensions()
                    .get::<AnsweredElsewhere>()
                    .is_some() => {}
            Ok(res) => self.record(res).await,
            Err(e) => {
                let status = e.as_response_error().status_code().as_u16();
                self.write(status).await;
            }
        }
    }

    /// Records the write with the status it answered.
    pub async fn record<B>(mut self, res: &ServiceResponse<B>) {
        if self.entry.resource.is_none() {
            // A creation names what it made in `Location`.
            self.entry.resource = res
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|l| l.rsplit('/').next())
                .map(str::to_owned);
        }
        self.write(res.status().as_u16()).await;
    }

    /// Records a write refused before it ran.
    pub async fn refused(mut self, req: &ServiceRequest, e: &ApiError) {
        if self.entry.summary.is_empty() {
            self.entry.summary = e.detail.clone();
        }
        let _ = req;
        self.write(e.kind.status().as_u16()).await;
    }

    async fn write(mut self, status: u16) {
        self.entry.status = status;
        let Some(store) = self.store else { return };
        // The write has happened: a failure here is logged loudly rather
        // than turned into an error the client would retry.
        if let Err(e) = store.append_audit(&self.entry).await {
            tracing::error!(
                error = %e,
                actor = %self.entry.actor,
                operation = %self.entry.operation,
                path = %self.entry.path,
                status,
                "could not write the audit log entry for a write"
            );
        }
    }
}

/// A compact, bounded, secret-free rendering of a JSON or form body.
pub fn summarize(body: &[u8], form: bool) -> String {
    let value = if form {
        let mut map = Map::new();
        for (k, v) in form_urlencoded::parse(body) {
            match map.get_mut(k.as_ref()) {
                Some(Value::Array(items)) => items.push(Value::String(v.into_owned())),
                Some(one) => *one = json!([one.take(), v.into_owned()]),
                None => {
                    map.insert(k.into_owned(), Value::String(v.into_owned()));
                }
            }
        }
        Value::Object(map)
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => return format!("{} bytes, not JSON", body.len()),
        }
    };
    let mut text = compact(&value).to_string();
    if text.chars().count() > SUMMARY_CHARS {
        text = text.chars().take(SUMMARY_CHARS - 1).collect::<String>() + "…";
    }
    text
}

fn compact(v: &Value) -> Value {
    match v {
        Value::String(s) if s.chars().count() > SUMMARY_STRING_CHARS => {
            Value::String(s.chars().take(SUMMARY_STRING_CHARS - 1).collect::<String>() + "…")
        }
        Value::Array(a) if a.len() > 8 => Value::String(format!("[{} items]", a.len())),
        Value::Array(a) => Value::Array(a.iter().map(compact).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| !SECRET_FIELDS.contains(&k.to_ascii_lowercase().as_str()))
                .map(|(k, v)| (k.clone(), compact(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_short_and_keep_no_secret() {
        let body = br#"{"title":"Standup","token":"hrld_x","targets":[1,2,3,4,5,6,7,8,9],"text":"#;
        let long = format!(
            "{}\"{}\"}}",
            std::str::from_utf8(body).unwrap(),
            "y".repeat(500)
        );
        let s = summarize(long.as_bytes(), false);
        assert!(s.contains("\"title\":\"Standup\""), "{s}");
        assert!(s.contains("[9 items]"), "{s}");
        assert!(!s.contains("hrld_x"), "{s}");
        assert!(s.chars().count() <= SUMMARY_CHARS, "{s}");
        let f = summarize(b"csrf=abc&name=ana&role=viewer&g=1&g=2", true);
        assert!(!f.contains("abc"), "{f}");
        assert!(f.contains("\"name\":\"ana\""), "{f}");
        assert!(f.contains("[\"1\",\"2\"]"), "{f}");
        assert_eq!(summarize(b"not json", false), "8 bytes, not JSON");
    }
}
