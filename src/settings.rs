//! Typed, layered settings: the embedded `config/default.toml`, then an
//! optional `--config FILE`, then `HERALD_SECTION__KEY` environment
//! variables. The seed's BOT_* names still work, below HERALD_*.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULTS_TOML: &str = include_str!("../config/default.toml");

/// The seed's environment names and the keys they set.
const SEED_NAMES: &[(&str, &str)] = &[
    ("BOT_MAX_SEND_PER_MINUTE", "delivery.max_per_minute"),
    ("BOT_GROUP_CONCURRENCY", "delivery.group_concurrency"),
    ("BOT_FIRE_CONCURRENCY", "delivery.fire_concurrency"),
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub control: ControlSettings,
    pub storage: StorageSettings,
    pub delivery: DeliverySettings,
    pub scheduler: SchedulerSettings,
    pub media: MediaSettings,
    pub retention: RetentionSettings,
    pub receipts: ReceiptSettings,
    pub recall: RecallSettings,
    pub simulator: SimulatorSettings,
    pub whatsapp: WhatsappSettings,
    pub groups: GroupsSettings,
    pub cluster: ClusterSettings,
    pub webhooks: WebhookSettings,
    pub log: LogSettings,
}

/// Outgoing webhooks (`/v1/webhooks`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Lets a webhook point at a loopback, private or link-local address.
    pub allow_private: bool,
    /// Seconds an attempt may take before it counts as failed.
    pub timeout_secs: u64,
    /// Attempts in flight at once, over every subscription.
    pub max_in_flight: usize,
    /// How often due deliveries are looked for (ms).
    pub poll_ms: u64,
    /// A subscription every attempt of which failed for this long is
    /// disabled with a reason.
    pub disable_after_hours: u64,
    /// Multiplies the retry schedule (5 s, 5 min, 30 min, 2 h, 5 h, 10 h,
    /// 10 h); 1 in production, small in tests.
    pub retry_scale: f64,
    /// The HTTP(S) proxy attempts go through (`http://host:port`); empty =
    /// none. `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` are ignored: a
    /// proxy the operator did not name here would resolve the receiver's
    /// name itself, past the address check. May hold credentials.
    pub proxy: Secret,
}

/// Several daemons on one PostgreSQL database, sharing the accounts by lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    pub enabled: bool,
    pub node_id: String,
    pub lease_secs: u64,
    pub advertise_url: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSettings {
    pub listen: String,
    pub token: Secret,
    pub token_file: String,
    /// Refuse to start the daemon unless `token` or `token_file` gives the
    /// token (the container image turns it on: a token generated into the
    /// data volume would be hidden from the operator, and `"none"` there
    /// would leave `/v1` open on every interface).
    pub require_configured_token: bool,
    pub allowed_hosts: String,
    pub trusted_proxies: String,
    pub unix_socket: String,
    pub max_json_bytes: usize,
    pub rate_limit_per_second: u32,
    pub rate_limit_burst: u32,
    pub max_event_streams: u32,
    /// Event streams one caller (a user, the daemon token, a console
    /// session's user) may hold open at once.
    pub max_event_streams_per_caller: u32,
    /// A bearer token `/metrics` asks for; empty: open.
    pub metrics_token: Secret,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSettings {
    pub data_dir: PathBuf,
    pub database_url: Secret,
    /// A file whose first line is the database URL (a mounted secret);
    /// read at load time into `database_url`.
    pub database_url_file: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliverySettings {
    pub max_per_minute: u32,
    pub group_concurrency: u32,
    pub fire_concurrency: u32,
    pub jitter_min_ms: u64,
    pub jitter_max_ms: u64,
    pub max_attempts: u32,
    pub retry_base_ms: u64,
    pub rate_limit_factor: f64,
    pub rate_limit_cooldown_secs: u64,
    pub drain_grace_secs: u64,
    pub pace_jitter: f64,
    pub pace_slack: f64,
    pub typing: bool,
    pub typing_max_ms: u64,
    pub warmup: String,
    pub warmup_all_accounts: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSettings {
    pub late_fire_grace_secs: u64,
    pub reconcile_secs: u64,
    pub missed_cap: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MediaSettings {
    pub max_bytes: u64,
}

/// How long history is kept; 0 keeps it forever.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    pub runs_days: u32,
    pub events_days: u32,
    pub media_unreferenced_hours: u32,
    pub audit_days: u32,
    pub interval_secs: u64,
    pub batch: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatorSettings {
    pub latency_min_ms: u64,
    pub latency_max_ms: u64,
    pub upload_bytes_per_sec: u64,
    pub groups_per_account: u32,
    pub rate_limit_per_minute: u32,
    /// Whether simulated groups send receipts, and how many read, when.
    pub receipts: bool,
    pub read_share: f64,
    pub read_after_secs: u64,
    /// Whether simulated members vote on polls, how many, and when.
    pub vote_share: f64,
    pub vote_after_secs: u64,
    pub vote_again_after_secs: u64,
    /// A shared `herald simulator serve` (http://host:port); empty = the
    /// simulator inside this daemon.
    pub url: String,
}

/// Receipts: when a run's counts are reported.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptSettings {
    pub settle_after_secs: u64,
    pub check_every_secs: u64,
}

/// Recalls and edits of sent runs: how long after a send WhatsApp allows them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecallSettings {
    pub window_secs: u64,
    pub edit_window_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupsSettings {
    pub min_sync_interval_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhatsappSettings {
    pub ack_timeout_secs: u64,
    pub reconnect_wait_secs: u64,
    pub connect_timeout_secs: u64,
    pub request_timeout_secs: u64,
    pub upload_timeout_secs: u64,
    pub upload_valid_hours: u64,
    pub groups_ttl_secs: u64,
    pub threads: u32,
    /// WhatsApp Web's WebSocket address; empty = WhatsApp's own.
    pub server_url: String,
    /// The WhatsApp Web version announced, e.g. `2.3000.1023456789`;
    /// empty = the client's own choice (it may fetch the current one).
    pub version: String,
    /// The key the sessions are sealed with in the database; empty =
    /// `<data_dir>/session.key`, generated (0600) on the first start.
    pub session_key_file: String,
    /// Logins a daemon starts a second when it connects many accounts at
    /// once (start-up, a takeover): spread, so a restart does not look
    /// like a login storm to WhatsApp.
    pub logins_per_sec: u32,
    /// Keep a legacy `session.db` (as `session.db.imported`, with its
    /// `-wal`/`-shm`) after importing it; off: deleted once the sealed copy
    /// has committed, so no plain-text copy of the keys stays on disk.
    pub keep_imported_session_files: bool,
    /// Seconds between readings of each account's standing (time-lock,
    /// new-chat quota), besides at login and after a 463.
    pub standing_every_secs: u64,
    /// The document id of WhatsApp Web's new-chat quota query, which
    /// WhatsApp changes with its builds.
    pub quota_doc_id: String,
}

/// The control port's own settings, read where the port is served: the
/// port and its adapters see these, not the whole of [`Settings`].
impl ControlSettings {
    pub fn listen_addr(&self) -> Result<SocketAddr, SettingsError> {
        self.listen.parse().map_err(|_| {
            bad(
                "control.listen",
                "must be an IP address and port, e.g. 127.0.0.1:8790",
            )
        })
    }

    /// `control.allowed_hosts`: extra names the port answers to as `Host`,
    /// lower-cased.
    pub fn allowed_hosts(&self) -> Vec<String> {
        self.allowed_hosts
            .split(',')
            .map(|n| n.trim().trim_end_matches('.').to_ascii_lowercase())
            .filter(|n| !n.is_empty())
            .collect()
    }

    /// `control.trusted_proxies`: the reverse proxies whose forwarding
    /// headers are believed.
    pub fn trusted_proxies(&self) -> Result<crate::proxies::Proxies, SettingsError> {
        self.trusted_proxies
            .parse()
            .map_err(|e: String| bad("control.trusted_proxies", e))
    }
}

impl Settings {
    /// The warm-up ramp for new numbers: "off", "default", or
    /// "DAY:CEILING,...".
    pub fn warmup(
        &self,
    ) -> Result<Option<herald_actors::delivery::caps::Warmup>, herald_actors::domain::ValidationError>
    {
        use herald_actors::delivery::caps::Warmup;
        match self.delivery.warmup.trim() {
            "" | "off" => Ok(None),
            "default" => Ok(Some(Warmup::default())),
            steps => Warmup::parse(steps, "delivery.warmup").map(Some),
        }
    }
}

impl Settings {
    /// The WhatsApp session key's file (`whatsapp.session_key_file`).
    pub fn session_key_path(&self) -> std::path::PathBuf {
        match self.whatsapp.session_key_file.as_str() {
            "" => self.storage.data_dir.join("session.key"),
            p => std::path::PathBuf::from(p),
        }
    }
}

impl WhatsappSettings {
    /// `version` as its three numbers, when set.
    pub fn version_numbers(&self) -> Result<Option<(u32, u32, u32)>, SettingsError> {
        if self.version.is_empty() {
            return Ok(None);
        }
        let parts: Vec<Option<u32>> = self.version.split('.').map(|p| p.parse().ok()).collect();
        match parts.as_slice() {
            [Some(a), Some(b), Some(c)] => Ok(Some((*a, *b, *c))),
            _ => Err(bad(
                "whatsapp.version",
                "must be three numbers separated by dots, e.g. 2.3000.1023456789",
            )),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub filter: String,
}

/// A setting that must not be printed: Debug, Display and Serialize show
/// `[redacted]` unless it is empty.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "[redacted]"
        })
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { "[redacted]" })
    }
}

/// Where the control port's bearer token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `control.token` or `control.token_file`.
    Configured(Secret),
    /// Nothing configured: the token generated into the data dir.
    Generated,
    /// `control.token = "none"`: `/v1` without a token, on purpose.
    Disabled,
}

/// The value of `control.token` that turns the token off.
pub const NO_TOKEN: &str = "none";

/// A setting that stops start-up, naming the key and the rule.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {key}: {rule}")]
pub struct SettingsError {
    pub key: String,
    pub rule: String,
}

/// The least a configured token must be: long and varied enough that it
/// cannot be guessed through the port (a generated one is 64 hex digits).
pub const MIN_TOKEN_CHARS: usize = 24;

/// Refuses a token too short or too uniform to be a secret.
pub fn check_token_strength(token: &Secret) -> Result<(), String> {
    let t = token.expose();
    let distinct: std::collections::BTreeSet<char> = t.chars().collect();
    if t.chars().count() < MIN_TOKEN_CHARS
        || distinct.len() < 8
        || t.chars().any(char::is_whitespace)
    {
        return Err(format!(
            "must be at least {MIN_TOKEN_CHARS} characters, at least 8 of them different, with no \
             space (a long random string, e.g. head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')"
        ));
    }
    Ok(())
}

fn is_node_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn bad(key: &str, rule: impl Into<String>) -> SettingsError {
    SettingsError {
        key: key.to_owned(),
        rule: rule.into(),
    }
}

/// The database a URL selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseKind {
    Sqlite,
    Postgres,
}

impl Settings {
    /// Loads the layers from the process environment.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        Self::load_from(file, &std::env::vars().collect())
    }

    /// Loads the layers with an explicit environment (for tests).
    pub fn load_from(file: Option<&Path>, env: &HashMap<String, String>) -> anyhow::Result<Self> {
        let mut b = config::Config::builder().add_source(config::File::from_str(
            DEFAULTS_TOML,
            config::FileFormat::Toml,
        ));
        if let Some(path) = file {
            if !path.exists() {
                anyhow::bail!("config file {} does not exist", path.display());
            }
            b = b.add_source(config::File::from(path).format(config::FileFormat::Toml));
        }
        for (name, key) in SEED_NAMES {
            if let Some(v) = env.get(*name) {
                b = b.set_override(*key, v.as_str())?;
            }
        }
        let herald_env: config::Map<String, String> = env
            .iter()
            // Only SECTION__KEY names are settings; HERALD_TEST_… and the like are not.
            .filter(|(k, _)| k.starts_with("HERALD_") && k.contains("__"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // A token variable that is set but empty is a mistake (a secret
        // that did not get filled in), not a request for no token.
        if env
            .get("HERALD_CONTROL__TOKEN")
            .is_some_and(|v| v.trim().is_empty())
        {
            return Err(bad(
                "control.token",
                "HERALD_CONTROL__TOKEN is set but empty; unset it to use the generated token",
            )
            .into());
        }
        // Seed names apply first; HERALD_* wins over them.
        for (k, v) in &herald_env {
            let key = k["HERALD_".len()..].to_lowercase().replace("__", ".");
            b = b.set_override(key, v.as_str())?;
        }
        let mut settings: Settings = b
            .build()
            .context("reading settings")?
            .try_deserialize()
            .map_err(|e| anyhow::anyhow!("invalid setting: {e}"))?;
        settings.read_database_url_file()?;
        settings.validate()?;
        Ok(settings)
    }

    /// `storage.database_url_file`: the URL (which holds the database
    /// password) from a file, such as a container secret, instead of the
    /// settings or the environment.
    fn read_database_url_file(&mut self) -> Result<(), SettingsError> {
        let file = &self.storage.database_url_file;
        if file.is_empty() {
            return Ok(());
        }
        if !self.storage.database_url.is_empty() {
            return Err(bad(
                "storage.database_url_file",
                "must be empty when storage.database_url is set (set one of the two)",
            ));
        }
        let text = std::fs::read_to_string(file).map_err(|e| {
            bad(
                "storage.database_url_file",
                format!("must name a readable file ({file}: {e})"),
            )
        })?;
        match text.lines().next().map(str::trim) {
            Some(url) if !url.is_empty() => {
                self.storage.database_url = Secret::new(url);
                Ok(())
            }
            _ => Err(bad(
                "storage.database_url_file",
                format!("{file} yields no URL: its first line is empty"),
            )),
        }
    }

    /// Where the other daemons of a cluster reach this one, which they
    /// send the daemon's token to: said outright, or derived from a listen
    /// address they can reach. Not an unspecified address (`0.0.0.0`,
    /// `::`: a peer would dial itself), and loopback only when said
    /// outright (a cluster on one host).
    fn check_advertised(&self, listen: std::net::SocketAddr) -> Result<(), SettingsError> {
        let url = &self.cluster.advertise_url;
        if url.is_empty() {
            let ip = listen.ip();
            if ip.is_unspecified() || ip.is_loopback() {
                return Err(bad(
                    "cluster.advertise_url",
                    format!(
                        "must be set in cluster mode while control.listen is {listen}, which \
                         other daemons cannot reach (they would send the daemon token to \
                         themselves): the URL they reach this daemon at, e.g. \
                         http://herald-a:8790 (http://127.0.0.1:PORT only if every daemon runs \
                         on this host)"
                    ),
                ));
            }
            return Ok(());
        }
        let host = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or_else(|| {
                bad(
                    "cluster.advertise_url",
                    "must start with http:// or https://",
                )
            })?
            .split(['/', '?', '#'])
            .next()
            .unwrap_or("");
        let host = match host.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty()
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_unspecified())
        {
            return Err(bad(
                "cluster.advertise_url",
                format!(
                    "must name a host other daemons can reach; {url:?} names no host or an \
                     unspecified address (0.0.0.0, ::)"
                ),
            ));
        }
        Ok(())
    }

    /// Range and consistency checks that serde cannot express.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let addr = self.listen_addr()?;
        // Always resolved here, so a token file that yields nothing stops
        // start-up before the database is opened.
        let token = self.token_source()?;
        if !addr.ip().is_loopback() && token == TokenSource::Disabled {
            return Err(bad(
                "control.token",
                format!("\"{NO_TOKEN}\" is refused on {addr}, which is not loopback"),
            ));
        }
        for name in self.allowed_hosts() {
            if name.contains([':', '/', '@', ' ', '[', ']']) {
                return Err(bad(
                    "control.allowed_hosts",
                    format!("{name:?} must be a host name without port or scheme"),
                ));
            }
        }
        self.trusted_proxies()?;
        if self.control.max_json_bytes < 1024 {
            return Err(bad("control.max_json_bytes", "must be at least 1024"));
        }
        if self.control.rate_limit_per_second > 0 && self.control.rate_limit_burst == 0 {
            return Err(bad(
                "control.rate_limit_burst",
                "must be at least 1 while control.rate_limit_per_second is on",
            ));
        }
        if self.control.max_event_streams == 0 {
            return Err(bad("control.max_event_streams", "must be at least 1"));
        }
        if self.control.max_event_streams_per_caller == 0 {
            return Err(bad(
                "control.max_event_streams_per_caller",
                "must be at least 1",
            ));
        }
        if !self.control.metrics_token.is_empty() {
            check_token_strength(&self.control.metrics_token)
                .map_err(|rule| bad("control.metrics_token", rule))?;
        }
        self.database_kind()?;
        let d = &self.delivery;
        if !(1..=600).contains(&d.max_per_minute) {
            return Err(bad("delivery.max_per_minute", "must be 1–600"));
        }
        if !(1..=64).contains(&d.group_concurrency) {
            return Err(bad("delivery.group_concurrency", "must be 1–64"));
        }
        if d.fire_concurrency > 100_000 {
            return Err(bad(
                "delivery.fire_concurrency",
                "must be 0 (unlimited) to 100000",
            ));
        }
        if d.jitter_min_ms > d.jitter_max_ms {
            return Err(bad(
                "delivery.jitter_min_ms",
                "must not exceed delivery.jitter_max_ms",
            ));
        }
        if d.max_attempts == 0 {
            return Err(bad("delivery.max_attempts", "must be at least 1"));
        }
        if !(d.rate_limit_factor > 0.0 && d.rate_limit_factor <= 1.0) {
            return Err(bad("delivery.rate_limit_factor", "must be in (0, 1]"));
        }
        if !(0.0..=0.95).contains(&d.pace_jitter) {
            return Err(bad("delivery.pace_jitter", "must be 0–0.95"));
        }
        if !(0.8..=10.0).contains(&d.pace_slack) {
            return Err(bad("delivery.pace_slack", "must be 0.8–10"));
        }
        if d.typing_max_ms > 30_000 {
            return Err(bad("delivery.typing_max_ms", "must be at most 30000"));
        }
        self.warmup().map_err(|e| bad("delivery.warmup", e.rule))?;
        let c = &self.cluster;
        if c.enabled {
            if self.database_kind()? != DatabaseKind::Postgres {
                return Err(bad(
                    "cluster.enabled",
                    "several daemons need PostgreSQL (storage.database_url = postgres://…); \
                     SQLite is one daemon per file",
                ));
            }
            if !(3..=600).contains(&c.lease_secs) {
                return Err(bad("cluster.lease_secs", "must be 3–600"));
            }
            if !c.node_id.is_empty() && !is_node_id(&c.node_id) {
                return Err(bad(
                    "cluster.node_id",
                    "must be 1–64 characters of a-z, A-Z, 0-9, '.', '_' or '-'",
                ));
            }
            self.check_advertised(addr)?;
        }
        if self.scheduler.reconcile_secs == 0 {
            return Err(bad("scheduler.reconcile_secs", "must be at least 1"));
        }
        let r = &self.retention;
        if r.interval_secs == 0 {
            return Err(bad("retention.interval_secs", "must be at least 1"));
        }
        if !(1..=10_000).contains(&r.batch) {
            return Err(bad("retention.batch", "must be 1–10000"));
        }
        if self.media.max_bytes == 0 || self.media.max_bytes > 100 * 1024 * 1024 {
            return Err(bad("media.max_bytes", "must be 1 byte to 100 MiB"));
        }
        let s = &self.simulator;
        if s.latency_min_ms > s.latency_max_ms {
            return Err(bad(
                "simulator.latency_min_ms",
                "must not exceed simulator.latency_max_ms",
            ));
        }
        if s.upload_bytes_per_sec == 0 {
            return Err(bad("simulator.upload_bytes_per_sec", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&s.read_share) {
            return Err(bad("simulator.read_share", "must be between 0 and 1"));
        }
        if s.read_after_secs > 86_400 {
            return Err(bad("simulator.read_after_secs", "must be 0–86400"));
        }
        if !(0.0..=1.0).contains(&s.vote_share) {
            return Err(bad("simulator.vote_share", "must be between 0 and 1"));
        }
        for (field, v) in [
            ("simulator.vote_after_secs", s.vote_after_secs),
            ("simulator.vote_again_after_secs", s.vote_again_after_secs),
        ] {
            if v > 86_400 {
                return Err(bad(field, "must be 0–86400"));
            }
        }
        if !s.url.is_empty() {
            parse_simulator_url(&s.url).map_err(|rule| bad("simulator.url", rule))?;
        }
        if self.receipts.settle_after_secs > 7 * 86_400 {
            return Err(bad(
                "receipts.settle_after_secs",
                "must be 0–604800 (7 days)",
            ));
        }
        if !(1..=3_600).contains(&self.receipts.check_every_secs) {
            return Err(bad("receipts.check_every_secs", "must be 1–3600"));
        }
        // WhatsApp's own limits are about two days and 15 minutes: a
        // longer window would only send what WhatsApp refuses.
        if !(60..=7 * 86_400).contains(&self.recall.window_secs) {
            return Err(bad("recall.window_secs", "must be 60–604800 (7 days)"));
        }
        if !(60..=86_400).contains(&self.recall.edit_window_secs) {
            return Err(bad("recall.edit_window_secs", "must be 60–86400"));
        }
        if !(1..=86_400).contains(&self.groups.min_sync_interval_secs) {
            return Err(bad("groups.min_sync_interval_secs", "must be 1–86400"));
        }
        let w = &self.whatsapp;
        for (key, v) in [
            ("whatsapp.ack_timeout_secs", w.ack_timeout_secs),
            ("whatsapp.reconnect_wait_secs", w.reconnect_wait_secs),
            ("whatsapp.connect_timeout_secs", w.connect_timeout_secs),
            ("whatsapp.request_timeout_secs", w.request_timeout_secs),
            ("whatsapp.upload_timeout_secs", w.upload_timeout_secs),
            ("whatsapp.upload_valid_hours", w.upload_valid_hours),
            ("whatsapp.groups_ttl_secs", w.groups_ttl_secs),
        ] {
            if v == 0 {
                return Err(bad(key, "must be at least 1"));
            }
        }
        if !(1..=16).contains(&w.threads) {
            return Err(bad("whatsapp.threads", "must be 1–16"));
        }
        if !(60..=86_400).contains(&w.standing_every_secs) {
            return Err(bad("whatsapp.standing_every_secs", "must be 60–86400"));
        }
        if w.quota_doc_id.is_empty() || !w.quota_doc_id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(
                "whatsapp.quota_doc_id",
                "must be the query's document id: digits only",
            ));
        }
        if !(1..=1000).contains(&w.logins_per_sec) {
            return Err(bad("whatsapp.logins_per_sec", "must be 1–1000"));
        }
        if !(w.server_url.is_empty()
            || w.server_url.starts_with("wss://")
            || w.server_url.starts_with("ws://"))
        {
            return Err(bad(
                "whatsapp.server_url",
                "must be empty or a ws:// or wss:// URL",
            ));
        }
        w.version_numbers()?;
        let h = &self.webhooks;
        if h.timeout_secs == 0 {
            return Err(bad("webhooks.timeout_secs", "must be at least 1"));
        }
        parse_webhook_proxy(h.proxy.expose()).map_err(|rule| bad("webhooks.proxy", rule))?;
        tracing_subscriber::EnvFilter::try_new(&self.log.filter)
            .map_err(|e| bad("log.filter", format!("is not a valid tracing filter: {e}")))?;
        Ok(())
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, SettingsError> {
        self.control.listen_addr()
    }

    /// Where the bearer token comes from. A token file that cannot be
    /// read or yields no token is an error naming `control.token_file`:
    /// start-up stops rather than serving `/v1` open or with a token the
    /// operator did not mean.
    pub fn token_source(&self) -> Result<TokenSource, SettingsError> {
        let c = &self.control;
        if c.token.expose().trim() == NO_TOKEN {
            if !c.token_file.is_empty() {
                return Err(bad(
                    "control.token_file",
                    format!("must be empty when control.token = \"{NO_TOKEN}\""),
                ));
            }
            return Ok(TokenSource::Disabled);
        }
        if !c.token.is_empty() {
            check_token_strength(&c.token).map_err(|rule| bad("control.token", rule))?;
            return Ok(TokenSource::Configured(c.token.clone()));
        }
        if c.token_file.is_empty() {
            return Ok(TokenSource::Generated);
        }
        let text = std::fs::read_to_string(&c.token_file).map_err(|e| {
            bad(
                "control.token_file",
                format!("must name a readable file ({}: {e})", c.token_file),
            )
        })?;
        match text.lines().next().map(str::trim) {
            Some(line) if !line.is_empty() => {
                let token = Secret::new(line);
                check_token_strength(&token).map_err(|rule| {
                    bad(
                        "control.token_file",
                        format!("{}: the token {rule}", c.token_file),
                    )
                })?;
                Ok(TokenSource::Configured(token))
            }
            _ => Err(bad(
                "control.token_file",
                format!("{} yields no token: its first line is empty", c.token_file),
            )),
        }
    }

    /// `control.allowed_hosts`: extra names the port answers to as `Host`,
    /// lower-cased.
    pub fn allowed_hosts(&self) -> Vec<String> {
        self.control.allowed_hosts()
    }

    /// `control.trusted_proxies`: the reverse proxies whose forwarding
    /// headers are believed.
    pub fn trusted_proxies(&self) -> Result<crate::proxies::Proxies, SettingsError> {
        self.control.trusted_proxies()
    }

    /// The database URL, defaulting to a SQLite file under the data dir.
    pub fn database_url(&self) -> String {
        if self.storage.database_url.is_empty() {
            format!(
                "sqlite://{}",
                self.storage.data_dir.join("herald.db").display()
            )
        } else {
            self.storage.database_url.expose().to_owned()
        }
    }

    pub fn database_kind(&self) -> Result<DatabaseKind, SettingsError> {
        let url = self.database_url();
        if url.starts_with("sqlite:") {
            Ok(DatabaseKind::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(DatabaseKind::Postgres)
        } else {
            Err(bad(
                "storage.database_url",
                "must start with sqlite:// or postgres://",
            ))
        }
    }

    /// This daemon's node id: the setting, or the host name.
    pub fn node_id(&self) -> String {
        if !self.cluster.node_id.is_empty() {
            return self.cluster.node_id.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| is_node_id(h))
            .unwrap_or_else(|| "herald".to_owned())
    }

    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.cluster.lease_secs)
    }

    pub fn drain_grace(&self) -> Duration {
        Duration::from_secs(self.delivery.drain_grace_secs)
    }

    /// The effective settings as TOML, secrets redacted (`herald config`).
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self).expect("settings serialise")
    }
}

/// The rule of `webhooks.proxy`.
pub const PROXY_RULE: &str = "must be empty or an http:// or https:// proxy URL with a host and \
                              no path, e.g. http://proxy.internal:3128 (SOCKS is not supported)";

/// Checks a `webhooks.proxy`: empty (`None`), or `http(s)://[user:pass@]
/// host[:port]` with nothing after the authority but an optional `/`. The
/// error never repeats the URL: it may hold a password.
pub fn parse_webhook_proxy(raw: &str) -> Result<Option<url::Url>, String> {
    if raw.trim().is_empty() {
        return Ok(None);
    }
    let url = url::Url::parse(raw).map_err(|e| format!("{PROXY_RULE} (it does not parse: {e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{PROXY_RULE} (its scheme is {})", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{PROXY_RULE} (it has no host)"));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{PROXY_RULE} (it has a path, query or fragment)"));
    }
    Ok(Some(url))
}

/// Checks a `simulator.url`: `http://host[:port]`, nothing after the
/// authority but an optional `/`. Answers the base that paths are appended to.
pub fn parse_simulator_url(url: &str) -> Result<String, String> {
    const RULE: &str = "must be empty or an http:// URL with a host and no path, \
                        e.g. http://127.0.0.1:7790";
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{RULE} ({url:?}: {e})"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{RULE} ({url:?} is not http://)"));
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("{RULE} ({url:?} has no host)"));
    };
    if authority.host().is_empty() || authority.as_str().contains('@') {
        return Err(format!("{RULE} ({url:?})"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("{RULE} ({url:?} has a path or query)"));
    }
    Ok(format!("http://{authority}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = Settings::load_from(None, &env(&[])).unwrap();
        assert_eq!(s.control.listen, "127.0.0.1:8790");
        assert_eq!(s.delivery.max_per_minute, 40);
        assert_eq!(s.delivery.group_concurrency, 3);
        assert_eq!(s.delivery.fire_concurrency, 8);
        assert_eq!(s.database_url(), "sqlite://./data/herald.db");
        assert_eq!(s.database_kind().unwrap(), DatabaseKind::Sqlite);
        assert_eq!(s.simulator.url, "", "the simulator inside the daemon");
    }

    #[test]
    fn seed_names_work_and_herald_names_win() {
        let s = Settings::load_from(
            None,
            &env(&[
                ("BOT_MAX_SEND_PER_MINUTE", "20"),
                ("BOT_GROUP_CONCURRENCY", "5"),
            ]),
        )
        .unwrap();
        assert_eq!(s.delivery.max_per_minute, 20);
        assert_eq!(s.delivery.group_concurrency, 5);
        let s = Settings::load_from(
            None,
            &env(&[
                ("BOT_MAX_SEND_PER_MINUTE", "20"),
                ("HERALD_DELIVERY__MAX_PER_MINUTE", "30"),
            ]),
        )
        .unwrap();
        assert_eq!(s.delivery.max_per_minute, 30);
    }

    #[test]
    fn file_layer_sits_between_defaults_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(
            &path,
            "[delivery]\nmax_per_minute = 25\nfire_concurrency = 2\n",
        )
        .unwrap();
        let s = Settings::load_from(
            Some(&path),
            &env(&[("HERALD_DELIVERY__FIRE_CONCURRENCY", "4")]),
        )
        .unwrap();
        assert_eq!(s.delivery.max_per_minute, 25);
        assert_eq!(s.delivery.fire_concurrency, 4);
        assert_eq!(s.delivery.group_concurrency, 3);
    }

    #[test]
    fn invalid_settings_name_the_key_and_rule() {
        let cases = [
            (
                "HERALD_DELIVERY__MAX_PER_MINUTE",
                "0",
                "delivery.max_per_minute: must be 1–600",
            ),
            (
                "HERALD_CONTROL__LISTEN",
                "nowhere",
                "control.listen: must be an IP address",
            ),
            (
                "HERALD_CONTROL__TOKEN",
                "",
                "control.token: HERALD_CONTROL__TOKEN is set but empty",
            ),
            (
                "HERALD_STORAGE__DATABASE_URL",
                "mysql://x",
                "storage.database_url: must start with",
            ),
            (
                "BOT_GROUP_CONCURRENCY",
                "many",
                "delivery.group_concurrency",
            ),
            ("HERALD_DELIVERY__NO_SUCH_KEY", "1", "no_such_key"),
            (
                "HERALD_SIMULATOR__URL",
                "https://sim:7790",
                "simulator.url: must be empty or an http:// URL",
            ),
            (
                "HERALD_SIMULATOR__URL",
                "127.0.0.1:7790",
                "simulator.url: must be empty or an http:// URL",
            ),
            (
                "HERALD_WHATSAPP__THREADS",
                "0",
                "whatsapp.threads: must be 1–16",
            ),
            (
                "HERALD_WHATSAPP__ACK_TIMEOUT_SECS",
                "0",
                "whatsapp.ack_timeout_secs: must be at least 1",
            ),
            (
                "HERALD_WEBHOOKS__PROXY",
                "socks5://proxy.internal:1080",
                "webhooks.proxy: must be empty or an http:// or https:// proxy URL",
            ),
            (
                "HERALD_WEBHOOKS__PROXY",
                "http://proxy.internal:3128/some/path",
                "webhooks.proxy: must be empty or an http:// or https:// proxy URL",
            ),
            (
                "HERALD_WEBHOOKS__TIMEOUT_SECS",
                "0",
                "webhooks.timeout_secs: must be at least 1",
            ),
        ];
        for (k, v, expect) in cases {
            let err = format!(
                "{:#}",
                Settings::load_from(None, &env(&[(k, v)])).unwrap_err()
            );
            assert!(err.contains(expect), "{k}={v}: {err}");
        }
    }

    #[test]
    fn non_loopback_is_allowed_with_a_token() {
        let s = Settings::load_from(
            None,
            &env(&[
                ("HERALD_CONTROL__LISTEN", "0.0.0.0:8790"),
                ("HERALD_CONTROL__TOKEN", "s3cret-0123456789abcdefXYZ"),
            ]),
        )
        .unwrap();
        assert_eq!(
            s.token_source().unwrap(),
            TokenSource::Configured(Secret::new("s3cret-0123456789abcdefXYZ"))
        );
        let printed = s.to_redacted_toml();
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(printed.contains("[redacted]"));
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn a_weak_token_is_refused_naming_the_key() {
        for weak in [
            "a",
            "s3cret",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "abababababababababababababab",
            "correct horse battery staple x",
        ] {
            let err =
                Settings::load_from(None, &env(&[("HERALD_CONTROL__TOKEN", weak)])).unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains("invalid setting control.token: must be at least 24 characters"),
                "{weak}: {err}"
            );
        }
        let err = Settings::load_from(None, &env(&[("HERALD_CONTROL__METRICS_TOKEN", "short")]))
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("control.metrics_token: must be at least 24"),
            "{err:#}"
        );
        // A hex one of 32 digits is fine (a generated token too: its
        // test is in `token`, which is above this module).
        assert!(Settings::load_from(
            None,
            &env(&[("HERALD_CONTROL__TOKEN", "9f86d081884c7d659a2feaa0c55ad015")])
        )
        .is_ok());
    }

    #[test]
    fn a_cluster_daemon_must_advertise_an_address_the_others_reach() {
        let cluster = |listen: &str, advertise: &str| {
            Settings::load_from(
                None,
                &env(&[
                    (
                        "HERALD_STORAGE__DATABASE_URL",
                        "postgres://herald@db/herald",
                    ),
                    ("HERALD_CLUSTER__ENABLED", "true"),
                    ("HERALD_CONTROL__LISTEN", listen),
                    ("HERALD_CLUSTER__ADVERTISE_URL", advertise),
                ]),
            )
            .map_err(|e| format!("{e:#}"))
        };
        for (listen, advertise) in [
            ("0.0.0.0:8790", ""),
            ("[::]:8790", ""),
            ("127.0.0.1:8790", ""),
            ("0.0.0.0:8790", "http://0.0.0.0:8790"),
            ("0.0.0.0:8790", "http://[::]:8790/"),
            ("0.0.0.0:8790", "http://:8790"),
            ("0.0.0.0:8790", "ftp://herald-a:8790"),
        ] {
            let err = cluster(listen, advertise).unwrap_err();
            assert!(
                err.contains("invalid setting cluster.advertise_url: must"),
                "{listen} {advertise}: {err}"
            );
        }
        for (listen, advertise) in [
            ("10.0.0.5:8790", ""),
            ("0.0.0.0:8790", "http://herald-a:8790"),
            ("127.0.0.1:8790", "http://127.0.0.1:8790"),
            ("0.0.0.0:8790", "https://[2001:db8::5]:8790/"),
        ] {
            assert!(cluster(listen, advertise).is_ok(), "{listen} {advertise}");
        }
    }

    #[test]
    fn no_token_configured_means_generated_and_none_means_disabled() {
        let s = Settings::load_from(None, &env(&[])).unwrap();
        assert_eq!(s.token_source().unwrap(), TokenSource::Generated);
        // A non-loopback address is fine with the generated token...
        let s = Settings::load_from(None, &env(&[("HERALD_CONTROL__LISTEN", "0.0.0.0:8790")]));
        assert_eq!(s.unwrap().token_source().unwrap(), TokenSource::Generated);
        let s = Settings::load_from(None, &env(&[("HERALD_CONTROL__TOKEN", "none")])).unwrap();
        assert_eq!(s.token_source().unwrap(), TokenSource::Disabled);
        // ...but never with the token turned off.
        let err = Settings::load_from(
            None,
            &env(&[
                ("HERALD_CONTROL__TOKEN", "none"),
                ("HERALD_CONTROL__LISTEN", "0.0.0.0:8790"),
            ]),
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("control.token: \"none\" is refused on 0.0.0.0:8790"),
            "{err:#}"
        );
    }

    #[test]
    fn a_token_file_that_yields_nothing_stops_start_up() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let load = || {
            Settings::load_from(
                None,
                &env(&[("HERALD_CONTROL__TOKEN_FILE", file.to_str().unwrap())]),
            )
        };
        let err = format!("{:#}", load().unwrap_err());
        assert!(
            err.contains("control.token_file: must name a readable file"),
            "{err}"
        );
        for empty in ["", "\n", "  \nsecond-line"] {
            std::fs::write(&file, empty).unwrap();
            let err = format!("{:#}", load().unwrap_err());
            assert!(err.contains("control.token_file: "), "{err}");
            assert!(err.contains("yields no token"), "{err}");
        }
        std::fs::write(&file, "abc\n").unwrap();
        let err = format!("{:#}", load().unwrap_err());
        assert!(
            err.contains("control.token_file: ") && err.contains("the token must be at least 24"),
            "{err}"
        );
        std::fs::write(&file, "abc-0123456789-defghijklm\n").unwrap();
        assert_eq!(
            load().unwrap().token_source().unwrap(),
            TokenSource::Configured(Secret::new("abc-0123456789-defghijklm"))
        );
    }

    #[test]
    fn postgres_url_selects_postgres_and_is_redacted() {
        let s = Settings::load_from(
            None,
            &env(&[(
                "HERALD_STORAGE__DATABASE_URL",
                "postgres://herald:pw@db/herald",
            )]),
        )
        .unwrap();
        assert_eq!(s.database_kind().unwrap(), DatabaseKind::Postgres);
        assert!(!s.to_redacted_toml().contains("pw@db"));
    }

    #[test]
    fn the_database_url_can_come_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("database-url");
        std::fs::write(&file, "postgres://herald:pw@db/herald\n").unwrap();
        let path = file.to_str().unwrap();
        let s = Settings::load_from(None, &env(&[("HERALD_STORAGE__DATABASE_URL_FILE", path)]))
            .unwrap();
        assert_eq!(s.database_url(), "postgres://herald:pw@db/herald");
        assert_eq!(s.database_kind().unwrap(), DatabaseKind::Postgres);
        assert!(!s.to_redacted_toml().contains("pw@db"));
        // Both set, an empty file, no file: each stops start-up naming the key.
        let both = [
            ("HERALD_STORAGE__DATABASE_URL_FILE", path),
            ("HERALD_STORAGE__DATABASE_URL", "postgres://db/herald"),
        ];
        let err = format!("{:#}", Settings::load_from(None, &env(&both)).unwrap_err());
        assert!(
            err.contains("storage.database_url_file: must be empty when"),
            "{err}"
        );
        std::fs::write(&file, "\n").unwrap();
        let err = format!(
            "{:#}",
            Settings::load_from(None, &env(&[("HERALD_STORAGE__DATABASE_URL_FILE", path)]))
                .unwrap_err()
        );
        assert!(err.contains("yields no URL"), "{err}");
        let missing = dir.path().join("nope");
        let err = format!(
            "{:#}",
            Settings::load_from(
                None,
                &env(&[(
                    "HERALD_STORAGE__DATABASE_URL_FILE",
                    missing.to_str().unwrap()
                )])
            )
            .unwrap_err()
        );
        assert!(
            err.contains("storage.database_url_file: must name a readable file"),
            "{err}"
        );
    }
}
