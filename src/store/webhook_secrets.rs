//! The webhooks' signing secrets at rest (`webhook_secrets`, migration
//! 0015): each sealed under the session key with the subscription id as
//! associated data ([`crate::seal::WebhookSeal`]), the current one
//! (`valid_until` NULL) and the previous ones still in their overlap.
//! Nothing here ever writes a secret in plain text.

use super::rows::{trunc, RowGet, Ts};
use super::{be, not_found, Db, SqlStore};
use super::{read, tx};
use crate::seal::{SessionKey, WebhookSeal};
use chrono::{DateTime, Utc};
use herald_actors::domain::{PreviousSecret, Webhook, MAX_SIGNING_SECRETS};
use herald_actors::ports::{too_many_secrets, StoreError, StoreResult};

/// A subscription's secret as stored: its number and, for a previous
/// one, the end of its overlap.
struct StoredSecret {
    webhook_id: i64,
    secret: String,
    until: Option<DateTime<Utc>>,
}

impl SqlStore {
    /// This store seals and opens webhook secrets under `key` (the
    /// session key): without it, creating, rotating or reading a
    /// subscription fails saying so.
    pub fn with_secret_key(mut self, key: &SessionKey) -> Self {
        self.secrets = Some(key.for_webhooks());
        self
    }

    pub(super) fn secret_seal(&self) -> StoreResult<&WebhookSeal> {
        self.secrets.as_ref().ok_or_else(|| {
            StoreError::Backend(
                "webhook secrets are sealed at rest and this store was opened without the \
                 session key (whatsapp.session_key_file)"
                    .into(),
            )
        })
    }

    /// The sealed form of `secret` for subscription `id`.
    pub(super) fn seal_secret(&self, id: i64, secret: &str) -> StoreResult<Vec<u8>> {
        Ok(self.secret_seal()?.seal(id, secret))
    }

    /// Fills in the secrets of `hooks` (read with an empty `secret`).
    pub(super) async fn attach_secrets(&self, hooks: &mut [Webhook]) -> StoreResult<()> {
        if hooks.is_empty() {
            return Ok(());
        }
        let seal = self.secret_seal()?;
        let ids = hooks
            .iter()
            .map(|w| w.id.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!(
            "SELECT webhook_id, sealed, valid_until FROM webhook_secrets \
             WHERE webhook_id IN ({ids}) ORDER BY webhook_id, n DESC"
        );
        let stored: Vec<StoredSecret> = read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(|r| {
                let webhook_id = r.int("webhook_id")?;
                let secret = seal.open(webhook_id, &r.bytes("sealed")?).map_err(|e| {
                    StoreError::Backend(format!("the secret of webhook {webhook_id} {e}"))
                })?;
                Ok(StoredSecret {
                    webhook_id,
                    secret,
                    until: r.opt_ts("valid_until")?,
                })
            })
            .collect::<StoreResult<_>>()?);
        for w in hooks.iter_mut() {
            w.secret.clear();
            w.previous_secrets.clear();
        }
        for s in stored {
            let Some(w) = hooks.iter_mut().find(|w| w.id == s.webhook_id) else {
                continue;
            };
            match s.until {
                None => w.secret = s.secret,
                Some(until) => w.previous_secrets.push(PreviousSecret {
                    secret: s.secret,
                    until,
                }),
            }
        }
        match hooks.iter().find(|w| w.secret.is_empty()) {
            Some(w) => Err(StoreError::Backend(format!(
                "webhook {} has no current secret in webhook_secrets",
                w.id
            ))),
            None => Ok(()),
        }
    }

    /// Seals the plain-text secrets a database from before migration 0015
    /// holds in `webhooks` (secret, old_secret, old_secret_until) into
    /// `webhook_secrets` and empties those columns, in one transaction.
    /// On SQLite the freed bytes are overwritten (secure_delete) and the
    /// log checkpointed, so the file no longer holds them. Answers how
    /// many subscriptions were sealed; 0 once done.
    pub async fn seal_plaintext_webhook_secrets(&self) -> StoreResult<usize> {
        let seal = self.secret_seal()?;
        let select = "SELECT id, secret, old_secret, old_secret_until FROM webhooks \
                      WHERE secret <> '' OR old_secret IS NOT NULL ORDER BY id";
        let insert = "INSERT INTO webhook_secrets (webhook_id, n, sealed, valid_until) \
                      VALUES ($1, (SELECT COALESCE(MAX(n), 0) + 1 FROM webhook_secrets \
                      WHERE webhook_id = $1), $2, $3)";
        let sqlite = matches!(self.db, Db::Sqlite { .. });
        let n = tx!(self, tx => {
            if sqlite {
                sqlx::query("PRAGMA secure_delete = ON").execute(&mut *tx).await.map_err(be)?;
            }
            let rows = sqlx::query(select).fetch_all(&mut *tx).await.map_err(be)?;
            for r in &rows {
                let id = r.int("id")?;
                let secret = r.text("secret")?;
                if let (Some(old), Some(until)) =
                    (r.opt_text("old_secret")?, r.opt_ts("old_secret_until")?)
                {
                    sqlx::query(insert)
                        .bind(id)
                        .bind(seal.seal(id, &old))
                        .bind(Some(Ts(trunc(until))))
                        .execute(&mut *tx)
                        .await
                        .map_err(be)?;
                }
                if !secret.is_empty() {
                    sqlx::query(insert)
                        .bind(id)
                        .bind(seal.seal(id, &secret))
                        .bind(None::<Ts>)
                        .execute(&mut *tx)
                        .await
                        .map_err(be)?;
                }
                sqlx::query(
                    "UPDATE webhooks SET secret = '', old_secret = NULL, \
                     old_secret_until = NULL WHERE id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            if sqlite {
                sqlx::query("PRAGMA secure_delete = OFF").execute(&mut *tx).await.map_err(be)?;
            }
            rows.len()
        });
        if let (true, Db::Sqlite { write, .. }) = (n > 0, &self.db) {
            // The old pages go from the log too, not only from the file.
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(write)
                .await
                .map_err(be)?;
        }
        Ok(n)
    }

    /// Inside a rotation's transaction: drops the secrets whose overlap
    /// ended by `now`, refuses a rotation that would make more than
    /// [`MAX_SIGNING_SECRETS`] sign, ends the current secret at
    /// `old_until` and adds `secret` as the current one.
    pub(super) async fn rotate_secret_rows(
        &self,
        id: i64,
        secret: &str,
        now: DateTime<Utc>,
        old_until: DateTime<Utc>,
    ) -> StoreResult<()> {
        let sealed = self.seal_secret(id, secret)?;
        let lock = match &self.db {
            // Two rotations of one subscription queue here, so each sees
            // the other's secret as the current one.
            Db::Postgres(_) => "SELECT id FROM webhooks WHERE id = $1 FOR UPDATE",
            Db::Sqlite { .. } => "SELECT id FROM webhooks WHERE id = $1",
        };
        tx!(self, tx => {
            if sqlx::query(lock).bind(id).fetch_optional(&mut *tx).await.map_err(be)?.is_none() {
                return Err(not_found(format!("webhook {id}")));
            }
            sqlx::query(
                "DELETE FROM webhook_secrets WHERE webhook_id = $1 \
                 AND valid_until IS NOT NULL AND valid_until <= $2",
            )
            .bind(id)
            .bind(Ts(trunc(now)))
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            let ends: Vec<DateTime<Utc>> = sqlx::query(
                "SELECT valid_until FROM webhook_secrets \
                 WHERE webhook_id = $1 AND valid_until IS NOT NULL",
            )
            .bind(id)
            .fetch_all(&mut *tx)
            .await
            .map_err(be)?
            .iter()
            .map(|r| r.ts("valid_until"))
            .collect::<StoreResult<_>>()?;
            if ends.len() + 1 >= MAX_SIGNING_SECRETS {
                return Err(too_many_secrets(id, &ends));
            }
            sqlx::query(
                "UPDATE webhook_secrets SET valid_until = $2 \
                 WHERE webhook_id = $1 AND valid_until IS NULL",
            )
            .bind(id)
            .bind(Ts(trunc(old_until)))
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            sqlx::query(
                "INSERT INTO webhook_secrets (webhook_id, n, sealed, valid_until) \
                 VALUES ($1, (SELECT COALESCE(MAX(n), 0) + 1 FROM webhook_secrets \
                 WHERE webhook_id = $1), $2, NULL)",
            )
            .bind(id)
            .bind(&sealed)
            .execute(&mut *tx)
            .await
            .map_err(be)?;
        });
        Ok(())
    }
}
