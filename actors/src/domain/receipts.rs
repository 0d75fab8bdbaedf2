//! Receipts: who received and who read what a run sent, counted per group.
//!
//! WhatsApp sends the sender a receipt per member device that got a group
//! message and per member that read (or played) it. Herald counts distinct
//! *participants* per run target, not devices and not receipts: a member
//! with a phone and a laptop counts once, a receipt repeated (a replay, a
//! restart, the account's next owner hearing it again) counts once. What a
//! target remembers grows with its group's participants, never with the
//! receipts: one 16-hex-digit token per participant seen, keyed by the
//! target so the same person is not linkable across groups.

use super::{AccountId, GroupJid};
use crate::domain::fnv64;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// How many leading characters of a message id a receipt carries: Herald's
/// ids are 24 characters and go on the wire cut to WhatsApp Web's 22
/// (`gateway::whatsapp::ids`), so a receipt is matched on these.
pub const RECEIPT_ID_LEN: usize = 22;

/// The part of `id` a receipt is matched on.
pub fn receipt_key(id: &str) -> &str {
    id.get(..RECEIPT_ID_LEN).unwrap_or(id)
}

/// What a receipt says of its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptKind {
    /// One of the participant's devices has it.
    Delivered,
    /// The participant read it (or played it: a voice note or video).
    Read,
}

impl ReceiptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Read => "read",
        }
    }
}

/// One receipt for one message, as a gateway heard it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The account that sent the message (the receipt came to it).
    pub account: AccountId,
    /// The group the message went to.
    pub chat: GroupJid,
    /// The message's id, whole or as WhatsApp carries it ([`receipt_key`]).
    pub message_id: String,
    /// The participant, without its device: `user@server`.
    pub participant: String,
    pub kind: ReceiptKind,
    pub at: DateTime<Utc>,
}

/// A participant JID without its device suffix: `123:4@s.whatsapp.net` and
/// `123@s.whatsapp.net` are the same person.
pub fn participant_of(jid: &str) -> String {
    match jid.split_once('@') {
        Some((user, server)) => {
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            format!("{user}@{server}")
        }
        None => jid.split_once(':').map_or(jid, |(u, _)| u).to_owned(),
    }
}

/// One run target's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct TargetReceipts {
    /// Participants with the message on at least one device.
    pub delivered: u32,
    /// Participants who read (or played) it.
    pub read: u32,
    pub first_receipt_at: Option<DateTime<Utc>>,
    pub last_receipt_at: Option<DateTime<Utc>>,
    /// When its first reader was counted: the run's read curve is drawn from
    /// these. Null where nobody read it, and for groups counted before
    /// Herald kept it (their reads are in `read`, not on the curve).
    pub first_read_at: Option<DateTime<Utc>>,
}

/// A run's counts over its targets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct RunReceipts {
    /// Groups where at least one participant has the message.
    pub groups_delivered: u32,
    /// Groups where at least one participant read it.
    pub groups_read: u32,
    /// Participants reached, summed over the groups.
    pub delivered: u64,
    /// Participants who read it, summed over the groups.
    pub read: u64,
    pub first_receipt_at: Option<DateTime<Utc>>,
    pub last_receipt_at: Option<DateTime<Utc>>,
}

impl RunReceipts {
    /// Adds one target's counts.
    pub fn add(&mut self, t: &TargetReceipts) {
        self.groups_delivered += u32::from(t.delivered > 0);
        self.groups_read += u32::from(t.read > 0);
        self.delivered += u64::from(t.delivered);
        self.read += u64::from(t.read);
        self.first_receipt_at = min_opt(self.first_receipt_at, t.first_receipt_at);
        self.last_receipt_at = self.last_receipt_at.max(t.last_receipt_at);
    }
}

fn min_opt(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What one batch of receipts did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiptTally {
    /// Participants newly counted, per account and kind.
    pub counted: HashMap<(AccountId, ReceiptKind), u64>,
    /// Receipts that changed nothing: a participant counted already, or a
    /// group at its participant count.
    pub repeated: u64,
    /// Receipts for no message Herald knows (not Herald's, another chat's,
    /// another account's, or of a run retention removed).
    pub ignored: u64,
    /// Targets whose counts were written (a row each).
    pub targets_written: u64,
    /// Store transactions (the counter's batches).
    pub batches: u64,
    /// The batch's poll votes.
    pub votes: super::VoteTally,
}

impl ReceiptTally {
    pub fn counted(&self, kind: ReceiptKind) -> u64 {
        self.counted
            .iter()
            .filter(|((_, k), _)| *k == kind)
            .map(|(_, n)| n)
            .sum()
    }

    pub fn merge(&mut self, other: ReceiptTally) {
        for (k, n) in other.counted {
            *self.counted.entry(k).or_default() += n;
        }
        self.repeated += other.repeated;
        self.ignored += other.ignored;
        self.targets_written += other.targets_written;
        self.batches += other.batches;
        self.votes.merge(other.votes);
    }
}

/// The participants a target has counted for one kind: a set of tokens,
/// stored as their 16-hex-digit concatenation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeenSet(HashSet<u64>);

impl SeenSet {
    /// Reads a stored set; a token that is not 16 hex digits is skipped
    /// (the counts stay as stored, this set only decides what is new).
    pub fn parse(s: &str) -> Self {
        Self(
            s.as_bytes()
                .chunks_exact(16)
                // Digits only: `from_str_radix` alone would take a sign.
                .filter(|c| c.iter().all(u8::is_ascii_hexdigit))
                .filter_map(|c| u64::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
                .collect(),
        )
    }

    pub fn encode(&self) -> String {
        let mut tokens: Vec<&u64> = self.0.iter().collect();
        tokens.sort_unstable();
        tokens.iter().map(|t| format!("{t:016x}")).collect()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The token of `participant` in target `target_id`.
fn token(target_id: i64, participant: &str) -> u64 {
    fnv64(format!("herald:receipt:{target_id}:{participant}").as_bytes())
}

/// One target's receipts being merged: what the store holds for it, and the
/// batch's receipts added one by one. Both stores use it, so the counting
/// rules are written once.
#[derive(Debug, Clone)]
pub struct TargetTally {
    pub target_id: i64,
    pub delivered: SeenSet,
    pub read: SeenSet,
    pub first_at: Option<DateTime<Utc>>,
    pub last_at: Option<DateTime<Utc>>,
    /// The earliest read counted.
    pub first_read_at: Option<DateTime<Utc>>,
    /// The most participants that can be counted: the group's others than
    /// the sending account, when its directory knows them.
    pub cap: Option<u32>,
    pub changed: bool,
}

impl TargetTally {
    /// `participants`: the group's participants in the account's directory
    /// (the account itself among them), if it is there.
    pub fn new(target_id: i64, participants: Option<u32>) -> Self {
        Self {
            target_id,
            delivered: SeenSet::default(),
            read: SeenSet::default(),
            first_at: None,
            last_at: None,
            first_read_at: None,
            cap: participants.filter(|n| *n > 0).map(|n| n - 1),
            changed: false,
        }
    }

    fn room(&self, set: &SeenSet) -> bool {
        self.cap.is_none_or(|cap| set.len() < cap as usize)
    }

    /// Adds a receipt; answers the kinds newly counted (a read also counts
    /// its participant as reached: a delivery receipt can come late or
    /// never from a device that was offline while the phone read it).
    pub fn add(
        &mut self,
        participant: &str,
        kind: ReceiptKind,
        at: DateTime<Utc>,
    ) -> Vec<ReceiptKind> {
        let t = token(self.target_id, participant);
        let mut new = Vec::new();
        if !self.delivered.0.contains(&t) && self.room(&self.delivered) {
            self.delivered.0.insert(t);
            new.push(ReceiptKind::Delivered);
        }
        // Only a participant counted as reached can be counted as a reader,
        // so `read` never exceeds `delivered` nor the group.
        if kind == ReceiptKind::Read && self.delivered.0.contains(&t) && !self.read.0.contains(&t) {
            self.read.0.insert(t);
            new.push(ReceiptKind::Read);
            self.first_read_at = min_opt(self.first_read_at, Some(at));
        }
        if !new.is_empty() {
            self.first_at = min_opt(self.first_at, Some(at));
            self.last_at = self.last_at.max(Some(at));
            self.changed = true;
        }
        new
    }

    pub fn counts(&self) -> TargetReceipts {
        TargetReceipts {
            delivered: self.delivered.len() as u32,
            read: self.read.len() as u32,
            first_receipt_at: self.first_at,
            last_receipt_at: self.last_at,
            first_read_at: self.first_read_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn a_stored_set_keeps_tokens_of_sixteen_hex_digits_only() {
        let good = format!("{:016x}{:016x}", 1u64, u64::MAX);
        assert_eq!(SeenSet::parse(&good).len(), 2);
        assert_eq!(SeenSet::parse(&good).encode(), good);
        // A sign is no digit: "+" followed by 15 digits is not a token.
        let signed = format!("+{:015x}{:016x}", 1u64, 2u64);
        assert_eq!(SeenSet::parse(&signed).encode(), format!("{:016x}", 2u64));
        assert!(SeenSet::parse("zzzzzzzzzzzzzzzz").is_empty());
    }

    #[test]
    fn a_participant_counts_once_whatever_its_devices_and_repeats() {
        let mut t = TargetTally::new(7, None);
        let p = participant_of("15550001:3@s.whatsapp.net");
        assert_eq!(p, "15550001@s.whatsapp.net");
        assert_eq!(
            t.add(&p, ReceiptKind::Delivered, at(5)),
            vec![ReceiptKind::Delivered]
        );
        assert!(t
            .add(
                &participant_of("15550001@s.whatsapp.net"),
                ReceiptKind::Delivered,
                at(6)
            )
            .is_empty());
        assert_eq!(t.add(&p, ReceiptKind::Read, at(9)), vec![ReceiptKind::Read]);
        assert!(t.add(&p, ReceiptKind::Read, at(12)).is_empty());
        let c = t.counts();
        assert_eq!((c.delivered, c.read), (1, 1));
        assert_eq!(
            (c.first_receipt_at, c.last_receipt_at),
            (Some(at(5)), Some(at(9)))
        );
        // The first read, not the first receipt nor a repeated read.
        assert_eq!(c.first_read_at, Some(at(9)));
    }

    #[test]
    fn a_read_counts_its_reader_as_reached_and_counts_stop_at_the_group() {
        // 3 participants with the account: at most 2 others.
        let mut t = TargetTally::new(1, Some(3));
        assert_eq!(
            t.add("a@s.whatsapp.net", ReceiptKind::Read, at(1)),
            vec![ReceiptKind::Delivered, ReceiptKind::Read]
        );
        t.add("b@s.whatsapp.net", ReceiptKind::Delivered, at(2));
        assert!(t
            .add("c@s.whatsapp.net", ReceiptKind::Read, at(3))
            .is_empty());
        assert_eq!((t.counts().delivered, t.counts().read), (2, 1));
    }

    #[test]
    fn a_stored_set_reads_back_as_written_and_keeps_counting_once() {
        let mut t = TargetTally::new(3, None);
        for i in 0..50 {
            t.add(&format!("{i}@lid"), ReceiptKind::Delivered, at(i));
        }
        let stored = t.delivered.encode();
        assert_eq!(stored.len(), 50 * 16);
        let mut back = TargetTally::new(3, None);
        back.delivered = SeenSet::parse(&stored);
        assert_eq!(back.delivered, t.delivered);
        assert!(back.add("7@lid", ReceiptKind::Delivered, at(99)).is_empty());
        assert_eq!(back.add("50@lid", ReceiptKind::Delivered, at(99)).len(), 1);
        // The same person in another group is another token.
        assert_ne!(token(3, "7@lid"), token(4, "7@lid"));
    }

    #[test]
    fn receipts_match_on_the_wire_length_of_an_id() {
        assert_eq!(
            receipt_key("3EB0AABBCCDDEEFF00112233"),
            "3EB0AABBCCDDEEFF001122"
        );
        assert_eq!(receipt_key("3EB0AABB"), "3EB0AABB");
    }

    #[test]
    fn a_run_sums_its_groups() {
        let mut r = RunReceipts::default();
        r.add(&TargetReceipts {
            delivered: 3,
            read: 0,
            first_receipt_at: Some(at(4)),
            last_receipt_at: Some(at(8)),
            first_read_at: None,
        });
        r.add(&TargetReceipts {
            delivered: 2,
            read: 2,
            first_receipt_at: Some(at(2)),
            last_receipt_at: Some(at(6)),
            first_read_at: Some(at(5)),
        });
        r.add(&TargetReceipts::default());
        assert_eq!(
            (r.groups_delivered, r.groups_read, r.delivered, r.read),
            (2, 1, 5, 2)
        );
        assert_eq!(
            (r.first_receipt_at, r.last_receipt_at),
            (Some(at(2)), Some(at(8)))
        );
    }
}
