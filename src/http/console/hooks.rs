//! Webhooks, for admins: the subscriptions with their state (one Herald
//! disabled says why, as an account's page does), add one (its secret
//! shown once), and each one's recent deliveries with ping, enable,
//! disable and delete.

use super::layout::{self, action_button, badge, csrf, utc, Nav};
use super::{post_form, with_location, Signed};
use crate::http::errors::ApiError;
use crate::http::extract::positive_id;
use crate::http::webhooks::{self as v1, CreateWebhook};
use crate::service::webhooks::{WebhookView, Webhooks};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::{webhook_type_names, WebhookPatch};
use maud::{html, Markup};

/// Deliveries a subscription's page shows, newest first.
const RECENT: u32 = 50;

fn disabled_notice(w: &WebhookView) -> Markup {
    html! {
        @if let Some(reason) = &w.disabled_reason {
            p.problem role="alert" { "Webhook " (w.id) " is off: " (reason) }
        }
    }
}

async fn list_page(
    service: &Service,
    (s, allowed): (&super::Session, Allowed),
    status: StatusCode,
    top: Markup,
) -> Result<HttpResponse, ApiError> {
    let all = Webhooks::of(service).list(allowed).await?.items;
    let body = html! {
        (top)
        @for w in &all { (disabled_notice(w)) }
        @if all.is_empty() { p { "No webhooks yet." } } @else {
            div.scroll { table #webhooks {
                caption.sr { "Webhooks" }
                thead { tr {
                    th scope="col" { "Webhook" } th scope="col" { "URL" } th scope="col" { "Types" }
                    th scope="col" { "State" }
                } }
                tbody { @for w in &all { tr {
                    td { a href={ "/webhooks/" (w.id) } { "Webhook " (w.id) } br; small { (w.description) } }
                    td { code { (w.url) } }
                    td { (w.types.join(", ")) }
                    td { (badge(if w.enabled { "enabled" } else { "disabled" })) }
                } } }
            } }
        }
        h2 { "Add a webhook" }
        form.stack #new-webhook method="post" action="/webhooks" {
            (csrf(s))
            label for="hook-url" { "URL (http or https)" }
            input #hook-url name="url" required type="url";
            fieldset {
                legend { "Events" }
                @for t in webhook_type_names() {
                    label { input type="checkbox" name="types" value=(t) checked[*t == "run.finished"]; " " (t) }
                }
            }
            label for="hook-description" { "Description" }
            input #hook-description name="description" maxlength="200";
            button type="submit" { "Add webhook" }
        }
    };
    Ok(layout::page_with(
        status,
        "Webhooks",
        Nav::Webhooks,
        s,
        body,
    ))
}

pub(super) async fn list(
    service: web::Data<Service>,
    Signed(s): Signed,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    list_page(&service, (&s, allowed), StatusCode::OK, html! {}).await
}

pub(super) async fn create(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let form = post_form(&req, &s, &body).await?;
    let types = form.all("types").into_iter().map(str::to_owned).collect();
    let new = CreateWebhook::from_form(form.text("url"), types, form.text("description"));
    let made = Webhooks::of(&service)
        .create(allowed, new.subscription())
        .await
        .map(v1::with_secret);
    match made {
        Ok(made) => {
            let top = html! {
                div.token-shown #new-secret role="status" {
                    p { "Webhook " (made.webhook.id) " added. Its signing secret, shown only this once:" }
                    p { code #secret-value { (made.secret) } }
                }
            };
            // The create proof opens the list's read (no higher role).
            let page = list_page(&service, (&s, allowed), StatusCode::CREATED, top).await?;
            Ok(with_location(
                page,
                &format!("/webhooks/{}", made.webhook.id),
            ))
        }
        Err(e) => Ok(layout::refused(
            &s,
            Nav::Webhooks,
            "Add a webhook",
            &e,
            "/webhooks",
        )),
    }
}

pub(super) async fn detail(
    service: web::Data<Service>,
    Signed(s): Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "webhook")?;
    let (w, deliveries) = Webhooks::of(&service)
        .with_recent(allowed, id, RECENT)
        .await?;
    let base = format!("/webhooks/{id}");
    let body = html! {
        (disabled_notice(&w))
        p { code { (w.url) } " · " (w.types.join(", ")) " · " (badge(if w.enabled { "enabled" } else { "disabled" })) }
        div.actions {
            (action_button(&s, &crate::http::webhooks::PING, &format!("{base}/ping"), "Send a test event", "quiet"))
            @if w.enabled {
                (action_button(&s, &crate::http::webhooks::PATCH, &format!("{base}/disable"), "Disable", "quiet"))
            } @else {
                (action_button(&s, &crate::http::webhooks::PATCH, &format!("{base}/enable"), "Enable", ""))
            }
            (action_button(&s, &crate::http::webhooks::DELETE, &format!("{base}/delete"), "Delete", "danger"))
        }
        h2 { "Recent deliveries" }
        @if deliveries.is_empty() { p { "None yet." } } @else {
            div.scroll { table #deliveries {
                caption.sr { "Deliveries" }
                thead { tr {
                    th scope="col" { "Delivery" } th scope="col" { "Type" } th scope="col" { "Status" }
                    th scope="col" { "Attempts" } th scope="col" { "Last answer" } th scope="col" { "Next attempt" }
                } }
                tbody { @for d in &deliveries { tr {
                    td { (d.id) }
                    td { (d.event_type) }
                    td { (badge(d.status.as_str())) }
                    td { (d.attempts) }
                    td { @if let Some(st) = d.last_status { (st) " " } small { (d.last_error.as_deref().unwrap_or("")) } }
                    td { @if d.status.as_str() == "pending" { (utc(d.next_attempt_at)) } }
                } } }
            } }
        }
    };
    Ok(layout::page(
        &format!("Webhook {id}"),
        Nav::Webhooks,
        &s,
        body,
    ))
}

pub(super) async fn ping(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let act = async {
        let n = positive_id(&id, "webhook")?;
        Webhooks::of(&service).ping(allowed, n).await
    };
    let (to, title) = (format!("/webhooks/{id}"), format!("Webhook {id}"));
    layout::button(
        (&req, &s, &body),
        (Nav::Webhooks, &title),
        act,
        |_| to,
        "/webhooks",
    )
    .await
}

async fn set_enabled(
    service: &Service,
    (req, s, id, body): (&HttpRequest, &super::Session, String, &web::Bytes),
    allowed: Allowed,
    on: bool,
) -> Result<HttpResponse, ApiError> {
    post_form(req, s, body).await?;
    let n = positive_id(&id, "webhook")?;
    let patch = WebhookPatch {
        enabled: Some(on),
        ..Default::default()
    };
    // A button on the page: no version to hold it to.
    let done = Webhooks::of(service)
        .patch(allowed, n, |_| Ok(()), patch)
        .await;
    let to = format!("/webhooks/{id}");
    Ok(layout::after(
        s,
        (Nav::Webhooks, &format!("Webhook {id}")),
        done,
        &to,
        "/webhooks",
    ))
}

pub(super) async fn enable(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    set_enabled(
        &service,
        (&req, &s, path.into_inner(), &body),
        allowed,
        true,
    )
    .await
}

pub(super) async fn disable(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    set_enabled(
        &service,
        (&req, &s, path.into_inner(), &body),
        allowed,
        false,
    )
    .await
}

pub(super) async fn delete(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let act = async {
        let n = positive_id(&id, "webhook")?;
        Webhooks::of(&service).delete(allowed, n).await
    };
    let title = format!("Webhook {id}");
    let to = |_: &()| "/webhooks".to_owned();
    layout::button(
        (&req, &s, &body),
        (Nav::Webhooks, &title),
        act,
        to,
        "/webhooks",
    )
    .await
}
