//! What WhatsApp says of each account, as the store keeps it: its
//! reach-out time-lock (active, until when) and its new-chat quota (used,
//! total, status), for the dashboard and the alert rules. Read from the
//! store at scrape time like the account states, so every daemon of a
//! cluster shows the same.

use super::labels::AccountLabel;
use herald_actors::domain::{Reading, Standing};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `status` is one of the quota's few statuses, or `unknown`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QuotaLabels {
    account: String,
    status: &'static str,
}

pub(super) struct Standings {
    timelock_active: Family<AccountLabel, Gauge>,
    timelock_until: Family<AccountLabel, Gauge>,
    quota_used: Family<AccountLabel, Gauge>,
    quota_total: Family<AccountLabel, Gauge>,
    quota_status: Family<QuotaLabels, Gauge>,
}

impl Standings {
    pub(super) fn register(r: &mut Registry) -> Self {
        let mut family = |name: &str, help: &str| {
            let f: Family<AccountLabel, Gauge> = Family::default();
            r.register(name, help, Family::clone(&f));
            f
        };
        let timelock_active = family(
            "account_timelock_active",
            "1 while WhatsApp's reach-out time-lock holds for the account, as last read",
        );
        let timelock_until = family(
            "account_timelock_until_seconds",
            "When the account's reach-out time-lock ends, as WhatsApp gave it (Unix seconds; 0 with no lock or no end given)",
        );
        let quota_used = family(
            "account_new_chat_quota_used",
            "Messages to new individual chats the account sent this quota cycle, as WhatsApp counts them",
        );
        let quota_total = family(
            "account_new_chat_quota_total",
            "The account's new-chat quota for this cycle, as WhatsApp gives it",
        );
        let quota_status = Family::default();
        r.register(
            "account_new_chat_quota_status",
            "1 for the account's new-chat quota status (none, first_warning, second_warning, capped, unknown)",
            Family::clone(&quota_status),
        );
        Self {
            timelock_active,
            timelock_until,
            quota_used,
            quota_total,
            quota_status,
        }
    }

    /// The gauges from the store: a lock that holds and its end, the
    /// quota's counts and its status (a reading never taken shows nothing).
    pub(super) fn set(&self, standings: &[(String, Standing)]) {
        for f in [
            &self.timelock_active,
            &self.timelock_until,
            &self.quota_used,
            &self.quota_total,
        ] {
            f.clear();
        }
        self.quota_status.clear();
        let now = chrono::Utc::now();
        for (account, s) in standings {
            let l = AccountLabel {
                account: account.clone(),
            };
            if let Some(lock) = s.timelock.known() {
                let holds = lock.holds_at(now);
                self.timelock_active.get_or_create(&l).set(i64::from(holds));
                let until = lock.until.filter(|_| holds).map_or(0, |u| u.timestamp());
                self.timelock_until.get_or_create(&l).set(until);
            }
            let status = match &s.quota {
                Reading::Never => continue,
                Reading::Unknown { .. } => "unknown",
                Reading::Known { value, .. } => {
                    if let Some(n) = value.used {
                        self.quota_used.get_or_create(&l).set(n as i64);
                    }
                    if let Some(n) = value.total {
                        self.quota_total.get_or_create(&l).set(n as i64);
                    }
                    value.status.as_str()
                }
            };
            self.quota_status
                .get_or_create(&QuotaLabels {
                    account: account.clone(),
                    status,
                })
                .set(1);
        }
    }
}
