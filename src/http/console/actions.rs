//! What a console user's role lets them do. Every console route that acts
//! (each POST, and the pairing pages, which show a QR code that links a
//! phone) is mapped to the `/v1` operation it performs, so the role it
//! needs and the operation it is logged as come from the one route table;
//! a POST not in the map needs admin (fail closed).

use super::session::Session;
use crate::http::routes::{self, match_pattern};
use herald_actors::domain::Role;

/// (console method, console path, `/v1` method, `/v1` path).
pub const ACTIONS: &[(&str, &str, &str, &str)] = &[
    ("POST", "/accounts", "POST", "/v1/accounts"),
    (
        "POST",
        "/accounts/{id}/enable",
        "POST",
        "/v1/accounts/{id}/enable",
    ),
    (
        "POST",
        "/accounts/{id}/disable",
        "POST",
        "/v1/accounts/{id}/disable",
    ),
    (
        "POST",
        "/accounts/{id}/limits",
        "PATCH",
        "/v1/accounts/{id}",
    ),
    (
        "POST",
        "/accounts/{id}/pair",
        "POST",
        "/v1/accounts/{id}/pair",
    ),
    (
        "GET",
        "/accounts/{id}/pair",
        "GET",
        "/v1/accounts/{id}/pair",
    ),
    (
        "GET",
        "/accounts/{id}/pair/state",
        "GET",
        "/v1/accounts/{id}/pair",
    ),
    (
        "GET",
        "/accounts/{id}/pair/qr.png",
        "GET",
        "/v1/accounts/{id}/pair/qr.png",
    ),
    ("POST", "/reminders", "POST", "/v1/reminders"),
    ("POST", "/reminders/{id}", "PUT", "/v1/reminders/{id}"),
    (
        "POST",
        "/reminders/{id}/pause",
        "POST",
        "/v1/reminders/{id}/pause",
    ),
    (
        "POST",
        "/reminders/{id}/resume",
        "POST",
        "/v1/reminders/{id}/resume",
    ),
    (
        "POST",
        "/reminders/{id}/archive",
        "DELETE",
        "/v1/reminders/{id}",
    ),
    (
        "POST",
        "/reminders/{id}/fire",
        "POST",
        "/v1/reminders/{id}/fire",
    ),
    ("POST", "/media", "POST", "/v1/media"),
    ("POST", "/runs/{id}/stop", "POST", "/v1/runs/{id}/stop"),
    ("POST", "/runs/{id}/pause", "POST", "/v1/runs/{id}/pause"),
    ("POST", "/runs/{id}/resume", "POST", "/v1/runs/{id}/resume"),
    ("POST", "/runs/{id}/retry", "POST", "/v1/runs/{id}/retry"),
    ("GET", "/users", "GET", "/v1/users"),
    ("POST", "/users", "POST", "/v1/users"),
    ("POST", "/users/{id}/revoke", "DELETE", "/v1/users/{id}"),
    ("GET", "/audit", "GET", "/v1/audit"),
    ("GET", "/webhooks", "GET", "/v1/webhooks"),
    ("POST", "/webhooks", "POST", "/v1/webhooks"),
    ("GET", "/webhooks/{id}", "GET", "/v1/webhooks/{id}"),
    (
        "POST",
        "/webhooks/{id}/ping",
        "POST",
        "/v1/webhooks/{id}/ping",
    ),
    (
        "POST",
        "/webhooks/{id}/enable",
        "PATCH",
        "/v1/webhooks/{id}",
    ),
    (
        "POST",
        "/webhooks/{id}/disable",
        "PATCH",
        "/v1/webhooks/{id}",
    ),
    (
        "POST",
        "/webhooks/{id}/delete",
        "DELETE",
        "/v1/webhooks/{id}",
    ),
];

/// Routes anyone may call, signed in or not.
const FREE: &[&str] = &["/sign-in", "/sign-out"];

/// What a console request needs: the operation it is logged as, the
/// least role, whether it writes, and the ids in its path.
pub fn needs(method: &str, path: &str) -> Option<(&'static str, Role, bool, Vec<String>)> {
    for (m, pattern, v1_method, v1_path) in ACTIONS {
        if *m != method {
            continue;
        }
        if let Some(ids) = match_pattern(pattern, path) {
            let route = routes::find(v1_method, v1_path)
                .expect("every console action names a /v1 route (tested)");
            let role = route.role.unwrap_or(Role::Admin);
            let ids = ids.into_iter().map(str::to_owned).collect();
            return Some((route.op.id, role, route.writes(), ids));
        }
    }
    (method == "POST" && !FREE.contains(&path))
        .then(|| ("consoleAction", Role::Admin, true, vec![]))
}

/// The signed-in user's role allows `method path`.
pub fn may(s: &Session, method: &str, path: &str) -> bool {
    needs(method, path).is_none_or(|(_, needed, _, _)| s.user.role.allows(needed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_console_action_names_a_v1_route() {
        for (_, pattern, m, p) in ACTIONS {
            assert!(routes::find(m, p).is_some(), "{pattern} → {m} {p}");
        }
        assert_eq!(
            needs("POST", "/reminders/7/fire").unwrap().1,
            Role::Operator
        );
        assert_eq!(needs("POST", "/accounts/a1/limits").unwrap().1, Role::Admin);
        assert_eq!(
            needs("GET", "/accounts/a1/pair/qr.png").unwrap().1,
            Role::Admin
        );
        assert_eq!(needs("GET", "/reminders/7"), None, "pages read");
        assert_eq!(needs("POST", "/sign-out"), None);
        // A POST nobody mapped needs admin.
        assert_eq!(needs("POST", "/something/new").unwrap().1, Role::Admin);
        let (op, _, writes, ids) = needs("POST", "/reminders/7/archive").unwrap();
        assert_eq!(
            (op, writes, ids),
            ("archiveReminder", true, vec!["7".to_owned()])
        );
    }
}
