//! `/v1/accounts`: paired accounts, their per-account limits and state.

use super::errors::ApiError;
use super::etag;
use super::extract::{account_id, double_option, Field, Json, Shape, Ty};
use crate::state::AppState;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::account::{AccountSnapshot, Snapshot};
use herald_actors::domain::{
    Account, AccountId, AccountLimits, AccountState, GatewayKind, ValidationError,
};
use herald_actors::ports::NewAccount;
use herald_actors::supervisor::{AccountUpdated, AddAccount, RemoveAccount};
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const MAX_NAME_CHARS: usize = 100;
pub const PER_MINUTE: (u64, u64) = (1, 600);
pub const GROUP_CONCURRENCY: (u64, u64) = (1, 64);
pub const DAILY_CAP: (u64, u64) = (1, 1_000_000);

/// How long a live view may take before the answer goes without it.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(2);

/// Said on a WhatsApp account until it is paired.
#[cfg(feature = "whatsapp")]
pub const PAIRING_NOTICE: &str = "A WhatsApp account starts in state 'pairing' and cannot send \
until it is paired: POST /v1/accounts/{id}/pair starts pairing by QR code (or by pair code with \
{\"phone\": \"+60…\"}); GET /v1/accounts/{id}/pair shows its progress.";
#[cfg(not(feature = "whatsapp"))]
pub const PAIRING_NOTICE: &str = "This build of Herald has no WhatsApp gateway (built without \
the `whatsapp` feature): the account is stored in state 'pairing' and cannot send.";

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
}

impl Shape for CreateAccount {
    const FIELDS: &'static [Field] = &[
        Field::req("id", Ty::Str),
        Field::nullable("name", Ty::Str),
        Field::req("kind", Ty::Str),
        Field::nullable("max_per_minute", Ty::UInt),
        Field::nullable("group_concurrency", Ty::UInt),
        Field::nullable("daily_cap", Ty::UInt),
    ];
}

impl CreateAccount {
    fn parse(self) -> Result<NewAccount, ValidationError> {
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
            max_per_minute: limit(self.max_per_minute, "max_per_minute", PER_MINUTE)?,
            group_concurrency: limit(
                self.group_concurrency,
                "group_concurrency",
                GROUP_CONCURRENCY,
            )?,
            daily_cap: limit(self.daily_cap, "daily_cap", DAILY_CAP)?,
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
}

impl Shape for PatchAccount {
    const FIELDS: &'static [Field] = &[
        Field::nullable("max_per_minute", Ty::UInt),
        Field::nullable("group_concurrency", Ty::UInt),
        Field::nullable("daily_cap", Ty::UInt),
    ];
}

impl PatchAccount {
    fn apply(self, mut limits: AccountLimits) -> Result<AccountLimits, ValidationError> {
        if let Some(v) = self.max_per_minute {
            limits.max_per_minute = limit(v, "max_per_minute", PER_MINUTE)?;
        }
        if let Some(v) = self.group_concurrency {
            limits.group_concurrency = limit(v, "group_concurrency", GROUP_CONCURRENCY)?;
        }
        if let Some(v) = self.daily_cap {
            limits.daily_cap = limit(v, "daily_cap", DAILY_CAP)?;
        }
        Ok(limits)
    }
}

fn limit(
    v: Option<u64>,
    field: &str,
    (min, max): (u64, u64),
) -> Result<Option<u32>, ValidationError> {
    match v {
        None => Ok(None),
        Some(n) if (min..=max).contains(&n) => Ok(Some(n as u32)),
        Some(_) => Err(ValidationError::new(field, format!("must be {min}–{max}"))),
    }
}

/// An account as the API shows it: the row, the limits in force, and for
/// a single account the actor's live view.
#[derive(Debug, Serialize)]
pub struct AccountView {
    #[serde(flatten)]
    account: Account,
    /// Overrides where set, else the daemon's settings.
    effective_limits: EffectiveLimits,
    #[serde(skip_serializing_if = "Option::is_none")]
    notice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live: Option<Option<AccountSnapshot>>,
}

#[derive(Debug, Serialize)]
struct EffectiveLimits {
    max_per_minute: u32,
    group_concurrency: u32,
}

impl AccountView {
    fn new(state: &AppState, account: Account) -> Self {
        let d = &state.settings.delivery;
        let effective_limits = EffectiveLimits {
            max_per_minute: account.limits.max_per_minute.unwrap_or(d.max_per_minute),
            group_concurrency: account
                .limits
                .group_concurrency
                .unwrap_or(d.group_concurrency),
        };
        let notice = (account.kind == GatewayKind::Whatsapp
            && account.state == AccountState::Pairing)
            .then_some(PAIRING_NOTICE);
        Self {
            account,
            effective_limits,
            notice,
            live: None,
        }
    }
}

pub async fn create(
    state: web::Data<AppState>,
    body: Json<CreateAccount>,
) -> Result<HttpResponse, ApiError> {
    let new = body.0.parse()?;
    let account = state.store.create_account(&new, chrono::Utc::now()).await?;
    if account.kind == GatewayKind::Simulator {
        state.register_simulated(&account.id);
    }
    // Awaited, so the actor exists before the client can fire a run.
    state
        .supervisor
        .send(AddAccount(account.id.clone()))
        .await?;
    let location = format!("/v1/accounts/{}", account.id);
    Ok(HttpResponse::Created()
        .insert_header(("Location", location))
        .json(AccountView::new(&state, account)))
}

pub async fn list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let items: Vec<_> = state
        .store
        .list_accounts()
        .await?
        .into_iter()
        .map(|a| AccountView::new(&state, a))
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "items": items })))
}

pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let account = load(&state, &path).await?;
    let tag = etag::of(&account);
    let live = snapshot(&state, &account.id).await;
    let mut view = AccountView::new(&state, account);
    view.live = Some(live);
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, tag))
        .json(view))
}

pub async fn patch(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    body: Json<PatchAccount>,
) -> Result<HttpResponse, ApiError> {
    let account = {
        let _edit = state.edits.lock().await;
        let account = load(&state, &path).await?;
        etag::check(
            &req,
            &format!("account {}", account.id),
            &etag::of(&account),
        )?;
        let limits = body.0.apply(account.limits.clone())?;
        state
            .store
            .update_account_limits(&account.id, &limits)
            .await?
    };
    let tag = etag::of(&account);
    state
        .supervisor
        .send(AccountUpdated(account.id.clone()))
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, tag))
        .json(AccountView::new(&state, account)))
}

pub async fn disable(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let account = load(&state, &path).await?;
    set_state(
        &state,
        account,
        AccountState::Disabled,
        Some("disabled by operator"),
    )
    .await
}

/// Enabling a simulated account connects it (also after a simulated ban
/// or log-out: the operator says it may send again). A WhatsApp account
/// is `connected` only if it holds a paired session, else back to
/// `pairing`: never a `connected` it could not honour.
pub async fn enable(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let account = load(&state, &path).await?;
    let to = match account.kind {
        GatewayKind::Simulator => AccountState::Connected,
        GatewayKind::Whatsapp if whatsapp_paired(&state, &account) => AccountState::Connected,
        GatewayKind::Whatsapp => AccountState::Pairing,
    };
    set_state(&state, account, to, None).await
}

#[cfg(feature = "whatsapp")]
fn whatsapp_paired(state: &AppState, account: &Account) -> bool {
    state.whatsapp.pairing(account).state == "paired"
}

#[cfg(not(feature = "whatsapp"))]
fn whatsapp_paired(_: &AppState, _: &Account) -> bool {
    false
}

async fn set_state(
    state: &AppState,
    account: Account,
    to: AccountState,
    reason: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let account = state
        .store
        .set_account_state(&account.id, to, reason)
        .await?;
    state
        .supervisor
        .send(AccountUpdated(account.id.clone()))
        .await?;
    Ok(HttpResponse::Ok().json(AccountView::new(state, account)))
}

/// Refused while the account has reminders that are not archived (the
/// store decides) or a run queued or in flight (its actor knows).
pub async fn delete(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let account = load(&state, &path).await?;
    if let Some(live) = snapshot(&state, &account.id).await {
        if live.current_run.is_some() || live.queue_depth > 0 {
            return Err(ApiError::conflict(format!(
                "account {} has runs queued or in flight; stop them first",
                account.id
            )));
        }
    }
    state.store.delete_account(&account.id).await?;
    // A removed WhatsApp account's client stops and its stored login goes.
    #[cfg(feature = "whatsapp")]
    if account.kind == herald_actors::domain::GatewayKind::Whatsapp {
        state.whatsapp.forget(&account.id).await;
    }
    state.supervisor.send(RemoveAccount(account.id)).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn load(state: &AppState, raw: &str) -> Result<Account, ApiError> {
    let id = account_id(raw)?;
    state
        .store
        .get_account(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("account {id}")))
}

/// The actor's live view, or `None` if it has no actor or is too busy to
/// answer in time (the row is still worth showing).
async fn snapshot(state: &AppState, id: &AccountId) -> Option<AccountSnapshot> {
    let addr = state.account_actor(id)?;
    addr.send(Snapshot).timeout(SNAPSHOT_TIMEOUT).await.ok()
}
