//! `herald backup FILE` and `herald restore FILE`: an embedded (SQLite)
//! install copied while its daemon runs, and put back into an empty data
//! directory.
//!
//! The archive is a plain tar (see [`tar`]): `herald-backup.json` first
//! (what made it, and when), then `herald.db`, a consistent snapshot taken
//! with SQLite's `VACUUM INTO` inside one read transaction (the daemon
//! goes on writing meanwhile: WAL readers never block it), then
//! `media/<sha256>` for every media row of that snapshot. Media files are
//! named by their content and never change, so copying them after the
//! snapshot is consistent too; a restore checks every file against its name.
//!
//! Not in the archive, on purpose: the control token and the WhatsApp
//! session key. A stolen backup then opens no session and drives no port;
//! the operator keeps those two apart (the manual, docs/src/backups.md).
//!
//! Imports: `settings`, `token` (its file helpers), `store` and
//! `herald_actors::domain`.

pub mod tar;

use crate::settings::{DatabaseKind, Settings};
use crate::store::SqlStore;
use crate::token::beside;
use anyhow::{bail, ensure, Context};
use chrono::{DateTime, Utc};
use herald_actors::domain::MediaId;
use serde::{Deserialize, Serialize};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Row, SqliteConnection};
use std::io::{BufReader, BufWriter, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

pub const MANIFEST: &str = "herald-backup.json";
pub const DATABASE: &str = "herald.db";
const FORMAT: u32 = 1;

/// What a backup says about itself, its first entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// This layout's version.
    pub format: u32,
    pub herald_version: String,
    pub created_at: DateTime<Utc>,
    /// The newest migration applied to the database when it was copied.
    pub schema_version: i64,
    /// The media files that follow the database.
    pub media_files: usize,
}

/// What `herald backup` wrote.
#[derive(Debug)]
pub struct BackupReport {
    pub manifest: Manifest,
    pub database_bytes: u64,
    pub media_bytes: u64,
    /// Media rows of the snapshot whose file retention removed before it
    /// was copied (no reminder used them): left out, rows and all.
    pub media_skipped: Vec<String>,
}

/// Where the install's SQLite database is, or why this is not one.
fn sqlite_path(settings: &Settings) -> anyhow::Result<PathBuf> {
    if settings.database_kind()? == DatabaseKind::Postgres {
        bail!(
            "storage.database_url is PostgreSQL: back it up with pg_dump (and copy {}/media \
             beside it); `herald backup` copies an embedded SQLite install",
            settings.storage.data_dir.display()
        );
    }
    SqlStore::sqlite_file(&settings.database_url())?
        .context("storage.database_url is an in-memory database: there is nothing to back up")
}

async fn open(path: &Path, create: bool) -> anyhow::Result<SqliteConnection> {
    SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
        .create_if_missing(create)
        .foreign_keys(true)
        // The daemon may hold the write lock for a commit; wait for it.
        .busy_timeout(Duration::from_secs(30))
        .connect()
        .await
        .with_context(|| format!("opening {}", path.display()))
}

/// Writes a backup of the install `settings` describe to `file` (which
/// must not exist), while its daemon runs or not.
pub async fn backup(settings: &Settings, file: &Path) -> anyhow::Result<BackupReport> {
    let db = sqlite_path(settings)?;
    ensure!(
        db.exists(),
        "no database at {}: is storage.data_dir right?",
        db.display()
    );
    ensure!(
        !file.exists(),
        "{} exists already: a backup never overwrites a file",
        file.display()
    );
    let snapshot = beside(file, ".db.tmp");
    let partial = beside(file, ".tmp");
    let result = write_backup(settings, &db, &snapshot, &partial).await;
    for leftover in [
        snapshot.clone(),
        beside(&snapshot, "-wal"),
        beside(&snapshot, "-shm"),
    ] {
        let _ = std::fs::remove_file(leftover);
    }
    match result {
        Ok(report) => {
            std::fs::rename(&partial, file)
                .with_context(|| format!("naming the backup {}", file.display()))?;
            Ok(report)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

async fn write_backup(
    settings: &Settings,
    db: &Path,
    snapshot: &Path,
    partial: &Path,
) -> anyhow::Result<BackupReport> {
    let _ = std::fs::remove_file(snapshot);
    let mut live = open(db, false).await?;
    sqlx::query("VACUUM INTO ?")
        .bind(snapshot.to_string_lossy().as_ref())
        .execute(&mut live)
        .await
        .context("copying the database (VACUUM INTO)")?;
    live.close().await?;

    let media_dir = settings.storage.data_dir.join("media");
    let mut copy = open(snapshot, false).await?;
    let ids: Vec<String> = sqlx::query_scalar("SELECT sha256 FROM media ORDER BY sha256")
        .fetch_all(&mut copy)
        .await?;
    let mut media = Vec::new();
    let mut media_skipped = Vec::new();
    for id in ids {
        let path = media_dir.join(&id);
        match std::fs::metadata(&path) {
            Ok(meta) => media.push((id, path, meta.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Retention collects media no reminder uses: its file may go
                // between the snapshot and here. One a reminder uses cannot.
                let used: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM reminder_parts WHERE media_id = ?")
                        .bind(&id)
                        .fetch_one(&mut copy)
                        .await?;
                ensure!(
                    used == 0,
                    "the media file {} is missing, and reminders use it: restore it into {} \
                     first (from an older backup), or take the backup again",
                    path.display(),
                    media_dir.display()
                );
                sqlx::query("DELETE FROM media WHERE sha256 = ?")
                    .bind(&id)
                    .execute(&mut copy)
                    .await?;
                media_skipped.push(id);
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    let schema_version: i64 =
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations")
            .fetch_one(&mut copy)
            .await
            .context("reading the schema version")?;
    copy.close().await?;

    let manifest = Manifest {
        format: FORMAT,
        herald_version: env!("CARGO_PKG_VERSION").to_owned(),
        created_at: Utc::now(),
        schema_version,
        media_files: media.len(),
    };
    let mtime = manifest.created_at.timestamp().max(0) as u64;
    let out = std::fs::File::create(partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut tar = tar::TarWriter::new(BufWriter::new(out));
    let json = serde_json::to_vec_pretty(&manifest)?;
    tar.append(MANIFEST, json.len() as u64, mtime, &json[..])?;
    let database_bytes = std::fs::metadata(snapshot)?.len();
    tar.append(
        DATABASE,
        database_bytes,
        mtime,
        std::fs::File::open(snapshot)?,
    )?;
    let mut media_bytes = 0;
    for (id, path, size) in &media {
        let f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
        tar.append(&format!("media/{id}"), *size, mtime, f)
            .with_context(|| format!("copying {}", path.display()))?;
        media_bytes += size;
    }
    let out = tar.finish()?.into_inner().map_err(|e| e.into_error())?;
    out.sync_all()?;
    Ok(BackupReport {
        manifest,
        database_bytes,
        media_bytes,
        media_skipped,
    })
}

/// What `herald restore` put back.
#[derive(Debug)]
pub struct RestoreReport {
    pub manifest: Manifest,
    pub database: PathBuf,
    pub media_files: usize,
}

/// The first file in `dir`, searching down: a directory that holds only
/// empty directories (an image's `media/`, a fresh volume's `lost+found`)
/// counts as empty.
fn first_file(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            if let Some(f) = first_file(&entry.path())? {
                return Ok(Some(f));
            }
        } else {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// Puts the backup in `file` into the data directory `settings` name
/// (and the SQLite file `storage.database_url` names), which must hold no
/// file yet. On failure, whatever it wrote is removed again.
pub async fn restore(settings: &Settings, file: &Path) -> anyhow::Result<RestoreReport> {
    let db = sqlite_path(settings)?;
    let data_dir = settings.storage.data_dir.clone();
    for dir in [Some(data_dir.as_path()), db.parent()]
        .into_iter()
        .flatten()
    {
        if let Some(found) = first_file(dir)? {
            bail!(
                "{} is not empty (it holds {}): restore only into an empty data directory, \
                 so that nothing of another install is mixed into this one",
                dir.display(),
                found.display()
            );
        }
    }
    let input = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut written: Vec<PathBuf> = Vec::new();
    let result = unpack(BufReader::new(input), &data_dir, &db, &mut written).await;
    if result.is_err() {
        for path in written.iter().rev() {
            let _ = std::fs::remove_file(path);
        }
    }
    let (manifest, media_files) = result?;
    Ok(RestoreReport {
        manifest,
        database: db,
        media_files,
    })
}

async fn unpack(
    input: impl Read,
    data_dir: &Path,
    db: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<(Manifest, usize)> {
    let media_dir = data_dir.join("media");
    std::fs::create_dir_all(&media_dir)
        .with_context(|| format!("creating {}", media_dir.display()))?;
    if let Some(parent) = db.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut manifest: Option<Manifest> = None;
    let mut have_db = false;
    let mut media_files = 0;
    tar::read_files(input, |name, size, data| {
        if manifest.is_none() {
            ensure!(
                name == MANIFEST,
                "not a Herald backup: it does not start with {MANIFEST}"
            );
            ensure!(size < 1 << 20, "{MANIFEST} is implausibly large");
            let m: Manifest = serde_json::from_reader(data).context("reading the manifest")?;
            ensure!(
                m.format == FORMAT,
                "this backup is in format {} (made by herald {}); this herald reads format \
                 {FORMAT}",
                m.format,
                m.herald_version
            );
            manifest = Some(m);
            return Ok(());
        }
        let (path, media) = match name.strip_prefix("media/") {
            None if name == DATABASE && !have_db => (db.to_path_buf(), None),
            Some(id) => {
                let id = MediaId::parse(id)
                    .map_err(|_| anyhow::anyhow!("{name}: not a media file of Herald's"))?;
                (media_dir.join(id.as_str()), Some(id))
            }
            None => bail!("{name}: not part of a Herald backup"),
        };
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        written.push(path.clone());
        let mut hashing = Hashing::new(data);
        let copied = std::io::copy(&mut hashing, &mut out)
            .with_context(|| format!("writing {}", path.display()))?;
        ensure!(copied == size, "{name}: the archive ends inside it");
        out.sync_all()?;
        match media {
            Some(id) => {
                ensure!(
                    hashing.hex() == id.as_str(),
                    "{name}: its bytes do not match its name (the backup is damaged)"
                );
                media_files += 1;
            }
            None => have_db = true,
        }
        Ok(())
    })?;
    let manifest = manifest.context("not a Herald backup: the archive is empty")?;
    ensure!(have_db, "the backup holds no {DATABASE}");
    ensure!(
        media_files == manifest.media_files,
        "the backup holds {media_files} media files where its manifest lists {} (truncated?)",
        manifest.media_files
    );
    let mut conn = open(db, false).await?;
    let check: String = sqlx::query("PRAGMA quick_check")
        .fetch_one(&mut conn)
        .await?
        .try_get(0)?;
    conn.close().await?;
    ensure!(
        check == "ok",
        "the restored database fails SQLite's check: {check}"
    );
    Ok((manifest, media_files))
}

/// A reader that hashes what passes through it (SHA-256).
struct Hashing<R> {
    inner: R,
    hash: sha2::Sha256,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R) -> Self {
        use sha2::Digest;
        Self {
            inner,
            hash: sha2::Sha256::new(),
        }
    }

    fn hex(self) -> String {
        use sha2::Digest;
        hex::encode(self.hash.finalize())
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
