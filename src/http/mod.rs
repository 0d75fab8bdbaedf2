//! The control port: health probes now, the /v1 API, metrics and events
//! as they are built.

use crate::startup::AppState;
use actix_web::{dev::Server, web, App, HttpResponse, HttpServer};
use std::net::TcpListener;
use std::sync::atomic::Ordering;

pub fn server(state: AppState, listener: TcpListener) -> std::io::Result<Server> {
    let data = web::Data::new(state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(crate::metrics::metrics_handler))
    })
    // Signals are ours: SIGTERM drains the actors before the port closes.
    .disable_signals()
    .workers(2)
    .listen(listener)?
    .run();
    Ok(server)
}

/// Alive: the process answers and the database answers.
async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    match state.store.ping().await {
        Ok(()) => HttpResponse::Ok().json(serde_json::json!({"status": "ok"})),
        Err(e) => HttpResponse::ServiceUnavailable()
            .json(serde_json::json!({"status": "unavailable", "error": e.to_string()})),
    }
}

/// Ready: started and not draining.
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    if state.ready.load(Ordering::SeqCst) {
        HttpResponse::Ok().json(serde_json::json!({"ready": true}))
    } else {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({"ready": false}))
    }
}
