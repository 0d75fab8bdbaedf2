//! The PostgreSQL server tests create scratch databases on.

use std::io::Write as _;

/// `HERALD_TEST_POSTGRES_URL`, or `None` with the skip said where a test
/// run shows it; with `HERALD_REQUIRE_POSTGRES=1` (CI) a skip fails.
pub fn base(test: &str) -> Option<String> {
    let base = std::env::var("HERALD_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty());
    if base.is_none() {
        assert!(
            std::env::var("HERALD_REQUIRE_POSTGRES").map_or(true, |v| v != "1"),
            "HERALD_REQUIRE_POSTGRES=1 but HERALD_TEST_POSTGRES_URL is not set"
        );
        // Written to the stderr handle itself: libtest captures eprintln!,
        // and a skip nobody sees looks like a pass.
        writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: set HERALD_TEST_POSTGRES_URL (e.g. \
             postgres://postgres@127.0.0.1:5432/test) to run it on PostgreSQL"
        )
        .ok();
    }
    base
}
