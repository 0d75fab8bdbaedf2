//! The `api_users` and `audit_log` tables: [`UserStore`] and
//! [`AuditStore`] on SQL.

use super::rows::{trunc, RowGet, Ts};
use super::{be, not_found, parse_enum, Db, SqlStore};
use super::{read, tx, writer};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::*;

const USER_COLS: &str = "id, name, role, token_hash, created_at, expires_at, created_by";

fn user_from(r: &impl RowGet) -> StoreResult<ApiUser> {
    Ok(ApiUser {
        id: r.int("id")?,
        name: r.text("name")?,
        role: parse_enum(r.text("role")?, "role")?,
        token_hash: r.text("token_hash")?,
        created_at: r.ts("created_at")?,
        expires_at: r.opt_ts("expires_at")?,
        created_by: r.text("created_by")?,
    })
}

#[async_trait]
impl UserStore for SqlStore {
    async fn create_user(&self, u: &NewApiUser) -> StoreResult<ApiUser> {
        let sql = format!(
            "INSERT INTO api_users (name, role, token_hash, created_at, expires_at, created_by) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING {USER_COLS}"
        );
        let row = writer!(self, p => sqlx::query(&sql)
            .bind(&u.name)
            .bind(u.role.as_str())
            .bind(&u.token_hash)
            .bind(Ts(trunc(u.created_at)))
            .bind(u.expires_at.map(|t| Ts(trunc(t))))
            .bind(&u.created_by)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .map(|r| user_from(&r))
            .transpose()?);
        row.ok_or_else(|| StoreError::Conflict(format!("a user named {} exists", u.name)))
    }

    async fn list_users(&self) -> StoreResult<Vec<ApiUser>> {
        let sql = format!("SELECT {USER_COLS} FROM api_users ORDER BY id");
        read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(user_from)
            .collect())
    }

    async fn get_user(&self, id: i64) -> StoreResult<ApiUser> {
        let sql = format!("SELECT {USER_COLS} FROM api_users WHERE id = $1");
        read!(self, p => sqlx::query(&sql)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(be)?
            .map(|r| user_from(&r))
            .transpose()?)
        .ok_or_else(|| not_found(format!("user {id}")))
    }

    async fn user_by_token(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ApiUser>> {
        let sql = format!(
            "SELECT {USER_COLS} FROM api_users WHERE token_hash = $1 \
             AND (expires_at IS NULL OR expires_at > $2)"
        );
        read!(self, p => sqlx::query(&sql)
            .bind(token_hash)
            .bind(Ts(trunc(now)))
            .fetch_optional(p)
            .await
            .map_err(be)?
            .map(|r| user_from(&r))
            .transpose())
    }

    async fn delete_user(&self, id: i64) -> StoreResult<()> {
        tx!(self, tx => {
            let n = sqlx::query("DELETE FROM api_users WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(be)?
                .rows_affected();
            if n == 0 {
                return Err(not_found(format!("user {id}")));
            }
            sqlx::query("DELETE FROM console_sessions WHERE user_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(be)?;
        });
        Ok(())
    }
}

const AUDIT_COLS: &str = "id, at, actor, actor_id, role, via, operation, method, path, \
                          resource, summary, status, remote, count, forwarded_by";

fn audit_from(r: &impl RowGet) -> StoreResult<AuditEntry> {
    Ok(AuditEntry {
        id: r.int("id")?,
        entry: NewAuditEntry {
            at: r.ts("at")?,
            actor: r.text("actor")?,
            actor_id: r.opt_int("actor_id")?,
            role: r
                .opt_text("role")?
                .map(|role| parse_enum(role, "role"))
                .transpose()?,
            via: r.text("via")?,
            operation: r.text("operation")?,
            method: r.text("method")?,
            path: r.text("path")?,
            resource: r.opt_text("resource")?,
            summary: r.text("summary")?,
            status: u16::try_from(r.int("status")?).unwrap_or(0),
            remote: r.text("remote")?,
            count: u32::try_from(r.int("count")?).unwrap_or(1),
            forwarded_by: r.opt_text("forwarded_by")?,
        },
    })
}

#[async_trait]
impl AuditStore for SqlStore {
    async fn append_audit(&self, e: &NewAuditEntry) -> StoreResult<i64> {
        writer!(self, p => sqlx::query(
            "INSERT INTO audit_log (at, actor, actor_id, role, via, operation, method, path, \
             resource, summary, status, remote, count, forwarded_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING id",
        )
        .bind(Ts(trunc(e.at)))
        .bind(&e.actor)
        .bind(e.actor_id)
        .bind(e.role.map(|r| r.as_str()))
        .bind(&e.via)
        .bind(&e.operation)
        .bind(&e.method)
        .bind(&e.path)
        .bind(&e.resource)
        .bind(&e.summary)
        .bind(i64::from(e.status))
        .bind(&e.remote)
        .bind(i64::from(e.count))
        .bind(&e.forwarded_by)
        .fetch_one(p)
        .await
        .map_err(be)?
        .int("id"))
    }

    async fn set_audit_count(&self, id: i64, count: u32) -> StoreResult<()> {
        let n = writer!(self, p => sqlx::query("UPDATE audit_log SET count = $1 WHERE id = $2")
            .bind(i64::from(count))
            .bind(id)
            .execute(p)
            .await
            .map_err(be)?
            .rows_affected());
        if n == 0 {
            return Err(not_found(format!("audit entry {id}")));
        }
        Ok(())
    }

    async fn list_audit(
        &self,
        f: &AuditFilter,
        before_id: Option<i64>,
        limit: u32,
    ) -> StoreResult<Vec<AuditEntry>> {
        // Every filter binds; an absent one matches all rows, so one
        // statement serves every combination.
        let sql = format!(
            "SELECT {AUDIT_COLS} FROM audit_log WHERE id < $1 \
             AND ($2 IS NULL OR actor = $2) AND ($3 IS NULL OR operation = $3) \
             AND ($4 IS NULL OR resource = $4) AND ($5 IS NULL OR at >= $5) \
             AND ($6 IS NULL OR at < $6) ORDER BY id DESC LIMIT $7"
        );
        let sql = match &self.db {
            // PostgreSQL must know a parameter's type where only `IS NULL`
            // would tell it.
            Db::Postgres(_) => sql
                .replace("$2 IS NULL", "$2::text IS NULL")
                .replace("$3 IS NULL", "$3::text IS NULL")
                .replace("$4 IS NULL", "$4::text IS NULL")
                .replace("$5 IS NULL", "$5::timestamptz IS NULL")
                .replace("$6 IS NULL", "$6::timestamptz IS NULL"),
            Db::Sqlite { .. } => sql,
        };
        read!(self, p => sqlx::query(&sql)
            .bind(before_id.unwrap_or(i64::MAX))
            .bind(&f.actor)
            .bind(&f.operation)
            .bind(&f.resource)
            .bind(f.since.map(|t| Ts(trunc(t))))
            .bind(f.until.map(|t| Ts(trunc(t))))
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(audit_from)
            .collect())
    }

    async fn prune_audit(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        Ok(writer!(self, p => sqlx::query(
            "DELETE FROM audit_log WHERE id IN \
             (SELECT id FROM audit_log WHERE at < $1 ORDER BY id LIMIT $2)",
        )
        .bind(Ts(trunc(before)))
        .bind(i64::from(limit))
        .execute(p)
        .await
        .map_err(be)?
        .rows_affected()))
    }
}
