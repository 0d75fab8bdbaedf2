//! What PostgreSQL counted while a benchmark ran: transactions, rows
//! written, updates that could not be made in place, and WAL, per 1,000 of
//! what the benchmark did. Counted, not timed, so `tests/suite/cost.rs` can
//! hold them to committed baselines.

/// What PostgreSQL counted for the benchmark's database (transactions
/// committed, rows written) and for the whole server (WAL): read before and
/// after. WAL is server-wide: its figures assume nothing else writes
/// meanwhile. A backend flushes its statistics when it exits: close the
/// pool before the second reading.
pub(crate) struct DbCost {
    commits: i64,
    rows: i64,
    /// Updates that were not HOT: each wrote its new row version on another
    /// page and a new entry in every index of its table.
    moved: i64,
    wal_bytes: f64,
    wal_records: i64,
}

impl DbCost {
    /// `None` on SQLite.
    pub(crate) async fn read(url: &str) -> anyhow::Result<Option<Self>> {
        use sqlx::Connection as _;
        if !url.starts_with("postgres") {
            return Ok(None);
        }
        let mut c = sqlx::PgConnection::connect(url).await?;
        // A backend flushes its counts as it exits, after the pool has let
        // go of it, and after it leaves pg_stat_activity: wait until the
        // benchmark's backends are gone, then until two readings agree
        // (up to 8 % of a run's rows were missing without this; in some
        // runs part of the counts still goes missing, not understood yet).
        for _ in 0..100 {
            let others: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .fetch_one(&mut c)
            .await?;
            if others == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let mut last = Self::snapshot(&mut c).await?;
        for _ in 0..30 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let now = Self::snapshot(&mut c).await?;
            // The readings themselves commit: compare what the benchmark wrote.
            if (now.rows, now.wal_records) == (last.rows, last.wal_records) {
                break;
            }
            last = now;
        }
        c.close().await?;
        Ok(Some(last))
    }

    async fn snapshot(c: &mut sqlx::PgConnection) -> anyhow::Result<Self> {
        use sqlx::Row as _;
        let db = sqlx::query(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted AS rows \
             FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut *c)
        .await?;
        let moved: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(n_tup_upd - n_tup_hot_upd), 0)::bigint FROM pg_stat_user_tables",
        )
        .fetch_one(&mut *c)
        .await?;
        let wal = sqlx::query("SELECT wal_bytes::float8 AS bytes, wal_records FROM pg_stat_wal")
            .fetch_one(&mut *c)
            .await?;
        Ok(Self {
            commits: db.try_get("xact_commit")?,
            rows: db.try_get("rows")?,
            moved,
            wal_bytes: wal.try_get("bytes")?,
            wal_records: wal.try_get("wal_records")?,
        })
    }

    /// ` {prefix}commits_per_1000=… {prefix}rows_per_1000=…
    /// {prefix}moved_per_1000=… wal_records_per_1000=… wal_kb_per_1000=…`,
    /// the difference from `before` per 1,000 of `n`.
    pub(crate) fn per_thousand(&self, before: &Self, n: u64, prefix: &str) -> String {
        let k = n.max(1) as f64 / 1000.0;
        format!(
            " {prefix}commits_per_1000={:.1} {prefix}rows_per_1000={:.0} {prefix}moved_per_1000={:.0} wal_records_per_1000={:.0} wal_kb_per_1000={:.1}",
            (self.commits - before.commits) as f64 / k,
            (self.rows - before.rows) as f64 / k,
            (self.moved - before.moved) as f64 / k,
            (self.wal_records - before.wal_records) as f64 / k,
            (self.wal_bytes - before.wal_bytes) / 1024.0 / k,
        )
    }

    /// The line's cost part for `n` done since `before` was read (empty on
    /// SQLite, where `before` is `None`); the pool must be closed first.
    pub(crate) async fn since(
        before: Option<Self>,
        url: &str,
        n: u64,
        prefix: &str,
    ) -> anyhow::Result<String> {
        Ok(match before {
            Some(before) => Self::read(url)
                .await?
                .map(|after| after.per_thousand(&before, n, prefix))
                .unwrap_or_default(),
            None => String::new(),
        })
    }

    /// WAL kilobytes and rows written since `before`.
    pub(crate) fn totals_since(&self, before: &Self) -> (f64, f64) {
        (
            (self.wal_bytes - before.wal_bytes) / 1024.0,
            (self.rows - before.rows) as f64,
        )
    }
}
