//! Authority, decided on what runs. Two steps, both bound to the router:
//!
//! 1. The scope's gate (`/v1`: [`api_gate`]; the console: `console_gate`)
//!    finds who is calling (bearer token or console session), refuses a
//!    path that is not canonical ([`super::canonical`]) and a forwarding
//!    header that is not another daemon's, and leaves the caller in the
//!    request. It decides nothing about what the request may do.
//! 2. Each route is registered wrapped in the authority of the operation
//!    it performs ([`api_route`]; the console's `console_route`): the role that
//!    operation declares is checked, and a write is put on the audit trail
//!    under the caller's name with its outcome. A request that matches no
//!    route reaches no wrapper and no handler: it is answered 404.
//!
//! So the role checked is always the role of the handler that runs; no
//! second lookup of the request's path string takes part. Every write
//! attempt, allowed or refused, leaves exactly one audit entry naming the
//! principal who made it; attempts that prove no identity are counted per
//! address and minute ([`super::attempts`]).

use super::attempts::{Attempt, Attempts, Origin};
use super::canonical;
use super::console::session::session_of;
use super::errors::{ApiError, Kind};
use super::forward;
use super::principal::{Guard, Principal};
use super::spec;
use super::trail::Trail;
use crate::service::Allowed;
use crate::service::Service;
use crate::settings::Secret;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage};
use chrono::Utc;
use herald_actors::domain::Role;

/// One registered operation: its method, full path and declaration.
#[derive(Debug)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub op: &'static spec::Op,
    /// The least role that may call it (the operation's own); `None`:
    /// open, no token (probes, metrics, the document).
    pub role: Option<Role>,
}

impl Route {
    /// A write: what the audit log records. Its service operation says
    /// (some reads are POSTs with a body, such as a preview).
    pub fn writes(&self) -> bool {
        self.op.writes()
    }
}

/// Who a request acts for, as the scope's gate found it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Principal,
    /// Signed in by the console's session cookie, not a bearer token.
    pub by_session: bool,
    /// Another daemon of the cluster forwarded it (it audited it there).
    pub forwarded: bool,
}

pub(super) fn is_write_method(m: &Method) -> bool {
    m != Method::GET && m != Method::HEAD
}

/// The ids in the matched route's path, in order (`3`, `3/17`).
pub(super) fn resource_of(req: &ServiceRequest) -> Option<String> {
    let ids: Vec<&str> = req.match_info().iter().map(|(_, v)| v).collect();
    (!ids.is_empty()).then(|| ids.join("/"))
}

fn attempts(req: &ServiceRequest) -> Option<web::Data<Attempts>> {
    req.app_data::<web::Data<Attempts>>().cloned()
}

async fn note_bad_token(req: &ServiceRequest) {
    if let Some(a) = attempts(req) {
        let from = Origin {
            remote: super::peer::remote_of(req.request()),
            via: "api",
            method: req.method().as_str(),
            path: req.path(),
        };
        a.note(Utc::now(), from, Attempt::BadToken).await;
    }
}

/// `/v1`'s credentials: the bearer token; without one, a console session
/// (which only routes that declare `session_cookie` accept).
pub(super) async fn authenticate(req: &ServiceRequest) -> Result<Caller, ApiError> {
    let guard = req
        .app_data::<web::Data<Guard>>()
        .map(|g| g.get_ref().clone())
        // Fail closed: a server built without a guard serves nothing.
        .unwrap_or_else(|| Guard::new(Some(Secret::new(crate::token::random_token())), None));
    let caller = |principal, by_session| Caller {
        principal,
        by_session,
        forwarded: false,
    };
    match req.headers().get(header::AUTHORIZATION) {
        Some(a) => Ok(caller(guard.authenticate(Some(a.as_bytes())).await?, false)),
        None => match session_of(req.request()).await {
            Some(s) if !guard.is_open() => Ok(caller(s.user, true)),
            _ => Ok(caller(guard.authenticate(None).await?, false)),
        },
    }
}

/// A write attempt refused before any route ran, on the trail.
pub(super) async fn refuse_before_routing(
    req: &ServiceRequest,
    via: &str,
    operation: &str,
    who: &Principal,
    e: &ApiError,
) {
    Trail::new(req, via, operation, None, who)
        .refused(req, e)
        .await;
}

/// The `/v1` gate: who is calling, a canonical path, an honest hop.
pub async fn api_gate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let mut caller = match authenticate(&req).await {
        Ok(c) => c,
        Err(e) => {
            note_bad_token(&req).await;
            return Err(e.into());
        }
    };
    if let Err(e) = canonical::check(req.path()) {
        if is_write_method(req.method()) {
            refuse_before_routing(&req, "api", "refusedPath", &caller.principal, &e).await;
        }
        return Err(e.into());
    }
    if req.headers().contains_key(forward::HOP) {
        let cluster = req
            .app_data::<web::Data<Service>>()
            .is_some_and(|s| s.clustered());
        if !(cluster && caller.principal.is_daemon() && !caller.by_session) {
            let e = ApiError::field_error(
                Kind::BadRequest,
                forward::HOP,
                "is honoured only from another daemon of this cluster: with the daemon's own \
                 token and cluster.enabled",
            );
            refuse_before_routing(&req, "api", "refusedForwarding", &caller.principal, &e).await;
            return Err(e.into());
        }
        caller.forwarded = true;
    }
    req.extensions_mut().insert(caller);
    next.call(req).await
}

/// Around each `/v1` route: its operation's role, and the audit entry of a
/// write.
pub async fn api_route(
    route: &'static Route,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    // Fail closed: a route reached without the gate serves nothing.
    let caller = req.extensions().get::<Caller>().cloned().ok_or_else(|| {
        ApiError::new(
            Kind::Internal,
            "a /v1 route was reached without the /v1 gate",
        )
    })?;
    // Fail closed: a route that performs no service operation has no
    // role to check, and serves nothing.
    let op = route.op.performs.ok_or_else(|| {
        ApiError::new(
            Kind::Internal,
            format!("{} {} performs no operation", route.method, route.path),
        )
    })?;
    let needed = op.role;
    if caller.by_session && !route.op.session_cookie {
        note_bad_token(&req).await;
        return Err(ApiError::new(
            Kind::Unauthorized,
            "this route needs an Authorization: Bearer <token> header (a console session opens \
             only the event stream under /v1)",
        )
        .into());
    }
    let who = &caller.principal;
    let mut trail = (route.writes() && !caller.forwarded)
        .then(|| Trail::new(&req, "api", route.op.id, resource_of(&req), who));
    if !who.role.allows(needed) {
        let e = who.refuse(&format!("{} {}", route.method, route.path), needed);
        if let Some(t) = trail.take() {
            t.refused(&req, &e).await;
        }
        return Err(e.into());
    }
    let req = match trail.as_mut() {
        Some(t) => t.read_body(req).await,
        None => req,
    };
    // The operation's proof, for the handler to hand to the service.
    req.extensions_mut().insert(op.allow(who.role)?);
    req.extensions_mut().insert(caller.principal);
    let res = next.call(req).await?;
    if let Some(t) = trail {
        t.record(&res).await;
    }
    Ok(res)
}

/// A handler that performs a service operation takes its proof, which the
/// route's authority minted after the role check. A handler reached
/// without one (its route declares no `performs`) fails closed.
impl actix_web::FromRequest for Allowed {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &actix_web::HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        std::future::ready(req.extensions().get::<Allowed>().copied().ok_or_else(|| {
            ApiError::new(
                Kind::Internal,
                format!(
                    "{} {} performs an operation its route does not declare",
                    req.method(),
                    req.path()
                ),
            )
        }))
    }
}
