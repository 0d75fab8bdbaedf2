//! Every console route, declared once: each line registers the page or
//! action with the authority it needs, and an action names the `/v1`
//! operation it performs, so its role and its audit entry are that
//! operation's. The check runs around the route actix matched
//! ([`console_route`]); a path that matches no line is answered 404
//! before any handler runs.

use super::layout::{self, Nav};
use super::session::{session_of, Session};
use super::{accounts, hooks, overview, people, reminders, runs, sign};
use crate::http::authority::{authenticate, is_write_method, refuse_before_routing, resource_of};
use crate::http::canonical;
use crate::http::trail::Trail;
use crate::http::{
    accounts as api_accounts, amend as api_amend, audit as api_audit, media as api_media,
    pairing as api_pairing, reminders as api_reminders, runs as api_runs, users as api_users,
    webhooks as api_webhooks,
};
use crate::service::Operation;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::web;
use actix_web::HttpMessage;
use herald_actors::domain::Role;

/// One console route's declaration: `free "name"` (anyone, signed in or
/// not), `page "name" Role` (a page of its own that reads with that role),
/// or `does OP` (a page or action performing the `/v1` operation `OP`,
/// with its role).
macro_rules! console_authority {
    ($m:expr, $p:literal, free $op:literal) => {
        ConsoleRoute {
            method: $m,
            path: $p,
            op: $op,
            role: None,
            performs: None,
            page: None,
        }
    };
    ($m:expr, $p:literal, page $op:literal $role:ident) => {
        ConsoleRoute {
            method: $m,
            path: $p,
            op: $op,
            role: Some(Role::$role),
            performs: None,
            page: Some(Operation::read($op, Role::$role)),
        }
    };
    ($m:expr, $p:literal, does $op:path) => {
        ConsoleRoute {
            method: $m,
            path: $p,
            op: $op.id,
            role: $op.role,
            performs: $op.performs,
            page: None,
        }
    };
}

macro_rules! console_routes {
    ($( $path:literal => { $( $method:ident => $handler:path [$($auth:tt)+] ),+ $(,)? } )+) => {
        /// Every console route.
        pub static CONSOLE_ROUTES: &[ConsoleRoute] = &[
            $( $( console_authority!(stringify!($method), $path, $($auth)+) ),+ ),+
        ];

        /// Registers the console's routes (after `/v1` and the open
        /// routes), each wrapped in its own entry of the table above.
        pub fn configure(cfg: &mut web::ServiceConfig) {
            let mut table = CONSOLE_ROUTES.iter();
            $(
                cfg.service(
                    web::resource($path)
                        $( .route({
                            let route: &'static ConsoleRoute =
                                table.next().expect("one entry per route");
                            debug_assert!(route.method == stringify!($method) && route.path == $path);
                            web::method(Method::$method)
                                .to($handler)
                                .wrap(actix_web::middleware::from_fn(
                                    move |req, next| console_route(route, req, next),
                                ))
                        }) )+,
                );
            )+
        }
    };
}

console_routes! {
    "/" => { GET => overview::page [page "consoleOverview" Viewer] }
    "/sign-in" => {
        GET => sign::sign_in_page [free "signInPage"],
        POST => sign::sign_in [free "signIn"],
    }
    "/sign-out" => { POST => sign::sign_out [free "signOut"] }
    "/assets/console.css" => { GET => layout::css [free "consoleCss"] }
    "/assets/console.js" => { GET => layout::js [free "consoleJs"] }
    "/accounts" => {
        GET => accounts::list [does api_accounts::LIST],
        POST => accounts::create [does api_accounts::CREATE],
    }
    "/accounts/{id}" => { GET => accounts::detail [does api_accounts::GET] }
    "/accounts/{id}/enable" => { POST => accounts::enable [does api_accounts::ENABLE] }
    "/accounts/{id}/disable" => { POST => accounts::disable [does api_accounts::DISABLE] }
    "/accounts/{id}/limits" => { POST => accounts::limits [does api_accounts::PATCH] }
    "/accounts/{id}/pair" => {
        GET => accounts::pair_page [does api_pairing::STATE],
        POST => accounts::pair_start [does api_pairing::START],
    }
    "/accounts/{id}/pair/state" => { GET => accounts::pair_state [does api_pairing::STATE] }
    "/accounts/{id}/pair/qr.png" => { GET => accounts::pair_qr [does api_pairing::QR_PNG] }
    "/reminders" => {
        GET => reminders::list [page "consoleReminders" Viewer],
        POST => reminders::create [does api_reminders::CREATE],
    }
    "/reminders/new" => { GET => reminders::new_form [does api_reminders::CREATE] }
    "/reminders/{id}" => {
        GET => reminders::detail [does api_reminders::GET],
        POST => reminders::update [does api_reminders::UPDATE],
    }
    "/reminders/{id}/edit" => { GET => reminders::edit_form [does api_reminders::UPDATE] }
    "/reminders/{id}/pause" => { POST => reminders::pause [does api_reminders::PAUSE] }
    "/reminders/{id}/resume" => { POST => reminders::resume [does api_reminders::RESUME] }
    "/reminders/{id}/archive" => { POST => reminders::archive [does api_reminders::DELETE] }
    "/reminders/{id}/fire" => { POST => reminders::fire [does api_reminders::FIRE] }
    "/media" => { POST => reminders::upload [does api_media::UPLOAD] }
    "/runs" => { GET => runs::list [does api_runs::LIST] }
    "/runs/{id}" => { GET => runs::detail [does api_runs::GET] }
    "/runs/{id}/live" => { GET => runs::live [does api_runs::GET] }
    "/runs/{id}/groups.csv" => { GET => runs::groups_csv [does api_runs::TARGETS] }
    "/runs/{id}/stop" => { POST => runs::stop [does api_runs::STOP] }
    "/runs/{id}/pause" => { POST => runs::pause [does api_runs::PAUSE] }
    "/runs/{id}/resume" => { POST => runs::resume [does api_runs::RESUME] }
    "/runs/{id}/retry" => { POST => runs::retry [does api_runs::RETRY] }
    "/runs/{id}/recall" => {
        GET => runs::recall_page [does api_amend::RECALL],
        POST => runs::recall [does api_amend::RECALL],
    }
    "/users" => {
        GET => people::list [does api_users::LIST],
        POST => people::create [does api_users::CREATE],
    }
    "/users/{id}/revoke" => { POST => people::revoke [does api_users::REVOKE] }
    "/audit" => { GET => people::audit_page [does api_audit::LIST] }
    "/webhooks" => {
        GET => hooks::list [does api_webhooks::LIST],
        POST => hooks::create [does api_webhooks::CREATE],
    }
    "/webhooks/{id}" => { GET => hooks::detail [does api_webhooks::GET] }
    "/webhooks/{id}/ping" => { POST => hooks::ping [does api_webhooks::PING] }
    "/webhooks/{id}/enable" => { POST => hooks::enable [does api_webhooks::PATCH] }
    "/webhooks/{id}/disable" => { POST => hooks::disable [does api_webhooks::PATCH] }
    "/webhooks/{id}/delete" => { POST => hooks::delete [does api_webhooks::DELETE] }
}

/// A console route: what its handler performs and the least role for it.
#[derive(Debug)]
pub struct ConsoleRoute {
    pub method: &'static str,
    pub path: &'static str,
    /// The audit log's operation: the `/v1` operation an action performs
    /// (`createReminder`), or the page's own name.
    pub op: &'static str,
    /// `None`: free to anyone, signed in or not (sign-in, the assets).
    pub role: Option<Role>,
    /// The service operation an action performs (its `/v1` operation's).
    pub performs: Option<&'static Operation>,
    /// A page of its own (the overview, the reminders' list): a read of
    /// its own name and role, whose proof opens the service reads it shows.
    pub page: Option<Operation>,
}

impl ConsoleRoute {
    /// A console write: a POST that needs more than a viewer's role.
    pub fn writes(&self) -> bool {
        self.method == "POST" && self.role.is_some_and(|r| r > Role::Viewer)
    }
}

/// The console's gate: the session, if any, and a canonical path.
pub async fn console_gate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let session = session_of(req.request()).await;
    if let Err(e) = canonical::check(req.path()) {
        if is_write_method(req.method()) {
            // A mangled `/v1` path lands here too: whoever it names, by
            // session or by token, is on the trail.
            let who = match &session {
                Some(s) => Some(s.user.clone()),
                None => authenticate(&req).await.ok().map(|c| c.principal),
            };
            if let Some(who) = who {
                refuse_before_routing(&req, "console", "refusedPath", &who, &e).await;
            }
        }
        return Err(e.into());
    }
    if let Some(s) = session {
        req.extensions_mut().insert(s);
    }
    next.call(req).await
}

/// Around each console route: its role (a page without a session goes to
/// the sign-in page), and the audit entry of a write.
pub async fn console_route(
    route: &'static ConsoleRoute,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(needed) = route.role else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    let Some(session) = req.extensions().get::<Session>().cloned() else {
        return Ok(req.into_response(super::request::see_other("/sign-in")));
    };
    let mut trail = route
        .writes()
        .then(|| Trail::new(&req, "console", route.op, resource_of(&req), &session.user));
    if !session.user.role.allows(needed) {
        let e = session
            .user
            .refuse(&format!("{} {}", route.method, route.path), needed);
        if let Some(t) = trail.take() {
            t.refused(&req, &e).await;
        }
        let page = layout::refused(&session, Nav::Overview, "Not allowed", &e, "/");
        return Ok(req.into_response(page));
    }
    let req = match trail.as_mut() {
        Some(t) => t.read_body(req).await,
        None => req,
    };
    if let Some(op) = route.performs.or(route.page.as_ref()) {
        req.extensions_mut().insert(op.allow(session.user.role)?);
    }
    let res = next.call(req).await;
    if let Some(t) = trail {
        t.outcome(&res).await;
    }
    Ok(res?.map_into_boxed_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_take_their_role_and_name_from_the_operation() {
        let find = |m: &str, p: &str| {
            CONSOLE_ROUTES
                .iter()
                .find(|r| r.method == m && r.path == p)
                .unwrap()
        };
        let fire = find("POST", "/reminders/{id}/fire");
        assert_eq!((fire.op, fire.role), ("fireReminder", Some(Role::Operator)));
        assert!(fire.writes());
        let archive = find("POST", "/reminders/{id}/archive");
        assert_eq!(archive.op, "archiveReminder");
        assert_eq!(
            find("POST", "/accounts/{id}/limits").role,
            Some(Role::Admin)
        );
        let qr = find("GET", "/accounts/{id}/pair/qr.png");
        assert_eq!(qr.role, Some(Role::Admin));
        assert!(!qr.writes(), "a page reads");
        assert_eq!(find("GET", "/audit").role, Some(Role::Admin));
        assert_eq!(find("POST", "/sign-out").role, None);
        assert!(!find("POST", "/sign-in").writes());
        // Every route past sign-in hands its handler a proof.
        for r in CONSOLE_ROUTES.iter().filter(|r| r.role.is_some()) {
            assert!(r.performs.is_some() || r.page.is_some(), "{}", r.path);
        }
        // Every route but the free ones declares a role.
        let free: Vec<&str> = CONSOLE_ROUTES
            .iter()
            .filter(|r| r.role.is_none())
            .map(|r| r.path)
            .collect();
        assert_eq!(
            free,
            [
                "/sign-in",
                "/sign-in",
                "/sign-out",
                "/assets/console.css",
                "/assets/console.js"
            ]
        );
    }
}
