//! Pictures for reminder parts, content-addressed by sha256: storing one
//! (its bytes decide its type) and reading its record.

use super::error::{ApiError, Kind};
use super::Service;
use super::{Allowed, Operation};
use crate::media::FileMedia;
use herald_actors::domain::{MediaId, MediaInfo, Role};
use herald_actors::ports::Store;

pub static UPLOAD: Operation = Operation::new("uploadMedia", Role::Operator);
pub static GET: Operation = Operation::read("getMedia", Role::Viewer);

/// The images WhatsApp shows inline. The bytes decide, not the
/// Content-Type a client claims.
pub const ACCEPTED: &[&str] = &["image/jpeg", "image/png", "image/webp", "image/gif"];

/// What media needs: the files and their records.
pub struct Media<'a> {
    store: &'a dyn Store,
    files: &'a FileMedia,
}

impl<'a> Media<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
            files: &state.media,
        }
    }

    /// Stores the picture `bytes`. Idempotent: the same bytes again answer
    /// with the first record.
    pub async fn upload(
        &self,
        allowed: Allowed,
        bytes: &[u8],
        filename: Option<String>,
    ) -> Result<MediaInfo, ApiError> {
        allowed.of(&UPLOAD)?;
        let mime = sniff(bytes)?;
        // The collector does not remove a file written but not yet recorded.
        let _gc = self.files.gc_lock().await;
        let id = self
            .files
            .write(bytes)
            .await
            .map_err(|e| ApiError::internal("could not store the media file", e))?;
        let info = MediaInfo {
            id,
            mime: mime.to_owned(),
            size: bytes.len() as u64,
            filename,
            created_at: chrono::Utc::now(),
        };
        Ok(self.store.put_media(&info).await?)
    }

    /// A picture's record.
    pub async fn get(&self, allowed: Allowed, id: &MediaId) -> Result<MediaInfo, ApiError> {
        allowed.of(&GET)?;
        self.store
            .get_media(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("media {id}")))
    }
}

fn sniff(bytes: &[u8]) -> Result<&'static str, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            "body",
            "must not be empty: send the image bytes",
        ));
    }
    match infer::get(bytes).map(|t| t.mime_type()) {
        Some(m) if ACCEPTED.contains(&m) => Ok(m),
        found => Err(ApiError::new(
            Kind::UnsupportedMedia,
            format!(
                "media must be a JPEG, PNG, WebP or GIF image; these bytes look like {}",
                found.unwrap_or("none of the known types")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_images_pass_the_sniff() {
        let png = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 0];
        assert_eq!(sniff(&png).unwrap(), "image/png");
        assert_eq!(sniff(b"GIF89a......").unwrap(), "image/gif");
        assert_eq!(
            sniff(b"%PDF-1.7\n").unwrap_err().kind,
            Kind::UnsupportedMedia
        );
        assert_eq!(sniff(b"hello").unwrap_err().kind, Kind::UnsupportedMedia);
        assert_eq!(sniff(b"").unwrap_err().kind, Kind::Validation);
    }
}
