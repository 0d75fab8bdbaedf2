//! `/v1/accounts/{id}/pair`: pairing a WhatsApp account by QR code or pair
//! code.
//!
//! - `POST /v1/accounts/{id}/pair` with an optional body `{"phone": "+60…"}`
//!   starts pairing (pair code when a phone number is given, QR otherwise)
//!   and answers with the pairing state once WhatsApp has answered, at most
//!   the gateway's connect timeout (20 s by default). 503 when WhatsApp
//!   cannot be reached, 409 when the account is already paired or is not a
//!   WhatsApp account, 422 for a malformed phone number.
//! - `GET /v1/accounts/{id}/pair` answers the state, with the QR as
//!   terminal text while one is waiting to be scanned.
//! - `GET /v1/accounts/{id}/pair/qr.png` answers the same QR as a PNG.

use super::errors::ApiError;
use super::extract::{account_id, check_json_content_type, parse_json, JsonBody, ACCOUNT_ID};
use super::forward;
use super::spec::{self, Body, Field, Op, Rule, Shape, Str, Success};
use crate::gateway::pairing_view::PairingView;
use crate::service::pairing::{self, Pairing};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

/// What `normalize_phone` accepts: 7–15 digits, country code first (no
/// leading 0), optionally after `+` and with spaces, dots, dashes or
/// brackets between.
const PHONE: Str = Str::pattern(
    "^[+]?[ .()-]*[1-9]([ .()-]*[0-9]){6,14}[ .()-]*$",
    "must be the phone number in international form, e.g. +60 12 345 6789: 7 to 15 digits, \
     country code first, no leading 0",
);

pub static PAIR_REQUEST: Shape = Shape {
    name: "PairRequest",
    description: "Optional: without a phone, pairing is by QR code",
    fields: &[Field::nullable(
        "phone",
        Rule::Str(PHONE),
        "International number of the phone to pair with a code; without it, a QR code",
    )],
    example: Some(r#"{"phone": "+60 12 345 6789"}"#),
};

pub static START: Op = Op::new(
    "startPairing",
    "Start pairing a WhatsApp account",
    Success::json::<PairingView>(200, "The pairing state"),
)
.describe(
    "Body optional: none or `{}` pairs by QR code; `{\"phone\": \"+60…\"}` asks for a pair code to \
     type on that phone. Answers the pairing state once WhatsApp has answered (at most the \
     gateway's connect timeout). Several daemons: answered by the one holding the account's \
     lease (forwarded there; taken here if no daemon holds it). 409 if the account is already \
     paired or is not a WhatsApp account; 503 if WhatsApp cannot be reached; 404 in a build \
     without the `whatsapp` feature.",
)
.path(&[ACCOUNT_ID])
.body(Body::OptionalJson(&PAIR_REQUEST))
.errors(&[409, 503])
.performs(&pairing::START);

pub static STATE: Op = Op::new(
    "getPairing",
    "Pairing state",
    Success::json::<PairingView>(200, "The pairing state"),
)
.describe(
    "With the QR as terminal text while one waits to be scanned. 409 unless a WhatsApp account.",
)
.path(&[ACCOUNT_ID])
.errors(&[409])
.performs(&pairing::STATE);

pub static QR_PNG: Op = Op::new(
    "getPairingQr",
    "The pairing QR as PNG",
    Success::json::<spec::Png>(200, "The QR code").media("image/png"),
)
.describe("404 when no QR is waiting to be scanned; 409 unless a WhatsApp account.")
.path(&[ACCOUNT_ID])
.errors(&[409])
.performs(&pairing::QR_PNG);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PairRequest {
    #[serde(default)]
    phone: Option<String>,
}

impl JsonBody for PairRequest {
    const SHAPE: &'static Shape = &PAIR_REQUEST;
}

pub async fn start(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    // The body is optional: no body (or `{}`) pairs by QR. A body must be
    // declared JSON like any other.
    let empty = body.iter().all(u8::is_ascii_whitespace);
    if !empty {
        check_json_content_type(&req)?;
    }
    let parsed = if empty {
        PairRequest::default()
    } else {
        parse_json::<PairRequest>(&body)?
    };
    let done = Pairing::of(&service)
        .start(allowed, &id, parsed.phone.as_deref(), forward::is_hop(&req))
        .await?;
    forward::answer(&req, &service, done, StatusCode::OK).await
}

pub async fn state(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    let done = Pairing::of(&service)
        .state(allowed, &id, forward::is_hop(&req))
        .await?;
    forward::answer_with(&req, &service, done, state_answer).await
}

/// A pairing's state, never cached: it changes as the phone scans.
pub fn state_answer(view: PairingView) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(view)
}

pub async fn qr_png(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    let done = Pairing::of(&service)
        .qr_png(allowed, &id, forward::is_hop(&req))
        .await?;
    forward::answer_with(&req, &service, done, qr_answer).await
}

/// The QR as a PNG, never cached: WhatsApp replaces it every 20 s or so.
pub fn qr_answer(png: Vec<u8>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("image/png")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(png)
}
