//! whatsapp-rust's storage (`Backend`: the signal, app-state, protocol,
//! message-secret and device stores) on Herald's own database, so every
//! daemon of a cluster reads the same session and any of them can log an
//! account in after a takeover.
//!
//! Each item is a row of `wa_session_rows` (`crate::store::whatsapp`),
//! sealed per account ([`crate::seal`]). Every write runs under the
//! account's lease when leases are on: a daemon that lost the account can
//! no longer change its ratchets behind the new owner's back.

use crate::seal::AccountSeal;
use crate::store::whatsapp::{Op, Row, WaRows};
use async_trait::async_trait;
use herald_actors::delivery::leases::LeaseTable;
use herald_actors::domain::{AccountId, Fence};
use std::collections::HashMap;
use std::sync::Arc;
use whatsapp_rust::bytes::Bytes;
use whatsapp_rust::wacore::appstate::hash::HashState;
use whatsapp_rust::wacore::appstate::processor::AppStateMutationMAC;
use whatsapp_rust::wacore::store::error::{Result, StoreError as WaError};
use whatsapp_rust::wacore::store::traits::*;
use whatsapp_rust::wacore::store::Device;

/// What a row is (`wa_session_rows.kind`). Stored: never renumber.
pub mod kind {
    pub const DEVICE: i32 = 1;
    pub const IDENTITY: i32 = 2;
    pub const SESSION: i32 = 3;
    pub const PREKEY: i32 = 4;
    pub const SIGNED_PREKEY: i32 = 5;
    pub const SENDER_KEY: i32 = 6;
    pub const SYNC_KEY: i32 = 7;
    pub const APP_VERSION: i32 = 8;
    pub const MUTATION_MAC: i32 = 9;
    pub const LID_MAPPING: i32 = 10;
    pub const BASE_KEY: i32 = 11;
    pub const DEVICE_LIST: i32 = 12;
    pub const GROUP_METADATA: i32 = 13;
    pub const TC_TOKEN: i32 = 14;
    pub const SENT_MESSAGE: i32 = 15;
    pub const MSG_SECRET: i32 = 16;
    pub const PENDING_INBOUND: i32 = 17;
}

/// Joins the parts of a composite key (JIDs and message ids never hold it).
const SEP: char = '\u{1f}';

fn key2(a: &str, b: &str) -> String {
    format!("{a}{SEP}{b}")
}

fn key3(a: &str, b: &str, c: &str) -> String {
    format!("{a}{SEP}{b}{SEP}{c}")
}

/// The user part of a Signal address (`user@server`, `user:dev@server`):
/// what `has_signal_state_for_user` asks about.
pub(super) fn user_of(address: &str) -> &str {
    let end = address.find(['@', ':']).unwrap_or(address.len());
    &address[..end]
}

fn db_err(e: impl std::error::Error + Send + Sync + 'static) -> WaError {
    WaError::Database(Box::new(e))
}

fn ser_err(e: impl std::error::Error + Send + Sync + 'static) -> WaError {
    WaError::Serialization(Box::new(e))
}

fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// One account's session store.
pub struct SessionBackend {
    rows: WaRows,
    account: AccountId,
    seal: AccountSeal,
    /// Several daemons: whose lease every write runs under.
    leases: Option<Arc<LeaseTable>>,
    /// Read-modify-writes of this account (tc tokens, message secrets) one
    /// at a time; the lease makes this process their only writer.
    rmw: tokio::sync::Mutex<()>,
    /// The cutoff each retention sweep last ran with, by [`Sweep`].
    swept: [std::sync::atomic::AtomicI64; 3],
    /// Single-row reads that arrive together go as one statement.
    gather: super::gather::Gather,
    /// The session, device-list and identity keys the account has (shared
    /// by its backends in this process): a read of one it lacks asks no
    /// database.
    known: Arc<super::known::Known>,
}

/// The retention sweeps whatsapp-rust asks for on every twelfth keep-alive
/// (about every 4.5 minutes per account): three write transactions each
/// time, which at 5,000 idle accounts were 55 a second on a database with
/// nothing to delete. A sweep runs only once its cutoff has moved
/// [`SWEEP_EVERY`] seconds past the last one's (so about hourly per
/// account); an expired row stays that much longer at most.
#[derive(Clone, Copy)]
enum Sweep {
    SentMessages = 0,
    PendingInbound = 1,
    MessageSecrets = 2,
}

const SWEEP_EVERY: i64 = 3600;
const NEVER_SWEPT: i64 = i64::MIN;

impl SessionBackend {
    pub fn new(
        rows: WaRows,
        account: AccountId,
        seal: AccountSeal,
        leases: Option<Arc<LeaseTable>>,
        known: Arc<super::known::Known>,
    ) -> Self {
        Self {
            rows,
            account,
            seal,
            leases,
            known,
            rmw: tokio::sync::Mutex::new(()),
            swept: std::array::from_fn(|_| NEVER_SWEPT.into()),
            gather: Default::default(),
        }
    }

    /// Whether a sweep up to `cutoff` is due: the first, or one whose
    /// cutoff moved [`SWEEP_EVERY`] past the last one's. Marks it run.
    fn sweep_due(&self, sweep: Sweep, cutoff: i64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let last = &self.swept[sweep as usize];
        let before = last.load(Relaxed);
        let due = before == NEVER_SWEPT || cutoff.saturating_sub(before) >= SWEEP_EVERY;
        due && last
            .compare_exchange(before, cutoff, Relaxed, Relaxed)
            .is_ok()
    }

    /// The fence to write under; an error once the lease is gone.
    fn fence(&self) -> Result<Option<Fence>> {
        match &self.leases {
            None => Ok(None),
            Some(t) => t.fence(&self.account).map(Some).ok_or_else(|| {
                db_err(herald_actors::ports::StoreError::Fenced(format!(
                    "account {} is not leased to daemon {}: its WhatsApp session is not written",
                    self.account,
                    t.node()
                )))
            }),
        }
    }

    async fn write(&self, ops: Vec<Op>) -> Result<u64> {
        if ops.is_empty() {
            return Ok(0);
        }
        let fence = self.fence()?;
        // Before the write is sent, so a read of the keys racing it never
        // misses one of these.
        self.known.writing(ops.iter().filter_map(|op| match op {
            Op::Put { kind, k, .. } => Some((*kind, k.as_str())),
            _ => None,
        }));
        self.rows
            .write(&self.account, fence.as_ref(), ops)
            .await
            .map_err(db_err)
    }

    /// A row to write, sealed (also the import of a legacy session file).
    pub(super) fn put(&self, kind: i32, k: String, g: String, n: i64, plain: &[u8]) -> Op {
        let v = self.seal.seal(kind, &k, plain);
        Op::Put { kind, k, g, n, v }
    }

    fn open(&self, kind: i32, row: &Row) -> Result<Vec<u8>> {
        self.seal.open(kind, &row.k, &row.v).map_err(|e| {
            WaError::Validation(format!(
                "account {}: a stored session row ({kind}/{}) {e}",
                self.account, row.k
            ))
        })
    }

    /// The row `kind`/`k`: "none" at once where the account is known not
    /// to have it, else read (gathered with the reads beside it).
    async fn row(&self, kind: i32, k: &str) -> Result<Option<Row>> {
        use super::known::Ask;
        // Without the lease nothing is known: the database answers.
        let fence = self.fence().ok();
        if let Some(f) = &fence {
            if self.known.ask(kind, k, f) == Ask::Absent {
                return Ok(None);
            }
        }
        let row = self
            .gather
            .get(&self.rows, &self.account, kind, k)
            .await
            .map_err(db_err)?;
        if row.is_none() {
            if let Some(reading) = self.known.missed(kind, std::time::Instant::now()) {
                self.read_keys(kind, reading).await;
            }
        }
        Ok(row)
    }

    /// Reads the keys of `kind` the account has, for [`Self::row`].
    async fn read_keys(&self, kind: i32, reading: super::known::Reading) {
        // The fence first: keys read after a move elsewhere and back are
        // then under an older fence than the lease's, and go unused.
        let Ok(fence) = self.fence() else {
            self.known.read_failed(kind, reading);
            return;
        };
        match self.rows.keys(&self.account, kind).await {
            Ok(keys) => self.known.read(kind, reading, fence, &keys),
            Err(e) => {
                tracing::debug!(account = %self.account, kind, error = %e, "the session keys were not read");
                self.known.read_failed(kind, reading);
            }
        }
    }

    async fn get(&self, kind: i32, k: &str) -> Result<Option<Vec<u8>>> {
        match self.row(kind, k).await? {
            Some(row) => self.open(kind, &row).map(Some),
            None => Ok(None),
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        kind: i32,
        k: &str,
    ) -> Result<Option<T>> {
        match self.get(kind, k).await? {
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(ser_err),
            None => Ok(None),
        }
    }

    pub(super) fn put_json<T: serde::Serialize>(
        &self,
        kind: i32,
        k: String,
        g: String,
        n: i64,
        v: &T,
    ) -> Result<Op> {
        let bytes = serde_json::to_vec(v).map_err(ser_err)?;
        Ok(self.put(kind, k, g, n, &bytes))
    }

    async fn delete(&self, kind: i32, k: &str) -> Result<()> {
        self.write(vec![Op::Delete {
            kind,
            k: k.to_owned(),
        }])
        .await
        .map(|_| ())
    }

    fn key32(&self, b: Vec<u8>) -> Result<[u8; 32]> {
        b.try_into().map_err(|b: Vec<u8>| {
            WaError::Validation(format!(
                "a stored identity key is {} bytes, not 32",
                b.len()
            ))
        })
    }
}

fn id_key(id: u32) -> String {
    // Zero-padded so key order is number order.
    format!("{id:010}")
}

#[async_trait]
impl SignalStore for SessionBackend {
    async fn put_identity(&self, address: &str, key: [u8; 32]) -> Result<()> {
        let op = self.put(
            kind::IDENTITY,
            address.into(),
            user_of(address).into(),
            0,
            &key,
        );
        self.write(vec![op]).await.map(|_| ())
    }

    async fn put_identities_batch(&self, identities: &[(Arc<str>, [u8; 32])]) -> Result<()> {
        let ops = identities
            .iter()
            .map(|(a, key)| self.put(kind::IDENTITY, a.to_string(), user_of(a).into(), 0, key))
            .collect();
        self.write(ops).await.map(|_| ())
    }

    async fn load_identity(&self, address: &str) -> Result<Option<[u8; 32]>> {
        self.get(kind::IDENTITY, address)
            .await?
            .map(|b| self.key32(b))
            .transpose()
    }

    async fn delete_identity(&self, address: &str) -> Result<()> {
        self.delete(kind::IDENTITY, address).await
    }

    async fn get_session(&self, address: &str) -> Result<Option<Bytes>> {
        Ok(self.get(kind::SESSION, address).await?.map(Bytes::from))
    }

    async fn put_session(&self, address: &str, session: &[u8]) -> Result<()> {
        let op = self.put(
            kind::SESSION,
            address.into(),
            user_of(address).into(),
            0,
            session,
        );
        self.write(vec![op]).await.map(|_| ())
    }

    async fn put_sessions_batch(&self, sessions: &[(Arc<str>, Bytes)]) -> Result<()> {
        let ops = sessions
            .iter()
            .map(|(a, s)| self.put(kind::SESSION, a.to_string(), user_of(a).into(), 0, s))
            .collect();
        self.write(ops).await.map(|_| ())
    }

    async fn delete_session(&self, address: &str) -> Result<()> {
        self.delete(kind::SESSION, address).await
    }

    async fn has_session(&self, address: &str) -> Result<bool> {
        Ok(self.row(kind::SESSION, address).await?.is_some())
    }

    async fn has_signal_state_for_user(&self, user: &str) -> Result<bool> {
        self.rows
            .any_with_g(&self.account, &[kind::SESSION, kind::IDENTITY], user)
            .await
            .map_err(db_err)
    }

    async fn store_prekey(&self, id: u32, record: &[u8], uploaded: bool) -> Result<()> {
        let op = self.put(kind::PREKEY, id_key(id), flag(uploaded), id.into(), record);
        self.write(vec![op]).await.map(|_| ())
    }

    async fn store_prekeys_batch(&self, keys: &[(u32, Bytes)], uploaded: bool) -> Result<()> {
        let ops = keys
            .iter()
            .map(|(id, r)| self.put(kind::PREKEY, id_key(*id), flag(uploaded), (*id).into(), r))
            .collect();
        self.write(ops).await.map(|_| ())
    }

    async fn load_prekey(&self, id: u32) -> Result<Option<Bytes>> {
        Ok(self.get(kind::PREKEY, &id_key(id)).await?.map(Bytes::from))
    }

    async fn load_prekeys_batch(&self, ids: &[u32]) -> Result<Vec<(u32, Bytes)>> {
        let ks: Vec<String> = ids.iter().map(|i| id_key(*i)).collect();
        let rows = self
            .rows
            .get_many(&self.account, kind::PREKEY, &ks)
            .await
            .map_err(db_err)?;
        rows.iter()
            .map(|r| Ok((r.n as u32, Bytes::from(self.open(kind::PREKEY, r)?))))
            .collect()
    }

    async fn mark_prekeys_uploaded(&self, ids: &[u32]) -> Result<()> {
        let ks = ids.iter().map(|i| id_key(*i)).collect();
        self.write(vec![Op::SetG {
            kind: kind::PREKEY,
            ks,
            g: flag(true),
        }])
        .await
        .map(|_| ())
    }

    async fn remove_prekey(&self, id: u32) -> Result<()> {
        self.delete(kind::PREKEY, &id_key(id)).await
    }

    async fn get_max_prekey_id(&self) -> Result<u32> {
        let m = self
            .rows
            .max_n(&self.account, kind::PREKEY)
            .await
            .map_err(db_err)?;
        Ok(u32::try_from(m).unwrap_or(0))
    }

    async fn store_signed_prekey(&self, id: u32, record: &[u8]) -> Result<()> {
        let op = self.put(
            kind::SIGNED_PREKEY,
            id_key(id),
            String::new(),
            id.into(),
            record,
        );
        self.write(vec![op]).await.map(|_| ())
    }

    async fn load_signed_prekey(&self, id: u32) -> Result<Option<Vec<u8>>> {
        self.get(kind::SIGNED_PREKEY, &id_key(id)).await
    }

    async fn load_all_signed_prekeys(&self) -> Result<Vec<(u32, Vec<u8>)>> {
        let rows = self
            .rows
            .list(&self.account, kind::SIGNED_PREKEY)
            .await
            .map_err(db_err)?;
        rows.iter()
            .map(|r| Ok((r.n as u32, self.open(kind::SIGNED_PREKEY, r)?)))
            .collect()
    }

    async fn remove_signed_prekey(&self, id: u32) -> Result<()> {
        self.delete(kind::SIGNED_PREKEY, &id_key(id)).await
    }

    async fn put_sender_key(&self, address: &str, record: &[u8]) -> Result<()> {
        let op = self.put(kind::SENDER_KEY, address.into(), String::new(), 0, record);
        self.write(vec![op]).await.map(|_| ())
    }

    async fn put_sender_keys_batch(&self, sender_keys: &[(Arc<str>, Bytes)]) -> Result<()> {
        let ops = sender_keys
            .iter()
            .map(|(a, r)| self.put(kind::SENDER_KEY, a.to_string(), String::new(), 0, r))
            .collect();
        self.write(ops).await.map(|_| ())
    }

    async fn get_sender_key(&self, address: &str) -> Result<Option<Vec<u8>>> {
        self.get(kind::SENDER_KEY, address).await
    }

    async fn delete_sender_key(&self, address: &str) -> Result<()> {
        self.delete(kind::SENDER_KEY, address).await
    }
}

/// `g` of a pre-key: whether it was uploaded.
fn flag(uploaded: bool) -> String {
    if uploaded { "1" } else { "0" }.to_owned()
}

/// Deletes the rows of `kind` whose `n` (a time) is before `cutoff`,
/// answering how many went.
async fn expired(b: &SessionBackend, kind: i32, cutoff: i64) -> Result<u32> {
    count(
        b.write(vec![Op::DeleteByN {
            kind,
            cutoff,
            inclusive: false,
            keep_zero: false,
        }])
        .await?,
    )
}

fn count(n: u64) -> Result<u32> {
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

#[async_trait]
impl AppSyncStore for SessionBackend {
    async fn get_sync_key(&self, key_id: &[u8]) -> Result<Option<AppStateSyncKey>> {
        self.get_json(kind::SYNC_KEY, &hex::encode(key_id)).await
    }

    async fn set_sync_key(&self, key_id: &[u8], key: AppStateSyncKey) -> Result<()> {
        let op = self.put_json(
            kind::SYNC_KEY,
            hex::encode(key_id),
            String::new(),
            key.timestamp,
            &key,
        )?;
        self.write(vec![op]).await.map(|_| ())
    }

    async fn get_version(&self, name: &str) -> Result<HashState> {
        Ok(self
            .get_json(kind::APP_VERSION, name)
            .await?
            .unwrap_or_default())
    }

    async fn set_version(&self, name: &str, state: HashState) -> Result<()> {
        let op = self.put_json(
            kind::APP_VERSION,
            name.into(),
            String::new(),
            state.version as i64,
            &state,
        )?;
        self.write(vec![op]).await.map(|_| ())
    }

    async fn put_mutation_macs(
        &self,
        name: &str,
        version: u64,
        mutations: &[AppStateMutationMAC],
    ) -> Result<()> {
        let ops = mutations
            .iter()
            .map(|m| {
                self.put(
                    kind::MUTATION_MAC,
                    key2(name, &hex::encode(&m.index_mac)),
                    name.into(),
                    version as i64,
                    &m.value_mac,
                )
            })
            .collect();
        self.write(ops).await.map(|_| ())
    }

    async fn get_mutation_mac(&self, name: &str, index_mac: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get(kind::MUTATION_MAC, &key2(name, &hex::encode(index_mac)))
            .await
    }

    async fn get_mutation_macs(
        &self,
        name: &str,
        index_macs: &[[u8; 32]],
    ) -> Result<HashMap<[u8; 32], Vec<u8>>> {
        let ks: Vec<String> = index_macs
            .iter()
            .map(|m| key2(name, &hex::encode(m)))
            .collect();
        let rows = self
            .rows
            .get_many(&self.account, kind::MUTATION_MAC, &ks)
            .await
            .map_err(db_err)?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in &rows {
            let Some(i) = ks.iter().position(|k| *k == r.k) else {
                continue;
            };
            out.insert(index_macs[i], self.open(kind::MUTATION_MAC, r)?);
        }
        Ok(out)
    }

    async fn delete_mutation_macs(&self, name: &str, index_macs: &[Vec<u8>]) -> Result<()> {
        let ops = index_macs
            .iter()
            .map(|m| Op::Delete {
                kind: kind::MUTATION_MAC,
                k: key2(name, &hex::encode(m)),
            })
            .collect();
        self.write(ops).await.map(|_| ())
    }

    async fn clear_mutation_macs(&self, name: &str) -> Result<()> {
        self.write(vec![Op::DeleteByG {
            kind: kind::MUTATION_MAC,
            g: name.into(),
        }])
        .await
        .map(|_| ())
    }

    async fn get_latest_sync_key_id(&self) -> Result<Option<Vec<u8>>> {
        // As WhatsApp Web: the highest key id whose key opens.
        let rows = self
            .rows
            .list(&self.account, kind::SYNC_KEY)
            .await
            .map_err(db_err)?;
        for r in rows.iter().rev() {
            let ok = self
                .open(kind::SYNC_KEY, r)
                .ok()
                .and_then(|b| serde_json::from_slice::<AppStateSyncKey>(&b).ok())
                .is_some();
            if ok {
                return hex::decode(&r.k).map(Some).map_err(ser_err);
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl ProtocolStore for SessionBackend {
    async fn store_sent_message(
        &self,
        chat_jid: &str,
        message_id: &str,
        payload: &[u8],
    ) -> Result<()> {
        let op = self.put(
            kind::SENT_MESSAGE,
            key2(chat_jid, message_id),
            String::new(),
            now_secs(),
            payload,
        );
        self.write(vec![op]).await.map(|_| ())
    }

    async fn take_sent_message(&self, chat_jid: &str, message_id: &str) -> Result<Option<Vec<u8>>> {
        let fence = self.fence()?;
        let k = key2(chat_jid, message_id);
        match self
            .rows
            .take(&self.account, fence.as_ref(), kind::SENT_MESSAGE, &k)
            .await
            .map_err(db_err)?
        {
            Some(row) => self.open(kind::SENT_MESSAGE, &row).map(Some),
            None => Ok(None),
        }
    }

    async fn delete_expired_sent_messages(&self, cutoff_timestamp: i64) -> Result<u32> {
        if !self.sweep_due(Sweep::SentMessages, cutoff_timestamp) {
            return Ok(0);
        }
        expired(self, kind::SENT_MESSAGE, cutoff_timestamp).await
    }

    async fn store_pending_inbound(
        &self,
        chat: &str,
        sender: &str,
        id: &str,
        message: &[u8],
    ) -> Result<()> {
        let op = self.put(
            kind::PENDING_INBOUND,
            key3(chat, sender, id),
            String::new(),
            now_secs(),
            message,
        );
        self.write(vec![op]).await.map(|_| ())
    }

    async fn get_pending_inbound(
        &self,
        chat: &str,
        sender: &str,
        id: &str,
    ) -> Result<Option<Vec<u8>>> {
        self.get(kind::PENDING_INBOUND, &key3(chat, sender, id))
            .await
    }

    async fn delete_pending_inbound(&self, chat: &str, sender: &str, id: &str) -> Result<()> {
        self.delete(kind::PENDING_INBOUND, &key3(chat, sender, id))
            .await
    }

    async fn delete_expired_pending_inbound(&self, cutoff_timestamp: i64) -> Result<u32> {
        if !self.sweep_due(Sweep::PendingInbound, cutoff_timestamp) {
            return Ok(0);
        }
        expired(self, kind::PENDING_INBOUND, cutoff_timestamp).await
    }

    async fn store_pending_inbound_batch(&self, rows: &[PendingInboundRow<'_>]) -> Result<()> {
        let now = now_secs();
        let ops = rows
            .iter()
            .map(|r| {
                self.put(
                    kind::PENDING_INBOUND,
                    key3(r.chat, r.sender, r.id),
                    String::new(),
                    now,
                    r.message,
                )
            })
            .collect();
        self.write(ops).await.map(|_| ())
    }

    async fn delete_pending_inbound_batch(&self, keys: &[PendingInboundKey<'_>]) -> Result<()> {
        let ops = keys
            .iter()
            .map(|k| Op::Delete {
                kind: kind::PENDING_INBOUND,
                k: key3(k.chat, k.sender, k.id),
            })
            .collect();
        self.write(ops).await.map(|_| ())
    }

    async fn get_sender_key_devices(&self, group_jid: &str) -> Result<Vec<(String, bool)>> {
        self.rows
            .sender_keys(&self.account, group_jid)
            .await
            .map_err(db_err)
    }

    async fn set_sender_key_status(&self, group_jid: &str, entries: &[(&str, bool)]) -> Result<()> {
        self.write(vec![Op::SenderKeys {
            group: group_jid.into(),
            entries: entries.iter().map(|(d, h)| ((*d).to_owned(), *h)).collect(),
        }])
        .await
        .map(|_| ())
    }

    async fn clear_sender_key_devices(&self, group_jid: &str) -> Result<()> {
        self.write(vec![Op::ClearSenderKeys {
            group: Some(group_jid.into()),
        }])
        .await
        .map(|_| ())
    }

    async fn delete_sender_key_device_rows(&self, device_jids: &[&str]) -> Result<()> {
        self.write(vec![Op::DropSenderKeyDevices {
            devices: device_jids.iter().map(|d| (*d).to_owned()).collect(),
        }])
        .await
        .map(|_| ())
    }

    async fn clear_all_sender_key_devices(&self) -> Result<()> {
        self.write(vec![Op::ClearSenderKeys { group: None }])
            .await
            .map(|_| ())
    }

    async fn get_lid_mapping(&self, lid: &str) -> Result<Option<LidPnMappingEntry>> {
        self.get_json(kind::LID_MAPPING, lid).await
    }

    async fn get_pn_mapping(&self, phone: &str) -> Result<Option<LidPnMappingEntry>> {
        let rows = self
            .rows
            .by_g(&self.account, kind::LID_MAPPING, phone, 1)
            .await
            .map_err(db_err)?;
        match rows.first() {
            Some(r) => serde_json::from_slice(&self.open(kind::LID_MAPPING, r)?)
                .map(Some)
                .map_err(ser_err),
            None => Ok(None),
        }
    }

    async fn put_lid_mapping(&self, entry: &LidPnMappingEntry) -> Result<()> {
        self.put_lid_mappings(std::slice::from_ref(entry)).await
    }

    async fn put_lid_mappings(&self, entries: &[LidPnMappingEntry]) -> Result<()> {
        let ops = entries
            .iter()
            .map(|e| {
                self.put_json(
                    kind::LID_MAPPING,
                    e.lid.clone(),
                    e.phone_number.clone(),
                    e.updated_at,
                    e,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        self.write(ops).await.map(|_| ())
    }

    async fn get_all_lid_mappings(&self) -> Result<Vec<LidPnMappingEntry>> {
        let rows = self
            .rows
            .list(&self.account, kind::LID_MAPPING)
            .await
            .map_err(db_err)?;
        rows.iter()
            .map(|r| serde_json::from_slice(&self.open(kind::LID_MAPPING, r)?).map_err(ser_err))
            .collect()
    }

    async fn save_base_key(&self, address: &str, message_id: &str, base_key: &[u8]) -> Result<()> {
        let op = self.put(
            kind::BASE_KEY,
            key2(address, message_id),
            String::new(),
            now_secs(),
            base_key,
        );
        self.write(vec![op]).await.map(|_| ())
    }

    async fn has_same_base_key(
        &self,
        address: &str,
        message_id: &str,
        current_base_key: &[u8],
    ) -> Result<bool> {
        Ok(self
            .get(kind::BASE_KEY, &key2(address, message_id))
            .await?
            .is_some_and(|saved| saved == current_base_key))
    }

    async fn delete_base_key(&self, address: &str, message_id: &str) -> Result<()> {
        self.delete(kind::BASE_KEY, &key2(address, message_id))
            .await
    }

    async fn update_device_list(&self, record: DeviceListRecord) -> Result<()> {
        self.update_device_lists(vec![record]).await
    }

    async fn update_device_lists(&self, records: Vec<DeviceListRecord>) -> Result<()> {
        let ops = records
            .iter()
            .map(|r| {
                self.put_json(
                    kind::DEVICE_LIST,
                    r.user.clone(),
                    String::new(),
                    r.timestamp,
                    r,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        self.write(ops).await.map(|_| ())
    }

    async fn get_devices(&self, user: &str) -> Result<Option<DeviceListRecord>> {
        self.get_json(kind::DEVICE_LIST, user).await
    }

    async fn delete_devices(&self, user: &str) -> Result<()> {
        self.delete(kind::DEVICE_LIST, user).await
    }

    async fn get_group_metadata(&self, group_jid: &str) -> Result<Option<Vec<u8>>> {
        self.get(kind::GROUP_METADATA, group_jid).await
    }

    async fn put_group_metadata(&self, group_jid: &str, blob: &[u8]) -> Result<()> {
        let op = self.put(
            kind::GROUP_METADATA,
            group_jid.into(),
            String::new(),
            now_secs(),
            blob,
        );
        self.write(vec![op]).await.map(|_| ())
    }

    async fn delete_group_metadata(&self, group_jid: &str) -> Result<()> {
        self.delete(kind::GROUP_METADATA, group_jid).await
    }

    async fn get_tc_token(&self, jid: &str) -> Result<Option<TcTokenEntry>> {
        self.get_json(kind::TC_TOKEN, jid).await
    }

    async fn put_tc_token(&self, jid: &str, entry: &TcTokenEntry) -> Result<()> {
        let _one = self.rmw.lock().await;
        let op = self.put_json(
            kind::TC_TOKEN,
            jid.into(),
            String::new(),
            entry.token_timestamp,
            entry,
        )?;
        self.write(vec![op]).await.map(|_| ())
    }

    async fn delete_tc_token(&self, jid: &str) -> Result<()> {
        self.delete(kind::TC_TOKEN, jid).await
    }

    async fn get_all_tc_token_jids(&self) -> Result<Vec<String>> {
        let rows = self
            .rows
            .list(&self.account, kind::TC_TOKEN)
            .await
            .map_err(db_err)?;
        Ok(rows.into_iter().map(|r| r.k).collect())
    }

    async fn delete_expired_tc_tokens(&self, token_cutoff: i64, sender_cutoff: i64) -> Result<u32> {
        let _one = self.rmw.lock().await;
        let rows = self
            .rows
            .list(&self.account, kind::TC_TOKEN)
            .await
            .map_err(db_err)?;
        let mut ops = Vec::new();
        for r in &rows {
            let e: TcTokenEntry =
                serde_json::from_slice(&self.open(kind::TC_TOKEN, r)?).map_err(ser_err)?;
            let token_dead = e.token.is_empty() || e.token_timestamp < token_cutoff;
            let sender_dead = e.sender_timestamp.is_none_or(|s| s < sender_cutoff);
            if token_dead && sender_dead {
                ops.push(Op::Delete {
                    kind: kind::TC_TOKEN,
                    k: r.k.clone(),
                });
            }
        }
        let n = self.write(ops).await?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    async fn touch_tc_token_sender_timestamp(
        &self,
        jid: &str,
        sender_timestamp: i64,
    ) -> Result<()> {
        let _one = self.rmw.lock().await;
        let entry = match self.get_tc_token(jid).await? {
            Some(e) => TcTokenEntry {
                sender_timestamp: Some(
                    e.sender_timestamp
                        .map_or(sender_timestamp, |s| s.max(sender_timestamp)),
                ),
                ..e
            },
            None => TcTokenEntry {
                token: Vec::new(),
                token_timestamp: sender_timestamp,
                sender_timestamp: Some(sender_timestamp),
            },
        };
        let op = self.put_json(
            kind::TC_TOKEN,
            jid.into(),
            String::new(),
            entry.token_timestamp,
            &entry,
        )?;
        self.write(vec![op]).await.map(|_| ())
    }

    async fn store_received_tc_token(
        &self,
        jid: &str,
        token: &[u8],
        token_timestamp: i64,
    ) -> Result<()> {
        let _one = self.rmw.lock().await;
        let existing = self.get_tc_token(jid).await?;
        if let Some(e) = &existing {
            if !e.token.is_empty() && token_timestamp < e.token_timestamp {
                return Ok(());
            }
        }
        let entry = TcTokenEntry {
            token: token.to_vec(),
            token_timestamp,
            sender_timestamp: existing.and_then(|e| e.sender_timestamp),
        };
        let op = self.put_json(
            kind::TC_TOKEN,
            jid.into(),
            String::new(),
            token_timestamp,
            &entry,
        )?;
        self.write(vec![op]).await.map(|_| ())
    }
}

/// A message secret's value: the parent message's time, then the secret.
fn secret_value(e: &MsgSecretEntry) -> Vec<u8> {
    let mut v = e.message_ts.to_be_bytes().to_vec();
    v.extend_from_slice(&e.secret);
    v
}

fn secret_parts(v: &[u8]) -> Result<(i64, Vec<u8>)> {
    if v.len() < 8 {
        return Err(WaError::Validation(
            "a stored message secret is too short".into(),
        ));
    }
    let ts = i64::from_be_bytes(v[..8].try_into().expect("8 bytes"));
    Ok((ts, v[8..].to_vec()))
}

#[async_trait]
impl MsgSecretStore for SessionBackend {
    async fn put_msg_secrets(&self, entries: Vec<MsgSecretEntry>) -> Result<usize> {
        let _one = self.rmw.lock().await;
        let mut ops = Vec::with_capacity(entries.len());
        for mut e in entries {
            let k = key3(&e.chat, &e.sender, &e.msg_id);
            // A re-persist never shortens the window nor forgets the time.
            if let Some(row) = self
                .rows
                .get(&self.account, kind::MSG_SECRET, &k)
                .await
                .map_err(db_err)?
            {
                let (ts, _) = secret_parts(&self.open(kind::MSG_SECRET, &row)?)?;
                e.expires_at = merge_msg_secret_expiry(row.n, e.expires_at);
                e.message_ts = merge_msg_secret_message_ts(ts, e.message_ts);
            }
            ops.push(self.put(
                kind::MSG_SECRET,
                k,
                String::new(),
                e.expires_at,
                &secret_value(&e),
            ));
        }
        let n = ops.len();
        self.write(ops).await?;
        Ok(n)
    }

    async fn get_msg_secret(
        &self,
        chat: &str,
        sender: &str,
        msg_id: &str,
    ) -> Result<Option<Vec<u8>>> {
        Ok(self
            .get_msg_secret_with_ts(chat, sender, msg_id)
            .await?
            .map(|(s, _)| s))
    }

    async fn get_msg_secret_with_ts(
        &self,
        chat: &str,
        sender: &str,
        msg_id: &str,
    ) -> Result<Option<(Vec<u8>, i64)>> {
        match self
            .get(kind::MSG_SECRET, &key3(chat, sender, msg_id))
            .await?
        {
            Some(v) => secret_parts(&v).map(|(ts, s)| Some((s, ts))),
            None => Ok(None),
        }
    }

    async fn delete_expired_msg_secrets(&self, cutoff_timestamp: i64) -> Result<u32> {
        if !self.sweep_due(Sweep::MessageSecrets, cutoff_timestamp) {
            return Ok(0);
        }
        // `n` is the secret's deadline: gone once it is not after the
        // cutoff, and 0 means "never" (the crate's in-memory store's rule).
        count(
            self.write(vec![Op::DeleteByN {
                kind: kind::MSG_SECRET,
                cutoff: cutoff_timestamp,
                inclusive: true,
                keep_zero: true,
            }])
            .await?,
        )
    }
}

#[async_trait]
impl DeviceStore for SessionBackend {
    async fn save(&self, device: &Device) -> Result<()> {
        let op = self.put_json(kind::DEVICE, String::new(), String::new(), 0, device)?;
        self.write(vec![op]).await.map(|_| ())
    }

    async fn load(&self) -> Result<Option<Device>> {
        let Some(mut d) = self.get_json::<Device>(kind::DEVICE, "").await? else {
            return Ok(None);
        };
        // Not stored: set on every start, as the client's own stores do.
        d.device_props = Arc::new(whatsapp_rust::wacore::store::device::DEVICE_PROPS.clone());
        d.client_profile = whatsapp_rust::ClientProfile::web();
        Ok(Some(d))
    }

    async fn exists(&self) -> Result<bool> {
        Ok(self
            .rows
            .get(&self.account, kind::DEVICE, "")
            .await
            .map_err(db_err)?
            .is_some())
    }

    async fn create(&self) -> Result<i32> {
        self.save(&Device::new()).await?;
        Ok(1)
    }

    async fn resource_report(&self) -> whatsapp_rust::wacore::stats::StorageResourceReport {
        // The rows live in the database, not in this process.
        whatsapp_rust::wacore::stats::StorageResourceReport {
            memory_bytes: Some(0),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_of_an_address() {
        assert_eq!(user_of("15550001111@s.whatsapp.net"), "15550001111");
        assert_eq!(user_of("15550001111:3@s.whatsapp.net"), "15550001111");
        assert_eq!(user_of("100000000000001:3@lid"), "100000000000001");
        assert_eq!(user_of("bare"), "bare");
    }
}
