//! Runs: the list, and one run with live progress ("412 of 1000
//! delivered", pace, expected finish, window close) that the page's script
//! refreshes from `/runs/{id}/live` whenever `/v1/events` says the run
//! moved; its groups with their failure reasons and a status filter; and
//! stop, pause, resume and retry. The pages read and act through the
//! service layer (`service::runs`), as the API does.

use super::charts;
use super::layout::{self, action_button, badge, local, utc, Nav};
use super::Signed;
use crate::export::TargetsCsv;
use crate::http::errors::ApiError;
use crate::http::extract::run_id;
use crate::http::forward;
use crate::service::polls::Polls;
use crate::service::runs::{Action, NamedRun, RunView, Runs};
use crate::service::timeline::Timelines;
use crate::service::Allowed;

use crate::service::Service;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Duration, Utc};
use herald_actors::delivery::outcome::delivered_line;
use herald_actors::domain::{Amendment, RunReceipts, RunStatus, TargetStatus, TimeZone};
use herald_actors::ports::RunFilter;
use maud::html;
use serde::Serialize;
use std::collections::BTreeMap;

/// Runs a page lists at once.
const PAGE: u32 = 100;
/// Groups a run's page lists at once; "Next groups" pages on by position.
const TARGETS_PAGE: u32 = 500;
/// Groups whose answers the page shows (the rest: `herald runs poll --csv`).
const POLL_GROUPS: u32 = 50;

pub(super) async fn list(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let q = web::Query::<BTreeMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let status = q
        .get("status")
        .filter(|v| !v.is_empty())
        .map(|v| v.parse::<RunStatus>())
        .transpose()?;
    let filter = RunFilter {
        reminder_id: None,
        account_id: None,
        status,
        before_id: None,
        limit: PAGE,
    };
    let runs = Runs::of(&service).list(allowed, &filter).await?.items;
    let body = html! {
        form.filter method="get" action="/runs" {
            label for="status" { "Status" }
            select #status name="status" {
                option value="" { "any" }
                @for st in RunStatus::ALL {
                    option value=(st) selected[status == Some(*st)] { (st) }
                }
            }
            button type="submit" { "Filter" }
        }
        (runs_table(&runs))
    };
    Ok(layout::page("Runs", Nav::Runs, &s, body))
}

/// Runs by the names people use (the reminder's title, the account's
/// name), ids second.
pub fn runs_table(runs: &[NamedRun]) -> maud::Markup {
    html! {
        @if runs.is_empty() { p { "No runs." } } @else {
            div.scroll { table {
                caption.sr { "Runs" }
                thead { tr {
                    th scope="col" { "Run" } th scope="col" { "Status" } th scope="col" { "Progress" }
                    th scope="col" { "Scheduled for" } th scope="col" { "Account" }
                } }
                tbody { @for NamedRun { run: r, names } in runs { tr {
                    td { a href={ "/runs/" (r.id) } { (names.label(r.id)) } br; small { "reminder " a href={ "/reminders/" (r.reminder_id) } { (r.reminder_id) } } }
                    td { (badge(r.status.as_str())) }
                    td { (delivered_line(&r.counts)) br;
                        progress.row-bar max=(r.counts.total().max(1)) value=(r.counts.sent)
                            aria-label={ (names.label(r.id)) ": " (delivered_line(&r.counts)) } {}
                        @if r.counts.failed > 0 { br; small { (r.counts.failed) " failed" } } }
                    td { (utc(r.scheduled_for)) }
                    td {
                        @let name = names.account_name.as_deref().unwrap_or(r.account_id.as_str());
                        (name)
                        @if name != r.account_id.as_str() { br; small { (r.account_id) } }
                    }
                } } }
            } }
        }
    }
}

/// What the run page shows live, as its script reads it.
#[derive(Serialize)]
struct Live {
    id: i64,
    /// "Monday standup · run 12", as notifications name the run.
    label: String,
    status: RunStatus,
    is_final: bool,
    delivered: String,
    sent: u32,
    failed: u32,
    skipped: u32,
    total: u32,
    /// Groups per minute since it started sending.
    pace: Option<String>,
    expected_finish: Option<String>,
    window_close: Option<String>,
    summary: Option<String>,
    /// Who received and read it, from receipts (they keep coming after
    /// the run ends).
    receipts: String,
    /// Its newest recall or edit and how far it got (empty: none).
    amendment: String,
}

/// "recall: 12 of 40 groups recalled (under way)".
fn amendment_line(a: Option<&Amendment>) -> String {
    a.map_or(String::new(), |a| {
        let state = if a.is_finished() {
            "finished"
        } else {
            "under way"
        };
        format!("{}: {} ({state})", a.kind, a.progress.line(a.kind))
    })
}

/// The run's receipts in a sentence: participants, not devices.
fn receipts_line(r: &RunReceipts) -> String {
    if r.groups_delivered == 0 {
        return "no receipts yet".into();
    }
    format!(
        "reached {} participants in {} groups · read by {} in {} groups",
        r.delivered, r.groups_delivered, r.read, r.groups_read
    )
}

fn live_of(view: &RunView, tz: &TimeZone, now: DateTime<Utc>) -> Live {
    let run = &view.run;
    let c = &run.counts;
    let done = c.sent + c.failed + c.skipped;
    let per_minute = run.started_at.and_then(|t| {
        let secs = (run.finished_at.unwrap_or(now) - t).num_milliseconds() as f64 / 1000.0;
        (secs >= 1.0 && done > 0).then(|| f64::from(done) * 60.0 / secs)
    });
    let left = c.total().saturating_sub(done);
    let expected_finish = match (per_minute, run.status.is_final()) {
        (_, true) => run.finished_at.map(|t| local(t, tz)),
        (Some(p), false) if p > 0.0 => {
            let ms = f64::from(left) / p * 60_000.0;
            Some(local(now + Duration::milliseconds(ms as i64), tz))
        }
        _ => None,
    };
    Live {
        id: run.id.0,
        label: view.names.label(run.id),
        status: run.status,
        is_final: run.status.is_final(),
        delivered: view.delivered.clone(),
        sent: c.sent,
        failed: c.failed,
        skipped: c.skipped,
        total: c.total(),
        pace: per_minute.map(|p| format!("{p:.1} groups per minute")),
        expected_finish,
        window_close: run.window_end_at.map(|t| local(t, tz)),
        summary: run.error_summary.clone(),
        receipts: receipts_line(&view.receipts),
        amendment: amendment_line(view.amendment.as_ref()),
    }
}

/// The run as the API reads it, and its timezone.
async fn run_view(
    service: &Service,
    allowed: Allowed,
    raw: &str,
) -> Result<(RunView, TimeZone), ApiError> {
    // The run's times in its reminder's timezone, as the reminder's page
    // shows them.
    let runs = Runs::of(service);
    let view = runs.get(allowed, run_id(raw)?).await?;
    let tz = runs.zone(allowed, &view.run).await?;
    Ok((view, tz))
}

pub(super) async fn live(
    service: web::Data<Service>,
    _: Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let (view, tz) = run_view(&service, allowed, &path).await?;
    Ok(HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .json(live_of(&view, &tz, Utc::now())))
}

/// Every group of the run with its status and receipts, as a CSV file a
/// spreadsheet opens as is (`crate::export`).
pub(super) async fn groups_csv(
    service: web::Data<Service>,
    _: Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = run_id(&path)?;
    let runs = Runs::of(&service);
    let mut out = TargetsCsv::new();
    let mut after = None;
    loop {
        let page = runs.targets(allowed, id, None, after, TARGETS_PAGE).await?;
        for t in &page.items {
            out.push(&serde_json::to_value(t).expect("a target serialises"));
        }
        match page.next_after {
            Some(a) => after = Some(a),
            None => break,
        }
    }
    Ok(HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"herald-run-{id}-groups.csv\""),
        ))
        .insert_header(("Cache-Control", "no-store"))
        .body(out.finish()))
}

pub(super) async fn detail(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let (view, tz) = run_view(&service, allowed, &path).await?;
    let run = &view.run;
    let q = web::Query::<BTreeMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let filter = q
        .get("status")
        .filter(|v| !v.is_empty())
        .map(|v| v.parse::<TargetStatus>())
        .transpose()?;
    let after = q.get("after").and_then(|v| v.parse::<u32>().ok());
    let targets = Runs::of(&service)
        .targets(allowed, run.id, filter, after, TARGETS_PAGE)
        .await?;

    let timeline = Timelines::of(&service).get(allowed, run.id).await?;
    let answer = Polls::of(&service)
        .get(allowed, run.id, None, None, POLL_GROUPS)
        .await?;
    let l = live_of(&view, &tz, Utc::now());
    let base = format!("/runs/{}", run.id);
    let status_q = filter.map_or(String::new(), |f| format!("status={f}&"));
    let next = targets
        .next_after
        .map(|a| format!("{base}?{status_q}after={a}"));
    let targets = targets.items;
    let body = html! {
        section #run data-run=(run.id) data-final=(l.is_final) aria-labelledby="progress" {
            h2 #progress.sr { "Progress" }
            p.big { span #run-delivered { (l.delivered) } }
            progress #run-bar max=(l.total.max(1)) value=(l.sent) aria-labelledby="run-delivered" {}
            dl.facts {
                dt { "Status" } dd #run-status { (badge(l.status.as_str())) }
                dt { "Failed / skipped" } dd #run-failed { (l.failed) " / " (l.skipped) }
                dt { "Receipts" } dd #run-receipts { (l.receipts) }
                dt { "Pace" } dd #run-pace { (l.pace.clone().unwrap_or("—".into())) }
                dt { "Expected finish" } dd #run-finish { (l.expected_finish.clone().unwrap_or("—".into())) }
                dt { "Window closes" } dd #run-close { (l.window_close.clone().unwrap_or("—".into())) }
                dt { "Reminder" } dd {
                    a href={ "/reminders/" (run.reminder_id) } { (view.names.reminder_title.as_deref().unwrap_or("(deleted)")) }
                    " " small { "#" (run.reminder_id) }
                }
                dt { "Account" } dd {
                    a href={ "/accounts/" (run.account_id) } { (view.names.account_name.as_deref().unwrap_or(run.account_id.as_str())) }
                    " " small { (run.account_id) }
                }
                dt { "Scheduled for" } dd { (local(run.scheduled_for, &tz)) }
                @if let Some(f) = &run.forecast { dt { "Forecast at start" } dd { (f) } }
            }
            p #run-summary { (l.summary.clone().unwrap_or_default()) }
        }
        (super::polls::section(&answer))
        section aria-labelledby="over-time" {
            h2 #over-time { "Over time" }
            (charts::run_charts(&timeline, &tz))
        }
        div.actions #run-actions {
            @match run.status {
                RunStatus::Running | RunStatus::Queued | RunStatus::Scheduled | RunStatus::Parked => {
                    (action_button(&s, &crate::http::runs::PAUSE, &format!("{base}/pause"), "Pause", ""))
                    (action_button(&s, &crate::http::runs::STOP, &format!("{base}/stop"), "Stop", "danger"))
                }
                RunStatus::Paused => {
                    (action_button(&s, &crate::http::runs::RESUME, &format!("{base}/resume"), "Resume", ""))
                    (action_button(&s, &crate::http::runs::STOP, &format!("{base}/stop"), "Stop", "danger"))
                }
                RunStatus::Partial | RunStatus::Failed | RunStatus::Cancelled => {
                    (action_button(&s, &crate::http::runs::RETRY, &format!("{base}/retry"), "Retry unsent groups", ""))
                }
                _ => {}
            }
            @if run.counts.sent > 0 && layout::allows(&s, &crate::http::amend::RECALL) {
                a.button.danger #recall href={ (base) "/recall" } { "Recall…" }
            }
        }
        // Refreshed by the page's script, as recalls and edits go on.
        p #run-amendment { (l.amendment) }
        section aria-labelledby="groups" {
            h2 #groups { "Groups" }
            form.filter method="get" action=(base) {
                label for="status" { "Show" }
                select #status name="status" {
                    option value="" { "all" }
                    @for st in TargetStatus::ALL {
                        option value=(st) selected[filter == Some(*st)] { (st) }
                    }
                }
                button type="submit" { "Filter" }
            }
            p { a #groups-csv href={ (base) "/groups.csv" } download { "Download every group as CSV" } }
            div.scroll { table #targets {
                thead { tr { th scope="col" { "#" } th scope="col" { "Group" } th scope="col" { "Status" } th scope="col" { "Reason" } th scope="col" { "Sent at" } th scope="col" { "Reached" } th scope="col" { "Read" } } }
                tbody { @for t in &targets { tr {
                    @let n = &t.target;
                    td { (n.position) }
                    td {
                        @if let Some(name) = &t.group_name { (name) br; }
                        code { (n.group) } br; small { (n.chosen_by) }
                    }
                    td { (badge(n.status.as_str())) }
                    td { (n.error.clone().unwrap_or_default()) }
                    td { (n.sent_at.map(|at| local(at, &tz)).unwrap_or_default()) }
                    td.num { (n.receipts.delivered) }
                    td.num { (n.receipts.read) }
                } } }
            } }
            nav.pager aria-label="Groups pages" {
                @if after.is_some() { a href={ (base) "?" (status_q) } { "← First groups" } " " }
                @if let Some(next) = &next { a #next-groups href=(next) { "Next groups →" } }
            }
        }
    };
    Ok(layout::page(&view.names.label(run.id), Nav::Runs, &s, body))
}

/// Asks before a recall: how many groups, until when, and that it cannot
/// be undone; the button posts to the action below.
/// What a recall would do, asked before it is done: the page's proof is
/// the recall's own (an operator's), which opens the run's read.
pub(super) async fn recall_page(
    service: web::Data<Service>,
    Signed(s): Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let (view, tz) = run_view(&service, allowed, &path).await?;
    let run = view.run;
    let base = format!("/runs/{}", run.id);
    let window = service.recall_window_secs() as i64;
    let deadline = run.finished_at.map(|f| f + Duration::seconds(window));
    let groups = run.counts.sent;
    let body = html! {
        section #recall aria-labelledby="recall-title" {
            h2 #recall-title { "Recall run " (run.id) "?" }
            p {
                "Every message of this run is deleted for everyone in the "
                strong #recall-groups { (groups) } " "
                (if groups == 1 { "group" } else { "groups" })
                " it was delivered to (and any whose delivery was not confirmed), one group at a \
                 time at the account's rate. Members see \"This message was deleted\". It cannot be undone."
            }
            @if let Some(d) = deadline {
                p { "WhatsApp allows it until " (local(d, &tz)) "; groups past that are reported too old." }
            }
            @if !run.status.is_final() {
                p { "The run is still " (run.status) ": it is stopped first." }
            }
            form.inline method="post" action={ (base) "/recall" } {
                (layout::csrf(&s))
                button type="submit" class="danger" { "Recall from " (groups) " groups" }
            }
            " "
            a href=(base) { "Cancel" }
        }
    };
    Ok(layout::page(
        &format!("Recall run {}", run.id),
        Nav::Runs,
        &s,
        body,
    ))
}

macro_rules! run_buttons {
    ($($name:ident => |$runs:ident, $allowed:ident, $run:ident| $act:expr),+ $(,)?) => {$(
        pub(super) async fn $name(
            service: web::Data<Service>,
            req: HttpRequest,
            Signed(s): Signed,
            path: web::Path<String>,
            body: web::Bytes,
            $allowed: Allowed,
        ) -> Result<HttpResponse, ApiError> {
            let $runs = Runs::of(&service);
            // Here, or on the daemon that holds the account.
            let act = async {
                let $run = run_id(&path)?;
                forward::settle(&req, &service, $act.await?).await
            };
            let (to, title) = (format!("/runs/{}", path), format!("Run {}", path));
            layout::button((&req, &s, &body), (Nav::Runs, &title), act, |_| to.clone(), &to).await
        }
    )+};
}

run_buttons!(
    stop => |runs, allowed, run| runs.control(allowed, run, Action::Stop, false),
    pause => |runs, allowed, run| runs.control(allowed, run, Action::Pause, false),
    resume => |runs, allowed, run| runs.control(allowed, run, Action::Resume, false),
    retry => |runs, allowed, run| runs.control(allowed, run, Action::Retry, false),
    recall => |runs, allowed, run| runs.recall(allowed, run, false),
);
