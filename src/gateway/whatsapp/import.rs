//! The upgrade from per-daemon session files: on the first start after it,
//! each `<data_dir>/whatsapp/<account>/session.db` (written by
//! whatsapp-rust-sqlite-storage 0.7) is read into the database, sealed,
//! so no paired account pairs again. Once the sealed copy has committed the
//! file and its `-wal`/`-shm` are overwritten with zeros and deleted (and
//! the directory synced), so no plain-text copy of the account's keys stays
//! on disk; `whatsapp.keep_imported_session_files` renames them to
//! `session.db.imported…` instead.
//!
//! What is carried over: the device (its keys and login), identities,
//! Signal sessions, pre-keys, signed pre-keys, sender keys, sender-key
//! status per group device, LID mappings, device lists and privacy
//! tokens. Left behind, as caches the client rebuilds: app-state sync
//! (re-synced from version 0, its keys asked again from the phone), sent
//! messages kept for retry receipts, base keys, message secrets, group
//! metadata, the server's certificate (the next login uses Noise XX).

use super::backend::{kind, SessionBackend};
use super::store::SessionStore;
use crate::store::whatsapp::Op;
use crate::token::beside;
use anyhow::Context as _;
use herald_actors::domain::AccountId;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::Row as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use whatsapp_rust::wacore::libsignal::protocol::{KeyPair, PrivateKey, PublicKey};
use whatsapp_rust::wacore::store::traits::{
    DeviceInfo, DeviceListRecord, LidPnMappingEntry, TcTokenEntry,
};
use whatsapp_rust::wacore::store::Device;

/// The file a daemon before 0.x kept an account's session in.
pub fn legacy_file(account_dir: &Path) -> PathBuf {
    account_dir.join("session.db")
}

/// Imports every legacy session file under `root` (`<data_dir>/whatsapp`)
/// whose account exists in `accounts` and has no session in the database
/// yet, then deletes it (renames it, with `keep_files`). Answers the
/// accounts imported.
pub async fn import_all(
    root: &Path,
    sessions: &SessionStore,
    accounts: &[AccountId],
    keep_files: bool,
) -> anyhow::Result<Vec<AccountId>> {
    let mut done = Vec::new();
    let Ok(dirs) = std::fs::read_dir(root) else {
        return Ok(done);
    };
    for entry in dirs.flatten() {
        let file = legacy_file(&entry.path());
        if !file.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(account) = accounts.iter().find(|a| a.as_str() == name) else {
            tracing::warn!(file = %file.display(), "a WhatsApp session file for an account Herald does not have: left as it is");
            continue;
        };
        if sessions.stored(account).await.map_err(anyhow::Error::msg)? {
            tracing::warn!(account = %account, file = %file.display(), "the database holds this account's session already: the file is left as it is");
            continue;
        }
        let ops = read_legacy(&file, &sessions.backend(account))
            .await
            .with_context(|| format!("importing the WhatsApp session {}", file.display()))?;
        let n = ops.len();
        // At start-up, before any lease is taken: the file's daemon was
        // the only one that could serve the account.
        sessions.rows().write(account, None, ops).await?;
        sessions.changed_outside(account);
        // Committed: the sealed copy is the account's session from here.
        if keep_files {
            keep(&file)?;
            tracing::info!(account = %account, rows = n, "imported the WhatsApp session file into the database (kept as session.db.imported: it holds the account's keys in plain text)");
        } else {
            remove(&file)?;
            tracing::info!(account = %account, rows = n, "imported the WhatsApp session file into the database (the file is deleted)");
        }
        done.push(account.clone());
    }
    Ok(done)
}

/// The legacy file's name and its SQLite companions' suffixes.
const COMPANIONS: [&str; 3] = ["", "-wal", "-shm"];

/// The legacy file and its SQLite companions.
fn with_companions(file: &Path) -> [PathBuf; 3] {
    COMPANIONS.map(|suffix| beside(file, suffix))
}

/// `session.db…` renamed to `session.db.imported…`.
fn keep(file: &Path) -> anyhow::Result<()> {
    for suffix in COMPANIONS {
        let (from, to) = (
            beside(file, suffix),
            beside(file, &format!(".imported{suffix}")),
        );
        if from.exists() {
            std::fs::rename(&from, &to).with_context(|| format!("renaming {}", from.display()))?;
        }
    }
    crate::token::sync_dir_of(file)
}

/// `session.db…` overwritten with zeros, synced, then deleted, and the
/// directory synced: the plain-text keys leave the file system as far as
/// the file system lets a program make them (a copy-on-write or
/// log-structured one may keep old blocks until it reuses them).
fn remove(file: &Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    for path in with_companions(file) {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let wipe = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
            let zeros = vec![0u8; 64 * 1024];
            let mut left = meta.len();
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                f.write_all(&zeros[..n])?;
                left -= n as u64;
            }
            f.sync_all()
        };
        wipe().with_context(|| format!("overwriting {}", path.display()))?;
        std::fs::remove_file(&path).with_context(|| format!("deleting {}", path.display()))?;
    }
    crate::token::sync_dir_of(file)
}

fn key_pair(bytes: &[u8]) -> anyhow::Result<KeyPair> {
    anyhow::ensure!(
        bytes.len() == 64,
        "a stored key pair is {} bytes, not 64",
        bytes.len()
    );
    let private =
        PrivateKey::deserialize(&bytes[..32]).map_err(|e| anyhow::anyhow!("private key: {e}"))?;
    let public = PublicKey::from_djb_public_key_bytes(&bytes[32..])
        .map_err(|e| anyhow::anyhow!("public key: {e}"))?;
    Ok(KeyPair::new(public, private))
}

fn jid_or_none(s: &str) -> Option<whatsapp_rust::Jid> {
    (!s.is_empty()).then(|| s.parse().ok()).flatten()
}

/// The rows of one legacy file, sealed for the account `b` serves.
async fn read_legacy(file: &Path, b: &SessionBackend) -> anyhow::Result<Vec<Op>> {
    let opts = SqliteConnectOptions::new()
        .filename(file)
        .create_if_missing(false);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await?;
    let mut ops = Vec::new();
    // Device 1 is the one the storage crate serves (its multi-account ids
    // were never used by Herald: one file per account).
    let Some(d) = sqlx::query("SELECT * FROM device ORDER BY id LIMIT 1")
        .fetch_optional(&pool)
        .await?
    else {
        pool.close().await;
        anyhow::bail!("the file holds no device");
    };
    let mut device = Device::new();
    device.pn = jid_or_none(&d.try_get::<String, _>("pn")?);
    device.lid = jid_or_none(&d.try_get::<String, _>("lid")?);
    device.registration_id = d.try_get::<i64, _>("registration_id")? as u32;
    device.noise_key = key_pair(&d.try_get::<Vec<u8>, _>("noise_key")?)?;
    device.identity_key = key_pair(&d.try_get::<Vec<u8>, _>("identity_key")?)?;
    device.signed_pre_key = key_pair(&d.try_get::<Vec<u8>, _>("signed_pre_key")?)?;
    device.signed_pre_key_id = d.try_get::<i64, _>("signed_pre_key_id")? as u32;
    device.signed_pre_key_signature = d
        .try_get::<Vec<u8>, _>("signed_pre_key_signature")?
        .try_into()
        .map_err(|_| anyhow::anyhow!("signed_pre_key_signature is not 64 bytes"))?;
    device.adv_secret_key = d
        .try_get::<Vec<u8>, _>("adv_secret_key")?
        .try_into()
        .map_err(|_| anyhow::anyhow!("adv_secret_key is not 32 bytes"))?;
    device.account = d
        .try_get::<Option<Vec<u8>>, _>("account")?
        .map(|a| whatsapp_rust::wacore::store::device::account_serde::from_bytes(&a))
        .transpose()
        .map_err(|e| anyhow::anyhow!("account identity: {e}"))?
        .map(Arc::new);
    device.push_name = d.try_get("push_name")?;
    device.app_version_primary = d.try_get::<i64, _>("app_version_primary")? as u32;
    device.app_version_secondary = d.try_get::<i64, _>("app_version_secondary")? as u32;
    device.app_version_tertiary = d.try_get::<i64, _>("app_version_tertiary")? as u32;
    device.app_version_last_fetched_ms = d.try_get("app_version_last_fetched_ms")?;
    device.edge_routing_info = d.try_get("edge_routing_info")?;
    device.props_hash = d.try_get("props_hash")?;
    device.next_pre_key_id = d.try_get::<i64, _>("next_pre_key_id")? as u32;
    device.first_unupload_pre_key_id = d.try_get::<i64, _>("first_unupload_pre_key_id")? as u32;
    device.server_has_prekeys = d.try_get("server_has_prekeys")?;
    device.nct_salt = d.try_get("nct_salt")?;
    device.login_counter = d.try_get::<i64, _>("login_counter")? as i32;
    device.lid_migrated = d.try_get("lid_migrated")?;
    device.last_signed_pre_key_rotation_ms = d.try_get("last_signed_pre_key_rotation_ms")?;
    device.read_receipts_disabled = d.try_get("read_receipts_disabled")?;
    let device_id: i64 = d.try_get("id")?;
    ops.push(b.put_json(kind::DEVICE, String::new(), String::new(), 0, &device)?);

    let q = |sql: &'static str| sqlx::query(sql).bind(device_id);
    for r in q("SELECT address, key FROM identities WHERE device_id = $1")
        .fetch_all(&pool)
        .await?
    {
        let a: String = r.try_get("address")?;
        let g = super::backend::user_of(&a).to_owned();
        ops.push(b.put(kind::IDENTITY, a, g, 0, &r.try_get::<Vec<u8>, _>("key")?));
    }
    for r in q("SELECT address, record FROM sessions WHERE device_id = $1")
        .fetch_all(&pool)
        .await?
    {
        let a: String = r.try_get("address")?;
        let g = super::backend::user_of(&a).to_owned();
        ops.push(b.put(kind::SESSION, a, g, 0, &r.try_get::<Vec<u8>, _>("record")?));
    }
    for r in q("SELECT id, key, uploaded FROM prekeys WHERE device_id = $1")
        .fetch_all(&pool)
        .await?
    {
        let id = r.try_get::<i64, _>("id")? as u32;
        let g = if r.try_get::<bool, _>("uploaded")? {
            "1"
        } else {
            "0"
        };
        ops.push(b.put(
            kind::PREKEY,
            format!("{id:010}"),
            g.into(),
            id.into(),
            &r.try_get::<Vec<u8>, _>("key")?,
        ));
    }
    for r in q("SELECT id, record FROM signed_prekeys WHERE device_id = $1")
        .fetch_all(&pool)
        .await?
    {
        let id = r.try_get::<i64, _>("id")? as u32;
        ops.push(b.put(
            kind::SIGNED_PREKEY,
            format!("{id:010}"),
            String::new(),
            id.into(),
            &r.try_get::<Vec<u8>, _>("record")?,
        ));
    }
    for r in q("SELECT address, record FROM sender_keys WHERE device_id = $1")
        .fetch_all(&pool)
        .await?
    {
        ops.push(b.put(
            kind::SENDER_KEY,
            r.try_get("address")?,
            String::new(),
            0,
            &r.try_get::<Vec<u8>, _>("record")?,
        ));
    }
    let mut groups: std::collections::BTreeMap<String, Vec<(String, bool)>> = Default::default();
    for r in q("SELECT group_jid, device_jid, has_key FROM sender_key_devices WHERE device_id = $1")
        .fetch_all(&pool)
        .await?
    {
        groups.entry(r.try_get("group_jid")?).or_default().push((
            r.try_get("device_jid")?,
            r.try_get::<i64, _>("has_key")? != 0,
        ));
    }
    ops.extend(
        groups
            .into_iter()
            .map(|(group, entries)| Op::SenderKeys { group, entries }),
    );
    for r in q("SELECT lid, phone_number, created_at, learning_source, updated_at FROM lid_pn_mapping WHERE device_id = $1")
        .fetch_all(&pool)
        .await?
    {
        let e = LidPnMappingEntry {
            lid: r.try_get("lid")?,
            phone_number: r.try_get("phone_number")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
            learning_source: r.try_get("learning_source")?,
        };
        ops.push(b.put_json(kind::LID_MAPPING, e.lid.clone(), e.phone_number.clone(), e.updated_at, &e)?);
    }
    for r in q("SELECT user_id, devices_json, timestamp, phash, raw_id FROM device_registry WHERE device_id = $1")
        .fetch_all(&pool)
        .await?
    {
        let devices: Vec<DeviceInfo> = serde_json::from_str(&r.try_get::<String, _>("devices_json")?)?;
        let rec = DeviceListRecord {
            user: r.try_get("user_id")?,
            devices,
            timestamp: r.try_get("timestamp")?,
            phash: r.try_get("phash")?,
            raw_id: r.try_get::<Option<i64>, _>("raw_id")?.map(|v| v as u32),
        };
        ops.push(b.put_json(kind::DEVICE_LIST, rec.user.clone(), String::new(), rec.timestamp, &rec)?);
    }
    for r in q(
        "SELECT jid, token, token_timestamp, sender_timestamp FROM tc_tokens WHERE device_id = $1",
    )
    .fetch_all(&pool)
    .await?
    {
        let e = TcTokenEntry {
            token: r.try_get("token")?,
            token_timestamp: r.try_get("token_timestamp")?,
            sender_timestamp: r.try_get("sender_timestamp")?,
        };
        ops.push(b.put_json(
            kind::TC_TOKEN,
            r.try_get("jid")?,
            String::new(),
            e.token_timestamp,
            &e,
        )?);
    }
    pool.close().await;
    Ok(ops)
}
