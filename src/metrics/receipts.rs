//! Receipts: the participants WhatsApp's receipts counted, and the
//! receipts that counted nothing.

use super::labels::{OutcomeLabel, ReceiptLabels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub(super) struct Receipts {
    pub(super) counted: Family<ReceiptLabels, Counter>,
    pub(super) uncounted: Family<OutcomeLabel, Counter>,
}

impl Receipts {
    pub(super) fn register(r: &mut Registry) -> Self {
        let receipts = Family::default();
        r.register(
            "receipts_counted",
            "Participants counted from WhatsApp's receipts for the account's group messages, by kind (delivered, read)",
            Family::clone(&receipts),
        );
        let receipts_uncounted = Family::default();
        r.register(
            "receipts_uncounted",
            "Receipts that counted nothing: a participant already counted (repeated) or no message of a run (ignored)",
            Family::clone(&receipts_uncounted),
        );
        Self {
            counted: receipts,
            uncounted: receipts_uncounted,
        }
    }

    /// Drops a deleted account's series.
    pub(super) fn remove(&self, account: &str) {
        for kind in ["delivered", "read"] {
            self.counted.remove(&ReceiptLabels {
                account: account.to_owned(),
                kind,
            });
        }
    }
}
