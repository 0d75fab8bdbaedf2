//! Step 2: each unique picture uploaded once per account (or a still-valid
//! handle reused), and the message each part becomes.

use super::ctx::RunCtx;
use super::failure::backoff;
use crate::delivery::outcome::StopReason;
use crate::domain::*;
use crate::ports::{GatewayError, OutgoingMessage};

impl RunCtx {
    /// Step 2: each unique media uploaded once, or a still-valid handle
    /// reused from this actor's cache or the store. A failure here is
    /// retried per part in step 3; an account failure halts the run.
    pub async fn prepare_uploads(&self) {
        if self.engine.ports.clock.now() >= self.window_end {
            self.control.stop(StopReason::WindowClosed(self.window_end));
            return;
        }
        if self.control.must_not_send() {
            return;
        }
        let ids: Vec<MediaId> = self.media_mime.keys().cloned().collect();
        for id in ids {
            match self.upload(&id, false).await {
                Ok(_) => {}
                Err(e) if e.is_account_failure() => return self.halt_with(&e),
                Err(e) => {
                    tracing::warn!(account = %self.account, run = %self.run_id(), error = %e, "media upload failed; retried per group");
                    return;
                }
            }
        }
    }

    /// A still-fresh handle for `media`, from this run's cache or the
    /// store's (the upload outlives the run).
    async fn cached_upload(&self, media: &MediaId) -> Option<UploadHandle> {
        let engine = &self.engine;
        let now = engine.ports.clock.now();
        let margin = chrono::Duration::from_std(engine.config.upload_margin).unwrap_or_default();
        let fresh = |h: &UploadHandle| h.expires_at > now + margin;
        let cached = self.uploads.borrow().get(media).cloned();
        if let Some(h) = cached.filter(fresh) {
            return Some(h);
        }
        let stored = engine
            .ports
            .store
            .get_upload_handle(&self.account, media)
            .await;
        let h = stored.ok().flatten().filter(fresh)?;
        self.uploads.borrow_mut().insert(media.clone(), h.clone());
        Some(h)
    }

    pub(super) async fn upload(
        &self,
        media: &MediaId,
        force: bool,
    ) -> Result<UploadHandle, GatewayError> {
        let engine = &self.engine;
        if !force {
            if let Some(h) = self.cached_upload(media).await {
                self.metrics().media_cache_hit(&self.account);
                return Ok(h);
            }
        }
        let bytes = engine
            .ports
            .media
            .read(media)
            .await
            .map_err(|e| GatewayError::Transient(format!("reading media {media}: {e}")))?;
        let mime = self
            .media_mime
            .get(media)
            .cloned()
            .unwrap_or_else(|| "image/jpeg".into());
        let mut attempt = 0;
        let handle = loop {
            attempt += 1;
            match self
                .gateway
                .upload(&self.account, media, &mime, bytes.clone())
                .await
            {
                Ok(h) => break h,
                Err(e)
                    if attempt < engine.config.max_attempts
                        && matches!(
                            e,
                            GatewayError::Transient(_)
                                | GatewayError::Unreachable(_)
                                | GatewayError::RateLimited { .. }
                        ) =>
                {
                    self.control
                        .nap(backoff(engine.config.retry_base, attempt))
                        .await;
                    if self.control.must_not_send() {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        };
        self.metrics()
            .media_uploaded(&self.account, bytes.len() as u64);
        if let Err(e) = engine
            .ports
            .store
            .put_upload_handle(&self.account, media, &handle)
            .await
        {
            tracing::warn!(error = %e, "could not cache upload handle");
        }
        self.uploads
            .borrow_mut()
            .insert(media.clone(), handle.clone());
        Ok(handle)
    }

    pub(super) async fn message(
        &self,
        target: &RunTarget,
        part: u32,
    ) -> Result<OutgoingMessage, GatewayError> {
        Ok(match &self.spec.parts[part as usize] {
            MessagePart::Text { .. } => {
                OutgoingMessage::Text(self.render(target, part).unwrap_or_default())
            }
            MessagePart::Media { media, .. } => {
                let upload = self.upload(media, false).await?;
                OutgoingMessage::Media {
                    upload,
                    mime: self.media_mime.get(media).cloned().unwrap_or_default(),
                    caption: self.render(target, part),
                }
            }
            MessagePart::Poll {
                options, multiple, ..
            } => OutgoingMessage::Poll {
                question: self.render(target, part).unwrap_or_default(),
                options: options.clone(),
                multiple: *multiple,
            },
        })
    }
}
