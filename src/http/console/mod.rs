//! The web console: server-rendered pages at `/` on the control port, for
//! the operator who keeps Herald open in a browser all day.
//!
//! - Pages are maud templates over plain view values; the one script
//!   (`assets/console.js`) only follows `/v1/events` and refreshes the
//!   live parts. Every asset is compiled into the binary.
//! - Sign-in takes the daemon's token once and opens a server-side
//!   session (`session`); every page needs one, and every form carries
//!   the session's CSRF token, checked with the cross-site rules of `/v1`
//!   (`browser::check_same_origin`) on every POST.
//! - An action performs a service operation (`crate::service`), the same
//!   typed function its `/v1` handler calls, with the proof of the role
//!   check its route minted; a form's fields are read by the API's own
//!   request rules first. None reads JSON back, and no rule exists twice.
//! - A page reads through the service too, with its route's proof: that
//!   of the `/v1` operation it shows (a run's page is `getRun`), or, for a
//!   page of its own (the overview, the reminders' list), of a read of its
//!   own name. A handler holds the `Service` handle, never the store;
//!   only the session store (`session`) reads who signed in.
//!
//! Imports: `http` (the API's request rules, errors and authority it builds on),
//! `service` (the operations its pages and actions perform), `token`,
//! `settings` (the daemon token's secret, which a session is bound to),
//! `export` (a run's groups as CSV), and of
//! the core `herald_actors::domain`, `herald_actors::ports::store`,
//! `herald_actors::delivery::outcome`,
//! `herald_actors::scheduling::preflight` and
//! `herald_actors::scheduling::scheduler::due`.

mod accounts;
mod charts;
mod hooks;
mod layout;
mod overview;
mod people;
mod polls;
mod reminders;
mod request;
mod routes;
mod runs;
pub mod session;
mod sign;

pub use request::{check_post, post_form, see_other, with_location, Form, Signed};
pub use routes::{configure, console_gate, ConsoleRoute, CONSOLE_ROUTES};

pub use session::{Session, Sessions};
