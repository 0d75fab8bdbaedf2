//! The control port: health probes, the `/v1` JSON API behind the bearer
//! token, server-sent events, the OpenAPI document and the web console.
//!
//! Handlers stay thin: they parse at the edge (`extract`), perform one
//! service operation (`crate::service`, reached through the
//! [`Service`] handle and nothing else) and let `errors` turn every
//! failure into problem+json. Only the edge's own checks (who is calling,
//! console sessions, sign-in attempts, the audit trail) keep a part of the
//! store of their own, the [`IdentityStore`] given to [`server`].
//! Who may call what is decided on the route that runs (`authority`).
//!
//! Imports: `service` (the operations handlers adapt), `settings`, `token`,
//! `proxies`, `metrics` (the metrics' content type), `export` (CSV),
//! `gateway::pairing_view`
//! (a pairing's view, data only), and of the core `herald_actors::domain`,
//! `herald_actors::ports` (the identity store: tokens, sessions, the audit
//! trail), `herald_actors::delivery` and `herald_actors::scheduling`.

mod accounts;
pub mod amend;
mod attempts;
mod audit;
pub mod authority;
pub mod browser;
pub mod canonical;
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
pub mod peer;
mod preview;
mod principal;
mod reminders;
mod routes;
mod runs;
mod scrape;
pub mod spec;
mod trail;
mod users;
mod webhooks;

use crate::service::health::Health;
use crate::service::Service;
use actix_web::{dev::Server, web, App, HttpRequest, HttpResponse, HttpServer};
pub use console::{ConsoleRoute, CONSOLE_ROUTES};
use errors::{ApiError, Kind};
use herald_actors::ports::IdentityStore;
pub use principal::{token_hash, Principal, DAEMON_TOKEN, USER_TOKEN_PREFIX};
pub use routes::{all_routes, Route, OPEN_ROUTES, ROUTES};
use routes::{method_not_allowed, v1_resources, Ready};
use std::net::TcpListener;
use std::sync::Arc;

/// Serves the control port; `/v1` requires `token` (`None`: no token, only
/// with `control.token = "none"`). Handlers reach the daemon only through
/// `service`; `identity` is the part of the store that says who is
/// calling (users' tokens, console sessions, sign-in attempts) and keeps
/// the audit trail, which the edge writes before and after an operation,
/// never in one.
pub fn server(
    service: Service,
    identity: Arc<dyn IdentityStore>,
    listener: TcpListener,
    token: Option<crate::settings::Secret>,
) -> std::io::Result<Server> {
    let settings = service.control();
    let unix_socket = unix_listener(&settings.unix_socket)?;
    let guard = web::Data::new(principal::Guard::new(token.clone(), Some(identity.clone())));
    let hosts = web::Data::new(browser::HostPolicy::from_settings(settings));
    let limits = web::Data::new(limits::Limits::from_settings(settings));
    let sessions = web::Data::new(console::Sessions::new(identity.clone(), token));
    let attempts = web::Data::new(attempts::Attempts::new(identity.clone()));
    let scrape = web::Data::new(scrape::Scrape::from_settings(settings));
    let trail = web::Data::new(trail::Log::new(identity));
    let proxies = web::Data::new(
        settings
            .trusted_proxies()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
    );
    let data = web::Data::new(service);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(guard.clone())
            .app_data(hosts.clone())
            .app_data(limits.clone())
            .app_data(sessions.clone())
            .app_data(attempts.clone())
            .app_data(proxies.clone())
            .app_data(trail.clone())
            .app_data(scrape.clone())
            // Middleware wraps outside-in in reverse order: Host is checked
            // on every route before anything else runs.
            .wrap(actix_web::middleware::from_fn(browser::require_own_host))
            // Outermost: whatever answers an error, it is problem+json.
            .wrap(actix_web::middleware::from_fn(errors::problems_only))
            .service(open_route("/healthz", web::get().to(healthz)))
            .service(open_route("/readyz", web::get().to(readyz)))
            .service(open_route("/metrics", web::get().to(metrics)))
            .service(open_route("/openapi.json", web::get().to(openapi::serve)))
            .service(
                web::scope("/v1")
                    // The rate first (registered last: outermost), so a flood
                    // costs little; then cross-site, then who is calling and
                    // a canonical path. The role and the audit entry are
                    // each route's own (`routes::v1_resources`).
                    .wrap(actix_web::middleware::from_fn(authority::api_gate))
                    .wrap(actix_web::middleware::from_fn(browser::refuse_cross_site))
                    .wrap(actix_web::middleware::from_fn(limits::rate_limit))
                    .configure(v1_resources)
                    .default_service(web::to(no_such_route)),
            )
            // The web console: pages at `/`, behind its own sign-in, on the
            // same per-client rate as `/v1`; each page's and action's role
            // is its route's own (`console::configure`).
            .service(
                web::scope("")
                    .wrap(actix_web::middleware::from_fn(console::console_gate))
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

/// A GET-only route outside `/v1`: another method is 405 with `Allow`;
/// any spelling of its path but the canonical one is 400, as everywhere;
/// each client's requests count against the port's rate limit, as on
/// `/v1` and the console.
fn open_route(path: &str, get: actix_web::Route) -> actix_web::Resource {
    web::resource(path)
        .route(
            get.wrap(actix_web::middleware::from_fn(canonical_only))
                .wrap(actix_web::middleware::from_fn(limits::rate_limit)),
        )
        .default_service(web::to(|| method_not_allowed("GET")))
}

async fn canonical_only(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    canonical::check(req.path())?;
    next.call(req).await
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

/// `GET /metrics`: open without a token unless `control.metrics_token`
/// is set — it carries account ids and counts, never message text or
/// group ids. A rendered page answers every scrape for a second
/// ([`scrape`]).
async fn metrics(
    req: HttpRequest,
    service: web::Data<Service>,
    scrape: web::Data<scrape::Scrape>,
) -> Result<HttpResponse, ApiError> {
    scrape.check(
        req.headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
    )?;
    let page = scrape
        .page(std::time::Instant::now(), Health::of(&service).metrics())
        .await;
    Ok(HttpResponse::Ok()
        .content_type(crate::metrics::CONTENT_TYPE)
        .body(page))
}

/// Alive: the process answers and the database answers.
async fn healthz(service: web::Data<Service>) -> HttpResponse {
    match Health::of(&service).alive().await {
        Ok(()) => HttpResponse::Ok().json(routes::Health {
            status: "ok",
            error: None,
        }),
        Err(e) => HttpResponse::ServiceUnavailable().json(routes::Health {
            status: "unavailable",
            error: Some(e.to_string()),
        }),
    }
}

/// Ready: started and not draining.
async fn readyz(service: web::Data<Service>) -> HttpResponse {
    let ready = Health::of(&service).ready();
    match ready {
        true => HttpResponse::Ok(),
        false => HttpResponse::ServiceUnavailable(),
    }
    .json(Ready {
        ready,
        waiting: None,
    })
}

/// The port while the daemon waits to start (a cluster daemon waiting out
/// its previous run's registration): `/healthz` 200 (the process is alive),
/// `/readyz` 503 naming what it waits for, every other route 503 with
/// `Retry-After`. Serves on its own copy of the port's listener until
/// stopped; the control port proper then takes over.
pub fn waiting(listener: &TcpListener, why: String, retry_after: u64) -> std::io::Result<Server> {
    let why = web::Data::new(why);
    let server = HttpServer::new(move || {
        App::new().app_data(why.clone()).default_service(web::to(
            move |req: HttpRequest, why: web::Data<String>| async move {
                match req.path() {
                    "/healthz" => HttpResponse::Ok().json(routes::Health {
                        status: "starting",
                        error: None,
                    }),
                    "/readyz" => HttpResponse::ServiceUnavailable().json(Ready {
                        ready: false,
                        waiting: Some(why.get_ref().clone()),
                    }),
                    _ => {
                        let mut e = ApiError::new(
                            Kind::Unavailable,
                            format!("the daemon is starting: {}", why.get_ref()),
                        );
                        e.retry_after = Some(retry_after);
                        actix_web::ResponseError::error_response(&e)
                    }
                }
            },
        ))
    })
    .disable_signals()
    .shutdown_timeout(0)
    .workers(1)
    .listen(listener.try_clone()?)?;
    Ok(server.run())
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
