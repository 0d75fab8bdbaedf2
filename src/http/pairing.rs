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

use super::errors::{ApiError, Kind};
use super::extract::ACCOUNT_ID;
use super::spec::{self, Body, Field, Op, Rule, Shape, Str, Success};
use crate::gateway::pairing_view::PairingView;
#[cfg(feature = "whatsapp")]
use actix_web::web;
use herald_actors::domain::Role;
#[cfg(feature = "whatsapp")]
pub use imp::{begin, qr_png_of, state_of};
pub use imp::{qr_png, start, state};

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
.needs(Role::Admin);

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
.needs(Role::Admin);

pub static QR_PNG: Op = Op::new(
    "getPairingQr",
    "The pairing QR as PNG",
    Success::json::<spec::Png>(200, "The QR code").media("image/png"),
)
.describe("404 when no QR is waiting to be scanned; 409 unless a WhatsApp account.")
.path(&[ACCOUNT_ID])
.errors(&[409])
.needs(Role::Admin);

#[cfg(feature = "whatsapp")]
mod imp {
    use super::*;
    use crate::gateway::whatsapp::pairing::PairingError;
    use crate::http::extract::{account_id, check_json_content_type, parse_json, JsonBody};
    use crate::http::forward;
    use crate::state::AppState;
    use actix_web::http::{header, Method};
    use actix_web::{HttpRequest, HttpResponse};
    use herald_actors::domain::{Account, GatewayKind};
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PairRequest {
        #[serde(default)]
        phone: Option<String>,
    }

    impl JsonBody for PairRequest {
        const SHAPE: &'static Shape = &super::PAIR_REQUEST;
    }

    async fn whatsapp_account(state: &AppState, raw: &str) -> Result<Account, ApiError> {
        let id = account_id(raw)?;
        let account = state
            .store
            .get_account(&id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("account {id}")))?;
        if account.kind != GatewayKind::Whatsapp {
            return Err(ApiError::conflict(format!(
                "account {id} is a {} account; only whatsapp accounts are paired",
                account.kind
            )));
        }
        Ok(account)
    }

    fn pairing_error(e: PairingError) -> ApiError {
        match e {
            PairingError::Invalid { field, rule } => ApiError::invalid(field, rule),
            e @ (PairingError::AlreadyPaired(_) | PairingError::NotWhatsapp(_)) => {
                ApiError::conflict(e.to_string())
            }
            e @ (PairingError::Unreachable(_) | PairingError::Elsewhere(_)) => {
                ApiError::new(Kind::Unavailable, e.to_string())
            }
            PairingError::Internal(why) => ApiError::internal("starting pairing failed", why),
        }
    }

    pub async fn start(
        state: web::Data<AppState>,
        path: web::Path<String>,
        req: HttpRequest,
        body: web::Bytes,
    ) -> Result<HttpResponse, ApiError> {
        // The body is optional: no body (or `{}`) pairs by QR. A body must
        // be declared JSON like any other.
        let empty = body.iter().all(u8::is_ascii_whitespace);
        if !empty {
            check_json_content_type(&req)?;
        }
        let parsed = if empty {
            PairRequest::default()
        } else {
            parse_json::<PairRequest>(&body)?
        };
        Ok(
            match begin_from(
                &state,
                &path,
                parsed.phone.as_deref(),
                forward::is_hop(&req),
            )
            .await?
            {
                Begun::Here(view) => HttpResponse::Ok().json(view),
                Begun::There(answer) => answer.response(),
            },
        )
    }

    /// Where pairing began: on this daemon, or on the account's owner.
    pub enum Begun {
        Here(PairingView),
        /// The owner's answer (a success; its refusals are errors here).
        There(forward::Relayed),
    }

    /// Starts pairing `account`: by QR, or by pair code with `phone`, on
    /// the daemon that holds the account's lease (taken here if no daemon
    /// holds it). The console's form comes here.
    pub async fn begin(
        state: &AppState,
        account: &str,
        phone: Option<&str>,
    ) -> Result<Begun, ApiError> {
        begin_from(state, account, phone, false).await
    }

    async fn begin_from(
        state: &AppState,
        raw: &str,
        phone: Option<&str>,
        hop: bool,
    ) -> Result<Begun, ApiError> {
        let account = whatsapp_account(state, raw).await?;
        if let forward::Owner::Elsewhere { node, url } =
            forward::owner_or_claim(state, &account.id, hop).await?
        {
            let body = serde_json::to_vec(&serde_json::json!({ "phone": phone }))
                .map_err(|e| ApiError::internal("forwarding pairing", e.to_string()))?;
            let path = format!("/v1/accounts/{}/pair", account.id);
            return forward::relay(state, &node, &url, Method::POST, &path, Some(body.into()))
                .await?
                .ok()
                .map(Begun::There);
        }
        let phone = phone.filter(|p| !p.trim().is_empty());
        let view = state
            .whatsapp
            .start_pairing(&account, phone)
            .await
            .map_err(pairing_error)?;
        if view.state == "failed" {
            let reason = view.reason.unwrap_or_else(|| "pairing failed".into());
            return Err(ApiError::new(Kind::Unavailable, reason));
        }
        Ok(Begun::Here(view))
    }

    /// A pairing's state and QR live in its owner's connection: asked of
    /// another daemon, the owner answers `GET …/pair{tail}`. `None` when
    /// this daemon holds the account, or no daemon does (the state as the
    /// store has it is then answered here).
    async fn from_owner(
        state: &AppState,
        account: &Account,
        hop: bool,
        tail: &str,
    ) -> Result<Option<HttpResponse>, ApiError> {
        let Ok(forward::Owner::Elsewhere { node, url }) =
            forward::owner(state, &account.id, hop).await
        else {
            return Ok(None);
        };
        let path = format!("/v1/accounts/{}/pair{tail}", account.id);
        let answer = forward::relay(state, &node, &url, Method::GET, &path, None).await?;
        Ok(Some(answer.response()))
    }

    pub async fn state(
        state: web::Data<AppState>,
        path: web::Path<String>,
        req: HttpRequest,
    ) -> Result<HttpResponse, ApiError> {
        state_of(&state, &path, forward::is_hop(&req)).await
    }

    /// `GET …/pair`, for the API and the console's page script.
    pub async fn state_of(
        state: &AppState,
        raw: &str,
        hop: bool,
    ) -> Result<HttpResponse, ApiError> {
        let account = whatsapp_account(state, raw).await?;
        if let Some(answer) = from_owner(state, &account, hop, "").await? {
            return Ok(answer);
        }
        Ok(HttpResponse::Ok()
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .json(state.whatsapp.pairing(&account).await))
    }

    pub async fn qr_png(
        state: web::Data<AppState>,
        path: web::Path<String>,
        req: HttpRequest,
    ) -> Result<HttpResponse, ApiError> {
        qr_png_of(&state, &path, forward::is_hop(&req)).await
    }

    /// `GET …/pair/qr.png`, for the API and the console's page.
    pub async fn qr_png_of(
        state: &AppState,
        raw: &str,
        hop: bool,
    ) -> Result<HttpResponse, ApiError> {
        let account = whatsapp_account(state, raw).await?;
        if let Some(answer) = from_owner(state, &account, hop, "/qr.png").await? {
            return Ok(answer);
        }
        match state.whatsapp.qr_png(&account) {
            Some(png) => Ok(HttpResponse::Ok()
                .content_type("image/png")
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .body(png)),
            None => Err(ApiError::new(
                Kind::NotFound,
                format!(
                    "account {} has no QR code to scan: it is {}; POST /v1/accounts/{}/pair starts pairing",
                    account.id,
                    state.whatsapp.pairing(&account).await.state,
                    account.id
                ),
            )),
        }
    }
}

#[cfg(not(feature = "whatsapp"))]
mod imp {
    use super::*;
    use actix_web::HttpResponse;

    async fn absent() -> Result<HttpResponse, ApiError> {
        Err(ApiError::new(
            Kind::NotFound,
            "this build of Herald has no WhatsApp gateway (built without the `whatsapp` feature)",
        ))
    }

    pub async fn start() -> Result<HttpResponse, ApiError> {
        absent().await
    }
    pub async fn state() -> Result<HttpResponse, ApiError> {
        absent().await
    }
    pub async fn qr_png() -> Result<HttpResponse, ApiError> {
        absent().await
    }
}

/// The routes' answers that need no network (the unreachable path is
/// tested on the gateway itself, where the WebSocket URL can be pointed at
/// a closed loopback port).
#[cfg(all(test, feature = "whatsapp"))]
mod tests {
    use crate::settings::Settings;
    use crate::startup::Application;
    use herald_actors::domain::{AccountId, AccountLimits, AccountState, GatewayKind};
    use herald_actors::ports::NewAccount;
    use serde_json::Value;
    use std::collections::HashMap;

    struct Resp {
        status: u16,
        content_type: String,
        json: Value,
    }

    async fn call(client: &awc::Client, method: &str, url: String, body: Option<&str>) -> Resp {
        let method = awc::http::Method::from_bytes(method.as_bytes()).unwrap();
        let req = client.request(method, url);
        let mut res = match body {
            Some(b) => req
                .insert_header(("Content-Type", "application/json"))
                .send_body(b.to_owned())
                .await
                .unwrap(),
            None => req.send().await.unwrap(),
        };
        let bytes = res.body().await.unwrap();
        Resp {
            status: res.status().as_u16(),
            content_type: res
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default(),
            json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    #[actix_rt::test]
    async fn pairing_routes_answer_without_the_network() {
        let dir = tempfile::tempdir().unwrap();
        let env: HashMap<String, String> = [
            ("HERALD_CONTROL__LISTEN", "127.0.0.1:0"),
            ("HERALD_STORAGE__DATA_DIR", dir.path().to_str().unwrap()),
            ("HERALD_LOG__FILTER", "warn"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let app = Application::build(Settings::load_from(None, &env).unwrap())
            .await
            .unwrap();
        let base = format!("http://127.0.0.1:{}/v1/accounts", app.port());
        let state = app.state().clone();
        let token = app.token().unwrap().expose().to_owned();
        actix_rt::spawn(async move {
            let _ = app.run_until_stopped().await;
        });
        for (id, kind) in [
            ("wa", GatewayKind::Whatsapp),
            ("sim", GatewayKind::Simulator),
        ] {
            state
                .store
                .create_account(
                    &NewAccount {
                        id: AccountId::parse(id).unwrap(),
                        name: id.into(),
                        kind,
                        state: AccountState::Pairing,
                        limits: AccountLimits::default(),
                    },
                    chrono::Utc::now(),
                )
                .await
                .unwrap();
        }
        let c = awc::Client::builder()
            .add_default_header(("Authorization", format!("Bearer {token}")))
            .finish();

        let r = call(&c, "GET", format!("{base}/wa/pair"), None).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json["state"], "idle");
        assert_eq!(r.json["account_id"], "wa");

        let r = call(&c, "GET", format!("{base}/wa/pair/qr.png"), None).await;
        assert_eq!(r.status, 404);
        assert_eq!(r.content_type, "application/problem+json");
        assert!(r.json["detail"].as_str().unwrap().contains("no QR code"));

        let r = call(&c, "POST", format!("{base}/nobody/pair"), None).await;
        assert_eq!(r.status, 404);
        let r = call(&c, "POST", format!("{base}/sim/pair"), None).await;
        assert_eq!(r.status, 409);
        let r = call(
            &c,
            "POST",
            format!("{base}/wa/pair"),
            Some(r#"{"phone": "12"}"#),
        )
        .await;
        assert_eq!((r.status, r.json["field"].as_str()), (422, Some("phone")));
        let r = call(
            &c,
            "POST",
            format!("{base}/wa/pair"),
            Some(r#"{"number": "1"}"#),
        )
        .await;
        assert_eq!((r.status, r.json["field"].as_str()), (422, Some("number")));
        let r = call(&c, "POST", format!("{base}/wa/pair"), Some("{")).await;
        assert_eq!(r.status, 400);
        let r = call(&c, "DELETE", format!("{base}/wa/pair"), None).await;
        assert_eq!(r.status, 405);
    }
}
