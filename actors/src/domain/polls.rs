//! Polls: a reminder part that asks, and the votes that come back, counted
//! as WhatsApp counts them.
//!
//! A member's device sends a vote as an encrypted update naming the poll's
//! message and the *hashes* of the options chosen (SHA-256 of each
//! option's text). Each vote carries the whole current choice: a later
//! vote from the same voter replaces an earlier one, an empty one
//! withdraws it. Herald keeps per group and poll one row per voter who
//! voted (the latest choice and its time), never one per vote message, so
//! a vote repeated after a restart or heard by the account's next owner
//! changes nothing, and an older vote heard late cannot undo a newer one.

use super::{fnv64, AccountId, GroupJid, RunId};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// How WhatsApp names an option in a vote: SHA-256 of its text.
pub fn option_hash(option: &str) -> [u8; 32] {
    Sha256::digest(option.as_bytes()).into()
}

/// One vote as a gateway heard (and decrypted) it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote {
    /// The account that sent the poll (the vote came to it).
    pub account: AccountId,
    /// The group the poll went to.
    pub chat: GroupJid,
    /// The poll message's id, whole or as WhatsApp carries it.
    pub poll_id: String,
    /// The voter, without its device, under the phone-number address where
    /// the gateway knows it (a LID and a phone number of one person must
    /// reach the counter as one voter).
    pub voter: String,
    /// The hashes ([`option_hash`]) of the options chosen; empty withdraws.
    pub options: Vec<[u8; 32]>,
    /// When the voter's device cast it (its own timestamp): the latest wins.
    pub at: DateTime<Utc>,
}

/// A run's poll part as it was sent, kept with the run so its votes are
/// read against the options the members saw, whatever happens to the
/// reminder later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct RunPoll {
    /// The part's position in the reminder (from 0).
    pub part: u32,
    /// The question as written (a template: each group saw its rendering).
    pub question: String,
    pub options: Vec<String>,
    pub multiple: bool,
}

/// One group's copy of a run's poll: the message a vote names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollMessage {
    pub target_id: i64,
    pub part: u32,
    /// The poll message's id as a receipt or vote carries it
    /// ([`crate::domain::receipt_key`]).
    pub key: String,
}

/// Why a vote was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VoteIgnored {
    /// For no poll Herald sent (another's, another chat's, another
    /// account's, or of a run retention removed).
    UnknownPoll,
    /// It names an option the poll does not have, or several options of a
    /// single-choice poll.
    BadChoice,
    /// A gateway could not open it (no secret for the poll, or the
    /// decryption failed).
    Undecryptable,
}

impl VoteIgnored {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownPoll => "unknown_poll",
            Self::BadChoice => "bad_choice",
            Self::Undecryptable => "undecryptable",
        }
    }
}

/// The options a vote chose, as a bit per option (bit `i` for option
/// `i`); 0 is a withdrawn vote.
pub fn choices_of(poll: &RunPoll, hashes: &[[u8; 32]]) -> Result<u16, VoteIgnored> {
    let mut bits = 0u16;
    for h in hashes {
        let i = poll
            .options
            .iter()
            .position(|o| option_hash(o) == *h)
            .ok_or(VoteIgnored::BadChoice)?;
        bits |= 1 << i;
    }
    if !poll.multiple && bits.count_ones() > 1 {
        return Err(VoteIgnored::BadChoice);
    }
    Ok(bits)
}

/// The token a voter is kept under in one group's poll: keyed by the
/// target, so one person is not linkable across groups, and 16 hex digits
/// whatever the address's length.
pub fn voter_token(target_id: i64, part: u32, voter: &str) -> String {
    format!(
        "{:016x}",
        fnv64(format!("herald:vote:{target_id}:{part}:{voter}").as_bytes())
    )
}

/// One voter's current choice, ready for the store: of a batch, only each
/// voter's latest vote is kept ([`latest_votes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoterChoice {
    pub target_id: i64,
    pub run_id: RunId,
    pub part: u32,
    pub voter: String,
    pub choices: u16,
    pub at: DateTime<Utc>,
}

/// Where one poll went: a run's target (one group), the part, and the
/// account that sent it, as a store finds them by the vote's poll id.
#[derive(Debug, Clone, Copy)]
pub struct PollSent<'a> {
    pub target_id: i64,
    pub run_id: RunId,
    pub part: u32,
    pub account: &'a str,
    pub group: &'a str,
}

/// A vote heard for the poll `sent`, as the voter's choice to keep: it
/// counts only if it came to the account that sent the poll, from the
/// group it went to (else it is for a poll Herald did not send there), and
/// chose only the poll's options, as many as it allows.
pub fn voter_choice(
    v: &Vote,
    sent: PollSent<'_>,
    poll: &RunPoll,
) -> Result<(AccountId, VoterChoice), VoteIgnored> {
    if v.account.as_str() != sent.account || v.chat.as_str() != sent.group {
        return Err(VoteIgnored::UnknownPoll);
    }
    let choice = VoterChoice {
        target_id: sent.target_id,
        run_id: sent.run_id,
        part: sent.part,
        voter: voter_token(sent.target_id, sent.part, &v.voter),
        choices: choices_of(poll, &v.options)?,
        at: v.at,
    };
    Ok((v.account.clone(), choice))
}

/// Of several votes for the same voter in the same poll, the latest;
/// a tie keeps the one seen first (a repeat changes nothing).
pub fn latest_votes(votes: Vec<(AccountId, VoterChoice)>) -> Vec<(AccountId, VoterChoice)> {
    let mut by_key: HashMap<(i64, u32, String), usize> = HashMap::new();
    let mut out: Vec<(AccountId, VoterChoice)> = Vec::with_capacity(votes.len());
    for (account, v) in votes {
        let key = (v.target_id, v.part, v.voter.clone());
        match by_key.get(&key) {
            Some(&i) if out[i].1.at >= v.at => {}
            Some(&i) => out[i] = (account, v),
            None => {
                by_key.insert(key, out.len());
                out.push((account, v));
            }
        }
    }
    out
}

/// What one batch of votes did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoteTally {
    /// Votes that changed a voter's current choice, per account.
    pub counted: HashMap<AccountId, u64>,
    /// Votes that changed nothing: a repeat, or older than the choice kept.
    pub repeated: u64,
    /// Votes not counted, per reason.
    pub ignored: HashMap<VoteIgnored, u64>,
    /// Store transactions (the counter's batches).
    pub batches: u64,
}

impl VoteTally {
    pub fn counted_total(&self) -> u64 {
        self.counted.values().sum()
    }

    pub fn ignored_total(&self) -> u64 {
        self.ignored.values().sum()
    }

    pub fn ignore(&mut self, why: VoteIgnored, n: u64) {
        if n > 0 {
            *self.ignored.entry(why).or_default() += n;
        }
    }

    pub fn merge(&mut self, other: VoteTally) {
        for (k, n) in other.counted {
            *self.counted.entry(k).or_default() += n;
        }
        for (k, n) in other.ignored {
            *self.ignored.entry(k).or_default() += n;
        }
        self.repeated += other.repeated;
        self.batches += other.batches;
    }
}

/// One option's count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct OptionVotes {
    pub option: String,
    /// Voters whose current choice includes it.
    pub votes: u64,
}

/// Counts of one poll over a set of voters' current choices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PollCounts {
    /// Per option, in the poll's order.
    pub options: Vec<OptionVotes>,
    /// Voters with a current choice (a withdrawn vote is none).
    pub voters: u64,
}

impl PollCounts {
    /// Zero for every option of `poll`.
    pub fn empty(poll: &RunPoll) -> Self {
        Self {
            options: poll
                .options
                .iter()
                .map(|o| OptionVotes {
                    option: o.clone(),
                    votes: 0,
                })
                .collect(),
            voters: 0,
        }
    }

    /// Adds `voters` voters and, per option `i`, `per_option[i]` votes.
    pub fn add(&mut self, voters: u64, per_option: &[u64]) {
        self.voters += voters;
        for (o, n) in self.options.iter_mut().zip(per_option) {
            o.votes += n;
        }
    }
}

/// One group's answer to one of a run's polls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct GroupPoll {
    pub target_id: i64,
    pub position: u32,
    pub group: GroupJid,
    #[serde(flatten)]
    pub counts: PollCounts,
}

/// A run's answer to one of its polls, over all its groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PollResult {
    #[serde(flatten)]
    pub poll: RunPoll,
    #[serde(flatten)]
    pub counts: PollCounts,
    /// Groups where at least one voter has a current choice.
    pub groups_voted: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn poll(multiple: bool) -> RunPoll {
        RunPoll {
            part: 0,
            question: "Coming?".into(),
            options: vec!["Yes".into(), "No".into(), "Maybe".into()],
            multiple,
        }
    }

    #[test]
    fn option_hash_is_whatsapps_sha256_of_the_text() {
        // SHA-256("Yes"), as WhatsApp clients compute an option's hash.
        assert_eq!(
            hex::encode(option_hash("Yes")),
            "85a39ab345d672ff8ca9b9c6876f3adcacf45ee7c1e2dbd2408fd338bd55e07e"
        );
    }

    #[test]
    fn choices_name_options_by_hash() {
        let p = poll(true);
        let h = |s: &str| option_hash(s);
        assert_eq!(choices_of(&p, &[h("No")]), Ok(0b010));
        assert_eq!(choices_of(&p, &[h("Yes"), h("Maybe")]), Ok(0b101));
        assert_eq!(choices_of(&p, &[]), Ok(0), "an empty vote withdraws");
        assert_eq!(
            choices_of(&p, &[h("Never")]),
            Err(VoteIgnored::BadChoice),
            "an option the poll does not have"
        );
        assert_eq!(
            choices_of(&poll(false), &[h("Yes"), h("No")]),
            Err(VoteIgnored::BadChoice),
            "two options of a single-choice poll"
        );
    }

    #[test]
    fn a_vote_counts_only_from_the_group_the_poll_went_to_on_the_account_that_sent_it() {
        let account = AccountId::parse("acct").unwrap();
        let group = GroupJid::parse("120363000000000001@g.us").unwrap();
        let vote = |account: &AccountId, chat: &GroupJid, options: Vec<[u8; 32]>| Vote {
            account: account.clone(),
            chat: chat.clone(),
            poll_id: "3EB0AA".into(),
            voter: "15551112222@s.whatsapp.net".into(),
            options,
            at: DateTime::from_timestamp(7, 0).unwrap(),
        };
        let sent = PollSent {
            target_id: 4,
            run_id: RunId(2),
            part: 1,
            account: "acct",
            group: group.as_str(),
        };
        let p = poll(false);
        let (who, c) = voter_choice(&vote(&account, &group, vec![option_hash("No")]), sent, &p)
            .expect("counted");
        assert_eq!(who, account);
        assert_eq!(
            (c.target_id, c.run_id, c.part, c.choices),
            (4, RunId(2), 1, 0b010)
        );
        assert_eq!(c.voter, voter_token(4, 1, "15551112222@s.whatsapp.net"));
        let other_group = GroupJid::parse("120363000000000002@g.us").unwrap();
        let other_account = AccountId::parse("other").unwrap();
        for (a, g) in [(&account, &other_group), (&other_account, &group)] {
            assert_eq!(
                voter_choice(&vote(a, g, vec![option_hash("No")]), sent, &p),
                Err(VoteIgnored::UnknownPoll)
            );
        }
        assert_eq!(
            voter_choice(
                &vote(&account, &group, vec![option_hash("Never")]),
                sent,
                &p
            ),
            Err(VoteIgnored::BadChoice)
        );
    }

    fn choice(voter: &str, at: i64, choices: u16) -> (AccountId, VoterChoice) {
        (
            AccountId::parse("acct").unwrap(),
            VoterChoice {
                target_id: 1,
                run_id: RunId(1),
                part: 0,
                voter: voter.into(),
                choices,
                at: DateTime::from_timestamp(at, 0).unwrap(),
            },
        )
    }

    #[test]
    fn of_a_batch_each_voters_latest_vote_is_kept() {
        let kept = latest_votes(vec![
            choice("a", 10, 1),
            choice("b", 10, 2),
            choice("a", 30, 0),
            choice("a", 20, 4),
            choice("b", 10, 4),
        ]);
        let kept: Vec<_> = kept
            .iter()
            .map(|(_, v)| (v.voter.as_str(), v.choices))
            .collect();
        assert_eq!(kept, vec![("a", 0), ("b", 2)]);
    }

    proptest! {
        /// Whatever order a voter's votes arrive in, and however often each
        /// is repeated, what is kept is the one cast last.
        #[test]
        fn the_latest_vote_wins_in_any_order(
            mut votes in proptest::collection::vec((0u8..4, 0i64..1000, 0u16..8), 1..40),
            seed in any::<u64>(),
        ) {
            // Distinct times per voter: two votes of one device never share one.
            votes.sort_by_key(|v| (v.0, v.1));
            votes.dedup_by_key(|v| (v.0, v.1));
            let mut latest: HashMap<u8, (i64, u16)> = HashMap::new();
            for (voter, at, c) in &votes {
                let e = latest.entry(*voter).or_insert((*at, *c));
                if *at >= e.0 { *e = (*at, *c); }
            }
            use rand::{RngExt, SeedableRng};
            let mut rng = crate::domain::SeededRng::seed_from_u64(seed);
            let mut shuffled: Vec<_> = votes
                .iter()
                .flat_map(|v| std::iter::repeat_n(*v, 1 + rng.random_range(0..2usize)))
                .collect();
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, rng.random_range(0..=i));
            }
            let kept = latest_votes(
                shuffled.iter().map(|(v, at, c)| choice(&v.to_string(), *at, *c)).collect(),
            );
            prop_assert_eq!(kept.len(), latest.len());
            for (_, v) in kept {
                let want = latest[&v.voter.parse::<u8>().unwrap()];
                prop_assert_eq!((v.at.timestamp(), v.choices), want);
            }
        }
    }
}
