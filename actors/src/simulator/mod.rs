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

pub mod risk;

use crate::domain::{fnv64, AccountId, GroupInfo, GroupJid, MediaId, UploadHandle};
use crate::ports::{Clock, Gateway, GatewayError, OutgoingMessage, SendReceipt};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dashmap::DashMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
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

/// What a delivered message contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveredContent {
    Text(String),
    Media {
        media: MediaId,
        mime: String,
        caption: Option<String>,
    },
}

/// One message WhatsApp accepted and delivered. Serialized flat, as
/// [`DeliveryRecord`]: a line of the journal and an item of the simulator
/// server's `GET /deliveries`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "DeliveryRecord", from = "DeliveryRecord")]
pub struct Delivery {
    /// Global acceptance order across all accounts.
    pub seq: u64,
    pub account: AccountId,
    pub group: GroupJid,
    pub message_id: String,
    pub content: DeliveredContent,
    /// Identifies the content regardless of message id or upload handle:
    /// the same text, or the same media with the same caption, has the same key.
    pub content_key: String,
    pub at: DateTime<Utc>,
    /// The lease the send carried (several daemons), if any.
    pub fence: Option<crate::domain::Fence>,
}

/// A [`Delivery`] as written down: its content in flat, optional fields.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DeliveryRecord {
    seq: u64,
    account: AccountId,
    group: GroupJid,
    message_id: String,
    content_key: String,
    text: Option<String>,
    media: Option<MediaId>,
    mime: Option<String>,
    caption: Option<String>,
    at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fence: Option<crate::domain::Fence>,
}

impl From<Delivery> for DeliveryRecord {
    fn from(d: Delivery) -> Self {
        let (text, media, mime, caption) = match d.content {
            DeliveredContent::Text(t) => (Some(t), None, None, None),
            DeliveredContent::Media {
                media,
                mime,
                caption,
            } => (None, Some(media), Some(mime), caption),
        };
        Self {
            seq: d.seq,
            account: d.account,
            group: d.group,
            message_id: d.message_id,
            content_key: d.content_key,
            text,
            media,
            mime,
            caption,
            at: d.at,
            fence: d.fence,
        }
    }
}

impl From<DeliveryRecord> for Delivery {
    fn from(d: DeliveryRecord) -> Self {
        let content = match (d.text, d.media) {
            (Some(t), _) => DeliveredContent::Text(t),
            (None, Some(media)) => DeliveredContent::Media {
                media,
                mime: d.mime.unwrap_or_default(),
                caption: d.caption,
            },
            (None, None) => DeliveredContent::Text(String::new()),
        };
        Self {
            seq: d.seq,
            account: d.account,
            group: d.group,
            message_id: d.message_id,
            content,
            content_key: d.content_key,
            at: d.at,
            fence: d.fence,
        }
    }
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
    rng: StdRng,
    log: Vec<Delivery>,
    delivered_content: HashSet<(GroupJid, String)>,
    stats: AccountStats,
    risk: crate::simulator::risk::RiskState,
    /// The newest lease epoch a fenced send has carried for this account.
    fence_epoch: Option<i64>,
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
            rng: StdRng::seed_from_u64(seed ^ fnv64(account.as_str().as_bytes())),
            log: Vec::new(),
            delivered_content: HashSet::new(),
            stats: AccountStats::default(),
            risk: crate::simulator::risk::RiskState::new(age_days),
            fence_epoch: None,
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
}

/// One line of the simulator's journal (JSON lines).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum JournalLine {
    Delivery(Delivery),
    Upload {
        account: AccountId,
        handle: String,
        media: MediaId,
        bytes: u64,
        expires_at: DateTime<Utc>,
    },
}

/// Reads the deliveries recorded in a simulator journal, in order. For
/// checks from outside the process that wrote it (crash tests).
pub fn read_journal(path: &std::path::Path) -> std::io::Result<Vec<Delivery>> {
    Ok(parse_journal(path)?
        .into_iter()
        .filter_map(|l| match l {
            JournalLine::Delivery(d) => Some(d),
            JournalLine::Upload { .. } => None,
        })
        .collect())
}

fn parse_journal(path: &std::path::Path) -> std::io::Result<Vec<JournalLine>> {
    Ok(parse_journal_with_len(path)?.0)
}

/// The journal's lines and the length in bytes of its intact part.
fn parse_journal_with_len(path: &std::path::Path) -> std::io::Result<(Vec<JournalLine>, u64)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let (mut out, mut len) = (Vec::new(), 0u64);
    for line in text.split_inclusive('\n') {
        // A crash can cut the last line short; everything before it counts.
        match serde_json::from_str(line.trim_end()) {
            Ok(l) if line.ends_with('\n') => {
                out.push(l);
                len += line.len() as u64;
            }
            _ => break,
        }
    }
    Ok((out, len))
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
        }
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
                    return Err(crate::simulator::risk::warning_answer(
                        &signs,
                        model.warning_retry,
                    ));
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

#[async_trait]
impl Gateway for Simulator {
    async fn upload(
        &self,
        account: &AccountId,
        media: &MediaId,
        _mime: &str,
        bytes: Arc<[u8]>,
    ) -> Result<UploadHandle, GatewayError> {
        let wait = {
            let now = self.clock.now();
            let Some(mut acc) = self.accounts.get_mut(account) else {
                return Err(GatewayError::LoggedOut);
            };
            acc.check_session(now)?;
            let transfer = self
                .config
                .upload_bytes_per_sec
                .map_or(Duration::ZERO, |bw| {
                    let nanos = bytes.len() as u128 * 1_000_000_000 / u128::from(bw.max(1));
                    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
                });
            transfer + acc.draw_latency(self.config.latency)
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        // The handle exists once the bytes are up; an upload abandoned
        // mid-transfer leaves nothing behind.
        let now = self.clock.now();
        let n = self.upload_seq.fetch_add(1, Ordering::Relaxed);
        let handle = UploadHandle {
            handle: format!("sim-upload-{n}-{}", &media.as_str()[..12]),
            expires_at: now + self.config.upload_ttl,
        };
        self.record(&JournalLine::Upload {
            account: account.clone(),
            handle: handle.handle.clone(),
            media: media.clone(),
            bytes: bytes.len() as u64,
            expires_at: handle.expires_at,
        });
        self.with_account(account, |a| {
            a.uploads.insert(
                handle.handle.clone(),
                Upload {
                    media: media.clone(),
                    expires_at: handle.expires_at,
                },
            );
            a.stats.uploads += 1;
            a.stats.upload_bytes += bytes.len() as u64;
        });
        Ok(handle)
    }

    /// The account's groups as one participating-groups query answers:
    /// groups it has left are not listed; admins-only groups are listed
    /// with `announce`, and whether this account is an admin of them.
    async fn list_groups(&self, account: &AccountId) -> Result<Vec<GroupInfo>, GatewayError> {
        let (answer, latency) = {
            let now = self.clock.now();
            let Some(mut acc) = self.accounts.get_mut(account) else {
                return Err(GatewayError::LoggedOut);
            };
            let latency = acc.draw_latency(self.config.latency);
            let answer = acc.check_session(now).map(|()| {
                let mut groups: Vec<GroupInfo> = acc
                    .groups
                    .iter()
                    .filter(|(_, access)| **access != GroupAccess::NotParticipant)
                    .map(|(jid, access)| GroupInfo {
                        jid: jid.clone(),
                        subject: Self::group_name(&acc, jid),
                        participants: 2 + (fnv64(jid.as_str().as_bytes()) % 250) as u32,
                        announce: *access == GroupAccess::AdminsOnly,
                        is_admin: acc.admin_of.contains(jid),
                        community: None,
                    })
                    .collect();
                groups.sort_by(|a, b| a.jid.cmp(&b.jid));
                groups
            });
            (answer, latency)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        answer
    }

    async fn ready(&self, account: &AccountId) -> Result<(), GatewayError> {
        let wait = self.reconnect_wait(account);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }

    async fn typing(
        &self,
        account: &AccountId,
        group: &GroupJid,
        _for: Duration,
    ) -> Result<(), GatewayError> {
        let now = self.clock.now();
        let Some(mut acc) = self.accounts.get_mut(account) else {
            return Err(GatewayError::LoggedOut);
        };
        acc.check_session(now)?;
        acc.stats.typing += 1;
        acc.risk.typed(group.as_str(), now);
        Ok(())
    }

    async fn send(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
    ) -> Result<SendReceipt, GatewayError> {
        self.send_fenced(account, group, message, message_id, None)
            .await
    }

    async fn claim_fence(&self, fence: &crate::domain::Fence) -> Result<(), GatewayError> {
        self.claim(fence)
    }

    async fn send_fenced(
        &self,
        account: &AccountId,
        group: &GroupJid,
        message: &OutgoingMessage,
        message_id: &str,
        fence: Option<&crate::domain::Fence>,
    ) -> Result<SendReceipt, GatewayError> {
        // Written while the socket is down: the client holds it until the
        // socket is back.
        let held = self.reconnect_wait(account);
        if !held.is_zero() {
            tokio::time::sleep(held).await;
        }
        let (answer, latency) = self.decide_send(account, group, message, message_id, fence);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::TokioClock;
    use crate::testkit::gateway_contract::{self, ContractSetup};
    use std::sync::atomic::AtomicUsize;
    use tokio::time::{sleep, Instant};

    fn t0() -> DateTime<Utc> {
        "2026-05-11T01:00:00Z".parse().unwrap()
    }

    fn acct(s: &str) -> AccountId {
        AccountId::parse(s).unwrap()
    }

    /// Must be called inside the (paused) runtime: the clock starts at t0 now.
    fn simulator(config: SimConfig) -> Arc<Simulator> {
        Arc::new(Simulator::new(
            config,
            Arc::new(TokioClock::starting_at(t0())),
        ))
    }

    fn text(s: &str) -> OutgoingMessage {
        OutgoingMessage::Text(s.to_owned())
    }

    fn picture(len: usize) -> (MediaId, Arc<[u8]>) {
        let bytes: Arc<[u8]> = (0..len).map(|i| (i % 251) as u8).collect();
        (MediaId::of_bytes(&bytes), bytes)
    }

    fn media(h: &UploadHandle, caption: Option<&str>) -> OutgoingMessage {
        OutgoingMessage::Media {
            upload: h.clone(),
            mime: "image/png".into(),
            caption: caption.map(str::to_owned),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_with_an_older_lease_epoch_than_one_seen_is_refused_unsent() {
        let sim = simulator(SimConfig::instant());
        let a = acct("fenced");
        let groups = sim.add_numbered_groups(&a, 3);
        let fence = |node: &str, epoch| crate::domain::Fence {
            account: a.clone(),
            node: node.into(),
            epoch,
        };
        let old = fence("n1", 4);
        let new = fence("n2", 5);
        sim.send_fenced(&a, &groups[0], &text("hi"), "m0", Some(&old))
            .await
            .unwrap();
        sim.send_fenced(&a, &groups[1], &text("hi"), "m1", Some(&new))
            .await
            .unwrap();
        // The old owner wakes up late: its send is refused and not delivered.
        let refused = sim
            .send_fenced(&a, &groups[2], &text("hi"), "m2", Some(&old))
            .await;
        assert_eq!(refused, Err(GatewayError::Fenced { sent: 4, seen: 5 }));
        // An unfenced send (single daemon) is not held to epochs.
        sim.send(&a, &groups[2], &text("hi"), "m3").await.unwrap();
        let ids: Vec<_> = sim.log().into_iter().map(|d| d.message_id).collect();
        assert_eq!(ids, ["m0", "m1", "m3"]);
        assert_eq!(sim.stats(&a).fenced, 1);
        assert_eq!(sim.fence_epoch(&a), Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimed_epoch_refuses_the_old_owner_before_the_new_one_sends() {
        let sim = simulator(SimConfig::instant());
        let a = acct("claimed");
        let groups = sim.add_numbered_groups(&a, 2);
        let fence = |node: &str, epoch| crate::domain::Fence {
            account: a.clone(),
            node: node.into(),
            epoch,
        };
        sim.send_fenced(&a, &groups[0], &text("hi"), "m0", Some(&fence("n1", 4)))
            .await
            .unwrap();
        // n2 takes the lease and claims it before its first send; n1's
        // request, held up while n1 was paused, arrives after the claim.
        sim.claim_fence(&fence("n2", 5)).await.unwrap();
        let late = sim
            .send_fenced(&a, &groups[1], &text("hi"), "m1", Some(&fence("n1", 4)))
            .await;
        assert_eq!(late, Err(GatewayError::Fenced { sent: 4, seen: 5 }));
        assert_eq!(sim.log().len(), 1, "the late send was not delivered");
        // A claim older than an epoch seen is refused, and changes nothing.
        assert_eq!(
            sim.claim_fence(&fence("n1", 4)).await,
            Err(GatewayError::Fenced { sent: 4, seen: 5 })
        );
        assert_eq!(sim.fence_epoch(&a), Some(5));
        // Claiming the same epoch again (a second run of the owner) is fine.
        sim.claim_fence(&fence("n2", 5)).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_journal_carries_deliveries_ids_and_uploads_across_a_restart() {
        let dir = std::env::temp_dir().join(format!("herald-sim-journal-{}", std::process::id()));
        let path = dir.join("journal.jsonl");
        let _ = std::fs::remove_file(&path);
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(t0()));
        let a = acct("journal");
        let config = SimConfig {
            latency: Latency::Zero,
            upload_bytes_per_sec: None,
            ..SimConfig::default()
        };
        let (pic, bytes) = picture(1000);
        let handle = {
            let sim = Simulator::with_journal(config.clone(), clock.clone(), &path).unwrap();
            let groups = sim.add_numbered_groups(&a, 3);
            let h = sim.upload(&a, &pic, "image/png", bytes).await.unwrap();
            assert_eq!(sim.send(&a, &groups[0], &text("hi"), "3EB0A").await, OK);
            assert_eq!(
                sim.send(&a, &groups[1], &media(&h, Some("c")), "3EB0B")
                    .await,
                OK
            );
            h
        };
        // A new process: same journal, groups configured again as at start-up.
        let sim = Simulator::with_journal(config, clock, &path).unwrap();
        let groups = sim.add_numbered_groups(&a, 3);
        assert_eq!(sim.delivered(&a), 2);
        assert_eq!(sim.uploads(&a), 1);
        assert_eq!(
            sim.send(&a, &groups[0], &text("hi"), "3EB0A").await,
            DUP,
            "accepted id remembered"
        );
        assert_eq!(
            sim.send(&a, &groups[2], &media(&handle, None), "3EB0C")
                .await,
            OK,
            "upload still valid"
        );
        // Content already delivered, under a new id, counts as a double send.
        assert_eq!(sim.send(&a, &groups[0], &text("hi"), "3EB0D").await, OK);
        assert_eq!(sim.duplicate_deliveries(), 1);
        let log = read_journal(&path).unwrap();
        assert_eq!(log.len(), 4);
        assert!(
            log.windows(2).all(|w| w[0].seq < w[1].seq),
            "sequence continues"
        );
        // A torn last line (a crash mid-write) is ignored, not fatal.
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"kind\":\"deliv")
            .unwrap();
        assert_eq!(read_journal(&path).unwrap().len(), 4);
        // Reopening drops the torn line; later deliveries are readable again.
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(t0()));
        let config = SimConfig {
            latency: Latency::Zero,
            ..SimConfig::default()
        };
        let sim = Simulator::with_journal(config, clock, &path).unwrap();
        sim.add_numbered_groups(&a, 3);
        assert_eq!(sim.send(&a, &groups[1], &text("later"), "3EB0E").await, OK);
        assert_eq!(read_journal(&path).unwrap().len(), 5);
        let _ = std::fs::remove_dir_all(&dir);
    }

    const OK: Result<SendReceipt, GatewayError> = Ok(SendReceipt { duplicate: false });
    const DUP: Result<SendReceipt, GatewayError> = Ok(SendReceipt { duplicate: true });

    struct SimSetup {
        sim: Arc<Simulator>,
        next: AtomicUsize,
    }

    #[async_trait]
    impl ContractSetup for SimSetup {
        async fn account_with_groups(&self, n: usize) -> (AccountId, Vec<GroupJid>) {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let account = acct(&format!("contract-{i}"));
            let groups = self.sim.add_numbered_groups(&account, n);
            (account, groups)
        }

        async fn expire_uploads(&self, account: &AccountId) -> bool {
            self.sim.expire_uploads(account);
            true
        }
    }

    fn contract_setup(sim: &Arc<Simulator>) -> SimSetup {
        SimSetup {
            sim: sim.clone(),
            next: AtomicUsize::new(0),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_simulator_passes_the_gateway_contract() {
        let sim = simulator(SimConfig::default());
        gateway_contract::run_all(sim.as_ref(), &contract_setup(&sim)).await;
        assert_eq!(sim.duplicate_deliveries(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_contracts_single_upload_really_feeds_every_group() {
        let sim = simulator(SimConfig::default());
        let setup = contract_setup(&sim);
        gateway_contract::one_upload_serves_many_groups(sim.as_ref(), &setup).await;
        let a = acct("contract-0");
        assert_eq!(sim.uploads(&a), 1);
        let log = sim.deliveries(&a);
        assert_eq!(log.len(), 5);
        assert!(log.iter().all(|d| d.content_key == log[0].content_key));
        let groups: HashSet<_> = log.iter().map(|d| &d.group).collect();
        assert_eq!(groups.len(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn latency_and_upload_time_pass_on_virtual_time() {
        let sim = simulator(SimConfig {
            latency: Latency::Fixed(Duration::from_millis(250)),
            upload_bytes_per_sec: Some(1_000_000),
            ..SimConfig::default()
        });
        let a = acct("sales");
        let groups = sim.add_numbered_groups(&a, 1);

        let start = Instant::now();
        assert_eq!(sim.send(&a, &groups[0], &text("hi"), "m1").await, OK);
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        // Accepted on arrival: the log has the time of the call.
        assert_eq!(sim.deliveries(&a)[0].at, t0());

        let (id, bytes) = picture(2_500_000);
        let start = Instant::now();
        let h = sim.upload(&a, &id, "image/png", bytes).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(2_500 + 250));
        assert_eq!(
            h.expires_at,
            t0() + Duration::from_millis(250 + 2_750) + Duration::from_secs(7 * 24 * 3600)
        );
        assert_eq!(sim.uploads(&a), 1);
        assert_eq!(sim.upload_bytes(&a), 2_500_000);

        let uniform = simulator(SimConfig::default());
        let b = acct("support");
        let groups = uniform.add_numbered_groups(&b, 1);
        let mut seen = HashSet::new();
        for i in 0..50 {
            let start = Instant::now();
            let got = uniform
                .send(&b, &groups[0], &text("x"), &format!("u{i}"))
                .await;
            assert_eq!(got, OK);
            let took = start.elapsed();
            assert!(
                (Duration::from_millis(80)..=Duration::from_millis(400)).contains(&took),
                "{took:?}"
            );
            seen.insert(took);
        }
        assert!(seen.len() > 10, "latency varies: {seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn sending_too_fast_is_rate_limited_then_banned_until_the_ban_ends() {
        let sim = simulator(SimConfig {
            rate_limit_per_minute: Some(5),
            ban_after_refusals: Some(3),
            ban_duration: Duration::from_secs(3600),
            ..SimConfig::instant()
        });
        let a = acct("sales");
        let g = sim.add_numbered_groups(&a, 1).remove(0);
        let mut n = 0;
        let mut send = || {
            n += 1;
            let sim = sim.clone();
            let (a, g) = (a.clone(), g.clone());
            async move { sim.send(&a, &g, &text("x"), &format!("m{n}")).await }
        };

        for _ in 0..5 {
            assert_eq!(send().await, OK);
            sleep(Duration::from_secs(10)).await;
        }
        // t = 50 s: the window (−10 s, 50 s] is full until the t = 0 send leaves it.
        let limited = GatewayError::RateLimited {
            retry_after: Some(Duration::from_secs(10)),
        };
        assert_eq!(send().await, Err(limited.clone()));
        sleep(Duration::from_secs(10)).await;
        assert_eq!(send().await, OK, "room again at t = 60 s");
        // Pushing on: the second refusal is a warning, the third a ban.
        assert_eq!(send().await, Err(limited));
        let until = t0() + Duration::from_secs(60 + 3600);
        let banned = GatewayError::Banned { until: Some(until) };
        assert_eq!(send().await, Err(banned.clone()));
        assert_eq!(sim.banned_until(&a), Some(until));

        // During the ban every request fails, uploads too, and nothing counts.
        sleep(Duration::from_secs(1800)).await;
        assert_eq!(send().await, Err(banned.clone()));
        let (id, bytes) = picture(10);
        assert_eq!(sim.upload(&a, &id, "image/png", bytes).await, Err(banned));

        sleep(Duration::from_secs(1800)).await;
        assert_eq!(sim.banned_until(&a), None);
        assert_eq!(send().await, OK, "the ban has ended");
        let stats = sim.stats(&a);
        assert_eq!((stats.delivered, stats.rate_limited, stats.bans), (7, 3, 1));
        assert!(sim.max_in_any_60s(&a) <= 5);
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_spread_over_more_than_a_minute_do_not_ban() {
        let sim = simulator(SimConfig {
            rate_limit_per_minute: Some(2),
            ban_after_refusals: Some(2),
            ..SimConfig::instant()
        });
        let a = acct("sales");
        let g = sim.add_numbered_groups(&a, 1).remove(0);
        for round in 0..3 {
            for i in 0..2 {
                let id = format!("ok-{round}-{i}");
                assert_eq!(sim.send(&a, &g, &text("x"), &id).await, OK);
            }
            let id = format!("over-{round}");
            let got = sim.send(&a, &g, &text("x"), &id).await;
            assert!(
                matches!(got, Err(GatewayError::RateLimited { .. })),
                "{got:?}"
            );
            sleep(Duration::from_secs(61)).await;
        }
        assert_eq!(sim.stats(&a).bans, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_id_is_delivered_once_per_account() {
        let sim = simulator(SimConfig::default());
        let (a, b) = (acct("sales"), acct("support"));
        let ga = sim.add_numbered_groups(&a, 2);
        let gb = sim.add_numbered_groups(&b, 1);
        assert_eq!(sim.send(&a, &ga[0], &text("hi"), "m1").await, OK);
        assert_eq!(sim.send(&a, &ga[0], &text("hi"), "m1").await, DUP);
        // The id is the account's, whatever the group or content.
        assert_eq!(sim.send(&a, &ga[1], &text("other"), "m1").await, DUP);
        // Another account has its own ids.
        assert_eq!(sim.send(&b, &gb[0], &text("hi"), "m1").await, OK);
        assert_eq!(sim.deliveries(&a).len(), 1);
        assert_eq!(sim.stats(&a).dedup_hits, 2);
        let log = sim.log();
        assert_eq!(log.len(), 2);
        assert_eq!(
            (log[0].account.as_str(), log[1].account.as_str()),
            ("sales", "support")
        );
        assert!(log[0].seq < log[1].seq);
        assert_eq!(sim.duplicate_deliveries(), 0);
    }

    /// Whether each of 200 sends failed, and how long each took.
    async fn transient_pattern(seed: u64) -> (Vec<bool>, Vec<Duration>, u64) {
        let sim = simulator(SimConfig {
            transient_failure_rate: 0.25,
            rate_limit_per_minute: None,
            seed,
            ..SimConfig::default()
        });
        let a = acct("sales");
        let g = sim.add_numbered_groups(&a, 1).remove(0);
        let mut failed = Vec::new();
        let mut took = Vec::new();
        for i in 0..200 {
            let start = Instant::now();
            failed.push(match sim.send(&a, &g, &text("x"), &format!("m{i}")).await {
                Ok(r) => {
                    assert!(!r.duplicate);
                    false
                }
                Err(GatewayError::Transient(_)) => true,
                Err(e) => panic!("unexpected {e}"),
            });
            took.push(start.elapsed());
        }
        (failed, took, sim.delivered(&a))
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_deterministic_under_a_seed() {
        let (first, took, delivered) = transient_pattern(7).await;
        let (again, took_again, _) = transient_pattern(7).await;
        assert_eq!(first, again);
        assert_eq!(took, took_again);
        let failures = first.iter().filter(|f| **f).count();
        assert!(
            (25..=75).contains(&failures),
            "{failures} of 200 at p = 0.25"
        );
        assert_eq!(
            delivered,
            200 - failures as u64,
            "a failed send delivers nothing"
        );
        let (other, _, _) = transient_pattern(8).await;
        assert_ne!(first, other, "another seed, another pattern");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnect_holds_ready_and_sends_until_the_socket_is_back() {
        let sim = simulator(SimConfig::instant());
        let a = acct("a1");
        let g = sim.add_numbered_groups(&a, 1).remove(0);
        let up = Instant::now();
        sim.ready(&a).await.unwrap();
        assert_eq!(up.elapsed(), Duration::ZERO, "a connected socket is ready");
        let start = Instant::now();
        sim.reconnecting_for(&a, Duration::from_secs(30));
        sim.ready(&a).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(30), "ready waits");
        sim.reconnecting_for(&a, Duration::from_secs(10));
        let held = Instant::now();
        sim.send(&a, &g, &text("hi"), "m1").await.unwrap();
        assert_eq!(held.elapsed(), Duration::from_secs(10), "send is held");
        let d = &sim.deliveries(&a)[0];
        assert_eq!(
            d.at,
            t0() + chrono::Duration::seconds(40),
            "leaves when back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_group_list_shows_names_posting_rights_and_leaves() {
        let sim = simulator(SimConfig::instant());
        let a = acct("a1");
        let g = sim.add_numbered_groups(&a, 4);
        sim.set_group_name(&a, &g[0], "Clients KL");
        sim.set_group_access(&a, &g[1], GroupAccess::AdminsOnly);
        sim.set_group_access(&a, &g[2], GroupAccess::AdminsOnly);
        sim.set_group_admin(&a, &g[2], true);
        sim.set_group_access(&a, &g[3], GroupAccess::NotParticipant);
        let listed = sim.list_groups(&a).await.unwrap();
        assert_eq!(listed.len(), 3, "a group the account left is not listed");
        assert_eq!(listed[0].subject, "Clients KL");
        assert!(listed[0].can_post());
        assert!(listed[1].announce && !listed[1].can_post());
        assert!(listed[2].announce && listed[2].is_admin && listed[2].can_post());
        assert_ne!(listed[1].subject, listed[2].subject);
        // What the list says about posting is what a send finds.
        let id = |i: usize| format!("m{i}");
        assert_eq!(
            sim.send(&a, &g[1], &text("x"), &id(1)).await,
            Err(GatewayError::NotAllowed)
        );
        assert!(sim.send(&a, &g[2], &text("x"), &id(2)).await.is_ok());
        sim.log_out(&a);
        assert_eq!(sim.list_groups(&a).await, Err(GatewayError::LoggedOut));
    }

    #[tokio::test(start_paused = true)]
    async fn injected_failures_and_account_states() {
        let sim = simulator(SimConfig::instant());
        let a = acct("sales");
        let g = sim.add_numbered_groups(&a, 3);
        let blip = GatewayError::Transient("socket closed".into());
        sim.fail_next(&a, 2, blip.clone());
        assert_eq!(
            sim.send(&a, &g[0], &text("x"), "m1").await,
            Err(blip.clone())
        );
        assert_eq!(sim.send(&a, &g[0], &text("x"), "m1").await, Err(blip));
        assert_eq!(sim.send(&a, &g[0], &text("x"), "m1").await, OK);

        sim.set_group_access(&a, &g[1], GroupAccess::AdminsOnly);
        sim.set_group_access(&a, &g[2], GroupAccess::NotParticipant);
        assert_eq!(
            sim.send(&a, &g[1], &text("x"), "m2").await,
            Err(GatewayError::NotAllowed)
        );
        assert_eq!(
            sim.send(&a, &g[2], &text("x"), "m3").await,
            Err(GatewayError::NotParticipant)
        );
        sim.remove_group(&a, &g[2]);
        assert_eq!(
            sim.send(&a, &g[2], &text("x"), "m3").await,
            Err(GatewayError::GroupNotFound)
        );

        sim.log_out(&a);
        assert_eq!(
            sim.send(&a, &g[0], &text("x"), "m4").await,
            Err(GatewayError::LoggedOut)
        );
        let (id, bytes) = picture(10);
        assert_eq!(
            sim.upload(&a, &id, "image/png", bytes.clone()).await,
            Err(GatewayError::LoggedOut)
        );
        sim.reconnect(&a);
        assert_eq!(sim.send(&a, &g[0], &text("x"), "m4").await, OK);

        sim.ban_for(&a, Duration::from_secs(600));
        let until = Some(t0() + Duration::from_secs(600));
        assert_eq!(
            sim.send(&a, &g[0], &text("x"), "m5").await,
            Err(GatewayError::Banned { until })
        );

        let stranger = acct("never-paired");
        assert_eq!(
            sim.send(&stranger, &g[0], &text("x"), "m1").await,
            Err(GatewayError::LoggedOut)
        );
        assert_eq!(
            sim.upload(&stranger, &id, "image/png", bytes).await,
            Err(GatewayError::LoggedOut)
        );
        assert_eq!(sim.delivered(&a), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn upload_handles_expire_and_belong_to_their_account() {
        let sim = simulator(SimConfig {
            upload_ttl: Duration::from_secs(24 * 3600),
            ..SimConfig::instant()
        });
        let (a, b) = (acct("sales"), acct("support"));
        let g = sim.add_numbered_groups(&a, 1).remove(0);
        sim.add_numbered_groups(&b, 1);
        let (id, bytes) = picture(1000);
        let h = sim.upload(&a, &id, "image/png", bytes).await.unwrap();
        assert_eq!(h.expires_at, t0() + Duration::from_secs(24 * 3600));
        assert_eq!(
            sim.send(&b, &g, &media(&h, None), "m0").await,
            Err(GatewayError::MediaExpired),
            "another account cannot use it"
        );

        sleep(Duration::from_secs(24 * 3600 - 1)).await;
        assert_eq!(sim.send(&a, &g, &media(&h, Some("hi")), "m1").await, OK);
        sleep(Duration::from_secs(1)).await;
        assert_eq!(
            sim.send(&a, &g, &media(&h, Some("hi")), "m2").await,
            Err(GatewayError::MediaExpired)
        );
        let d = &sim.deliveries(&a)[0];
        assert_eq!(
            d.content,
            DeliveredContent::Media {
                media: id,
                mime: "image/png".into(),
                caption: Some("hi".into())
            }
        );
        assert_eq!((sim.uploads(&a), sim.upload_bytes(&a)), (1, 1000));
        assert_eq!(sim.uploads(&b), 0);
    }

    /// Sends `n` texts from `account`, `gap` apart.
    async fn paced(sim: &Simulator, account: &AccountId, n: usize, gap: Duration) {
        let g = sim.add_numbered_groups(account, n);
        for (i, group) in g.iter().enumerate() {
            if i > 0 {
                sleep(gap).await;
            }
            let got = sim.send(account, group, &text("x"), &format!("m{i}")).await;
            assert_eq!(got, OK);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn max_in_any_60s_counts_a_half_open_window() {
        let sim = simulator(SimConfig::instant());
        let (a, b, c) = (acct("a"), acct("b"), acct("c"));
        paced(&sim, &a, 41, Duration::from_millis(1500)).await;
        // The 41st send is at exactly 60 s: outside [0, 60 s).
        assert_eq!(sim.deliveries(&a)[40].at, t0() + Duration::from_secs(60));
        assert_eq!(sim.max_in_any_60s(&a), 40);
        paced(&sim, &b, 41, Duration::from_millis(1400)).await;
        assert_eq!(sim.max_in_any_60s(&b), 41);
        assert_eq!(sim.max_in_any_60s(&c), 0);
        assert_eq!(sim.max_in_any_60s(&acct("nobody")), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sender_that_honours_retry_after_stays_under_the_limit() {
        let sim = simulator(SimConfig {
            rate_limit_per_minute: Some(40),
            ban_after_refusals: None,
            ..SimConfig::default()
        });
        let a = acct("sales");
        let groups = sim.add_numbered_groups(&a, 300);
        for (i, g) in groups.iter().enumerate() {
            loop {
                match sim.send(&a, g, &text("x"), &format!("m{i}")).await {
                    Ok(_) => break,
                    Err(GatewayError::RateLimited { retry_after }) => {
                        sleep(retry_after.expect("the simulator always says when")).await
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        assert_eq!(sim.delivered(&a), 300);
        assert_eq!(sim.max_in_any_60s(&a), 40);
    }

    #[tokio::test(start_paused = true)]
    async fn duplicate_deliveries_catch_a_resend_under_a_new_id() {
        let sim = simulator(SimConfig::instant());
        let a = acct("sales");
        let g = sim.add_numbered_groups(&a, 2);
        assert_eq!(sim.send(&a, &g[0], &text("hello"), "r1-g0-p0").await, OK);
        assert_eq!(sim.send(&a, &g[1], &text("hello"), "r1-g1-p0").await, OK);
        assert_eq!(sim.duplicate_deliveries(), 0, "same text, other group");
        assert_eq!(sim.send(&a, &g[0], &text("hello"), "r1-g0-p0").await, DUP);
        assert_eq!(sim.duplicate_deliveries(), 0, "same id is caught by dedup");
        assert_eq!(
            sim.send(&a, &g[0], &text("hello"), "r1-g0-p0-retry").await,
            OK
        );
        assert_eq!(sim.duplicate_deliveries(), 1);

        // Media is keyed by what it shows, not by the upload handle.
        let (id, bytes) = picture(100);
        let h1 = sim
            .upload(&a, &id, "image/png", bytes.clone())
            .await
            .unwrap();
        let h2 = sim.upload(&a, &id, "image/png", bytes).await.unwrap();
        assert_ne!(h1.handle, h2.handle);
        assert_eq!(sim.send(&a, &g[0], &media(&h1, Some("hi")), "p1").await, OK);
        assert_eq!(
            sim.send(&a, &g[0], &media(&h1, Some("bye")), "p2").await,
            OK
        );
        assert_eq!(sim.duplicate_deliveries(), 1);
        assert_eq!(sim.send(&a, &g[0], &media(&h2, Some("hi")), "p3").await, OK);
        assert_eq!(sim.duplicate_deliveries(), 2);
        assert_eq!(sim.stats(&a).duplicate_deliveries, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn instant_config_sends_20k_across_100_accounts_quickly() {
        let sim = Arc::new(Simulator::new(
            SimConfig::instant(),
            Arc::new(crate::ports::SystemClock),
        ));
        let accounts: Vec<AccountId> = (0..100).map(|i| acct(&format!("acct-{i}"))).collect();
        for a in &accounts {
            sim.add_numbered_groups(a, 200);
        }
        let start = std::time::Instant::now();
        let tasks: Vec<_> = accounts
            .iter()
            .cloned()
            .map(|a| {
                let sim = sim.clone();
                tokio::spawn(async move {
                    let msg = text("Standup in 10 minutes");
                    for i in 0..200 {
                        let g = Simulator::numbered_group(i);
                        let got = sim.send(&a, &g, &msg, &format!("{a}-{i}")).await;
                        assert_eq!(got, OK);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let took = start.elapsed();
        let rate = 20_000.0 / took.as_secs_f64();
        println!("simulator: 20000 sends in {took:?} ({rate:.0}/s)");
        assert_eq!(sim.total_delivered(), 20_000);
        assert_eq!(sim.duplicate_deliveries(), 0);
        assert!(rate > 20_000.0, "{rate:.0} sends/s");
    }
}
