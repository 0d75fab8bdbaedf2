//! `/v1/accounts/{id}/groups`: the account's group directory — list and
//! search it, sync it from WhatsApp, label groups.

use super::errors::ApiError;
use super::extract::{account_id, Json, JsonBody, ACCOUNT_ID};
use super::spec::Op;
use super::spec::{self, Array, Body, Field, Param, Params, Pattern, Rule, Shape, Str, Success};
use crate::service::groups::{self, GroupPageView, Groups, ResolvedGroups, SyncView};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::{
    parse_labels, Group, GroupFilter, GroupJid, Label, MAX_ENTRY_CHARS, MAX_LABELS, MAX_TARGETS,
};
use serde::Deserialize;

pub const DEFAULT_LIMIT: i64 = 100;
pub const MAX_LIMIT: i64 = 1000;

pub const LABEL: Rule = Rule::Str(Str {
    max: Label::MAX_LEN,
    pattern: Some(Pattern {
        regex: "^[a-z0-9][a-z0-9_-]*$",
        rule: Label::RULE,
    }),
    ..Str::ANY
});

fn true_false() -> &'static [&'static str] {
    &["true", "false"]
}

const GROUP_JID: Param = Param::new(
    "jid",
    Rule::Str(Str {
        max: GroupJid::MAX_CHARS,
        pattern: Some(Pattern {
            regex: GroupJid::PATTERN,
            rule: GroupJid::RULE,
        }),
        ..Str::ANY
    }),
    "The group's JID",
);

pub static LIST: Op = Op::new(
    "listGroups",
    "List and search an account's groups",
    Success::json::<GroupPageView>(200, "A page of groups, in JID order"),
)
.describe(
    "The account's group directory as of its last sync (`synced_at` on each group). `total` \
     counts every group that matches the filters; for the next page pass `after` = \
     `next_after` (null on the last page).",
)
.path(&[ACCOUNT_ID])
.query(&[
    Param::new(
        "name",
        Rule::Str(Str::len(1, 100)),
        "Groups whose name contains this, ignoring case",
    ),
    Param::new(
        "can_post",
        Rule::Str(Str::one_of(true_false)),
        "Only groups this account may (true) or may not (false) post in",
    ),
    Param::new("label", LABEL, "Only groups with this label"),
    Param::new(
        "include_left",
        Rule::Str(Str::one_of(true_false)),
        "Also groups the account has left (default false)",
    ),
    GROUP_JID_AFTER,
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
.performs(&groups::LIST);

const GROUP_JID_AFTER: Param = Param::new("after", GROUP_JID.rule, "Only groups after this JID");

pub static SYNC: Op = Op::new(
    "syncGroups",
    "Sync an account's groups from WhatsApp",
    Success::json::<SyncView>(200, "What the sync changed"),
)
.describe(
    "One participating-groups request to WhatsApp, stored as the account's directory: new groups \
     added, renamed or re-permissioned ones updated (labels kept), groups no longer listed \
     marked as left. At most once per `groups.min_sync_interval_secs` per account, counted \
     from the last attempt: sooner answers 429 with `Retry-After`. 409 when the account is not \
     connected; 503 when WhatsApp does not answer.",
)
.path(&[ACCOUNT_ID])
.errors(&[409, 429, 503])
.performs(&groups::SYNC);

pub static RESOLVE: Op = Op::new(
    "resolveGroups",
    "Turn group names and JIDs into JIDs",
    Success::json::<ResolvedGroups>(200, "The JIDs, in entry order, each once"),
)
.describe(
    "For importing targets (a CSV of names or JIDs): a JID is taken as it is; a name must match \
     exactly one group the account is in, case-insensitively, ignoring surrounding spaces. \
     Otherwise 422 on `entries`, its rule listing every offender (`entries[3] \"Sales\" names \
     no group`, `… names 2 groups`). Nothing is written either way.",
)
.path(&[ACCOUNT_ID])
.body(Body::Json(&RESOLVE_BODY))
.performs(&groups::RESOLVE);

static ENTRIES: Array = Array {
    items: Rule::Str(Str {
        min: 1,
        max: MAX_ENTRY_CHARS,
        pattern: Some(Pattern {
            regex: spec::NOT_BLANK,
            rule: "must not be blank",
        }),
        ..Str::ANY
    }),
    min: 1,
    max: MAX_TARGETS,
    unique: false,
    noun: "entries",
};

pub static RESOLVE_BODY: Shape = Shape {
    name: "GroupEntries",
    description: "Group names or JIDs to resolve",
    fields: &[Field::req(
        "entries",
        Rule::Array(&ENTRIES),
        "Each a group JID or a group's exact name",
    )],
    example: Some(r#"{"entries": ["Sales KL", "120363000000000001@g.us"]}"#),
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntriesBody {
    entries: Vec<String>,
}

impl JsonBody for EntriesBody {
    const SHAPE: &'static Shape = &RESOLVE_BODY;
}

pub async fn resolve(
    service: web::Data<Service>,
    path: web::Path<String>,
    body: Json<EntriesBody>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let account = account_id(&path)?;
    let resolved = Groups::of(&service)
        .resolve(allowed, account, &body.0.entries)
        .await?;
    Ok(HttpResponse::Ok().json(resolved))
}

pub static SET_LABELS: Op = Op::new(
    "setGroupLabels",
    "Set a group's labels",
    Success::json::<Group>(200, "The group"),
)
.describe(
    "Replaces the group's labels; an empty list clears them. Labels let a reminder target many \
     groups at once and survive syncs.",
)
.path(&[ACCOUNT_ID, GROUP_JID])
.body(Body::Json(&LABELS))
.performs(&groups::SET_LABELS);

static LABEL_LIST: Array = Array {
    items: LABEL,
    min: 0,
    max: MAX_LABELS,
    unique: true,
    noun: "labels",
};

pub static LABELS: Shape = Shape {
    name: "GroupLabels",
    description: "A group's labels, each once",
    fields: &[Field::req(
        "labels",
        Rule::Array(&LABEL_LIST),
        "1–40 of a-z, 0-9, '_' or '-', starting with a letter or digit",
    )],
    example: Some(r#"{"labels": ["clients", "kl-east"]}"#),
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelsBody {
    labels: Vec<String>,
}

impl JsonBody for LabelsBody {
    const SHAPE: &'static Shape = &LABELS;
}

pub async fn list(
    service: web::Data<Service>,
    path: web::Path<String>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &LIST)?;
    let account = account_id(&path)?;
    let flag = |name| p.text(name).map(|v| v == "true");
    let filter = GroupFilter {
        account_id: account,
        name: p.text("name").map(str::to_owned),
        can_post: flag("can_post"),
        label: p.parsed("label", Label::parse)?,
        include_left: flag("include_left").unwrap_or(false),
        after: p.parsed("after", GroupJid::parse)?,
        limit: p.int("limit").unwrap_or(DEFAULT_LIMIT) as u32,
    };
    Ok(HttpResponse::Ok().json(Groups::of(&service).list(allowed, &filter).await?))
}

pub async fn sync(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let account = account_id(&path)?;
    Ok(HttpResponse::Ok().json(Groups::of(&service).sync(allowed, &account).await?))
}

pub async fn set_labels(
    service: web::Data<Service>,
    path: web::Path<(String, String)>,
    body: Json<LabelsBody>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let (raw_account, raw_jid) = path.into_inner();
    let account = account_id(&raw_account)?;
    let raw_jid = spec::path_value(&GROUP_JID, "group", &raw_jid)?;
    let jid =
        GroupJid::parse(raw_jid).map_err(|_| ApiError::not_found(format!("group {raw_jid:?}")))?;
    let labels = parse_labels(&body.0.labels)?;
    let group = Groups::of(&service)
        .set_labels(allowed, &account, &jid, &labels)
        .await?;
    Ok(HttpResponse::Ok().json(group))
}
