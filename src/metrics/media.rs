//! Media: uploads through the gateway, and the uploads a still-valid
//! handle saved.

use super::labels::AccountLabel;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

pub(super) struct Media {
    pub(super) uploads: Family<AccountLabel, Counter>,
    pub(super) uploaded_bytes: Family<AccountLabel, Counter>,
    pub(super) cache_hits: Family<AccountLabel, Counter>,
}

impl Media {
    pub(super) fn register(r: &mut Registry) -> Self {
        let uploads = Family::default();
        r.register(
            "media_uploads",
            "Media uploads through the gateway",
            Family::clone(&uploads),
        );
        let uploaded_bytes = Family::default();
        r.register_with_unit(
            "media_uploaded",
            "Bytes of media uploaded through the gateway",
            Unit::Bytes,
            Family::clone(&uploaded_bytes),
        );
        let cache_hits = Family::default();
        r.register(
            "media_upload_cache_hits",
            "Media parts that reused a still-valid upload handle instead of uploading",
            Family::clone(&cache_hits),
        );
        Self {
            uploads,
            uploaded_bytes,
            cache_hits,
        }
    }

    /// Drops a deleted account's series.
    pub(super) fn remove(&self, l: &AccountLabel) {
        for f in [&self.uploads, &self.uploaded_bytes, &self.cache_hits] {
            f.remove(l);
        }
    }
}
