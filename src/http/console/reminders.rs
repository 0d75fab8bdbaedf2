//! Reminders: the list with each next fire time in the reminder's own
//! timezone; one reminder with its next fire times, forecast and runs;
//! the create and edit form, which builds the API's request and hands it
//! to the `/v1` handlers, so the API's rules (and only they) decide.

use super::layout::{self, action_button, badge, csrf, local, Nav};
use super::Session;
use super::{post_form, see_other, Form, Signed};
use crate::http::errors::{ApiError, Kind};
use crate::http::etag;
use crate::http::extract::{numeric_id, parse_json};
use crate::http::media;
use crate::service::accounts::Accounts;
use crate::service::groups::Groups;
use crate::service::media::Media;
use crate::service::reminders::{ForecastView, From, Reminders, NEXT_FIRES};
use crate::service::runs::Runs;
use crate::service::Allowed;
use crate::service::Service;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{Duration, SubsecRound, Utc};
use herald_actors::domain::{
    dst_note, Account, GroupFilter, NewReminder, Reminder, ReminderRequest, ReminderState, TimeZone,
};
use herald_actors::ports::{ReminderFilter, RunFilter};
use herald_actors::scheduling::preflight::Preflight;
use herald_actors::scheduling::scheduler::next_due;
use maud::{html, Markup};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// A schedule in words.
fn schedule_text(r: &Reminder) -> String {
    let v = serde_json::to_value(&r.spec.schedule).unwrap_or(Value::Null);
    match (v.get("at"), v.get("cron")) {
        (Some(at), _) => format!("once, {}", at.as_str().unwrap_or("")),
        (_, Some(c)) => format!("cron {}", c.as_str().unwrap_or("")),
        _ => String::new(),
    }
}

/// When it fires next, in its timezone (`—` when it will not).
fn next_fire(r: &Reminder) -> String {
    if r.state != ReminderState::Active {
        return "—".into();
    }
    let s = &r.spec;
    match next_due(&s.schedule, &s.timezone, &s.window, Utc::now()) {
        Some(d) => local(d.effective, &s.timezone),
        None => "—".into(),
    }
}

pub(super) async fn list(
    service: web::Data<Service>,
    Signed(s): Signed,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let mut all = Reminders::of(&service)
        .all(allowed, &ReminderFilter::default())
        .await?;
    all.sort_by_key(|r| std::cmp::Reverse(r.id));
    let body = html! {
        @if layout::allows(&s, &crate::http::reminders::CREATE) {
            p { a.button href="/reminders/new" { "New reminder" } }
        }
        @if all.is_empty() {
            p { "No reminders yet." }
        } @else {
            div.scroll { table {
                caption.sr { "Reminders" }
                thead { tr {
                    th scope="col" { "Reminder" } th scope="col" { "State" }
                    th scope="col" { "Schedule" } th scope="col" { "Next fire (its timezone)" }
                    th scope="col" { "Groups" } th scope="col" { "Actions" }
                } }
                tbody { @for r in &all { tr {
                    td { a href={ "/reminders/" (r.id) } { (r.spec.title) } br; small { "#" (r.id) " · " (r.spec.account_id) } }
                    td { (badge(r.state.as_str())) }
                    td { (schedule_text(r)) br; small { (r.spec.timezone) } }
                    td { (next_fire(r)) }
                    td { (r.spec.targets.len()) @if r.spec.select.is_some() { " + picked" } }
                    td { (state_buttons(&s, r)) }
                } } }
            } }
        }
    };
    Ok(layout::page("Reminders", Nav::Reminders, &s, body))
}

fn state_buttons(s: &Session, r: &Reminder) -> Markup {
    let base = format!("/reminders/{}", r.id);
    html! {
        @match r.state {
            ReminderState::Active => {
                (action_button(s, &crate::http::reminders::FIRE, &format!("{base}/fire"), "Fire now", ""))
                (action_button(s, &crate::http::reminders::PAUSE, &format!("{base}/pause"), "Pause", "quiet"))
            }
            ReminderState::Paused => {
                (action_button(s, &crate::http::reminders::RESUME, &format!("{base}/resume"), "Resume", ""))
            }
            ReminderState::Archived => {}
        }
    }
}

/// The reminder as the API reads it.
async fn load(service: &Service, allowed: Allowed, raw: &str) -> Result<Reminder, ApiError> {
    let id = crate::http::extract::numeric_id(raw, "reminder")?;
    Ok(Reminders::of(service).get(allowed, id).await?.reminder)
}

pub(super) async fn detail(
    service: web::Data<Service>,
    Signed(s): Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = crate::http::extract::numeric_id(&path, "reminder")?;
    let reminders = Reminders::of(&service);
    let view = reminders.get(allowed, id).await?;
    let fires: Vec<_> = view.next_fires.iter().map(|f| f.at).collect();
    let r = view.reminder;
    let tz = r.spec.timezone;
    // The API's own dry-run; a refusal (no account, no occurrence) is shown.
    let forecast = reminders.forecast(allowed, r.id, From::Now).await;
    let filter = RunFilter {
        reminder_id: Some(r.id),
        account_id: None,
        status: None,
        before_id: None,
        limit: 10,
    };
    let runs = Runs::of(&service).list(allowed, &filter).await?.items;
    let base = format!("/reminders/{}", r.id);
    let body = html! {
        p { (badge(r.state.as_str())) " " (schedule_text(&r)) " · " (tz) " · window "
            (r.spec.window.start_hour()) ":00–" (r.spec.window.end_hour()) ":00"
            @if r.spec.resume_next_window { " · resumes in the next window" } }
        div.actions {
            @if r.state != ReminderState::Archived && layout::allows(&s, &crate::http::reminders::UPDATE) {
                a.button href={ (base) "/edit" } { "Edit" }
            }
            (state_buttons(&s, &r))
            @if r.state != ReminderState::Archived {
                (action_button(&s, &crate::http::reminders::DELETE, &format!("{base}/archive"), "Archive", "danger"))
            }
        }
        section aria-labelledby="forecast" {
            h2 #forecast { "Forecast" }
            (forecast_view(&forecast, &tz))
        }
        section aria-labelledby="fires" {
            h2 #fires { "Next fire times (" (tz) ")" }
            @if fires.is_empty() { p { "None." } }
            ol { @for at in &fires { li { (local(*at, &tz)) } } }
        }
        section aria-labelledby="content" {
            h2 #content { "Message" }
            @for part in &r.spec.parts {
                @let v = serde_json::to_value(part).unwrap_or(Value::Null);
                @if v["kind"] == "text" {
                    blockquote { (v["text"].as_str().unwrap_or("")) }
                } @else {
                    p { "Picture " code { (v["media"].as_str().unwrap_or("")) }
                        @if let Some(c) = v["caption"].as_str() { " with caption: " (c) } }
                }
            }
            p { (r.spec.targets.len()) " groups named"
                @if let Some(sel) = &r.spec.select { ", and picked when a run starts: " code { (serde_json::to_string(sel).unwrap_or_default()) } } }
        }
        section aria-labelledby="runs" {
            h2 #runs { "Recent runs" }
            @if runs.is_empty() { p { "None yet." } }
            ul { @for run in runs.iter().map(|n| &n.run) { li {
                a href={ "/runs/" (run.id) } { "Run " (run.id) } " " (badge(run.status.as_str())) " "
                (herald_actors::delivery::outcome::delivered_line(&run.counts)) " · " (local(run.scheduled_for, &tz))
            } } }
        }
    };
    Ok(layout::page(&r.spec.title, Nav::Reminders, &s, body))
}

/// The API's forecast in words: "800 of 1000 groups fit before 18:00 at
/// 40/min", and the groups the preflight refused.
fn forecast_view(f: &Result<ForecastView, ApiError>, tz: &TimeZone) -> Markup {
    match f {
        Err(e) => layout::problem(e),
        Ok(f) => html! {
            p #forecast-text { (f.text) }
            p { (f.groups_fit) " of " (f.groups) " groups fit before the window closes at "
                (local(f.window_close, tz)) " at " (f.per_minute) "/min"
                @if f.fits { " — all fit." } @else { " — not all fit." } }
            (preflight_view(&f.preflight))
        },
    }
}

fn preflight_view(p: &Preflight) -> Markup {
    html! {
        @if p.directory_synced_at.is_none() {
            p.warn { "The account's group list was never synced: nothing can be checked or picked yet." }
        }
        @if !p.refused.is_empty() {
            details.warn {
                summary { (p.refused.len()) " groups would be refused" }
                ul { @for g in &p.refused { li { code { (g.group) } " " (g.reason) } } }
            }
        }
    }
}

/// What the form holds, as typed (so a refused form comes back as it was).
#[derive(Default)]
struct Draft {
    account_id: String,
    title: String,
    timezone: String,
    kind: String,
    at: String,
    cron: String,
    start_hour: String,
    end_hour: String,
    resume_next_window: bool,
    /// `earlier` or `later`: which of a time that happens twice.
    fold: String,
    text: String,
    media: String,
    caption: String,
    targets: Vec<String>,
    all: bool,
    labels: Vec<String>,
    name: String,
    version: String,
}

impl Draft {
    fn new_for(account: &str) -> Self {
        Self {
            account_id: account.into(),
            timezone: "UTC".into(),
            kind: "at".into(),
            start_hour: "6".into(),
            end_hour: "18".into(),
            ..Self::default()
        }
    }

    fn from_form(f: &Form) -> Self {
        Self {
            account_id: f.text("account_id").into(),
            title: f.get("title").unwrap_or("").into(),
            timezone: f.text("timezone").into(),
            kind: f.text("kind").into(),
            at: f.text("at").into(),
            fold: f.text("fold").into(),
            cron: f.text("cron").into(),
            start_hour: f.text("start_hour").into(),
            end_hour: f.text("end_hour").into(),
            resume_next_window: f.checked("resume_next_window"),
            text: f.get("text").unwrap_or("").replace("\r\n", "\n"),
            media: f.text("media").into(),
            caption: f.get("caption").unwrap_or("").into(),
            targets: f.all("targets").into_iter().map(str::to_owned).collect(),
            all: f.checked("all"),
            labels: f.all("labels").into_iter().map(str::to_owned).collect(),
            name: f.text("name").into(),
            version: f.text("version").into(),
        }
    }

    fn from_reminder(r: &Reminder) -> Self {
        let spec = serde_json::to_value(&r.spec).unwrap_or(Value::Null);
        let str_of = |v: &Value| v.as_str().unwrap_or("").to_owned();
        let mut d = Self {
            account_id: r.spec.account_id.to_string(),
            title: r.spec.title.clone(),
            timezone: r.spec.timezone.to_string(),
            kind: if spec["schedule"].get("cron").is_some() {
                "cron"
            } else {
                "at"
            }
            .into(),
            at: minutes(str_of(&spec["schedule"]["at"])),
            fold: str_of(&spec["schedule"]["fold"]),
            cron: str_of(&spec["schedule"]["cron"]),
            start_hour: r.spec.window.start_hour().to_string(),
            end_hour: r.spec.window.end_hour().to_string(),
            resume_next_window: r.spec.resume_next_window,
            targets: r.spec.targets.iter().map(|t| t.to_string()).collect(),
            all: spec["select"]["all"] == true,
            labels: spec["select"]["labels"]
                .as_array()
                .map(|a| a.iter().map(str_of).collect())
                .unwrap_or_default(),
            name: str_of(&spec["select"]["name"]),
            version: etag::of(r),
            ..Self::default()
        };
        for p in spec["parts"].as_array().into_iter().flatten() {
            if p["kind"] == "text" && d.text.is_empty() {
                d.text = str_of(&p["text"]);
            } else if p["kind"] == "media" && d.media.is_empty() {
                d.media = str_of(&p["media"]);
                d.caption = str_of(&p["caption"]);
            }
        }
        d
    }

    /// The parts in order, text first; which form field each came from.
    fn parts(&self) -> Vec<(&'static str, Value)> {
        let mut parts = Vec::new();
        if !self.text.trim().is_empty() {
            parts.push(("text", json!({"kind": "text", "text": self.text})));
        }
        if !self.media.is_empty() {
            let caption = (!self.caption.trim().is_empty()).then_some(&self.caption);
            parts.push((
                "media",
                json!({"kind": "media", "media": self.media, "caption": caption}),
            ));
        }
        parts
    }

    /// The API's request body for this form.
    fn request(&self) -> Value {
        let number = |s: &str| s.parse::<i64>().map_or(Value::from(s), Value::from);
        let schedule = if self.kind == "cron" {
            json!({"cron": self.cron})
        } else if self.fold == "later" {
            json!({"at": self.at, "fold": "later"})
        } else {
            json!({"at": self.at})
        };
        let mut select = serde_json::Map::new();
        if self.all {
            select.insert("all".into(), true.into());
        }
        if !self.labels.is_empty() {
            select.insert("labels".into(), json!(self.labels));
        }
        if !self.name.is_empty() {
            select.insert("name".into(), json!(self.name));
        }
        let mut v = json!({
            "account_id": self.account_id,
            "title": self.title,
            "timezone": self.timezone,
            "schedule": schedule,
            "window": {"start_hour": number(&self.start_hour), "end_hour": number(&self.end_hour)},
            "resume_next_window": self.resume_next_window,
            "parts": self.parts().into_iter().map(|(_, p)| p).collect::<Vec<_>>(),
            "targets": self.targets,
        });
        if !select.is_empty() {
            v["select"] = Value::Object(select);
        }
        v
    }

    /// The form field a problem's `field` belongs beside.
    fn field_for(&self, api_field: &str) -> &'static str {
        let head = api_field.split(['.', '[']).next().unwrap_or("");
        match head {
            "account_id" => "account_id",
            "title" => "title",
            "timezone" => "timezone",
            "schedule" => "schedule",
            "window" | "resume_next_window" => "window",
            "targets" | "select" => "targets",
            "parts" => {
                let index = api_field
                    .strip_prefix("parts[")
                    .and_then(|r| r.split(']').next())
                    .and_then(|i| i.parse::<usize>().ok());
                match index.and_then(|i| self.parts().get(i).map(|(f, _)| *f)) {
                    Some(f) => f,
                    None => "text",
                }
            }
            _ => "",
        }
    }
}

/// `2026-12-01T09:00:00` as `2026-12-01T09:00`: a datetime-local input
/// shows a seconds field only when the value has seconds.
fn minutes(at: String) -> String {
    match at.strip_suffix(":00") {
        Some(hm) if hm.len() == "2026-12-01T09:00".len() => hm.to_owned(),
        _ => at,
    }
}

/// Problems by form field ("" for the form as a whole).
type Errors = BTreeMap<&'static str, String>;

fn errors_of(d: &Draft, e: &ApiError) -> Errors {
    let mut out = Errors::new();
    match (&e.field, &e.rule) {
        (Some(f), Some(rule)) => out.insert(d.field_for(f), format!("{f}: {rule}")),
        _ => out.insert("", e.detail.clone()),
    };
    out
}

pub(super) async fn new_form(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let accounts = Accounts::of(&service).all(allowed).await?;
    let wanted = web::Query::<BTreeMap<String, String>>::from_query(req.query_string())
        .ok()
        .and_then(|q| q.get("account").cloned());
    let account = wanted
        .filter(|w| accounts.iter().any(|a| a.account.id.as_str() == w))
        .or_else(|| accounts.first().map(|a| a.account.id.to_string()))
        .unwrap_or_default();
    let draft = Draft::new_for(&account);
    let who = (&s, allowed);
    form_page(&service, who, None, &draft, &Errors::new(), StatusCode::OK).await
}

pub(super) async fn edit_form(
    service: web::Data<Service>,
    Signed(s): Signed,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let r = load(&service, allowed, &path).await?;
    let draft = Draft::from_reminder(&r);
    form_page(
        &service,
        (&s, allowed),
        Some(r.id),
        &draft,
        &Errors::new(),
        StatusCode::OK,
    )
    .await
}

async fn form_page(
    service: &Service,
    who: (&Session, Allowed),
    id: Option<i64>,
    d: &Draft,
    errors: &Errors,
    status: StatusCode,
) -> Result<HttpResponse, ApiError> {
    form_page_with(service, who, id, d, errors, status, None).await
}

async fn form_page_with(
    service: &Service,
    (s, allowed): (&Session, Allowed),
    id: Option<i64>,
    d: &Draft,
    errors: &Errors,
    status: StatusCode,
    preview: Option<&Markup>,
) -> Result<HttpResponse, ApiError> {
    let accounts: Vec<Account> = Accounts::of(service)
        .all(allowed)
        .await?
        .into_iter()
        .map(|v| v.account)
        .collect();
    let groups = match herald_actors::domain::AccountId::parse(&d.account_id) {
        Ok(account) => {
            let filter = GroupFilter {
                limit: 5000,
                ..GroupFilter::all_of(account)
            };
            Groups::of(service).list(allowed, &filter).await?.items
        }
        Err(_) => Vec::new(),
    };
    let labels: BTreeSet<String> = groups
        .iter()
        .flat_map(|g| g.labels.iter().map(|l| l.to_string()))
        .collect();
    let title = match id {
        Some(id) => format!("Edit reminder {id}"),
        None => "New reminder".into(),
    };
    let action = id.map_or("/reminders".to_owned(), |id| format!("/reminders/{id}"));
    let body = form(s, &action, d, errors, &accounts, &groups, &labels, preview);
    Ok(layout::page_with(status, &title, Nav::Reminders, s, body))
}

/// A field's error, tied to its input for screen readers.
fn error_note(errors: &Errors, key: &str) -> Markup {
    html! {
        @if let Some(e) = errors.get(key) {
            p.error id={ "err-" (key) } role="alert" { (e) }
        }
    }
}

fn described(errors: &Errors, key: &str) -> Option<String> {
    errors.get(key).map(|_| format!("err-{key}"))
}

fn invalid(errors: &Errors, key: &str) -> Option<&'static str> {
    errors.get(key).map(|_| "true")
}

#[allow(clippy::too_many_arguments)]
fn form(
    s: &Session,
    action: &str,
    d: &Draft,
    errors: &Errors,
    accounts: &[Account],
    groups: &[herald_actors::domain::Group],
    labels: &BTreeSet<String>,
    preview: Option<&Markup>,
) -> Markup {
    html! {
        (error_note(errors, ""))
        @if let Some(p) = preview {
            (p)
        }
        @if !errors.is_empty() {
            p.error role="alert" { "Nothing was saved." }
        }
        form #reminder-form.stack method="post" action=(action) {
            (csrf(s))
            input type="hidden" name="version" value=(d.version);
            fieldset {
                legend { "What" }
                label for="account_id" { "Account" }
                select #account_id name="account_id" data-reload="account" aria-invalid=[invalid(errors, "account_id")] aria-describedby=[described(errors, "account_id")] {
                    @for a in accounts {
                        option value=(a.id) selected[a.id.as_str() == d.account_id] { (a.id) " (" (a.state) ")" }
                    }
                }
                (error_note(errors, "account_id"))
                label for="title" { "Title" }
                input #title name="title" value=(d.title) required aria-invalid=[invalid(errors, "title")] aria-describedby=[described(errors, "title")];
                (error_note(errors, "title"))
                label for="text" { "Text" }
                textarea #text name="text" rows="4" aria-invalid=[invalid(errors, "text")] aria-describedby=[described(errors, "text")] { (d.text) }
                (error_note(errors, "text"))
                label for="picture" { "Picture (JPEG, PNG, WebP or GIF; sent after the text)" }
                input #picture type="file" accept="image/*" aria-describedby="picture-state";
                input #media type="hidden" name="media" value=(d.media);
                p #picture-state.hint aria-live="polite" {
                    @if d.media.is_empty() { "No picture." } @else { "Picture " code { (d.media) } " attached." }
                }
                img #picture-preview alt="Preview of the picture" hidden;
                (error_note(errors, "media"))
                label for="caption" { "Caption" }
                input #caption name="caption" value=(d.caption);
            }
            fieldset {
                legend { "When" }
                label for="timezone" { "Timezone (IANA name, e.g. Asia/Kuala_Lumpur)" }
                input #timezone name="timezone" value=(d.timezone) required aria-invalid=[invalid(errors, "timezone")] aria-describedby=[described(errors, "timezone")];
                (error_note(errors, "timezone"))
                div role="radiogroup" aria-label="Schedule kind" {
                    label.inline { input type="radio" name="kind" value="at" checked[d.kind != "cron"]; " Once" }
                    label.inline { input type="radio" name="kind" value="cron" checked[d.kind == "cron"]; " Repeating (cron)" }
                }
                label for="at" { "Once at (local date and time)" }
                input #at type="datetime-local" name="at" value=(d.at) aria-invalid=[invalid(errors, "schedule")] aria-describedby=[described(errors, "schedule")];
                label for="fold" { "If clocks go back and that time happens twice" }
                select #fold name="fold" {
                    option value="earlier" selected[d.fold != "later"] { "the first (still summer time)" }
                    option value="later" selected[d.fold == "later"] { "the second (after the change)" }
                }
                label for="cron" { "Cron: minute hour day-of-month month day-of-week" }
                input #cron name="cron" value=(d.cron) placeholder="0 9 * * 1-5" aria-invalid=[invalid(errors, "schedule")];
                (error_note(errors, "schedule"))
                div.row {
                    div {
                        label for="start_hour" { "Delivery window opens (hour)" }
                        input #start_hour name="start_hour" type="number" min="0" max="23" value=(d.start_hour) aria-invalid=[invalid(errors, "window")] aria-describedby=[described(errors, "window")];
                    }
                    div {
                        label for="end_hour" { "closes (hour)" }
                        input #end_hour name="end_hour" type="number" min="0" max="24" value=(d.end_hour) aria-invalid=[invalid(errors, "window")];
                    }
                }
                label.inline { input type="checkbox" name="resume_next_window" checked[d.resume_next_window]; " Groups left at the window's close go in the next window" }
                (error_note(errors, "window"))
            }
            fieldset #targets {
                legend { "To which groups" }
                (error_note(errors, "targets"))
                label.inline { input #all type="checkbox" name="all" checked[d.all]; " Every group the account is in (" (groups.len()) ")" }
                @if !labels.is_empty() {
                    p { "Groups with any of these labels:" }
                    @for l in labels {
                        label.inline.tag { input type="checkbox" name="labels" value=(l) checked[d.labels.contains(l)]; " " (l) }
                    }
                }
                label for="name" { "Groups whose name matches (* and ? wildcards)" }
                input #name name="name" value=(d.name);
                p { "Or pick groups:" }
                label for="group-search" { "Search groups" }
                input #group-search type="search" data-filter="group-list" autocomplete="off";
                ul #group-list.picklist {
                    @for g in groups {
                        li data-name=(g.info.subject.to_lowercase()) {
                            label { input type="checkbox" name="targets" value=(g.info.jid) checked[d.targets.iter().any(|t| *t == g.info.jid.to_string())];
                                " " (g.info.subject) " " small { (g.info.participants) " members"
                                @for l in &g.labels { " · " (l) } } }
                        }
                    }
                }
                @if groups.is_empty() { p.warn { "This account has no synced groups yet." } }
            }
            div.actions {
                button type="submit" { "Save reminder" }
                button.quiet type="submit" name="preview" value="1" {
                    "Preview: next times and forecast"
                }
            }
        }
    }
}

/// What saving would give, without saving: the schedule's next five times
/// in the reminder's timezone with any daylight-saving note, and the
/// engine's forecast with the pre-flight's refusals.
async fn preview_of(service: &Service, allowed: Allowed, spec: &NewReminder) -> Markup {
    let tz = spec.timezone;
    let now = Utc::now().trunc_subsecs(0);
    // However far the first time is: a one-shot may be years away.
    let fires = spec
        .schedule
        .occurrences(&tz, now, now + Duration::days(366 * 100), NEXT_FIRES);
    let forecast = Reminders::of(service)
        .forecast_of(allowed, spec, From::Next, now)
        .await;
    html! {
        section #preview.card aria-labelledby="preview-title" {
            h2 #preview-title { "Preview (not saved)" }
            h3 { "Next times" }
            @if fires.is_empty() {
                p.warn { "The schedule has no time after now." }
            }
            ol #next-times {
                @for t in &fires {
                    li {
                        (local(*t, &tz))
                        @if let Some(note) = dst_note(&tz, *t) {
                            " " small.warn { "(" (note) ")" }
                        }
                    }
                }
            }
            h3 { "Forecast at the next time" }
            @match forecast {
                Ok(Some(f)) => {
                    p #preview-forecast { (f.text) }
                    @if !f.preflight.refused.is_empty() {
                        p.warn { (f.preflight.refused.len()) " group(s) the account is not in or may not post to: a run fails them up front." }
                    }
                }
                Ok(None) => p.warn { "No forecast: the schedule has no time after now." },
                Err(e) => p.warn { "No forecast: " (e.detail) },
            }
        }
    }
}

/// Runs a form through the API's own parsing (shape, then the domain's
/// rules), so a refusal names the same field and rule the API would.
fn parsed(d: &Draft) -> Result<ReminderRequest, ApiError> {
    parse_json::<ReminderRequest>(d.request().to_string().as_bytes())
}

pub(super) async fn create(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let form = post_form(&req, &s, &body).await?;
    let d = Draft::from_form(&form);
    if form.get("preview").is_some() {
        return previewed(&service, (&s, allowed), None, &d).await;
    }
    let made = match parsed(&d).and_then(|r| r.parse().map_err(ApiError::from)) {
        Ok(new) => Reminders::of(&service).create(allowed, new).await,
        Err(e) => Err(e),
    };
    match made {
        Ok(c) => Ok(see_other(&format!("/reminders/{}", c.reminder.id))),
        Err(e) => refused_form(&service, (&s, allowed), None, &d, &e).await,
    }
}

/// The form again, as filled in, with [`preview_of`] above it; or with
/// the field's problem if the form does not parse. Nothing is stored.
async fn previewed(
    service: &Service,
    (s, allowed): (&Session, Allowed),
    id: Option<i64>,
    d: &Draft,
) -> Result<HttpResponse, ApiError> {
    let spec = match parsed(d).and_then(|r| r.parse().map_err(ApiError::from)) {
        Ok(spec) => spec,
        Err(e) => return refused_form(service, (s, allowed), id, d, &e).await,
    };
    let preview = preview_of(service, allowed, &spec).await;
    form_page_with(
        service,
        (s, allowed),
        id,
        d,
        &Errors::new(),
        StatusCode::OK,
        Some(&preview),
    )
    .await
}

async fn refused_form(
    service: &Service,
    who: (&Session, Allowed),
    id: Option<i64>,
    d: &Draft,
    e: &ApiError,
) -> Result<HttpResponse, ApiError> {
    let status = if e.kind == Kind::Forbidden {
        StatusCode::FORBIDDEN
    } else {
        e.status()
    };
    form_page(service, who, id, d, &errors_of(d, e), status).await
}

pub(super) async fn update(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    path: web::Path<String>,
    body: web::Bytes,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let form = post_form(&req, &s, &body).await?;
    let d = Draft::from_form(&form);
    let id = crate::http::extract::numeric_id(&path, "reminder")?;
    if form.get("preview").is_some() {
        return previewed(&service, (&s, allowed), Some(id), &d).await;
    }
    // The version the form was drawn from: an edit made in between is not
    // overwritten silently (the API's If-Match rule, for a form), checked
    // under the same lock as the write.
    let expect = |now: &str| {
        if d.version.is_empty() || d.version == now {
            return Ok(());
        }
        Err(ApiError::new(
            Kind::PreconditionFailed,
            format!(
                "reminder {} changed since this form was opened; reload it",
                id
            ),
        ))
    };
    let saved = match parsed(&d).and_then(|r| r.parse().map_err(ApiError::from)) {
        Ok(new) => {
            Reminders::of(&service)
                .replace(allowed, id, expect, new)
                .await
        }
        Err(e) => Err(e),
    };
    match saved {
        Ok(_) => Ok(see_other(&format!("/reminders/{}", id))),
        Err(e) => refused_form(&service, (&s, allowed), Some(id), &d, &e).await,
    }
}

macro_rules! reminder_buttons {
    ($($name:ident => $to:expr),+ $(,)?) => {$(
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
                let reminder = numeric_id(&id, "reminder")?;
                Reminders::of(&service).$name(allowed, reminder).await
            };
            let back = format!("/reminders/{id}");
            let title = format!("Reminder {id}");
            layout::button((&req, &s, &body), (Nav::Reminders, &title), act, $to, &back).await
        }
    )+};
}

reminder_buttons!(
    pause => |r| format!("/reminders/{}", r.id),
    resume => |r| format!("/reminders/{}", r.id),
    archive => |r| format!("/reminders/{}", r.id),
    fire => |f| format!("/runs/{}", f.run_id),
);

/// A picture from the form's file input, sent by the page's script as the
/// raw bytes (`X-CSRF-Token` carries the session's token), stored by the
/// service as the API's upload stores it.
pub(super) async fn upload(
    service: web::Data<Service>,
    req: HttpRequest,
    Signed(s): Signed,
    payload: web::Payload,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let token = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    super::check_post(&req, &s, token.as_deref())?;
    let (bytes, filename) = media::received(&service, &req, payload).await?;
    let stored = Media::of(&service)
        .upload(allowed, &bytes, filename)
        .await?;
    Ok(media::created(stored))
}
