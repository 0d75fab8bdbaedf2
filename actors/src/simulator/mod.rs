//! [`Simulator`]: the simulated WhatsApp, Herald's embedded default gateway.
//!
//! It is a model to test and plan capacity against, not a stub: requests take
//! time (on tokio's clock, so paused time makes a day of sending take
//! milliseconds), accounts know only their own groups, sending too fast is
//! answered with rate limits and then a temporary ban, message ids are
//! deduplicated, uploads expire, and failures can be injected. Every delivered
//! message is logged so tests and `herald simulate` can check pacing and
//! exactly-once delivery afterwards.
//!
//! Model of one send: WhatsApp decides on the message when the request
//! arrives, which the simulator takes to be the moment of the call (the log's
//! timestamp and the rate window use that instant); the configured latency is
//! the wait for the acknowledgement. So a caller that gives up mid-latency
//! (a stop, a crash) has still delivered, which is exactly the case that
//! resending with the same message id must cover.
//!
//! State is sharded per account in a `DashMap`; a guard is only held inside
//! synchronous code, never across an `.await`.
//!
//! Imports: `domain` and `ports` (the gateway port it implements), nothing of
//! the engine that drives it.

mod gateway;
mod journal;
pub mod risk;
#[cfg(test)]
mod tests;

use journal::{parse_journal_with_len, JournalLine};
pub use journal::{read_journal, DeliveredContent, Delivery, DeliveryRecord};

use crate::domain::SeededRng;
use crate::domain::{
    fnv64, option_hash, AccountId, GroupInfo, GroupJid, MediaId, Receipt, ReceiptKind, TimeLock,
    UploadHandle, Vote,
};
use crate::ports::{
    Clock, Gateway, GatewayError, OutgoingMessage, ReceiptSink, SendReceipt, StandingError,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dashmap::DashMap;
use rand::{RngExt, SeedableRng};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The rate window WhatsApp's anti-spam is modelled on.
const WINDOW: Duration = Duration::from_secs(60);

/// How long a request waits for its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    Zero,
    Fixed(Duration),
    /// Drawn uniformly from `min..=max` for every request.
    Uniform {
        min: Duration,
        max: Duration,
    },
}

/// The simulator's knobs. `Default` is WhatsApp-like; [`SimConfig::instant`]
/// removes every delay and limit for throughput benchmarks.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Round trip of one send or upload request.
    pub latency: Latency,
    /// Upload bandwidth in bytes per second; `None` is infinite. An upload
    /// takes `bytes / bandwidth` plus one latency.
    pub upload_bytes_per_sec: Option<u64>,
    /// Deliveries an account may make in any 60-second window; one more is
    /// answered `RateLimited` with the time until the window has room.
    /// `None` disables rate limiting (and so bans).
    pub rate_limit_per_minute: Option<u32>,
    /// An account that keeps pushing after being told to slow down, i.e.
    /// collects this many `RateLimited` answers within 60 seconds, is banned
    /// for `ban_duration`; the refusal that crosses the line already answers
    /// `Banned`. `None` never bans.
    pub ban_after_refusals: Option<u32>,
    pub ban_duration: Duration,
    /// How long an upload handle stays usable.
    pub upload_ttl: Duration,
    /// Probability that a send fails with `Transient` before reaching
    /// WhatsApp (nothing is delivered).
    pub transient_failure_rate: f64,
    /// Seeds the per-account random streams (latency and transient failures),
    /// so a run is reproducible for the same sequence of calls per account.
    pub seed: u64,
    /// The ban-risk model (identical content, regular intervals, no
    /// typing, volume above the account's age): warnings, then a
    /// temporary ban. `None`: only speed is judged.
    pub risk: Option<crate::simulator::risk::RiskModel>,
    /// Age in days of a newly paired account, for the risk model's
    /// allowance (see [`Simulator::set_account_age`]).
    pub account_age_days: u32,
    /// The receipts a delivered message gets from the group's other
    /// participants, handed to [`Simulator::with_receipts`]'s sink. `None`:
    /// none (a simulation of sends only).
    pub receipts: Option<SimReceipts>,
    /// The votes a delivered poll gets from the group's other
    /// participants, handed to the same sink. `None`: nobody votes.
    pub votes: Option<SimVotes>,
}

/// Votes on a simulated poll: the first `share` of each group's other
/// participants vote `after` it arrives; of those, every `change_every`-th
/// votes again `later` with another choice and every `withdraw_every`-th
/// (counted from the second) withdraws `later` (0: none); every
/// `repeat_every`-th vote is relayed twice, as a server replaying its queue
/// does, and a replayed second vote brings its voter's first again after
/// it, as a device that was offline does (0: never).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimVotes {
    pub share: f64,
    pub after: Duration,
    pub later: Duration,
    pub change_every: u32,
    pub withdraw_every: u32,
    pub repeat_every: u32,
}

impl Default for SimVotes {
    fn default() -> Self {
        Self {
            share: 0.6,
            after: Duration::from_secs(5),
            later: Duration::from_secs(60),
            change_every: 4,
            withdraw_every: 7,
            repeat_every: 5,
        }
    }
}

/// The simulator's own record of a poll's votes: each voter's latest
/// choice (option texts), withdrawn votes left out. What Herald's tally
/// must equal.
pub type CastVotes = std::collections::BTreeMap<String, Vec<String>>;

/// Receipts from a simulated group: each other participant's phone
/// delivers at once, the first `read_share` of them read after
/// `read_after`; every `repeat_every`-th receipt is relayed twice, as a
/// server replaying its queue does (0: never).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimReceipts {
    pub read_share: f64,
    pub read_after: Duration,
    pub repeat_every: u32,
}

/// The participants of a simulated group, the account among them (as a
/// participating-groups query counts them).
pub fn sim_participants(group: &GroupJid) -> u32 {
    2 + (fnv64(group.as_str().as_bytes()) % 250) as u32
}

/// The `i`-th other participant of a simulated group.
pub fn sim_member(group: &GroupJid, i: u32) -> String {
    let h = fnv64(group.as_str().as_bytes()) % 100_000;
    format!("1{h:05}{i:04}@s.whatsapp.net")
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Latency::Uniform {
                min: Duration::from_millis(80),
                max: Duration::from_millis(400),
            },
            upload_bytes_per_sec: Some(2_000_000),
            rate_limit_per_minute: Some(60),
            // Above a typical group concurrency, so the few sends already in
            // flight when the first RateLimited comes back do not ban the account.
            ban_after_refusals: Some(10),
            ban_duration: Duration::from_secs(3600),
            upload_ttl: Duration::from_secs(7 * 24 * 3600),
            transient_failure_rate: 0.0,
            seed: 0,
            risk: None,
            account_age_days: 365,
            receipts: None,
            votes: None,
        }
    }
}

impl SimConfig {
    /// No latency, infinite bandwidth, no rate limit: measures Herald, not WhatsApp.
    pub fn instant() -> Self {
        Self {
            latency: Latency::Zero,
            upload_bytes_per_sec: None,
            rate_limit_per_minute: None,
            ban_after_refusals: None,
            ..Self::default()
        }
    }
}

/// What an account may do in a group it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupAccess {
    Member,
    /// Only admins may post: sends answer `NotAllowed`.
    AdminsOnly,
    /// The account was removed or left: sends answer `NotParticipant`.
    NotParticipant,
}

/// Counters of one account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccountStats {
    pub delivered: u64,
    /// Sends answered `duplicate: true` (same message id again).
    pub dedup_hits: u64,
    /// Deliveries that repeated content already delivered to the same group.
    pub duplicate_deliveries: u64,
    pub rate_limited: u64,
    pub bans: u64,
    pub transient_failures: u64,
    pub uploads: u64,
    pub upload_bytes: u64,
    /// Typing presences shown.
    pub typing: u64,
    /// Risk-model warnings (answered as rate limits).
    pub warnings: u64,
    /// Sends refused for carrying an older lease epoch than one seen before.
    pub fenced: u64,
}

struct Upload {
    media: MediaId,
    expires_at: DateTime<Utc>,
}

struct SimAccount {
    id: AccountId,
    groups: HashMap<GroupJid, GroupAccess>,
    /// Names set by [`Simulator::set_group_name`]; others get one from their JID.
    names: HashMap<GroupJid, String>,
    /// Groups this account is an admin of (it may post in admins-only ones).
    admin_of: HashSet<GroupJid>,
    logged_out: bool,
    banned_until: Option<DateTime<Utc>>,
    /// The socket is down and the client is reconnecting until then:
    /// `ready` waits for it, and a `send` written meanwhile is held by the
    /// client and leaves when the socket is back, as WhatsApp Web clients do.
    reconnecting_until: Option<DateTime<Utc>>,
    /// Deliveries inside the current 60 s window (only kept when rate limiting).
    recent: VecDeque<DateTime<Utc>>,
    /// `RateLimited` answers inside the current 60 s window.
    refusals: VecDeque<DateTime<Utc>>,
    accepted_ids: HashSet<String>,
    injected: VecDeque<GatewayError>,
    uploads: HashMap<String, Upload>,
    rng: SeededRng,
    log: Vec<Delivery>,
    delivered_content: HashSet<(GroupJid, String)>,
    stats: AccountStats,
    risk: crate::simulator::risk::RiskState,
    /// The newest lease epoch a fenced send has carried for this account.
    fence_epoch: Option<i64>,
    /// WhatsApp's reach-out time-lock: until then every send is refused
    /// with 463, and a time-lock query answers when it ends.
    timelock_until: Option<DateTime<Utc>>,
}

impl SimAccount {
    fn new(seed: u64, account: &AccountId, age_days: u32) -> Self {
        Self {
            id: account.clone(),
            groups: HashMap::new(),
            names: HashMap::new(),
            admin_of: HashSet::new(),
            logged_out: false,
            banned_until: None,
            reconnecting_until: None,
            recent: VecDeque::new(),
            refusals: VecDeque::new(),
            accepted_ids: HashSet::new(),
            injected: VecDeque::new(),
            uploads: HashMap::new(),
            // Per-account streams keep each account reproducible however
            // the accounts' calls interleave.
            rng: SeededRng::seed_from_u64(seed ^ fnv64(account.as_str().as_bytes())),
            log: Vec::new(),
            delivered_content: HashSet::new(),
            stats: AccountStats::default(),
            risk: crate::simulator::risk::RiskState::new(age_days),
            fence_epoch: None,
            timelock_until: None,
        }
    }

    /// Raises the newest epoch seen to `epoch`, or refuses an older one.
    fn raise_fence(&mut self, epoch: i64) -> Result<(), GatewayError> {
        match self.fence_epoch {
            Some(seen) if epoch < seen => Err(GatewayError::Fenced { sent: epoch, seen }),
            _ => {
                self.fence_epoch = Some(epoch);
                Ok(())
            }
        }
    }

    fn draw_latency(&mut self, latency: Latency) -> Duration {
        match latency {
            Latency::Zero => Duration::ZERO,
            Latency::Fixed(d) => d,
            Latency::Uniform { min, max } if min >= max => min,
            Latency::Uniform { min, max } => self.rng.random_range(min..=max),
        }
    }

    /// The account-level gate every request passes first.
    fn check_session(&mut self, now: DateTime<Utc>) -> Result<(), GatewayError> {
        if self.logged_out {
            return Err(GatewayError::LoggedOut);
        }
        match self.banned_until {
            Some(until) if now < until => Err(GatewayError::Banned { until: Some(until) }),
            Some(_) => {
                self.banned_until = None;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// Entries at or before `now - 60 s` have left the window `(now - 60 s, now]`.
fn prune(q: &mut VecDeque<DateTime<Utc>>, now: DateTime<Utc>) {
    let cutoff = now - WINDOW;
    while q.front().is_some_and(|t| *t <= cutoff) {
        q.pop_front();
    }
}

/// The simulated WhatsApp. Share it as `Arc<Simulator>`: the engine uses it
/// as a `Gateway`, tests and `herald simulate` read its log.
pub struct Simulator {
    config: SimConfig,
    clock: Arc<dyn Clock>,
    accounts: DashMap<AccountId, SimAccount>,
    seq: AtomicU64,
    upload_seq: AtomicU64,
    /// Append-only record of deliveries and uploads (see [`Simulator::with_journal`]).
    journal: Option<std::sync::Mutex<std::fs::File>>,
    /// Where the members' receipts and votes go (see [`SimConfig::receipts`]).
    receipts: Option<ReceiptSink>,
    /// Votes cast so far, by account, group and poll message id.
    cast: Arc<DashMap<(AccountId, GroupJid, String), CastVotes>>,
}

impl Simulator {
    /// Times come from `clock`: with [`crate::ports::TokioClock`] on paused
    /// time, the log carries virtual timestamps.
    pub fn new(config: SimConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            config,
            clock,
            accounts: DashMap::new(),
            seq: AtomicU64::new(0),
            upload_seq: AtomicU64::new(0),
            journal: None,
            receipts: None,
            cast: Arc::default(),
        }
    }

    /// Each voter's latest choice on the poll `message_id` the account sent
    /// to `group`, as cast so far.
    pub fn cast_votes(&self, account: &AccountId, group: &GroupJid, message_id: &str) -> CastVotes {
        self.cast
            .get(&(account.clone(), group.clone(), message_id.to_owned()))
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Every poll's votes cast so far: (account, group, message id) → votes.
    pub fn all_cast_votes(&self) -> Vec<((AccountId, GroupJid, String), CastVotes)> {
        self.cast
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect()
    }

    /// The votes of a poll just delivered: a share of the other
    /// participants vote after a while, some change or withdraw later.
    fn plan_votes(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message_id: &str,
        options: &[String],
        multiple: bool,
    ) {
        let (Some(sink), Some(plan)) = (&self.receipts, self.config.votes) else {
            return;
        };
        let others = sim_participants(group) - 1;
        let voters = (f64::from(others) * plan.share.clamp(0.0, 1.0)).ceil() as u32;
        let n = options.len() as u64;
        // A choice is a pure function of the poll, the voter and the round.
        let pick = |i: u32, round: u32| -> Vec<String> {
            let h = fnv64(format!("{message_id}:{i}:{round}").as_bytes());
            if multiple {
                let bits = (h % ((1 << n) - 1)) + 1;
                (0..n as usize)
                    .filter(|b| bits & (1 << b) != 0)
                    .map(|b| options[b].clone())
                    .collect()
            } else {
                vec![options[(h % n) as usize].clone()]
            }
        };
        let now = self.clock.now();
        let (first_at, then_at) = (now + plan.after, now + plan.after + plan.later);
        let mut first = Vec::new();
        let mut then = Vec::new();
        for i in 0..voters {
            let voter = sim_member(group, i);
            first.push((voter.clone(), pick(i, 0), first_at));
            let every = |k: u32| k > 0 && i % k == 0;
            if every(plan.change_every) {
                let mut again = pick(i, 1);
                if again == pick(i, 0) {
                    again = pick(i, 2);
                }
                then.push((voter, again, then_at));
            } else if plan.withdraw_every > 0 && i % plan.withdraw_every == 1 {
                then.push((voter, Vec::new(), then_at));
            }
        }
        let times = move |i: usize| {
            1 + usize::from(plan.repeat_every > 0 && i.is_multiple_of(plan.repeat_every as usize))
        };
        let (sink, cast) = (sink.clone(), self.cast.clone());
        let key = (account.clone(), group.clone(), message_id.to_owned());
        tokio::spawn(async move {
            let mut earlier: HashMap<String, Vote> = HashMap::new();
            let mut stale = Vec::new();
            for (wait, round) in [(plan.after, first), (plan.later, then)] {
                tokio::time::sleep(wait).await;
                for (i, (voter, chosen, at)) in round.into_iter().enumerate() {
                    {
                        let mut votes = cast.entry(key.clone()).or_default();
                        if chosen.is_empty() {
                            votes.remove(&voter);
                        } else {
                            votes.insert(voter.clone(), chosen.clone());
                        }
                    }
                    let vote = Vote {
                        account: key.0.clone(),
                        chat: key.1.clone(),
                        poll_id: key.2.clone(),
                        voter,
                        options: chosen.iter().map(|o| option_hash(o)).collect(),
                        at,
                    };
                    for _ in 0..times(i) {
                        sink.offer_vote(vote.clone());
                    }
                    // A replay may bring the voter's earlier vote again,
                    // well after the new one: it must not undo it.
                    match earlier.remove(&vote.voter) {
                        Some(old) if times(i) > 1 => stale.push(old),
                        Some(_) => {}
                        None => {
                            earlier.insert(vote.voter.clone(), vote);
                        }
                    }
                }
            }
            tokio::time::sleep(plan.after).await;
            for old in stale {
                sink.offer_vote(old);
            }
        });
    }

    /// Hands the receipts [`SimConfig::receipts`] plans to `sink`.
    pub fn with_receipts(mut self, sink: ReceiptSink) -> Self {
        self.receipts = Some(sink);
        self
    }

    /// The receipts of a message just delivered: the other participants'
    /// deliveries now, the readers' later.
    fn hear(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
    ) {
        if let OutgoingMessage::Poll {
            options, multiple, ..
        } = message
        {
            self.plan_votes(account, group, message_id, options, *multiple);
        }
        let (Some(sink), Some(plan)) = (&self.receipts, self.config.receipts) else {
            return;
        };
        let others = sim_participants(group) - 1;
        let readers = (f64::from(others) * plan.read_share.clamp(0.0, 1.0)).ceil() as u32;
        let receipt = |i: u32, kind: ReceiptKind, at| Receipt {
            account: account.clone(),
            chat: group.clone(),
            message_id: message_id.to_owned(),
            participant: sim_member(group, i),
            kind,
            at,
        };
        let now = self.clock.now();
        let times =
            |i: u32| 1 + usize::from(plan.repeat_every > 0 && i.is_multiple_of(plan.repeat_every));
        for i in 0..others {
            for _ in 0..times(i) {
                sink.offer(receipt(i, ReceiptKind::Delivered, now));
            }
        }
        if readers == 0 {
            return;
        }
        let reads: Vec<Receipt> = (0..readers)
            .flat_map(|i| {
                std::iter::repeat_n(
                    receipt(i, ReceiptKind::Read, now + plan.read_after),
                    times(i),
                )
            })
            .collect();
        let (sink, wait) = (sink.clone(), plan.read_after);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            for r in reads {
                sink.offer(r);
            }
        });
    }

    /// A simulator that remembers, across restarts of the process, what it
    /// delivered, which message ids it accepted and which uploads it holds —
    /// as WhatsApp's servers do when a client crashes and reconnects. Every
    /// delivery and upload is appended to `path` (JSON lines) before it is
    /// acknowledged, and replayed from it here.
    pub fn with_journal(
        config: SimConfig,
        clock: Arc<dyn Clock>,
        path: &std::path::Path,
    ) -> std::io::Result<Self> {
        let mut sim = Self::new(config, clock);
        let (lines, intact) = parse_journal_with_len(path)?;
        let (mut next_seq, mut uploads) = (0u64, 0u64);
        for line in lines {
            match line {
                JournalLine::Delivery(d) => {
                    next_seq = next_seq.max(d.seq + 1);
                    sim.with_account(&d.account.clone(), |a| {
                        a.accepted_ids.insert(d.message_id.clone());
                        if !a
                            .delivered_content
                            .insert((d.group.clone(), d.content_key.clone()))
                        {
                            a.stats.duplicate_deliveries += 1;
                        }
                        a.stats.delivered += 1;
                        a.log.push(d);
                    });
                }
                JournalLine::Upload {
                    account,
                    handle,
                    media,
                    bytes,
                    expires_at,
                } => {
                    uploads += 1;
                    sim.with_account(&account, |a| {
                        a.uploads.insert(handle, Upload { media, expires_at });
                        a.stats.uploads += 1;
                        a.stats.upload_bytes += bytes;
                    });
                }
            }
        }
        sim.seq = AtomicU64::new(next_seq);
        sim.upload_seq = AtomicU64::new(uploads);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        // Drop a torn last line so the next append starts a line of its own.
        file.set_len(intact)?;
        sim.journal = Some(std::sync::Mutex::new(file));
        Ok(sim)
    }

    /// Appends one line. A write error is logged: the simulator keeps
    /// answering, it only forgets that line across a restart.
    fn record(&self, line: &JournalLine) {
        use std::io::Write;
        let Some(journal) = &self.journal else { return };
        let mut text = serde_json::to_string(line).expect("journal lines serialise");
        text.push('\n');
        let mut file = journal.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(text.as_bytes()) {
            tracing::warn!(error = %e, "simulator journal write failed");
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// The `i`-th group of [`Simulator::add_numbered_groups`].
    pub fn numbered_group(i: usize) -> GroupJid {
        GroupJid::parse(&format!("120363{i:012}@g.us")).expect("digits and @g.us")
    }

    fn with_account<T>(&self, account: &AccountId, f: impl FnOnce(&mut SimAccount) -> T) -> T {
        let mut acc = self.accounts.entry(account.clone()).or_insert_with(|| {
            SimAccount::new(self.config.seed, account, self.config.account_age_days)
        });
        f(&mut acc)
    }

    fn read_account<T>(&self, account: &AccountId, f: impl FnOnce(&SimAccount) -> T) -> Option<T> {
        self.accounts.get(account).map(|a| f(&a))
    }

    /// Pairs `account` (if new) as a member of `groups`. An account no
    /// helper has ever named answers every request with `LoggedOut`; any
    /// helper below that configures an account pairs it too.
    pub fn add_account(&self, account: &AccountId, groups: impl IntoIterator<Item = GroupJid>) {
        self.with_account(account, |a| {
            a.groups
                .extend(groups.into_iter().map(|g| (g, GroupAccess::Member)))
        });
    }

    /// Pairs `account` as a member of groups `0..n` (see
    /// [`Simulator::numbered_group`]) and returns them.
    pub fn add_numbered_groups(&self, account: &AccountId, n: usize) -> Vec<GroupJid> {
        let groups: Vec<_> = (0..n).map(Self::numbered_group).collect();
        self.add_account(account, groups.iter().cloned());
        groups
    }

    pub fn set_group_access(&self, account: &AccountId, group: &GroupJid, access: GroupAccess) {
        self.with_account(account, |a| a.groups.insert(group.clone(), access));
    }

    /// Renames a group, as a member changing its subject would.
    pub fn set_group_name(&self, account: &AccountId, group: &GroupJid, name: &str) {
        self.with_account(account, |a| a.names.insert(group.clone(), name.to_owned()));
    }

    /// Makes the account an admin of the group (or not): an admin may post
    /// in an admins-only group.
    pub fn set_group_admin(&self, account: &AccountId, group: &GroupJid, admin: bool) {
        self.with_account(account, |a| {
            if admin {
                a.admin_of.insert(group.clone());
            } else {
                a.admin_of.remove(group);
            }
        });
    }

    /// The name a group has: the one set, or "Group NNNN" from the JID's
    /// last digits, so numbered groups have distinct, searchable names.
    fn group_name(a: &SimAccount, jid: &GroupJid) -> String {
        a.names.get(jid).cloned().unwrap_or_else(|| {
            let local = jid.as_str().trim_end_matches("@g.us");
            format!("Group {}", &local[local.len().saturating_sub(4)..])
        })
    }

    /// The group no longer exists for this account: sends answer `GroupNotFound`.
    pub fn remove_group(&self, account: &AccountId, group: &GroupJid) {
        self.with_account(account, |a| a.groups.remove(group));
    }

    /// The next `n` sends of `account` fail with `error` (after the
    /// logged-out and ban checks, before anything is delivered).
    pub fn fail_next(&self, account: &AccountId, n: usize, error: GatewayError) {
        self.with_account(account, |a| {
            a.injected.extend(std::iter::repeat_n(error, n))
        });
    }

    /// The session ends: every request answers `LoggedOut` until [`Simulator::reconnect`].
    /// Time-locks `account`'s reach-out until `until`, as WhatsApp does:
    /// sends are refused with 463 until then, and the time-lock query says
    /// so.
    pub fn time_lock(&self, account: &AccountId, until: DateTime<Utc>) {
        self.with_account(account, |a| a.timelock_until = Some(until));
    }

    pub fn log_out(&self, account: &AccountId) {
        self.with_account(account, |a| a.logged_out = true);
    }

    /// Pairs a logged-out account again.
    pub fn reconnect(&self, account: &AccountId) {
        self.with_account(account, |a| a.logged_out = false);
    }

    /// The account's socket drops now and is back after `d`: `ready` waits
    /// until then, and sends written meanwhile are held and leave together
    /// when it is back.
    pub fn reconnecting_for(&self, account: &AccountId, d: Duration) {
        let until = self.clock.now() + d;
        self.with_account(account, |a| a.reconnecting_until = Some(until));
    }

    /// How long until the account's socket is back (zero when it is up).
    fn reconnect_wait(&self, account: &AccountId) -> Duration {
        let now = self.clock.now();
        self.read_account(account, |a| a.reconnecting_until)
            .flatten()
            .and_then(|until| (until - now).to_std().ok())
            .unwrap_or(Duration::ZERO)
    }

    /// Bans `account` from now for `d`, as if WhatsApp had decided to.
    pub fn ban_for(&self, account: &AccountId, d: Duration) {
        let until = self.clock.now() + d;
        self.with_account(account, |a| {
            a.banned_until = Some(until);
            a.stats.bans += 1;
        });
    }

    /// The end of the account's ban, if one is in effect now.
    pub fn banned_until(&self, account: &AccountId) -> Option<DateTime<Utc>> {
        let now = self.clock.now();
        self.read_account(account, |a| a.banned_until.filter(|u| now < *u))
            .flatten()
    }

    /// How old `account` is, for the risk model's daily allowance.
    pub fn set_account_age(&self, account: &AccountId, days: u32) {
        self.with_account(account, |a| a.risk.age_days = days);
    }

    /// The risk model's warnings and bans for `account`, in order.
    pub fn risk_log(
        &self,
        account: &AccountId,
    ) -> Vec<(DateTime<Utc>, crate::simulator::risk::Verdict)> {
        self.read_account(account, |a| a.risk.log.clone())
            .unwrap_or_default()
    }

    /// Makes every upload handle of `account` expire now.
    pub fn expire_uploads(&self, account: &AccountId) {
        let now = self.clock.now();
        self.with_account(account, |a| {
            a.uploads.values_mut().for_each(|u| u.expires_at = now)
        });
    }

    /// Every delivered message of every account, in acceptance order.
    pub fn log(&self) -> Vec<Delivery> {
        let mut all: Vec<Delivery> = self.accounts.iter().flat_map(|a| a.log.clone()).collect();
        all.sort_by_key(|d| d.seq);
        all
    }

    /// The messages `account` delivered, in acceptance order.
    pub fn deliveries(&self, account: &AccountId) -> Vec<Delivery> {
        self.read_account(account, |a| a.log.clone())
            .unwrap_or_default()
    }

    pub fn delivered(&self, account: &AccountId) -> u64 {
        self.stats(account).delivered
    }

    pub fn total_delivered(&self) -> u64 {
        self.accounts.iter().map(|a| a.stats.delivered).sum()
    }

    pub fn stats(&self, account: &AccountId) -> AccountStats {
        self.read_account(account, |a| a.stats).unwrap_or_default()
    }

    /// The most deliveries `account` made in any half-open window
    /// `[t, t + 60 s)`: what a pacing guarantee of "N per minute" bounds.
    pub fn max_in_any_60s(&self, account: &AccountId) -> usize {
        let mut times: Vec<DateTime<Utc>> = self
            .read_account(account, |a| a.log.iter().map(|d| d.at).collect())
            .unwrap_or_default();
        times.sort_unstable();
        // The busiest window can always be slid right until it starts at a delivery.
        let mut best = 0;
        let mut end = 0;
        for (start, t) in times.iter().enumerate() {
            let close = *t + WINDOW;
            while end < times.len() && times[end] < close {
                end += 1;
            }
            best = best.max(end - start);
        }
        best
    }

    pub fn uploads(&self, account: &AccountId) -> u64 {
        self.stats(account).uploads
    }

    pub fn upload_bytes(&self, account: &AccountId) -> u64 {
        self.stats(account).upload_bytes
    }

    /// Deliveries, over all accounts, whose (account, group, content) had
    /// already been delivered: a run sends each part once per group, so each
    /// one is a double send that deduplication by message id did not catch.
    pub fn duplicate_deliveries(&self) -> u64 {
        self.accounts
            .iter()
            .map(|a| a.stats.duplicate_deliveries)
            .sum()
    }

    /// Decides a send at the moment of the call; returns the answer and the
    /// latency to wait before giving it.
    fn decide_send(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        fence: Option<&crate::domain::Fence>,
    ) -> (Result<SendReceipt, GatewayError>, Duration) {
        let now = self.clock.now();
        let Some(mut acc) = self.accounts.get_mut(account) else {
            return (Err(GatewayError::LoggedOut), Duration::ZERO);
        };
        let acc = &mut *acc;
        // Checked and raised under the account's lock, so a send from an
        // old owner can never land after one from the new owner.
        if let Some(f) = fence {
            if let Err(refused) = acc.raise_fence(f.epoch) {
                acc.stats.fenced += 1;
                return (Err(refused), Duration::ZERO);
            }
        }
        let latency = acc.draw_latency(self.config.latency);
        let answer = self.decide_locked(acc, now, group, message, message_id, fence);
        (answer, latency)
    }

    /// Raises the account's newest epoch to `fence`'s, refusing one older
    /// than an epoch already seen.
    pub fn claim(&self, fence: &crate::domain::Fence) -> Result<(), GatewayError> {
        let Some(mut acc) = self.accounts.get_mut(&fence.account) else {
            return Err(GatewayError::LoggedOut);
        };
        acc.raise_fence(fence.epoch)
    }

    /// The newest lease epoch a fenced send (or claim) carried for `account`.
    pub fn fence_epoch(&self, account: &AccountId) -> Option<i64> {
        self.accounts.get(account).and_then(|a| a.fence_epoch)
    }

    fn decide_locked(
        &self,
        acc: &mut SimAccount,
        now: DateTime<Utc>,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        fence: Option<&crate::domain::Fence>,
    ) -> Result<SendReceipt, GatewayError> {
        acc.check_session(now)?;
        if let Some(until) = acc.timelock_until.filter(|u| now < *u) {
            acc.stats.warnings += 1;
            return Err(GatewayError::Restricted {
                code: 463,
                retry_after: (until - now).to_std().ok(),
            });
        }
        if let Some(err) = acc.injected.pop_front() {
            return Err(err);
        }
        if self.config.transient_failure_rate > 0.0
            && acc
                .rng
                .random_bool(self.config.transient_failure_rate.min(1.0))
        {
            acc.stats.transient_failures += 1;
            return Err(GatewayError::Transient(
                "simulated network failure".to_owned(),
            ));
        }
        if acc.accepted_ids.contains(message_id) {
            acc.stats.dedup_hits += 1;
            return Ok(SendReceipt { duplicate: true });
        }
        match acc.groups.get(group) {
            None => return Err(GatewayError::GroupNotFound),
            Some(GroupAccess::NotParticipant) => return Err(GatewayError::NotParticipant),
            Some(GroupAccess::AdminsOnly) if !acc.admin_of.contains(group) => {
                return Err(GatewayError::NotAllowed)
            }
            Some(GroupAccess::AdminsOnly) => {}
            Some(GroupAccess::Member) => {}
        }
        let (content, content_key) = match message {
            OutgoingMessage::Text(text) => (
                DeliveredContent::Text(text.clone()),
                format!("text:{:016x}", fnv64(text.as_bytes())),
            ),
            OutgoingMessage::Media {
                upload,
                mime,
                caption,
            } => {
                let media = match acc.uploads.get(&upload.handle) {
                    Some(u) if now < u.expires_at => u.media.clone(),
                    _ => return Err(GatewayError::MediaExpired),
                };
                let key = match caption {
                    Some(c) => format!("media:{media}:{:016x}", fnv64(c.as_bytes())),
                    None => format!("media:{media}"),
                };
                let content = DeliveredContent::Media {
                    media,
                    mime: mime.clone(),
                    caption: caption.clone(),
                };
                (content, key)
            }
            OutgoingMessage::Poll {
                question,
                options,
                multiple,
            } => (
                DeliveredContent::Poll {
                    question: question.clone(),
                    options: options.clone(),
                    multiple: *multiple,
                },
                format!(
                    "poll:{:016x}",
                    fnv64(format!("{question}\n{}", options.join("\n")).as_bytes())
                ),
            ),
            // Keyed by the message they name: a group that gets the same
            // revoke (or edit) twice shows as a double delivery.
            OutgoingMessage::Revoke { of } => (
                DeliveredContent::Revoke { of: of.clone() },
                format!("revoke:{of}"),
            ),
            OutgoingMessage::Edit { of, text } => (
                DeliveredContent::Edit {
                    of: of.clone(),
                    text: text.clone(),
                },
                format!("edit:{of}:{:016x}", fnv64(text.as_bytes())),
            ),
        };
        if let Some(limit) = self.config.rate_limit_per_minute {
            prune(&mut acc.recent, now);
            if acc.recent.len() >= limit as usize {
                return Err(self.refuse(acc, now));
            }
            acc.recent.push_back(now);
        }
        if let Some(model) = &self.config.risk {
            use crate::simulator::risk::Verdict;
            let verdict = acc.risk.judge(model, group.as_str(), &content_key, now);
            if verdict != Verdict::Fine && self.config.rate_limit_per_minute.is_some() {
                // Not delivered: it does not count against the rate window.
                acc.recent.pop_back();
            }
            match verdict {
                Verdict::Fine => {}
                Verdict::Warning(signs) => {
                    acc.stats.warnings += 1;
                    let answer =
                        crate::simulator::risk::warning_answer(&signs, model.warning_retry);
                    // A 463 is WhatsApp's time-lock: it holds for the
                    // retry it names, and a time-lock query says until when.
                    if matches!(answer, GatewayError::Restricted { code: 463, .. }) {
                        acc.timelock_until = Some(now + model.warning_retry);
                    }
                    return Err(answer);
                }
                Verdict::Ban { until, .. } => {
                    acc.banned_until = Some(until);
                    acc.stats.bans += 1;
                    return Err(GatewayError::Banned { until: Some(until) });
                }
            }
        }

        acc.accepted_ids.insert(message_id.to_owned());
        if !acc
            .delivered_content
            .insert((group.clone(), content_key.clone()))
        {
            acc.stats.duplicate_deliveries += 1;
        }
        acc.stats.delivered += 1;
        let delivery = Delivery {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            account: acc.id.clone(),
            group: group.clone(),
            message_id: message_id.to_owned(),
            content,
            content_key,
            at: now,
            fence: fence.cloned(),
        };
        self.record(&JournalLine::Delivery(delivery.clone()));
        acc.log.push(delivery);
        Ok(SendReceipt { duplicate: false })
    }

    /// A send over the rate limit: `RateLimited`, or a ban for an account
    /// that has been told too often.
    fn refuse(&self, acc: &mut SimAccount, now: DateTime<Utc>) -> GatewayError {
        acc.stats.rate_limited += 1;
        prune(&mut acc.refusals, now);
        acc.refusals.push_back(now);
        if let Some(strikes) = self.config.ban_after_refusals {
            if acc.refusals.len() >= strikes as usize {
                let until = now + self.config.ban_duration;
                acc.banned_until = Some(until);
                acc.refusals.clear();
                acc.stats.bans += 1;
                return GatewayError::Banned { until: Some(until) };
            }
        }
        // The window has room once its oldest delivery leaves it.
        let retry_after = acc
            .recent
            .front()
            .and_then(|oldest| (*oldest + WINDOW - now).to_std().ok());
        GatewayError::RateLimited { retry_after }
    }
}
