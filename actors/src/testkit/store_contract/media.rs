//! Media: idempotent by content hash, and the per-account upload handles.

use super::fixtures::{account, aid, at, media, media_info, S};
use crate::domain::*;

// ---------------------------------------------------------------- media

pub async fn media_is_idempotent(s: S) {
    let first = media_info(b"a picture", "first.png");
    assert_eq!(s.get_media(&first.id).await.unwrap(), None);
    assert_eq!(s.put_media(&first).await.unwrap(), first);

    let mut again = media_info(b"a picture", "second.png");
    again.created_at = at(5);
    assert_eq!(
        s.put_media(&again).await.unwrap(),
        first,
        "the same bytes return the first record"
    );
    assert_eq!(s.get_media(&first.id).await.unwrap(), Some(first.clone()));

    let mut other = media_info(b"another picture", "x.jpg");
    other.mime = "image/jpeg".into();
    other.filename = None;
    assert_eq!(s.put_media(&other).await.unwrap(), other);
    assert_eq!(s.get_media(&other.id).await.unwrap(), Some(other));
    assert_eq!(s.get_media(&first.id).await.unwrap(), Some(first));
}

pub async fn upload_handles(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let m = media(&s, b"picture").await;
    assert_eq!(s.get_upload_handle(&a, &m).await.unwrap(), None);

    let h1 = UploadHandle {
        handle: "mmg/abc".into(),
        expires_at: at(60),
    };
    s.put_upload_handle(&a, &m, &h1).await.unwrap();
    assert_eq!(s.get_upload_handle(&a, &m).await.unwrap(), Some(h1));
    assert_eq!(
        s.get_upload_handle(&b, &m).await.unwrap(),
        None,
        "handles are per account"
    );

    let h2 = UploadHandle {
        handle: "mmg/def".into(),
        expires_at: at(120),
    };
    s.put_upload_handle(&a, &m, &h2).await.unwrap();
    assert_eq!(
        s.get_upload_handle(&a, &m).await.unwrap(),
        Some(h2.clone()),
        "replaced"
    );

    let unknown_media = MediaId::of_bytes(b"never stored");
    assert!(s.put_upload_handle(&a, &unknown_media, &h2).await.is_err());
    assert_eq!(s.get_upload_handle(&a, &unknown_media).await.unwrap(), None);
    let ghost = aid("ghost");
    assert!(s.put_upload_handle(&ghost, &m, &h2).await.is_err());
    assert_eq!(s.get_upload_handle(&ghost, &m).await.unwrap(), None);
}
