//! `herald whatsapp rekey`: every WhatsApp session row re-sealed under a
//! new key, in one transaction, with the daemons stopped. The old key file
//! is kept beside the new one (`….old`) until the operator deletes it.

use super::seal::SessionKey;
use super::store::open_key;
use crate::settings::Settings;
use crate::store::{DaemonLock, SqlStore};
use anyhow::Context as _;
use std::path::PathBuf;

/// What a rekey did.
#[derive(Debug)]
pub struct Rekeyed {
    pub rows: usize,
    pub accounts: usize,
    pub old_id: String,
    pub new_id: String,
    pub key_file: PathBuf,
    pub old_file: PathBuf,
}

fn with_suffix(p: &std::path::Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

pub async fn rekey(settings: &Settings) -> anyhow::Result<Rekeyed> {
    let url = settings.database_url();
    // A running daemon would go on sealing under the old key: refused
    // while any holds the database (the same lock a daemon takes).
    let lock = DaemonLock::for_url(&url)
        .await
        .context("the daemons must be stopped for a rekey")?;
    let sql = SqlStore::connect(&url)
        .await
        .context("opening the database")?;
    let rows = sql.wa_rows();
    let path = settings.session_key_path();
    let old = open_key(&path, &rows).await?;
    let new_path = with_suffix(&path, ".new");
    let _ = std::fs::remove_file(&new_path);
    let new = SessionKey::create(&new_path)?;
    let all = rows.all_sealed().await?;
    let mut accounts = std::collections::BTreeSet::new();
    let mut resealed = Vec::with_capacity(all.len());
    for (account, kind, k, v) in all {
        let plain = old
            .for_account(account.as_str())
            .open(kind, &k, &v)
            .map_err(|e| anyhow::anyhow!("account {account}: a session row ({kind}/{k}) {e}"))?;
        let v = new.for_account(account.as_str()).seal(kind, &k, &plain);
        accounts.insert(account.clone());
        resealed.push((account, kind, k, v));
    }
    rows.reseal(&resealed, &new.id()).await?;
    let old_file = with_suffix(&path, ".old");
    std::fs::rename(&path, &old_file)
        .with_context(|| format!("moving the old key to {}", old_file.display()))?;
    std::fs::rename(&new_path, &path)
        .with_context(|| format!("moving the new key to {}", path.display()))?;
    sql.close().await;
    drop(lock);
    Ok(Rekeyed {
        rows: resealed.len(),
        accounts: accounts.len(),
        old_id: old.id(),
        new_id: new.id(),
        key_file: path,
        old_file,
    })
}
