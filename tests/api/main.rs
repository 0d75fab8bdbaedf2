//! Black-box tests of the control port: each test starts the daemon on
//! port 0 with a fresh database and the simulator, and drives it over HTTP.

mod accounts;
mod auth;
mod browser;
mod concurrency;
mod errors;
mod events;
mod flow;
mod helpers;
mod media;
mod openapi;
mod reminders;
mod runs;
mod schema;
