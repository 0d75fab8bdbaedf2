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
    /// For a forwarded request, the principal it was forwarded for.
    pub principal: Principal,
    /// Signed in by the console's session cookie, not a bearer token.
    pub by_session: bool,
    /// The daemon of the cluster that forwarded it, if one did.
    pub forwarded_by: Option<String>,
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
            client: super::peer::client_of(req.request()),
            via: "api",
            method: req.method().as_str(),
            path: req.path(),
        };
        a.note(Utc::now(), from, Attempt::BadToken).await;
    }
}

fn guard_of(req: &ServiceRequest) -> Result<&Guard, ApiError> {
    // Fail closed, and say so: a server built without a guard serves
    // nothing, as an internal error rather than a refused token.
    req.app_data::<web::Data<Guard>>()
        .map(|g| g.get_ref())
        .ok_or_else(|| {
            ApiError::new(
                Kind::Internal,
                "the control port was built without its guard",
            )
        })
}

/// `/v1`'s credentials: the bearer token; without one, a console session
/// (which only routes that declare `session_cookie` accept).
pub(super) async fn authenticate(req: &ServiceRequest) -> Result<Caller, ApiError> {
    let guard = guard_of(req)?;
    let caller = |principal, by_session| Caller {
        principal,
        by_session,
        forwarded_by: None,
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
            // Only a token that names nobody is a failed authentication;
            // a store that could not answer is the daemon's fault.
            if e.kind == Kind::Unauthorized {
                note_bad_token(&req).await;
            }
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
        match forwarded(&req, &caller).await {
            Ok(forwarded) => caller = forwarded,
            Err(e) => {
                refuse_before_routing(&req, "api", "refusedForwarding", &caller.principal, &e)
                    .await;
                return Err(e.into());
            }
        }
    }
    req.extensions_mut().insert(caller);
    next.call(req).await
}

/// A request that says another daemon forwarded it: honoured only from a
/// live daemon of this cluster, with the daemon's own token, for a
/// principal the shared store knows. The caller it acts as is that
/// principal (whose role the route checks), forwarded by that daemon.
async fn forwarded(req: &ServiceRequest, caller: &Caller) -> Result<Caller, ApiError> {
    let refuse = |field: &str, rule: &str| ApiError::field_error(Kind::BadRequest, field, rule);
    let service = req.app_data::<web::Data<Service>>();
    let cluster = service.is_some_and(|s| s.clustered());
    if !(cluster && caller.principal.is_daemon() && !caller.by_session) {
        return Err(refuse(
            forward::HOP,
            "is honoured only from another daemon of this cluster: with the daemon's own token \
             and cluster.enabled",
        ));
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let node = header(forward::HOP);
    let service = service.expect("clustered, so the service is there");
    if node.is_empty()
        || Some(node.as_str()) == service.node()
        || !service.is_live_peer(&node).await?
    {
        return Err(refuse(
            forward::HOP,
            "must name another live daemon of this cluster (its registration in the shared \
             database not expired)",
        ));
    }
    let named = header(forward::FOR);
    let principal = if named == crate::http::DAEMON_TOKEN {
        Principal::daemon()
    } else {
        let user = named
            .strip_prefix("user:")
            .and_then(|id| id.parse::<i64>().ok())
            .ok_or_else(|| refuse(forward::FOR, "must be control.token or user:<id>"))?;
        guard_of(req)?.user(user).await?.ok_or_else(|| {
            refuse(
                forward::FOR,
                "must name a live user (not revoked, not expired) of the shared store",
            )
        })?
    };
    Ok(Caller {
        principal,
        by_session: false,
        forwarded_by: Some(node),
    })
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
    let mut trail = route.writes().then(|| {
        Trail::new(&req, "api", route.op.id, resource_of(&req), who)
            .forwarded_by(caller.forwarded_by.clone())
    });
    let refusal = if caller.forwarded_by.is_some() && !op.forwards {
        Some(ApiError::field_error(
            Kind::BadRequest,
            forward::HOP,
            format!(
                "is honoured only on an operation the account's owner performs; {} is performed \
                 by any daemon and is never forwarded",
                op.id
            ),
        ))
    } else if !who.role.allows(needed) {
        Some(who.refuse(&format!("{} {}", route.method, route.path), needed))
    } else {
        None
    };
    if let Some(e) = refusal {
        match trail.take() {
            Some(t) => t.refused(&req, &e).await,
            // A read refused for its hop is an attempt worth keeping too.
            None if caller.forwarded_by.is_some() => {
                refuse_before_routing(&req, "api", "refusedForwarding", who, &e).await
            }
            None => {}
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
    let res = next.call(req).await;
    if let Some(t) = trail {
        t.outcome(&res).await;
    }
    res
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::attempts::Attempts;
    use crate::http::trail::Log;
    use crate::settings::Secret;
    use actix_web::{test, App, HttpResponse};
    use herald_actors::domain::AuditFilter;
    use herald_actors::memstore::MemoryStore;
    use herald_actors::ports::AuditStore;
    use std::sync::Arc;

    const TOKEN: &str = "authority-test-token-0123456789";

    /// `POST /v1/users` as the route table declares it (built here: the
    /// table is above this module, and its tests may not import upward).
    fn create_user() -> &'static Route {
        let op = &crate::http::users::CREATE;
        Box::leak(Box::new(Route {
            method: "POST",
            path: "/v1/users",
            op,
            role: op.role,
        }))
    }

    async fn failing(
        _: ServiceRequest,
        _: Next<impl MessageBody + 'static>,
    ) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
        Err::<ServiceResponse<actix_web::body::BoxBody>, _>(
            actix_web::error::ErrorInternalServerError("the service behind the route failed"),
        )
    }

    /// The `/v1` gate and one route, with the inner service failing when
    /// `fail` is set; the guard only when `guarded`.
    macro_rules! app {
        ($store:expr, $fail:expr, $guarded:expr) => {{
            let store: Arc<MemoryStore> = $store;
            let route = create_user();
            let mut app = App::new()
                .app_data(web::Data::new(Log::new(store.clone())))
                .app_data(web::Data::new(Attempts::new(store.clone())));
            if $guarded {
                app = app.app_data(web::Data::new(Guard::new(
                    Some(Secret::new(TOKEN)),
                    Some(store.clone()),
                )));
            }
            test::init_service(
                app.service(
                    web::scope("/v1")
                        .wrap(actix_web::middleware::from_fn(api_gate))
                        .service(
                            web::resource("/users").route(
                                web::post()
                                    .to(|| async { HttpResponse::Created().finish() })
                                    .wrap(actix_web::middleware::Condition::new(
                                        $fail,
                                        actix_web::middleware::from_fn(failing),
                                    ))
                                    .wrap(actix_web::middleware::from_fn(move |req, next| {
                                        api_route(route, req, next)
                                    })),
                            ),
                        ),
                ),
            )
            .await
        }};
    }

    fn post(token: &str) -> actix_web::test::TestRequest {
        test::TestRequest::post()
            .uri("/v1/users")
            .insert_header((header::AUTHORIZATION, format!("Bearer {token}")))
            .insert_header((header::CONTENT_TYPE, "application/json"))
            .set_payload(r#"{"name":"ana","role":"viewer"}"#)
    }

    async fn trail(store: &MemoryStore) -> Vec<(String, u16)> {
        store
            .list_audit(&AuditFilter::default(), None, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.entry.operation, e.entry.status))
            .collect()
    }

    #[actix_web::test]
    async fn a_write_whose_route_fails_is_still_on_the_trail_once() {
        let store = Arc::new(MemoryStore::new());
        let app = app!(store.clone(), true, true);
        let res = test::try_call_service(&app, post(TOKEN).to_request()).await;
        let status = match res {
            Ok(r) => r.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        assert_eq!(status.as_u16(), 500);
        assert_eq!(trail(&store).await, [("createUser".to_owned(), 500)]);
        // A write that succeeds: one entry more, with its status.
        let app = app!(store.clone(), false, true);
        let res = test::call_service(&app, post(TOKEN).to_request()).await;
        assert_eq!(res.status().as_u16(), 201);
        assert_eq!(trail(&store).await.len(), 2);
    }

    #[actix_web::test]
    async fn a_port_without_its_guard_answers_500_not_401() {
        let store = Arc::new(MemoryStore::new());
        let app = app!(store.clone(), false, false);
        let res = test::try_call_service(&app, post(TOKEN).to_request()).await;
        let status = match res {
            Ok(r) => r.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        assert_eq!(status.as_u16(), 500);
        assert!(trail(&store).await.is_empty(), "no failed authentication");
    }

    #[actix_web::test]
    async fn a_store_that_cannot_answer_is_no_bad_token() {
        let store = Arc::new(MemoryStore::new());
        store.fail_next_user_lookups(1);
        let app = app!(store.clone(), false, true);
        let user_token = format!("{}{}", crate::token::USER_TOKEN_PREFIX, "0".repeat(64));
        let res = test::try_call_service(&app, post(&user_token).to_request()).await;
        let status = match res {
            Ok(r) => r.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        assert_ne!(status.as_u16(), 401, "the daemon's fault, not the caller's");
        assert!(status.is_server_error(), "{status}");
        assert!(
            trail(&store).await.is_empty(),
            "not counted as a failed authentication"
        );
        // A token that is nobody's is.
        let res = test::try_call_service(&app, post(&user_token).to_request()).await;
        let status = match res {
            Ok(r) => r.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        assert_eq!(status.as_u16(), 401);
        assert_eq!(
            trail(&store).await,
            [("failedAuthentication".to_owned(), 401)]
        );
    }
}
