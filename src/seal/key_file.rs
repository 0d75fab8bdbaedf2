//! Which key a daemon may seal and open with, decided at start-up before
//! anything else touches the database.
//!
//! The database records the id of its key (`wa_session_key`) at the first
//! start, before anything is sealed. From then on a daemon starts only
//! with that key: a daemon of the same cluster with another key file, or
//! with none, stops naming both key ids, even when nothing is sealed yet
//! (a new key does not quietly take over: what one daemon sealed the
//! others could not open). A `herald whatsapp rekey` that stopped between
//! its commit and its renames leaves the expected key in `<file>.new`; the
//! error then names that file and the renames that finish the rekey.

use super::SessionKey;
use crate::store::sealed::Sealed;
use crate::token::beside;
use anyhow::bail;
use std::path::{Path, PathBuf};

/// `path` with `suffix` appended to its file name (`….new`, `….old`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The key a daemon starts with: the file at `path`, made (0600) and
/// recorded on the first start of the database. A missing file or another
/// key than the recorded one stops start-up, naming the file, both key
/// ids and what to do.
pub async fn open_key(path: &Path, sealed: &Sealed) -> anyhow::Result<SessionKey> {
    let recorded = sealed.key_id().await?;
    let key = match (SessionKey::load(path)?, &recorded) {
        (Some(k), _) => k,
        (None, Some(id)) => bail!(missing(path, id, sealed).await?),
        (None, None) => match SessionKey::create(path) {
            Ok(k) => {
                tracing::info!(path = %path.display(), key = %k.id(), "generated the session key");
                k
            }
            // Another daemon on the same file made it a moment before.
            Err(e) => SessionKey::load(path)?.ok_or(e)?,
        },
    };
    match recorded {
        Some(id) if id == key.id() => {}
        Some(id) => bail!(other_key(path, &key, &id, sealed).await?),
        // The first start on this database: recorded now, before anything
        // is sealed. Another daemon starting at the same moment with
        // another key may have recorded its own first.
        None => {
            let id = sealed.record_key_id(&key.id()).await?;
            if id != key.id() {
                bail!(other_key(path, &key, &id, sealed).await?);
            }
            tracing::info!(key = %id, "recorded the session key's id in the database");
        }
    }
    Ok(key)
}

/// The rekey that stopped after its commit: `<path>.new` holds the key the
/// database expects.
fn interrupted_rekey(path: &Path, recorded: &str) -> anyhow::Result<Option<PathBuf>> {
    let new = beside(path, ".new");
    Ok(SessionKey::load(&new)?
        .filter(|k| k.id() == recorded)
        .map(|_| new))
}

async fn missing(path: &Path, id: &str, sealed: &Sealed) -> anyhow::Result<String> {
    let shown = path.display();
    if let Some(new) = interrupted_rekey(path, id)? {
        return Ok(format!(
            "whatsapp.session_key_file {shown} does not exist, and the database expects key \
             {id}, which is in {new}: `herald whatsapp rekey` re-sealed the database under it \
             and stopped before moving the key files. Finish the rekey (daemons stopped): \
             mv {new} {shown}",
            new = new.display()
        ));
    }
    Ok(if sealed.any_sealed().await? {
        format!(
            "whatsapp.session_key_file {shown} does not exist, but the WhatsApp sessions and \
             webhook secrets in the database are sealed under key {id}: copy that key file \
             here from the daemon that made it (every daemon of a cluster needs the same \
             file). Without it the accounts must pair again and the webhooks need new secrets."
        )
    } else {
        format!(
            "whatsapp.session_key_file {shown} does not exist, but this database's session \
             key is {id}, recorded by the daemon that first started on it (nothing is sealed \
             under it yet): copy that daemon's key file here (every daemon of a cluster needs \
             the same file). If key {id} is lost, `herald whatsapp rekey` (daemons stopped) \
             records a new key."
        )
    })
}

async fn other_key(
    path: &Path,
    key: &SessionKey,
    id: &str,
    sealed: &Sealed,
) -> anyhow::Result<String> {
    let (shown, ours) = (path.display(), key.id());
    if let Some(new) = interrupted_rekey(path, id)? {
        return Ok(format!(
            "whatsapp.session_key_file {shown} holds key {ours}, but the database expects key \
             {id}, which is in {new}: `herald whatsapp rekey` re-sealed the database under it \
             and stopped before moving the key files. Finish the rekey (daemons stopped): \
             mv {shown} {old} && mv {new} {shown}",
            new = new.display(),
            old = beside(path, ".old").display()
        ));
    }
    Ok(if sealed.any_sealed().await? {
        format!(
            "whatsapp.session_key_file {shown} holds key {ours}, but the WhatsApp sessions and \
             webhook secrets in the database are sealed under key {id}: put back the key file \
             they were sealed with (every daemon of a cluster needs the same file); with it in \
             place, `herald whatsapp rekey` moves them to a new key"
        )
    } else {
        format!(
            "whatsapp.session_key_file {shown} holds key {ours}, but this database's session \
             key is {id}, recorded by the daemon that first started on it (nothing is sealed \
             under it yet): every daemon of a cluster needs the same key file, so copy that \
             daemon's file (key {id}) here. If key {id} is lost, `herald whatsapp rekey` \
             (daemons stopped) records a new key."
        )
    })
}
