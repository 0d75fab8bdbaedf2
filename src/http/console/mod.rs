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
//! - Writes go through the same functions the `/v1` handlers do: the
//!   service layer's typed operations where an action has one (run
//!   controls), else the `/v1` handler with its JSON answer read back, so
//!   no rule exists twice.
//!
//! Imports: `http` (the API's handlers, errors and authority it builds on),
//! `service` (the operations its actions perform), `state`, `token`, and of the core `herald_actors::domain`,
//! `herald_actors::ports::store`, `herald_actors::delivery::outcome` and
//! `herald_actors::scheduling::scheduler::due`.

/// A console button that runs one `/v1` handler taken with the path's id:
/// the form is checked (session CSRF, same origin), then the handler runs;
/// on success the browser goes to `$to(id, answer)`, on a refusal it gets
/// the page that says why, with a link back to `$back/{id}`.
macro_rules! button_action {
    ($name:ident, $handler:path, $nav:expr, $noun:literal, $back:literal, $to:expr) => {
        pub(super) async fn $name(
            state: actix_web::web::Data<crate::state::AppState>,
            req: actix_web::HttpRequest,
            crate::http::console::Signed(s): crate::http::console::Signed,
            path: actix_web::web::Path<String>,
            body: actix_web::web::Bytes,
        ) -> Result<actix_web::HttpResponse, crate::http::errors::ApiError> {
            crate::http::console::post_form(&req, &s, &body).await?;
            let id = path.into_inner();
            let to: fn(&str, &serde_json::Value) -> String = $to;
            let answer =
                crate::http::console::api($handler(state, actix_web::web::Path::from(id.clone())))
                    .await;
            Ok(match answer {
                Ok(v) => crate::http::console::see_other(&to(&id, &v)),
                Err(e) => crate::http::console::layout::refused(
                    &s,
                    $nav,
                    &format!(concat!($noun, " {}"), id),
                    &e,
                    &format!(concat!($back, "/{}"), id),
                ),
            })
        }
    };
}

mod accounts;
mod hooks;
mod layout;
mod overview;
mod people;
mod reminders;
mod request;
mod routes;
mod runs;
pub mod session;
mod sign;

pub use request::{api, check_post, post_form, see_other, with_location, Form, Signed};
pub use routes::{configure, console_gate, ConsoleRoute, CONSOLE_ROUTES};

pub use session::{Session, Sessions};
