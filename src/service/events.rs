//! The event log as a caller follows it: the stored events and the live
//! bus, subscribed together so nothing falls between the two.

use super::error::ApiError;
use super::Service;
use super::{Allowed, Operation};
use herald_actors::domain::{Event, Role};
use herald_actors::events::EventBus;
use herald_actors::ports::Store;
use std::sync::Arc;
use tokio::sync::broadcast;

pub static STREAM: Operation = Operation::read("streamEvents", Role::Viewer);

/// What following the events needs: the stored log and the live bus.
pub struct Events<'a> {
    store: &'a Arc<dyn Store>,
    bus: &'a EventBus,
}

/// A caller's view of the log: the store to replay from, and the live
/// events from the moment of subscribing.
pub struct Following {
    pub store: Arc<dyn Store>,
    pub live: broadcast::Receiver<Event>,
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
            store: self.store.clone(),
        })
    }
}
