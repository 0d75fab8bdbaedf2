//! Every route the control port serves, declared once: the `/v1` table
//! registers each handler with the operation it is documented by, so the
//! OpenAPI document ([`super::openapi`]) and the server cannot drift.
//! Each `/v1` line also names the role it needs, so a route cannot be
//! added without deciding who may call it.

use super::errors::{ApiError, Kind};
use super::{
    accounts, audit, events, groups, media, pairing, preview, reminders, runs, spec, users,
    webhooks,
};
use actix_web::http::Method;
use actix_web::{web, HttpResponse};
use herald_actors::domain::Role;

/// One registered operation: its method, full path and declaration.
#[derive(Debug)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub op: &'static spec::Op,
    /// The least role that may call it; `None`: open, no token (probes,
    /// metrics, the document).
    pub role: Option<Role>,
}

impl Route {
    /// A write: what the audit log records. A GET never writes, and
    /// anything a viewer may call is a read by definition (some reads are
    /// POSTs with a body, such as a preview).
    pub fn writes(&self) -> bool {
        self.method != "GET" && self.role.is_some_and(|r| r > Role::Viewer)
    }

    /// The values of the path's `{…}` segments in `path`, when `path` is
    /// this route's (same number of segments, literal ones equal).
    pub fn params<'a>(&self, path: &'a str) -> Option<Vec<&'a str>> {
        match_pattern(self.path, path)
    }
}

/// The values of `pattern`'s `{…}` segments in `path`, if it matches.
pub fn match_pattern<'a>(pattern: &str, path: &'a str) -> Option<Vec<&'a str>> {
    let mut want = pattern.split('/');
    let mut got = path.split('/');
    let mut params = Vec::new();
    loop {
        match (want.next(), got.next()) {
            (None, None) => return Some(params),
            (Some(w), Some(g)) if w.starts_with('{') && w.ends_with('}') && !g.is_empty() => {
                params.push(g)
            }
            (Some(w), Some(g)) if w == g => {}
            _ => return None,
        }
    }
}

/// The `/v1` route a request is for, if any.
pub fn find(method: &str, path: &str) -> Option<&'static Route> {
    ROUTES
        .iter()
        .find(|r| r.method == method && r.params(path).is_some())
}

/// Declares the `/v1` resources once: each line registers the handler and
/// names the operation the document is generated from, so a route cannot
/// be served undocumented or documented unserved.
macro_rules! v1_api {
    ($( $path:literal => { $( $method:ident => $handler:path [$op:path, $role:ident] ),+ $(,)? } )+) => {
        /// Every `/v1` operation.
        pub static ROUTES: &[Route] = &[
            $( $( Route {
                method: stringify!($method),
                path: concat!("/v1", $path),
                op: &$op,
                role: Some(Role::$role),
            } ),+ ),+
        ];

        pub(super) fn v1_resources(cfg: &mut web::ServiceConfig) {
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
        GET => accounts::list [accounts::LIST, Viewer],
        POST => accounts::create [accounts::CREATE, Admin],
    }
    "/accounts/{id}" => {
        GET => accounts::get [accounts::GET, Viewer],
        PATCH => accounts::patch [accounts::PATCH, Admin],
        DELETE => accounts::delete [accounts::DELETE, Admin],
    }
    "/accounts/{id}/disable" => { POST => accounts::disable [accounts::DISABLE, Admin] }
    "/accounts/{id}/enable" => { POST => accounts::enable [accounts::ENABLE, Admin] }
    "/accounts/{id}/groups" => { GET => groups::list [groups::LIST, Viewer] }
    "/accounts/{id}/groups/sync" => { POST => groups::sync [groups::SYNC, Operator] }
    "/accounts/{id}/groups/resolve" => { POST => groups::resolve [groups::RESOLVE, Viewer] }
    "/accounts/{id}/groups/{jid}/labels" => { PUT => groups::set_labels [groups::SET_LABELS, Operator] }
    "/accounts/{id}/pair" => {
        POST => pairing::start [pairing::START, Admin],
        GET => pairing::state [pairing::STATE, Admin],
    }
    "/accounts/{id}/pair/qr.png" => { GET => pairing::qr_png [pairing::QR_PNG, Admin] }
    "/media" => { POST => media::upload [media::UPLOAD, Operator] }
    "/media/{id}" => { GET => media::get [media::GET, Viewer] }
    "/reminders" => {
        GET => reminders::list [reminders::LIST, Viewer],
        POST => reminders::create [reminders::CREATE, Operator],
    }
    "/reminders/{id}" => {
        GET => reminders::get [reminders::GET, Viewer],
        PUT => reminders::update [reminders::UPDATE, Operator],
        DELETE => reminders::delete [reminders::DELETE, Operator],
    }
    "/reminders/{id}/pause" => { POST => reminders::pause [reminders::PAUSE, Operator] }
    "/reminders/{id}/resume" => { POST => reminders::resume [reminders::RESUME, Operator] }
    "/reminders/{id}/fire" => { POST => reminders::fire [reminders::FIRE, Operator] }
    "/reminders/{id}/forecast" => { POST => reminders::forecast [reminders::FORECAST, Viewer] }
    "/reminders/{id}/preview" => { POST => preview::preview [preview::PREVIEW, Viewer] }
    "/runs" => { GET => runs::list [runs::LIST, Viewer] }
    "/runs/{id}" => { GET => runs::get [runs::GET, Viewer] }
    "/runs/{id}/targets" => { GET => runs::targets [runs::TARGETS, Viewer] }
    "/runs/{id}/stop" => { POST => runs::stop [runs::STOP, Operator] }
    "/runs/{id}/pause" => { POST => runs::pause [runs::PAUSE, Operator] }
    "/runs/{id}/resume" => { POST => runs::resume [runs::RESUME, Operator] }
    "/runs/{id}/retry" => { POST => runs::retry [runs::RETRY, Operator] }
    "/events" => { GET => events::stream [events::STREAM, Viewer] }
    "/users" => {
        GET => users::list [users::LIST, Admin],
        POST => users::create [users::CREATE, Admin],
    }
    "/users/{id}" => {
        GET => users::get [users::GET, Admin],
        DELETE => users::revoke [users::REVOKE, Admin],
    }
    "/audit" => { GET => audit::list [audit::LIST, Admin] }
    "/webhooks" => {
        GET => webhooks::list [webhooks::LIST, Admin],
        POST => webhooks::create [webhooks::CREATE, Admin],
    }
    "/webhooks/{id}" => {
        GET => webhooks::get [webhooks::GET, Admin],
        PATCH => webhooks::patch [webhooks::PATCH, Admin],
        DELETE => webhooks::delete [webhooks::DELETE, Admin],
    }
    "/webhooks/{id}/rotate" => { POST => webhooks::rotate [webhooks::ROTATE_SECRET, Admin] }
    "/webhooks/{id}/ping" => { POST => webhooks::ping [webhooks::PING, Admin] }
    "/webhooks/{id}/deliveries" => { GET => webhooks::deliveries [webhooks::DELIVERIES, Admin] }
    "/webhooks/{id}/deliveries/{delivery_id}/retry" => {
        POST => webhooks::retry [webhooks::RETRY, Admin],
    }
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
        role: None,
    },
    Route {
        method: "GET",
        path: "/readyz",
        op: &READYZ,
        role: None,
    },
    Route {
        method: "GET",
        path: "/openapi.json",
        op: &OPENAPI,
        role: None,
    },
    Route {
        method: "GET",
        path: "/metrics",
        op: &METRICS,
        role: None,
    },
];

/// Every route this server registers.
pub fn all_routes() -> impl Iterator<Item = &'static Route> {
    ROUTES.iter().chain(OPEN_ROUTES)
}

pub(super) async fn method_not_allowed(allow: &'static str) -> Result<HttpResponse, ApiError> {
    let mut e = ApiError::new(
        Kind::MethodNotAllowed,
        format!("this route accepts: {allow}"),
    );
    e.allow = Some(allow);
    Err(e)
}
