//! Accounts as operators see and switch them: the row with the limits in
//! force, and enabling or disabling one.

use super::error::{ApiError, Kind};
use super::{version, Allowed, Operation};
use crate::groups::GroupDirectory;
use crate::settings::DeliverySettings;
use crate::state::{AppState, Simulated};
use actix::Addr;
use chrono::Utc;
use herald_actors::domain::{
    Account, AccountId, AccountLimits, AccountState, GatewayKind, Role, ValidationError,
};
use herald_actors::events::EventBus;
use herald_actors::ports::{NewAccount, Store};
use herald_actors::supervisor::{AccountUpdated, AddAccount, Supervisor};
use schemars::JsonSchema;
use serde::Serialize;

pub static CREATE: Operation = Operation::new("createAccount", Role::Admin);
pub static PATCH: Operation = Operation::new("patchAccount", Role::Admin);
pub static ENABLE: Operation = Operation::new("enableAccount", Role::Admin);
pub static DISABLE: Operation = Operation::new("disableAccount", Role::Admin);

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

/// What switching an account needs: its row, the event log its state
/// change commits with, the supervisor that tells its actor, the daemon's
/// limits, and whether a WhatsApp account holds a paired session.
pub struct Accounts<'a> {
    store: &'a dyn Store,
    events: &'a EventBus,
    supervisor: &'a Addr<Supervisor>,
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
    pub fn of(state: &'a AppState) -> Self {
        Self {
            store: state.store.as_ref(),
            events: &state.engine.events,
            supervisor: &state.supervisor,
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
        self.supervisor.send(AddAccount(account.id.clone())).await?;
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
        self.supervisor
            .send(AccountUpdated(account.id.clone()))
            .await?;
        Ok(self.view(account))
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
        self.supervisor
            .send(AccountUpdated(account.id.clone()))
            .await?;
        Ok(self.view(account))
    }
}
