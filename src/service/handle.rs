//! The handle adapters hold to perform operations.

use crate::settings::{ControlSettings, Secret};
use crate::state::AppState;

/// What an adapter holds: the way to each family of operations
/// (`Runs::of(&service)`, …) and the few settings an adapter reads for
/// itself. The handles the operations are given (the store, the actors,
/// the gateways) stay inside `service`, so a handler that wanted to
/// reach the store past an operation's check has no way to.
#[derive(Clone)]
pub struct Service {
    /// Seen by the operations' modules only (`of`), never by an adapter.
    pub(super) state: AppState,
}

impl Service {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    /// The control port's settings (its address, hosts, limits, proxies).
    /// Adapters see no other part of the settings: not the database URL,
    /// the session key's file or the webhook proxy's credentials.
    pub fn control(&self) -> &ControlSettings {
        &self.state.settings.control
    }

    /// Whether this daemon is one of a cluster (`cluster.enabled`): only
    /// then is a request another daemon forwarded honoured.
    pub fn clustered(&self) -> bool {
        self.state.settings.cluster.enabled
    }

    /// `media.max_bytes`: the largest picture an upload may carry.
    pub fn max_picture_bytes(&self) -> u64 {
        self.state.settings.media.max_bytes
    }

    /// `recall.window_secs`: how long after a run's end WhatsApp lets it
    /// be recalled.
    pub fn recall_window_secs(&self) -> u64 {
        self.state.settings.recall.window_secs
    }

    /// The bearer token this daemon sends with a request it forwards to
    /// the account's owner (every daemon of a cluster shares it).
    pub fn control_token(&self) -> Option<&Secret> {
        self.state.control_token.as_ref()
    }

    /// Whether `node` is a live daemon of this cluster: its registration
    /// in the shared store has not expired. Only such a daemon forwards
    /// requests here.
    pub async fn is_live_peer(&self, node: &str) -> Result<bool, super::error::ApiError> {
        Ok(self
            .state
            .store
            .live_nodes()
            .await?
            .iter()
            .any(|n| n.node == node))
    }

    /// This daemon's name in its cluster, `None` alone.
    pub fn node(&self) -> Option<&str> {
        self.state.engine.leases.as_ref().map(|t| t.node())
    }
}
