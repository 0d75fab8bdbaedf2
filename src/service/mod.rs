//! The operations the daemon performs for its callers, typed: each takes
//! typed input and answers a typed value or an [`error::ApiError`]. The
//! `/v1` handlers, the console's buttons and a request another daemon
//! forwarded are adapters over the same function, so a rule exists once.
//!
//! Each operation is declared as an [`Operation`]: its id (the OpenAPI
//! operationId and the audit log's name) and the least role that may
//! perform it. Its function takes an [`Allowed`], which only
//! [`Operation::allow`] makes and which names the operation it was made
//! for: no adapter can call an operation without its check, nor with the
//! check of another.
//!
//! Imports: `state` (the handles an operation is given a part of),
//! `settings`, `token` (user tokens), `webhooks` (a target's address rules,
//! secrets), `groups` (the directory and its sync), `media` (the picture
//! files), `gateway::whatsapp` (a WhatsApp account's pairing and login),
//! `gateway::pairing_view`, `metrics` (the open metrics route's
//! series), `telemetry` (the slow database waits it counts), and of the core `herald_actors::domain`,
//! `herald_actors::ports`, `herald_actors::events`, `herald_actors::delivery`,
//! `herald_actors::messages`, `herald_actors::scheduling`,
//! `herald_actors::cluster` and
//! `herald_actors::supervisor`.

pub mod accounts;
pub mod audit;
pub mod error;
pub mod events;
pub mod groups;
mod handle;
pub mod health;
pub mod history;
pub mod media;
mod operation;
mod owner;
pub mod pairing;
pub mod polls;
pub mod reminders;
pub mod runs;
pub mod timeline;
pub mod upcoming;
pub mod users;
pub mod version;
pub mod webhooks;

pub use handle::Service;
pub use operation::{Allowed, Done, Operation};

/// Every operation of the service layer: each is performed by exactly one
/// `/v1` route (`http::routes`' test holds the adapters to this).
pub static OPERATIONS: &[&Operation] = &[
    &accounts::CREATE,
    &accounts::PATCH,
    &accounts::ENABLE,
    &accounts::DISABLE,
    &accounts::DELETE,
    &accounts::LIST,
    &accounts::GET,
    &groups::LIST,
    &groups::SYNC,
    &groups::RESOLVE,
    &groups::SET_LABELS,
    &media::UPLOAD,
    &media::GET,
    &pairing::START,
    &pairing::STATE,
    &pairing::QR_PNG,
    &events::STREAM,
    &reminders::CREATE,
    &reminders::REPLACE,
    &reminders::PAUSE,
    &reminders::RESUME,
    &reminders::ARCHIVE,
    &reminders::FIRE,
    &reminders::LIST,
    &reminders::GET,
    &reminders::FORECAST,
    &reminders::PREVIEW,
    &runs::STOP,
    &runs::PAUSE,
    &runs::RESUME,
    &runs::RETRY,
    &runs::RECALL,
    &runs::EDIT,
    &runs::LIST,
    &runs::GET,
    &runs::TARGETS,
    &polls::POLL,
    &timeline::TIMELINE,
    &history::HISTORY,
    &upcoming::UPCOMING,
    &users::CREATE,
    &users::REVOKE,
    &users::LIST,
    &users::GET,
    &webhooks::CREATE,
    &webhooks::PATCH,
    &webhooks::DELETE,
    &webhooks::ROTATE_SECRET,
    &webhooks::PING,
    &webhooks::RETRY,
    &webhooks::LIST,
    &webhooks::GET,
    &webhooks::DELIVERIES,
    &audit::LIST,
];

#[cfg(test)]
mod tests {
    use super::*;
    use error::Kind;
    use herald_actors::domain::Role;

    static A: Operation = Operation::new("opA", Role::Operator);
    static B: Operation = Operation::new("opB", Role::Viewer);

    #[test]
    fn a_proof_is_made_only_for_a_role_the_operation_allows() {
        assert!(A.allow(Role::Viewer).is_err());
        let e = A.allow(Role::Viewer).unwrap_err();
        assert_eq!(e.kind, Kind::NeedsRole);
        assert!(
            e.detail.contains("opA needs the operator role"),
            "{}",
            e.detail
        );
        assert!(A.allow(Role::Operator).is_ok());
        assert!(A.allow(Role::Admin).is_ok());
    }

    #[test]
    fn a_proof_for_one_operation_does_not_open_another() {
        let b = B.allow(Role::Admin).unwrap();
        assert!(b.of(&B).is_ok());
        assert_eq!(b.of(&A).unwrap_err().kind, Kind::Internal);
    }
}
