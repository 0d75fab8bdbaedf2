//! The test's side of group messaging on the running server: the groups
//! the account is in and their members' devices, how the server answers
//! each group message, the receipts and poll votes the members send back,
//! and what was recorded of all that. Apart from lib.rs, which serves:
//! lib.rs calls nothing here, the tests do.

use super::{groups, receipts, Delivery, FakeWhatsApp, Group, ReceiptPlan, ReceiptSent, Verdict};
use super::{CastVote, VotePlan};
use std::sync::atomic::Ordering;

impl FakeWhatsApp {
    /// Puts the account in `groups` (answered to the participating-groups
    /// and group-info queries).
    pub fn set_groups(&self, groups: Vec<Group>) {
        *self.shared.groups.lock().unwrap() = groups;
    }

    /// `n` groups, see [`groups::numbered_groups`].
    pub fn numbered_groups(n: usize, members: usize, announce_every: usize) -> Vec<Group> {
        groups::numbered_groups(n, members, announce_every)
    }

    /// Every member of every group has `n` devices from now on: the phone
    /// and `n - 1` companions (default 1: the phone only).
    pub fn set_member_devices(&self, n: u32) {
        self.shared.member_devices.store(n.max(1), Ordering::SeqCst);
    }

    /// Makes the keys of every member device of the current groups now, so
    /// the pre-key bundles a first send asks for cost the server nothing
    /// then (a benchmark measures the client, not the server).
    pub fn prepare_keys(&self) {
        let n = self.shared.member_devices.load(Ordering::SeqCst);
        let groups = self.shared.groups.lock().unwrap().clone();
        for g in &groups {
            for m in &g.members {
                for jid in groups::member_devices(m, n) {
                    self.shared.keys_of(&jid);
                }
            }
        }
    }

    /// How the server answers each group message from now on (default: ack).
    pub fn set_policy(&self, p: impl Fn(&Delivery) -> Verdict + Send + Sync + 'static) {
        *self.shared.policy.lock().unwrap() = Some(Box::new(p));
    }

    /// Every group message received, in order (resends included).
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.deliveries.lock().unwrap().clone()
    }

    /// The receipts each group message the server acks gets from now on
    /// (`None`: none, the default).
    pub fn set_receipts(&self, plan: Option<ReceiptPlan>) {
        *self.shared.receipt_plan.lock().unwrap() = plan;
    }

    /// Receipts relayed to senders so far, in the order sent.
    pub fn receipts(&self) -> Vec<ReceiptSent> {
        let sent = self.shared.receipts_sent.lock().unwrap();
        sent.iter().map(|(r, _)| r.clone()).collect()
    }

    /// Relays every receipt relayed so far once more, to its sender's
    /// current connection, as a server replaying its queue would; answers
    /// how many went out. Not recorded in [`Self::receipts`].
    pub fn replay_receipts(&self) -> usize {
        let sent = self.shared.receipts_sent.lock().unwrap().clone();
        let logins = self.shared.logins.lock().unwrap().clone();
        sent.iter()
            .filter_map(|(r, sender)| {
                let conn = logins.get(sender)?;
                self.shared.send(*conn, receipts::node(r)).ok()
            })
            .count()
    }

    /// Pre-key bundle requests answered.
    pub fn prekey_fetches(&self) -> u64 {
        self.shared.prekey_fetches.load(Ordering::SeqCst)
    }

    /// The votes the members' phones cast on each poll the account sends
    /// from now on (`None`: none, the default). A poll already sent keeps
    /// the plan it was sent under.
    pub fn set_votes(&self, plan: Option<VotePlan>) {
        self.shared.votes.lock().unwrap().plan = plan;
    }

    /// Each voter's latest vote on each poll, cast so far (relayed to the
    /// account's linked devices, or waiting for one to log in).
    pub fn votes(&self) -> Vec<CastVote> {
        self.shared.votes.lock().unwrap().record()
    }

    /// Vote messages relayed to the account's linked devices so far: one
    /// per device a vote went to, a vote sent twice counted twice.
    pub fn votes_relayed(&self) -> u64 {
        self.shared.votes.lock().unwrap().relayed
    }

    /// Why a vote could not be sent to a linked device (no session with it
    /// and no keys uploaded, say), in order.
    pub fn vote_failures(&self) -> Vec<String> {
        self.shared.votes.lock().unwrap().failures.clone()
    }
}
