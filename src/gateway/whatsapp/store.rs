//! Where the WhatsApp gateway keeps sessions: the shared database, sealed
//! under the session key (which key a daemon may use is decided at
//! start-up by [`crate::seal::key_file`]). Opens each account's
//! [`SessionBackend`], answers whether an account has a stored device, and
//! forgets one.

use super::backend::{kind, SessionBackend};
use super::known::Known;
use crate::seal::SessionKey;
use crate::store::whatsapp::WaRows;
use herald_actors::delivery::leases::LeaseTable;
use herald_actors::domain::AccountId;
use std::sync::Arc;

/// The session rows, the key, and (several daemons) the leases every write
/// runs under. Cheap to clone.
#[derive(Clone)]
pub struct SessionStore {
    rows: WaRows,
    key: SessionKey,
    /// Several daemons: the leases every session write runs under.
    leases: Option<Arc<LeaseTable>>,
    /// Each account's known session keys, shared by its backends.
    known: Arc<dashmap::DashMap<AccountId, Arc<Known>>>,
}

impl SessionStore {
    pub fn new(rows: WaRows, key: SessionKey) -> Self {
        Self {
            rows,
            key,
            leases: None,
            known: Default::default(),
        }
    }

    /// Several daemons: every session write checks the account's lease,
    /// and only the lease holder opens a session.
    pub fn with_leases(mut self, leases: Arc<LeaseTable>) -> Self {
        self.leases = Some(leases);
        self
    }

    pub fn leases(&self) -> Option<&Arc<LeaseTable>> {
        self.leases.as_ref()
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
            self.leases.clone(),
            self.known(account),
        )
    }

    fn known(&self, account: &AccountId) -> Arc<Known> {
        self.known
            .entry(account.clone())
            .or_insert_with(|| {
                Arc::new(Known::new([
                    kind::SESSION,
                    kind::DEVICE_LIST,
                    kind::IDENTITY,
                ]))
            })
            .clone()
    }

    /// The account's rows were changed other than through its backends
    /// (imported, wiped): what was read of its keys is forgotten.
    pub fn changed_outside(&self, account: &AccountId) {
        if let Some(known) = self.known.get(account) {
            known.forget();
        }
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
        let fence = match &self.leases {
            Some(t) => Some(t.fence(account).ok_or_else(|| {
                format!("account {account} is not leased to this daemon; its session is kept")
            })?),
            None => None,
        };
        let cleared = self
            .rows
            .clear(account, fence.as_ref())
            .await
            .map_err(|e| format!("forgetting the session of {account}: {e}"));
        self.changed_outside(account);
        cleared
    }
}
