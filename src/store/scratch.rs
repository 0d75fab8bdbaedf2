//! Throwaway databases for the contract tests and `herald bench store`.

use anyhow::Context as _;
use sqlx::{Connection as _, Executor as _, PgConnection};

/// A PostgreSQL database with a random name, created through a base URL
/// that can `CREATE DATABASE`. Call [`ScratchPostgres::drop_database`] when
/// done; a database left behind is named `herald_scratch_…` for cleaning up.
#[derive(Debug)]
pub struct ScratchPostgres {
    base_url: String,
    pub name: String,
    /// The base URL pointing at the new database.
    pub url: String,
}

impl ScratchPostgres {
    pub async fn create(base_url: &str) -> anyhow::Result<Self> {
        let name = format!("herald_scratch_{:016x}", rand::random::<u64>());
        let mut conn = PgConnection::connect(base_url)
            .await
            .with_context(|| format!("connecting to {base_url} to create a scratch database"))?;
        // The name is ours ([a-z0-9_]), so formatting it into SQL is safe.
        conn.execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .with_context(|| format!("creating database {name}"))?;
        conn.close().await.ok();
        Ok(Self {
            url: with_database(base_url, &name)?,
            base_url: base_url.to_owned(),
            name,
        })
    }

    /// Drops the database, closing whatever connections are still open on it.
    pub async fn drop_database(self) -> anyhow::Result<()> {
        let mut conn = PgConnection::connect(&self.base_url).await?;
        let forced = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if conn.execute(forced.as_str()).await.is_err() {
            // Before PostgreSQL 13 there is no FORCE.
            conn.execute(format!("DROP DATABASE IF EXISTS {}", self.name).as_str())
                .await
                .with_context(|| format!("dropping database {}", self.name))?;
        }
        conn.close().await.ok();
        Ok(())
    }
}

/// Replaces the database name in a `postgres://user@host:port/db?opts` URL.
pub fn with_database(url: &str, db: &str) -> anyhow::Result<String> {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let authority = head
        .find("://")
        .map(|i| i + 3)
        .with_context(|| format!("{url:?} is not a postgres:// URL"))?;
    let base = match head[authority..].find('/') {
        Some(i) => &head[..authority + i],
        None => head,
    };
    Ok(match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    })
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn database_name_is_replaced_or_added() {
        let cases = [
            ("postgres://u@h:5432/test", "postgres://u@h:5432/x"),
            ("postgres://u@h:5432", "postgres://u@h:5432/x"),
            (
                "postgres://u@h/test?sslmode=disable",
                "postgres://u@h/x?sslmode=disable",
            ),
            ("postgresql://h/", "postgresql://h/x"),
        ];
        for (from, to) in cases {
            assert_eq!(with_database(from, "x").unwrap(), to, "{from}");
        }
        assert!(with_database("nonsense", "x").is_err());
    }
}
