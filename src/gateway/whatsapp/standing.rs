//! WhatsApp's two answers about an account, decoded: the reach-out
//! time-lock (`FetchReachoutTimelock`) and the new-chat quota
//! (`FetchNewChatMessageCappingInfo`), both MEX (GraphQL) queries. What
//! cannot be asked now (not connected, no answer in time) leaves the last
//! reading; what comes back unreadable (an unknown document id, fields
//! missing or malformed) is `Unreadable`, shown as unknown.

use chrono::{DateTime, Utc};
use herald_actors::domain::{NewChatQuota, QuotaStatus, TimeLock};
use herald_actors::ports::StandingError;
use whatsapp_rust::features::{MexError, MexResponse, ReachoutTimelock};
use whatsapp_rust::request::IqError;

fn not_answered(e: MexError) -> StandingError {
    match e {
        // The query was asked and answered with something unreadable: an
        // error naming the document (a stale id), or no decodable JSON.
        MexError::Request(IqError::ParseError(e)) => StandingError::Unreadable(e.to_string()),
        MexError::Request(IqError::ServerError { code, text, .. }) => {
            StandingError::Unreadable(format!("WhatsApp refused the query: {code} {text}"))
        }
        MexError::Request(e) => StandingError::NotNow(e.to_string()),
        other => StandingError::Unreadable(other.to_string()),
    }
}

/// A Unix time in seconds (or, from a larger number, milliseconds).
fn unix(t: i64) -> Option<DateTime<Utc>> {
    if t <= 0 {
        return None;
    }
    if t > 100_000_000_000 {
        DateTime::from_timestamp_millis(t)
    } else {
        DateTime::from_timestamp(t, 0)
    }
}

/// The time-lock query's answer.
pub fn timelock(answer: Result<ReachoutTimelock, MexError>) -> Result<TimeLock, StandingError> {
    let lock = answer.map_err(not_answered)?;
    let active = lock
        .is_active
        .ok_or_else(|| StandingError::Unreadable("the time-lock answer has no is_active".into()))?;
    // "0" or nothing: no end given.
    let until = match lock.time_enforcement_ends.as_deref().map(str::trim) {
        None | Some("") | Some("0") => None,
        Some(t) => Some(t.parse::<i64>().ok().and_then(unix).ok_or_else(|| {
            StandingError::Unreadable(format!("the time-lock's end {t:?} is not a Unix time"))
        })?),
    };
    Ok(TimeLock {
        active,
        until,
        kind: lock.enforcement_type,
    })
}

/// The quota query's answer.
pub fn quota(answer: Result<MexResponse, MexError>) -> Result<NewChatQuota, StandingError> {
    use whatsapp_rust::wacore::iq::mex_operations::fetch_new_chat_message_capping_info as q;
    let data = answer
        .map_err(not_answered)?
        .data
        .ok_or_else(|| StandingError::Unreadable("the quota answer has no data".into()))?;
    let info = serde_json::from_value::<q::Response>(data)
        .map_err(|e| StandingError::Unreadable(format!("the quota answer: {e}")))?
        .xwa2_message_capping_info
        .ok_or_else(|| StandingError::Unreadable("the quota answer has no capping info".into()))?;
    let status = info.capping_status.as_deref().ok_or_else(|| {
        StandingError::Unreadable("the quota answer has no capping_status".into())
    })?;
    let status = QuotaStatus::from_whatsapp(status).ok_or_else(|| {
        StandingError::Unreadable(format!(
            "the quota status {status:?} is not one Herald knows"
        ))
    })?;
    let count = |v: Option<String>, what: &str| -> Result<Option<u64>, StandingError> {
        v.map(|t| {
            t.trim().parse::<u64>().map_err(|_| {
                StandingError::Unreadable(format!("the quota's {what} {t:?} is not a count"))
            })
        })
        .transpose()
    };
    Ok(NewChatQuota {
        status,
        used: count(info.used_quota, "used")?,
        total: count(info.total_quota, "total")?,
        cycle_start: info.cycle_start_timestamp.and_then(unix),
        cycle_end: info.cycle_end_timestamp.and_then(unix),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lock(v: serde_json::Value) -> Result<TimeLock, StandingError> {
        timelock(Ok(serde_json::from_value(v).unwrap()))
    }

    fn cap(v: serde_json::Value) -> Result<NewChatQuota, StandingError> {
        quota(Ok(serde_json::from_value(v).unwrap()))
    }

    #[test]
    fn time_locks_read_as_whatsapp_gives_them() {
        let l = lock(
            json!({"is_active": true, "time_enforcement_ends": "1796205600",
                            "enforcement_type": "DEFAULT"}),
        )
        .unwrap();
        assert!(l.active);
        assert_eq!(l.until, DateTime::from_timestamp(1_796_205_600, 0));
        assert_eq!(l.kind.as_deref(), Some("DEFAULT"));
        let free = lock(json!({"is_active": false, "time_enforcement_ends": "0"})).unwrap();
        assert_eq!((free.active, free.until), (false, None));
        for bad in [
            json!({"time_enforcement_ends": "1796205600"}),
            json!({"is_active": true, "time_enforcement_ends": "soon"}),
        ] {
            assert!(matches!(lock(bad), Err(StandingError::Unreadable(_))));
        }
    }

    #[test]
    fn quotas_read_as_whatsapp_gives_them_and_an_unknown_answer_is_unreadable() {
        let q = cap(json!({"data": {"xwa2_message_capping_info": {
            "capping_status": "SECOND_WARNING", "used_quota": "45", "total_quota": "50",
            "cycle_start_timestamp": 1_796_100_000, "cycle_end_timestamp": 1_796_186_400}}}))
        .unwrap();
        assert_eq!(q.status, QuotaStatus::SecondWarning);
        assert_eq!((q.used, q.total), (Some(45), Some(50)));
        assert_eq!(q.cycle_end, DateTime::from_timestamp(1_796_186_400, 0));
        for bad in [
            json!({"data": null}),
            json!({"data": {"xwa2_message_capping_info": {"capping_status": "MAYBE"}}}),
            json!({"data": {"xwa2_message_capping_info": {"used_quota": "1"}}}),
            json!({"data": {"xwa2_message_capping_info": {"capping_status": "NONE",
                   "used_quota": "many"}}}),
        ] {
            assert!(matches!(cap(bad), Err(StandingError::Unreadable(_))));
        }
        // A stale document id: WhatsApp's error, read as unknown.
        let stale = MexError::Request(IqError::ParseError(anyhow::anyhow!(
            "MEX fatal error (query=WAWebMexFetchNewChatMessageCappingInfoJobQuery, code=400): \
             document not found"
        )));
        assert!(
            matches!(quota(Err(stale)), Err(StandingError::Unreadable(m)) if m.contains("document not found"))
        );
        assert!(matches!(
            quota(Err(MexError::Request(IqError::NotConnected))),
            Err(StandingError::NotNow(_))
        ));
    }
}
