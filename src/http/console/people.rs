//! Users and the audit log, for admins: add a user (its token shown once,
//! on the page that answers the form), revoke one, and read who wrote
//! what.

use super::layout::{self, action_button, csrf, utc, Nav};
use super::{post_form, with_location, Signed};
use crate::http::errors::ApiError;
use crate::http::extract::positive_id;
use crate::http::users::{self, CreateUser};
use crate::service::audit::Audit;
use crate::service::users::Users;
use crate::service::Allowed;
use crate::service::Service;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::{AuditFilter, Role};
use maud::{html, Markup};
use std::collections::BTreeMap;

/// Audit entries a page shows at once.
const AUDIT_PAGE: u32 = 100;

async fn users_page(
    service: &Service,
    (s, allowed): (&super::Session, Allowed),
    status: StatusCode,
    top: Markup,
) -> Result<HttpResponse, ApiError> {
    let all = Users::of(service).list(allowed).await?.items;
    let body = html! {
        (top)
        p { "The daemon's own token (" code { "control.token" } ") is always an admin and is not listed." }
        @if all.is_empty() { p { "No users yet." } } @else {
            div.scroll { table #users {
                caption.sr { "Users" }
                thead { tr {
                    th scope="col" { "Name" } th scope="col" { "Role" } th scope="col" { "Created" }
                    th scope="col" { "Expires" } th scope="col" { "By" } th scope="col" { span.sr { "Revoke" } }
                } }
                tbody { @for u in &all { tr {
                    td { (u.name) }
                    td { (u.role) }
                    td { (utc(u.created_at)) }
                    td { @match u.expires_at { Some(t) => (utc(t)), None => "never" } }
                    td { (u.created_by) }
                    td { (action_button(s, &crate::http::users::REVOKE, &format!("/users/{}/revoke", u.id), "Revoke", "danger")) }
                } } }
            } }
        }
        h2 { "Add a user" }
        form.stack #new-user method="post" action="/users" {
            (csrf(s))
            label for="user-name" { "Name" }
            input #user-name name="name" required maxlength="64" pattern="[A-Za-z0-9._@\\-]{1,64}";
            label for="user-role" { "Role" }
            select #user-role name="role" {
                @for r in Role::ALL {
                    option value=(r) selected[r == Role::Operator] { (r) }
                }
            }
            small { "viewer reads everything; operator also writes reminders, runs, groups and media; admin also manages accounts, pairing and users." }
            label for="user-expires" { "Expires (optional, RFC 3339, e.g. 2027-01-01T00:00:00Z)" }
            input #user-expires name="expires_at";
            button type="submit" { "Add user" }
        }
    };
    Ok(layout::page_with(status, "Users", Nav::Users, s, body))
}

pub(super) async fn list(
    service: web::Data<Service>,
    Signed(s): Signed,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    users_page(&service, (&s, allowed), StatusCode::OK, html! {}).await
}

pub(super) async fn create(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let form = post_form(&req, &s, &body).await?;
    let expires = Some(form.text("expires_at")).filter(|t| !t.is_empty());
    let new = CreateUser::from_form(form.text("name"), form.text("role"), expires);
    let made = match users::spec_of(new) {
        Ok(spec) => {
            Users::of(&service)
                .create(allowed, &s.user.name, spec)
                .await
        }
        Err(e) => Err(e),
    };
    match made {
        // Shown once, on this answer; a reload does not show it again.
        Ok(made) => {
            let top = html! {
                div.token-shown #new-token role="status" {
                    p { "User " strong { (made.user.name) } " (" (made.user.role) ") added. Their token, shown only this once:" }
                    p { code #token-value { (made.token) } }
                }
            };
            // The answer lists the users too: the create proof opens that
            // read (it needs no higher role).
            let page = users_page(&service, (&s, allowed), StatusCode::CREATED, top).await?;
            Ok(with_location(page, &format!("/users/{}", made.user.id)))
        }
        Err(e) => Ok(layout::refused(&s, Nav::Users, "Add a user", &e, "/users")),
    }
}

pub(super) async fn revoke(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let act = async {
        let n = positive_id(&id, "user")?;
        Users::of(&service).revoke(allowed, n).await
    };
    let title = format!("User {id}");
    let to = |_: &()| "/users".to_owned();
    layout::button((&req, &s, &body), (Nav::Users, &title), act, to, "/users").await
}

pub(super) async fn audit_page(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    if let Some(attempts) = req.app_data::<web::Data<crate::http::attempts::Attempts>>() {
        attempts.flush().await;
    }
    let q = web::Query::<BTreeMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let field = |k: &str| q.get(k).filter(|v| !v.is_empty()).cloned();
    let filter = AuditFilter {
        actor: field("actor"),
        operation: field("operation"),
        resource: field("resource"),
        ..Default::default()
    };
    let before = field("before_id").and_then(|v| v.parse::<i64>().ok());
    let page = Audit::of(&service)
        .list(allowed, &filter, before, AUDIT_PAGE)
        .await?;
    let (entries, next) = (page.items, page.next_before_id);
    let body = html! {
        form.filter method="get" action="/audit" {
            label for="actor" { "Who" }
            input #actor name="actor" value=(filter.actor.as_deref().unwrap_or(""));
            label for="operation" { "Operation" }
            input #operation name="operation" value=(filter.operation.as_deref().unwrap_or(""));
            label for="resource" { "Id" }
            input #resource name="resource" value=(filter.resource.as_deref().unwrap_or(""));
            button type="submit" { "Filter" }
        }
        @if entries.is_empty() { p { "Nothing recorded." } } @else {
            div.scroll { table #audit {
                caption.sr { "Audit log" }
                thead { tr {
                    th scope="col" { "When" } th scope="col" { "Who" } th scope="col" { "What" }
                    th scope="col" { "Id" } th scope="col" { "Status" } th scope="col" { "From" }
                    th scope="col" { "Change" }
                } }
                tbody { @for e in &entries { tr {
                    td { (utc(e.at)) }
                    td { (e.actor) br; small { (e.role.map_or("no identity", |r| r.as_str())) } }
                    td { (e.operation) br; small { (e.method) " " (e.path) " · " (e.via) } }
                    td { (e.resource.as_deref().unwrap_or("")) }
                    td { (e.status) }
                    td {
                        (e.remote)
                        @if let Some(node) = &e.forwarded_by { br; small { "forwarded by " (node) } }
                    }
                    td { small { (e.summary) } }
                } } }
            } }
        }
        @if let Some(n) = next {
            p { a href={ "/audit?before_id=" (n) } { "Older entries" } }
        }
    };
    Ok(layout::page("Audit log", Nav::Audit, &s, body))
}
