//! The `/v1` guard: who is calling ([`super::principal`]), whether the
//! route table lets their role call this route, and for a write, an entry
//! in the audit log with its outcome. Probes, metrics and the OpenAPI
//! document stay open: they are read by machines that hold no token and
//! reveal nothing an attacker could use to send.

use super::errors::ApiError;
use super::principal::{Guard, Principal};
use super::routes::{self, Route};
use super::trail::Trail;
use crate::settings::Secret;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::HttpMessage;

/// Refuses `who` a route beyond their role, naming both roles.
pub fn check(who: &Principal, route: &Route) -> Result<(), ApiError> {
    match route.role {
        Some(needed) if !who.role.allows(needed) => {
            Err(who.refuse(&format!("{} {}", route.method, route.path), needed))
        }
        _ => Ok(()),
    }
}

/// Every `/v1` request: who is calling, whether their role may call this
/// route, and for a write, an entry in the audit log with its outcome.
pub async fn authorize(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let guard = req
        .app_data::<actix_web::web::Data<Guard>>()
        .map(|g| g.get_ref().clone())
        // Fail closed: a server built without a guard serves nothing.
        .unwrap_or_else(|| Guard::new(Some(Secret::new(crate::token::random_token())), None));
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec());
    let principal = match auth {
        None => match console_reading_events(&req).await {
            Some(p) => p,
            None => guard.authenticate(None).await?,
        },
        Some(a) => guard.authenticate(Some(&a)).await?,
    };
    // An unknown path or method goes on to its 404 or 405.
    let Some(route) = routes::find(req.method().as_str(), req.path()) else {
        return next.call(req).await;
    };
    // A write another daemon forwarded here (to the account's owner) was
    // recorded by that daemon, under the caller's name; the hop itself
    // carries only the daemon's token.
    let forwarded = req.headers().contains_key(super::forward::HOP) && principal.user_id.is_none();
    let mut trail = (route.writes() && !forwarded).then(|| {
        let ids = route.params(req.path()).unwrap_or_default();
        let resource = (!ids.is_empty()).then(|| ids.join("/"));
        Trail::new(&req, "api", route.op.id, resource, &principal)
    });
    if let Err(refused) = check(&principal, route) {
        if let Some(t) = trail.take() {
            t.refused(&req, &refused).await;
        }
        return Err(refused.into());
    }
    let req = match trail.as_mut() {
        Some(t) => t.read_body(req).await,
        None => req,
    };
    req.extensions_mut().insert(principal);
    let res = next.call(req).await?;
    if let Some(t) = trail {
        t.record(&res).await;
    }
    Ok(res)
}

/// The console's pages follow `/v1/events` with `EventSource`, which can
/// send no header, only the session cookie: a signed-in console session
/// may read that stream, and nothing else under `/v1` (every write still
/// needs a bearer token, so a stolen cookie cannot send).
async fn console_reading_events(req: &ServiceRequest) -> Option<Principal> {
    if req.method() != actix_web::http::Method::GET || req.path() != "/v1/events" {
        return None;
    }
    super::console::session::session_of(req.request())
        .await
        .map(|s| s.user)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::errors::Kind;
    use crate::http::principal::{new_user_token, token_hash, DAEMON_TOKEN};
    use chrono::Utc;
    use herald_actors::domain::Role;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_user_token_acts_for_its_user_until_revoked() {
        use herald_actors::domain::NewApiUser;
        use herald_actors::ports::UserStore;
        let store = Arc::new(herald_actors::memstore::MemoryStore::new());
        let token = new_user_token();
        let ana = store
            .create_user(&NewApiUser {
                name: "ana".into(),
                role: Role::Viewer,
                token_hash: token_hash(&token),
                created_at: Utc::now(),
                expires_at: None,
                created_by: DAEMON_TOKEN.into(),
            })
            .await
            .unwrap();
        let g = Guard::new(Some(Secret::new("s3cret")), Some(store.clone()));
        let header = format!("Bearer {token}");
        let p = g.authenticate(Some(header.as_bytes())).await.unwrap();
        assert_eq!(
            (p.user_id, p.name.as_str(), p.role),
            (Some(ana.id), "ana", Role::Viewer)
        );
        let write = routes::find("POST", "/v1/reminders").unwrap();
        let e = check(&p, write).unwrap_err();
        assert_eq!(e.kind, Kind::NeedsRole);
        assert!(e.detail.contains("needs the operator role"), "{}", e.detail);
        assert!(check(&p, routes::find("GET", "/v1/reminders").unwrap()).is_ok());
        store.delete_user(ana.id).await.unwrap();
        let e = g.authenticate(Some(header.as_bytes())).await.unwrap_err();
        assert_eq!(e.kind, Kind::Unauthorized);
    }
}
