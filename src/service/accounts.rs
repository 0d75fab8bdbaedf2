//! Accounts as operators see and switch them: the row with the limits in
//! force and the actor's live view; creating, changing, enabling,
//! disabling and removing one.

use super::error::{ApiError, Kind};
use super::Service;
use super::{version, Allowed, Operation};
use crate::groups::GroupDirectory;
use crate::settings::DeliverySettings;
use crate::state::Simulated;
use chrono::{Datelike, TimeZone as _, Utc};
use herald_actors::delivery::account::{AccountSnapshot, Snapshot};
use herald_actors::domain::{
    Account, AccountId, AccountLimits, AccountState, GatewayKind, Role, ValidationError,
};
use herald_actors::events::EventBus;
use herald_actors::ports::{NewAccount, Store};
use herald_actors::supervisor::Door;
use schemars::JsonSchema;
use serde::Serialize;
use std::time::Duration;

pub static CREATE: Operation = Operation::new("createAccount", Role::Admin);
pub static PATCH: Operation = Operation::new("patchAccount", Role::Admin);
pub static ENABLE: Operation = Operation::new("enableAccount", Role::Admin);
pub static DISABLE: Operation = Operation::new("disableAccount", Role::Admin);
pub static DELETE: Operation = Operation::new("deleteAccount", Role::Admin);
pub static LIST: Operation = Operation::read("listAccounts", Role::Viewer);
pub static GET: Operation = Operation::read("getAccount", Role::Viewer);

/// How long a live view may take before the answer goes without it.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(feature = "whatsapp")]
pub const PAIRING_NOTICE: &str = "A WhatsApp account starts in state 'pairing' and cannot send \
until it is paired: POST /v1/accounts/{id}/pair starts pairing by QR code (or by pair code with \
{\"phone\": \"+60…\"}); GET /v1/accounts/{id}/pair shows its progress.";
#[cfg(not(feature = "whatsapp"))]
pub const PAIRING_NOTICE: &str = "This build of Herald has no WhatsApp gateway (built without \
the `whatsapp` feature): the account is stored in state 'pairing' and cannot send.";

/// An account as the API shows it: the row and the limits in force.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Account")]
pub struct AccountView {
    #[serde(flatten)]
    pub account: Account,
    /// Overrides where set, else the daemon's settings.
    pub effective_limits: EffectiveLimits,
    /// Present on WhatsApp accounts while they wait to be paired: how to
    /// pair them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notice: Option<&'static str>,
}

/// A single account: the row, the limits in force and the actor's live
/// view (null while the account has no actor on this daemon).
#[derive(Debug, Serialize, JsonSchema)]
pub struct AccountDetail {
    #[serde(flatten)]
    pub account: AccountView,
    pub live: Option<AccountSnapshot>,
}

/// A page of accounts, in id order.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AccountPage {
    pub items: Vec<AccountView>,
    /// Pass as `after` for the next page; null on the last.
    pub next_after: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct EffectiveLimits {
    pub max_per_minute: u32,
    pub group_concurrency: u32,
}

impl AccountView {
    /// `account` with the daemon's `delivery` defaults where it sets none.
    pub fn new(delivery: &DeliverySettings, account: Account) -> Self {
        let effective_limits = EffectiveLimits {
            max_per_minute: account
                .limits
                .max_per_minute
                .unwrap_or(delivery.max_per_minute),
            group_concurrency: account
                .limits
                .group_concurrency
                .unwrap_or(delivery.group_concurrency),
        };
        let notice = (account.kind == GatewayKind::Whatsapp
            && account.state == AccountState::Pairing)
            .then_some(PAIRING_NOTICE);
        Self {
            account,
            effective_limits,
            notice,
        }
    }
}

/// What showing and switching an account needs: its row, the event log
/// its state change commits with, the supervisor that tells its actor, the
/// actors here (their live view), the daemon's limits, and whether a
/// WhatsApp account holds a paired session.
pub struct Accounts<'a> {
    store: &'a dyn Store,
    events: &'a EventBus,
    actors: &'a Door,
    delivery: &'a DeliverySettings,
    /// Where a new simulated account is registered.
    simulated: Simulated<'a>,
    simulator_url: &'a str,
    /// A new account's groups are listed before it is answered.
    groups: &'a GroupDirectory,
    /// Serialises an edit's version check with its write.
    edits: &'a tokio::sync::Mutex<()>,
    #[cfg(feature = "whatsapp")]
    whatsapp: &'a crate::gateway::whatsapp::WhatsappGateway,
}

impl<'a> Accounts<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
            events: &state.engine.events,
            actors: &state.door,
            delivery: &state.settings.delivery,
            simulated: state.simulated(),
            simulator_url: &state.settings.simulator.url,
            groups: &state.groups,
            edits: &state.edits,
            #[cfg(feature = "whatsapp")]
            whatsapp: &state.whatsapp,
        }
    }

    /// The account as the API shows it.
    pub fn view(&self, account: Account) -> AccountView {
        AccountView::new(self.delivery, account)
    }

    /// The per-minute limit of an account that sets none.
    pub fn default_max_per_minute(&self) -> u32 {
        self.delivery.max_per_minute
    }

    /// Stores a new account and starts its actor. A simulated one is
    /// registered with the simulator first (if the shared simulator cannot
    /// be reached, nothing is created and the request can be repeated) and
    /// its groups are listed before the answer, so the next request finds
    /// them.
    pub async fn create(&self, allowed: Allowed, new: NewAccount) -> Result<AccountView, ApiError> {
        allowed.of(&CREATE)?;
        if new.kind == GatewayKind::Simulator {
            self.simulated.register(&new.id).await.map_err(|e| {
                ApiError::new(
                    Kind::Unavailable,
                    format!(
                        "the shared simulator at {} did not register the account: {e}",
                        self.simulator_url
                    ),
                )
            })?;
        }
        let account = self.store.create_account(&new, Utc::now()).await?;
        // Awaited, so the actor exists before the client can fire a run.
        self.actors.added(account.id.clone()).await?;
        if account.kind == GatewayKind::Simulator {
            // A busy database is waited out; a failure that remains is
            // logged, and a manual sync can follow.
            if let Err(e) = self.groups.sync_new(&account.id).await {
                tracing::warn!(account = %account.id, error = %e, "new account's groups not listed");
            }
        }
        Ok(self.view(account))
    }

    /// Changes the account's limits with `change`, while it is the version
    /// `expect` accepts (given the current version's tag).
    pub async fn patch(
        &self,
        allowed: Allowed,
        id: &AccountId,
        expect: impl FnOnce(&str) -> Result<(), ApiError>,
        change: impl FnOnce(AccountLimits) -> Result<AccountLimits, ValidationError>,
    ) -> Result<AccountView, ApiError> {
        allowed.of(&PATCH)?;
        let account = {
            let _edit = self.edits.lock().await;
            let account = self.load(id).await?;
            expect(&version::of(&account))?;
            let limits = change(account.limits.clone())?;
            self.store
                .update_account_limits(&account.id, &limits)
                .await?
        };
        self.actors.changed(account.id.clone()).await?;
        Ok(self.view(account))
    }

    /// A page of at most `limit` accounts in id order, after the id `after`.
    pub async fn list(
        &self,
        allowed: Allowed,
        after: Option<&str>,
        limit: u32,
    ) -> Result<AccountPage, ApiError> {
        allowed.of(&LIST)?;
        // One more than asked says whether another page follows.
        let mut page = self.store.list_accounts_page(after, limit + 1).await?;
        let more = page.len() > limit as usize;
        page.truncate(limit as usize);
        let next_after = more
            .then(|| page.last().map(|a| a.id.as_str().to_owned()))
            .flatten();
        let items = page.into_iter().map(|a| self.view(a)).collect();
        Ok(AccountPage { items, next_after })
    }

    /// Every account, in id order, for a page that shows them all.
    pub async fn all(&self, allowed: Allowed) -> Result<Vec<AccountView>, ApiError> {
        allowed.of(&LIST)?;
        let all = self.store.list_accounts().await?;
        Ok(all.into_iter().map(|a| self.view(a)).collect())
    }

    /// One account with its actor's live view, and its version.
    pub async fn get(
        &self,
        allowed: Allowed,
        id: &AccountId,
    ) -> Result<(AccountDetail, String), ApiError> {
        allowed.of(&GET)?;
        let account = self.load(id).await?;
        let tag = version::of(&account);
        let live = self.snapshot(id).await;
        let account = self.view(account);
        Ok((AccountDetail { account, live }, tag))
    }

    /// Messages `account` has sent since the start of its local day (its
    /// own timezone, else UTC), as its daily cap counts them.
    pub async fn sent_today(&self, allowed: Allowed, account: &Account) -> Result<u64, ApiError> {
        allowed.of(&GET)?;
        let tz = account
            .limits
            .timezone
            .map(|t| t.tz())
            .unwrap_or(chrono_tz::UTC);
        let now = Utc::now().with_timezone(&tz);
        let midnight = tz
            .with_ymd_and_hms(now.year(), now.month(), now.day(), 0, 0, 0)
            .earliest()
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_else(|| Utc::now() - chrono::Duration::hours(24));
        let sent = self.store.sent_since(&account.id, midnight).await?;
        Ok(sent.iter().map(|(_, parts)| u64::from(*parts)).sum())
    }

    /// One account as the API shows it, without asking its actor: for a
    /// page that shows no live view and must not wait for one.
    pub async fn row(&self, allowed: Allowed, id: &AccountId) -> Result<AccountView, ApiError> {
        allowed.of(&GET)?;
        Ok(self.view(self.load(id).await?))
    }

    /// The actor's live view, or `None` if it has no actor here or is too
    /// busy to answer in time (the row is still worth showing).
    async fn snapshot(&self, id: &AccountId) -> Option<AccountSnapshot> {
        let addr = self.actors.actor(id)?;
        addr.send(Snapshot).timeout(SNAPSHOT_TIMEOUT).await.ok()
    }

    /// Removes the account. Refused while it has reminders that are not
    /// archived, or a run queued or sending, or a recall or edit under way:
    /// the store decides, in the delete's transaction, so the rule holds
    /// whichever daemon carries the account's actor. A WhatsApp account's
    /// client stops and its stored login goes.
    pub async fn delete(&self, allowed: Allowed, id: &AccountId) -> Result<(), ApiError> {
        allowed.of(&DELETE)?;
        let account = self.load(id).await?;
        self.store.delete_account(&account.id).await?;
        #[cfg(feature = "whatsapp")]
        if account.kind == GatewayKind::Whatsapp {
            self.whatsapp.forget(&account.id).await;
        }
        self.actors.removed(account.id).await?;
        Ok(())
    }

    async fn load(&self, id: &AccountId) -> Result<Account, ApiError> {
        self.store
            .get_account(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("account {id}")))
    }

    /// State `disabled`: its queue stops; runs wait until it is enabled.
    pub async fn disable(&self, allowed: Allowed, id: &AccountId) -> Result<AccountView, ApiError> {
        allowed.of(&DISABLE)?;
        let account = self.load(id).await?;
        self.set_state(
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
    pub async fn enable(&self, allowed: Allowed, id: &AccountId) -> Result<AccountView, ApiError> {
        allowed.of(&ENABLE)?;
        let account = self.load(id).await?;
        let to = match account.kind {
            GatewayKind::Simulator => AccountState::Connected,
            GatewayKind::Whatsapp if self.whatsapp_paired(&account).await => {
                AccountState::Connected
            }
            GatewayKind::Whatsapp => AccountState::Pairing,
        };
        self.set_state(account, to, None).await
    }

    #[cfg(feature = "whatsapp")]
    async fn whatsapp_paired(&self, account: &Account) -> bool {
        self.whatsapp.pairing(account).await.state == "paired"
    }

    #[cfg(not(feature = "whatsapp"))]
    async fn whatsapp_paired(&self, _: &Account) -> bool {
        false
    }

    async fn set_state(
        &self,
        account: Account,
        to: AccountState,
        reason: Option<&str>,
    ) -> Result<AccountView, ApiError> {
        // The `account_state` event commits with the change (the outbox), as
        // the engine's own state changes do.
        let account = self
            .events
            .account_state(self.store, &account.id, to, reason, None)
            .await?;
        self.actors.changed(account.id.clone()).await?;
        Ok(self.view(account))
    }
}
