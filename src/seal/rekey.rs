//! `herald whatsapp rekey`: everything sealed under the session key (the
//! WhatsApp session rows and the webhook secrets) re-sealed under a new
//! key, in one transaction, with the daemons stopped. The old key file is
//! kept beside the new one (`….old`) until the operator deletes it.
//!
//! The order makes every crash recoverable: the new key is written to
//! `<file>.new` and made durable (file and directory synced) before the
//! database commits to it; after the commit the files are renamed and the
//! directory synced again. A crash between the commit and the renames
//! leaves the key the database expects in `<file>.new`, and the next start
//! says so and how to finish ([`super::key_file`]).

use super::key_file::{open_key, with_suffix};
use super::SessionKey;
use crate::settings::Settings;
use crate::store::sealed::AllSealed;
use crate::store::{DaemonLock, SqlStore};
use anyhow::Context as _;
use std::path::PathBuf;

/// What a rekey did.
#[derive(Debug)]
pub struct Rekeyed {
    /// Session rows re-sealed, and of how many accounts.
    pub rows: usize,
    pub accounts: usize,
    /// Webhook secrets re-sealed.
    pub webhook_secrets: usize,
    /// The key everything was sealed under (none when nothing was sealed
    /// and its file is gone).
    pub old_id: Option<String>,
    pub new_id: String,
    pub key_file: PathBuf,
    /// Where the old key file now is, when there was one.
    pub old_file: Option<PathBuf>,
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
    let sealed = sql.sealed();
    let path = settings.session_key_path();
    let all = sealed.all().await?;
    // With something sealed, the old key must be the recorded one. With
    // nothing sealed there is nothing to open: a lost or mismatched key is
    // simply replaced.
    let old = if all.is_empty() {
        SessionKey::load(&path)?
    } else {
        Some(open_key(&path, &sealed).await?)
    };
    let new_path = with_suffix(&path, ".new");
    let _ = std::fs::remove_file(&new_path);
    // Durable (file and directory synced) before the database depends on it.
    let new = SessionKey::create(&new_path)?;
    let mut resealed = AllSealed::default();
    let mut accounts = std::collections::BTreeSet::new();
    if let Some(old) = &old {
        for (account, kind, k, v) in all.sessions {
            let plain = old
                .for_account(account.as_str())
                .open(kind, &k, &v)
                .map_err(|e| {
                    anyhow::anyhow!("account {account}: a session row ({kind}/{k}) {e}")
                })?;
            let v = new.for_account(account.as_str()).seal(kind, &k, &plain);
            accounts.insert(account.clone());
            resealed.sessions.push((account, kind, k, v));
        }
        let (from, to) = (old.for_webhooks(), new.for_webhooks());
        for (place, bound, v) in all.webhook_secrets {
            let secret = if bound {
                from.open(&place, &v)
            } else {
                from.open_unbound(place.webhook, &v)
            }
            .map_err(|e| anyhow::anyhow!("webhook {}: its secret {e}", place.webhook))?;
            resealed
                .webhook_secrets
                .push((place, true, to.seal(&place, &secret)));
        }
    }
    sealed.reseal(&resealed, &new.id()).await?;
    // Committed: the database now expects the new key.
    let old_file = with_suffix(&path, ".old");
    let moved_old = match std::fs::rename(&path, &old_file) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => {
            return Err(e).with_context(|| format!("moving the old key to {}", old_file.display()))
        }
    };
    std::fs::rename(&new_path, &path)
        .with_context(|| format!("moving the new key to {}", path.display()))?;
    crate::token::sync_dir_of(&path)?;
    sql.close().await;
    drop(lock);
    Ok(Rekeyed {
        rows: resealed.sessions.len(),
        accounts: accounts.len(),
        webhook_secrets: resealed.webhook_secrets.len(),
        old_id: old.map(|k| k.id()),
        new_id: new.id(),
        key_file: path,
        old_file: moved_old.then_some(old_file),
    })
}
