//! The handle adapters hold to perform operations.

use crate::settings::{Secret, Settings};
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

    pub fn settings(&self) -> &Settings {
        &self.state.settings
    }

    /// The bearer token this daemon sends with a request it forwards to
    /// the account's owner (every daemon of a cluster shares it).
    pub fn control_token(&self) -> Option<&Secret> {
        self.state.control_token.as_ref()
    }

    /// This daemon's name in its cluster, `None` alone.
    pub fn node(&self) -> Option<&str> {
        self.state.engine.leases.as_ref().map(|t| t.node())
    }
}
