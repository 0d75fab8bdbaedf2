//! `/v1/media`: pictures for reminder parts, content-addressed by sha256.

use super::errors::{ApiError, Kind};
use super::extract::{declared_length, media_id, read_limited, MEDIA_ID};
use super::spec::{Body, Op, Param, Params, Pattern, Rule, Str, Success};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::MediaInfo;
use herald_actors::domain::Role;

/// The images WhatsApp shows inline. The bytes decide, not the
/// Content-Type a client claims.
pub const ACCEPTED: &[&str] = &["image/jpeg", "image/png", "image/webp", "image/gif"];
pub const MAX_FILENAME_CHARS: usize = 255;
/// No path separators or control characters, not blank.
const FILENAME_RULE: &str = "must be 1–255 characters without '/', '\\' or control characters";
const FILENAME: Str = Str {
    min: 1,
    max: MAX_FILENAME_CHARS,
    pattern: Some(Pattern {
        regex: "^[^/\\\\\\x00-\\x1F\\x7F-\\x9F]*[^/\\\\\\x00-\\x20\\x7F-\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000][^/\\\\\\x00-\\x1F\\x7F-\\x9F]*$",
        rule: FILENAME_RULE,
    }),
    ..Str::ANY
};

pub static UPLOAD: Op = Op::new(
    "uploadMedia",
    "Upload a picture",
    Success::json::<MediaInfo>(201, "Stored; `Location` names it").location(),
)
.describe(
    "The raw image bytes as the body (any or no Content-Type: the type is read from the bytes). \
     Accepted: JPEG, PNG, WebP, GIF, at most `media.max_bytes`. Idempotent: the id is the sha256 \
     of the bytes. An empty body is 422; other bytes are 415.",
)
.query(&[Param::new(
    "filename",
    Rule::Str(FILENAME),
    "Original file name: no path separators or control characters",
)])
.body(Body::Bytes)
.needs(Role::Operator);

pub static GET: Op = Op::new(
    "getMedia",
    "Media metadata",
    Success::json::<MediaInfo>(200, "The media"),
)
.path(&[MEDIA_ID])
.needs(Role::Viewer);

pub async fn upload(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let params = Params::of(&req, &UPLOAD)?;
    let filename = params.parsed("filename", parse_filename)?;
    let limit = state.settings.media.max_bytes;
    let bytes = read_limited(payload, declared_length(&req), limit, "media").await?;
    let mime = sniff(&bytes)?;
    let _gc = state.media.gc_lock().await;
    let id = state
        .media
        .write(&bytes)
        .await
        .map_err(|e| ApiError::internal("could not store the media file", e))?;
    let info = MediaInfo {
        id,
        mime: mime.to_owned(),
        size: bytes.len() as u64,
        filename,
        created_at: chrono::Utc::now(),
    };
    // Idempotent: the same bytes again answer with the first record.
    let stored = state.store.put_media(&info).await?;
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/v1/media/{}", stored.id)))
        .json(stored))
}

pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = media_id(&path)?;
    let info = state
        .store
        .get_media(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("media {id}")))?;
    Ok(HttpResponse::Ok().json(info))
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

fn parse_filename(s: &str) -> Result<String, String> {
    let ok = s.chars().count() <= MAX_FILENAME_CHARS
        && !s.chars().any(|c| c.is_control() || c == '/' || c == '\\')
        && !s.trim().is_empty();
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "must be 1–{MAX_FILENAME_CHARS} characters without '/', '\\' or control characters"
        ))
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

    #[test]
    fn filenames_cannot_carry_paths() {
        assert!(parse_filename("poster.png").is_ok());
        for bad in ["../x.png", "a\\b", " ", "a\nb"] {
            assert!(parse_filename(bad).is_err(), "{bad:?}");
        }
    }
}
