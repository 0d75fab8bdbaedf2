//! Every route the control port serves, declared once: the `/v1` table
//! registers each handler with the operation it is documented by, so the
//! OpenAPI document ([`super::openapi`]) and the server cannot drift.
//! Each `/v1` route performs one service operation (`spec::Op::performs`)
//! and needs the role that operation declares; the check runs on the
//! route actix matched, wrapped around its handler (`authority`): no
//! second lookup of the request's path decides it.

use super::errors::{ApiError, Kind};
use super::{
    accounts, amend, audit, events, groups, media, pairing, preview, reminders, runs, spec, users,
    webhooks,
};
use actix_web::http::Method;
use actix_web::{web, HttpResponse};

pub use super::authority::Route;

/// Declares the `/v1` resources once: each line registers the handler,
/// wrapped in the authority of the operation it performs (its role, its
/// audit entry: [`super::authority`]), and names the operation the
/// document is generated from, so a route cannot be served undocumented,
/// documented unserved, or served without the check its operation
/// declares.
macro_rules! v1_api {
    ($( $path:literal => { $( $method:ident => $handler:path [$op:path] ),+ $(,)? } )+) => {
        /// Every `/v1` operation.
        pub static ROUTES: &[Route] = &[
            $( $( Route {
                method: stringify!($method),
                path: concat!("/v1", $path),
                op: &$op,
                role: $op.role,
            } ),+ ),+
        ];

        pub(super) fn v1_resources(cfg: &mut web::ServiceConfig) {
            // The table above, in the same order as the registrations
            // below: each route is wrapped with its own entry.
            let mut table = ROUTES.iter();
            $(
                let allow: &'static str =
                    concat!($( stringify!($method), ", " ),+).trim_end_matches(", ");
                cfg.service(
                    web::resource($path)
                        $( .route({
                            let route: &'static Route = table.next().expect("one entry per route");
                            debug_assert!(route.method == stringify!($method) && route.path.ends_with($path));
                            web::method(Method::$method)
                                .to($handler)
                                .wrap(actix_web::middleware::from_fn(
                                    move |req, next| super::authority::api_route(route, req, next),
                                ))
                        }) )+
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
    "/accounts/{id}/history" => { GET => accounts::history [accounts::HISTORY] }
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
    "/upcoming" => { GET => reminders::upcoming [reminders::UPCOMING] }
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
    "/runs/{id}/timeline" => { GET => runs::timeline [runs::TIMELINE] }
    "/runs/{id}/poll" => { GET => runs::poll [runs::POLL] }
    "/runs/{id}/stop" => { POST => runs::stop [runs::STOP] }
    "/runs/{id}/pause" => { POST => runs::pause [runs::PAUSE] }
    "/runs/{id}/resume" => { POST => runs::resume [runs::RESUME] }
    "/runs/{id}/retry" => { POST => runs::retry [runs::RETRY] }
    "/runs/{id}/recall" => { POST => amend::recall [amend::RECALL] }
    "/runs/{id}/edit" => { POST => amend::edit [amend::EDIT] }
    "/events" => { GET => events::stream [events::STREAM] }
    "/users" => {
        GET => users::list [users::LIST],
        POST => users::create [users::CREATE],
    }
    "/users/{id}" => {
        GET => users::get [users::GET],
        DELETE => users::revoke [users::REVOKE],
    }
    "/audit" => { GET => audit::list [audit::LIST] }
    "/webhooks" => {
        GET => webhooks::list [webhooks::LIST],
        POST => webhooks::create [webhooks::CREATE],
    }
    "/webhooks/{id}" => {
        GET => webhooks::get [webhooks::GET],
        PATCH => webhooks::patch [webhooks::PATCH],
        DELETE => webhooks::delete [webhooks::DELETE],
    }
    "/webhooks/{id}/rotate" => { POST => webhooks::rotate [webhooks::ROTATE_SECRET] }
    "/webhooks/{id}/ping" => { POST => webhooks::ping [webhooks::PING] }
    "/webhooks/{id}/deliveries" => { GET => webhooks::deliveries [webhooks::DELIVERIES] }
    "/webhooks/{id}/deliveries/{delivery_id}/retry" => {
        POST => webhooks::retry [webhooks::RETRY],
    }
}

/// The liveness probe's answer.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub(super) struct Health {
    #[schemars(extend("enum" = ["ok", "unavailable", "starting"]))]
    pub status: &'static str,
    /// Why the database did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The readiness probe's answer.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub(super) struct Ready {
    pub ready: bool,
    /// While a cluster daemon starts: what it waits for, and until when
    /// (its node id still registered by a previous run that no longer
    /// renews it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

static HEALTHZ: spec::Op = spec::Op::new(
    "healthz",
    "Liveness",
    spec::Success::json::<Health>(200, "Alive"),
)
.describe("The process answers and the database answers (503 when it does not).")
.errors(&[503]);
static READYZ: spec::Op = spec::Op::new(
    "readyz",
    "Readiness",
    spec::Success::json::<Ready>(200, "Ready"),
)
.describe("Started and not draining (503 during start-up and shutdown).")
.errors(&[503]);
static OPENAPI: spec::Op = spec::Op::new(
    "openapi",
    "This document",
    spec::Success::json::<spec::Document>(200, "The OpenAPI document"),
);
static METRICS: spec::Op = spec::Op::new(
    "metrics",
    "Prometheus metrics",
    spec::Success::json::<spec::Metrics>(200, "Metrics").media("application/openmetrics-text"),
)
.describe(
    "Prometheus text exposition with per-account labels. Open, like the probes, unless \
     `control.metrics_token` is set: then it needs `Authorization: Bearer <metrics token>` (401 \
     without). One rendered page answers every scrape for a second.",
)
.errors(&[401]);

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

/// Every route this server registers outside the console.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::CONSOLE_ROUTES;
    use crate::service::OPERATIONS;

    #[test]
    fn every_v1_route_performs_one_operation_and_every_operation_has_one_route() {
        for op in OPERATIONS {
            let routes: Vec<&Route> = ROUTES
                .iter()
                .filter(|r| r.op.performs.is_some_and(|p| std::ptr::eq(p, *op)))
                .collect();
            assert_eq!(
                routes.len(),
                1,
                "{} is performed by {} /v1 routes",
                op.id,
                routes.len()
            );
            assert_eq!(
                routes[0].op.id, op.id,
                "{} {}",
                routes[0].method, routes[0].path
            );
            assert_eq!(routes[0].role, Some(op.role), "{}", op.id);
        }
        // Every `/v1` route performs a declared operation: a route added
        // without one fails here (and serves nothing: `api_route`).
        for r in ROUTES {
            let p =
                r.op.performs
                    .unwrap_or_else(|| panic!("{} {} performs no operation", r.method, r.path));
            assert!(
                OPERATIONS.iter().any(|op| std::ptr::eq(*op, p)),
                "{} is not in service::OPERATIONS",
                p.id
            );
            assert_eq!(r.role, Some(p.role), "{} {}", r.method, r.path);
            assert_eq!(
                r.writes(),
                !p.reads && r.method != "GET",
                "{} {}: a GET never writes",
                r.method,
                r.path
            );
        }
        for r in OPEN_ROUTES {
            assert!(r.op.performs.is_none() && r.role.is_none(), "{}", r.path);
        }
    }

    #[test]
    fn a_console_action_performs_what_its_v1_operation_performs() {
        for c in CONSOLE_ROUTES.iter().filter(|c| c.performs.is_some()) {
            let op = c.performs.unwrap();
            assert_eq!(
                (c.op, c.role),
                (op.id, Some(op.role)),
                "{} {}",
                c.method,
                c.path
            );
        }
        // Every console action (a POST past sign-in) performs one.
        for c in CONSOLE_ROUTES {
            if c.method == "POST" && c.role.is_some() {
                assert!(
                    c.performs.is_some(),
                    "{} {} performs nothing",
                    c.method,
                    c.path
                );
            }
        }
        // The run buttons are service operations, not handler calls.
        for action in ["stop", "pause", "resume", "retry"] {
            let path = format!("/runs/{{id}}/{action}");
            let c = CONSOLE_ROUTES.iter().find(|c| c.path == path).unwrap();
            assert!(c.performs.is_some(), "{path}");
        }
    }
}
