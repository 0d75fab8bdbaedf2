//! `/v1/reminders`: what to send, to which groups, when. Every change is
//! followed by `ReminderChanged` so the scheduler recomputes at once
//! instead of at its next reconcile.

use super::errors::ApiError;
use super::etag;
use super::extract::{numeric_id, Json, JsonBody, REMINDER_ID};
use super::spec::{
    Array, Body, Choice, Field, OneOf, Op, Param, Params, Pattern, Rule, Shape, Str, Success,
    NOT_BLANK,
};
use crate::service::reminders::{
    self, Checked, FireResult, ForecastView, From, ReminderView, Reminders, RemindersPage,
};
use crate::service::upcoming::{self, Upcoming, Upcomings};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::{
    AccountId, Fold, GroupJid, MediaId, NamePattern, Reminder, ReminderRequest, ReminderState,
    Schedule, TimeZone, MAX_CAPTION_CHARS, MAX_LABELS, MAX_PARTS, MAX_PATTERN_CHARS,
    MAX_POLL_OPTIONS, MAX_POLL_OPTION_CHARS, MAX_POLL_QUESTION_CHARS, MAX_TARGETS, MAX_TEXT_CHARS,
    MAX_TITLE_CHARS, MIN_POLL_OPTIONS,
};
use herald_actors::ports::ReminderFilter;

fn text_kind() -> &'static [&'static str] {
    &["text"]
}
fn media_kind() -> &'static [&'static str] {
    &["media"]
}
fn poll_kind() -> &'static [&'static str] {
    &["poll"]
}
fn reminder_states() -> &'static [&'static str] {
    ReminderState::NAMES
}
fn forecast_from() -> &'static [&'static str] {
    &["now", "next"]
}

const ACCOUNT_REF: Rule = Rule::Str(Str::pattern(AccountId::PATTERN, AccountId::RULE));

pub static WINDOW: Shape = Shape {
    name: "Window",
    description:
        "Delivery hours in the reminder's timezone. start > end crosses midnight; 0–24 is \
                  all day; start = end is refused. Default 06–18.",
    fields: &[
        Field::req("start_hour", Rule::Int { min: 0, max: 23 }, ""),
        Field::req("end_hour", Rule::Int { min: 0, max: 24 }, ""),
    ],
    example: Some(r#"{"start_hour": 6, "end_hour": 18}"#),
};

fn fold_names() -> &'static [&'static str] {
    Fold::NAMES
}

static AT: Shape = Shape {
    name: "ScheduleAt",
    description: "Fires once",
    fields: &[
        Field::req(
            "at",
            Rule::Str(Str::pattern(Schedule::AT_PATTERN, Schedule::AT_RULE)),
            "One-shot local date-time, e.g. 2026-12-01T09:00, in the reminder's timezone. An \
             offset (`+01:00`, `Z`) may follow: it must be the timezone's offset at that time, and \
             picks one of a time that happens twice when clocks go back",
        ),
        Field::opt(
            "fold",
            Rule::Str(Str::one_of(fold_names)),
            "When clocks go back and the time happens twice: `earlier` (default, still on summer \
             time) or `later` (after the change). Elsewhere it changes nothing",
        ),
    ],
    example: None,
};

static CRON: Shape = Shape {
    name: "ScheduleCron",
    description: "Fires on every match",
    fields: &[Field::req(
        "cron",
        Rule::Str(Str::pattern(
            Schedule::CRON_PATTERN,
            "must have 5 fields (minute hour day-of-month month day-of-week)",
        )),
        "5 fields: minute hour day-of-month month day-of-week, in the reminder's timezone; it must \
         match some date",
    )],
    example: None,
};

pub static SCHEDULE: OneOf = OneOf {
    name: "Schedule",
    description: "Exactly one of `at` (once) or `cron` (recurring)",
    tag: None,
    variants: &[&AT, &CRON],
};

static TEXT_PART: Shape = Shape {
    name: "TextPart",
    description: "A text message",
    fields: &[
        Field::req("kind", Rule::Str(Str::one_of(text_kind)), ""),
        Field::req(
            "text",
            Rule::Str(Str {
                min: 1,
                max: MAX_TEXT_CHARS,
                pattern: Some(NOT_BLANK_RULE),
                ..Str::ANY
            }),
            "",
        ),
    ],
    example: None,
};

static MEDIA_PART: Shape = Shape {
    name: "MediaPart",
    description: "A picture uploaded through /v1/media, with an optional caption",
    fields: &[
        Field::req("kind", Rule::Str(Str::one_of(media_kind)), ""),
        Field::req(
            "media",
            Rule::Str(Str::pattern(MediaId::PATTERN, MediaId::RULE)),
            "The media id; it must have been uploaded",
        ),
        Field::nullable("caption", Rule::Str(Str::len(0, MAX_CAPTION_CHARS)), ""),
    ],
    example: None,
};

/// Not blank: a string with at least one character that is not white space.
const NOT_BLANK_RULE: Pattern = Pattern {
    regex: NOT_BLANK,
    rule: "must not be empty",
};

// Not `unique`: the domain refuses two options alike after trimming, and
// names both positions.
static POLL_OPTIONS: Array = Array {
    items: Rule::Str(Str {
        min: 1,
        max: MAX_POLL_OPTION_CHARS,
        pattern: Some(NOT_BLANK_RULE),
        ..Str::ANY
    }),
    min: MIN_POLL_OPTIONS,
    max: MAX_POLL_OPTIONS,
    unique: false,
    noun: "options",
};

static POLL_PART: Shape = Shape {
    name: "PollPart",
    description: "A WhatsApp poll: members answer it in the chat, and `GET /v1/runs/{id}/poll` \
                  counts each voter's latest choice across the run's groups",
    fields: &[
        Field::req("kind", Rule::Str(Str::one_of(poll_kind)), ""),
        Field::req(
            "question",
            Rule::Str(Str {
                min: 1,
                max: MAX_POLL_QUESTION_CHARS,
                pattern: Some(NOT_BLANK_RULE),
                ..Str::ANY
            }),
            "A template, like a text (`{group_name}` and the rest)",
        ),
        Field::req(
            "options",
            Rule::Array(&POLL_OPTIONS),
            "Sent as written, no two alike",
        ),
        Field::opt(
            "multiple",
            Rule::Bool,
            "Members may choose several options (default: one)",
        ),
    ],
    example: None,
};

pub static PART: OneOf = OneOf {
    name: "Part",
    description: "One message; a group receives a reminder's parts in order",
    tag: Some("kind"),
    variants: &[&TEXT_PART, &MEDIA_PART, &POLL_PART],
};

static PARTS: Array = Array {
    items: Rule::OneOf(&PART),
    min: 1,
    max: MAX_PARTS,
    unique: false,
    noun: "parts",
};

static TARGETS: Array = Array {
    items: Rule::Str(Str {
        max: GroupJid::MAX_CHARS,
        pattern: Some(Pattern {
            regex: GroupJid::PATTERN,
            rule: GroupJid::RULE,
        }),
        ..Str::ANY
    }),
    min: 0,
    max: MAX_TARGETS,
    unique: true,
    noun: "groups",
};

static SELECT_LABELS: Array = Array {
    items: super::groups::LABEL,
    min: 0,
    max: MAX_LABELS,
    unique: true,
    noun: "labels",
};

static EXCLUDES: Array = Array {
    items: TARGETS.items,
    min: 0,
    max: MAX_TARGETS,
    unique: true,
    noun: "groups",
};

pub static SELECT: Shape = Shape {
    name: "TargetSelector",
    description: "Groups picked from the account's directory (GET /v1/accounts/{id}/groups) when \
        a run first starts: the union of `all`, any of `labels` and `name`, minus `exclude`, \
        counting only groups the account is still in. The picks are stored with the run, each \
        saying how it was chosen (`all`, `label:<x>`, `name:<pattern>`), and never re-read.",
    fields: &[
        Field::opt(
            "all",
            Rule::Bool,
            "Every group the account is in (default false)",
        ),
        Field::opt(
            "labels",
            Rule::Array(&SELECT_LABELS),
            "Groups carrying any of these labels",
        ),
        Field::opt(
            "name",
            Rule::Str(Str {
                min: 1,
                max: MAX_PATTERN_CHARS,
                pattern: Some(Pattern {
                    regex: NamePattern::PATTERN,
                    rule: NamePattern::RULE,
                }),
                ..Str::ANY
            }),
            "Groups whose name matches, case-insensitively: a substring, or with `*` (any run) \
             or `?` (one character) a glob on the whole name (`kl-*` matches \"KL-East\", not \
             \"Team KL-East\")",
        ),
        Field::opt(
            "exclude",
            Rule::Array(&EXCLUDES),
            "Group JIDs never picked; none may also be in `targets`",
        ),
    ],
    example: Some(
        r#"{"labels": ["clients"], "name": "kl-*", "exclude": ["120363000000000009@g.us"]}"#,
    ),
};

/// An IANA timezone name.
pub const TIMEZONE: Rule = Rule::Str(Str {
    choice: Some(Choice {
        values: TimeZone::names,
        rule: Some(TimeZone::RULE),
    }),
    ..Str::ANY
});

pub static REMINDER_REQUEST: Shape = Shape {
    name: "ReminderRequest",
    description: "A reminder to create, or the whole of one to replace",
    fields: &[
        Field::req(
            "account_id",
            ACCOUNT_REF,
            "The sending account; it must exist",
        ),
        Field::req(
            "title",
            Rule::Str(Str {
                min: 1,
                max: MAX_TITLE_CHARS,
                pattern: Some(Pattern {
                    regex: NOT_BLANK,
                    rule: "must not be blank",
                }),
                ..Str::ANY
            }),
            "",
        ),
        Field::req(
            "timezone",
            TIMEZONE,
            "IANA name such as Asia/Kuala_Lumpur, or UTC",
        ),
        Field::req("schedule", Rule::OneOf(&SCHEDULE), ""),
        Field::nullable(
            "window",
            Rule::Object(&WINDOW),
            "Absent or null: the default 06–18",
        ),
        Field::opt(
            "resume_next_window",
            Rule::Bool,
            "When the window closes with groups left, resume at the next opening instead of \
             ending partial (default false)",
        ),
        Field::opt(
            "unique_texts",
            Rule::Bool,
            "No two groups of a run receive the same text: every templated text or caption must \
             give at least one variant per target, or the reminder is refused (default false)",
        ),
        Field::req("parts", Rule::Array(&PARTS), ""),
        Field::opt(
            "targets",
            Rule::Array(&TARGETS),
            "WhatsApp group JIDs, each once; at least one unless `select` is given",
        ),
        Field::nullable("select", Rule::Object(&SELECT), ""),
    ],
    example: Some(
        r#"{"account_id": "sales-1", "title": "Monday standup", "timezone": "Asia/Kuala_Lumpur",
            "schedule": {"cron": "0 9 * * 1"}, "window": {"start_hour": 8, "end_hour": 18},
            "parts": [{"kind": "text", "text": "Standup in 10 minutes"}],
            "targets": ["120363000000000001@g.us", "120363000000000002@g.us"]}"#,
    ),
};

impl JsonBody for ReminderRequest {
    const SHAPE: &'static Shape = &REMINDER_REQUEST;
}

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;

const VALIDATED: &str = "Validated field by field; a 422 names the field (`targets[3]`, \
    `window.end_hour`, `parts[0].caption`) and the rule. The account and any media must exist \
    (else 422), the cron must match some date, and the window's hours must differ.";

pub static CREATE: Op = Op::new(
    "createReminder",
    "Create a reminder",
    Success::json::<Checked>(201, "Created; `Location` names it").location(),
)
.describe(VALIDATED)
.body(Body::Json(&REMINDER_REQUEST))
.performs(&reminders::CREATE);

pub static UPCOMING: Op = Op::new(
    "listUpcomingFires",
    "What will send in the next 24 hours",
    Success::json::<Upcoming>(200, "Every fire of the active reminders, soonest first"),
)
.describe(
    "What the console's overview chart draws: each fire of an active reminder in the next 24 \
     hours, at the time it starts sending (its window's opening if the occurrence falls \
     outside the window, as the scheduler moves it), with its account and the groups it names \
     (`selects`: a selector adds groups when the run starts).",
)
.performs(&upcoming::UPCOMING);

pub async fn upcoming(
    service: web::Data<Service>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(Upcomings::of(&service).get(allowed).await?))
}

pub static LIST: Op = Op::new(
    "listReminders",
    "List reminders",
    Success::json::<RemindersPage>(200, "A page of reminders, in id order"),
)
.describe(
    "Summaries in id order (the targets are counted, not listed: read one reminder for them). \
     For the next page pass `after` = `next_after`; `next_after` is null on the last page.",
)
.query(&[
    Param::new("account_id", ACCOUNT_REF, "Only this account's"),
    Param::new(
        "state",
        Rule::Str(Str::one_of(reminder_states)),
        "Only in this state",
    ),
    Param::new(
        "after",
        Rule::Int {
            min: 0,
            max: i64::MAX,
        },
        "Only reminders with a larger id",
    ),
    Param::new(
        "limit",
        Rule::Int {
            min: 1,
            max: MAX_LIMIT,
        },
        "Page size",
    )
    .default(DEFAULT_LIMIT),
])
.performs(&reminders::LIST);

pub static GET: Op = Op::new(
    "getReminder",
    "One reminder with its next fire times",
    Success::json::<ReminderView>(200, "The reminder").etag(),
)
.describe(
    "`next_fires`: the schedule's next 5 occurrences in its timezone. `next_due`: what the \
     scheduler holds (the send time moves to the window's opening when an occurrence falls \
     outside the window).",
)
.path(&[REMINDER_ID])
.performs(&reminders::GET);

pub static UPDATE: Op = Op::new(
    "replaceReminder",
    "Replace a reminder",
    Success::json::<Checked>(200, "The reminder").etag(),
)
.describe(
    "Refused (409) while one of its runs is scheduled, queued, running, paused or parked, or \
     once archived; refused (412) if `If-Match` names a version that is no longer current.",
)
.path(&[REMINDER_ID])
.body(Body::Json(&REMINDER_REQUEST))
.if_match()
.errors(&[409])
.performs(&reminders::REPLACE);

pub static DELETE: Op = Op::new("archiveReminder", "Archive a reminder", Success::NO_CONTENT)
    .describe(
        "It stops firing; its runs stay. Runs already queued or in flight go on (stop them \
         through /v1/runs/{id}/stop).",
    )
    .path(&[REMINDER_ID])
    .performs(&reminders::ARCHIVE);

pub static PAUSE: Op = Op::new(
    "pauseReminder",
    "Pause a reminder",
    Success::json::<Reminder>(200, "The reminder"),
)
.describe("Idempotent. 409 if archived.")
.path(&[REMINDER_ID])
.errors(&[409])
.performs(&reminders::PAUSE);

pub static RESUME: Op = Op::new(
    "resumeReminder",
    "Resume a reminder",
    Success::json::<Reminder>(200, "The reminder"),
)
.describe("Idempotent. 409 if archived.")
.path(&[REMINDER_ID])
.errors(&[409])
.performs(&reminders::RESUME);

pub static FIRE: Op = Op::new(
    "fireReminder",
    "Fire now",
    Success::json::<FireResult>(202, "Accepted; `Location` names the run").location(),
)
.describe(
    "Creates a run for now (to the second). Inside the delivery window it is queued at once \
     (`queued`); outside, it waits for the window to open (`scheduled`). 409 unless the \
     reminder is active.",
)
.path(&[REMINDER_ID])
.errors(&[409, 503])
.performs(&reminders::FIRE);

pub static FORECAST: Op = Op::new(
    "forecastReminder",
    "Dry-run forecast",
    Success::json::<ForecastView>(200, "The estimate"),
)
.describe(
    "Would the groups fit the window at the account's rate? From now (or the window's opening) \
     or from the next due time, to that window's close. Nothing is written; no body. 409 when \
     `from=next` and the schedule has no occurrence left.",
)
.path(&[REMINDER_ID])
.query(&[Param::new(
    "from",
    Rule::Str(Str::one_of(forecast_from)),
    "Start now (default) or at the next due time",
)])
.errors(&[409])
.performs(&reminders::FORECAST);

pub async fn create(
    service: web::Data<Service>,
    body: Json<ReminderRequest>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let new = body.0.parse()?;
    let checked = Reminders::of(&service).create(allowed, new).await?;
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/v1/reminders/{}", checked.reminder.id)))
        .json(checked))
}

pub async fn update(
    service: web::Data<Service>,
    req: HttpRequest,
    path: web::Path<String>,
    body: Json<ReminderRequest>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = numeric_id(&path, "reminder")?;
    let new = body.0.parse()?;
    let expect = |current: &str| etag::check(&req, &format!("reminder {id}"), current);
    let checked = Reminders::of(&service)
        .replace(allowed, id, expect, new)
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag::of(&checked.reminder)))
        .json(checked))
}

pub async fn pause(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = numeric_id(&path, "reminder")?;
    Ok(HttpResponse::Ok().json(Reminders::of(&service).pause(allowed, id).await?))
}

pub async fn resume(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = numeric_id(&path, "reminder")?;
    Ok(HttpResponse::Ok().json(Reminders::of(&service).resume(allowed, id).await?))
}

pub async fn delete(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = numeric_id(&path, "reminder")?;
    Reminders::of(&service).archive(allowed, id).await?;
    Ok(HttpResponse::NoContent().finish())
}

pub async fn fire(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = numeric_id(&path, "reminder")?;
    let fired = Reminders::of(&service).fire(allowed, id).await?;
    Ok(HttpResponse::Accepted()
        .insert_header(("Location", format!("/v1/runs/{}", fired.run_id)))
        .json(fired))
}

/// Keyset paging by id: a page reads `limit` summaries (parts and targets
/// counted, not loaded), however many reminders exist.
pub async fn list(
    service: web::Data<Service>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &LIST)?;
    let filter = ReminderFilter {
        account_id: p.parsed("account_id", AccountId::parse)?,
        state: p.parsed("state", str::parse::<ReminderState>)?,
    };
    let limit = p.int("limit").unwrap_or(DEFAULT_LIMIT) as u32;
    let page = Reminders::of(&service)
        .list(allowed, filter, p.int("after"), limit)
        .await?;
    Ok(HttpResponse::Ok().json(page))
}

pub async fn get(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = numeric_id(&path, "reminder")?;
    let view = Reminders::of(&service).get(allowed, id).await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag::of(&view.reminder)))
        .json(view))
}

pub async fn forecast(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &FORECAST)?;
    let from = match p.text("from") {
        Some("next") => From::Next,
        _ => From::Now,
    };
    let id = numeric_id(&path, "reminder")?;
    let forecast = Reminders::of(&service).forecast(allowed, id, from).await?;
    Ok(HttpResponse::Ok().json(forecast))
}
