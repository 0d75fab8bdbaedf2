//! The handles `startup` builds, which the service layer (each operation
//! takes the part it needs) and the watchdog are given; request handlers
//! never see them. Kept apart from `startup` so those modules depend on
//! this small type, not on the code that builds them.

use crate::gateway::remote_sim::RemoteSimulator;
use crate::media::FileMedia;
use crate::metrics::PromMetrics;
use crate::settings::Settings;
use actix::prelude::*;
use herald_actors::delivery::engine::Engine;
use herald_actors::domain::AccountId;
use herald_actors::ports::{GatewayError, Store};
use herald_actors::scheduling::scheduler::SchedulerActor;
use herald_actors::simulator::Simulator;
use herald_actors::supervisor::Door;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The daemon's handles, whole.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Arc<dyn Store>,
    pub engine: Arc<Engine>,
    /// The way into the account actors.
    pub door: Door,
    pub scheduler: Addr<SchedulerActor>,
    /// The simulator inside this daemon. With `simulator.url` set it is
    /// not a gateway (the shared one is) and keeps no journal.
    pub simulator: Arc<Simulator>,
    /// The shared simulator process (`simulator.url`), when set: the
    /// gateway of every `simulator` account.
    pub remote_simulator: Option<Arc<RemoteSimulator>>,
    pub media: Arc<FileMedia>,
    pub groups: Arc<crate::groups::GroupDirectory>,
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<PromMetrics>,
    /// Serialises an edit's `If-Match` check with its write, so two
    /// operators editing one reminder or account cannot both win.
    pub edits: Arc<tokio::sync::Mutex<()>>,
    /// The bearer token `/v1` requires, used to forward a request to the
    /// daemon that owns an account (every daemon of a cluster shares it).
    pub control_token: Option<crate::settings::Secret>,
    /// Several daemons: this daemon's lease keeper, which takes a free
    /// account's lease on request (pairing).
    pub cluster: Option<Arc<herald_actors::cluster::Keeper>>,
    #[cfg(feature = "whatsapp")]
    pub whatsapp: crate::gateway::whatsapp::WhatsappGateway,
}

/// The simulator a simulated account belongs to: this daemon's, or the
/// shared one (`simulator.url`).
#[derive(Clone, Copy)]
pub struct Simulated<'a> {
    groups: usize,
    remote: Option<&'a RemoteSimulator>,
    local: &'a Simulator,
}

impl Simulated<'_> {
    /// The account in the configured number of numbered groups, registered
    /// twice or not.
    pub async fn register(&self, id: &AccountId) -> Result<(), GatewayError> {
        match self.remote {
            Some(remote) => remote.register(id, self.groups).await.map(drop),
            None => {
                self.local.add_numbered_groups(id, self.groups);
                Ok(())
            }
        }
    }
}

impl AppState {
    /// A simulated account belongs to the configured number of numbered
    /// groups (120363000000000001@g.us upwards): in this daemon's simulator,
    /// or registered with the shared one (which leaves an account it
    /// already knows as it is). Returns once the groups are there, so a
    /// group sync that follows lists them.
    pub async fn register_simulated(&self, id: &AccountId) -> Result<(), GatewayError> {
        self.simulated().register(id).await
    }

    /// Where simulated accounts are registered.
    pub fn simulated(&self) -> Simulated<'_> {
        Simulated {
            groups: self.settings.simulator.groups_per_account as usize,
            remote: self.remote_simulator.as_deref(),
            local: &self.simulator,
        }
    }
}
