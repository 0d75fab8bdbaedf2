//! Outside tools a test drives (promtool, valgrind, …): present, or the
//! test is skipped with a line saying so, or fails where CI requires it.

use std::io::Write as _;
use std::process::{Command, Stdio};

/// Whether `cmd args…` runs; if not, skip (saying so) or fail when
/// `HERALD_REQUIRE_<require>=1`.
pub fn have(test: &str, require: &str, cmd: &str, args: &[&str]) -> bool {
    let ok = Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let var = format!("HERALD_REQUIRE_{require}");
        assert!(
            std::env::var(&var).as_deref() != Ok("1"),
            "{test}: `{cmd} {}` does not run and {var}=1",
            args.join(" ")
        );
        // To the stderr handle itself: libtest captures eprintln!, and a
        // skip nobody sees looks like a pass.
        writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: `{cmd}` is not installed (.ci/run installs it)"
        )
        .ok();
    }
    ok
}
