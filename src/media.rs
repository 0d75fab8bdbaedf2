//! Media bytes on disk: `<data_dir>/media/<sha256>`, written once and never
//! changed (the name is the content's hash).

use async_trait::async_trait;
use herald_actors::domain::MediaId;
use herald_actors::ports::MediaSource;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct FileMedia {
    dir: PathBuf,
    /// Held by an upload from writing the file to storing its row, and by
    /// retention from deleting the row to removing the file, so an upload
    /// of bytes being collected never ends with a row and no file.
    gc: Arc<tokio::sync::Mutex<()>>,
}

impl FileMedia {
    pub fn new(data_dir: &Path) -> std::io::Result<Self> {
        let dir = data_dir.join("media");
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            gc: Arc::default(),
        })
    }

    /// See the `gc` field: an upload and a collection exclude each other.
    pub async fn gc_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.gc.lock().await
    }

    /// Removes a media file; one already gone is not an error.
    pub async fn remove(&self, id: &MediaId) -> std::io::Result<()> {
        match tokio::fs::remove_file(self.path(id)).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn path(&self, id: &MediaId) -> PathBuf {
        self.dir.join(id.as_str())
    }

    /// Stores bytes under their hash. Written to a temporary name and
    /// renamed, so a crash never leaves a truncated file under a valid id.
    pub async fn write(&self, bytes: &[u8]) -> std::io::Result<MediaId> {
        let id = MediaId::of_bytes(bytes);
        let path = self.path(&id);
        if tokio::fs::try_exists(&path).await? {
            return Ok(id);
        }
        // Unique per write, not only per process: daemons in containers
        // sharing one media volume (compose, Kubernetes) are all pid 1.
        let tmp = self.dir.join(format!(
            ".{}.tmp-{}-{:016x}",
            id.as_str(),
            std::process::id(),
            rand::random::<u64>()
        ));
        tokio::fs::write(&tmp, bytes).await?;
        tokio::fs::rename(&tmp, &path).await?;
        Ok(id)
    }
}

#[async_trait]
impl MediaSource for FileMedia {
    async fn read(&self, media: &MediaId) -> std::io::Result<Arc<[u8]>> {
        Ok(tokio::fs::read(self.path(media)).await?.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_is_content_addressed_and_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let media = FileMedia::new(dir.path()).unwrap();
        let id = media.write(b"picture bytes").await.unwrap();
        assert_eq!(id, MediaId::of_bytes(b"picture bytes"));
        assert_eq!(media.write(b"picture bytes").await.unwrap(), id);
        assert_eq!(&*media.read(&id).await.unwrap(), b"picture bytes");
        let missing = MediaId::of_bytes(b"other");
        assert_eq!(
            media.read(&missing).await.unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        // No temporary files left behind.
        assert_eq!(
            std::fs::read_dir(dir.path().join("media")).unwrap().count(),
            1
        );
    }
}
