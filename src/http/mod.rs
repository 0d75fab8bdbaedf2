//! The control port: health probes, the `/v1` JSON API behind the bearer
//! token, server-sent events, the OpenAPI document and the web console.
//!
//! Handlers stay thin: they parse at the edge (`extract`), call the store
//! or an actor, and let `errors` turn every failure into problem+json.

mod accounts;
mod auth;
pub mod browser;
mod console;
pub mod errors;
pub mod etag;
mod events;
pub mod extract;
pub mod forward;
mod groups;
pub mod limits;
mod media;
pub mod openapi;
mod pairing;
mod preview;
mod reminders;
mod runs;
pub mod spec;

use crate::state::AppState;
use actix_web::http::Method;
use actix_web::{dev::Server, web, App, HttpRequest, HttpResponse, HttpServer};
use errors::{ApiError, Kind};
use std::net::TcpListener;
use std::sync::atomic::Ordering;

/// One registered operation: its method, full path and declaration.
#[derive(Debug)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub op: &'static spec::Op,
}

/// Declares the `/v1` resources once: each line registers the handler and
/// names the operation the document is generated from, so a route cannot
/// be served undocumented or documented unserved.
macro_rules! v1_api {
    ($( $path:literal => { $( $method:ident => $handler:path [$op:path] ),+ $(,)? } )+) => {
        /// Every `/v1` operation.
        pub static ROUTES: &[Route] = &[
            $( $( Route { method: stringify!($method), path: concat!("/v1", $path), op: &$op } ),+ ),+
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
    "/accounts" => {
        GET => accounts::list [accounts::LIST],
        POST => accounts::create [accounts::CREATE],
    }
    "/accounts/{id}" => {
        GET => accounts::get [accounts::GET],
        PATCH => accounts::patch [accounts::PATCH],
        DELETE => accounts::delete [accounts::DELETE],
    }
    "/accounts/{id}/disable" => { POST => accounts::disable [accounts::DISABLE] }
    "/accounts/{id}/enable" => { POST => accounts::enable [accounts::ENABLE] }
    "/accounts/{id}/groups" => { GET => groups::list [groups::LIST] }
    "/accounts/{id}/groups/sync" => { POST => groups::sync [groups::SYNC] }
    "/accounts/{id}/groups/resolve" => { POST => groups::resolve [groups::RESOLVE] }
    "/accounts/{id}/groups/{jid}/labels" => { PUT => groups::set_labels [groups::SET_LABELS] }
    "/accounts/{id}/pair" => {
        POST => pairing::start [pairing::START],
        GET => pairing::state [pairing::STATE],
    }
    "/accounts/{id}/pair/qr.png" => { GET => pairing::qr_png [pairing::QR_PNG] }
    "/media" => { POST => media::upload [media::UPLOAD] }
    "/media/{id}" => { GET => media::get [media::GET] }
    "/reminders" => {
        GET => reminders::list [reminders::LIST],
        POST => reminders::create [reminders::CREATE],
    }
    "/reminders/{id}" => {
        GET => reminders::get [reminders::GET],
        PUT => reminders::update [reminders::UPDATE],
        DELETE => reminders::delete [reminders::DELETE],
    }
    "/reminders/{id}/pause" => { POST => reminders::pause [reminders::PAUSE] }
    "/reminders/{id}/resume" => { POST => reminders::resume [reminders::RESUME] }
    "/reminders/{id}/fire" => { POST => reminders::fire [reminders::FIRE] }
    "/reminders/{id}/forecast" => { POST => reminders::forecast [reminders::FORECAST] }
    "/reminders/{id}/preview" => { POST => preview::preview [preview::PREVIEW] }
    "/runs" => { GET => runs::list [runs::LIST] }
    "/runs/{id}" => { GET => runs::get [runs::GET] }
    "/runs/{id}/targets" => { GET => runs::targets [runs::TARGETS] }
    "/runs/{id}/stop" => { POST => runs::stop [runs::STOP] }
    "/runs/{id}/pause" => { POST => runs::pause [runs::PAUSE] }
    "/runs/{id}/resume" => { POST => runs::resume [runs::RESUME] }
    "/runs/{id}/retry" => { POST => runs::retry [runs::RETRY] }
    "/events" => { GET => events::stream [events::STREAM] }
}

static HEALTHZ: spec::Op = spec::Op::new(
    "healthz",
    "Liveness",
    spec::Success::json(200, "Alive", "Health"),
)
.describe("The process answers and the database answers (503 when it does not).")
.errors(&[503]);
static READYZ: spec::Op = spec::Op::new(
    "readyz",
    "Readiness",
    spec::Success::json(200, "Ready", "Ready"),
)
.describe("Started and not draining (503 during start-up and shutdown).")
.errors(&[503]);
static OPENAPI: spec::Op = spec::Op::new(
    "openapi",
    "This document",
    spec::Success::json(200, "The OpenAPI document", "Document"),
);
static METRICS: spec::Op = spec::Op::new(
    "metrics",
    "Prometheus metrics",
    spec::Success::json(200, "Metrics", "Metrics").media("application/openmetrics-text"),
)
.describe("Prometheus text exposition with per-account labels. Open, like the probes.");

/// Routes outside `/v1`, served without a token.
pub static OPEN_ROUTES: &[Route] = &[
    Route {
        method: "GET",
        path: "/healthz",
        op: &HEALTHZ,
    },
    Route {
        method: "GET",
        path: "/readyz",
        op: &READYZ,
    },
    Route {
        method: "GET",
        path: "/openapi.json",
        op: &OPENAPI,
    },
    Route {
        method: "GET",
        path: "/metrics",
        op: &METRICS,
    },
];

/// Every route this server registers.
pub fn all_routes() -> impl Iterator<Item = &'static Route> {
    ROUTES.iter().chain(OPEN_ROUTES)
}

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
    let limits = web::Data::new(limits::Limits::from_settings(&state.settings.control));
    let sessions = web::Data::new(console::Sessions::new());
    let data = web::Data::new(state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(guard.clone())
            .app_data(hosts.clone())
            .app_data(limits.clone())
            .app_data(sessions.clone())
            // Middleware wraps outside-in in reverse order: Host is checked
            // on every route before anything else runs.
            .wrap(actix_web::middleware::from_fn(browser::require_own_host))
            // Outermost: whatever answers an error, it is problem+json.
            .wrap(actix_web::middleware::from_fn(errors::problems_only))
            .service(open_route("/healthz", web::get().to(healthz)))
            .service(open_route("/readyz", web::get().to(readyz)))
            .service(open_route(
                "/metrics",
                web::get().to(crate::metrics::metrics_handler),
            ))
            .service(open_route("/openapi.json", web::get().to(openapi::serve)))
            .service(
                web::scope("/v1")
                    // The rate first (registered last: outermost), so a flood
                    // costs little; then cross-site, then the token.
                    .wrap(actix_web::middleware::from_fn(auth::require_token))
                    .wrap(actix_web::middleware::from_fn(browser::refuse_cross_site))
                    .wrap(actix_web::middleware::from_fn(limits::rate_limit))
                    .configure(v1_resources)
                    .default_service(web::to(no_such_route)),
            )
            // The web console: pages at `/`, behind its own sign-in, on the
            // same per-client rate as `/v1`.
            .service(
                web::scope("")
                    .wrap(actix_web::middleware::from_fn(limits::rate_limit))
                    .configure(console::configure)
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

/// A GET-only route outside `/v1`: another method is 405 with `Allow`.
fn open_route(path: &str, get: actix_web::Route) -> actix_web::Resource {
    web::resource(path)
        .route(get)
        .default_service(web::to(|| method_not_allowed("GET")))
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
