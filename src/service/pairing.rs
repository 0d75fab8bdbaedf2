//! Pairing a WhatsApp account, by QR code or by pair code. A pairing lives
//! in the connection of the daemon that holds the account's lease: each
//! operation is performed there (the adapter forwards it), and starting
//! one on an account no daemon holds takes its lease here.

use super::error::{ApiError, Kind};
use super::Service;
use super::{Allowed, Done, Operation};
use crate::gateway::pairing_view::PairingView;
use herald_actors::domain::{AccountId, Role};

pub static START: Operation = Operation::new("startPairing", Role::Admin).forwarded();
pub static STATE: Operation = Operation::read("getPairing", Role::Admin).forwarded();
pub static QR_PNG: Operation = Operation::read("getPairingQr", Role::Admin).forwarded();

#[cfg(feature = "whatsapp")]
pub use imp::Pairing;

#[cfg(feature = "whatsapp")]
mod imp {
    use super::*;
    use crate::gateway::whatsapp::pairing::PairingError;
    use crate::gateway::whatsapp::WhatsappGateway;
    use crate::service::owner::{Owner, Owners};
    use herald_actors::domain::{Account, GatewayKind};
    use herald_actors::ports::Store;

    /// What pairing needs: the account's row, who holds it, and the
    /// WhatsApp connections here.
    pub struct Pairing<'a> {
        store: &'a dyn Store,
        owners: Owners<'a>,
        whatsapp: &'a WhatsappGateway,
    }

    impl<'a> Pairing<'a> {
        pub fn of(service: &'a Service) -> Self {
            let state = &service.state;
            Self {
                store: state.store.as_ref(),
                owners: Owners::of(service),
                whatsapp: &state.whatsapp,
            }
        }

        /// Starts pairing `id`: by QR, or by pair code with `phone`, on the
        /// daemon that holds the account's lease (taken here if no daemon
        /// holds it). Answers once WhatsApp has. `hop`: another daemon
        /// forwarded it here.
        pub async fn start(
            &self,
            allowed: Allowed,
            id: &AccountId,
            phone: Option<&str>,
            hop: bool,
        ) -> Result<Done<PairingView>, ApiError> {
            allowed.of(&START)?;
            let account = self.whatsapp_account(id).await?;
            if let Owner::Elsewhere { node, url } =
                self.owners.owner_or_claim(&account.id, hop).await?
            {
                return Ok(Done::Elsewhere {
                    node,
                    url,
                    path: format!("/v1/accounts/{id}/pair"),
                    body: Some(serde_json::json!({ "phone": phone })),
                    read: false,
                });
            }
            let phone = phone.filter(|p| !p.trim().is_empty());
            let view = self
                .whatsapp
                .start_pairing(&account, phone)
                .await
                .map_err(pairing_error)?;
            if view.state == "failed" {
                let reason = view.reason.unwrap_or_else(|| "pairing failed".into());
                return Err(ApiError::new(Kind::Unavailable, reason));
            }
            Ok(Done::Here(view))
        }

        /// The pairing's state, with the QR as terminal text while one
        /// waits to be scanned: the owner's, or as the store has it when
        /// no daemon holds the account.
        pub async fn state(
            &self,
            allowed: Allowed,
            id: &AccountId,
            hop: bool,
        ) -> Result<Done<PairingView>, ApiError> {
            allowed.of(&STATE)?;
            let account = self.whatsapp_account(id).await?;
            if let Some(there) = self.at_owner(&account.id, hop, "").await {
                return Ok(there);
            }
            Ok(Done::Here(self.whatsapp.pairing(&account).await))
        }

        /// The QR waiting to be scanned, as a PNG.
        pub async fn qr_png(
            &self,
            allowed: Allowed,
            id: &AccountId,
            hop: bool,
        ) -> Result<Done<Vec<u8>>, ApiError> {
            allowed.of(&QR_PNG)?;
            let account = self.whatsapp_account(id).await?;
            if let Some(there) = self.at_owner(&account.id, hop, "/qr.png").await {
                return Ok(there);
            }
            match self.whatsapp.qr_png(&account) {
                Some(png) => Ok(Done::Here(png)),
                None => Err(ApiError::new(
                    Kind::NotFound,
                    format!(
                        "account {id} has no QR code to scan: it is {}; POST \
                         /v1/accounts/{id}/pair starts pairing",
                        self.whatsapp.pairing(&account).await.state,
                    ),
                )),
            }
        }

        /// `GET …/pair{tail}` at the daemon holding `id`; `None` when this
        /// daemon holds it or none does (answered here from the store).
        async fn at_owner<T>(&self, id: &AccountId, hop: bool, tail: &str) -> Option<Done<T>> {
            let Ok(Owner::Elsewhere { node, url }) = self.owners.owner(id, hop).await else {
                return None;
            };
            Some(Done::Elsewhere {
                node,
                url,
                path: format!("/v1/accounts/{id}/pair{tail}"),
                body: None,
                read: true,
            })
        }

        async fn whatsapp_account(&self, id: &AccountId) -> Result<Account, ApiError> {
            let account = self
                .store
                .get_account(id)
                .await?
                .ok_or_else(|| ApiError::not_found(format!("account {id}")))?;
            if account.kind != GatewayKind::Whatsapp {
                return Err(ApiError::conflict(format!(
                    "account {id} is a {} account; only whatsapp accounts are paired",
                    account.kind
                )));
            }
            Ok(account)
        }
    }

    fn pairing_error(e: PairingError) -> ApiError {
        match e {
            PairingError::Invalid { field, rule } => ApiError::invalid(field, rule),
            e @ (PairingError::AlreadyPaired(_) | PairingError::NotWhatsapp(_)) => {
                ApiError::conflict(e.to_string())
            }
            e @ (PairingError::Unreachable(_) | PairingError::Elsewhere(_)) => {
                ApiError::new(Kind::Unavailable, e.to_string())
            }
            PairingError::Internal(why) => ApiError::internal("starting pairing failed", why),
        }
    }
}

/// A build without the `whatsapp` feature: every pairing operation is
/// refused as absent, after its role check.
#[cfg(not(feature = "whatsapp"))]
pub struct Pairing;

#[cfg(not(feature = "whatsapp"))]
impl Pairing {
    pub fn of(_: &Service) -> Self {
        Pairing
    }

    fn absent<T>(allowed: Allowed, op: &'static Operation) -> Result<Done<T>, ApiError> {
        allowed.of(op)?;
        Err(ApiError::new(
            Kind::NotFound,
            "this build of Herald has no WhatsApp gateway (built without the `whatsapp` feature)",
        ))
    }

    pub async fn start(
        &self,
        allowed: Allowed,
        _: &AccountId,
        _: Option<&str>,
        _: bool,
    ) -> Result<Done<PairingView>, ApiError> {
        Self::absent(allowed, &START)
    }

    pub async fn state(
        &self,
        allowed: Allowed,
        _: &AccountId,
        _: bool,
    ) -> Result<Done<PairingView>, ApiError> {
        Self::absent(allowed, &STATE)
    }

    pub async fn qr_png(
        &self,
        allowed: Allowed,
        _: &AccountId,
        _: bool,
    ) -> Result<Done<Vec<u8>>, ApiError> {
        Self::absent(allowed, &QR_PNG)
    }
}
