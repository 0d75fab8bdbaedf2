//! Herald's persistence on sqlx: SQLite (the embedded default) and
//! PostgreSQL behind one [`Store`] implementation.
//!
//! The SQL is written once with `$N` placeholders, which both backends
//! accept, and each method body is expanded once per backend by the
//! `read!`/`writer!`/`tx!` macros so the same text binds to each driver's
//! types. Where the dialects really differ (bulk inserts and the transition
//! batch: arrays through `UNNEST` on PostgreSQL, a JSON array through
//! `json_each` on SQLite) the `Bulk` trait has one implementation per
//! connection type.

mod rows;
pub mod scratch;

use anyhow::Context as _;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::lifecycle::MAYBE_DELIVERED;
use herald_actors::ports::*;
use rows::{trunc, RowGet, Ts};
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

/// The sqlx store. Cheap to share behind an `Arc`; the pools inside are
/// already reference-counted.
pub struct SqlStore {
    db: Db,
}

enum Db {
    /// SQLite has one writer at a time, so writes go through a pool of one
    /// connection and queue in the pool rather than spinning in SQLite's
    /// busy handler; reads use their own pool and run beside it under WAL.
    Sqlite {
        write: SqlitePool,
        read: SqlitePool,
    },
    Postgres(PgPool),
}

/// Expands `$body` once per backend with `$p` bound to a pool for reading.
macro_rules! read {
    ($self:ident, $p:ident => $body:expr) => {
        match &$self.db {
            Db::Sqlite { read: $p, .. } => $body,
            Db::Postgres($p) => $body,
        }
    };
}

/// Like `read!`, with the pool that may write (one statement, no transaction).
macro_rules! writer {
    ($self:ident, $p:ident => $body:expr) => {
        match &$self.db {
            Db::Sqlite { write: $p, .. } => $body,
            Db::Postgres($p) => $body,
        }
    };
}

/// Runs `$body` in a transaction bound to `$tx` and commits it. Leaving the
/// body early (`?`, `return`) drops the transaction, which rolls it back.
macro_rules! tx {
    ($self:ident, $tx:ident => $body:expr) => {
        match &$self.db {
            Db::Sqlite { write, .. } => {
                // IMMEDIATE takes the write lock up front: a deferred
                // transaction that reads first can fail with SQLITE_BUSY
                // on upgrade, which busy_timeout does not retry.
                let mut $tx = write.begin_with("BEGIN IMMEDIATE").await.map_err(be)?;
                let out = $body;
                $tx.commit().await.map_err(be)?;
                out
            }
            Db::Postgres(p) => {
                let mut $tx = p.begin().await.map_err(be)?;
                let out = $body;
                $tx.commit().await.map_err(be)?;
                out
            }
        }
    };
}

/// Inside a `tx!` body, as its last write: gives reminder `$id` the next
/// version. The scheduler reads the reminders written since the highest
/// version it has seen, so versions must become visible in order: a
/// version taken by a writer that commits after a faster writer's higher
/// one would be passed over. On PostgreSQL a transaction-scoped advisory
/// lock, held to the commit, orders the writers (`$lock` is
/// [`SqlStore::version_lock_sql`]); SQLite's write lock already does.
macro_rules! bump_version {
    ($tx:ident, $lock:expr, $id:expr) => {
        if let Some(lock) = $lock {
            sqlx::query(lock).execute(&mut *$tx).await.map_err(be)?;
        }
        sqlx::query(&format!(
            "UPDATE reminders SET version = {NEXT_VERSION} WHERE id = $1"
        ))
        .bind($id)
        .execute(&mut *$tx)
        .await
        .map_err(be)?;
    };
}

/// Inside a `tx!` body: fails with `Fenced` (the transaction rolls back)
/// unless every fence is its account's current lease. `$sql` is
/// [`SqlStore::fence_check_sql`].
macro_rules! check_fences {
    ($tx:ident, $sql:expr, $fences:expr) => {
        for f in $fences {
            let held: Option<i64> = sqlx::query_scalar($sql)
                .bind(f.account.as_str())
                .bind(&f.node)
                .bind(f.epoch)
                .fetch_optional(&mut *$tx)
                .await
                .map_err(be)?;
            if held.is_none() {
                return Err(f.refused());
            }
        }
    };
}

// After the macros above, which they use.
mod groups;
mod leases;

/// One daemon per database, unless they share the accounts by lease. Two
/// daemons without leases would both think they own every account and send
/// every run twice, so a second one is refused at start-up. SQLite: an
/// exclusive lock on `<file>.lock`, released by the kernel however the
/// daemon ends. PostgreSQL: a session advisory lock on a connection of its
/// own, released when that connection closes; exclusive for a lone daemon,
/// shared by the daemons of a cluster, so neither kind starts beside the
/// other.
#[derive(Debug)]
pub enum DaemonLock {
    File(std::fs::File),
    Postgres(sqlx::PgConnection),
}

/// The advisory lock key of "a Herald daemon runs on this database".
const DAEMON_LOCK_KEY: i64 = 0x4845_5241_4c44; // "HERALD"

impl DaemonLock {
    /// Takes the lock for the database at `url` (nothing to take for an
    /// in-memory database), or says who holds it.
    pub async fn for_url(url: &str) -> anyhow::Result<Option<DaemonLock>> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Self::postgres(url, false).await.map(Some);
        }
        let Some(db) = SqlStore::sqlite_file(url)? else {
            return Ok(None);
        };
        Self::file(&db).map(Some)
    }

    fn file(db: &std::path::Path) -> anyhow::Result<DaemonLock> {
        use std::io::{Read, Seek, Write};
        let mut path = db.to_path_buf().into_os_string();
        path.push(".lock");
        let path = std::path::PathBuf::from(path);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating database directory {}", dir.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                let who = if pid.is_empty() {
                    "another Herald daemon".to_owned()
                } else {
                    format!("another Herald daemon (pid {pid})")
                };
                anyhow::bail!(
                    "{who} is using the SQLite database {}: one daemon per database; stop \
                     it first",
                    db.display()
                );
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()))
            }
        }
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        Ok(DaemonLock::File(file))
    }

    /// The lock a daemon of a cluster holds: shared with the other
    /// daemons of the cluster, refused while a lone daemon runs.
    pub async fn for_cluster(url: &str) -> anyhow::Result<DaemonLock> {
        Self::postgres(url, true).await
    }

    async fn postgres(url: &str, shared: bool) -> anyhow::Result<DaemonLock> {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .context("connecting to PostgreSQL")?;
        let sql = if shared {
            "SELECT pg_try_advisory_lock_shared($1)"
        } else {
            "SELECT pg_try_advisory_lock($1)"
        };
        let got: bool = sqlx::query_scalar(sql)
            .bind(DAEMON_LOCK_KEY)
            .fetch_one(&mut conn)
            .await
            .context("taking the daemon lock")?;
        match (got, shared) {
            (true, _) => Ok(DaemonLock::Postgres(conn)),
            (false, false) => anyhow::bail!(
                "another Herald daemon is using this PostgreSQL database: one daemon per \
                 database unless every daemon runs with cluster.enabled = true; stop it first"
            ),
            (false, true) => anyhow::bail!(
                "a Herald daemon without cluster.enabled is using this PostgreSQL database: \
                 stop it, or run it with cluster.enabled = true too"
            ),
        }
    }
}

fn be(e: sqlx::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn corrupt(what: &str, e: impl Display) -> StoreError {
    StoreError::Backend(format!("stored {what} is invalid: {e}"))
}

fn not_found(what: impl Display) -> StoreError {
    StoreError::NotFound(what.to_string())
}

fn is_fk_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_foreign_key_violation())
}

fn parse_enum<T: FromStr<Err = ValidationError>>(s: String, what: &str) -> StoreResult<T> {
    s.parse().map_err(|e| corrupt(what, e))
}

fn to_u32(v: i64, what: &str) -> StoreResult<u32> {
    u32::try_from(v).map_err(|e| corrupt(what, e))
}

fn opt_u32(v: Option<i64>, what: &str) -> StoreResult<Option<u32>> {
    v.map(|v| to_u32(v, what)).transpose()
}

impl SqlStore {
    /// Opens `sqlite://PATH` (creating the file and its directory) or
    /// `postgres://…`, and brings the schema up to date.
    pub async fn connect(url: &str) -> anyhow::Result<SqlStore> {
        if url.starts_with("sqlite:") {
            Self::connect_sqlite(url).await
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Self::connect_postgres(url).await
        } else {
            anyhow::bail!("unsupported database url {url:?}: use sqlite://PATH or postgres://…")
        }
    }

    /// What [`bump_version!`] runs first: PostgreSQL's writers of reminders
    /// queue on a lock to their commit; SQLite's already hold the file's.
    fn version_lock_sql(&self) -> Option<&'static str> {
        match self.db {
            Db::Sqlite { .. } => None,
            Db::Postgres(_) => Some(REMINDER_VERSION_LOCK),
        }
    }

    /// The file of a SQLite url; `None` for PostgreSQL or an in-memory
    /// database.
    pub fn sqlite_file(url: &str) -> anyhow::Result<Option<std::path::PathBuf>> {
        if !url.starts_with("sqlite:") || url.contains(":memory:") {
            return Ok(None);
        }
        let opts = SqliteConnectOptions::from_str(url)
            .with_context(|| format!("parsing database url {url:?}"))?;
        Ok(Some(opts.get_filename().to_path_buf()))
    }

    async fn connect_sqlite(url: &str) -> anyhow::Result<SqlStore> {
        let in_memory = url.contains(":memory:");
        let opts = SqliteConnectOptions::from_str(url)
            .with_context(|| format!("parsing database url {url:?}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // In WAL mode NORMAL survives a process crash; only a power loss
            // can drop the last commits. Herald's message ids are
            // deterministic, so a lost `sending` mark is re-sent with the same
            // id and the gateway deduplicates it. FULL would fsync on every
            // commit for no delivery guarantee we need.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        if !in_memory {
            let path = opts.get_filename();
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating database directory {}", dir.display()))?;
            }
        }
        let single = || {
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                // An in-memory database lives only as long as its connection.
                .idle_timeout(None)
                .max_lifetime(None)
        };
        let write = single()
            .connect_with(opts.clone())
            .await
            .with_context(|| format!("opening {url}"))?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&write)
            .await
            .context("migrating the SQLite database")?;
        let read = if in_memory {
            write.clone()
        } else {
            // Two cores: a few readers cover the control port and the engine.
            SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(opts)
                .await
                .with_context(|| format!("opening {url}"))?
        };
        Ok(SqlStore {
            db: Db::Sqlite { write, read },
        })
    }

    async fn connect_postgres(url: &str) -> anyhow::Result<SqlStore> {
        let pool = PgPoolOptions::new()
            // Enough for the engine's batched writes plus the control port,
            // and small enough that several daemons can share a server.
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .context("connecting to PostgreSQL")?;
        sqlx::migrate!("./migrations/postgres")
            .run(&pool)
            .await
            .context("migrating the PostgreSQL database")?;
        Ok(SqlStore {
            db: Db::Postgres(pool),
        })
    }

    /// Closes the pools and waits for their connections to finish.
    pub async fn close(&self) {
        match &self.db {
            Db::Sqlite { write, read } => {
                read.close().await;
                write.close().await;
            }
            Db::Postgres(p) => p.close().await,
        }
    }
}

// ---------------------------------------------------------------- row mapping

const ACCOUNT_COLS: &str = "id, name, kind, state, state_reason, state_until, max_per_minute, \
                            group_concurrency, daily_cap, hourly_cap, timezone, created_at, \
                            incident_at, new_number";
const MEDIA_COLS: &str = "sha256, mime, size, filename, created_at";
const REMINDER_COLS: &str = "id, account_id, title, timezone, schedule_kind, schedule_expr, \
     window_start_hour, window_end_hour, resume_next_window, unique_texts, state, created_at, \
     updated_at, target_select";
const RUN_COLS: &str = "id, reminder_id, account_id, scheduled_for, window_end_at, status, \
                        forecast, error_summary, created_at, started_at, finished_at, \
                        stop_requested_at";
const TARGET_COLS: &str = "id, run_id, position, group_jid, status, parts_sent, message_id, \
                           attempts, error, sent_at, latency_ms, chosen_by";
const EVENT_COLS: &str = "id, at, kind, account_id, run_id, data";
/// A reminder's next version: one more than the highest, read inside the
/// writing transaction (see migration 0008) by [`bump_version!`].
const NEXT_VERSION: &str = "(SELECT COALESCE(MAX(version), 0) + 1 FROM reminders)";
/// Held from a reminder's version bump to its commit on PostgreSQL, so
/// versions follow commit order (any constant key of ours would do).
const REMINDER_VERSION_LOCK: &str = "SELECT pg_advisory_xact_lock(4801)";
/// What the scheduler reads of a reminder (`ReminderSchedule`), with its
/// newest run's occurrence from the firing lock's index.
const SCHEDULE_COLS: &str = "r.id, r.account_id, r.state, r.timezone, r.schedule_kind, \
     r.schedule_expr, r.window_start_hour, r.window_end_hour, \
     (r.target_select IS NOT NULL) AS selects, r.created_at, r.updated_at, r.version, \
     (SELECT MAX(x.scheduled_for) FROM runs x WHERE x.reminder_id = r.id) AS last_scheduled_for";
/// A reminder in a list, its parts and targets counted when it was written
/// (counting 50 reminders' 2,000 target rows per page cost PostgreSQL a
/// quarter of a second before their first vacuum).
const SUMMARY_COLS: &str = "r.id, r.state, r.account_id, r.title, r.timezone, r.schedule_kind, \
     r.schedule_expr, r.window_start_hour, r.window_end_hour, r.resume_next_window, \
     r.created_at, r.updated_at, r.part_count AS n_parts, r.target_count AS n_targets";
/// Runs retention may delete (alias `p`): finished, ended before `$1`, and
/// not their reminder's newest (the scheduler's cursor).
const PRUNABLE_RUN: &str = "p.status IN ('success', 'partial', 'failed', 'cancelled', 'missed') \
     AND COALESCE(p.finished_at, p.created_at) < $1 \
     AND p.scheduled_for < (SELECT MAX(n.scheduled_for) FROM runs n WHERE n.reminder_id = p.reminder_id)";
const UNFINISHED: &str = "('queued', 'running', 'paused', 'parked')";
/// Runs whose reminder may not change: they send what it said when they fired.
const EDIT_BLOCKING: &str = "('scheduled', 'queued', 'running', 'paused', 'parked')";

fn account_from<R: RowGet>(r: &R) -> StoreResult<Account> {
    Ok(Account {
        id: AccountId::parse(&r.text("id")?).map_err(|e| corrupt("account id", e))?,
        name: r.text("name")?,
        kind: parse_enum(r.text("kind")?, "gateway kind")?,
        state: parse_enum(r.text("state")?, "account state")?,
        state_reason: r.opt_text("state_reason")?,
        state_until: r.opt_ts("state_until")?,
        limits: AccountLimits {
            max_per_minute: opt_u32(r.opt_int("max_per_minute")?, "max_per_minute")?,
            group_concurrency: opt_u32(r.opt_int("group_concurrency")?, "group_concurrency")?,
            daily_cap: opt_u32(r.opt_int("daily_cap")?, "daily_cap")?,
            hourly_cap: opt_u32(r.opt_int("hourly_cap")?, "hourly_cap")?,
            timezone: r
                .opt_text("timezone")?
                .map(|t| TimeZone::parse(&t).map_err(|e| corrupt("account timezone", e)))
                .transpose()?,
            new_number: r.flag("new_number")?,
        },
        created_at: r.ts("created_at")?,
        incident_at: r.opt_ts("incident_at")?,
    })
}

fn media_from<R: RowGet>(r: &R) -> StoreResult<MediaInfo> {
    Ok(MediaInfo {
        id: MediaId::parse(&r.text("sha256")?).map_err(|e| corrupt("media id", e))?,
        mime: r.text("mime")?,
        size: u64::try_from(r.int("size")?).map_err(|e| corrupt("media size", e))?,
        filename: r.opt_text("filename")?,
        created_at: r.ts("created_at")?,
    })
}

fn part_from<R: RowGet>(r: &R) -> StoreResult<MessagePart> {
    match r.text("kind")?.as_str() {
        "text" => Ok(MessagePart::Text {
            text: r.opt_text("text")?.unwrap_or_default(),
        }),
        "media" => {
            let id = r.opt_text("media_id")?.unwrap_or_default();
            Ok(MessagePart::Media {
                media: MediaId::parse(&id).map_err(|e| corrupt("part media", e))?,
                caption: r.opt_text("caption")?,
            })
        }
        other => Err(corrupt("part kind", other)),
    }
}

fn target_jid_from<R: RowGet>(r: &R) -> StoreResult<GroupJid> {
    GroupJid::parse(&r.text("group_jid")?).map_err(|e| corrupt("group jid", e))
}

fn reminder_from<R: RowGet>(
    r: &R,
    parts: Vec<MessagePart>,
    targets: Vec<GroupJid>,
) -> StoreResult<Reminder> {
    let timezone = TimeZone::parse(&r.text("timezone")?).map_err(|e| corrupt("timezone", e))?;
    let schedule = Schedule::from_parts(&r.text("schedule_kind")?, &r.text("schedule_expr")?)
        .map_err(|e| corrupt("schedule", e))?;
    let window = WindowHours::parse(r.int("window_start_hour")?, r.int("window_end_hour")?)
        .map_err(|e| corrupt("window", e))?;
    Ok(Reminder {
        id: r.int("id")?,
        state: parse_enum(r.text("state")?, "reminder state")?,
        spec: NewReminder {
            account_id: AccountId::parse(&r.text("account_id")?)
                .map_err(|e| corrupt("account id", e))?,
            title: r.text("title")?,
            timezone,
            schedule,
            window,
            resume_next_window: r.flag("resume_next_window")?,
            parts,
            targets,
            select: r
                .opt_text("target_select")?
                .map(|s| serde_json::from_str(&s).map_err(|e| corrupt("target selector", e)))
                .transpose()?,
            unique_texts: r.flag("unique_texts")?,
        },
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

/// Timezone, schedule and window columns, shared by the reminder readers.
fn timing_from<R: RowGet>(r: &R) -> StoreResult<(TimeZone, Schedule, WindowHours)> {
    let timezone = TimeZone::parse(&r.text("timezone")?).map_err(|e| corrupt("timezone", e))?;
    let schedule = Schedule::from_parts(&r.text("schedule_kind")?, &r.text("schedule_expr")?)
        .map_err(|e| corrupt("schedule", e))?;
    let window = WindowHours::parse(r.int("window_start_hour")?, r.int("window_end_hour")?)
        .map_err(|e| corrupt("window", e))?;
    Ok((timezone, schedule, window))
}

fn schedule_from<R: RowGet>(r: &R) -> StoreResult<ReminderSchedule> {
    let (timezone, schedule, window) = timing_from(r)?;
    Ok(ReminderSchedule {
        id: r.int("id")?,
        account_id: AccountId::parse(&r.text("account_id")?)
            .map_err(|e| corrupt("account id", e))?,
        state: parse_enum(r.text("state")?, "reminder state")?,
        timezone,
        schedule,
        window,
        selects: r.flag("selects")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
        version: r.int("version")?,
        last_scheduled_for: r.opt_ts("last_scheduled_for")?,
    })
}

fn summary_from<R: RowGet>(r: &R) -> StoreResult<ReminderSummary> {
    let (timezone, schedule, window) = timing_from(r)?;
    Ok(ReminderSummary {
        id: r.int("id")?,
        state: parse_enum(r.text("state")?, "reminder state")?,
        account_id: AccountId::parse(&r.text("account_id")?)
            .map_err(|e| corrupt("account id", e))?,
        title: r.text("title")?,
        timezone,
        schedule,
        window,
        resume_next_window: r.flag("resume_next_window")?,
        parts: to_u32(r.int("n_parts")?, "part count")?,
        targets: to_u32(r.int("n_targets")?, "target count")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

/// `limit` as SQL's LIMIT: 0 means no limit.
fn sql_limit(limit: u32) -> i64 {
    if limit == 0 {
        i64::MAX
    } else {
        i64::from(limit)
    }
}

fn run_from<R: RowGet>(r: &R) -> StoreResult<Run> {
    let count = |c: &str| to_u32(r.int(c)?, "target count");
    Ok(Run {
        id: RunId(r.int("id")?),
        reminder_id: r.int("reminder_id")?,
        account_id: AccountId::parse(&r.text("account_id")?)
            .map_err(|e| corrupt("account id", e))?,
        scheduled_for: r.ts("scheduled_for")?,
        window_end_at: r.opt_ts("window_end_at")?,
        status: parse_enum(r.text("status")?, "run status")?,
        forecast: r.opt_text("forecast")?,
        error_summary: r.opt_text("error_summary")?,
        counts: TargetCounts {
            pending: count("n_pending")?,
            sending: count("n_sending")?,
            sent: count("n_sent")?,
            failed: count("n_failed")?,
            skipped: count("n_skipped")?,
        },
        created_at: r.ts("created_at")?,
        started_at: r.opt_ts("started_at")?,
        stop_requested_at: r.opt_ts("stop_requested_at")?,
        finished_at: r.opt_ts("finished_at")?,
    })
}

fn target_from<R: RowGet>(r: &R) -> StoreResult<RunTarget> {
    Ok(RunTarget {
        id: r.int("id")?,
        run_id: RunId(r.int("run_id")?),
        position: to_u32(r.int("position")?, "target position")?,
        group: target_jid_from(r)?,
        status: parse_enum(r.text("status")?, "target status")?,
        parts_sent: to_u32(r.int("parts_sent")?, "parts_sent")?,
        message_id: r.opt_text("message_id")?,
        attempts: to_u32(r.int("attempts")?, "attempts")?,
        error: r.opt_text("error")?,
        sent_at: r.opt_ts("sent_at")?,
        latency_ms: opt_u32(r.opt_int("latency_ms")?, "latency_ms")?,
        chosen_by: r.text("chosen_by")?,
    })
}

fn event_from<R: RowGet>(r: &R) -> StoreResult<Event> {
    let data = r.text("data")?;
    Ok(Event {
        id: r.int("id")?,
        at: r.ts("at")?,
        kind: r.text("kind")?,
        account_id: r.opt_text("account_id")?,
        run_id: r.opt_int("run_id")?,
        data: serde_json::from_str(&data).map_err(|e| corrupt("event data", e))?,
    })
}

/// Runs matching `filter` with their target counts, in one statement: the
/// page of runs first, then one grouped count over just those runs' targets
/// (served by the (run_id, status) index).
fn runs_sql(filter: &str, order: &str, limit: &str) -> String {
    format!(
        "WITH page AS (SELECT {RUN_COLS} FROM runs WHERE {filter} ORDER BY id {order} {limit}) \
         SELECT page.*, \
                COALESCE(c.n_pending, 0) AS n_pending, COALESCE(c.n_sending, 0) AS n_sending, \
                COALESCE(c.n_sent, 0) AS n_sent, COALESCE(c.n_failed, 0) AS n_failed, \
                COALESCE(c.n_skipped, 0) AS n_skipped \
         FROM page LEFT JOIN ( \
             SELECT run_id, \
                    COUNT(*) FILTER (WHERE status = 'pending') AS n_pending, \
                    COUNT(*) FILTER (WHERE status = 'sending') AS n_sending, \
                    COUNT(*) FILTER (WHERE status = 'sent') AS n_sent, \
                    COUNT(*) FILTER (WHERE status = 'failed') AS n_failed, \
                    COUNT(*) FILTER (WHERE status = 'skipped') AS n_skipped \
             FROM run_targets WHERE run_id IN (SELECT id FROM page) GROUP BY run_id \
         ) c ON c.run_id = page.id \
         ORDER BY page.id {order}"
    )
}

/// Reminders' parts and targets, by reminder id.
type Children = (HashMap<i64, Vec<MessagePart>>, HashMap<i64, Vec<GroupJid>>);

/// Collects part and target rows (ordered by reminder, position) per reminder.
fn group_children<R: RowGet>(parts: &[R], targets: &[R]) -> StoreResult<Children> {
    let mut p: HashMap<i64, Vec<MessagePart>> = HashMap::new();
    for r in parts {
        p.entry(r.int("reminder_id")?)
            .or_default()
            .push(part_from(r)?);
    }
    let mut t: HashMap<i64, Vec<GroupJid>> = HashMap::new();
    for r in targets {
        t.entry(r.int("reminder_id")?)
            .or_default()
            .push(target_jid_from(r)?);
    }
    Ok((p, t))
}

/// Checks, inside the writing transaction, what a reminder refers to.
macro_rules! validate_refs {
    ($tx:ident, $r:expr) => {{
        let r: &NewReminder = $r;
        let account = sqlx::query("SELECT 1 FROM accounts WHERE id = $1")
            .bind(r.account_id.as_str())
            .fetch_optional(&mut *$tx)
            .await
            .map_err(be)?;
        if account.is_none() {
            return Err(ValidationError::new(
                "account_id",
                format!("account {} does not exist", r.account_id),
            )
            .into());
        }
        for (i, part) in r.parts.iter().enumerate() {
            if let Some(m) = part.media_id() {
                let found = sqlx::query("SELECT 1 FROM media WHERE sha256 = $1")
                    .bind(m.as_str())
                    .fetch_optional(&mut *$tx)
                    .await
                    .map_err(be)?;
                if found.is_none() {
                    return Err(ValidationError::new(
                        format!("parts[{i}].media"),
                        format!("media {m} does not exist; upload it first"),
                    )
                    .into());
                }
            }
        }
    }};
}

/// Writes a reminder's parts and targets (positions from 0).
macro_rules! insert_children {
    ($tx:ident, $id:expr, $r:expr) => {{
        let (id, r): (i64, &NewReminder) = ($id, $r);
        for (i, part) in r.parts.iter().enumerate() {
            let (kind, text, media, caption) = match part {
                MessagePart::Text { text } => ("text", Some(text.as_str()), None, None),
                MessagePart::Media { media, caption } => {
                    ("media", None, Some(media.as_str()), caption.as_deref())
                }
            };
            sqlx::query(
                "INSERT INTO reminder_parts (reminder_id, position, kind, text, media_id, caption) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(id)
            .bind(i as i64)
            .bind(kind)
            .bind(text)
            .bind(media)
            .bind(caption)
            .execute(&mut *$tx)
            .await
            .map_err(be)?;
        }
        Bulk::insert_reminder_targets(&mut *$tx, id, &r.targets).await?;
    }};
}

// ---------------------------------------------------------------- dialects

/// Bulk statements, where the two dialects part ways for speed: both send
/// a whole batch in a few statements, PostgreSQL as arrays it unnests,
/// SQLite as a JSON array it walks with `json_each` (a statement per row
/// would cost a hop to sqlx's SQLite worker thread each).
trait Bulk {
    async fn insert_reminder_targets(&mut self, reminder: i64, t: &[GroupJid]) -> StoreResult<()>;
    async fn insert_run_targets(
        &mut self,
        run: i64,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()>;
    /// Applies transitions that each name a different target; NotFound if
    /// one names no target.
    async fn apply_distinct(&mut self, ts: &ByKind<'_>) -> StoreResult<()>;
    /// Inserts the runs whose occurrence is free, in one statement; returns
    /// (id, reminder, scheduled_for) of those it inserted. NotFound if one
    /// names an unknown reminder (the transaction is then unusable).
    async fn insert_runs(&mut self, runs: &[NewRun], now: DateTime<Utc>) -> StoreResult<Inserted>;
    /// The runs at these occurrences, with their counts, in any order.
    async fn runs_at(&mut self, keys: &[Occurrence]) -> StoreResult<Vec<Run>>;
    /// One of `ids` that names no reminder.
    async fn missing_reminder(&mut self, ids: &[i64]) -> StoreResult<Option<i64>>;
    /// Inserts events in order; their ids, ascending.
    async fn insert_events(&mut self, events: &[EventRow<'_>]) -> StoreResult<Vec<i64>>;
}

/// (reminder, scheduled_for): a run's firing lock.
type Occurrence = (i64, DateTime<Utc>);

/// What `insert_runs` inserted: id by occurrence.
type Inserted = HashMap<Occurrence, i64>;

/// An event as stored: instant truncated, data serialized.
struct EventRow<'a> {
    at: DateTime<Utc>,
    kind: &'a str,
    account_id: Option<&'a str>,
    run_id: Option<i64>,
    data: String,
}

impl<'a> EventRow<'a> {
    fn of(e: &'a NewEvent) -> StoreResult<Self> {
        Ok(Self {
            at: trunc(e.at),
            kind: e.kind,
            account_id: e.account_id.as_ref().map(AccountId::as_str),
            run_id: e.run_id.map(|r| r.0),
            data: serde_json::to_string(&e.data).map_err(|e| StoreError::Backend(e.to_string()))?,
        })
    }

    fn stored(&self, id: i64, e: &NewEvent) -> Event {
        Event {
            id,
            at: self.at,
            kind: self.kind.to_owned(),
            account_id: self.account_id.map(str::to_owned),
            run_id: self.run_id,
            data: e.data.clone(),
        }
    }
}

/// The run `create_run` would read back right after inserting it.
fn fresh_run(id: i64, r: &NewRun, now: DateTime<Utc>) -> Run {
    Run {
        id: RunId(id),
        reminder_id: r.reminder_id,
        account_id: r.account_id.clone(),
        scheduled_for: r.scheduled_for,
        window_end_at: None,
        status: r.status,
        forecast: None,
        error_summary: r.error_summary.clone(),
        counts: TargetCounts::default(),
        created_at: now,
        started_at: None,
        finished_at: None,
        stop_requested_at: None,
    }
}

fn fk_to_not_found(e: sqlx::Error) -> StoreError {
    if is_fk_violation(&e) {
        not_found("reminder")
    } else {
        be(e)
    }
}

fn inserted_from<R: RowGet>(rows: &[R]) -> StoreResult<Inserted> {
    rows.iter()
        .map(|r| {
            Ok((
                (r.int("reminder_id")?, r.ts("scheduled_for")?),
                r.int("id")?,
            ))
        })
        .collect()
}

/// Applies a batch in order. Grouping by kind reorders the batch, which is
/// only harmless while each target appears once, so the batch is cut into
/// stretches of distinct targets (usually the whole batch) applied in turn.
async fn apply_batch<C: Bulk>(conn: &mut C, ts: &[Transition]) -> StoreResult<()> {
    let mut start = 0;
    while start < ts.len() {
        let mut seen = HashSet::new();
        let mut end = start;
        while end < ts.len() && seen.insert(ts[end].target_id()) {
            end += 1;
        }
        conn.apply_distinct(&ByKind::of(&ts[start..end])).await?;
        start = end;
    }
    Ok(())
}

/// A stretch of transitions sorted by what they do to a target row.
#[derive(Default)]
struct ByKind<'a> {
    /// (target, message id)
    sending: Vec<(i64, &'a str)>,
    /// (target, parts_sent, status, sent_at, latency_ms)
    sent: Vec<(i64, i64, &'static str, DateTime<Utc>, i64)>,
    /// (target, final status, error)
    ended: Vec<(i64, &'static str, &'a str)>,
    requeued: Vec<i64>,
}

impl<'a> ByKind<'a> {
    fn of(ts: &'a [Transition]) -> Self {
        let mut k = Self::default();
        for t in ts {
            match t {
                Transition::Sending {
                    target_id,
                    message_id,
                    ..
                } => k.sending.push((*target_id, message_id)),
                Transition::Sent {
                    target_id,
                    part,
                    last,
                    at,
                    latency_ms,
                } => {
                    let status = if *last {
                        TargetStatus::Sent
                    } else {
                        TargetStatus::Pending
                    };
                    k.sent.push((
                        *target_id,
                        i64::from(*part) + 1,
                        status.as_str(),
                        *at,
                        i64::from(*latency_ms),
                    ));
                }
                Transition::Failed { target_id, error } => {
                    k.ended
                        .push((*target_id, TargetStatus::Failed.as_str(), error))
                }
                Transition::Skipped { target_id, reason } => {
                    k.ended
                        .push((*target_id, TargetStatus::Skipped.as_str(), reason))
                }
                Transition::Requeue { target_id } => k.requeued.push(*target_id),
            }
        }
        k
    }
}

fn json(v: serde_json::Value) -> String {
    v.to_string()
}

/// A reminder's selector as stored (NULL: explicit JIDs only).
fn select_json(r: &NewReminder) -> Option<String> {
    r.select
        .as_ref()
        .map(|s| serde_json::to_string(s).expect("a selector serialises"))
}

fn jids_json(groups: &[GroupJid]) -> String {
    json(serde_json::Value::Array(
        groups.iter().map(|g| g.as_str().into()).collect(),
    ))
}

impl Bulk for SqliteConnection {
    async fn insert_reminder_targets(&mut self, reminder: i64, t: &[GroupJid]) -> StoreResult<()> {
        // `WHERE true` settles SQLite's parse of INSERT … SELECT … ON CONFLICT.
        sqlx::query(
            "INSERT INTO reminder_targets (reminder_id, position, group_jid) \
             SELECT $1, j.key, j.value FROM json_each($2) AS j WHERE true",
        )
        .bind(reminder)
        .bind(jids_json(t))
        .execute(&mut *self)
        .await
        .map_err(be)?;
        Ok(())
    }

    async fn insert_run_targets(
        &mut self,
        run: i64,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        let rows = json(serde_json::Value::Array(
            groups
                .iter()
                .map(|(g, how)| serde_json::json!([g.as_str(), how]))
                .collect(),
        ));
        sqlx::query(
            "INSERT INTO run_targets (run_id, position, group_jid, status, chosen_by) \
             SELECT $1, j.key, j.value ->> 0, 'pending', j.value ->> 1 FROM json_each($2) AS j \
             WHERE true ON CONFLICT (run_id, position) DO NOTHING",
        )
        .bind(run)
        .bind(rows)
        .execute(&mut *self)
        .await
        .map_err(be)?;
        Ok(())
    }

    async fn apply_distinct(&mut self, k: &ByKind<'_>) -> StoreResult<()> {
        use serde_json::json as j;
        let mut steps: Vec<(&str, serde_json::Value, Vec<i64>)> = Vec::new();
        if !k.sending.is_empty() {
            steps.push((
                "UPDATE run_targets SET status = 'sending', message_id = j.value ->> 1, \
                 attempts = attempts + 1 \
                 FROM json_each($1) AS j WHERE run_targets.id = j.value ->> 0 \
                 AND run_targets.status IN ('pending', 'sending')",
                k.sending.iter().map(|(id, m)| j!([id, m])).collect(),
                k.sending.iter().map(|r| r.0).collect(),
            ));
        }
        if !k.sent.is_empty() {
            steps.push((
                "UPDATE run_targets SET parts_sent = j.value ->> 1, status = j.value ->> 2, \
                 sent_at = j.value ->> 3, latency_ms = j.value ->> 4 \
                 FROM json_each($1) AS j WHERE run_targets.id = j.value ->> 0 \
                 AND run_targets.status = 'sending'",
                k.sent
                    .iter()
                    .map(|(id, n, st, at, lat)| j!([id, n, st, at.timestamp_micros(), lat]))
                    .collect(),
                k.sent.iter().map(|r| r.0).collect(),
            ));
        }
        if !k.ended.is_empty() {
            steps.push((
                "UPDATE run_targets SET status = j.value ->> 1, error = j.value ->> 2 \
                 FROM json_each($1) AS j WHERE run_targets.id = j.value ->> 0 \
                 AND run_targets.status IN ('pending', 'sending')",
                k.ended.iter().map(|(id, st, e)| j!([id, st, e])).collect(),
                k.ended.iter().map(|r| r.0).collect(),
            ));
        }
        if !k.requeued.is_empty() {
            steps.push((
                "UPDATE run_targets SET status = 'pending', error = NULL \
                 WHERE id IN (SELECT value FROM json_each($1)) \
                 AND status IN ('failed', 'skipped')",
                k.requeued.iter().map(|id| j!(id)).collect(),
                k.requeued.clone(),
            ));
        }
        for (sql, rows, ids) in steps {
            let n = sqlx::query(sql)
                .bind(json(rows))
                .execute(&mut *self)
                .await
                .map_err(be)?
                .rows_affected();
            if n != ids.len() as u64 {
                let missing: Option<i64> = sqlx::query_scalar(
                    "SELECT j.value FROM json_each($1) AS j \
                     WHERE NOT EXISTS (SELECT 1 FROM run_targets t WHERE t.id = j.value) LIMIT 1",
                )
                .bind(json(ids.into()))
                .fetch_optional(&mut *self)
                .await
                .map_err(be)?;
                // Every row exists: the others were skipped by their status guard.
                if let Some(id) = missing {
                    return Err(missing_target(Some(id)));
                }
            }
        }
        Ok(())
    }

    async fn insert_runs(&mut self, runs: &[NewRun], now: DateTime<Utc>) -> StoreResult<Inserted> {
        use serde_json::json as j;
        let rows: Vec<_> = runs
            .iter()
            .map(|r| {
                j!([
                    r.reminder_id,
                    r.account_id.as_str(),
                    r.scheduled_for.timestamp_micros(),
                    r.status.as_str(),
                    r.error_summary
                ])
            })
            .collect();
        let rows = sqlx::query(
            "INSERT INTO runs (reminder_id, account_id, scheduled_for, status, error_summary, \
             created_at) \
             SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4, $2 \
             FROM json_each($1) AS j WHERE true ORDER BY j.key \
             ON CONFLICT (reminder_id, scheduled_for) DO NOTHING \
             RETURNING id, reminder_id, scheduled_for",
        )
        .bind(json(rows.into()))
        .bind(Ts(now))
        .fetch_all(&mut *self)
        .await
        .map_err(fk_to_not_found)?;
        inserted_from(&rows)
    }

    async fn runs_at(&mut self, keys: &[Occurrence]) -> StoreResult<Vec<Run>> {
        let sql = runs_sql(
            "id IN (SELECT r.id FROM json_each($1) AS j JOIN runs AS r \
             ON r.reminder_id = j.value ->> 0 AND r.scheduled_for = j.value ->> 1)",
            "ASC",
            "",
        );
        let keys: Vec<_> = keys
            .iter()
            .map(|(r, at)| serde_json::json!([r, at.timestamp_micros()]))
            .collect();
        sqlx::query(&sql)
            .bind(json(keys.into()))
            .fetch_all(&mut *self)
            .await
            .map_err(be)?
            .iter()
            .map(run_from)
            .collect()
    }

    async fn missing_reminder(&mut self, ids: &[i64]) -> StoreResult<Option<i64>> {
        sqlx::query_scalar(
            "SELECT j.value FROM json_each($1) AS j \
             WHERE NOT EXISTS (SELECT 1 FROM reminders r WHERE r.id = j.value) LIMIT 1",
        )
        .bind(json(ids.into()))
        .fetch_optional(&mut *self)
        .await
        .map_err(be)
    }

    async fn insert_events(&mut self, events: &[EventRow<'_>]) -> StoreResult<Vec<i64>> {
        use serde_json::json as j;
        let rows: Vec<_> = events
            .iter()
            .map(|e| {
                j!([
                    e.at.timestamp_micros(),
                    e.kind,
                    e.account_id,
                    e.run_id,
                    e.data
                ])
            })
            .collect();
        // AUTOINCREMENT numbers rows in the order the SELECT yields them;
        // RETURNING's own order is unspecified, so sort.
        let mut ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO events (at, kind, account_id, run_id, data) \
             SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4 \
             FROM json_each($1) AS j ORDER BY j.key RETURNING id",
        )
        .bind(json(rows.into()))
        .fetch_all(&mut *self)
        .await
        .map_err(be)?;
        ids.sort_unstable();
        Ok(ids)
    }
}

fn missing_target(id: Option<i64>) -> StoreError {
    not_found(match id {
        Some(id) => format!("run target {id}"),
        None => "run target".to_owned(),
    })
}

impl Bulk for PgConnection {
    async fn insert_reminder_targets(&mut self, reminder: i64, t: &[GroupJid]) -> StoreResult<()> {
        let pos: Vec<i64> = (0..t.len() as i64).collect();
        let jids: Vec<&str> = t.iter().map(GroupJid::as_str).collect();
        sqlx::query(
            "INSERT INTO reminder_targets (reminder_id, position, group_jid) \
             SELECT $1, u.pos, u.jid FROM UNNEST($2::bigint[], $3::text[]) AS u(pos, jid)",
        )
        .bind(reminder)
        .bind(pos)
        .bind(jids)
        .execute(&mut *self)
        .await
        .map_err(be)?;
        Ok(())
    }

    async fn insert_run_targets(
        &mut self,
        run: i64,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        let pos: Vec<i64> = (0..groups.len() as i64).collect();
        let jids: Vec<&str> = groups.iter().map(|(g, _)| g.as_str()).collect();
        let how: Vec<&str> = groups.iter().map(|(_, h)| h.as_str()).collect();
        sqlx::query(
            "INSERT INTO run_targets (run_id, position, group_jid, status, chosen_by) \
             SELECT $1, u.pos, u.jid, 'pending', u.how \
             FROM UNNEST($2::bigint[], $3::text[], $4::text[]) AS u(pos, jid, how) \
             ON CONFLICT (run_id, position) DO NOTHING",
        )
        .bind(run)
        .bind(pos)
        .bind(jids)
        .bind(how)
        .execute(&mut *self)
        .await
        .map_err(be)?;
        Ok(())
    }

    async fn apply_distinct(&mut self, k: &ByKind<'_>) -> StoreResult<()> {
        if !k.sending.is_empty() {
            let (ids, mids): (Vec<i64>, Vec<&str>) = k.sending.iter().copied().unzip();
            let n = sqlx::query(
                "UPDATE run_targets AS t SET status = 'sending', message_id = u.mid, \
                 attempts = t.attempts + 1 \
                 FROM UNNEST($1::bigint[], $2::text[]) AS u(id, mid) WHERE t.id = u.id \
                 AND t.status IN ('pending', 'sending')",
            )
            .bind(&ids)
            .bind(&mids)
            .execute(&mut *self)
            .await
            .map_err(be)?
            .rows_affected();
            pg_all_found(self, n, &ids).await?;
        }
        if !k.sent.is_empty() {
            let ids: Vec<i64> = k.sent.iter().map(|r| r.0).collect();
            let n = sqlx::query(
                "UPDATE run_targets AS t SET parts_sent = u.parts_sent, status = u.status, \
                 sent_at = u.at, latency_ms = u.lat \
                 FROM UNNEST($1::bigint[], $2::bigint[], $3::text[], $4::timestamptz[], \
                             $5::bigint[]) AS u(id, parts_sent, status, at, lat) \
                 WHERE t.id = u.id AND t.status = 'sending'",
            )
            .bind(&ids)
            .bind(k.sent.iter().map(|r| r.1).collect::<Vec<i64>>())
            .bind(k.sent.iter().map(|r| r.2).collect::<Vec<&str>>())
            .bind(k.sent.iter().map(|r| r.3).collect::<Vec<DateTime<Utc>>>())
            .bind(k.sent.iter().map(|r| r.4).collect::<Vec<i64>>())
            .execute(&mut *self)
            .await
            .map_err(be)?
            .rows_affected();
            pg_all_found(self, n, &ids).await?;
        }
        if !k.ended.is_empty() {
            let ids: Vec<i64> = k.ended.iter().map(|r| r.0).collect();
            let n = sqlx::query(
                "UPDATE run_targets AS t SET status = u.status, error = u.error \
                 FROM UNNEST($1::bigint[], $2::text[], $3::text[]) AS u(id, status, error) \
                 WHERE t.id = u.id AND t.status IN ('pending', 'sending')",
            )
            .bind(&ids)
            .bind(k.ended.iter().map(|r| r.1).collect::<Vec<&str>>())
            .bind(k.ended.iter().map(|r| r.2).collect::<Vec<&str>>())
            .execute(&mut *self)
            .await
            .map_err(be)?
            .rows_affected();
            pg_all_found(self, n, &ids).await?;
        }
        if !k.requeued.is_empty() {
            let n = sqlx::query(
                "UPDATE run_targets SET status = 'pending', error = NULL \
                 WHERE id = ANY($1::bigint[]) AND status IN ('failed', 'skipped')",
            )
            .bind(&k.requeued)
            .execute(&mut *self)
            .await
            .map_err(be)?
            .rows_affected();
            pg_all_found(self, n, &k.requeued).await?;
        }
        Ok(())
    }

    async fn insert_runs(&mut self, runs: &[NewRun], now: DateTime<Utc>) -> StoreResult<Inserted> {
        // Occurrence order, not input order: two batches that overlap then
        // take the occurrences' index entries in the same order, so one
        // waits for the other instead of deadlocking.
        let rows = sqlx::query(
            "INSERT INTO runs (reminder_id, account_id, scheduled_for, status, error_summary, \
             created_at) \
             SELECT u.rid, u.acc, u.at, u.status, u.err, $6 \
             FROM UNNEST($1::bigint[], $2::text[], $3::timestamptz[], $4::text[], $5::text[]) \
                  AS u(rid, acc, at, status, err) \
             ORDER BY u.rid, u.at \
             ON CONFLICT (reminder_id, scheduled_for) DO NOTHING \
             RETURNING id, reminder_id, scheduled_for",
        )
        .bind(runs.iter().map(|r| r.reminder_id).collect::<Vec<i64>>())
        .bind(
            runs.iter()
                .map(|r| r.account_id.as_str())
                .collect::<Vec<&str>>(),
        )
        .bind(
            runs.iter()
                .map(|r| r.scheduled_for)
                .collect::<Vec<DateTime<Utc>>>(),
        )
        .bind(
            runs.iter()
                .map(|r| r.status.as_str())
                .collect::<Vec<&str>>(),
        )
        .bind(
            runs.iter()
                .map(|r| r.error_summary.as_deref())
                .collect::<Vec<Option<&str>>>(),
        )
        .bind(now)
        .fetch_all(&mut *self)
        .await
        .map_err(fk_to_not_found)?;
        inserted_from(&rows)
    }

    async fn runs_at(&mut self, keys: &[Occurrence]) -> StoreResult<Vec<Run>> {
        let sql = runs_sql(
            "id IN (SELECT r.id FROM UNNEST($1::bigint[], $2::timestamptz[]) AS u(rid, at) \
             JOIN runs AS r ON r.reminder_id = u.rid AND r.scheduled_for = u.at)",
            "ASC",
            "",
        );
        sqlx::query(&sql)
            .bind(keys.iter().map(|k| k.0).collect::<Vec<i64>>())
            .bind(keys.iter().map(|k| k.1).collect::<Vec<DateTime<Utc>>>())
            .fetch_all(&mut *self)
            .await
            .map_err(be)?
            .iter()
            .map(run_from)
            .collect()
    }

    async fn missing_reminder(&mut self, ids: &[i64]) -> StoreResult<Option<i64>> {
        sqlx::query_scalar(
            "SELECT u.id FROM UNNEST($1::bigint[]) AS u(id) \
             WHERE NOT EXISTS (SELECT 1 FROM reminders r WHERE r.id = u.id) LIMIT 1",
        )
        .bind(ids)
        .fetch_optional(&mut *self)
        .await
        .map_err(be)
    }

    async fn insert_events(&mut self, events: &[EventRow<'_>]) -> StoreResult<Vec<i64>> {
        // Identity values are drawn in the order rows are inserted, which
        // follows ORDER BY; sort rather than trust RETURNING's order.
        let mut ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO events (at, kind, account_id, run_id, data) \
             SELECT u.at, u.kind, u.acc, u.run, u.data \
             FROM UNNEST($1::timestamptz[], $2::text[], $3::text[], $4::bigint[], $5::text[]) \
                  WITH ORDINALITY AS u(at, kind, acc, run, data, n) \
             ORDER BY u.n RETURNING id",
        )
        .bind(events.iter().map(|e| e.at).collect::<Vec<DateTime<Utc>>>())
        .bind(events.iter().map(|e| e.kind).collect::<Vec<&str>>())
        .bind(
            events
                .iter()
                .map(|e| e.account_id)
                .collect::<Vec<Option<&str>>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.run_id)
                .collect::<Vec<Option<i64>>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.data.as_str())
                .collect::<Vec<&str>>(),
        )
        .fetch_all(&mut *self)
        .await
        .map_err(be)?;
        ids.sort_unstable();
        Ok(ids)
    }
}

/// An UPDATE … FROM UNNEST touches only the ids that exist; name one that
/// does not, so the caller sees which target was unknown.
async fn pg_all_found(conn: &mut PgConnection, updated: u64, ids: &[i64]) -> StoreResult<()> {
    if updated == ids.len() as u64 {
        return Ok(());
    }
    let missing: Option<i64> = sqlx::query_scalar(
        "SELECT u.id FROM UNNEST($1::bigint[]) AS u(id) \
         WHERE NOT EXISTS (SELECT 1 FROM run_targets t WHERE t.id = u.id) LIMIT 1",
    )
    .bind(ids)
    .fetch_optional(&mut *conn)
    .await
    .map_err(be)?;
    // Every row exists: the others were skipped by their status guard.
    missing.map_or(Ok(()), |id| Err(missing_target(Some(id))))
}

// ---------------------------------------------------------------- the store

#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> &'static str {
        match self.db {
            Db::Sqlite { .. } => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }

    async fn ping(&self) -> StoreResult<()> {
        read!(self, p => sqlx::query("SELECT 1").execute(p).await.map_err(be).map(drop))?;
        Ok(())
    }

    // ------------------------------------------------------------ accounts

    async fn create_account(&self, a: &NewAccount, now: DateTime<Utc>) -> StoreResult<Account> {
        let now = trunc(now);
        let n = writer!(self, p => sqlx::query(
            "INSERT INTO accounts (id, name, kind, state, state_reason, max_per_minute, \
             group_concurrency, daily_cap, created_at, hourly_cap, timezone, new_number) \
             VALUES ($1, $2, $3, $4, NULL, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(a.id.as_str())
        .bind(&a.name)
        .bind(a.kind.as_str())
        .bind(a.state.as_str())
        .bind(a.limits.max_per_minute.map(i64::from))
        .bind(a.limits.group_concurrency.map(i64::from))
        .bind(a.limits.daily_cap.map(i64::from))
        .bind(Ts(now))
        .bind(a.limits.hourly_cap.map(i64::from))
        .bind(a.limits.timezone.as_ref().map(|t| t.name().to_owned()))
        .bind(a.limits.new_number)
        .execute(p)
        .await
        .map_err(be)?
        .rows_affected());
        if n == 0 {
            return Err(StoreError::Conflict(format!(
                "account {} already exists",
                a.id
            )));
        }
        Ok(Account {
            id: a.id.clone(),
            name: a.name.clone(),
            kind: a.kind,
            state: a.state,
            state_reason: None,
            state_until: None,
            limits: a.limits.clone(),
            created_at: now,
            incident_at: None,
        })
    }

    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        let sql = format!("SELECT {ACCOUNT_COLS} FROM accounts WHERE id = $1");
        read!(self, p => sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(account_from)
            .transpose())
    }

    async fn list_accounts(&self) -> StoreResult<Vec<Account>> {
        let sql = format!("SELECT {ACCOUNT_COLS} FROM accounts ORDER BY id");
        read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(account_from)
            .collect())
    }

    async fn list_accounts_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<Account>> {
        let sql = format!("SELECT {ACCOUNT_COLS} FROM accounts WHERE id > $1 ORDER BY id LIMIT $2");
        // Every id sorts after the empty string.
        let after = after.unwrap_or("");
        read!(self, p => sqlx::query(&sql)
            .bind(after)
            .bind(sql_limit(limit))
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(account_from)
            .collect())
    }

    async fn update_account_limits(
        &self,
        id: &AccountId,
        limits: &AccountLimits,
    ) -> StoreResult<Account> {
        let sql = format!(
            "UPDATE accounts SET max_per_minute = $2, group_concurrency = $3, daily_cap = $4, \
             hourly_cap = $5, timezone = $6, new_number = $7 WHERE id = $1 \
             RETURNING {ACCOUNT_COLS}"
        );
        writer!(self, p => sqlx::query(&sql)
            .bind(id.as_str())
            .bind(limits.max_per_minute.map(i64::from))
            .bind(limits.group_concurrency.map(i64::from))
            .bind(limits.daily_cap.map(i64::from))
            .bind(limits.hourly_cap.map(i64::from))
            .bind(limits.timezone.as_ref().map(|t| t.name().to_owned()))
            .bind(limits.new_number)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(account_from)
            .transpose())?
        .ok_or_else(|| not_found(format!("account {id}")))
    }

    async fn set_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
    ) -> StoreResult<Account> {
        self.set_account_state_until(id, state, reason, None).await
    }

    async fn set_account_state_until(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
    ) -> StoreResult<Account> {
        let sql = format!(
            "UPDATE accounts SET state = $2, state_reason = $3, state_until = $4 WHERE id = $1 \
             RETURNING {ACCOUNT_COLS}"
        );
        writer!(self, p => sqlx::query(&sql)
            .bind(id.as_str())
            .bind(state.as_str())
            .bind(reason)
            .bind(until.map(|t| Ts(trunc(t))))
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(account_from)
            .transpose())?
        .ok_or_else(|| not_found(format!("account {id}")))
    }

    async fn record_incident(&self, id: &AccountId, at: DateTime<Utc>) -> StoreResult<()> {
        let n = writer!(self, p => sqlx::query("UPDATE accounts SET incident_at = $2 WHERE id = $1")
            .bind(id.as_str())
            .bind(Ts(trunc(at)))
            .execute(p)
            .await
            .map_err(be)?
            .rows_affected());
        if n == 0 {
            return Err(not_found(format!("account {id}")));
        }
        Ok(())
    }

    async fn delete_account(&self, id: &AccountId) -> StoreResult<()> {
        tx!(self, tx => {
            let live = sqlx::query(
                "SELECT id FROM reminders WHERE account_id = $1 AND state <> 'archived' LIMIT 1",
            )
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            if let Some(r) = live {
                return Err(StoreError::Conflict(format!(
                    "account {id} still has reminders that are not archived (reminder {})",
                    r.int("id")?
                )));
            }
            // Archived reminders, their runs and the upload cache cascade.
            let n = sqlx::query("DELETE FROM accounts WHERE id = $1")
                .bind(id.as_str())
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if n == 0 {
                return Err(not_found(format!("account {id}")));
            }
        });
        Ok(())
    }

    // ------------------------------------------------------------ media

    async fn put_media(&self, m: &MediaInfo) -> StoreResult<MediaInfo> {
        let sql = format!("SELECT {MEDIA_COLS} FROM media WHERE sha256 = $1");
        let stored = tx!(self, tx => {
            sqlx::query(
                "INSERT INTO media (sha256, mime, size, filename, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (sha256) DO NOTHING",
            )
            .bind(m.id.as_str())
            .bind(&m.mime)
            .bind(i64::try_from(m.size).map_err(|_| {
                StoreError::Invalid(ValidationError::new("size", "is too large"))
            })?)
            .bind(m.filename.as_deref())
            .bind(Ts(m.created_at))
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            let row = sqlx::query(&sql)
                .bind(m.id.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(be)?;
            media_from(&row)?
        });
        Ok(stored)
    }

    async fn get_media(&self, id: &MediaId) -> StoreResult<Option<MediaInfo>> {
        let sql = format!("SELECT {MEDIA_COLS} FROM media WHERE sha256 = $1");
        read!(self, p => sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(media_from)
            .transpose())
    }

    async fn get_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
    ) -> StoreResult<Option<UploadHandle>> {
        read!(self, p => {
            let row = sqlx::query(
                "SELECT handle, expires_at FROM media_uploads WHERE account_id = $1 AND media_id = $2",
            )
            .bind(account.as_str())
            .bind(media.as_str())
            .fetch_optional(p)
            .await
            .map_err(be)?;
            match row {
                Some(r) => Ok(Some(UploadHandle {
                    handle: r.text("handle")?,
                    expires_at: r.ts("expires_at")?,
                })),
                None => Ok(None),
            }
        })
    }

    async fn put_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
        h: &UploadHandle,
    ) -> StoreResult<()> {
        writer!(self, p => sqlx::query(
            "INSERT INTO media_uploads (account_id, media_id, handle, expires_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (account_id, media_id) \
             DO UPDATE SET handle = excluded.handle, expires_at = excluded.expires_at",
        )
        .bind(account.as_str())
        .bind(media.as_str())
        .bind(&h.handle)
        .bind(Ts(h.expires_at))
        .execute(p)
        .await
        .map(drop)
        .map_err(|e| {
            if is_fk_violation(&e) {
                not_found(format!("account {account} or media {media}"))
            } else {
                be(e)
            }
        }))?;
        Ok(())
    }

    // ------------------------------------------------------------ reminders

    async fn create_reminder(&self, r: &NewReminder, now: DateTime<Utc>) -> StoreResult<Reminder> {
        let now = trunc(now);
        let id = tx!(self, tx => {
            validate_refs!(tx, r);
            let row = sqlx::query(
                "INSERT INTO reminders (account_id, title, timezone, schedule_kind, schedule_expr, \
                 window_start_hour, window_end_hour, resume_next_window, state, created_at, updated_at, \
                 unique_texts, target_select, part_count, target_count) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11, $12, $13, $14) \
                 RETURNING id",
            )
            .bind(r.account_id.as_str())
            .bind(&r.title)
            .bind(r.timezone.name())
            .bind(r.schedule.kind())
            .bind(r.schedule.expr())
            .bind(i64::from(r.window.start_hour()))
            .bind(i64::from(r.window.end_hour()))
            .bind(r.resume_next_window)
            .bind(ReminderState::Active.as_str())
            .bind(Ts(now))
            .bind(r.unique_texts)
            .bind(select_json(r))
            .bind(r.parts.len() as i64)
            .bind(r.targets.len() as i64)
            .fetch_one(&mut *tx)
            .await
            .map_err(be)?;
            let id = row.int("id")?;
            insert_children!(tx, id, r);
            bump_version!(tx, self.version_lock_sql(), id);
            id
        });
        Ok(Reminder {
            id,
            state: ReminderState::Active,
            spec: r.clone(),
            created_at: now,
            updated_at: now,
        })
    }

    async fn get_reminder(&self, id: i64) -> StoreResult<Option<Reminder>> {
        let sql = format!("SELECT {REMINDER_COLS} FROM reminders WHERE id = $1");
        read!(self, p => {
            let Some(row) = sqlx::query(&sql)
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(be)?
            else {
                return Ok(None);
            };
            let parts = sqlx::query(
                "SELECT reminder_id, kind, text, media_id, caption FROM reminder_parts \
                 WHERE reminder_id = $1 ORDER BY position",
            )
            .bind(id)
            .fetch_all(p)
            .await
            .map_err(be)?;
            let targets = sqlx::query(
                "SELECT reminder_id, group_jid FROM reminder_targets \
                 WHERE reminder_id = $1 ORDER BY position",
            )
            .bind(id)
            .fetch_all(p)
            .await
            .map_err(be)?;
            let (mut parts, mut targets) = group_children(&parts, &targets)?;
            reminder_from(
                &row,
                parts.remove(&id).unwrap_or_default(),
                targets.remove(&id).unwrap_or_default(),
            )
            .map(Some)
        })
    }

    async fn list_reminders(&self, f: &ReminderFilter) -> StoreResult<Vec<Reminder>> {
        let mut filter = vec!["TRUE".to_owned()];
        if f.account_id.is_some() {
            filter.push(format!("r.account_id = ${}", filter.len()));
        }
        if f.state.is_some() {
            filter.push(format!("r.state = ${}", filter.len()));
        }
        let filter = filter.join(" AND ");
        let cols = REMINDER_COLS
            .split(", ")
            .map(|c| format!("r.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let main = format!("SELECT {cols} FROM reminders r WHERE {filter} ORDER BY r.id");
        let parts = format!(
            "SELECT p.reminder_id, p.kind, p.text, p.media_id, p.caption \
             FROM reminder_parts p JOIN reminders r ON r.id = p.reminder_id \
             WHERE {filter} ORDER BY p.reminder_id, p.position"
        );
        let targets = format!(
            "SELECT t.reminder_id, t.group_jid \
             FROM reminder_targets t JOIN reminders r ON r.id = t.reminder_id \
             WHERE {filter} ORDER BY t.reminder_id, t.position"
        );
        let account = f.account_id.as_ref().map(|a| a.as_str().to_owned());
        let state = f.state.map(|s| s.as_str());
        read!(self, p => {
            // One consistent snapshot for the three reads.
            let mut tx = p.begin().await.map_err(be)?;
            macro_rules! fetch {
                ($sql:expr) => {{
                    let mut q = sqlx::query($sql);
                    if let Some(a) = &account {
                        q = q.bind(a.as_str());
                    }
                    if let Some(s) = state {
                        q = q.bind(s);
                    }
                    q.fetch_all(&mut *tx).await.map_err(be)?
                }};
            }
            let rows = fetch!(&main);
            let part_rows = fetch!(&parts);
            let target_rows = fetch!(&targets);
            tx.commit().await.map_err(be)?;
            let (mut parts, mut targets) = group_children(&part_rows, &target_rows)?;
            rows.iter()
                .map(|row| {
                    let id = row.int("id")?;
                    reminder_from(
                        row,
                        parts.remove(&id).unwrap_or_default(),
                        targets.remove(&id).unwrap_or_default(),
                    )
                })
                .collect()
        })
    }

    async fn list_reminder_summaries(
        &self,
        page: &ReminderPage,
    ) -> StoreResult<Vec<ReminderSummary>> {
        let f = &page.filter;
        let mut filter = vec!["r.id > $1".to_owned()];
        if f.account_id.is_some() {
            filter.push(format!("r.account_id = ${}", filter.len() + 1));
        }
        if f.state.is_some() {
            filter.push(format!("r.state = ${}", filter.len() + 1));
        }
        let sql = format!(
            "SELECT {SUMMARY_COLS} FROM reminders r WHERE {} ORDER BY r.id LIMIT ${}",
            filter.join(" AND "),
            filter.len() + 1
        );
        read!(self, p => {
            let mut q = sqlx::query(&sql).bind(page.after_id.unwrap_or(0));
            if let Some(a) = &f.account_id {
                q = q.bind(a.as_str());
            }
            if let Some(s) = f.state {
                q = q.bind(s.as_str());
            }
            q.bind(sql_limit(page.limit))
                .fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(summary_from)
                .collect()
        })
    }

    async fn reminder_schedules(&self, scan: ScheduleScan) -> StoreResult<Vec<ReminderSchedule>> {
        read!(self, p => match scan {
            ScheduleScan::Active => sqlx::query(&format!(
                "SELECT {SCHEDULE_COLS} FROM reminders r WHERE r.state = 'active' ORDER BY r.id"
            ))
            .fetch_all(p)
            .await,
            ScheduleScan::ChangedAfter(v) => sqlx::query(&format!(
                "SELECT {SCHEDULE_COLS} FROM reminders r WHERE r.version > $1 ORDER BY r.version"
            ))
            .bind(v)
            .fetch_all(p)
            .await,
        }
        .map_err(be)?
        .iter()
        .map(schedule_from)
        .collect())
    }

    async fn get_reminder_schedule(&self, id: i64) -> StoreResult<Option<ReminderSchedule>> {
        let sql = format!("SELECT {SCHEDULE_COLS} FROM reminders r WHERE r.id = $1");
        read!(self, p => sqlx::query(&sql)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(schedule_from)
            .transpose())
    }

    async fn update_reminder(
        &self,
        id: i64,
        r: &NewReminder,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        let now = trunc(now);
        let (state, created_at) = tx!(self, tx => {
            let Some(row) = sqlx::query("SELECT state, created_at FROM reminders WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?
            else {
                return Err(not_found(format!("reminder {id}")));
            };
            let state: ReminderState = parse_enum(row.text("state")?, "reminder state")?;
            let created_at = row.ts("created_at")?;
            let active = sqlx::query(&format!(
                "SELECT id, status FROM runs WHERE reminder_id = $1 AND status IN {EDIT_BLOCKING} LIMIT 1"
            ))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            if let Some(run) = active {
                return Err(StoreError::Conflict(format!(
                    "reminder {id} has a run in progress (run {} is {}); stop it or wait for it to finish",
                    run.int("id")?,
                    run.text("status")?
                )));
            }
            validate_refs!(tx, r);
            sqlx::query(
                "UPDATE reminders SET account_id = $2, title = $3, timezone = $4, \
                 schedule_kind = $5, schedule_expr = $6, window_start_hour = $7, \
                 window_end_hour = $8, resume_next_window = $9, updated_at = $10, \
                 unique_texts = $11, target_select = $12, \
                 part_count = $13, target_count = $14 WHERE id = $1",
            )
            .bind(id)
            .bind(r.account_id.as_str())
            .bind(&r.title)
            .bind(r.timezone.name())
            .bind(r.schedule.kind())
            .bind(r.schedule.expr())
            .bind(i64::from(r.window.start_hour()))
            .bind(i64::from(r.window.end_hour()))
            .bind(r.resume_next_window)
            .bind(Ts(now))
            .bind(r.unique_texts)
            .bind(select_json(r))
            .bind(r.parts.len() as i64)
            .bind(r.targets.len() as i64)
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            for table in ["reminder_parts", "reminder_targets"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE reminder_id = $1"))
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
            insert_children!(tx, id, r);
            bump_version!(tx, self.version_lock_sql(), id);
            (state, created_at)
        });
        Ok(Reminder {
            id,
            state,
            spec: r.clone(),
            created_at,
            updated_at: now,
        })
    }

    async fn set_reminder_state(
        &self,
        id: i64,
        state: ReminderState,
        now: DateTime<Utc>,
    ) -> StoreResult<Reminder> {
        let n = tx!(self, tx => {
            let n = sqlx::query("UPDATE reminders SET state = $2, updated_at = $3 WHERE id = $1")
                .bind(id)
                .bind(state.as_str())
                .bind(Ts(trunc(now)))
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if n > 0 {
                bump_version!(tx, self.version_lock_sql(), id);
            }
            n
        });
        if n == 0 {
            return Err(not_found(format!("reminder {id}")));
        }
        self.get_reminder(id)
            .await?
            .ok_or_else(|| not_found(format!("reminder {id}")))
    }

    // ------------------------------------------------------------ runs

    async fn create_run(
        &self,
        reminder_id: i64,
        account: &AccountId,
        scheduled_for: DateTime<Utc>,
        status: RunStatus,
        error_summary: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<RunCreated> {
        let scheduled_for = trunc(scheduled_for);
        let select = runs_sql("reminder_id = $1 AND scheduled_for = $2", "ASC", "");
        let created = tx!(self, tx => {
            // ON CONFLICT waits for a concurrent inserter of the same
            // occurrence and then does nothing: exactly one caller wins.
            let n = sqlx::query(
                "INSERT INTO runs (reminder_id, account_id, scheduled_for, status, error_summary, \
                 created_at) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (reminder_id, scheduled_for) DO NOTHING",
            )
            .bind(reminder_id)
            .bind(account.as_str())
            .bind(Ts(scheduled_for))
            .bind(status.as_str())
            .bind(error_summary)
            .bind(Ts(trunc(now)))
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                if is_fk_violation(&e) {
                    not_found(format!("reminder {reminder_id}"))
                } else {
                    be(e)
                }
            })?
            .rows_affected();
            let row = sqlx::query(&select)
                .bind(reminder_id)
                .bind(Ts(scheduled_for))
                .fetch_one(&mut *tx)
                .await
                .map_err(be)?;
            RunCreated {
                run: run_from(&row)?,
                created: n == 1,
            }
        });
        Ok(created)
    }

    async fn create_runs(
        &self,
        runs: &[NewRun],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<RunCreated>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let now = trunc(now);
        let runs: Vec<NewRun> = runs
            .iter()
            .map(|r| NewRun {
                scheduled_for: trunc(r.scheduled_for),
                ..r.clone()
            })
            .collect();
        // Only the first element of an occurrence repeated in the batch is
        // offered for inserting, so it is the one stored, as with create_run.
        let mut seen = HashSet::new();
        let firsts: Vec<NewRun> = runs
            .iter()
            .filter(|r| seen.insert((r.reminder_id, r.scheduled_for)))
            .cloned()
            .collect();
        let attempt = async {
            Ok(tx!(self, tx => {
                // Each occurrence inserted is claimed by its first element;
                // the rest (there before, or repeated) are read back.
                let mut inserted = Bulk::insert_runs(&mut *tx, &firsts, now).await?;
                let mut out: Vec<Option<RunCreated>> = runs
                    .iter()
                    .map(|r| {
                        inserted
                            .remove(&(r.reminder_id, r.scheduled_for))
                            .map(|id| RunCreated {
                                run: fresh_run(id, r, now),
                                created: true,
                            })
                    })
                    .collect();
                let rest: Vec<Occurrence> = runs
                    .iter()
                    .zip(&out)
                    .filter(|(_, c)| c.is_none())
                    .map(|(r, _)| (r.reminder_id, r.scheduled_for))
                    .collect();
                if !rest.is_empty() {
                    let found: HashMap<Occurrence, Run> = Bulk::runs_at(&mut *tx, &rest)
                        .await?
                        .into_iter()
                        .map(|run| ((run.reminder_id, run.scheduled_for), run))
                        .collect();
                    for (r, c) in runs.iter().zip(&mut out) {
                        if c.is_some() {
                            continue;
                        }
                        let key = (r.reminder_id, r.scheduled_for);
                        let run = found.get(&key).ok_or_else(|| {
                            StoreError::Backend(format!(
                                "run of reminder {} at {} neither inserted nor found",
                                key.0, key.1
                            ))
                        })?;
                        *c = Some(RunCreated {
                            run: run.clone(),
                            created: false,
                        });
                    }
                }
                out.into_iter().flatten().collect::<Vec<_>>()
            }))
        };
        match attempt.await {
            // Only the insert's FK check says NotFound; name the reminder,
            // as create_run does, on a fresh connection (PostgreSQL has
            // given up on the failed transaction).
            Err(StoreError::NotFound(_)) => {
                let ids: Vec<i64> = runs.iter().map(|r| r.reminder_id).collect();
                let missing = read!(self, p => {
                    let mut c = p.acquire().await.map_err(be)?;
                    Bulk::missing_reminder(&mut *c, &ids).await?
                });
                Err(not_found(match missing {
                    Some(id) => format!("reminder {id}"),
                    None => "reminder".to_owned(),
                }))
            }
            other => other,
        }
    }

    async fn create_chosen_targets(
        &self,
        run: RunId,
        groups: &[(GroupJid, String)],
    ) -> StoreResult<()> {
        tx!(self, tx => {
            // The no-op update locks the run's row on PostgreSQL (SQLite's
            // IMMEDIATE transaction is already alone), so of two callers
            // freezing the same run, the second sees the first's targets.
            let locked = sqlx::query("UPDATE runs SET status = status WHERE id = $1")
                .bind(run.0)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if locked == 0 {
                return Err(not_found(format!("run {run}")));
            }
            let has = sqlx::query("SELECT 1 AS one FROM run_targets WHERE run_id = $1 LIMIT 1")
                .bind(run.0)
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?;
            if has.is_none() {
                Bulk::insert_run_targets(&mut *tx, run.0, groups).await?;
            }
        });
        Ok(())
    }

    async fn get_run(&self, id: RunId) -> StoreResult<Option<Run>> {
        let sql = runs_sql("id = $1", "ASC", "");
        read!(self, p => sqlx::query(&sql)
            .bind(id.0)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(run_from)
            .transpose())
    }

    async fn list_runs(&self, f: &RunFilter) -> StoreResult<Vec<Run>> {
        let mut filter = vec!["TRUE".to_owned()];
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        if f.reminder_id.is_some() {
            filter.push(format!("reminder_id = ${}", next()));
        }
        if f.account_id.is_some() {
            filter.push(format!("account_id = ${}", next()));
        }
        if f.status.is_some() {
            filter.push(format!("status = ${}", next()));
        }
        if f.before_id.is_some() {
            filter.push(format!("id < ${}", next()));
        }
        // A zero limit means no limit (RunFilter::default() lists everything).
        let limit = if f.limit > 0 {
            format!("LIMIT ${}", next())
        } else {
            String::new()
        };
        let sql = runs_sql(&filter.join(" AND "), "DESC", &limit);
        read!(self, p => {
            let mut q = sqlx::query(&sql);
            if let Some(r) = f.reminder_id {
                q = q.bind(r);
            }
            if let Some(a) = &f.account_id {
                q = q.bind(a.as_str());
            }
            if let Some(s) = f.status {
                q = q.bind(s.as_str());
            }
            if let Some(b) = f.before_id {
                q = q.bind(b);
            }
            if f.limit > 0 {
                q = q.bind(i64::from(f.limit));
            }
            q.fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(run_from)
                .collect()
        })
    }

    async fn update_run(&self, id: RunId, u: &RunUpdate) -> StoreResult<()> {
        check_update(u)?;
        // The compare-and-set: statuses are a fixed vocabulary, bound as
        // parameters all the same.
        let mut sql = "UPDATE runs SET status = COALESCE($2, status), \
             window_end_at = COALESCE($3, window_end_at), \
             started_at = COALESCE($4, started_at), \
             finished_at = COALESCE($5, finished_at), \
             forecast = COALESCE($6, forecast), \
             error_summary = COALESCE($7, error_summary), \
             stop_requested_at = CASE WHEN $8 THEN NULL \
                                 ELSE COALESCE($9, stop_requested_at) END WHERE id = $1"
            .to_owned();
        if !u.expect.is_empty() {
            let marks: Vec<String> = (0..u.expect.len())
                .map(|i| format!("${}", i + 10))
                .collect();
            sql.push_str(&format!(" AND status IN ({})", marks.join(", ")));
        }
        let fence_sql = self.fence_check_sql();
        // One transaction: the fence, the compare-and-set and the skipping
        // of open targets land together or not at all.
        tx!(self, tx => {
            check_fences!(tx, &fence_sql, u.fence.as_slice());
            let mut q = sqlx::query(&sql)
            .bind(id.0)
            .bind(u.status.map(|s| s.as_str()))
            .bind(u.window_end_at.map(Ts))
            .bind(u.started_at.map(Ts))
            .bind(u.finished_at.map(Ts))
            .bind(u.forecast.as_deref())
            .bind(u.error_summary.as_deref())
            // A retry forgets an earlier stop.
            .bind(u.requeue_unsent)
            .bind(u.stop_requested_at.map(Ts));
            for s in &u.expect {
                q = q.bind(s.as_str());
            }
            let n = q.execute(&mut *tx).await.map_err(be)?.rows_affected();
            if n == 0 {
                let actual: Option<String> =
                    sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
                        .bind(id.0)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(be)?;
                return Err(match actual {
                    None => not_found(format!("run {id}")),
                    Some(s) => cas_conflict(id, parse_enum(s, "run status")?),
                });
            }
            if u.requeue_unsent {
                sqlx::query(
                    // A group whose last message may have arrived goes back
                    // as `sending`, so a second skip still says so.
                    "UPDATE run_targets SET error = NULL, status = CASE \
                       WHEN error LIKE $2 THEN 'sending' ELSE 'pending' END \
                     WHERE run_id = $1 AND status IN ('failed', 'skipped')",
                )
                .bind(id.0)
                .bind(format!("%{MAYBE_DELIVERED}"))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            if let Some(reason) = &u.skip_open {
                sqlx::query(
                    "UPDATE run_targets SET status = 'skipped', \
                     error = CASE WHEN status = 'sending' THEN $3 ELSE $2 END \
                     WHERE run_id = $1 AND status IN ('pending', 'sending')",
                )
                .bind(id.0)
                .bind(reason.as_str())
                .bind(format!("{reason}{MAYBE_DELIVERED}"))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
        });
        Ok(())
    }

    async fn list_targets(
        &self,
        run: RunId,
        status: Option<TargetStatus>,
        after_position: Option<u32>,
        limit: u32,
    ) -> StoreResult<Vec<RunTarget>> {
        let mut sql = format!("SELECT {TARGET_COLS} FROM run_targets WHERE run_id = $1");
        let mut n = 1;
        if status.is_some() {
            n += 1;
            sql.push_str(&format!(" AND status = ${n}"));
        }
        if after_position.is_some() {
            n += 1;
            sql.push_str(&format!(" AND position > ${n}"));
        }
        sql.push_str(" ORDER BY position");
        // As with runs, zero means no limit.
        if limit > 0 {
            n += 1;
            sql.push_str(&format!(" LIMIT ${n}"));
        }
        read!(self, p => {
            let mut q = sqlx::query(&sql).bind(run.0);
            if let Some(s) = status {
                q = q.bind(s.as_str());
            }
            if let Some(a) = after_position {
                q = q.bind(i64::from(a));
            }
            if limit > 0 {
                q = q.bind(i64::from(limit));
            }
            q.fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(target_from)
                .collect()
        })
    }

    async fn apply_transitions(&self, ts: &[Transition]) -> StoreResult<()> {
        if ts.is_empty() {
            return Ok(());
        }
        tx!(self, tx => apply_batch(&mut *tx, ts).await?);
        Ok(())
    }

    async fn apply_transitions_fenced(
        &self,
        fences: &[herald_actors::lease::Fence],
        ts: &[Transition],
    ) -> StoreResult<()> {
        if ts.is_empty() {
            return Ok(());
        }
        let fence_sql = self.fence_check_sql();
        tx!(self, tx => {
            check_fences!(tx, &fence_sql, fences);
            apply_batch(&mut *tx, ts).await?
        });
        Ok(())
    }

    async fn unfinished_runs(&self) -> StoreResult<Vec<Run>> {
        let sql = runs_sql(&format!("status IN {UNFINISHED}"), "ASC", "");
        read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(run_from)
            .collect())
    }

    async fn sent_since(
        &self,
        account: &AccountId,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<(Option<DateTime<Utc>>, u32)>> {
        // Only runs that were still going at `since` can hold such sends:
        // the account index narrows to those, not the account's history.
        read!(self, p => sqlx::query(
            "SELECT CASE WHEN t.status = 'sending' THEN NULL ELSE t.sent_at END AS sent_at, \
             CASE WHEN t.status = 'sending' THEN 1 ELSE t.parts_sent END AS parts_sent \
             FROM runs r JOIN run_targets t ON t.run_id = r.id \
             WHERE r.account_id = $1 AND (r.finished_at IS NULL OR r.finished_at >= $2) \
             AND (t.sent_at >= $2 OR t.status = 'sending')",
        )
        .bind(account.as_str())
        .bind(Ts(since))
        .fetch_all(p)
        .await
        .map_err(be)?
        .iter()
        .map(|r| Ok((r.opt_ts("sent_at")?, r.int("parts_sent")? as u32)))
        .collect())
    }

    async fn last_scheduled_for(&self, reminder_id: i64) -> StoreResult<Option<DateTime<Utc>>> {
        read!(self, p => sqlx::query(
            "SELECT MAX(scheduled_for) AS last FROM runs WHERE reminder_id = $1",
        )
        .bind(reminder_id)
        .fetch_one(p)
        .await
        .map_err(be)?
        .opt_ts("last"))
    }

    // ------------------------------------------------------------ events

    async fn append_event(&self, e: &NewEvent) -> StoreResult<Event> {
        let at = trunc(e.at);
        let data =
            serde_json::to_string(&e.data).map_err(|e| StoreError::Backend(e.to_string()))?;
        let id = writer!(self, p => sqlx::query(
            "INSERT INTO events (at, kind, account_id, run_id, data) VALUES ($1, $2, $3, $4, $5) \
             RETURNING id",
        )
        .bind(Ts(at))
        .bind(e.kind)
        .bind(e.account_id.as_ref().map(AccountId::as_str))
        .bind(e.run_id.map(|r| r.0))
        .bind(&data)
        .fetch_one(p)
        .await
        .map_err(be)?
        .int("id"))?;
        Ok(Event {
            id,
            at,
            kind: e.kind.to_owned(),
            account_id: e.account_id.as_ref().map(|a| a.as_str().to_owned()),
            run_id: e.run_id.map(|r| r.0),
            data: e.data.clone(),
        })
    }

    async fn append_events(&self, events: &[NewEvent]) -> StoreResult<Vec<Event>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let rows = events
            .iter()
            .map(EventRow::of)
            .collect::<StoreResult<Vec<_>>>()?;
        let ids = tx!(self, tx => {
            let ids = Bulk::insert_events(&mut *tx, &rows).await?;
            if ids.len() != rows.len() {
                return Err(StoreError::Backend(format!(
                    "inserted {} of {} events",
                    ids.len(),
                    rows.len()
                )));
            }
            ids
        });
        Ok(rows
            .iter()
            .zip(events)
            .zip(ids)
            .map(|((row, e), id)| row.stored(id, e))
            .collect())
    }

    // ------------------------------------------------------------ retention

    async fn prune_runs(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<PrunedRuns> {
        let limit = sql_limit(limit);
        // Targets first, a batch at a time, so no transaction deletes a
        // whole 10,000-group run at once; then the runs left empty.
        let targets = format!(
            "DELETE FROM run_targets WHERE id IN (SELECT t.id FROM run_targets t \
             WHERE t.run_id IN (SELECT p.id FROM runs p WHERE {PRUNABLE_RUN} ORDER BY p.id LIMIT $2) \
             LIMIT $2)"
        );
        let runs = format!(
            "DELETE FROM runs WHERE id IN (SELECT p.id FROM runs p WHERE {PRUNABLE_RUN} \
             AND NOT EXISTS (SELECT 1 FROM run_targets t WHERE t.run_id = p.id) \
             ORDER BY p.id LIMIT $2)"
        );
        let before = Ts(trunc(before));
        Ok(tx!(self, tx => {
            let targets = sqlx::query(&targets)
                .bind(before)
                .bind(limit)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            let runs = sqlx::query(&runs)
                .bind(before)
                .bind(limit)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            PrunedRuns { runs, targets }
        }))
    }

    async fn prune_events(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        let before = Ts(trunc(before));
        let limit = sql_limit(limit);
        Ok(tx!(self, tx => {
            let ids: Vec<i64> = sqlx::query(
                "DELETE FROM events WHERE id IN \
                 (SELECT id FROM events WHERE at < $1 ORDER BY id LIMIT $2) RETURNING id",
            )
            .bind(before)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(be)?
            .iter()
            .map(|r| r.int("id"))
            .collect::<StoreResult<_>>()?;
            if let Some(max) = ids.iter().max() {
                sqlx::query(
                    "INSERT INTO retention_marks (what, through) VALUES ('events', $1) \
                     ON CONFLICT (what) DO UPDATE SET through = excluded.through \
                     WHERE excluded.through > retention_marks.through",
                )
                .bind(*max)
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            ids.len() as u64
        }))
    }

    async fn events_pruned_through(&self) -> StoreResult<i64> {
        let row = read!(self, p => sqlx::query(
            "SELECT through FROM retention_marks WHERE what = 'events'",
        )
        .fetch_optional(p)
        .await
        .map_err(be)?
        .as_ref()
        .map(|r| r.int("through"))
        .transpose())?;
        Ok(row.unwrap_or(0))
    }

    async fn prune_media(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<MediaId>> {
        // One statement: a reminder written meanwhile either commits first
        // (and its part keeps the media) or finds the media gone (422).
        let mut ids: Vec<MediaId> = writer!(self, p => sqlx::query(
            "DELETE FROM media WHERE sha256 IN (SELECT m.sha256 FROM media m \
             WHERE m.created_at < $1 \
             AND NOT EXISTS (SELECT 1 FROM reminder_parts x WHERE x.media_id = m.sha256) \
             ORDER BY m.sha256 LIMIT $2) RETURNING sha256",
        )
        .bind(Ts(trunc(before)))
        .bind(sql_limit(limit))
        .fetch_all(p)
        .await
        .map_err(be)?
        .iter()
        .map(|r| MediaId::parse(&r.text("sha256")?).map_err(|e| corrupt("media id", e)))
        .collect::<StoreResult<_>>())?;
        ids.sort();
        Ok(ids)
    }

    async fn events_after(&self, after_id: i64, limit: u32) -> StoreResult<Vec<Event>> {
        // As with runs, zero means no limit.
        let sql = format!(
            "SELECT {EVENT_COLS} FROM events WHERE id > $1 ORDER BY id {}",
            if limit > 0 { "LIMIT $2" } else { "" }
        );
        read!(self, p => {
            let mut q = sqlx::query(&sql).bind(after_id);
            if limit > 0 {
                q = q.bind(i64::from(limit));
            }
            q.fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(event_from)
                .collect()
        })
    }

    // ------------------------------------------------------------ groups

    async fn sync_groups(
        &self,
        account: &AccountId,
        groups: &[GroupInfo],
        now: DateTime<Utc>,
    ) -> StoreResult<GroupSyncSummary> {
        self.sync_groups_sql(account, groups, now).await
    }

    async fn list_groups(&self, f: &GroupFilter) -> StoreResult<GroupPage> {
        self.list_groups_sql(f).await
    }

    async fn set_group_labels(
        &self,
        account: &AccountId,
        group: &GroupJid,
        labels: &[Label],
    ) -> StoreResult<Group> {
        self.set_group_labels_sql(account, group, labels).await
    }

    async fn groups_synced_at(&self, account: &AccountId) -> StoreResult<Option<DateTime<Utc>>> {
        self.groups_synced_at_sql(account).await
    }

    // ------------------------------------------------------------ leases

    async fn node_heartbeat(
        &self,
        node: &str,
        instance: &str,
        control_url: Option<&str>,
        ttl: Duration,
    ) -> StoreResult<()> {
        self.node_heartbeat_sql(node, instance, control_url, ttl)
            .await
    }

    async fn node_leave(&self, node: &str, instance: &str) -> StoreResult<()> {
        self.node_leave_sql(node, instance).await
    }

    async fn live_nodes(&self) -> StoreResult<Vec<herald_actors::lease::NodeInfo>> {
        self.live_nodes_sql().await
    }

    async fn list_leases(&self) -> StoreResult<Vec<herald_actors::lease::Lease>> {
        self.list_leases_sql().await
    }

    async fn acquire_lease(
        &self,
        account: &AccountId,
        node: &str,
        ttl: Duration,
    ) -> StoreResult<Option<herald_actors::lease::Lease>> {
        self.acquire_lease_sql(account, node, ttl).await
    }

    async fn renew_leases(
        &self,
        fences: &[herald_actors::lease::Fence],
        ttl: Duration,
    ) -> StoreResult<Vec<bool>> {
        self.renew_leases_sql(fences, ttl).await
    }

    async fn release_lease(&self, fence: &herald_actors::lease::Fence) -> StoreResult<()> {
        self.release_lease_sql(fence).await
    }
}
