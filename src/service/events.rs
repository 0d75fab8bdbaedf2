//! The event log as a caller follows it: the stored events and the live
//! bus, subscribed together so nothing falls between the two.

use super::error::ApiError;
use super::Service;
use super::{Allowed, Operation};
use herald_actors::domain::{Event, Role};
use herald_actors::events::EventBus;
use herald_actors::ports::{Store, StoreResult};
use std::sync::Arc;
use tokio::sync::broadcast;

pub static STREAM: Operation = Operation::read("streamEvents", Role::Viewer);

/// What following the events needs: the stored log and the live bus.
pub struct Events<'a> {
    store: &'a Arc<dyn Store>,
    bus: &'a EventBus,
}

/// A caller's view of the log: the stored events to replay from, and the
/// live events from the moment of subscribing.
pub struct Following {
    pub replay: Replay,
    pub live: broadcast::Receiver<Event>,
}

/// The stored event log, to read only: what a follower replays from.
#[derive(Clone)]
pub struct Replay {
    store: Arc<dyn Store>,
}

impl Replay {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    /// At most `limit` events with ids above `after`, oldest first.
    pub async fn after(&self, after: i64, limit: u32) -> StoreResult<Vec<Event>> {
        self.store.events_after(after, limit).await
    }

    /// The highest id retention has deleted (0 if none): a replay from
    /// below it has lost events.
    pub async fn pruned_through(&self) -> StoreResult<i64> {
        self.store.events_pruned_through().await
    }
}

impl<'a> Events<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: &state.store,
            bus: &state.engine.events,
        }
    }

    /// Subscribes to the live bus before the store is read, so an event
    /// committed in between is in one or the other.
    pub fn follow(&self, allowed: Allowed) -> Result<Following, ApiError> {
        allowed.of(&STREAM)?;
        Ok(Following {
            live: self.bus.subscribe(),
            replay: Replay::new(self.store.clone()),
        })
    }
}
