//! The `webhooks` and `webhook_deliveries` tables: [`WebhookStore`] on
//! SQL. Deliveries are made by the `events_to_webhooks` trigger, in the
//! transaction of the event they carry (see the migration). The secrets
//! are sealed in `webhook_secrets` (`super::webhook_secrets`).
//!
//! A disabled subscription's deliveries wait as `held`: disabling (by an
//! admin or by the sender) holds the pending ones in the same
//! transaction, enabling makes them pending again, and the claim never
//! takes a delivery of a disabled subscription whatever its status says.

use super::records::{event_from, EVENT_COLS};
use super::rows::{trunc, RowGet, Ts};
use super::{be, not_found, Db, SqlStore};
use super::{read, tx, writer};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::*;
use std::collections::HashMap;
use std::time::Duration;

const WEBHOOK_COLS: &str =
    "id, url, types, description, enabled, disabled_reason, failing_since, created_at";
const DELIVERY_COLS: &str = "id, webhook_id, event_id, event_type, status, attempts, \
                             next_attempt_at, last_attempt_at, last_status, last_error, created_at";

/// `types` as stored: comma-framed, so `,run.started,` is a substring
/// test in SQL.
fn framed(types: &[String]) -> String {
    format!(",{},", types.join(","))
}

fn unframed(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

fn webhook_from(r: &impl RowGet) -> StoreResult<Webhook> {
    Ok(Webhook {
        id: r.int("id")?,
        url: r.text("url")?,
        types: unframed(&r.text("types")?),
        description: r.text("description")?,
        enabled: r.flag("enabled")?,
        disabled_reason: r.opt_text("disabled_reason")?,
        // Filled in by `attach_secrets`.
        secret: String::new(),
        previous_secrets: Vec::new(),
        failing_since: r.opt_ts("failing_since")?,
        created_at: r.ts("created_at")?,
    })
}

fn delivery_from(r: &impl RowGet) -> StoreResult<WebhookDelivery> {
    let status = r.text("status")?;
    Ok(WebhookDelivery {
        id: r.int("id")?,
        webhook_id: r.int("webhook_id")?,
        event_id: r.int("event_id")?,
        event_type: r.text("event_type")?,
        status: DeliveryStatus::parse(&status)
            .ok_or_else(|| StoreError::Backend(format!("unknown delivery status {status}")))?,
        attempts: u32::try_from(r.int("attempts")?).unwrap_or(u32::MAX),
        next_attempt_at: r.ts("next_attempt_at")?,
        last_attempt_at: r.opt_ts("last_attempt_at")?,
        last_status: r
            .opt_int("last_status")?
            .and_then(|s| u16::try_from(s).ok()),
        last_error: r.opt_text("last_error")?,
        created_at: r.ts("created_at")?,
    })
}

/// Indexed by the subscription's new `enabled`: disabling holds its
/// pending deliveries (and drops their claims: an attempt in flight can no
/// longer be recorded, and is made again once enabled); enabling makes its
/// held ones pending again.
const HOLD_SQL: [&str; 2] = [
    "UPDATE webhook_deliveries SET status = 'held', claimed_by = NULL, claimed_until = NULL \
     WHERE webhook_id = $1 AND status = 'pending'",
    "UPDATE webhook_deliveries SET status = 'pending' WHERE webhook_id = $1 AND status = 'held'",
];

/// The status a delivery made or retried by hand for subscription `$1`
/// starts in: held while the subscription is disabled.
const INITIAL_STATUS: &str = "(CASE WHEN EXISTS (SELECT 1 FROM webhooks w \
                              WHERE w.id = $1 AND NOT w.enabled) THEN 'held' ELSE 'pending' END)";

fn ids_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

impl SqlStore {
    /// Rows of `sql` (which ends in `IN (`) for `ids`, by id.
    async fn by_ids<T>(
        &self,
        sql: &str,
        ids: &[i64],
        map: impl Fn(&dyn AnyRow) -> StoreResult<(i64, T)>,
    ) -> StoreResult<HashMap<i64, T>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let sql = format!("{sql}{})", ids_list(ids));
        read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(|r| map(r))
            .collect())
    }
}

/// A row of either backend, for [`SqlStore::by_ids`].
trait AnyRow {
    fn webhook(&self) -> StoreResult<Webhook>;
    fn event(&self) -> StoreResult<Event>;
}

impl<R: RowGet> AnyRow for R {
    fn webhook(&self) -> StoreResult<Webhook> {
        webhook_from(self)
    }
    fn event(&self) -> StoreResult<Event> {
        event_from(self)
    }
}

#[async_trait]
impl WebhookStore for SqlStore {
    async fn create_webhook(&self, w: &NewWebhook) -> StoreResult<Webhook> {
        // The secret is sealed bound to its place (the subscription's id
        // among it), so it is written once the row has its id, in the same
        // transaction; the plain text never reaches the database. Without
        // the key nothing is written.
        self.secret_seal()?;
        let sql = format!(
            "INSERT INTO webhooks (url, types, description, enabled, secret, created_at) \
             VALUES ($1, $2, $3, $4, '', $5) RETURNING {WEBHOOK_COLS}"
        );
        let mut hook = tx!(self, tx => {
            let hook = sqlx::query(&sql)
                .bind(&w.url)
                .bind(framed(&w.types))
                .bind(&w.description)
                .bind(w.enabled)
                .bind(Ts(trunc(w.created_at)))
                .fetch_one(&mut *tx)
                .await
                .map_err(be)
                .and_then(|r| webhook_from(&r))?;
            sqlx::query(
                "INSERT INTO webhook_secrets (webhook_id, n, sealed, valid_until, bound) \
                 VALUES ($1, 1, $2, NULL, 1)",
            )
            .bind(hook.id)
            .bind(self.seal_first_secret(hook.id, &w.secret)?)
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            hook
        });
        hook.secret = w.secret.clone();
        Ok(hook)
    }

    async fn list_webhooks(&self) -> StoreResult<Vec<Webhook>> {
        let sql = format!("SELECT {WEBHOOK_COLS} FROM webhooks ORDER BY id");
        let mut hooks: Vec<Webhook> = read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(webhook_from)
            .collect::<StoreResult<_>>())?;
        self.attach_secrets(&mut hooks).await?;
        Ok(hooks)
    }

    async fn get_webhook(&self, id: i64) -> StoreResult<Webhook> {
        let sql = format!("SELECT {WEBHOOK_COLS} FROM webhooks WHERE id = $1");
        let hook = read!(self, p => sqlx::query(&sql)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .map(|r| webhook_from(&r))
            .transpose()?)
        .ok_or_else(|| not_found(format!("webhook {id}")))?;
        let mut one = [hook];
        self.attach_secrets(&mut one).await?;
        let [hook] = one;
        Ok(hook)
    }

    async fn update_webhook(&self, id: i64, patch: &WebhookPatch) -> StoreResult<Webhook> {
        let sql = format!(
            "UPDATE webhooks SET url = COALESCE($2, url), types = COALESCE($3, types), \
             description = COALESCE($4, description), enabled = COALESCE($5, enabled), \
             disabled_reason = CASE WHEN $5 THEN NULL ELSE disabled_reason END, \
             failing_since = CASE WHEN $5 THEN NULL ELSE failing_since END \
             WHERE id = $1 RETURNING {WEBHOOK_COLS}"
        );
        let sql = match &self.db {
            Db::Postgres(_) => sql.replace("WHEN $5 THEN", "WHEN $5::boolean THEN"),
            Db::Sqlite { .. } => sql,
        };
        let hook = tx!(self, tx => {
            let hook = sqlx::query(&sql)
                .bind(id)
                .bind(&patch.url)
                .bind(patch.types.as_deref().map(framed))
                .bind(&patch.description)
                .bind(patch.enabled)
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?
                .map(|r| webhook_from(&r))
                .transpose()?
                .ok_or_else(|| not_found(format!("webhook {id}")))?;
            if let Some(enabled) = patch.enabled {
                sqlx::query(HOLD_SQL[usize::from(enabled)])
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
            hook
        });
        let mut one = [hook];
        self.attach_secrets(&mut one).await?;
        let [hook] = one;
        Ok(hook)
    }

    async fn rotate_webhook_secret(
        &self,
        id: i64,
        secret: &str,
        now: DateTime<Utc>,
        old_until: DateTime<Utc>,
    ) -> StoreResult<Webhook> {
        self.rotate_secret_rows(id, secret, now, old_until).await?;
        self.get_webhook(id).await
    }

    async fn delete_webhook(&self, id: i64) -> StoreResult<()> {
        tx!(self, tx => {
            let n = sqlx::query("DELETE FROM webhooks WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if n == 0 {
                return Err(not_found(format!("webhook {id}")));
            }
            for table in ["webhook_deliveries", "webhook_secrets"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE webhook_id = $1"))
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            }
        });
        Ok(())
    }

    async fn add_delivery(
        &self,
        webhook_id: i64,
        event_id: i64,
        event_type: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<WebhookDelivery> {
        self.get_webhook(webhook_id).await?;
        let sql = format!(
            "INSERT INTO webhook_deliveries (webhook_id, event_id, event_type, status, attempts, \
             next_attempt_at, created_at) VALUES ($1, $2, $3, {INITIAL_STATUS}, 0, $4, $4) \
             RETURNING {DELIVERY_COLS}"
        );
        writer!(self, p => sqlx::query(&sql)
            .bind(webhook_id)
            .bind(event_id)
            .bind(event_type)
            .bind(Ts(trunc(now)))
            .fetch_one(p)
            .await
            .map_err(be)
            .and_then(|r| delivery_from(&r)))
    }

    async fn list_deliveries(
        &self,
        webhook_id: i64,
        before_id: Option<i64>,
        limit: u32,
    ) -> StoreResult<Vec<WebhookDelivery>> {
        let sql = format!(
            "SELECT {DELIVERY_COLS} FROM webhook_deliveries WHERE webhook_id = $1 AND id < $2 \
             ORDER BY id DESC LIMIT $3"
        );
        read!(self, p => sqlx::query(&sql)
            .bind(webhook_id)
            .bind(before_id.unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(delivery_from)
            .collect())
    }

    async fn webhook_backlog(&self, now: DateTime<Utc>) -> StoreResult<WebhookBacklog> {
        // The (status, next_attempt_at) index answers both from one range.
        let sql = "SELECT COUNT(*) AS pending, \
                   MIN(CASE WHEN next_attempt_at <= $1 THEN next_attempt_at END) AS oldest \
                   FROM webhook_deliveries WHERE status = 'pending'";
        read!(self, p => {
            let row = sqlx::query(sql)
                .bind(Ts(trunc(now)))
                .fetch_one(p)
                .await
                .map_err(be)?;
            Ok(WebhookBacklog {
                pending: u64::try_from(row.int("pending")?).unwrap_or(0),
                oldest_due_at: row.opt_ts("oldest")?,
            })
        })
    }

    async fn claim_deliveries(
        &self,
        node: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<DueDelivery>> {
        // The outer condition repeats the inner one: PostgreSQL checks it
        // again on a row another claimer changed meanwhile, so two daemons
        // never both claim one delivery. The choice is a materialized CTE,
        // evaluated once: as a plain `IN (SELECT … LIMIT … SKIP LOCKED)`
        // PostgreSQL may rescan it after updating the rows it returned,
        // find those no longer due, and claim the next ones too (more than
        // `limit`).
        let lock = match &self.db {
            Db::Postgres(_) => " FOR UPDATE SKIP LOCKED",
            Db::Sqlite { .. } => "",
        };
        // A disabled subscription's deliveries are never claimed, whatever
        // their status says (a subscription disabled meanwhile holds them
        // in its own transaction). One whose subscription is gone is, so
        // it can be given up below.
        let enabled = "NOT EXISTS (SELECT 1 FROM webhooks w \
                       WHERE w.id = webhook_deliveries.webhook_id AND NOT w.enabled)";
        let sql = format!(
            "WITH due AS MATERIALIZED (SELECT id FROM webhook_deliveries \
              WHERE status = 'pending' AND next_attempt_at <= $2 \
              AND (claimed_until IS NULL OR claimed_until <= $2) AND {enabled} \
              ORDER BY next_attempt_at, id LIMIT $4{lock}) \
             UPDATE webhook_deliveries SET claimed_by = $1, claimed_until = $3 \
             WHERE status = 'pending' AND next_attempt_at <= $2 \
             AND (claimed_until IS NULL OR claimed_until <= $2) AND {enabled} \
             AND id IN (SELECT id FROM due) \
             RETURNING {DELIVERY_COLS}"
        );
        let claimed: Vec<WebhookDelivery> = writer!(self, p => sqlx::query(&sql)
            .bind(node)
            .bind(Ts(trunc(now)))
            .bind(Ts(trunc(until)))
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(delivery_from)
            .collect::<StoreResult<_>>()?);
        let hook_ids: Vec<i64> = claimed.iter().map(|d| d.webhook_id).collect();
        let event_ids: Vec<i64> = claimed.iter().map(|d| d.event_id).collect();
        let mut hooks = self
            .by_ids(
                &format!("SELECT {WEBHOOK_COLS} FROM webhooks WHERE id IN ("),
                &hook_ids,
                |r| r.webhook().map(|w| (w.id, w)),
            )
            .await?;
        let mut opened: Vec<Webhook> = hooks.drain().map(|(_, w)| w).collect();
        self.attach_secrets(&mut opened).await?;
        let hooks: HashMap<i64, Webhook> = opened.into_iter().map(|w| (w.id, w)).collect();
        let events = self
            .by_ids(
                &format!("SELECT {EVENT_COLS} FROM events WHERE id IN ("),
                &event_ids,
                |r| r.event().map(|e| (e.id, e)),
            )
            .await?;
        let mut due = Vec::with_capacity(claimed.len());
        for d in claimed {
            match (hooks.get(&d.webhook_id), events.get(&d.event_id)) {
                (Some(w), Some(e)) => due.push(DueDelivery {
                    webhook: w.clone(),
                    event: e.clone(),
                    delivery: d,
                }),
                // The subscription was deleted, or retention took the
                // event: nothing left to send.
                _ => {
                    let outcome = AttemptOutcome::GaveUp {
                        status: None,
                        error: "its subscription or its event no longer exists".into(),
                    };
                    self.finish_attempt(d.id, node, &outcome, now, Duration::MAX)
                        .await?;
                }
            }
        }
        Ok(due)
    }

    async fn finish_attempt(
        &self,
        delivery_id: i64,
        node: &str,
        outcome: &AttemptOutcome,
        now: DateTime<Utc>,
        disable_after: Duration,
    ) -> StoreResult<()> {
        let now_ts = Ts(trunc(now));
        let (status, code, error, next) = match outcome {
            AttemptOutcome::Delivered { status } => ("delivered", Some(*status), None, None),
            AttemptOutcome::Retry {
                status,
                error,
                next_attempt_at,
            } => (
                "pending",
                *status,
                Some(error.as_str()),
                Some(*next_attempt_at),
            ),
            AttemptOutcome::GaveUp { status, error } => {
                ("failed", *status, Some(error.as_str()), None)
            }
        };
        tx!(self, tx => {
            let row = sqlx::query(
                "UPDATE webhook_deliveries SET status = $3, attempts = attempts + 1, \
                 next_attempt_at = COALESCE($4, next_attempt_at), last_attempt_at = $5, \
                 last_status = $6, last_error = $7, claimed_by = NULL, claimed_until = NULL \
                 WHERE id = $1 AND claimed_by = $2 AND status = 'pending' RETURNING webhook_id",
            )
            .bind(delivery_id)
            .bind(node)
            .bind(status)
            .bind(next.map(|t| Ts(trunc(t))))
            .bind(now_ts)
            .bind(code.map(i64::from))
            .bind(error)
            .fetch_optional(&mut *tx)
            .await
            .map_err(be)?;
            let Some(row) = row else {
                return Err(StoreError::Conflict(format!(
                    "delivery {delivery_id} is not claimed by {node}"
                )));
            };
            let webhook_id = row.int("webhook_id")?;
            if matches!(outcome, AttemptOutcome::Delivered { .. }) {
                sqlx::query("UPDATE webhooks SET failing_since = NULL WHERE id = $1")
                    .bind(webhook_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(be)?;
            } else {
                let since = sqlx::query(
                    "UPDATE webhooks SET failing_since = COALESCE(failing_since, $2) \
                     WHERE id = $1 RETURNING failing_since, enabled",
                )
                .bind(webhook_id)
                .bind(now_ts)
                .fetch_optional(&mut *tx)
                .await
                .map_err(be)?;
                if let Some(r) = since {
                    let failing_since = r.ts("failing_since")?;
                    let failing = (now - failing_since).to_std().unwrap_or_default();
                    if r.flag("enabled")? && failing > disable_after {
                        let reason = format!(
                            "disabled by Herald: every attempt failed since {} (the last: {})",
                            failing_since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                            error.unwrap_or("no answer")
                        );
                        sqlx::query(
                            "UPDATE webhooks SET enabled = $2, disabled_reason = $3 WHERE id = $1",
                        )
                        .bind(webhook_id)
                        .bind(false)
                        .bind(reason)
                        .execute(&mut *tx)
                        .await
                        .map_err(be)?;
                        sqlx::query(HOLD_SQL[0])
                            .bind(webhook_id)
                            .execute(&mut *tx)
                            .await
                            .map_err(be)?;
                    }
                }
            }
        });
        Ok(())
    }

    async fn retry_delivery(
        &self,
        webhook_id: i64,
        delivery_id: i64,
        now: DateTime<Utc>,
    ) -> StoreResult<WebhookDelivery> {
        let initial = INITIAL_STATUS.replace("$1", "$2");
        let sql = format!(
            "UPDATE webhook_deliveries SET status = {initial}, next_attempt_at = $3, \
             claimed_by = NULL, claimed_until = NULL \
             WHERE id = $1 AND webhook_id = $2 RETURNING {DELIVERY_COLS}"
        );
        writer!(self, p => sqlx::query(&sql)
            .bind(delivery_id)
            .bind(webhook_id)
            .bind(Ts(trunc(now)))
            .fetch_optional(p)
            .await
            .map_err(be)?
            .map(|r| delivery_from(&r))
            .transpose()?)
        .ok_or_else(|| not_found(format!("delivery {delivery_id} of webhook {webhook_id}")))
    }
}
