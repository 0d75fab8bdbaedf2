//! Where the WhatsApp gateway keeps sessions: the shared database, sealed
//! under the session key. Opens each account's [`SessionBackend`], answers
//! whether an account has a stored device, forgets one, and checks at
//! start-up that this daemon holds the key the sessions were sealed with.

use super::backend::{kind, SessionBackend};
use super::seal::SessionKey;
use crate::store::whatsapp::WaRows;
use anyhow::bail;
use herald_actors::delivery::leases::LeaseTable;
use herald_actors::domain::AccountId;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The session rows, the key, and (several daemons) the leases every write
/// runs under. Cheap to clone.
#[derive(Clone)]
pub struct SessionStore {
    rows: WaRows,
    key: SessionKey,
    leases: Arc<OnceLock<Arc<LeaseTable>>>,
}

impl SessionStore {
    pub fn new(rows: WaRows, key: SessionKey) -> Self {
        Self {
            rows,
            key,
            leases: Arc::default(),
        }
    }

    /// Several daemons: from now on every session write checks the
    /// account's lease, and only the lease holder opens a session.
    pub fn set_leases(&self, leases: Arc<LeaseTable>) {
        let _ = self.leases.set(leases);
    }

    pub fn leases(&self) -> Option<&Arc<LeaseTable>> {
        self.leases.get()
    }

    /// The cell the leases are set in, for what must follow them.
    pub fn leases_cell(&self) -> Arc<OnceLock<Arc<LeaseTable>>> {
        self.leases.clone()
    }

    pub fn rows(&self) -> &WaRows {
        &self.rows
    }

    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    /// The storage whatsapp-rust's client of `account` runs on.
    pub fn backend(&self, account: &AccountId) -> SessionBackend {
        SessionBackend::new(
            self.rows.clone(),
            account.clone(),
            self.key.for_account(account.as_str()),
            self.leases.get().cloned(),
        )
    }

    /// Whether the account has a stored device (a login, or a pairing that
    /// got as far as making its keys).
    pub async fn stored(&self, account: &AccountId) -> Result<bool, String> {
        self.rows
            .get(account, kind::DEVICE, "")
            .await
            .map(|r| r.is_some())
            .map_err(|e| format!("reading the session of {account}: {e}"))
    }

    /// Forgets the account's session (it pairs as a new device, or was
    /// deleted), under its lease when leases are on.
    pub async fn wipe(&self, account: &AccountId) -> Result<(), String> {
        let fence = match self.leases.get() {
            Some(t) => Some(t.fence(account).ok_or_else(|| {
                format!("account {account} is not leased to this daemon; its session is kept")
            })?),
            None => None,
        };
        self.rows
            .clear(account, fence.as_ref())
            .await
            .map_err(|e| format!("forgetting the session of {account}: {e}"))
    }
}

/// The session key a daemon starts with: the file at `path`, made (0600)
/// on the first start when the database holds no sessions yet. A missing
/// file or another key than the one the stored sessions were sealed with
/// stops start-up, naming the key file.
pub async fn open_key(path: &Path, rows: &WaRows) -> anyhow::Result<SessionKey> {
    let recorded = rows.key_id().await?;
    let sealed = rows.any_sealed().await?;
    let shown = path.display();
    let key = match (SessionKey::load(path)?, &recorded) {
        (Some(k), _) => k,
        (None, Some(id)) if sealed => bail!(
            "whatsapp.session_key_file {shown} does not exist, but the WhatsApp sessions in \
             the database are sealed under key {id}: copy that key file here from the daemon \
             that made it (every daemon of a cluster needs the same file). Without it the \
             accounts must pair again."
        ),
        (None, _) => {
            let k = SessionKey::create(path)?;
            tracing::info!(path = %shown, key = %k.id(), "generated the WhatsApp session key");
            k
        }
    };
    match recorded {
        Some(id) if id == key.id() => {}
        Some(id) if sealed => bail!(
            "whatsapp.session_key_file {shown} holds key {}, but the WhatsApp sessions in the \
             database are sealed under key {id}: put back the key file they were sealed \
             with (every daemon of a cluster needs the same file), or re-seal them with \
             `herald whatsapp rekey`",
            key.id()
        ),
        // Nothing is sealed yet: this key is as good as any, and is recorded
        // (a daemon that pairs an account seals it under its own key; every
        // daemon of a cluster needs the same file, as the README says).
        _ => rows.reseal(&[], &key.id()).await?,
    }
    Ok(key)
}
