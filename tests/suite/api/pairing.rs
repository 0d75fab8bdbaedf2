//! The pairing routes' answers that need no network (the unreachable path
//! is tested on the gateway itself, where the WebSocket URL can be pointed
//! at a closed loopback port). Here rather than beside the routes: a test
//! that starts the whole daemon belongs above it, not in a module the
//! daemon is built from.

use crate::api::helpers::spawn_app;
use herald_actors::domain::{AccountId, AccountLimits, AccountState, GatewayKind};
use herald_actors::ports::NewAccount;
use serde_json::json;

#[actix_rt::test]
async fn pairing_routes_answer_without_the_network() {
    let app = spawn_app().await;
    for (id, kind) in [
        ("wa", GatewayKind::Whatsapp),
        ("sim", GatewayKind::Simulator),
    ] {
        app.state
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
    let base = "/v1/accounts";

    let r = app.get(&format!("{base}/wa/pair")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["state"], "idle");
    assert_eq!(r.json["account_id"], "wa");

    let r = app.get(&format!("{base}/wa/pair/qr.png")).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.content_type, "application/problem+json");
    assert!(r.json["detail"].as_str().unwrap().contains("no QR code"));

    let r = app.post_empty(&format!("{base}/nobody/pair")).await;
    assert_eq!(r.status, 404);
    let r = app.post_empty(&format!("{base}/sim/pair")).await;
    assert_eq!(r.status, 409);
    let r = app
        .post(&format!("{base}/wa/pair"), json!({"phone": "12"}))
        .await;
    assert_eq!((r.status, r.json["field"].as_str()), (422, Some("phone")));
    let r = app
        .post(&format!("{base}/wa/pair"), json!({"number": "1"}))
        .await;
    assert_eq!((r.status, r.json["field"].as_str()), (422, Some("number")));
    let r = app
        .send(
            "POST",
            &format!("{base}/wa/pair"),
            Some("application/json"),
            Some(b"{".to_vec()),
            &[],
        )
        .await;
    assert_eq!(r.status, 400);
    let r = app.delete(&format!("{base}/wa/pair")).await;
    assert_eq!(r.status, 405);
}
