//! The `accounts` table family: accounts, their caps and counters, and the
//! daemon's pairing state. [`AccountStore`] on SQL.

use super::records::{account_from, sql_limit, ACCOUNT_COLS};
use super::rows::{trunc, RowGet, Ts};
use super::{be, corrupt, not_found, SqlStore};
use super::{read, tx, writer};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::*;

#[async_trait]
impl AccountStore for SqlStore {
    // ------------------------------------------------------------ accounts

    async fn create_account(&self, a: &NewAccount, now: DateTime<Utc>) -> StoreResult<Account> {
        let now = trunc(now);
        let n = writer!(self, p => sqlx::query(
            "INSERT INTO accounts (id, name, kind, state, state_reason, max_per_minute, \
             group_concurrency, daily_cap, created_at, hourly_cap, timezone, new_number) \
             VALUES ($1, $2, $3, $4, NULL, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(a.id.as_str())
        .bind(&a.name)
        .bind(a.kind.as_str())
        .bind(a.state.as_str())
        .bind(a.limits.max_per_minute.map(i64::from))
        .bind(a.limits.group_concurrency.map(i64::from))
        .bind(a.limits.daily_cap.map(i64::from))
        .bind(Ts(now))
        .bind(a.limits.hourly_cap.map(i64::from))
        .bind(a.limits.timezone.as_ref().map(|t| t.name().to_owned()))
        .bind(a.limits.new_number)
        .execute(p)
        .await
        .map_err(be)?
        .rows_affected());
        if n == 0 {
            return Err(StoreError::Conflict(format!(
                "account {} already exists",
                a.id
            )));
        }
        Ok(Account {
            id: a.id.clone(),
            name: a.name.clone(),
            kind: a.kind,
            state: a.state,
            state_reason: None,
            state_until: None,
            limits: a.limits.clone(),
            created_at: now,
            incident_at: None,
            standing: Standing::default(),
        })
    }

    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        let sql = format!("SELECT {ACCOUNT_COLS} FROM accounts WHERE id = $1");
        read!(self, p => sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(account_from)
            .transpose())
    }

    async fn list_accounts(&self) -> StoreResult<Vec<Account>> {
        let sql = format!("SELECT {ACCOUNT_COLS} FROM accounts ORDER BY id");
        read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(account_from)
            .collect())
    }

    async fn list_accounts_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<Account>> {
        let sql = format!("SELECT {ACCOUNT_COLS} FROM accounts WHERE id > $1 ORDER BY id LIMIT $2");
        // Every id sorts after the empty string.
        let after = after.unwrap_or("");
        read!(self, p => sqlx::query(&sql)
            .bind(after)
            .bind(sql_limit(limit))
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(account_from)
            .collect())
    }

    async fn update_account_limits(
        &self,
        id: &AccountId,
        limits: &AccountLimits,
    ) -> StoreResult<Account> {
        let sql = format!(
            "UPDATE accounts SET max_per_minute = $2, group_concurrency = $3, daily_cap = $4, \
             hourly_cap = $5, timezone = $6, new_number = $7 WHERE id = $1 \
             RETURNING {ACCOUNT_COLS}"
        );
        writer!(self, p => sqlx::query(&sql)
            .bind(id.as_str())
            .bind(limits.max_per_minute.map(i64::from))
            .bind(limits.group_concurrency.map(i64::from))
            .bind(limits.daily_cap.map(i64::from))
            .bind(limits.hourly_cap.map(i64::from))
            .bind(limits.timezone.as_ref().map(|t| t.name().to_owned()))
            .bind(limits.new_number)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(account_from)
            .transpose())?
        .ok_or_else(|| not_found(format!("account {id}")))
    }

    async fn set_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
    ) -> StoreResult<Account> {
        self.set_account_state_until(id, state, reason, None).await
    }

    async fn set_account_state_until(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
    ) -> StoreResult<Account> {
        let sql = set_state_sql();
        writer!(self, p => sqlx::query(&sql)
            .bind(id.as_str())
            .bind(state.as_str())
            .bind(reason)
            .bind(until.map(|t| Ts(trunc(t))))
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(account_from)
            .transpose())?
        .ok_or_else(|| not_found(format!("account {id}")))
    }

    async fn change_account_state(
        &self,
        id: &AccountId,
        state: AccountState,
        reason: Option<&str>,
        until: Option<DateTime<Utc>>,
        event: &NewEvent,
    ) -> StoreResult<(Account, Event)> {
        let sql = set_state_sql();
        Ok(tx!(self, tx => {
            let account = sqlx::query(&sql)
                .bind(id.as_str())
                .bind(state.as_str())
                .bind(reason)
                .bind(until.map(|t| Ts(trunc(t))))
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?
                .as_ref()
                .map(account_from)
                .transpose()?
                .ok_or_else(|| not_found(format!("account {id}")))?;
            let told = super::events::insert_in(&mut *tx, std::slice::from_ref(event))
                .await?
                .pop()
                .ok_or_else(|| StoreError::Backend("the account's event was not stored".into()))?;
            (account, told)
        }))
    }

    async fn record_incident(&self, id: &AccountId, at: DateTime<Utc>) -> StoreResult<()> {
        let n = writer!(self, p => sqlx::query("UPDATE accounts SET incident_at = $2 WHERE id = $1")
            .bind(id.as_str())
            .bind(Ts(trunc(at)))
            .execute(p)
            .await
            .map_err(be)?
            .rows_affected());
        if n == 0 {
            return Err(not_found(format!("account {id}")));
        }
        Ok(())
    }

    async fn set_account_standing(
        &self,
        id: &AccountId,
        was: Option<&Standing>,
        standing: &Standing,
        changed: Option<&NewEvent>,
    ) -> StoreResult<Option<Event>> {
        let text = serde_json::to_string(standing)
            .map_err(|e| StoreError::Backend(format!("the account's standing: {e}")))?;
        // The row is locked (PostgreSQL) or the writer held (SQLite's
        // IMMEDIATE) from this read to the commit.
        let lock_sql = format!(
            "SELECT standing FROM accounts WHERE id = $1{}",
            match &self.db {
                super::Db::Postgres(_) => " FOR UPDATE",
                super::Db::Sqlite { .. } => "",
            }
        );
        Ok(tx!(self, tx => {
            if let Some(was) = was {
                let row = sqlx::query(&lock_sql)
                    .bind(id.as_str())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(be)?
                    .ok_or_else(|| not_found(format!("account {id}")))?;
                let stored: Standing = row
                    .opt_text("standing")?
                    .map(|t| serde_json::from_str(&t).map_err(|e| corrupt("account standing", e)))
                    .transpose()?
                    .unwrap_or_default();
                if stored != *was {
                    return Err(StoreError::Conflict(format!(
                        "account {id}: its standing changed meanwhile"
                    )));
                }
            }
            let n = sqlx::query("UPDATE accounts SET standing = $2 WHERE id = $1")
                .bind(id.as_str())
                .bind(&text)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if n == 0 {
                return Err(not_found(format!("account {id}")));
            }
            match changed {
                Some(e) => super::events::insert_in(&mut *tx, std::slice::from_ref(e))
                    .await?
                    .pop(),
                None => None,
            }
        }))
    }

    async fn delete_account(&self, id: &AccountId) -> StoreResult<()> {
        tx!(self, tx => {
            let live = sqlx::query(
                "SELECT id FROM reminders WHERE account_id = $1 AND state <> 'archived' LIMIT 1",
            )
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            if let Some(r) = live {
                return Err(StoreError::Conflict(format!(
                    "account {id} still has reminders that are not archived (reminder {})",
                    r.int("id")?
                )));
            }
            // A run or a recall the account's actor is carrying, on
            // whichever daemon: deleting would cut it off mid-send.
            let busy = sqlx::query(
                "SELECT id, status FROM runs WHERE account_id = $1 \
                 AND status IN ('queued', 'running') LIMIT 1",
            )
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            if let Some(r) = busy {
                return Err(StoreError::Conflict(format!(
                    "account {id} has a run {} (run {}); stop it first",
                    r.text("status")?,
                    r.int("id")?
                )));
            }
            let amending = sqlx::query(
                "SELECT a.id FROM run_amendments a JOIN runs r ON r.id = a.run_id \
                 WHERE r.account_id = $1 AND a.finished_at IS NULL LIMIT 1",
            )
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            if let Some(a) = amending {
                return Err(StoreError::Conflict(format!(
                    "account {id} is recalling or editing a run (amendment {}); let it finish first",
                    a.int("id")?
                )));
            }
            // Archived reminders, their runs and the upload cache cascade.
            let n = sqlx::query("DELETE FROM accounts WHERE id = $1")
                .bind(id.as_str())
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if n == 0 {
                return Err(not_found(format!("account {id}")));
            }
        });
        Ok(())
    }
}

/// An account's state change, answering the row: one statement for the
/// plain change and for the one written with its event.
fn set_state_sql() -> String {
    format!(
        "UPDATE accounts SET state = $2, state_reason = $3, state_until = $4 WHERE id = $1 \
         RETURNING {ACCOUNT_COLS}"
    )
}
