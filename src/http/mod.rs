//! The control port: health probes, the `/v1` JSON API behind the bearer
//! token, server-sent events and the OpenAPI document.
//!
//! Handlers stay thin: they parse at the edge (`extract`), call the store
//! or an actor, and let `errors` turn every failure into problem+json.

mod accounts;
mod auth;
pub mod browser;
pub mod errors;
mod etag;
mod events;
pub mod extract;
mod media;
pub mod openapi;
mod pairing;
mod reminders;
mod runs;

use crate::state::AppState;
use actix_web::http::Method;
use actix_web::{dev::Server, web, App, HttpRequest, HttpResponse, HttpServer};
use errors::{ApiError, Kind};
use std::net::TcpListener;
use std::sync::atomic::Ordering;

/// Declares the `/v1` resources once: the registration and the `ROUTES`
/// table the OpenAPI test checks come from the same lines.
macro_rules! v1_api {
    ($( $path:literal => { $( $method:ident => $handler:path ),+ $(,)? } )+) => {
        /// Every `/v1` operation as (method, path template).
        pub const ROUTES: &[(&str, &str)] = &[
            $( $( (stringify!($method), concat!("/v1", $path)) ),+ ),+
        ];

        fn v1_resources(cfg: &mut web::ServiceConfig) {
            $(
                let allow: &'static str =
                    concat!($( stringify!($method), ", " ),+).trim_end_matches(", ");
                cfg.service(
                    web::resource($path)
                        $( .route(web::method(Method::$method).to($handler)) )+
                        .default_service(web::to(move || method_not_allowed(allow))),
                );
            )+
        }
    };
}

v1_api! {
    "/accounts" => { GET => accounts::list, POST => accounts::create }
    "/accounts/{id}" => {
        GET => accounts::get,
        PATCH => accounts::patch,
        DELETE => accounts::delete,
    }
    "/accounts/{id}/disable" => { POST => accounts::disable }
    "/accounts/{id}/enable" => { POST => accounts::enable }
    "/media" => { POST => media::upload }
    "/media/{id}" => { GET => media::get }
    "/reminders" => { GET => reminders::list, POST => reminders::create }
    "/reminders/{id}" => {
        GET => reminders::get,
        PUT => reminders::update,
        DELETE => reminders::delete,
    }
    "/reminders/{id}/pause" => { POST => reminders::pause }
    "/reminders/{id}/resume" => { POST => reminders::resume }
    "/reminders/{id}/fire" => { POST => reminders::fire }
    "/reminders/{id}/forecast" => { POST => reminders::forecast }
    "/runs" => { GET => runs::list }
    "/runs/{id}" => { GET => runs::get }
    "/runs/{id}/targets" => { GET => runs::targets }
    "/runs/{id}/stop" => { POST => runs::stop }
    "/runs/{id}/pause" => { POST => runs::pause }
    "/runs/{id}/resume" => { POST => runs::resume }
    "/runs/{id}/retry" => { POST => runs::retry }
    "/events" => { GET => events::stream }
}

/// The pairing routes, registered by `pairing::configure` (WhatsApp
/// accounts; without the `whatsapp` feature they answer 404 saying so).
pub const PAIRING_ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/accounts/{id}/pair"),
    ("GET", "/v1/accounts/{id}/pair"),
    ("GET", "/v1/accounts/{id}/pair/qr.png"),
];

/// Every route this server registers, as (method, path template).
pub fn all_routes() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    ROUTES.iter().chain(PAIRING_ROUTES).chain(OPEN_ROUTES)
}

/// Routes outside `/v1`, served without a token.
pub const OPEN_ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/openapi.json"),
    ("GET", "/metrics"),
];

/// Serves the control port; `/v1` requires `token` (`None`: no token, only
/// with `control.token = "none"`).
pub fn server(
    state: AppState,
    listener: TcpListener,
    token: Option<crate::settings::Secret>,
) -> std::io::Result<Server> {
    let unix_socket = unix_listener(&state.settings.control.unix_socket)?;
    let guard = web::Data::new(auth::Guard::new(token));
    let hosts = web::Data::new(browser::HostPolicy::from_settings(&state.settings));
    let data = web::Data::new(state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(guard.clone())
            .app_data(hosts.clone())
            // Middleware wraps outside-in in reverse order: Host is checked
            // on every route before anything else runs.
            .wrap(actix_web::middleware::from_fn(browser::require_own_host))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(crate::metrics::metrics_handler))
            .route("/openapi.json", web::get().to(openapi::serve))
            .service(
                web::scope("/v1")
                    // Cross-site first (registered last: outermost), then the token.
                    .wrap(actix_web::middleware::from_fn(auth::require_token))
                    .wrap(actix_web::middleware::from_fn(browser::refuse_cross_site))
                    .configure(v1_resources)
                    .configure(pairing::configure)
                    .default_service(web::to(no_such_route)),
            )
            .default_service(web::to(no_such_route))
    })
    // Signals are ours: SIGTERM drains the actors before the port closes.
    .disable_signals()
    // By the time the port closes the actors have drained; an open event
    // stream never ends by itself, so it must not hold the exit up for the
    // default 30 s.
    .shutdown_timeout(3)
    .workers(2)
    .listen(listener)?;
    let server = match unix_socket {
        Some(uds) => server.listen_uds(uds)?,
        None => server,
    };
    Ok(server.run())
}

/// The optional Unix socket for the control port, readable and writable by
/// the daemon's user only (0600). The same routes and token rules apply.
fn unix_listener(path: &str) -> std::io::Result<Option<std::os::unix::net::UnixListener>> {
    use std::os::unix::fs::PermissionsExt;
    if path.is_empty() {
        return Ok(None);
    }
    let path = std::path::Path::new(path);
    // A socket file left by a previous run (a crash) would make bind fail.
    if std::fs::symlink_metadata(path)
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
    {
        std::fs::remove_file(path)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(Some(listener))
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

async fn no_such_route(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::new(
        Kind::NotFound,
        format!(
            "no route {} {}; see /openapi.json",
            req.method(),
            req.path()
        ),
    ))
}

async fn method_not_allowed(allow: &'static str) -> Result<HttpResponse, ApiError> {
    let mut e = ApiError::new(
        Kind::MethodNotAllowed,
        format!("this route accepts: {allow}"),
    );
    e.allow = Some(allow);
    Err(e)
}
