//! Accounts: state and reason, limits, today's sends against the caps,
//! enable/disable, limit changes, and pairing by QR code.

use super::layout::{self, action_button, badge, csrf, Nav};
use super::{post_form, see_other, Signed};
use crate::http::accounts as v1;
use crate::http::errors::ApiError;
use crate::http::extract::{account_id, parse_json};
use crate::http::forward;
use crate::http::pairing as v1_pairing;
use crate::service::accounts::Accounts;
use crate::service::groups::Groups;
use crate::service::history::Histories;
use crate::service::pairing::Pairing;
use crate::service::Allowed;
use crate::service::Service;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::{Account, GatewayKind, GroupFilter, Reading, Standing};
use maud::{html, Markup};
use serde_json::{json, Value};

fn cap(v: Option<u32>) -> String {
    v.map_or("none".into(), |n| n.to_string())
}

/// "120 of 500" against a daily cap, "120 (no daily cap)" without one.
/// What WhatsApp last said of the account, as facts: its reach-out
/// time-lock and its new-chat quota, each with when it was read.
fn standing_facts(s: &Standing) -> Markup {
    let now = chrono::Utc::now();
    let when = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map_or(String::new(), |t| {
            format!(" (read {})", t.format("%Y-%m-%d %H:%M UTC"))
        })
    };
    let lock = match &s.timelock {
        Reading::Never => "not read yet".to_owned(),
        Reading::Unknown { why, .. } => format!("unknown: {why}"),
        Reading::Known { value, .. } if value.holds_at(now) => match value.until {
            Some(u) => format!(
                "time-locked until {}; a 463 pauses the account until then",
                u.format("%Y-%m-%d %H:%M UTC")
            ),
            None => "time-locked, with no end given".to_owned(),
        },
        Reading::Known { .. } => "none".to_owned(),
    };
    let quota = match &s.quota {
        Reading::Never => "not read yet".to_owned(),
        Reading::Unknown { why, .. } => format!("unknown: {why}"),
        Reading::Known { value: q, .. } => {
            let mut t = q.status.as_str().replace('_', " ");
            if let (Some(u), Some(total)) = (q.used, q.total) {
                t.push_str(&format!(", {u} of {total} used"));
            }
            if let Some(end) = q.cycle_end {
                t.push_str(&format!(
                    ", cycle ends {}",
                    end.format("%Y-%m-%d %H:%M UTC")
                ));
            }
            t
        }
    };
    html! {
        dt { "Reach-out time-lock" }
        dd #standing-timelock { (lock) (when(s.timelock.read_at())) }
        dt { "New-chat quota" }
        dd #standing-quota { (quota) (when(s.quota.read_at())) }
    }
}

fn against_cap(today: u64, daily_cap: Option<u32>) -> String {
    match daily_cap {
        Some(c) => format!("{today} of {c}"),
        None => format!("{today} (no daily cap)"),
    }
}

pub(super) async fn list(
    service: web::Data<Service>,
    Signed(s): Signed,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let each = Accounts::of(&service);
    let accounts = each.all(allowed).await?;
    let mut rows = Vec::new();
    for v in &accounts {
        rows.push((v, each.sent_today(allowed, &v.account).await?));
    }
    let body = html! {
        @if accounts.is_empty() {
            p { "No accounts yet: add one below." }
        } @else {
            div.scroll {
                table {
                    caption.sr { "Accounts" }
                    thead { tr {
                        th scope="col" { "Account" } th scope="col" { "State" }
                        th scope="col" { "Rate" } th scope="col" { "Sent today" }
                        th scope="col" { "Actions" }
                    } }
                    tbody {
                        @for (v, today) in &rows {
                            @let a = &v.account;
                            tr {
                                td { a href={ "/accounts/" (a.id) } { (a.id) } br; small { (a.name) " · " (a.kind) } }
                                td { (badge(a.state.as_str())) @if let Some(r) = &a.state_reason { br; small { (r) } } }
                                td { (v.effective_limits.max_per_minute) "/min" }
                                td { (against_cap(*today, a.limits.daily_cap)) }
                                td { (state_buttons(&s, a)) }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="new-account" {
            h2 #new-account { "Add an account" }
            form.grid method="post" action="/accounts" {
                (csrf(&s))
                label for="acc-id" { "Id" }
                input #acc-id name="id" required placeholder="sales-1" aria-describedby="acc-id-hint";
                small #acc-id-hint { "Letters, digits, - and _; it names the account in the API." }
                label for="acc-name" { "Name" }
                input #acc-name name="name";
                label for="acc-kind" { "Kind" }
                select #acc-kind name="kind" {
                    option value="simulator" { "simulator (sends nowhere)" }
                    option value="whatsapp" { "whatsapp (pair by QR)" }
                }
                button type="submit" { "Add account" }
            }
        }
    };
    Ok(layout::page("Accounts", Nav::Accounts, &s, body))
}

fn state_buttons(s: &super::Session, a: &Account) -> Markup {
    use herald_actors::domain::AccountState::*;
    html! {
        @if a.state == Disabled || matches!(a.state, LoggedOut | Banned | CoolingDown | Disconnected) {
            (action_button(s, &crate::http::accounts::ENABLE, &format!("/accounts/{}/enable", a.id), "Enable", ""))
        }
        @if a.state != Disabled {
            (action_button(s, &crate::http::accounts::DISABLE, &format!("/accounts/{}/disable", a.id), "Disable", "quiet"))
        }
        @if a.kind == GatewayKind::Whatsapp {
            a.button href={ "/accounts/" (a.id) "/pair" } { "Pair" }
        }
    }
}

pub(super) async fn create(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let form = post_form(&req, &s, &body).await?;
    let mut v = json!({"id": form.text("id"), "kind": form.text("kind")});
    if !form.text("name").is_empty() {
        v["name"] = form.text("name").into();
    }
    let made = match parse_json::<v1::CreateAccount>(v.to_string().as_bytes()) {
        Ok(b) => match b.parse() {
            Ok(new) => Accounts::of(&service).create(allowed, new).await,
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(e),
    };
    match made {
        Ok(a) => Ok(see_other(&format!("/accounts/{}", a.account.id))),
        Err(e) => Ok(layout::refused(
            &s,
            Nav::Accounts,
            "Accounts",
            &e,
            "/accounts",
        )),
    }
}

pub(super) async fn detail(
    service: web::Data<Service>,
    Signed(s): Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let accounts = Accounts::of(&service);
    let view = accounts.row(allowed, &account_id(&path)?).await?;
    let (a, limits) = (view.account, view.effective_limits);
    let today = accounts.sent_today(allowed, &a).await?;
    let history = Histories::of(&service).get(allowed, &a.id).await?;
    let filter = GroupFilter {
        limit: 500,
        ..GroupFilter::all_of(a.id.clone())
    };
    let groups = Groups::of(&service).list(allowed, &filter).await?;
    let num = |v: Option<u32>| v.map(|n| n.to_string()).unwrap_or_default();
    let body = html! {
        p { (badge(a.state.as_str())) @if let Some(r) = &a.state_reason { " " (r) } }
        dl.facts {
            dt { "Kind" } dd { (a.kind) }
            dt { "Name" } dd { (a.name) }
            dt { "Rate" } dd { (limits.max_per_minute) " per minute, "
                (limits.group_concurrency) " groups at once" }
            dt { "Sent today" } dd #sent-today { (against_cap(today, a.limits.daily_cap)) }
            dt { "Hourly cap" } dd { (cap(a.limits.hourly_cap)) }
            (standing_facts(&a.standing))
        }
        div.actions { (state_buttons(&s, &a)) }
        section aria-labelledby="days" {
            h2 #days { "Last 30 days" }
            (super::charts::account_chart(&history))
        }
        section aria-labelledby="limits" {
            h2 #limits { "Limits" }
            p.hint { "Leave a box empty to use the daemon's setting." }
            form.grid method="post" action={ "/accounts/" (a.id) "/limits" } {
                (csrf(&s))
                label for="max_per_minute" { "Messages per minute" }
                input #max_per_minute name="max_per_minute" inputmode="numeric" value=(num(a.limits.max_per_minute));
                label for="group_concurrency" { "Groups at once" }
                input #group_concurrency name="group_concurrency" inputmode="numeric" value=(num(a.limits.group_concurrency));
                label for="daily_cap" { "Daily cap" }
                input #daily_cap name="daily_cap" inputmode="numeric" value=(num(a.limits.daily_cap));
                label for="hourly_cap" { "Hourly cap" }
                input #hourly_cap name="hourly_cap" inputmode="numeric" value=(num(a.limits.hourly_cap));
                button type="submit" { "Save limits" }
            }
        }
        section aria-labelledby="groups" {
            h2 #groups { "Groups (" (groups.total) ")" }
            div.scroll { table {
                thead { tr { th scope="col" { "Group" } th scope="col" { "Members" } th scope="col" { "Labels" } th scope="col" { "May post" } } }
                tbody { @for g in &groups.items { tr {
                    td { (g.info.subject) br; small { (g.info.jid) } }
                    td { (g.info.participants) }
                    td { @for l in &g.labels { span.tag { (l) } " " } }
                    td { @if g.can_post { "yes" } @else { "no" } }
                } } }
            } }
        }
    };
    Ok(layout::page(
        &format!("Account {}", a.id),
        Nav::Accounts,
        &s,
        body,
    ))
}

/// The account's limits through the API's PATCH: an empty box clears the
/// override (`null`), anything else goes as the API would get it.
pub(super) async fn limits(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let form = post_form(&req, &s, &body).await?;
    let mut patch = serde_json::Map::new();
    for name in [
        "max_per_minute",
        "group_concurrency",
        "daily_cap",
        "hourly_cap",
    ] {
        let raw = form.text(name);
        let v = if raw.is_empty() {
            Value::Null
        } else {
            raw.parse::<i64>().map_or(Value::from(raw), Value::from)
        };
        patch.insert(name.into(), v);
    }
    let id = path.into_inner();
    let change = parse_json::<v1::PatchAccount>(Value::Object(patch).to_string().as_bytes());
    let result = match (change, account_id(&id)) {
        // The form is the version on the page: no version to hold it to.
        (Ok(b), Ok(account)) => {
            let accounts = Accounts::of(&service);
            let no_version = |_: &str| Ok(());
            accounts
                .patch(allowed, &account, no_version, |l| b.apply(l))
                .await
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    done(&s, result, &id)
}

fn done<T>(s: &super::Session, r: Result<T, ApiError>, id: &str) -> Result<HttpResponse, ApiError> {
    let back = format!("/accounts/{id}");
    Ok(match r {
        Ok(_) => see_other(&back),
        Err(e) => layout::refused(s, Nav::Accounts, &format!("Account {id}"), &e, &back),
    })
}

pub(super) async fn pair_page(
    service: web::Data<Service>,
    Signed(s): Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let a = Accounts::of(&service)
        .row(allowed, &account_id(&path)?)
        .await?
        .account;
    let body = html! {
        p { (badge(a.state.as_str())) }
        @if a.kind != GatewayKind::Whatsapp {
            p { "A " (a.kind) " account is not paired." }
        } @else {
            p { "Open WhatsApp on the phone, Linked devices, Link a device, and scan the code. "
                "WhatsApp replaces the code every 20 seconds or so; this page follows it." }
            (action_button(&s, &v1_pairing::START, &format!("/accounts/{}/pair", a.id), "Start pairing", ""))
            p { "Or pair by phone number: WhatsApp shows \"Link with phone number instead\" under "
                "the QR on the phone; type the code this page shows there." }
            form #pair-by-phone method="post" action={ "/accounts/" (a.id) "/pair" } {
                (csrf(&s))
                label for="phone" { "Phone number, country code first (digits only)" }
                input #phone type="tel" name="phone" inputmode="numeric" placeholder="60123456789" required;
                button type="submit" { "Get a pair code" }
            }
            div #pairing data-account=(a.id) {
                p #pair-state aria-live="polite" { "Checking…" }
                p #pair-code.big hidden {}
                img #pair-qr alt="QR code to scan with WhatsApp" hidden width="264" height="264";
            }
        }
        p { a href={ "/accounts/" (a.id) } { "Back to the account" } }
    };
    Ok(layout::page(
        &format!("Pair {}", a.id),
        Nav::Accounts,
        &s,
        body,
    ))
}

pub(super) async fn pair_start(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let form = post_form(&req, &s, &body).await?;
    let id = path.into_inner();
    let phone = form.get("phone").map(str::to_owned);
    let r = async {
        let account = account_id(&id)?;
        let done = Pairing::of(&service)
            .start(allowed, &account, phone.as_deref(), false)
            .await?;
        forward::settle(&req, &service, done).await
    };
    Ok(match r.await {
        Ok(_) => see_other(&format!("/accounts/{id}/pair")),
        Err(e) => layout::refused(
            &s,
            Nav::Accounts,
            &format!("Pair {id}"),
            &e,
            &format!("/accounts/{id}/pair"),
        ),
    })
}

/// The pairing's state, for the page's script (session, GET only).
pub(super) async fn pair_state(
    service: web::Data<Service>,
    req: HttpRequest,
    _: Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    let done = Pairing::of(&service).state(allowed, &id, false).await?;
    forward::answer_with(&req, &service, done, v1_pairing::state_answer).await
}

pub(super) async fn pair_qr(
    service: web::Data<Service>,
    req: HttpRequest,
    _: Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    let done = Pairing::of(&service).qr_png(allowed, &id, false).await?;
    forward::answer_with(&req, &service, done, v1_pairing::qr_answer).await
}

macro_rules! account_buttons {
    ($($name:ident),+ $(,)?) => {$(
        /// The account's button: the form checked, then the operation.
        pub(super) async fn $name(
            service: web::Data<Service>,
            req: HttpRequest,
            Signed(s): Signed,
            path: web::Path<String>,
            body: web::Bytes,
            allowed: Allowed,
        ) -> Result<HttpResponse, ApiError> {
            let id = path.into_inner();
            let act = async {
                let account = account_id(&id)?;
                Accounts::of(&service).$name(allowed, &account).await
            };
            let (to, title) = (format!("/accounts/{id}"), format!("Account {id}"));
            layout::button((&req, &s, &body), (Nav::Accounts, &title), act, |_| to.clone(), &to).await
        }
    )+};
}

account_buttons!(enable, disable);
