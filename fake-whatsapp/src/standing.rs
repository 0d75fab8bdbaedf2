//! What the fake server says of the account's standing, as WhatsApp does:
//! the reach-out time-lock and the new-chat quota, answered to WhatsApp
//! Web's two MEX (GraphQL) queries — `<iq xmlns="w:mex" type="get">` with
//! `<query query_id="…">{"variables":…}</query>`, answered with
//! `<result>{"data":…}</result>` — in the shapes both whatsapp-rust and
//! Baileys decode. While the time-lock holds, every group message is
//! nacked with 463.

use chrono::{DateTime, Utc};
use whatsapp_rust::serde_json::{self, json, Value};
use whatsapp_rust::wacore::iq::mex_operations::{
    fetch_new_chat_message_capping_info as quota_query, fetch_reachout_timelock as lock_query,
};
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::Node;
#[cfg(test)]
use whatsapp_rust::wacore_binary::NodeContent;

/// The new-chat quota as the fake reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// WhatsApp's spelling: `NONE`, `FIRST_WARNING`, `SECOND_WARNING`,
    /// `CAPPED`.
    pub status: String,
    pub used: u64,
    pub total: u64,
    pub cycle_start: DateTime<Utc>,
    pub cycle_end: DateTime<Utc>,
}

impl Default for Quota {
    fn default() -> Self {
        let now = Utc::now();
        Self {
            status: "NONE".into(),
            used: 0,
            total: 50,
            cycle_start: now - chrono::Duration::days(1),
            cycle_end: now + chrono::Duration::days(27),
        }
    }
}

/// The account's standing on the fake server.
#[derive(Debug, Clone, Default)]
pub struct Standing {
    /// The time-lock's end: active, and sends nacked with 463, until then.
    pub locked_until: Option<DateTime<Utc>>,
    pub quota: Quota,
    /// Answer the quota query as WhatsApp answers a document id it does
    /// not know (a stale id): a GraphQL error, no data.
    pub forget_quota_document: bool,
    /// Queries answered, by document id.
    pub asked: Vec<String>,
}

impl Standing {
    /// The time-lock holds at `now`.
    pub fn locked(&self, now: DateTime<Utc>) -> bool {
        self.locked_until.is_some_and(|u| now < u)
    }

    /// The `<result>` of a MEX query, or `None` for a query the fake does
    /// not answer (its caller answers it with an error).
    pub fn answer(&mut self, query: &Node) -> Option<Node> {
        let id = query.attrs.get("query_id")?.to_string();
        self.asked.push(id.clone());
        let now = Utc::now();
        let body = if id == lock_query::DOC_ID {
            let holds = self.locked(now);
            let ends = self
                .locked_until
                .filter(|_| holds)
                .map_or("0".to_owned(), |u| u.timestamp().to_string());
            json!({ "data": { "xwa2_fetch_account_reachout_timelock": {
                "is_active": holds,
                "time_enforcement_ends": ends,
                "enforcement_type": if holds { "DEFAULT" } else { "" },
            } } })
        } else if id == quota_query::DOC_ID && !self.forget_quota_document {
            let q = &self.quota;
            json!({ "data": { "xwa2_message_capping_info": {
                "capping_status": q.status,
                "used_quota": q.used.to_string(),
                "total_quota": q.total.to_string(),
                "cycle_start_timestamp": q.cycle_start.timestamp(),
                "cycle_end_timestamp": q.cycle_end.timestamp(),
                "server_sent_timestamp": now.timestamp(),
            } } })
        } else if id == quota_query::DOC_ID {
            unknown_document(&id)
        } else {
            return None;
        };
        let bytes = serde_json::to_vec(&body).expect("JSON");
        Some(NodeBuilder::new("result").bytes(bytes).build())
    }
}

/// WhatsApp's answer to a persisted query it does not know.
fn unknown_document(id: &str) -> Value {
    json!({ "data": null, "errors": [{
        "message": format!("PersistedQueryNotFound: document not found ({id})"),
        "extensions": { "error_code": 400, "is_summary": true, "is_retryable": false,
                        "severity": "CRITICAL" },
    }] })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(id: &str) -> Node {
        NodeBuilder::new("query")
            .attr("query_id", id.to_owned())
            .bytes(br#"{"variables":{}}"#.to_vec())
            .build()
    }

    fn data(n: &Node) -> Value {
        match &n.content {
            Some(NodeContent::Bytes(b)) => serde_json::from_slice(b).unwrap(),
            _ => panic!("no bytes"),
        }
    }

    #[test]
    fn both_queries_answer_in_whatsapps_shape() {
        let mut s = Standing::default();
        let free = data(&s.answer(&query(lock_query::DOC_ID)).unwrap());
        assert_eq!(
            free["data"]["xwa2_fetch_account_reachout_timelock"]["is_active"],
            false
        );
        let until = Utc::now() + chrono::Duration::minutes(20);
        s.locked_until = Some(until);
        let locked = data(&s.answer(&query(lock_query::DOC_ID)).unwrap());
        let l = &locked["data"]["xwa2_fetch_account_reachout_timelock"];
        assert_eq!(l["is_active"], true);
        assert_eq!(l["time_enforcement_ends"], until.timestamp().to_string());
        s.quota.status = "SECOND_WARNING".into();
        s.quota.used = 45;
        let q = data(&s.answer(&query(quota_query::DOC_ID)).unwrap());
        let q = &q["data"]["xwa2_message_capping_info"];
        assert_eq!(
            (q["capping_status"].as_str(), q["used_quota"].as_str()),
            (Some("SECOND_WARNING"), Some("45"))
        );
        s.forget_quota_document = true;
        let e = data(&s.answer(&query(quota_query::DOC_ID)).unwrap());
        assert!(e["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("document not found"));
        assert!(s.answer(&query("123")).is_none());
        assert_eq!(s.asked.len(), 5);
    }
}
