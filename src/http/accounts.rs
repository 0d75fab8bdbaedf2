//! `/v1/accounts`: paired accounts, their per-account limits and state.

use super::errors::ApiError;
use super::etag;
use super::extract::{account_id, double_option, Json, JsonBody, ACCOUNT_ID};
use super::spec::{Body, Field, Op, Param, Params, Rule, Shape, Str, Success};
use crate::service::accounts::{self, AccountDetail, AccountPage, AccountView, Accounts};
use crate::service::history::{self, AccountHistory, Histories};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::{
    AccountId, AccountLimits, AccountState, GatewayKind, TimeZone, ValidationError,
};
use herald_actors::ports::NewAccount;
use serde::Deserialize;

pub const MAX_NAME_CHARS: usize = 100;
pub const PER_MINUTE: Rule = Rule::Int { min: 1, max: 600 };
pub const GROUP_CONCURRENCY: Rule = Rule::Int { min: 1, max: 64 };
pub const DAILY_CAP: Rule = Rule::Int {
    min: 1,
    max: 1_000_000,
};

/// Said on a WhatsApp account until it is paired.
const NEW_NUMBER_DOC: &str = "The number is new to sending at volume: the daemon's warm-up ramp \
(delivery.warmup) holds it to rising daily ceilings, starting over after a ban or a cool-down. \
Default false; null = false";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAccount {
    id: String,
    #[serde(default)]
    name: Option<String>,
    kind: String,
    #[serde(default)]
    max_per_minute: Option<u64>,
    #[serde(default)]
    group_concurrency: Option<u64>,
    #[serde(default)]
    daily_cap: Option<u64>,
    #[serde(default)]
    hourly_cap: Option<u64>,
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    new_number: Option<bool>,
}

fn gateway_kinds() -> &'static [&'static str] {
    GatewayKind::NAMES
}

pub static CREATE_ACCOUNT: Shape = Shape {
    name: "CreateAccount",
    description: "A new account",
    fields: &[
        Field::req(
            "id",
            Rule::Str(Str::pattern(AccountId::PATTERN, AccountId::RULE)),
            "",
        ),
        Field::nullable(
            "name",
            Rule::Str(Str::len(0, MAX_NAME_CHARS)),
            "Defaults to the id",
        ),
        Field::req("kind", Rule::Str(Str::one_of(gateway_kinds)), ""),
        Field::nullable("max_per_minute", PER_MINUTE, "Messages per minute override"),
        Field::nullable(
            "group_concurrency",
            GROUP_CONCURRENCY,
            "Groups in flight override",
        ),
        Field::nullable(
            "daily_cap",
            DAILY_CAP,
            "Messages per local day; a run that reaches it is deferred to the next day",
        ),
        Field::nullable(
            "hourly_cap",
            DAILY_CAP,
            "Messages per local hour; a run that reaches it is deferred to the next hour",
        ),
        Field::nullable(
            "timezone",
            super::reminders::TIMEZONE,
            "IANA timezone of the account's days and hours for its caps; null counts in each \
             reminder's timezone",
        ),
        Field::nullable("new_number", Rule::Bool, NEW_NUMBER_DOC),
    ],
    example: Some(
        r#"{"id": "sales-1", "name": "Sales line 1", "kind": "simulator", "new_number": true}"#,
    ),
};

impl JsonBody for CreateAccount {
    const SHAPE: &'static Shape = &CREATE_ACCOUNT;
}

impl CreateAccount {
    pub fn parse(self) -> Result<NewAccount, ValidationError> {
        let id = AccountId::parse(&self.id).map_err(|e| ValidationError::new("id", e.rule))?;
        let name = match self.name.as_deref().map(str::trim) {
            None | Some("") => id.as_str().to_owned(),
            Some(n) if n.chars().count() > MAX_NAME_CHARS => {
                return Err(ValidationError::new(
                    "name",
                    format!("must be at most {MAX_NAME_CHARS} characters"),
                ))
            }
            Some(n) => n.to_owned(),
        };
        let kind: GatewayKind = self
            .kind
            .parse()
            .map_err(|e: ValidationError| ValidationError::new("kind", e.rule))?;
        let limits = AccountLimits {
            daily_cap: limit(self.daily_cap, "daily_cap", DAILY_CAP)?,
            hourly_cap: limit(self.hourly_cap, "hourly_cap", DAILY_CAP)?,
            timezone: self
                .timezone
                .map(|t| TimeZone::parse(&t).map_err(|e| ValidationError::new("timezone", e.rule)))
                .transpose()?,
            new_number: self.new_number.unwrap_or(false),
            max_per_minute: limit(self.max_per_minute, "max_per_minute", PER_MINUTE)?,
            group_concurrency: limit(
                self.group_concurrency,
                "group_concurrency",
                GROUP_CONCURRENCY,
            )?,
        };
        // A simulated account is usable at once; a WhatsApp one needs pairing.
        let state = match kind {
            GatewayKind::Simulator => AccountState::Connected,
            GatewayKind::Whatsapp => AccountState::Pairing,
        };
        Ok(NewAccount {
            id,
            name,
            kind,
            state,
            limits,
        })
    }
}

/// PATCH: a field left out is unchanged, `null` clears the override (back
/// to the daemon's setting), a number sets it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchAccount {
    #[serde(default, deserialize_with = "double_option")]
    max_per_minute: Option<Option<u64>>,
    #[serde(default, deserialize_with = "double_option")]
    group_concurrency: Option<Option<u64>>,
    #[serde(default, deserialize_with = "double_option")]
    daily_cap: Option<Option<u64>>,
    #[serde(default, deserialize_with = "double_option")]
    hourly_cap: Option<Option<u64>>,
    /// The account's timezone for its daily and hourly caps.
    #[serde(default, deserialize_with = "double_option")]
    timezone: Option<Option<String>>,
    #[serde(default, deserialize_with = "double_option")]
    new_number: Option<Option<bool>>,
}

pub static PATCH_ACCOUNT: Shape = Shape {
    name: "PatchAccount",
    description: "Each field: left out = unchanged, null = back to the daemon's setting, a \
                  number = override",
    fields: &[
        Field::nullable("max_per_minute", PER_MINUTE, "null clears the override"),
        Field::nullable(
            "group_concurrency",
            GROUP_CONCURRENCY,
            "null clears the override",
        ),
        Field::nullable(
            "daily_cap",
            DAILY_CAP,
            "Messages per local day (null clears the cap); a run that reaches it is deferred",
        ),
        Field::nullable(
            "hourly_cap",
            DAILY_CAP,
            "Messages per local hour (null clears the cap)",
        ),
        Field::nullable(
            "timezone",
            super::reminders::TIMEZONE,
            "IANA timezone of the account's days and hours for its caps; null counts in each \
             reminder's timezone",
        ),
        Field::nullable("new_number", Rule::Bool, NEW_NUMBER_DOC),
    ],
    example: Some(r#"{"max_per_minute": 20, "group_concurrency": null}"#),
};

impl JsonBody for PatchAccount {
    const SHAPE: &'static Shape = &PATCH_ACCOUNT;
}

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;

pub static CREATE: Op = Op::new(
    "createAccount",
    "Add an account",
    Success::json::<AccountView>(201, "Created; `Location` names it").location(),
)
.describe(
    "A `simulator` account is created `connected` and can send at once. A `whatsapp` account is \
     created in state `pairing`; see the account's `notice`. 409 if the id is taken. 503 if \
     the shared simulated WhatsApp (`simulator.url`) cannot register a `simulator` account.",
)
.body(Body::Json(&CREATE_ACCOUNT))
.errors(&[409, 503])
.performs(&accounts::CREATE);

pub static LIST: Op = Op::new(
    "listAccounts",
    "List accounts",
    Success::json::<AccountPage>(200, "A page of accounts, in id order"),
)
.describe("For the next page pass `after` = `next_after`; `next_after` is null on the last page.")
.query(&[
    Param::new(
        "after",
        Rule::Str(Str::pattern(AccountId::PATTERN, AccountId::RULE)),
        "Only accounts whose id sorts after this one",
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
.performs(&accounts::LIST);

pub static GET: Op = Op::new(
    "getAccount",
    "One account with its live state",
    Success::json::<AccountDetail>(200, "The account").etag(),
)
.describe(
    "The row plus the account actor's live view (`live`): queue depth, current run, tokens, \
     rate, why it is halted. `live` is null if the actor does not answer within 2 s.",
)
.path(&[ACCOUNT_ID])
.performs(&accounts::GET);

pub static HISTORY: Op = Op::new(
    "getAccountHistory",
    "An account's last 30 days",
    Success::json::<AccountHistory>(200, "Messages per day against the day's ceiling"),
)
.describe(
    "What the console's account chart draws: messages sent each local day (the account's \
     timezone, else UTC; a group's parts count on the day its last part went out), the ceiling \
     the engine held it to that day (its daily cap, or the warm-up ramp's step where lower, \
     `ceiling_by`), and its last incident.",
)
.path(&[ACCOUNT_ID])
.performs(&history::HISTORY);

pub async fn history(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    Ok(HttpResponse::Ok().json(Histories::of(&service).get(allowed, &id).await?))
}

pub static PATCH: Op = Op::new(
    "patchAccount",
    "Change per-account limits",
    Success::json::<AccountView>(200, "The account").etag(),
)
.describe("Applies to runs that start afterwards.")
.path(&[ACCOUNT_ID])
.body(Body::Json(&PATCH_ACCOUNT))
.if_match()
.performs(&accounts::PATCH);

pub static DELETE: Op = Op::new("deleteAccount", "Remove an account", Success::NO_CONTENT)
    .describe(
        "Refused (409) while it has reminders that are not archived, a run queued or sending, \
         or a recall or edit under way, on whichever daemon carries it. Archived reminders \
         and their runs go with it.",
    )
    .path(&[ACCOUNT_ID])
    .errors(&[409])
    .performs(&accounts::DELETE);

pub static DISABLE: Op = Op::new(
    "disableAccount",
    "Disable an account",
    Success::json::<AccountView>(200, "The account"),
)
.describe("State `disabled`: its queue stops; runs wait until it is enabled.")
.path(&[ACCOUNT_ID])
.performs(&accounts::DISABLE);

pub static ENABLE: Op = Op::new(
    "enableAccount",
    "Enable an account",
    Success::json::<AccountView>(200, "The account"),
)
.describe(
    "A simulator account becomes `connected`. A WhatsApp account becomes `connected` if it \
     holds a paired session, else goes back to `pairing`.",
)
.path(&[ACCOUNT_ID])
.performs(&accounts::ENABLE);

impl PatchAccount {
    pub fn apply(self, mut limits: AccountLimits) -> Result<AccountLimits, ValidationError> {
        if let Some(v) = self.max_per_minute {
            limits.max_per_minute = limit(v, "max_per_minute", PER_MINUTE)?;
        }
        if let Some(v) = self.group_concurrency {
            limits.group_concurrency = limit(v, "group_concurrency", GROUP_CONCURRENCY)?;
        }
        if let Some(v) = self.daily_cap {
            limits.daily_cap = limit(v, "daily_cap", DAILY_CAP)?;
        }
        if let Some(v) = self.hourly_cap {
            limits.hourly_cap = limit(v, "hourly_cap", DAILY_CAP)?;
        }
        if let Some(v) = self.timezone {
            limits.timezone = v
                .map(|t| TimeZone::parse(&t).map_err(|e| ValidationError::new("timezone", e.rule)))
                .transpose()?;
        }
        if let Some(v) = self.new_number {
            limits.new_number = v.unwrap_or(false);
        }
        Ok(limits)
    }
}

/// The shape check already held the number to its rule; this converts it
/// (and says the same rule should it ever be reached otherwise).
fn limit(v: Option<u64>, field: &str, rule: Rule) -> Result<Option<u32>, ValidationError> {
    let Rule::Int { min, max } = rule else {
        unreachable!("limits are integer rules")
    };
    match v {
        None => Ok(None),
        Some(n) if (min as u64..=max as u64).contains(&n) => Ok(Some(n as u32)),
        Some(_) => Err(ValidationError::new(field, format!("must be {min}–{max}"))),
    }
}

pub async fn create(
    service: web::Data<Service>,
    body: Json<CreateAccount>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let new = body.0.parse()?;
    let view = Accounts::of(&service).create(allowed, new).await?;
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/v1/accounts/{}", view.account.id)))
        .json(view))
}

/// Keyset paging by id.
pub async fn list(
    service: web::Data<Service>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &LIST)?;
    let limit = p.int("limit").unwrap_or(DEFAULT_LIMIT) as u32;
    let page = Accounts::of(&service)
        .list(allowed, p.text("after"), limit)
        .await?;
    Ok(HttpResponse::Ok().json(page))
}

pub async fn get(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    let (detail, tag) = Accounts::of(&service).get(allowed, &id).await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, tag))
        .json(detail))
}

pub async fn patch(
    service: web::Data<Service>,
    req: HttpRequest,
    path: web::Path<String>,
    body: Json<PatchAccount>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    let expect = |current: &str| etag::check(&req, &format!("account {id}"), current);
    let view = Accounts::of(&service)
        .patch(allowed, &id, expect, |limits| body.0.apply(limits))
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag::of(&view.account)))
        .json(view))
}

pub async fn disable(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    let view = Accounts::of(&service).disable(allowed, &id).await?;
    Ok(HttpResponse::Ok().json(view))
}

pub async fn enable(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    let view = Accounts::of(&service).enable(allowed, &id).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Refused while the account has reminders that are not archived, a run
/// queued or sending, or a recall or edit under way.
pub async fn delete(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = account_id(&path)?;
    Accounts::of(&service).delete(allowed, &id).await?;
    Ok(HttpResponse::NoContent().finish())
}
