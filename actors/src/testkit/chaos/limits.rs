//! (b) never over the limit in force, in any 60 s window: the sends of
//! every account, revokes and edits with the runs' messages.

use crate::domain::AccountId;
use crate::simulator::Delivery;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// Each account's first window over `limit_at` its time, said with what
/// the window held.
pub(super) fn over_the_limit(
    by_account: BTreeMap<AccountId, Vec<&Delivery>>,
    limit_at: impl Fn(&AccountId, DateTime<Utc>) -> u32,
) -> Vec<String> {
    let mut out = Vec::new();
    for (account, mut sent) in by_account {
        sent.sort_by_key(|d| d.at);
        let mut lo = 0;
        for hi in 0..sent.len() {
            while sent[hi].at - sent[lo].at >= chrono::Duration::seconds(60) {
                lo += 1;
            }
            let limit = limit_at(&account, sent[hi].at);
            if (hi - lo + 1) as u32 > limit {
                out.push(format!(
                    "{account} sent {} messages in the 60 s before {} (limit {limit}; {})",
                    hi - lo + 1,
                    sent[hi].at,
                    describe(&sent[lo..=hi])
                ));
                break;
            }
        }
    }
    out
}

/// What a window of sends held: revokes and edits among them, and the
/// leases they went under (`node@epoch ×n`), for a replay's first look.
fn describe(window: &[&Delivery]) -> String {
    let amends = window
        .iter()
        .filter(|d| d.content.amends().is_some())
        .count();
    let mut under: BTreeMap<String, usize> = BTreeMap::new();
    for d in window {
        let key = d
            .fence
            .as_ref()
            .map_or("unfenced".to_owned(), |f| format!("{}@{}", f.node, f.epoch));
        *under.entry(key).or_default() += 1;
    }
    let under: Vec<String> = under.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
    format!(
        "{amends} revokes or edits; from {} to {}; under {}",
        window[0].at,
        window[window.len() - 1].at,
        under.join(", ")
    )
}
