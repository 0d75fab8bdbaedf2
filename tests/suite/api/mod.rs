//! Black-box tests of the control port: each test starts the daemon on
//! port 0 with a fresh database and the simulator, and drives it over HTTP.

mod accounts;
mod auth;
mod authority;
mod browser;
mod charts;
mod concurrency;
mod console;
mod console_browser;
mod errors;
mod events;
mod exports;
// The fake WhatsApp Web server: the console's pair-code test pairs a real
// client against it.
use herald_fake_whatsapp as fake_whatsapp;
mod flow;
mod groups;
mod helpers;
mod limits;
mod media;
mod openapi;
mod paging;
mod pairing;
mod preflight;
mod reminders;
mod roles;
mod runs;
mod schema;
mod selectors;
mod webhooks;
