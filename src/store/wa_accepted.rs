//! Message ids WhatsApp accepted from each account (`wa_accepted_ids`,
//! migration 0017), shared by every daemon that owns the account in turn,
//! so a resend after a takeover is recognised as a duplicate. Not fenced:
//! an ack is a fact about WhatsApp, worth keeping whoever heard it.

use super::be;
use super::rows::{trunc, RowGet, Ts};
use super::whatsapp::WaRows;
use super::{read, tx, writer};
use chrono::{DateTime, Utc};
use herald_actors::domain::AccountId;
use herald_actors::ports::StoreResult;

impl WaRows {
    /// Records that WhatsApp accepted `ids` from `account` (again is no
    /// error).
    pub async fn accept_ids(
        &self,
        account: &AccountId,
        ids: &[String],
        at: DateTime<Utc>,
    ) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        tx!(self, tx => {
            for id in ids {
                sqlx::query(
                    "INSERT INTO wa_accepted_ids (account_id, message_id, accepted_at) \
                     VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                )
                .bind(account.as_str())
                .bind(id)
                .bind(Ts(trunc(at)))
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
        });
        Ok(())
    }

    /// WhatsApp accepted `id` from `account`, by whichever daemon sent it.
    pub async fn was_accepted(&self, account: &AccountId, id: &str) -> StoreResult<bool> {
        let sql = "SELECT 1 AS one FROM wa_accepted_ids WHERE account_id = $1 AND message_id = $2";
        read!(self, p => Ok(sqlx::query(sql)
            .bind(account.as_str())
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .is_some()))
    }

    /// The newest `limit` ids accepted from `account`, newest first.
    pub async fn recent_accepted(
        &self,
        account: &AccountId,
        limit: u32,
    ) -> StoreResult<Vec<String>> {
        let sql = "SELECT message_id FROM wa_accepted_ids WHERE account_id = $1 \
                   ORDER BY accepted_at DESC, message_id DESC LIMIT $2";
        read!(self, p => sqlx::query(sql)
            .bind(account.as_str())
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(|r| r.text("message_id"))
            .collect())
    }

    /// Forgets up to `limit` ids accepted before `before`; answers how many.
    pub async fn prune_accepted(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        let sql = "DELETE FROM wa_accepted_ids WHERE (account_id, message_id) IN \
                   (SELECT account_id, message_id FROM wa_accepted_ids WHERE accepted_at < $1 \
                    ORDER BY accepted_at LIMIT $2)";
        writer!(self, p => Ok(sqlx::query(sql)
            .bind(Ts(trunc(before)))
            .bind(i64::from(limit))
            .execute(p)
            .await
            .map_err(be)?
            .rows_affected()))
    }
}
