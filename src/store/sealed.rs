//! Everything sealed under the session key, across the tables that hold
//! it: the WhatsApp session rows (`wa_session_rows`) and the webhooks'
//! signing secrets (`webhook_secrets`), and the id of the key they are
//! sealed under (`wa_session_key`). The key id is recorded at a daemon's
//! first start, before anything is sealed, so a daemon of the same
//! database with another key file is refused even then
//! (`crate::seal::key_file`); a rekey moves every sealed value and the
//! record in one transaction.

use super::rows::RowGet;
use super::{be, Db, SqlStore};
use super::{read, tx, writer};
use herald_actors::domain::AccountId;
use herald_actors::ports::{StoreError, StoreResult};

/// The sealed values of every table and the key record. Cheap to clone.
#[derive(Clone)]
pub struct Sealed {
    db: Db,
}

/// Every sealed value, as stored.
#[derive(Debug, Default)]
pub struct AllSealed {
    /// WhatsApp session rows: `(account, kind, k, v)`.
    pub sessions: Vec<(AccountId, i32, String, Vec<u8>)>,
    /// Webhook secrets: `(webhook_id, n, sealed)`.
    /// Each webhook secret's place, whether it is sealed bound to it
    /// (before migration 0020: the subscription id alone), and its sealed
    /// value. A rekey writes them all bound.
    pub webhook_secrets: Vec<(crate::seal::SecretPlace, bool, Vec<u8>)>,
}

impl AllSealed {
    pub fn len(&self) -> usize {
        self.sessions.len() + self.webhook_secrets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl SqlStore {
    /// The sealed values and the key record, on this store's pools.
    pub fn sealed(&self) -> Sealed {
        Sealed {
            db: self.db.clone(),
        }
    }
}

impl Sealed {
    /// The id of the key everything is sealed under, once recorded.
    pub async fn key_id(&self) -> StoreResult<Option<String>> {
        read!(self, p => {
            sqlx::query("SELECT key_id FROM wa_session_key WHERE id = 1")
                .fetch_optional(p)
                .await
                .map_err(be)?
                .map(|r| r.text("key_id"))
                .transpose()
        })
    }

    /// Records `key_id` unless a key is recorded already; answers the
    /// recorded one: `key_id`, or the one another daemon recorded first.
    pub async fn record_key_id(&self, key_id: &str) -> StoreResult<String> {
        writer!(self, p => {
            sqlx::query(
                "INSERT INTO wa_session_key (id, key_id) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
            )
            .bind(key_id)
            .execute(p)
            .await
            .map_err(be)?;
        });
        self.key_id()
            .await?
            .ok_or_else(|| StoreError::Backend("the session key's id was not recorded".into()))
    }

    /// Whether anything is sealed: a session row or a webhook secret.
    pub async fn any_sealed(&self) -> StoreResult<bool> {
        read!(self, p => {
            Ok(sqlx::query(
                "SELECT 1 AS one FROM wa_session_rows \
                 UNION ALL SELECT 1 AS one FROM webhook_secrets LIMIT 1",
            )
            .fetch_optional(p)
            .await
            .map_err(be)?
            .is_some())
        })
    }

    /// Every sealed value of every table.
    pub async fn all(&self) -> StoreResult<AllSealed> {
        let sessions = read!(self, p => {
            sqlx::query("SELECT account_id, CAST(kind AS BIGINT) AS kind, k, v FROM wa_session_rows ORDER BY account_id, kind, k")
                .fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(|r| {
                    let a = AccountId::parse(&r.text("account_id")?)
                        .map_err(|e| StoreError::Backend(format!("stored account id is invalid: {e}")))?;
                    Ok((a, r.int("kind")? as i32, r.text("k")?, r.bytes("v")?))
                })
                .collect::<StoreResult<Vec<_>>>()
        })?;
        let webhook_secrets = read!(self, p => {
            sqlx::query(
                "SELECT webhook_id, n, sealed, valid_until, bound FROM webhook_secrets \
                 ORDER BY webhook_id, n",
            )
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(|r| {
                let place = crate::seal::SecretPlace {
                    webhook: r.int("webhook_id")?,
                    n: r.int("n")?,
                    until: r.opt_ts("valid_until")?,
                };
                Ok((place, r.int("bound")? == 1, r.bytes("sealed")?))
            })
            .collect::<StoreResult<Vec<_>>>()
        })?;
        Ok(AllSealed {
            sessions,
            webhook_secrets,
        })
    }

    /// Replaces every sealed value (a new key) and the recorded key id in
    /// one transaction: everything moves to the new key, or nothing does.
    pub async fn reseal(&self, all: &AllSealed, key_id: &str) -> StoreResult<()> {
        tx!(self, tx => {
            for (a, kind, k, v) in &all.sessions {
                sqlx::query("UPDATE wa_session_rows SET v = $4 WHERE account_id = $1 AND kind = $2 AND k = $3")
                    .bind(a.as_str())
                    .bind(*kind)
                    .bind(k)
                    .bind(v)
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
            for (place, _, v) in &all.webhook_secrets {
                sqlx::query(
                    "UPDATE webhook_secrets SET sealed = $3, bound = 1 WHERE webhook_id = $1 AND n = $2",
                )
                    .bind(place.webhook)
                    .bind(place.n)
                    .bind(v)
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
            sqlx::query(
                "INSERT INTO wa_session_key (id, key_id) VALUES (1, $1) \
                 ON CONFLICT (id) DO UPDATE SET key_id = excluded.key_id",
            )
            .bind(key_id)
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            Ok::<(), StoreError>(())
        })
    }
}
