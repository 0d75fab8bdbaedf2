//! Votes the group members' phones cast on the polls the account sends,
//! so a client's tally can be checked against what was voted. When the
//! account's device sends a poll to a group, a share of the members vote,
//! and some of them later change their choice or withdraw it, as a test's
//! [`VotePlan`] says (off unless one is set). Each vote is what a member's
//! phone sends: a `PollUpdateMessage` whose selection is encrypted with
//! the poll's secret (`wacore::poll`), in a group message the phone
//! encrypts with its own sender key (`skmsg`), that key handed to each of
//! the account's linked devices in a pairwise Signal message (`pkmsg` or
//! `msg`). WhatsApp relays it to the linked devices and to other clients'
//! devices in the group (`relays.rs`); one offline at the time gets it at
//! its next login.
//!
//! What was voted is kept as each voter's latest choice ([`CastVote`]).

use super::delivery::Delivery;
use super::external::device_jid;
use super::phone::DeviceKeys;
use super::receipts::within;
use super::recipient::{bundle_of, Recipients};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use whatsapp_rust::buffa::MessageField;
use whatsapp_rust::wacore::messages::MessageUtils;
use whatsapp_rust::wacore::poll;
use whatsapp_rust::wacore::send::{should_hide_decrypt_fail, stanza_type_from_message};
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::Node;
use whatsapp_rust::waproto::whatsapp as wa;

/// Who votes on each poll the account sends, and when. Shares take the
/// first places, the same every time (as a [`super::ReceiptPlan`]'s do),
/// so a test can count what to expect.
#[derive(Debug, Clone, PartialEq)]
pub struct VotePlan {
    /// Share (0–1) of the group's members who vote (the first ones, in
    /// the group's order), `after` the poll arrived.
    pub share: f64,
    pub after: Duration,
    /// Share (0–1) of the voters who change their choice (the first
    /// voters), and of those who withdraw it (an empty vote; the last
    /// voters), `again_after` the poll arrived (not before `after`). A
    /// voter in both changes, then withdraws.
    pub change_share: f64,
    pub withdraw_share: f64,
    pub again_after: Duration,
    /// Share (0–1) of the voters (the first ones) whose first vote is
    /// relayed twice: the phone sends it again, same message id and same
    /// vote, as after a retry.
    pub repeat_share: f64,
}

/// A voter's latest vote on a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CastVote {
    pub group: String,
    /// The poll's message id.
    pub poll_id: String,
    /// The member (`user@s.whatsapp.net`: its phone votes).
    pub voter: String,
    /// The options selected, by name, in the poll's order; empty: the
    /// vote was withdrawn.
    pub options: Vec<String>,
    /// Votes the member cast on the poll (one sent twice counted once).
    pub votes: usize,
    /// The latest vote's `sender_timestamp_ms` (each of a voter's votes
    /// is later than the one before) and message id.
    pub at_ms: i64,
    pub message_id: String,
}

/// One vote of the plan: the member (its place in the group), the options
/// (their places in the poll; none: withdrawn), whether it is sent twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Planned {
    pub member: usize,
    pub options: Vec<usize>,
    pub repeat: bool,
}

/// The options member `m` picks first: one, by its place; on a poll that
/// allows more than one, every third member adds the next option.
fn first_choice(m: usize, options: usize, selectable: u32) -> Vec<usize> {
    let first = m % options;
    let mut picked = vec![first];
    if selectable != 1 && options > 1 && m % 3 == 2 {
        picked.push((first + 1) % options);
        picked.sort_unstable();
    }
    picked
}

/// Every vote on one poll: (when, after the poll arrived; what), in time
/// order. `selectable` is the poll's count (0: any number).
pub(super) fn planned(
    plan: &VotePlan,
    members: usize,
    options: usize,
    selectable: u32,
) -> Vec<(Duration, Planned)> {
    if options == 0 {
        return Vec::new();
    }
    let voters = (0..members)
        .filter(|m| within(*m, members, plan.share))
        .count();
    let again = plan.again_after.max(plan.after);
    let mut out = Vec::new();
    for m in 0..voters {
        let first = Planned {
            member: m,
            options: first_choice(m, options, selectable),
            repeat: within(m, voters, plan.repeat_share),
        };
        out.push((plan.after, first));
    }
    for m in (0..voters).filter(|m| within(*m, voters, plan.change_share)) {
        let options = vec![(m + 1) % options];
        out.push((
            again,
            Planned {
                member: m,
                options,
                repeat: false,
            },
        ));
    }
    // From the last voter back: a small share withdraws other voters'
    // votes than the ones that changed.
    for m in (0..voters).filter(|m| within(voters - 1 - m, voters, plan.withdraw_share)) {
        let options = Vec::new();
        out.push((
            again,
            Planned {
                member: m,
                options,
                repeat: false,
            },
        ));
    }
    // Stable: at one time, first votes, then changes, then withdrawals.
    out.sort_by_key(|(at, _)| *at);
    out
}

/// A poll the account sent, as its members read it.
struct Poll {
    /// The account's phone number: the poll's creator.
    author: String,
    options: Vec<String>,
    selectable: u32,
    secret: Vec<u8>,
    /// The members' phone JIDs, in the group's order.
    voters: Vec<String>,
}

/// A vote waiting for its time.
struct Due {
    at: Instant,
    group: String,
    poll_id: String,
    vote: Planned,
}

/// A login (user, device).
type Login = (u64, u32);

/// The polls sent, the votes planned on them, the stanzas waiting for
/// their device, and what was voted.
#[derive(Default)]
pub(super) struct Votes {
    pub plan: Option<VotePlan>,
    /// By (group, poll message id).
    polls: HashMap<(String, String), Poll>,
    due: Vec<Due>,
    /// Vote stanzas for devices offline at the time, oldest first.
    waiting: Vec<(Login, Node)>,
    cast: Vec<CastVote>,
    /// Vote stanzas handed to a device's connection.
    pub relayed: u64,
    /// Votes a device could not be sent, and why.
    pub failures: Vec<String>,
}

impl Votes {
    /// A group message from the account's device, accepted: when the
    /// members read a poll in it, its secret is kept and the plan's votes
    /// on it are queued. `author` is the account's phone number,
    /// `devices` each member's device JIDs, the phone first.
    pub fn sent(&mut self, d: &Delivery, author: &str, devices: &[Vec<String>], now: Instant) {
        let Some(secret) = d.read.secret.clone().filter(|_| d.read.kind == "poll") else {
            return;
        };
        let poll = Poll {
            author: author.to_owned(),
            options: d.read.options.clone(),
            selectable: d.read.selectable,
            secret,
            voters: devices.iter().filter_map(|m| m.first().cloned()).collect(),
        };
        let plan = self.plan.as_ref();
        let votes = plan.map_or(Vec::new(), |p| {
            planned(p, poll.voters.len(), poll.options.len(), poll.selectable)
        });
        for (after, vote) in votes {
            self.due.push(Due {
                at: now + after,
                group: d.group.clone(),
                poll_id: d.id.clone(),
                vote,
            });
        }
        self.polls.insert((d.group.clone(), d.id.clone()), poll);
    }

    /// Casts the votes whose time has come, in order: each voter's phone
    /// encrypts its vote for every device `to` gives for the poll's group
    /// (the account's linked devices, other clients' devices in the
    /// group), with `recipients` holding the phones' Signal state and
    /// `keys_of` their keys; `uploaded` gives a device's pre-key bundle
    /// (by its JID), for a phone that has no session with it yet. What it
    /// sends waits for [`Self::relay`].
    pub fn cast_due(
        &mut self,
        now: Instant,
        to: impl Fn(&str) -> Vec<Login>,
        recipients: &mut Recipients,
        keys_of: impl Fn(&str) -> Arc<DeviceKeys>,
        mut uploaded: impl FnMut(&str) -> Option<Node>,
    ) {
        let due: Vec<Due> = self.due.extract_if(.., |d| d.at <= now).collect();
        for d in due {
            let key = (d.group.clone(), d.poll_id.clone());
            let Some(poll) = self.polls.get(&key) else {
                continue;
            };
            let voter = poll.voters[d.vote.member].clone();
            let names: Vec<String> = d
                .vote
                .options
                .iter()
                .map(|i| poll.options[*i].clone())
                .collect();
            let at_ms = self.next_ms(&d.group, &d.poll_id, &voter);
            let message = match vote_message(&d.group, &d.poll_id, poll, &voter, &names, at_ms) {
                Ok(m) => m,
                Err(e) => {
                    self.failures.push(format!("{voter}: {e}"));
                    continue;
                }
            };
            let id = format!("3EB0{:016X}", rand::random::<u64>());
            for _ in 0..if d.vote.repeat { 2 } else { 1 } {
                let vote = Vote {
                    group: &d.group,
                    voter: &voter,
                    id: &id,
                    message: &message,
                };
                let (stanzas, failed) =
                    vote.seal(&to(&d.group), recipients, &keys_of, &mut uploaded);
                self.waiting.extend(stanzas);
                self.failures.extend(failed);
            }
            self.remember(CastVote {
                group: d.group,
                poll_id: d.poll_id,
                voter,
                options: names,
                votes: 1,
                at_ms,
                message_id: id,
            });
        }
    }

    /// Sends the stanzas waiting, oldest first, with `send`, which answers
    /// false when the device is offline: then that stanza, and every later
    /// one for the device, waits for the next call.
    pub fn relay(&mut self, mut send: impl FnMut(Login, Node) -> bool) {
        let mut offline = HashSet::new();
        for (login, node) in std::mem::take(&mut self.waiting) {
            if !offline.contains(&login) && send(login, node.clone()) {
                self.relayed += 1;
            } else {
                offline.insert(login);
                self.waiting.push((login, node));
            }
        }
    }

    /// Each voter's latest vote, in the order they first voted.
    pub fn record(&self) -> Vec<CastVote> {
        self.cast.clone()
    }

    /// A `sender_timestamp_ms` for a voter's next vote on the poll: now,
    /// or just after its last vote if that was as late.
    fn next_ms(&self, group: &str, poll_id: &str, voter: &str) -> i64 {
        let now = chrono::Utc::now().timestamp_millis();
        self.latest(group, poll_id, voter)
            .map_or(now, |v| now.max(v.at_ms + 1))
    }

    fn latest(&self, group: &str, poll_id: &str, voter: &str) -> Option<&CastVote> {
        self.cast
            .iter()
            .find(|v| v.group == group && v.poll_id == poll_id && v.voter == voter)
    }

    /// Keeps `vote` as its voter's latest on the poll.
    fn remember(&mut self, vote: CastVote) {
        let latest = self
            .cast
            .iter_mut()
            .find(|v| v.group == vote.group && v.poll_id == vote.poll_id && v.voter == vote.voter);
        match latest {
            Some(v) => {
                *v = CastVote {
                    votes: v.votes + 1,
                    ..vote
                }
            }
            None => self.cast.push(vote),
        }
    }
}

/// The vote a member's phone sends: the options' hashes encrypted with
/// the poll's secret, for this poll, creator and voter (their phone
/// JIDs), as whatsapp-rust's `Polls::vote` makes it.
fn vote_message(
    group: &str,
    poll_id: &str,
    poll: &Poll,
    voter: &str,
    names: &[String],
    at_ms: i64,
) -> Result<wa::Message, String> {
    let creator = format!("{}@s.whatsapp.net", poll.author);
    let hashes: Vec<Vec<u8>> = names
        .iter()
        .map(|n| poll::compute_option_hash(n).to_vec())
        .collect();
    let (enc_payload, iv) =
        poll::encrypt_poll_vote_with_secret(&hashes, &poll.secret, poll_id, &creator, voter)
            .map_err(|e| format!("encrypting the vote: {e}"))?;
    let update = wa::message::PollUpdateMessage {
        poll_creation_message_key: MessageField::some(wa::MessageKey {
            remote_jid: Some(group.to_owned()),
            from_me: Some(false),
            id: Some(poll_id.to_owned()),
            participant: Some(creator),
        }),
        vote: MessageField::some(wa::message::PollEncValue {
            enc_payload: Some(enc_payload),
            enc_iv: Some(iv.to_vec()),
        }),
        metadata: MessageField::none(),
        sender_timestamp_ms: Some(at_ms),
    };
    Ok(wa::Message {
        poll_update_message: MessageField::some(update),
        ..Default::default()
    })
}

/// One vote as a member's phone sends it to the group.
struct Vote<'a> {
    group: &'a str,
    /// The member's phone JID.
    voter: &'a str,
    id: &'a str,
    message: &'a wa::Message,
}

impl Vote<'_> {
    /// The stanza each device in `to` gets: the phone's sender key for the
    /// group in a pairwise message to that device (sent every time: the
    /// phone cannot tell which devices hold it), then the vote encrypted
    /// with that key. Answers the stanzas, and why a device got none.
    fn seal(
        &self,
        to: &[Login],
        recipients: &mut Recipients,
        keys_of: &impl Fn(&str) -> Arc<DeviceKeys>,
        uploaded: &mut impl FnMut(&str) -> Option<Node>,
    ) -> (Vec<(Login, Node)>, Vec<String>) {
        let padded = MessageUtils::encode_and_pad(self.message);
        let (skdm, skmsg) = match recipients.seal_group(self.voter, self.group, &padded, keys_of) {
            Ok(sealed) => sealed,
            Err(e) => return (Vec::new(), vec![e]),
        };
        let key = MessageUtils::encode_and_pad(&wa::Message {
            sender_key_distribution_message: MessageField::some(
                wa::message::SenderKeyDistributionMessage {
                    group_id: Some(self.group.to_owned()),
                    axolotl_sender_key_distribution_message: Some(skdm),
                },
            ),
            ..Default::default()
        });
        let (mut stanzas, mut failed) = (Vec::new(), Vec::new());
        for &(user, device) in to {
            let jid = device_jid(&user.to_string(), device);
            let bundle = || uploaded(&jid).map(|n| bundle_of(&n, device));
            let name = format!("{user}:{device}");
            match recipients.seal_pairwise(self.voter, &name, &key, bundle, keys_of) {
                Ok(pairwise) => stanzas.push(((user, device), self.stanza(pairwise, &skmsg))),
                Err(e) => failed.push(e),
            }
        }
        (stanzas, failed)
    }

    /// `<message from=group participant=voter>` with the pairwise part
    /// first (it carries the key the group part needs), as WhatsApp
    /// relays a group message to one device.
    fn stanza(&self, (kind, pairwise): (&'static str, Vec<u8>), skmsg: &[u8]) -> Node {
        // A vote hides a failure to decrypt it, as the phone marks it.
        let hide = should_hide_decrypt_fail(self.message);
        let enc = |kind: &'static str, bytes: Vec<u8>| {
            let b = NodeBuilder::new("enc").attr("v", "2").attr("type", kind);
            let b = if hide {
                b.attr("decrypt-fail", "hide")
            } else {
                b
            };
            b.bytes(bytes).build()
        };
        let user = self.voter.split('@').next().unwrap_or_default();
        NodeBuilder::new("message")
            .attr("from", self.group.to_owned())
            .attr("participant", self.voter.to_owned())
            .attr("id", self.id.to_owned())
            .attr("t", chrono::Utc::now().timestamp().to_string())
            .attr("type", stanza_type_from_message(self.message))
            .attr("notify", format!("Member {user}"))
            .children([enc(kind, pairwise), enc("skmsg", skmsg.to_vec())])
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::Verdict;
    use crate::external::Externals;
    use crate::phone::key_pair;
    use crate::recipient::Decrypted;
    use whatsapp_rust::wacore::libsignal::protocol::PreKeyId;
    use whatsapp_rust::wacore_binary::NodeContent;

    const GROUP: &str = "120363000000000001@g.us";
    const POLL: &str = "3EB0POLL0001";
    const ACCOUNT: &str = "15550001111";
    /// The account's linked device, as the phones name it.
    const AUTHOR: (u64, u32) = (15550001111, 6);
    const AUTHOR_JID: &str = "15550001111:6@s.whatsapp.net";
    const AUTHOR_NAME: &str = "15550001111:6";
    const OPTIONS: [&str; 3] = ["Yes", "No", "Maybe"];

    fn plan(share: f64) -> VotePlan {
        VotePlan {
            share,
            after: Duration::from_secs(1),
            change_share: 0.25,
            withdraw_share: 0.25,
            again_after: Duration::from_secs(3),
            repeat_share: 0.5,
        }
    }

    #[test]
    fn the_plan_is_the_same_every_time_and_in_time_order() {
        let p = planned(&plan(0.8), 10, 3, 1);
        assert_eq!(p, planned(&plan(0.8), 10, 3, 1));
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
        let first: Vec<&Planned> = p.iter().take(8).map(|(_, v)| v).collect();
        // ceil(10 × 0.8) = 8 members vote, the first ones, one option each
        // on a single-choice poll.
        assert!(p
            .iter()
            .take(8)
            .all(|(at, _)| *at == Duration::from_secs(1)));
        assert_eq!(
            first.iter().map(|v| v.member).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        assert!(first.iter().all(|v| v.options == vec![v.member % 3]));
        assert_eq!(first.iter().filter(|v| v.repeat).count(), 4);
        let later: Vec<&Planned> = p.iter().skip(8).map(|(_, v)| v).collect();
        assert!(p
            .iter()
            .skip(8)
            .all(|(at, _)| *at == Duration::from_secs(3)));
        // ceil(8 × 0.25) = 2 change (the first voters), to another option;
        // 2 withdraw (the last voters).
        let changed: Vec<&&Planned> = later.iter().filter(|v| !v.options.is_empty()).collect();
        assert_eq!(changed.iter().map(|v| v.member).collect::<Vec<_>>(), [0, 1]);
        assert!(changed
            .iter()
            .all(|v| v.options.len() == 1 && v.options != first[v.member].options));
        let withdrawn: Vec<usize> = later
            .iter()
            .filter(|v| v.options.is_empty())
            .map(|v| v.member)
            .collect();
        assert_eq!(withdrawn, [6, 7]);
        assert!(later.iter().all(|v| !v.repeat));
    }

    #[test]
    fn on_a_poll_of_several_choices_every_third_voter_picks_two() {
        for selectable in [0, 2] {
            let p = planned(&plan(1.0), 6, 3, selectable);
            let two: Vec<usize> = p
                .iter()
                .take(6)
                .filter(|(_, v)| v.options.len() == 2)
                .map(|(_, v)| v.member)
                .collect();
            assert_eq!(two, [2, 5], "selectable {selectable}");
            assert_eq!(p[2].1.options, vec![0, 2], "in the poll's order");
        }
        // A change comes after the first vote even if planned sooner.
        let mut early = plan(1.0);
        early.again_after = Duration::ZERO;
        let p = planned(&early, 4, 2, 1);
        assert!(p.iter().all(|(at, _)| *at == early.after));
        assert!(p.iter().take(4).all(|(_, v)| v.options.len() == 1));
    }

    fn poll() -> Poll {
        Poll {
            author: ACCOUNT.into(),
            options: OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
            selectable: 0,
            secret: vec![0x5e; 32],
            voters: vec!["15550001001@s.whatsapp.net".into()],
        }
    }

    #[test]
    fn a_vote_opens_with_the_polls_secret_for_its_creator_and_voter() {
        let voter = "15550001001@s.whatsapp.net";
        let names = vec!["Yes".to_owned(), "Maybe".to_owned()];
        let m = vote_message(GROUP, POLL, &poll(), voter, &names, 1_700_000_000_123).unwrap();
        let update = m.poll_update_message.as_option().unwrap();
        let key = update.poll_creation_message_key.as_option().unwrap();
        assert_eq!(key.remote_jid.as_deref(), Some(GROUP));
        assert_eq!(key.id.as_deref(), Some(POLL));
        assert_eq!(key.from_me, Some(false));
        assert_eq!(
            key.participant.as_deref(),
            Some("15550001111@s.whatsapp.net")
        );
        assert_eq!(update.sender_timestamp_ms, Some(1_700_000_000_123));
        let vote = update.vote.as_option().unwrap();
        let hashes = poll::decrypt_poll_vote_with_secret(
            poll::PollVoteCiphertext {
                enc_payload: vote.enc_payload.as_deref().unwrap(),
                enc_iv: vote.enc_iv.as_deref().unwrap(),
            },
            &poll().secret,
            POLL,
            "15550001111@s.whatsapp.net",
            voter,
        )
        .unwrap();
        let want: Vec<Vec<u8>> = names
            .iter()
            .map(|n| poll::compute_option_hash(n).to_vec())
            .collect();
        assert_eq!(hashes, want);
        // Under another voter's name it does not open.
        let other = poll::decrypt_poll_vote_with_secret(
            poll::PollVoteCiphertext {
                enc_payload: vote.enc_payload.as_deref().unwrap(),
                enc_iv: vote.enc_iv.as_deref().unwrap(),
            },
            &poll().secret,
            POLL,
            "15550001111@s.whatsapp.net",
            "15550001002@s.whatsapp.net",
        );
        assert!(other.is_err());
    }

    /// A poll as the members read it, sent by the account's linked device.
    fn poll_delivery() -> Delivery {
        Delivery {
            group: GROUP.into(),
            id: POLL.into(),
            kind: "poll".into(),
            media_type: None,
            edit: None,
            size: 0,
            key_shares: 0,
            at: Instant::now(),
            seen_before: 0,
            conn: 1,
            verdict: Verdict::Ack,
            read: Decrypted {
                kind: "poll".into(),
                text: Some("Coming?".into()),
                options: OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
                selectable: 1,
                secret: Some(vec![0x5e; 32]),
                devices: 2,
                ..Decrypted::default()
            },
        }
    }

    fn members() -> Vec<Vec<String>> {
        ["15550001001", "15550001002"]
            .iter()
            .map(|m| {
                vec![
                    format!("{m}@s.whatsapp.net"),
                    format!("{m}:1@s.whatsapp.net"),
                ]
            })
            .collect()
    }

    /// Each device's keys, made once.
    fn keys(jids: &[&str]) -> HashMap<String, Arc<DeviceKeys>> {
        jids.iter()
            .map(|j| ((*j).to_owned(), Arc::new(DeviceKeys::new(key_pair()))))
            .collect()
    }

    fn bytes(n: &Node) -> Vec<u8> {
        match &n.content {
            Some(NodeContent::Bytes(b)) => b.clone(),
            _ => Vec::new(),
        }
    }

    fn attr(n: &Node, k: &str) -> String {
        n.attrs.get(k).map(|v| v.to_string()).unwrap_or_default()
    }

    /// Reads a relayed vote stanza as the account's device `author` does:
    /// the pairwise part hands it the voter's sender key, the group part
    /// is the vote. Answers the pairwise part's type and the options voted.
    fn read_as_author(
        author: &mut Recipients,
        keys: &Arc<DeviceKeys>,
        stanza: &Node,
    ) -> (String, Vec<String>) {
        assert_eq!(attr(stanza, "from"), GROUP);
        assert_eq!(attr(stanza, "type"), "poll");
        let voter = attr(stanza, "participant");
        let encs = stanza.children().unwrap();
        assert_eq!(encs.len(), 2, "{stanza:?}");
        assert!(encs
            .iter()
            .all(|e| attr(e, "v") == "2" && attr(e, "decrypt-fail") == "hide"));
        let kind = attr(&encs[0], "type");
        assert_eq!(attr(&encs[1], "type"), "skmsg");
        // The voter's phone, named as the account's client names it.
        let sender = format!("{}:0", voter.trim_end_matches("@s.whatsapp.net"));
        let got = author.receive(
            GROUP,
            &sender,
            &[(AUTHOR_JID.to_owned(), kind.clone(), bytes(&encs[0]))],
            None,
            &[],
            |_| keys.clone(),
        );
        assert!(got.failures.is_empty(), "{got:?}");
        let m = author
            .open(AUTHOR_JID, GROUP, &sender, &bytes(&encs[1]))
            .unwrap();
        let update = m.poll_update_message.as_option().expect("a poll update");
        let vote = update.vote.as_option().unwrap();
        let hashes = poll::decrypt_poll_vote_with_secret(
            poll::PollVoteCiphertext {
                enc_payload: vote.enc_payload.as_deref().unwrap(),
                enc_iv: vote.enc_iv.as_deref().unwrap(),
            },
            &[0x5e; 32],
            POLL,
            "15550001111@s.whatsapp.net",
            &voter,
        )
        .unwrap();
        let names = OPTIONS
            .iter()
            .filter(|o| hashes.contains(&poll::compute_option_hash(o).to_vec()))
            .map(|o| (*o).to_owned())
            .collect();
        (kind, names)
    }

    fn everyone_votes() -> VotePlan {
        VotePlan {
            share: 1.0,
            after: Duration::ZERO,
            change_share: 0.0,
            withdraw_share: 0.0,
            again_after: Duration::ZERO,
            repeat_share: 0.0,
        }
    }

    #[test]
    fn a_phone_without_a_session_opens_one_from_the_uploaded_keys_and_the_author_reads_the_vote() {
        let author_keys = Arc::new(DeviceKeys::new(key_pair()));
        // The linked device's upload, as the client sends it.
        let mut uploads = Externals::default();
        let upload = NodeBuilder::new("iq")
            .children(author_keys.bundle(AUTHOR_JID).children().unwrap().to_vec())
            .build();
        uploads.upload(AUTHOR_JID, &upload).unwrap();
        let phones = keys(&["15550001001@s.whatsapp.net", "15550001002@s.whatsapp.net"]);
        let mut members_state = Recipients::default();
        let mut votes = Votes {
            plan: Some(everyone_votes()),
            ..Votes::default()
        };
        let now = Instant::now();
        votes.sent(&poll_delivery(), ACCOUNT, &members(), now);
        votes.cast_due(
            now,
            |_| vec![AUTHOR],
            &mut members_state,
            |j| phones[j].clone(),
            |j| {
                assert_eq!(j, AUTHOR_JID);
                uploads.bundle(j, j)
            },
        );
        assert!(votes.failures.is_empty(), "{:?}", votes.failures);
        let mut sent = Vec::new();
        votes.relay(|login, node| {
            assert_eq!(login, AUTHOR);
            sent.push(node);
            true
        });
        assert_eq!((sent.len(), votes.relayed), (2, 2));
        let mut author = Recipients::default();
        let read: Vec<(String, Vec<String>)> = sent
            .iter()
            .map(|s| read_as_author(&mut author, &author_keys, s))
            .collect();
        assert_eq!(
            read,
            [
                ("pkmsg".to_owned(), vec!["Yes".to_owned()]),
                ("pkmsg".to_owned(), vec!["No".to_owned()]),
            ]
        );
        let record = votes.record();
        assert_eq!(record.len(), 2);
        assert_eq!(record[1].voter, "15550001002@s.whatsapp.net");
        assert_eq!(
            (record[1].options.clone(), record[1].votes),
            (vec!["No".to_owned()], 1)
        );
    }

    #[test]
    fn a_phone_answers_on_the_session_the_author_opened_and_later_votes_replace_earlier_ones() {
        let author_keys = Arc::new(DeviceKeys::new(key_pair()));
        let phone = "15550001001@s.whatsapp.net";
        let phones = keys(&[phone, "15550001002@s.whatsapp.net"]);
        // The account's device sent the group its sender key: the phone
        // took it in a pkmsg, so the two share a session.
        let mut author = Recipients::default();
        let (skdm, _) = author
            .seal_group(AUTHOR_JID, GROUP, b"poll", |_| author_keys.clone())
            .unwrap();
        let key = MessageUtils::encode_and_pad(&wa::Message {
            sender_key_distribution_message: MessageField::some(
                wa::message::SenderKeyDistributionMessage {
                    group_id: Some(GROUP.into()),
                    axolotl_sender_key_distribution_message: Some(skdm),
                },
            ),
            ..Default::default()
        });
        let phone_bundle = || Some(bundle_of(&phones[phone].bundle(phone), 0));
        let (kind, pkmsg) = author
            .seal_pairwise(AUTHOR_JID, "15550001001:0", &key, phone_bundle, |_| {
                author_keys.clone()
            })
            .unwrap();
        assert_eq!(kind, "pkmsg");
        let mut members_state = Recipients::default();
        let got = members_state.receive(
            GROUP,
            AUTHOR_NAME,
            &[(phone.to_owned(), kind.to_owned(), pkmsg)],
            None,
            &[],
            |j| phones[j].clone(),
        );
        assert!(got.failures.is_empty(), "{got:?}");
        // Only the first member votes, changes, withdraws, and sends its
        // first vote twice.
        let mut votes = Votes {
            plan: Some(VotePlan {
                share: 0.5,
                change_share: 1.0,
                withdraw_share: 1.0,
                repeat_share: 1.0,
                ..everyone_votes()
            }),
            ..Votes::default()
        };
        let now = Instant::now();
        votes.sent(&poll_delivery(), ACCOUNT, &members(), now);
        votes.cast_due(
            now,
            |_| vec![AUTHOR],
            &mut members_state,
            |j| phones[j].clone(),
            |_| None,
        );
        assert!(votes.failures.is_empty(), "{:?}", votes.failures);
        let mut sent = Vec::new();
        votes.relay(|_, node| {
            sent.push(node);
            true
        });
        let read: Vec<(String, Vec<String>)> = sent
            .iter()
            .map(|s| read_as_author(&mut author, &author_keys, s))
            .collect();
        let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            read,
            [
                ("msg".to_owned(), names(&["Yes"])),
                ("msg".to_owned(), names(&["Yes"])),
                ("msg".to_owned(), names(&["No"])),
                ("msg".to_owned(), names(&[])),
            ]
        );
        // The repeat is the same message: same id.
        assert_eq!(attr(&sent[0], "id"), attr(&sent[1], "id"));
        assert_ne!(attr(&sent[1], "id"), attr(&sent[2], "id"));
        let record = votes.record();
        assert_eq!(record.len(), 1);
        let v = &record[0];
        assert_eq!((v.voter.as_str(), v.options.len(), v.votes), (phone, 0, 3));
        assert_eq!(v.message_id, attr(&sent[3], "id"));
    }

    #[test]
    fn a_stanza_for_an_offline_device_waits_and_keeps_its_order() {
        let mut votes = Votes::default();
        let (a, b) = ((1u64, 5u32), (1u64, 6u32));
        for (login, id) in [(a, "1"), (b, "2"), (a, "3")] {
            votes
                .waiting
                .push((login, NodeBuilder::new("message").attr("id", id).build()));
        }
        let mut sent = Vec::new();
        votes.relay(|login, node| {
            if login == a {
                return false;
            }
            sent.push(attr(&node, "id"));
            true
        });
        assert_eq!((sent.clone(), votes.relayed), (vec!["2".to_owned()], 1));
        votes.relay(|_, node| {
            sent.push(attr(&node, "id"));
            true
        });
        assert_eq!(sent, ["2", "1", "3"]);
        assert_eq!(votes.relayed, 3);
        assert!(votes.waiting.is_empty());
    }

    #[test]
    fn a_bundle_takes_the_uploaded_one_time_pre_key() {
        let keys = DeviceKeys::new(key_pair());
        let one_time = key_pair();
        let mut children = keys.bundle(AUTHOR_JID).children().unwrap().to_vec();
        children.push(
            NodeBuilder::new("list")
                .children([NodeBuilder::new("key")
                    .children([
                        NodeBuilder::new("id").bytes(vec![0, 1, 7]).build(),
                        NodeBuilder::new("value")
                            .bytes(one_time.public_key.public_key_bytes().to_vec())
                            .build(),
                    ])
                    .build()])
                .build(),
        );
        let mut uploads = Externals::default();
        uploads
            .upload(
                AUTHOR_JID,
                &NodeBuilder::new("iq").children(children).build(),
            )
            .unwrap();
        let b = bundle_of(&uploads.bundle(AUTHOR_JID, AUTHOR_JID).unwrap(), 6).unwrap();
        assert_eq!(b.pre_key_id().unwrap(), Some(PreKeyId::from(263u32)));
        assert_eq!(u32::from(b.signed_pre_key_id().unwrap()), 1);
        assert_eq!(u32::from(b.device_id().unwrap()), 6);
        // Handed out once: the next bundle goes without.
        let b = bundle_of(&uploads.bundle(AUTHOR_JID, AUTHOR_JID).unwrap(), 6).unwrap();
        assert_eq!(b.pre_key_id().unwrap(), None);
    }
}
