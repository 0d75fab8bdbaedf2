//! The OpenAPI document against the real daemon: schemathesis generates
//! requests from `/openapi.json` (examples, coverage, fuzzing and stateful
//! phases, every check) and must find nothing.
//!
//! Without schemathesis on PATH the test says it skipped and passes, unless
//! `HERALD_REQUIRE_SCHEMATHESIS=1` (as `.ci/run` sets), then it fails.
//! Where a check cannot apply, `tests/schemathesis/schemathesis.toml` says
//! so and why.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Cases per operation and phase; with ~30 operations the run generates
/// about 3,000 cases in a little over a minute.
const MAX_EXAMPLES: &str = "20";
/// A fixed seed: a failure found in CI is found again locally.
/// `HERALD_SCHEMATHESIS_SEED` runs another (a search beyond CI's).
const SEED: &str = "20261123";
const TOKEN: &str = "schemathesis-token-7d2e-0a9b";

use crate::common::net;
use net::free_port;

struct Daemon(Child, std::path::PathBuf);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        // No way out of Herald may panic, the fuzzer's included.
        let log = std::fs::read_to_string(&self.1).unwrap_or_default();
        if log.contains("panicked") && !std::thread::panicking() {
            panic!("herald serve panicked:\n{log}");
        }
    }
}

fn start_daemon(dir: &Path, port: u16) -> Daemon {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.arg("serve");
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") || k.starts_with("BOT_") || k == "NOTIFY_SOCKET" {
            cmd.env_remove(k);
        }
    }
    let log = std::fs::File::create(dir.join("herald.log")).unwrap();
    cmd.env("HERALD_STORAGE__DATA_DIR", dir)
        .env("HERALD_CONTROL__LISTEN", format!("127.0.0.1:{port}"))
        .env("HERALD_CONTROL__TOKEN", TOKEN)
        // The fuzzer is a flood by design; the rate limit has its own
        // black-box test (tests/suite/api/limits.rs). Kept on, high enough that
        // this run stays clear of it.
        .env("HERALD_CONTROL__RATE_LIMIT_PER_SECOND", "100000")
        .env("HERALD_CONTROL__RATE_LIMIT_BURST", "100000")
        // Its event streams close at its request timeout: one caller holds
        // many at once, as many as the port allows in all (the per-caller
        // cap has its own test, http::limits).
        .env("HERALD_CONTROL__MAX_EVENT_STREAMS_PER_CALLER", "64")
        .env("HERALD_SIMULATOR__LATENCY_MIN_MS", "1")
        .env("HERALD_SIMULATOR__LATENCY_MAX_MS", "5")
        .env("HERALD_DELIVERY__JITTER_MIN_MS", "0")
        .env("HERALD_DELIVERY__JITTER_MAX_MS", "5")
        .env("HERALD_LOG__FILTER", "warn")
        .stdout(Stdio::null())
        .stderr(log);
    let daemon = Daemon(cmd.spawn().expect("herald starts"), dir.join("herald.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = write!(
                s,
                "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            );
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            if text.starts_with("HTTP/1.1 200") {
                return daemon;
            }
        }
        assert!(Instant::now() < deadline, "herald did not become ready");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn schemathesis() -> Option<String> {
    ["schemathesis", "st"].into_iter().find_map(|name| {
        Command::new(name)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| name.to_owned())
    })
}

#[test]
fn schemathesis_finds_nothing() {
    let Some(st) = schemathesis() else {
        if std::env::var("HERALD_REQUIRE_SCHEMATHESIS").as_deref() == Ok("1") {
            panic!("schemathesis is not installed and HERALD_REQUIRE_SCHEMATHESIS=1");
        }
        println!("skipped: schemathesis not installed");
        return;
    };
    let seed = std::env::var("HERALD_SCHEMATHESIS_SEED").unwrap_or_else(|_| SEED.to_owned());
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _daemon = start_daemon(dir.path(), port);
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/schemathesis/schemathesis.toml"
    );
    let out = Command::new(&st)
        .current_dir(dir.path())
        .args(["--no-color", "--config-file", config, "run"])
        .arg(format!("http://127.0.0.1:{port}/openapi.json"))
        .args(["--checks", "all"])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--max-examples", MAX_EXAMPLES, "--seed", &seed])
        // One worker: with two, hypothesis' lambda descriptions race in
        // CPython's ast module ("AST constructor recursion depth mismatch"),
        // an error in the tool, not in the daemon.
        .args(["--workers", "1", "--request-timeout", "10"])
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .output()
        .expect("schemathesis runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The closing summary: the count of cases and the last line.
    let summary: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" generated") || (l.starts_with("===") && l.contains(" in ")))
        .map(str::trim)
        .collect();
    // Straight to stderr, past the test harness' capture: CI's log shows
    // the line on success too.
    let _ = writeln!(
        std::io::stderr(),
        "schemathesis (seed {seed}): {}",
        summary.join(" / ")
    );
    if !out.status.success() {
        let log = std::fs::read_to_string(dir.path().join("herald.log")).unwrap_or_default();
        panic!(
            "schemathesis found failures (exit {:?}):\n{stdout}\n{stderr}\n--- herald log ---\n{log}",
            out.status.code()
        );
    }
    let generated = cases_generated(&stdout);
    assert!(
        generated >= 1000,
        "only {generated} cases generated; raise MAX_EXAMPLES\n{stdout}"
    );
}

/// "Test cases: 1234 generated, …" → 1234.
fn cases_generated(stdout: &str) -> u64 {
    stdout
        .lines()
        .filter_map(|l| l.split_once(" generated"))
        .filter_map(|(head, _)| head.split_whitespace().last()?.parse().ok())
        .max()
        .unwrap_or(0)
}
