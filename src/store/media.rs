//! The `media` table: uploaded pictures by content hash. [`MediaStore`] on SQL.

use super::records::{media_from, sql_limit, MEDIA_COLS};
use super::rows::{trunc, RowGet, Ts};
use super::{be, corrupt, is_fk_violation, not_found, SqlStore};
use super::{read, tx, writer};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use herald_actors::domain::*;
use herald_actors::ports::*;

#[async_trait]
impl MediaStore for SqlStore {
    // ------------------------------------------------------------ media

    async fn put_media(&self, m: &MediaInfo) -> StoreResult<MediaInfo> {
        let sql = format!("SELECT {MEDIA_COLS} FROM media WHERE sha256 = $1");
        let stored = tx!(self, tx => {
            sqlx::query(
                "INSERT INTO media (sha256, mime, size, filename, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (sha256) DO NOTHING",
            )
            .bind(m.id.as_str())
            .bind(&m.mime)
            .bind(i64::try_from(m.size).map_err(|_| {
                StoreError::Invalid(ValidationError::new("size", "is too large"))
            })?)
            .bind(m.filename.as_deref())
            .bind(Ts(m.created_at))
            .execute(&mut *tx)
            .await
            .map_err(be)?;
            let row = sqlx::query(&sql)
                .bind(m.id.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(be)?;
            media_from(&row)?
        });
        Ok(stored)
    }

    async fn get_media(&self, id: &MediaId) -> StoreResult<Option<MediaInfo>> {
        let sql = format!("SELECT {MEDIA_COLS} FROM media WHERE sha256 = $1");
        read!(self, p => sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(p)
            .await
            .map_err(be)?
            .as_ref()
            .map(media_from)
            .transpose())
    }

    async fn get_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
    ) -> StoreResult<Option<UploadHandle>> {
        read!(self, p => {
            let row = sqlx::query(
                "SELECT handle, expires_at FROM media_uploads WHERE account_id = $1 AND media_id = $2",
            )
            .bind(account.as_str())
            .bind(media.as_str())
            .fetch_optional(p)
            .await
            .map_err(be)?;
            match row {
                Some(r) => Ok(Some(UploadHandle {
                    handle: r.text("handle")?,
                    expires_at: r.ts("expires_at")?,
                })),
                None => Ok(None),
            }
        })
    }

    async fn put_upload_handle(
        &self,
        account: &AccountId,
        media: &MediaId,
        h: &UploadHandle,
    ) -> StoreResult<()> {
        writer!(self, p => sqlx::query(
            "INSERT INTO media_uploads (account_id, media_id, handle, expires_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (account_id, media_id) \
             DO UPDATE SET handle = excluded.handle, expires_at = excluded.expires_at",
        )
        .bind(account.as_str())
        .bind(media.as_str())
        .bind(&h.handle)
        .bind(Ts(h.expires_at))
        .execute(p)
        .await
        .map(drop)
        .map_err(|e| {
            if is_fk_violation(&e) {
                not_found(format!("account {account} or media {media}"))
            } else {
                be(e)
            }
        }))?;
        Ok(())
    }

    async fn prune_media(&self, before: DateTime<Utc>, limit: u32) -> StoreResult<Vec<MediaId>> {
        // One statement: a reminder written meanwhile either commits first
        // (and its part keeps the media) or finds the media gone (422).
        let mut ids: Vec<MediaId> = writer!(self, p => sqlx::query(
            "DELETE FROM media WHERE sha256 IN (SELECT m.sha256 FROM media m \
             WHERE m.created_at < $1 \
             AND NOT EXISTS (SELECT 1 FROM reminder_parts x WHERE x.media_id = m.sha256) \
             ORDER BY m.sha256 LIMIT $2) RETURNING sha256",
        )
        .bind(Ts(trunc(before)))
        .bind(sql_limit(limit))
        .fetch_all(p)
        .await
        .map_err(be)?
        .iter()
        .map(|r| MediaId::parse(&r.text("sha256")?).map_err(|e| corrupt("media id", e)))
        .collect::<StoreResult<_>>())?;
        ids.sort();
        Ok(ids)
    }
}
