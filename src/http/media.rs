//! `/v1/media`: pictures for reminder parts, content-addressed by sha256.

use super::errors::ApiError;
use super::extract::{declared_length, media_id, read_limited, MEDIA_ID};
use super::spec::{Body, Op, Param, Params, Pattern, Rule, Str, Success};
use crate::service::media::{self, Media};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::MediaInfo;

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
.performs(&media::UPLOAD);

pub static GET: Op = Op::new(
    "getMedia",
    "Media metadata",
    Success::json::<MediaInfo>(200, "The media"),
)
.path(&[MEDIA_ID])
.performs(&media::GET);

pub async fn upload(
    service: web::Data<Service>,
    req: HttpRequest,
    payload: web::Payload,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let (bytes, filename) = received(&service, &req, payload).await?;
    let stored = Media::of(&service)
        .upload(allowed, &bytes, filename)
        .await?;
    Ok(created(stored))
}

/// An upload's bytes, within `media.max_bytes`, and its file name.
pub async fn received(
    service: &Service,
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<(web::Bytes, Option<String>), ApiError> {
    let params = Params::of(req, &UPLOAD)?;
    let filename = params.parsed("filename", parse_filename)?;
    let limit = service.max_picture_bytes();
    let bytes = read_limited(payload, declared_length(req), limit, "media").await?;
    Ok((bytes, filename))
}

/// 201 naming the stored picture.
pub fn created(stored: MediaInfo) -> HttpResponse {
    HttpResponse::Created()
        .insert_header(("Location", format!("/v1/media/{}", stored.id)))
        .json(stored)
}

pub async fn get(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = media_id(&path)?;
    Ok(HttpResponse::Ok().json(Media::of(&service).get(allowed, &id).await?))
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
    fn filenames_cannot_carry_paths() {
        assert!(parse_filename("poster.png").is_ok());
        for bad in ["../x.png", "a\\b", " ", "a\nb"] {
            assert!(parse_filename(bad).is_err(), "{bad:?}");
        }
    }
}
