//! Live daemons (`nodes`) and account leases (`account_leases`): the
//! [`Store`](herald_actors::ports::Store) lease methods in `mod.rs`
//! delegate here, and `update_run` / `apply_transitions_fenced` check
//! fences with [`SqlStore::fence_check_sql`].
//!
//! Every expiry is read and written on the database's clock, so daemons
//! whose clocks disagree still agree on who owns what.

use super::rows::RowGet;
use super::{be, is_fk_violation, not_found, Db, SqlStore};
use super::{read, writer};
use async_trait::async_trait;
use herald_actors::domain::AccountId;
use herald_actors::domain::{Fence, Lease, NodeInfo};
use herald_actors::ports::*;
use std::time::Duration;

/// The database's clock as each dialect stores an instant.
const SQLITE_NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";
const PG_NOW: &str = "clock_timestamp()";

fn lease_from(r: &impl RowGet) -> StoreResult<Lease> {
    Ok(Lease {
        account: AccountId::parse(&r.text("account_id")?)
            .map_err(|e| StoreError::Backend(format!("stored account id is invalid: {e}")))?,
        node: r.text("node_id")?,
        epoch: r.int("epoch")?,
        expires_at: r.ts("expires_at")?,
        expired: r.flag("expired")?,
    })
}

fn node_from(r: &impl RowGet) -> StoreResult<NodeInfo> {
    Ok(NodeInfo {
        node: r.text("node_id")?,
        control_url: r.opt_text("control_url")?,
        expires_at: r.ts("expires_at")?,
    })
}

impl SqlStore {
    pub(super) fn now_sql(&self) -> &'static str {
        match self.db {
            Db::Sqlite { .. } => SQLITE_NOW,
            Db::Postgres(_) => PG_NOW,
        }
    }

    /// Now plus the seconds bound at `$n` (a float).
    fn later_sql(&self, n: usize) -> String {
        match self.db {
            Db::Sqlite { .. } => format!("({SQLITE_NOW} + CAST(${n} * 1000000.0 AS INTEGER))"),
            Db::Postgres(_) => format!("({PG_NOW} + make_interval(secs => ${n}::float8))"),
        }
    }

    /// Selects a row while `$1..$3` (account, node, epoch) is the current,
    /// unexpired lease. On PostgreSQL the row is share-locked to the end of
    /// the writing transaction, so a takeover waits for the write to
    /// commit, and a write after a takeover sees the new epoch.
    pub(super) fn fence_check_sql(&self) -> String {
        let lock = match self.db {
            Db::Sqlite { .. } => "",
            Db::Postgres(_) => " FOR SHARE",
        };
        format!(
            "SELECT epoch FROM account_leases WHERE account_id = $1 AND node_id = $2 \
             AND epoch = $3 AND expires_at > {}{lock}",
            self.now_sql()
        )
    }

    pub(super) async fn node_heartbeat_sql(
        &self,
        node: &str,
        instance: &str,
        control_url: Option<&str>,
        ttl: Duration,
    ) -> StoreResult<()> {
        let sql = format!(
            "INSERT INTO nodes (node_id, instance, control_url, expires_at) \
             VALUES ($1, $2, $3, {later}) \
             ON CONFLICT (node_id) DO UPDATE SET instance = excluded.instance, \
               control_url = excluded.control_url, expires_at = excluded.expires_at \
             WHERE nodes.instance = excluded.instance OR nodes.expires_at <= {now}",
            later = self.later_sql(4),
            now = self.now_sql()
        );
        let n = writer!(self, p => sqlx::query(&sql)
            .bind(node)
            .bind(instance)
            .bind(control_url)
            .bind(ttl.as_secs_f64())
            .execute(p)
            .await
            .map_err(be)?
            .rows_affected());
        if n == 0 {
            return Err(StoreError::Conflict(format!(
                "node id {node:?} is in use by another running Herald daemon; give each \
                 daemon its own cluster.node_id"
            )));
        }
        Ok(())
    }

    pub(super) async fn node_leave_sql(&self, node: &str, instance: &str) -> StoreResult<()> {
        writer!(self, p => sqlx::query("DELETE FROM nodes WHERE node_id = $1 AND instance = $2")
            .bind(node)
            .bind(instance)
            .execute(p)
            .await
            .map_err(be)
            .map(drop))?;
        Ok(())
    }

    pub(super) async fn live_nodes_sql(&self) -> StoreResult<Vec<NodeInfo>> {
        let sql = format!(
            "SELECT node_id, control_url, expires_at FROM nodes WHERE expires_at > {} \
             ORDER BY node_id",
            self.now_sql()
        );
        read!(self, p => sqlx::query(&sql)
            .fetch_all(p)
            .await
            .map_err(be)?
            .iter()
            .map(node_from)
            .collect())
    }

    pub(super) async fn list_leases_sql(&self) -> StoreResult<Vec<Lease>> {
        let sql = format!(
            "SELECT account_id, node_id, epoch, expires_at, expires_at <= {} AS expired \
             FROM account_leases ORDER BY account_id",
            self.now_sql()
        );
        read!(self, p => sqlx::query(&sql)
        .fetch_all(p)
        .await
        .map_err(be)?
        .iter()
        .map(lease_from)
        .collect())
    }

    pub(super) async fn acquire_lease_sql(
        &self,
        account: &AccountId,
        node: &str,
        ttl: Duration,
    ) -> StoreResult<Option<Lease>> {
        // On PostgreSQL a racing taker waits on the row and re-checks the
        // WHERE against the winner's row: only one of them gets it.
        let sql = format!(
            "INSERT INTO account_leases (account_id, node_id, epoch, expires_at) \
             VALUES ($1, $2, 1, {later}) \
             ON CONFLICT (account_id) DO UPDATE SET node_id = excluded.node_id, \
               epoch = account_leases.epoch + 1, expires_at = excluded.expires_at \
             WHERE account_leases.expires_at <= {now} \
             RETURNING account_id, node_id, epoch, expires_at, expires_at <= {now} AS expired",
            later = self.later_sql(3),
            now = self.now_sql()
        );
        let row = writer!(self, p => sqlx::query(&sql)
            .bind(account.as_str())
            .bind(node)
            .bind(ttl.as_secs_f64())
            .fetch_optional(p)
            .await
            .map_err(|e| if is_fk_violation(&e) {
                not_found(format!("account {account}"))
            } else {
                be(e)
            })?
            .as_ref()
            .map(lease_from)
            .transpose())?;
        Ok(row)
    }

    pub(super) async fn renew_leases_sql(
        &self,
        fences: &[Fence],
        ttl: Duration,
    ) -> StoreResult<Vec<bool>> {
        if let Db::Postgres(p) = &self.db {
            // One statement for every lease, however many accounts the
            // daemon holds: a renewal round stays one round trip.
            let sql = format!(
                "UPDATE account_leases AS l SET expires_at = {later} \
                 FROM UNNEST($1::text[], $2::text[], $3::bigint[]) AS f(account_id, node_id, epoch) \
                 WHERE l.account_id = f.account_id AND l.node_id = f.node_id \
                 AND l.epoch = f.epoch AND l.expires_at > {now} \
                 RETURNING l.account_id, l.node_id, l.epoch",
                later = self.later_sql(4),
                now = self.now_sql()
            );
            let renewed: std::collections::HashSet<(String, String, i64)> = sqlx::query(&sql)
                .bind(
                    fences
                        .iter()
                        .map(|f| f.account.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(fences.iter().map(|f| f.node.as_str()).collect::<Vec<_>>())
                .bind(fences.iter().map(|f| f.epoch).collect::<Vec<_>>())
                .bind(ttl.as_secs_f64())
                .fetch_all(p)
                .await
                .map_err(be)?
                .iter()
                .map(|r| Ok((r.text("account_id")?, r.text("node_id")?, r.int("epoch")?)))
                .collect::<StoreResult<_>>()?;
            // Matched on the whole fence: a stale or foreign fence for an
            // account renewed by its own fence is still refused.
            return Ok(fences
                .iter()
                .map(|f| renewed.contains(&(f.account.to_string(), f.node.clone(), f.epoch)))
                .collect());
        }
        let sql = format!(
            "UPDATE account_leases SET expires_at = {later} WHERE account_id = $1 \
             AND node_id = $2 AND epoch = $3 AND expires_at > {now}",
            later = self.later_sql(4),
            now = self.now_sql()
        );
        let mut out = Vec::with_capacity(fences.len());
        // SQLite serves one daemon (cluster mode is refused there): a
        // statement per lease is enough for the contract.
        for f in fences {
            let n = writer!(self, p => sqlx::query(&sql)
                .bind(f.account.as_str())
                .bind(&f.node)
                .bind(f.epoch)
                .bind(ttl.as_secs_f64())
                .execute(p)
                .await
                .map_err(be)?
                .rows_affected());
            out.push(n == 1);
        }
        Ok(out)
    }

    pub(super) async fn release_lease_sql(&self, f: &Fence) -> StoreResult<()> {
        let sql = format!(
            "UPDATE account_leases SET expires_at = {} WHERE account_id = $1 \
             AND node_id = $2 AND epoch = $3",
            self.now_sql()
        );
        writer!(self, p => sqlx::query(&sql)
            .bind(f.account.as_str())
            .bind(&f.node)
            .bind(f.epoch)
            .execute(p)
            .await
            .map_err(be)
            .map(drop))?;
        Ok(())
    }
}

#[async_trait]
impl LeaseStore for SqlStore {
    // ------------------------------------------------------------ leases

    async fn node_heartbeat(
        &self,
        node: &str,
        instance: &str,
        control_url: Option<&str>,
        ttl: Duration,
    ) -> StoreResult<()> {
        self.node_heartbeat_sql(node, instance, control_url, ttl)
            .await
    }

    async fn node_leave(&self, node: &str, instance: &str) -> StoreResult<()> {
        self.node_leave_sql(node, instance).await
    }

    async fn live_nodes(&self) -> StoreResult<Vec<herald_actors::domain::NodeInfo>> {
        self.live_nodes_sql().await
    }

    async fn list_leases(&self) -> StoreResult<Vec<herald_actors::domain::Lease>> {
        self.list_leases_sql().await
    }

    async fn acquire_lease(
        &self,
        account: &AccountId,
        node: &str,
        ttl: Duration,
    ) -> StoreResult<Option<herald_actors::domain::Lease>> {
        self.acquire_lease_sql(account, node, ttl).await
    }

    async fn renew_leases(
        &self,
        fences: &[herald_actors::domain::Fence],
        ttl: Duration,
    ) -> StoreResult<Vec<bool>> {
        self.renew_leases_sql(fences, ttl).await
    }

    async fn release_lease(&self, fence: &herald_actors::domain::Fence) -> StoreResult<()> {
        self.release_lease_sql(fence).await
    }
}
