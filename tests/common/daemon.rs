//! Real child processes for tests: `herald serve` with its own port and
//! data dir, and the shared `herald simulator serve`. Settings come only
//! from the test (never the developer's shell), output goes to a file
//! printed when a test fails, and a panicking test kills them.

#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const DRAIN_GRACE_SECS: u64 = 10;

use crate::common::net;
/// A port nobody listens on right now (the daemon binds it a moment later).
pub use net::free_port;

/// A minimal HTTP/1.1 GET: no client dependency, and a hung daemon shows up
/// as `None` after the timeouts rather than as a stuck test.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http(port, "GET", path, None).map(|(status, _, body)| (status, body))
}

/// One request without a body, with a bearer token if given: (status,
/// head, body).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Option<(u16, String, String)> {
    let auth = token.map(|t| format!("Authorization: Bearer {t}"));
    request(port, method, path, auth.as_slice(), "")
}

/// One request with extra header lines (`Name: value`) and a body:
/// (status, head, body).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[String],
    body: &str,
) -> Option<(u16, String, String)> {
    let addr = ([127, 0, 0, 1], port).into();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((status, head.to_owned(), body.to_owned()))
}

/// One API call with a bearer token and, when given, a JSON body: (status,
/// the answer as JSON, or null where it is not JSON). Panics when nothing
/// answers, naming the call.
pub fn call_json(
    port: u16,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut headers = vec![format!("Authorization: Bearer {token}")];
    let body = body.map(serde_json::Value::to_string).unwrap_or_default();
    if !body.is_empty() {
        headers.push("Content-Type: application/json".into());
    }
    let (status, _, text) = request(port, method, path, &headers, &body)
        .unwrap_or_else(|| panic!("{method} {path}: no answer on port {port}"));
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// The binary under test. HERALD_TEST_BIN: a copy of it, so a long series
/// of runs is not switched to a newer build halfway.
pub fn herald_bin() -> String {
    std::env::var("HERALD_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_herald").to_owned())
}

/// The last line `herald args…` (a benchmark) printed; fails with its
/// output unless it exited 0.
pub fn bench_line(args: &[&str]) -> String {
    let out = herald()
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "herald {}: {}\n{stdout}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().last().unwrap_or_default().to_owned()
}

/// The number after `key=` in a benchmark's line.
pub fn figure(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in: {line}"))
}

/// `herald` with no HERALD_ / BOT_ / systemd settings from the developer's
/// shell: a test's settings are the test's own.
pub fn herald() -> Command {
    let mut cmd = Command::new(herald_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_")
            || k.starts_with("BOT_")
            || k.starts_with("WATCHDOG_")
            || k == "NOTIFY_SOCKET"
        {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Sends a signal by name (`kill` avoids a libc/nix dependency).
pub fn signal(child: &Child, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} failed");
}

/// The child's exit status once it has ended; `None` if it still runs
/// after `within`.
pub fn exited(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first line a child with piped stdout prints, read on a thread so a
/// process that never prints fails the test instead of hanging it; empty
/// if nothing came within `within`.
pub fn first_line(child: &mut Child, within: Duration) -> String {
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(within).unwrap_or_default()
}

pub struct Daemon {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `herald serve` on `dir` with a fresh port and extra env.
    pub fn start(dir: &Path, env: &[(&str, String)]) -> Daemon {
        std::fs::create_dir_all(dir).unwrap();
        let port = free_port();
        let log = dir.join(format!("herald-{port}.log"));
        let mut cmd = herald();
        cmd.arg("serve");
        cmd.env("HERALD_STORAGE__DATA_DIR", dir)
            .env("HERALD_CONTROL__LISTEN", format!("127.0.0.1:{port}"))
            // Every daemon a test starts runs on this host: in cluster mode
            // the others reach it on loopback, which must be said.
            .env(
                "HERALD_CLUSTER__ADVERTISE_URL",
                format!("http://127.0.0.1:{port}"),
            )
            .env(
                "HERALD_DELIVERY__DRAIN_GRACE_SECS",
                DRAIN_GRACE_SECS.to_string(),
            )
            // The simulated WhatsApp must not be what limits the pace here.
            .env("HERALD_SIMULATOR__RATE_LIMIT_PER_MINUTE", "100000")
            .env("HERALD_LOG__FILTER", "info,sqlx=warn,actix_server=warn")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("starting herald serve");
        Daemon { child, port, log }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    /// Polls /healthz until it answers 200, failing fast if the process dies.
    pub fn wait_healthy(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "herald exited with {status} during start-up\n{}",
                    self.logs()
                );
            }
            if matches!(self.get("/healthz"), Some((200, _))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "/healthz did not answer within {within:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A real SIGTERM, as systemd sends it.
    pub fn term(&self) {
        self.signal("TERM");
    }

    /// Sends a signal by name: TERM, STOP, CONT.
    pub fn signal(&self, name: &str) {
        signal(&self.child, name);
    }

    /// SIGTERM; it must drain and exit 0 within 30 s.
    pub fn stop(mut self) {
        self.term();
        let status = self.wait_exit(Duration::from_secs(30));
        assert_eq!(status.code(), Some(0), "{}", self.logs());
    }

    /// SIGKILL: std's `Child::kill` sends exactly that.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        exited(&mut self.child, within).unwrap_or_else(|| {
            panic!(
                "herald still running {within:?} after the signal\n{}",
                self.logs()
            )
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A failed assertion must not leave a daemon behind.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        assert_no_panic(&self.logs(), "herald serve");
    }
}

/// Fails the test when a process's output shows a panic: no way out of
/// Herald (a refusal at start-up, an error at run time, a shutdown) may
/// panic. Quiet while the test is failing already.
pub fn assert_no_panic(output: &str, who: &str) {
    if output.contains("panicked") && !std::thread::panicking() {
        panic!("{who} panicked:\n{output}");
    }
}

// ------------------------------------------------------------ the shared simulator

/// A `herald simulator serve` child on a port it picked itself.
pub struct SimProcess {
    pub child: Child,
    pub port: u16,
    pub journal: PathBuf,
    pub log: PathBuf,
}

impl SimProcess {
    pub fn start(dir: &Path, flags: &[&str]) -> SimProcess {
        std::fs::create_dir_all(dir).unwrap();
        let journal = dir.join("journal.jsonl");
        let log = dir.join("simulator.log");
        let mut child = herald()
            .args(["simulator", "serve", "--listen", "127.0.0.1:0", "--journal"])
            .arg(&journal)
            .args(flags)
            .env("HERALD_LOG__FILTER", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting herald simulator serve");
        // The one line on stdout names the port.
        let line = first_line(&mut child, Duration::from_secs(60));
        let port = line
            .trim()
            .strip_prefix("simulator: listening on 127.0.0.1:")
            .and_then(|p| p.parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            panic!(
                "no listening line (got {line:?})\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        SimProcess {
            child,
            port,
            journal,
            log,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn client(&self) -> herald::gateway::remote_sim::RemoteSimulator {
        herald::gateway::remote_sim::RemoteSimulator::new(&self.url()).unwrap()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM; it must exit 0 promptly.
    pub fn stop(mut self) {
        signal(&self.child, "TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "still running 15 s after SIGTERM\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0), "{}", self.logs());
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `done` every 100 ms for up to `within`, failing with `what`.
pub fn wait_until(
    within: Duration,
    what: &str,
    nodes: &mut [&mut Daemon],
    mut done: impl FnMut() -> bool,
) -> Duration {
    wait_until_says(within, what, nodes, || {
        done().then_some(()).ok_or_else(String::new)
    })
}

/// [`wait_until`] whose check says what it last saw (`Err`), which a
/// failure prints before the daemons' logs.
pub fn wait_until_says(
    within: Duration,
    what: &str,
    nodes: &mut [&mut Daemon],
    mut done: impl FnMut() -> Result<(), String>,
) -> Duration {
    let start = Instant::now();
    loop {
        let last = match done() {
            Ok(()) => return start.elapsed(),
            Err(saw) => saw,
        };
        for d in nodes.iter_mut() {
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!(
                    "a daemon exited with {status} while waiting for {what}\n{}",
                    d.logs()
                );
            }
        }
        if start.elapsed() > within {
            let logs: Vec<String> = nodes.iter().map(|d| d.logs()).collect();
            panic!(
                "no {what} within {within:?}\n{last}\n{}",
                logs.join("\n-----\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
