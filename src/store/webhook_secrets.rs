//! The webhooks' signing secrets at rest (`webhook_secrets`, migrations
//! 0015 and 0020): each sealed under the session key bound to its place,
//! the subscription, its number and the end of its overlap
//! ([`crate::seal::SecretPlace`]), the current one (`valid_until` NULL) and
//! the previous ones still in their overlap. A rotation re-seals the
//! secret it ends with that end. Nothing here ever writes a secret in
//! plain text.

use super::rows::{trunc, RowGet, Ts};
use super::{be, not_found, Db, SqlStore};
use super::{read, tx};
use crate::seal::{SecretPlace, SessionKey, WebhookSeal};
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

    /// The sealed form of the current secret `secret` of a new
    /// subscription `id` (its first).
    pub(super) fn seal_first_secret(&self, id: i64, secret: &str) -> StoreResult<Vec<u8>> {
        let place = SecretPlace {
            webhook: id,
            n: 1,
            until: None,
        };
        Ok(self.secret_seal()?.seal(&place, secret))
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
            "SELECT webhook_id, n, sealed, valid_until, bound FROM webhook_secrets \
             WHERE webhook_id IN ({ids}) ORDER BY webhook_id, n DESC"
        );
        let stored: Vec<StoredSecret> = read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(|r| {
                let place = SecretPlace {
                    webhook: r.int("webhook_id")?,
                    n: r.int("n")?,
                    until: r.opt_ts("valid_until")?,
                };
                let webhook_id = place.webhook;
                if r.int("bound")? == 0 {
                    return Err(StoreError::Backend(format!(
                        "secret {} of webhook {webhook_id} is not bound to its place; \
                         start the daemon with the session key to bind it",
                        place.n
                    )));
                }
                let secret = seal.open(&place, &r.bytes("sealed")?).map_err(|e| {
                    StoreError::Backend(format!("the secret of webhook {webhook_id} {e}"))
                })?;
                Ok(StoredSecret {
                    webhook_id,
                    secret,
                    until: place.until,
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
        let next_n =
            "SELECT COALESCE(MAX(n), 0) + 1 AS n FROM webhook_secrets WHERE webhook_id = $1";
        let insert = "INSERT INTO webhook_secrets (webhook_id, n, sealed, valid_until, bound) \
                      VALUES ($1, $2, $3, $4, 1)";
        let sqlite = matches!(self.db, Db::Sqlite { .. });
        let n = tx!(self, tx => {
            if sqlite {
                sqlx::query("PRAGMA secure_delete = ON").execute(&mut *tx).await.map_err(be)?;
            }
            let rows = sqlx::query(select).fetch_all(&mut *tx).await.map_err(be)?;
            for r in &rows {
                let id = r.int("id")?;
                let secret = r.text("secret")?;
                let old = match (r.opt_text("old_secret")?, r.opt_ts("old_secret_until")?) {
                    (Some(old), Some(until)) => Some((old, Some(trunc(until)))),
                    _ => None,
                };
                let current = (!secret.is_empty()).then_some((secret, None));
                for (plain, until) in old.into_iter().chain(current) {
                    let n = sqlx::query(next_n)
                        .bind(id)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(be)?
                        .int("n")?;
                    let place = SecretPlace { webhook: id, n, until };
                    sqlx::query(insert)
                        .bind(id)
                        .bind(n)
                        .bind(seal.seal(&place, &plain))
                        .bind(until.map(Ts))
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

    /// Seals bound to their place the secrets sealed before migration
    /// 0020 (the subscription id alone), in one transaction. Answers how
    /// many were bound; 0 once done.
    pub async fn bind_webhook_secrets(&self) -> StoreResult<usize> {
        let seal = self.secret_seal()?;
        tx!(self, tx => {
            let rows = sqlx::query(
                "SELECT webhook_id, n, sealed, valid_until FROM webhook_secrets WHERE bound = 0 \
                 ORDER BY webhook_id, n",
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(be)?;
            for r in &rows {
                let place = SecretPlace {
                    webhook: r.int("webhook_id")?,
                    n: r.int("n")?,
                    until: r.opt_ts("valid_until")?,
                };
                let plain = seal.open_unbound(place.webhook, &r.bytes("sealed")?).map_err(|e| {
                    StoreError::Backend(format!("the secret of webhook {} {e}", place.webhook))
                })?;
                sqlx::query(
                    "UPDATE webhook_secrets SET sealed = $3, bound = 1 WHERE webhook_id = $1 AND n = $2",
                )
                .bind(place.webhook)
                .bind(place.n)
                .bind(seal.seal(&place, &plain))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            Ok::<usize, StoreError>(rows.len())
        })
    }

    /// Inside a rotation's transaction: drops the secrets whose overlap
    /// ended by `now`, refuses a rotation that would make more than
    /// [`MAX_SIGNING_SECRETS`] sign, ends the current secret at
    /// `old_until` (re-sealed bound to that end) and adds `secret` as the
    /// current one.
    pub(super) async fn rotate_secret_rows(
        &self,
        id: i64,
        secret: &str,
        now: DateTime<Utc>,
        old_until: DateTime<Utc>,
    ) -> StoreResult<()> {
        let seal = self.secret_seal()?;
        let old_until = trunc(old_until);
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
            let current = sqlx::query(
                "SELECT n, sealed FROM webhook_secrets WHERE webhook_id = $1 AND valid_until IS NULL",
            )
            .bind(id)
            .fetch_all(&mut *tx)
            .await
            .map_err(be)?;
            for r in &current {
                let n = r.int("n")?;
                let was = SecretPlace { webhook: id, n, until: None };
                let plain = seal.open(&was, &r.bytes("sealed")?).map_err(|e| {
                    StoreError::Backend(format!("the secret of webhook {id} {e}"))
                })?;
                let ended = SecretPlace { until: Some(old_until), ..was };
                sqlx::query(
                    "UPDATE webhook_secrets SET valid_until = $3, sealed = $4 \
                     WHERE webhook_id = $1 AND n = $2",
                )
                .bind(id)
                .bind(n)
                .bind(Ts(old_until))
                .bind(seal.seal(&ended, &plain))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            let n = sqlx::query(
                "SELECT COALESCE(MAX(n), 0) + 1 AS n FROM webhook_secrets WHERE webhook_id = $1",
            )
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .map_err(be)?
            .int("n")?;
            let place = SecretPlace { webhook: id, n, until: None };
            sqlx::query(
                "INSERT INTO webhook_secrets (webhook_id, n, sealed, valid_until, bound) \
                 VALUES ($1, $2, $3, NULL, 1)",
            )
            .bind(id)
            .bind(n)
            .bind(seal.seal(&place, secret))
            .execute(&mut *tx)
            .await
            .map_err(be)?;
        });
        Ok(())
    }
}
