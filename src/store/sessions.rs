//! Console sign-ins (`console_sessions`), each kept until it expires, so
//! a restart or another daemon of a cluster keeps the operator signed in.

use super::rows::{trunc, RowGet, Ts};
use super::{be, parse_enum, SqlStore};
use super::{read, tx, writer};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::ConsoleSession;
use herald_actors::ports::*;

#[async_trait]
impl ConsoleSessionStore for SqlStore {
    async fn put_console_session(
        &self,
        session: &ConsoleSession,
        now: DateTime<Utc>,
        max: u32,
    ) -> StoreResult<()> {
        let now = Ts(trunc(now));
        tx!(self, tx => {
            sqlx::query("DELETE FROM console_sessions WHERE expires_at <= $1")
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            // The cap is per identity: a user by id, a built-in principal
            // (no id) by its name, so no user's sign-ins end the daemon
            // token's sessions, whatever the user is called.
            let same = match session.user_id {
                Some(_) => "user_id = $1",
                None => "user_id IS NULL AND user_name = $1",
            };
            let count = format!("SELECT COUNT(*) AS n FROM console_sessions WHERE {same}");
            let live = match session.user_id {
                Some(id) => sqlx::query(&count).bind(id),
                None => sqlx::query(&count).bind(session.user_name.clone()),
            }
            .fetch_one(&mut *tx)
            .await
            .map_err(be)?
            .int("n")?;
            // Signing in again and again (a script gone wrong) ends that
            // user's sessions closest to their end instead of growing the
            // table, and never another user's.
            let over = live - i64::from(max.max(1)) + 1;
            if over > 0 {
                let oldest = format!(
                    "DELETE FROM console_sessions WHERE id_hash IN (SELECT id_hash FROM \
                     console_sessions WHERE {same} ORDER BY expires_at, id_hash LIMIT $2)"
                );
                match session.user_id {
                    Some(id) => sqlx::query(&oldest).bind(id),
                    None => sqlx::query(&oldest).bind(session.user_name.clone()),
                }
                .bind(over)
                .execute(&mut *tx)
                .await
                .map_err(be)?;
            }
            sqlx::query(
                "INSERT INTO console_sessions (id_hash, csrf, expires_at, user_id, user_name, role, \
                 token_mark) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&session.id_hash)
            .bind(&session.csrf)
            .bind(Ts(trunc(session.expires_at)))
            .bind(session.user_id)
            .bind(&session.user_name)
            .bind(session.role.as_str())
            .bind(&session.token_mark)
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            Ok::<(), StoreError>(())
        })
    }

    async fn get_console_session(
        &self,
        id_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ConsoleSession>> {
        read!(self, p => sqlx::query(
            "SELECT id_hash, csrf, expires_at, user_id, user_name, role, token_mark FROM \
             console_sessions \
             WHERE id_hash = $1 AND expires_at > $2",
        )
        .bind(id_hash)
        .bind(Ts(trunc(now)))
        .fetch_optional(p)
        .await
        .map_err(be)?
        .map(|r| {
            Ok(ConsoleSession {
                id_hash: r.text("id_hash")?,
                csrf: r.text("csrf")?,
                expires_at: r.ts("expires_at")?,
                user_id: r.opt_int("user_id")?,
                user_name: r.text("user_name")?,
                role: parse_enum(r.text("role")?, "role")?,
                token_mark: r.opt_text("token_mark")?,
            })
        })
        .transpose())
    }

    async fn delete_console_session(&self, id_hash: &str) -> StoreResult<()> {
        writer!(self, p => sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .execute(p)
            .await
            .map_err(be)?
            .rows_affected());
        Ok(())
    }
}
