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
//!
//! Imports: `seal` (webhook secrets are sealed at rest), and of the core
//! `herald_actors::domain`, `herald_actors::ports` (the store traits it
//! implements) and `herald_actors::lifecycle`.

mod accounts;
mod amend;
mod dialect;
mod events;
mod groups;
mod leases;
mod media;
mod polls;
mod receipts;
mod records;
mod reminders;
mod rows;
mod runs;
pub mod scratch;
pub mod sealed;
mod sessions;
mod users;
mod wa_accepted;
mod webhook_secrets;
mod webhooks;
pub mod whatsapp;

use anyhow::Context as _;
use async_trait::async_trait;
use herald_actors::domain::*;
use herald_actors::ports::*;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

/// The sqlx store. Cheap to share behind an `Arc`; the pools inside are
/// already reference-counted.
pub struct SqlStore {
    db: Db,
    /// Seals and opens the webhooks' signing secrets; without it (a store
    /// opened without the session key) they can be neither written nor
    /// read. See [`SqlStore::with_secret_key`].
    secrets: Option<crate::seal::WebhookSeal>,
}

#[derive(Clone)]
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
            $crate::store::Db::Sqlite { read: $p, .. } => $body,
            $crate::store::Db::Postgres($p) => $body,
        }
    };
}

/// Like `read!`, with the pool that may write (one statement, no transaction).
macro_rules! writer {
    ($self:ident, $p:ident => $body:expr) => {
        match &$self.db {
            $crate::store::Db::Sqlite { write: $p, .. } => $body,
            $crate::store::Db::Postgres($p) => $body,
        }
    };
}

/// Runs `$body` in a transaction bound to `$tx` and commits it. Leaving the
/// body early (`?`, `return`) drops the transaction, which rolls it back.
macro_rules! tx {
    ($self:ident, $tx:ident => $body:expr) => {
        match &$self.db {
            $crate::store::Db::Sqlite { write, .. } => {
                // IMMEDIATE takes the write lock up front: a deferred
                // transaction that reads first can fail with SQLITE_BUSY
                // on upgrade, which busy_timeout does not retry.
                let mut $tx = write
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err($crate::store::be)?;
                let out = $body;
                $tx.commit().await.map_err($crate::store::be)?;
                out
            }
            $crate::store::Db::Postgres(p) => {
                let mut $tx = p.begin().await.map_err($crate::store::be)?;
                let out = $body;
                $tx.commit().await.map_err($crate::store::be)?;
                out
            }
        }
    };
}

/// Inside a `tx!` body: fails with `Fenced` (the transaction rolls back)
/// unless every fence is its account's current lease. `$sql` is
/// [`SqlStore::fence_check_sql`].
macro_rules! check_fences {
    ($tx:ident, $sql:expr, $fences:expr) => {
        for f in $fences {
            if !$crate::store::fence_held!($tx, $sql, f) {
                return Err(::herald_actors::ports::StoreError::fenced(&f));
            }
        }
    };
}

/// Inside a `tx!` body: whether `$fence` is its account's current lease
/// (`$sql` is [`SqlStore::fence_check_sql`]); a database error returns.
macro_rules! fence_held {
    ($tx:ident, $sql:expr, $fence:expr) => {{
        let f = $fence;
        let held: Option<i64> = ::sqlx::query_scalar($sql)
            .bind(f.account.as_str())
            .bind(&f.node)
            .bind(f.epoch)
            .fetch_optional(&mut *$tx)
            .await
            .map_err($crate::store::be)?;
        held.is_some()
    }};
}

// By path (`use super::tx;`), so a module names the macros it uses and
// the macros name everything they use: no order of `mod` lines to keep.
pub(crate) use {check_fences, fence_held, read, tx, writer};

/// Held from a reminder's version bump to its commit on PostgreSQL, so
/// versions follow commit order (any constant key of ours would do).
const REMINDER_VERSION_LOCK: &str = "SELECT pg_advisory_xact_lock(4801)";

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

/// What this daemon needs is held by another live daemon: the database
/// (SQLite, or PostgreSQL without a cluster) or, in a cluster, its node
/// id. `herald serve` exits with its own code for it (`daemon::EXIT_IN_USE`),
/// which a supervisor may retry.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HeldByAnother(pub String);

/// How long a PostgreSQL transaction of Herald's may wait on Herald itself
/// between statements before the server ends it (see `connect_postgres`).
pub const IDLE_IN_TRANSACTION: &str = "5s";

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
                return Err(HeldByAnother(format!(
                    "{who} is using the SQLite database {}: one daemon per database; stop \
                     it first",
                    db.display()
                ))
                .into());
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
            (false, false) => Err(HeldByAnother(
                "another Herald daemon is using this PostgreSQL database: one daemon per \
                 database unless every daemon runs with cluster.enabled = true; stop it first"
                    .into(),
            )
            .into()),
            (false, true) => Err(HeldByAnother(
                "a Herald daemon without cluster.enabled is using this PostgreSQL database: \
                 stop it, or run it with cluster.enabled = true too"
                    .into(),
            )
            .into()),
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
            secrets: None,
        })
    }

    async fn connect_postgres(url: &str) -> anyhow::Result<SqlStore> {
        use std::str::FromStr;
        let opts = sqlx::postgres::PgConnectOptions::from_str(url)
            .context("reading the PostgreSQL URL")?
            // A daemon frozen inside a transaction (SIGSTOP, a suspended
            // VM) would hold its fence checks' row locks on its leases, and
            // the daemon taking its accounts over would wait on them until
            // it woke. Herald never waits on anything else mid-transaction,
            // so the server ends such a transaction (rolled back: the
            // frozen daemon's marks never land) and the takeover goes on.
            .options([("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION)]);
        let pool = PgPoolOptions::new()
            // Enough for the engine's batched writes plus the control port,
            // and small enough that several daemons can share a server.
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts)
            .await
            .context("connecting to PostgreSQL")?;
        sqlx::migrate!("./migrations/postgres")
            .run(&pool)
            .await
            .context("migrating the PostgreSQL database")?;
        Ok(SqlStore {
            db: Db::Postgres(pool),
            secrets: None,
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

// ---------------------------------------------------------------- the store

#[async_trait]
impl StoreBase for SqlStore {
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

    async fn database_now(&self) -> StoreResult<chrono::DateTime<chrono::Utc>> {
        use rows::RowGet as _;
        let sql = format!("SELECT {} AS now", self.now_sql());
        read!(self, p => sqlx::query(&sql)
            .fetch_one(p)
            .await
            .map_err(be)?
            .ts("now"))
    }
}
