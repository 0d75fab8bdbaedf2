//! The two places where SQLite and PostgreSQL differ below the SQL text:
//! how an instant is bound and how a column is read back. Everything above
//! (the SQL and the row mapping) is written once.

use chrono::{DateTime, Utc};
use herald_actors::ports::{StoreError, StoreResult};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgRow, PgTypeInfo};
use sqlx::sqlite::{SqliteArgumentValue, SqliteRow, SqliteTypeInfo};
use sqlx::{Encode, Postgres, Row, Sqlite, Type};

/// An instant as a bind parameter: microseconds since the epoch on SQLite
/// (see the migration), timestamptz on PostgreSQL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ts(pub DateTime<Utc>);

impl Type<Sqlite> for Ts {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }
}

impl<'q> Encode<'q, Sqlite> for Ts {
    fn encode_by_ref(&self, buf: &mut Vec<SqliteArgumentValue<'q>>) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<'q, Sqlite>>::encode_by_ref(&self.0.timestamp_micros(), buf)
    }
}

impl Type<Postgres> for Ts {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }
}

impl Encode<'_, Postgres> for Ts {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <DateTime<Utc> as Encode<'_, Postgres>>::encode_by_ref(&self.0, buf)
    }
}

/// Both backends keep microseconds; truncating on the way in means what a
/// call returns is exactly what a later read returns.
pub(crate) fn trunc(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

fn from_micros(us: i64) -> StoreResult<DateTime<Utc>> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| StoreError::Backend(format!("stored instant out of range: {us}")))
}

fn col_err(col: &str, e: sqlx::Error) -> StoreError {
    StoreError::Backend(format!("reading column {col}: {e}"))
}

/// Typed column access with one spelling for both row types.
pub(crate) trait RowGet {
    fn int(&self, col: &str) -> StoreResult<i64>;
    fn opt_int(&self, col: &str) -> StoreResult<Option<i64>>;
    fn text(&self, col: &str) -> StoreResult<String>;
    fn opt_text(&self, col: &str) -> StoreResult<Option<String>>;
    fn flag(&self, col: &str) -> StoreResult<bool>;
    fn bytes(&self, col: &str) -> StoreResult<Vec<u8>>;
    fn ts(&self, col: &str) -> StoreResult<DateTime<Utc>>;
    fn opt_ts(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>>;
}

macro_rules! common_getters {
    () => {
        fn int(&self, col: &str) -> StoreResult<i64> {
            self.try_get(col).map_err(|e| col_err(col, e))
        }
        fn opt_int(&self, col: &str) -> StoreResult<Option<i64>> {
            self.try_get(col).map_err(|e| col_err(col, e))
        }
        fn text(&self, col: &str) -> StoreResult<String> {
            self.try_get(col).map_err(|e| col_err(col, e))
        }
        fn opt_text(&self, col: &str) -> StoreResult<Option<String>> {
            self.try_get(col).map_err(|e| col_err(col, e))
        }
        fn flag(&self, col: &str) -> StoreResult<bool> {
            self.try_get(col).map_err(|e| col_err(col, e))
        }
        fn bytes(&self, col: &str) -> StoreResult<Vec<u8>> {
            self.try_get(col).map_err(|e| col_err(col, e))
        }
    };
}

impl RowGet for SqliteRow {
    common_getters!();
    fn ts(&self, col: &str) -> StoreResult<DateTime<Utc>> {
        from_micros(self.try_get(col).map_err(|e| col_err(col, e))?)
    }
    fn opt_ts(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
        self.try_get::<Option<i64>, _>(col)
            .map_err(|e| col_err(col, e))?
            .map(from_micros)
            .transpose()
    }
}

impl RowGet for PgRow {
    common_getters!();
    fn ts(&self, col: &str) -> StoreResult<DateTime<Utc>> {
        self.try_get(col).map_err(|e| col_err(col, e))
    }
    fn opt_ts(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
        self.try_get(col).map_err(|e| col_err(col, e))
    }
}
