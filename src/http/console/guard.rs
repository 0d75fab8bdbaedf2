//! Refuses a console request beyond the signed-in user's role (see
//! [`super::actions`] for what each needs), and records every console
//! write in the audit log.

use super::actions::needs;
use super::layout::{self, Nav};
use super::session::session_of;
use crate::http::trail::Trail;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::HttpMessage;

/// Refuses what the signed-in user's role does not allow, and records
/// every console write in the audit log. Requests without a session go
/// on: their handler sends the browser to the sign-in page.
pub async fn authorize(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let Some((operation, needed, writes, ids)) = needs(req.method().as_str(), req.path()) else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    let Some(session) = session_of(req.request()).await else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    req.extensions_mut().insert(session.clone());
    let resource = (!ids.is_empty()).then(|| ids.join("/"));
    let mut trail = writes.then(|| Trail::new(&req, "console", operation, resource, &session.user));
    if !session.user.role.allows(needed) {
        let e = session
            .user
            .refuse(&format!("{} {}", req.method(), req.path()), needed);
        if let Some(t) = trail {
            t.refused(&req, &e).await;
        }
        let page = layout::refused(&session, Nav::Overview, "Not allowed", &e, "/");
        return Ok(req.into_response(page).map_into_boxed_body());
    }
    let req = match trail.as_mut() {
        Some(t) => t.read_body(req).await,
        None => req,
    };
    let res = next.call(req).await?;
    if let Some(t) = trail {
        t.record(&res).await;
    }
    Ok(res.map_into_boxed_body())
}
