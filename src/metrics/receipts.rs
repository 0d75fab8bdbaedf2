//! Receipts: the participants WhatsApp's receipts counted, and the
//! receipts that counted nothing; poll votes the same.

use super::labels::{AccountLabel, OutcomeLabel, ReceiptLabels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub(super) struct Receipts {
    pub(super) counted: Family<ReceiptLabels, Counter>,
    pub(super) uncounted: Family<OutcomeLabel, Counter>,
    pub(super) votes: Family<AccountLabel, Counter>,
    pub(super) votes_uncounted: Family<OutcomeLabel, Counter>,
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
        let votes = Family::default();
        r.register(
            "poll_votes_counted",
            "Poll votes that changed a voter's current choice in the account's polls (a first vote, a change, a withdrawal)",
            Family::clone(&votes),
        );
        let votes_uncounted = Family::default();
        r.register(
            "poll_votes_uncounted",
            "Poll votes not counted: repeated (as new as the choice kept), unknown_poll (no poll Herald sent), bad_choice (an option the poll lacks), undecryptable",
            Family::clone(&votes_uncounted),
        );
        Self {
            counted: receipts,
            uncounted: receipts_uncounted,
            votes,
            votes_uncounted,
        }
    }

    /// Drops a deleted account's series.
    pub(super) fn remove(&self, account: &str, label: &AccountLabel) {
        self.votes.remove(label);
        for kind in ["delivered", "read"] {
            self.counted.remove(&ReceiptLabels {
                account: account.to_owned(),
                kind,
            });
        }
    }
}
