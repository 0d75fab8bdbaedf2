//! The page shell every console page shares, the sign-in page, the
//! compiled-in assets, and small formatting helpers.

use super::Session;
use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;
use chrono::{DateTime, Utc};
use herald_actors::domain::TimeZone;
use maud::{html, Markup, DOCTYPE};

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// Which section a page belongs to, for the navigation's current mark.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Accounts,
    Reminders,
    Runs,
    Users,
    Audit,
    Webhooks,
}

/// An HTML answer with the headers every console page carries: no
/// caching (pages show live state), no framing (a framed form could be
/// clicked through by another site), scripts only from this port.
pub fn html(status: StatusCode, page: Markup) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header(("X-Frame-Options", "DENY"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("Referrer-Policy", "same-origin"))
        .insert_header((
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data: blob:; frame-ancestors 'none'; form-action 'self'",
        ))
        .body(page.into_string())
}

pub fn page(title: &str, nav: Nav, s: &Session, body: Markup) -> HttpResponse {
    page_with(StatusCode::OK, title, nav, s, body)
}

pub fn page_with(
    status: StatusCode,
    title: &str,
    nav: Nav,
    s: &Session,
    body: Markup,
) -> HttpResponse {
    let link = |to: &str, name: &str, which: Nav| {
        html! {
            @if nav == which {
                a href=(to) aria-current="page" { (name) }
            } @else {
                a href=(to) { (name) }
            }
        }
    };
    html(
        status,
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · Herald" }
                    link rel="stylesheet" href="/assets/console.css";
                    script src="/assets/console.js" defer {}
                }
                body {
                    a.skip href="#main" { "Skip to content" }
                    header.top {
                        span.brand { "Herald" }
                        nav aria-label="Sections" {
                            (link("/", "Overview", Nav::Overview))
                            (link("/accounts", "Accounts", Nav::Accounts))
                            (link("/reminders", "Reminders", Nav::Reminders))
                            (link("/runs", "Runs", Nav::Runs))
                            @if s.user.role == herald_actors::domain::Role::Admin {
                                (link("/users", "Users", Nav::Users))
                                (link("/audit", "Audit", Nav::Audit))
                                (link("/webhooks", "Webhooks", Nav::Webhooks))
                            }
                        }
                        span.who #who { (s.user.name) " · " (s.user.role) }
                        form.signout method="post" action="/sign-out" {
                            (csrf(s))
                            button type="submit" { "Sign out" }
                        }
                    }
                    main #main tabindex="-1" {
                        h1 { (title) }
                        (body)
                    }
                    // Run ends and other news, read out by screen readers.
                    div #notices role="status" aria-live="polite" {}
                }
            }
        },
    )
}

/// The signed-in user's role allows operation `op`: only to leave out
/// what they could not use; every request is checked on its own route.
pub fn allows(s: &Session, op: &crate::http::spec::Op) -> bool {
    op.role.is_none_or(|needed| s.user.role.allows(needed))
}

/// The hidden CSRF field every form carries.
pub fn csrf(s: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(s.csrf); }
}

/// A one-button form that POSTs to `action`, which performs `op`; nothing
/// when the signed-in user's role may not (its route would refuse it).
pub fn action_button(
    s: &Session,
    op: &crate::http::spec::Op,
    action: &str,
    label: &str,
    class: &str,
) -> Markup {
    if !allows(s, op) {
        return html! {};
    }
    html! {
        form.inline method="post" action=(action) {
            (csrf(s))
            button type="submit" class=(class) { (label) }
        }
    }
}

pub fn sign_in(error: Option<&str>, status: StatusCode) -> HttpResponse {
    html(
        status,
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { "Sign in · Herald" }
                    link rel="stylesheet" href="/assets/console.css";
                }
                body.signin {
                    main #main {
                        h1 { "Herald" }
                        form method="post" action="/sign-in" {
                            label for="token" { "Control token" }
                            p.hint #token-hint {
                                "The daemon's token, from " code { "control.token" }
                                " in its data directory (" code { "cat data/control.token" } " on the defaults)."
                            }
                            input #token type="password" name="token" autocomplete="current-password"
                                required autofocus aria-describedby="token-hint"
                                aria-invalid=[error.map(|_| "true")];
                            @if let Some(e) = error {
                                p.error role="alert" { (e) }
                            }
                            button type="submit" { "Sign in" }
                        }
                    }
                }
            }
        },
    )
}

pub async fn css() -> HttpResponse {
    asset("text/css; charset=utf-8", CSS)
}

pub async fn js() -> HttpResponse {
    asset("text/javascript; charset=utf-8", JS)
}

fn asset(mime: &str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(mime)
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .body(body)
}

/// An instant in a timezone, to the minute, with the zone's abbreviation.
pub fn local(at: DateTime<Utc>, tz: &TimeZone) -> String {
    at.with_timezone(&tz.tz())
        .format("%a %Y-%m-%d %H:%M %Z")
        .to_string()
}

pub fn utc(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A state or status as a labelled badge (the text says it; colour only helps).
pub fn badge(state: &str) -> Markup {
    html! { span class={ "badge " (state) } { (state.replace('_', " ")) } }
}

/// A problem from the API, shown at the top of a page.
pub fn problem(e: &crate::http::errors::ApiError) -> Markup {
    html! {
        div.problem role="alert" {
            strong { (e.kind.title()) } ": " (e.detail)
        }
    }
}

/// A refused action: the API's problem, with its status, and a way back.
pub fn refused(
    s: &Session,
    nav: Nav,
    title: &str,
    e: &crate::http::errors::ApiError,
    back: &str,
) -> HttpResponse {
    page_with(
        e.status(),
        title,
        nav,
        s,
        html! {
            (problem(e))
            p { a href=(back) { "Back" } }
        },
    )
}

/// Where a console action leads: to `to` once done, else the page that
/// says why it was refused, with a link back to `back`.
pub fn after<T>(
    s: &Session,
    (nav, title): (Nav, &str),
    done: Result<T, crate::http::errors::ApiError>,
    to: &str,
    back: &str,
) -> HttpResponse {
    match done {
        Ok(_) => super::see_other(to),
        Err(e) => refused(s, nav, title, &e, back),
    }
}

/// A console button: the form checked (CSRF, same origin), then `act`; to
/// `to` of its result once done, else the page that says why, with a link
/// back to `back`.
pub async fn button<T>(
    (req, s, body): (&actix_web::HttpRequest, &Session, &actix_web::web::Bytes),
    (nav, title): (Nav, &str),
    act: impl std::future::Future<Output = Result<T, crate::http::errors::ApiError>>,
    to: impl FnOnce(&T) -> String,
    back: &str,
) -> Result<HttpResponse, crate::http::errors::ApiError> {
    super::post_form(req, s, body).await?;
    let done = act.await;
    let to = done.as_ref().map_or_else(|_| back.to_owned(), to);
    Ok(after(s, (nav, title), done, &to, back))
}
