//! Herald's image under podman, as an operator runs it.
//!
//! The image is built from deploy/Containerfile's `prebuilt` target on a
//! Debian base made here (`debootstrap --variant=minbase bookworm`, then
//! `podman import`; the root file system is kept under target/ and the
//! image in podman's store, so later runs reuse both). The binary is the
//! debug build `cargo test` has already made (`CARGO_BIN_EXE_herald`,
//! stripped of its debug info): CI has no time for a release build, and
//! the image's own build stage makes the release binary for operators.
//!
//! One container: refused without a token; with one, it answers /readyz
//! (the time from `podman run` is printed), its HEALTHCHECK passes, a
//! simulated fan-out goes out through the port, `herald backup` works
//! inside it, and SIGTERM stops it cleanly. Then two containers in cluster
//! mode on the host's PostgreSQL and a shared simulated WhatsApp: one is
//! SIGKILLed mid-run, the other finishes every run, and the simulator's
//! journal has every group exactly once.
//!
//! This machine's podman needs `--runtime runc --cgroup-manager=cgroupfs`
//! and explicit ulimits; they are here, not in the image. Without podman
//! the tests say they skipped, unless `HERALD_REQUIRE_PODMAN=1` (.ci/run).

use crate::common::cluster;
use crate::common::daemon as harness;
use crate::common::fan_out;
use crate::common::postgres;

use herald_actors::domain::{AccountId, RunStatus};
use herald_actors::simulator::read_journal;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Global flags this machine's podman needs (rootful, no systemd).
const PODMAN: &[&str] = &["--runtime", "runc", "--cgroup-manager=cgroupfs"];
/// The default limits are refused here.
const LIMITS: &[&str] = &[
    "--ulimit",
    "nofile=1024:4096",
    "--ulimit",
    "nproc=1024:4096",
];
const BASE: &str = "localhost/herald-ci-base:bookworm";
const IMAGE: &str = "localhost/herald-ci:test";
const TOKEN: &str = "container-test-token-9f3c1a";
/// 64 hex digits, as `whatsapp.session_key_file` wants.
const SESSION_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(PODMAN)
        .args(args)
        .output()
        .expect("podman runs")
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// podman is there, or the test skips (fails under HERALD_REQUIRE_PODMAN=1).
fn have_podman(test: &str) -> bool {
    let there = Command::new("podman")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !there {
        assert!(
            std::env::var("HERALD_REQUIRE_PODMAN").as_deref() != Ok("1"),
            "{test}: podman is not installed and HERALD_REQUIRE_PODMAN=1"
        );
        writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: podman is not installed (apt-get install podman debootstrap; .ci/run does)"
        )
        .ok();
    }
    there
}

/// target/ (the directory `cargo test` built the binary in).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_herald"))
        .ancestors()
        .nth(2)
        .expect("target/<profile>/herald")
        .to_path_buf()
}

/// The Debian base image: imported from a minbase root file system made
/// with debootstrap, which is kept under target/ for the next run.
fn base_image() {
    if podman(&["image", "exists", BASE]).status.success() {
        return;
    }
    let cache = target_dir().join("herald-container-base");
    let tarball = cache.join("bookworm-minbase.tar");
    if !tarball.exists() {
        let rootfs = cache.join("rootfs");
        let _ = std::fs::remove_dir_all(&rootfs);
        std::fs::create_dir_all(&cache).unwrap();
        let mirror = std::env::var("HERALD_DEBIAN_MIRROR")
            .unwrap_or_else(|_| "http://deb.debian.org/debian".into());
        let out = Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&rootfs)
            .arg(&mirror)
            .output()
            .expect("debootstrap runs (apt-get install debootstrap)");
        ok("debootstrap", out);
        // Documentation, locales and apt's lists are no use in the image.
        let partial = cache.join("bookworm-minbase.tar.partial");
        let out = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args([
                "--exclude=./usr/share/doc",
                "--exclude=./usr/share/man",
                "--exclude=./usr/share/info",
                "--exclude=./usr/share/locale",
                "--exclude=./var/cache/apt",
                "--exclude=./var/lib/apt/lists",
                "-cf",
            ])
            .arg(&partial)
            .arg(".")
            .output()
            .unwrap();
        ok("tar of the root file system", out);
        std::fs::rename(&partial, &tarball).unwrap();
        std::fs::remove_dir_all(&rootfs).unwrap();
    }
    ok(
        "podman import",
        podman(&["import", tarball.to_str().unwrap(), BASE]),
    );
}

/// Builds the image once for every test of this binary; answers its size
/// in bytes.
fn image() -> u64 {
    static BUILT: OnceLock<u64> = OnceLock::new();
    *BUILT.get_or_init(|| {
        base_image();
        let ctx = tempfile::tempdir().unwrap();
        // The debug binary without its debug info: a tenth of the bytes.
        let out = Command::new("strip")
            .args(["--strip-debug", "-o"])
            .arg(ctx.path().join("herald"))
            .arg(env!("CARGO_BIN_EXE_herald"))
            .output()
            .expect("strip runs (binutils)");
        ok("strip", out);
        let containerfile = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/Containerfile");
        let began = Instant::now();
        ok(
            "podman build",
            podman(&[
                "build",
                "--format",
                "docker",
                "--target",
                "prebuilt",
                "--build-arg",
                &format!("RUNTIME_IMAGE={BASE}"),
                // Never pulled: the prebuilt target skips the build stage.
                "--build-arg",
                &format!("BUILD_IMAGE={BASE}"),
                "-f",
                containerfile.to_str().unwrap(),
                "-t",
                IMAGE,
                ctx.path().to_str().unwrap(),
            ]),
        );
        let size: u64 = ok(
            "podman image inspect",
            podman(&["image", "inspect", "--format", "{{.Size}}", IMAGE]),
        )
        .parse()
        .unwrap();
        eprintln!(
            "image: {IMAGE} built in {:.1} s, {:.1} MB (base {BASE} and a stripped debug binary)",
            began.elapsed().as_secs_f64(),
            size as f64 / 1e6
        );
        size
    })
}

/// The secrets a container mounts read-only at /run/secrets, 0644 as a
/// compose file secret would be: the token, the session key, and the
/// database URL when given.
fn secrets(dir: &Path, database_url: Option<&str>) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let secrets = dir.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    // The container's user (10001) must get into the mounted directory.
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut files = vec![("control_token", TOKEN), ("session_key", SESSION_KEY)];
    if let Some(url) = database_url {
        files.push(("database_url", url));
    }
    for (name, value) in files {
        std::fs::write(secrets.join(name), format!("{value}\n")).unwrap();
        std::fs::set_permissions(secrets.join(name), std::fs::Permissions::from_mode(0o644))
            .unwrap();
    }
    secrets
}

/// A running container, removed (with its volume) when dropped.
struct Container {
    name: String,
    port: u16,
}

impl Container {
    /// `podman run -d` of the image with the given network flags and
    /// environment, and the secrets mounted.
    fn run(
        name: &str,
        port: u16,
        network: &[String],
        secrets: &Path,
        env: &[(&str, String)],
    ) -> Self {
        let name = format!("herald-ci-{}-{name}", std::process::id());
        let _ = podman(&["rm", "-f", "-v", &name]);
        let mut args: Vec<String> = ["run", "-d", "--name", &name]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(LIMITS.iter().map(|s| s.to_string()));
        args.extend(network.iter().cloned());
        args.push("-v".into());
        args.push(format!("{}:/run/secrets:ro", secrets.display()));
        for (k, v) in env {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
        args.push(IMAGE.into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok("podman run", podman(&args));
        Container { name, port }
    }

    fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn running(&self) -> bool {
        podman(&["inspect", "--format", "{{.State.Running}}", &self.name])
            .stdout
            .starts_with(b"true")
    }

    fn wait_ready(&self, within: Duration) -> Duration {
        let began = Instant::now();
        for polls in 0.. {
            if matches!(harness::http_get(self.port, "/readyz"), Some((200, _))) {
                return began.elapsed();
            }
            // `podman inspect` takes a while: every 40th poll (about 1 s).
            assert!(
                polls % 40 != 39 || self.running(),
                "{} exited during start-up\n{}",
                self.name,
                self.logs()
            );
            assert!(
                began.elapsed() < within,
                "{} not ready within {within:?}\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        unreachable!()
    }

    fn exit_code(&self) -> String {
        ok(
            "podman inspect",
            podman(&["inspect", "--format", "{{.State.ExitCode}}", &self.name]),
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let logs = self.logs();
        let _ = podman(&["rm", "-f", "-v", &self.name]);
        harness::assert_no_panic(&logs, "herald serve in the container");
    }
}

/// The simulator's and engine's knobs that make a test run quick: no
/// typing, no warm-up, short jitter, a 5 s drain.
fn quick() -> Vec<(&'static str, String)> {
    vec![
        (
            "HERALD_CONTROL__TOKEN_FILE",
            "/run/secrets/control_token".into(),
        ),
        (
            "HERALD_WHATSAPP__SESSION_KEY_FILE",
            "/run/secrets/session_key".into(),
        ),
        ("HERALD_DELIVERY__TYPING", "false".into()),
        ("HERALD_DELIVERY__WARMUP", "off".into()),
        ("HERALD_DELIVERY__JITTER_MIN_MS", "0".into()),
        ("HERALD_DELIVERY__JITTER_MAX_MS", "5".into()),
        ("HERALD_DELIVERY__DRAIN_GRACE_SECS", "5".into()),
    ]
}

fn api(port: u16, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    harness::call_json(port, TOKEN, method, path, body.as_ref())
}

#[test]
fn the_image_refuses_to_start_without_a_token_then_serves_a_fan_out_and_stops_cleanly() {
    if !have_podman("container") {
        return;
    }
    let size = image();
    let tmp = tempfile::tempdir().unwrap();
    let secrets = secrets(tmp.path(), None);

    // No token given: the daemon refuses, naming the setting.
    let mut bare: Vec<&str> = vec!["run", "--rm"];
    bare.extend(LIMITS);
    bare.push(IMAGE);
    let refused = podman(&bare);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("control.require_configured_token"), "{said}");

    let port = harness::free_port();
    let mut env = quick();
    // The in-container simulator must not be what limits the pace.
    env.push(("HERALD_SIMULATOR__RATE_LIMIT_PER_MINUTE", "100000".into()));
    env.push(("HERALD_SIMULATOR__LATENCY_MIN_MS", "2".into()));
    env.push(("HERALD_SIMULATOR__LATENCY_MAX_MS", "10".into()));
    let began = Instant::now();
    let c = Container::run(
        "single",
        port,
        &["-p".into(), format!("127.0.0.1:{port}:8790")],
        &secrets,
        &env,
    );
    c.wait_ready(Duration::from_secs(60));
    let to_ready = began.elapsed();
    let logs = c.logs();
    assert!(
        logs.contains("cannot be tightened"),
        "the read-only 0644 session key is used, with a warning\n{logs}"
    );
    let health = podman(&["healthcheck", "run", &c.name]);
    assert!(health.status.success(), "HEALTHCHECK: {health:?}");
    assert_eq!(
        ok(
            "podman inspect",
            podman(&["inspect", "--format", "{{.Config.User}}", &c.name])
        ),
        "10001:10001"
    );

    // A simulated fan-out through the port.
    let groups = 40;
    let (status, r) = api(
        port,
        "POST",
        "/v1/accounts",
        Some(json!({"id": "demo", "kind": "simulator", "max_per_minute": 600})),
    );
    assert_eq!(status, 201, "{r}");
    let targets: Vec<String> = (0..groups)
        .map(|i| {
            herald_actors::simulator::Simulator::numbered_group(i)
                .as_str()
                .to_owned()
        })
        .collect();
    let (status, r) = api(
        port,
        "POST",
        "/v1/reminders",
        Some(json!({
            "account_id": "demo",
            "title": "Standup",
            "timezone": "UTC",
            "schedule": {"at": "2099-01-05T09:00"},
            "window": {"start_hour": 0, "end_hour": 24},
            "parts": [{"kind": "text", "text": "Standup in 10 minutes"}],
            "targets": targets,
        })),
    );
    assert_eq!(status, 201, "{r}");
    let (status, r) = api(
        port,
        "POST",
        &format!("/v1/reminders/{}/fire", r["id"]),
        None,
    );
    assert_eq!(status, 202, "{r}");
    let run = r["run_id"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        let (_, r) = api(port, "GET", &format!("/v1/runs/{run}"), None);
        if r["status"] == "success" {
            break r;
        }
        assert!(
            Instant::now() < deadline
                && !["partial", "failed"].contains(&r["status"].as_str().unwrap_or("")),
            "{r}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(run["counts"]["sent"], groups, "{run}");
    let (_, metrics) = harness::http_get(port, "/metrics").unwrap();
    assert!(
        metrics.contains("herald_runs_finished_total{account=\"demo\",status=\"success\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("herald_account_state{account=\"demo\",state=\"connected\"} 1"));

    // The backup an operator takes of a running container.
    let backup = podman(&["exec", &c.name, "herald", "backup", "/data/backup.tar"]);
    let said = ok("herald backup in the container", backup);
    assert!(said.contains("0 media files"), "{said}");

    // SIGTERM: drains and exits 0.
    let stop = podman(&["stop", "-t", "30", &c.name]);
    ok("podman stop", stop);
    assert_eq!(c.exit_code(), "0", "{}", c.logs());
    assert!(c.logs().contains("stopped cleanly"));
    eprintln!(
        "container: image {:.1} MB; podman run to /readyz in {:.2} s; {groups} groups sent through the port",
        size as f64 / 1e6,
        to_ready.as_secs_f64()
    );
}

const CLUSTER_GROUPS: usize = 150;
const CLUSTER_RATE: u32 = 600;

#[test]
fn two_containers_on_postgres_share_the_accounts_and_one_finishes_what_a_sigkilled_one_began() {
    if !have_podman("container cluster") {
        return;
    }
    let Some(base) = postgres::base("the container cluster test") else {
        return;
    };
    image();
    let tmp = tempfile::tempdir().unwrap();
    let db = cluster::Db::create(&base);
    let accounts: Vec<AccountId> = ["box-1", "box-2"]
        .iter()
        .map(|a| AccountId::parse(a).unwrap())
        .collect();
    let reminders: Vec<i64> = db.rt.block_on(async {
        let mut out = Vec::new();
        for a in &accounts {
            out.push(
                fan_out::seed_reminder(
                    &db.store,
                    a,
                    CLUSTER_RATE,
                    CLUSTER_GROUPS,
                    "container drill",
                )
                .await,
            );
        }
        out
    });
    let sim = harness::SimProcess::start(
        &tmp.path().join("sim"),
        &[
            "--latency-min-ms",
            "2",
            "--latency-max-ms",
            "10",
            "--rate-limit-per-minute",
            "0",
            "--groups-per-account",
            &CLUSTER_GROUPS.to_string(),
        ],
    );
    // The URL reaches the host's PostgreSQL: host networking.
    let secrets = secrets(tmp.path(), Some(db.url()));
    let node = |name: &str| {
        let port = harness::free_port();
        let mut env = quick();
        env.extend([
            ("HERALD_CONTROL__LISTEN", format!("127.0.0.1:{port}")),
            (
                "HERALD_STORAGE__DATABASE_URL_FILE",
                "/run/secrets/database_url".into(),
            ),
            ("HERALD_CLUSTER__ENABLED", "true".into()),
            ("HERALD_CLUSTER__NODE_ID", name.into()),
            ("HERALD_CLUSTER__LEASE_SECS", "3".into()),
            (
                "HERALD_CLUSTER__ADVERTISE_URL",
                format!("http://127.0.0.1:{port}"),
            ),
            ("HERALD_SIMULATOR__URL", sim.url()),
            (
                "HERALD_SIMULATOR__GROUPS_PER_ACCOUNT",
                CLUSTER_GROUPS.to_string(),
            ),
            ("HERALD_DELIVERY__FIRE_CONCURRENCY", "0".into()),
        ]);
        Container::run(
            name,
            port,
            &["--network".into(), "host".into()],
            &secrets,
            &env,
        )
    };
    let c1 = node("c1");
    let c2 = node("c2");
    c1.wait_ready(Duration::from_secs(60));
    c2.wait_ready(Duration::from_secs(60));
    let logs = || format!("{}\n-----\n{}", c1.logs(), c2.logs());
    let wait = |within: Duration, what: &str, done: &dyn Fn() -> bool| {
        let began = Instant::now();
        while !done() {
            assert!(
                began.elapsed() < within,
                "no {what} within {within:?}\n{}",
                logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        began.elapsed()
    };
    wait(
        Duration::from_secs(30),
        "one account on each daemon",
        &|| {
            let o = db.owners();
            o.len() == 2 && o.values().all(|a| a.len() == 1)
        },
    );
    let owned_by_c1 = db.owners().remove("c1").unwrap();

    let runs: Vec<_> = db.rt.block_on(async {
        let mut out = Vec::new();
        for (a, r) in accounts.iter().zip(&reminders) {
            out.push(fan_out::queue_run(&db.store, *r, a).await);
        }
        out
    });
    let total = accounts.len() * CLUSTER_GROUPS;
    wait(
        Duration::from_secs(60),
        "a quarter of the groups sent",
        &|| db.sent(&runs) >= total / 4,
    );
    ok(
        "podman kill",
        podman(&["kill", "--signal", "KILL", &c1.name]),
    );
    let takeover = wait(Duration::from_secs(20), "c1's account taken over", &|| {
        db.owner_of().get(&owned_by_c1[0]).map(String::as_str) == Some("c2")
    });
    wait(Duration::from_secs(120), "every run finished", &|| {
        db.statuses(&runs).iter().all(|s| s.is_final())
    });
    let statuses = db.statuses(&runs);
    assert!(
        statuses.iter().all(|s| *s == RunStatus::Success),
        "{statuses:?}\n{}",
        logs()
    );
    ok("podman stop", podman(&["stop", "-t", "30", &c2.name]));
    assert_eq!(c2.exit_code(), "0", "{}", c2.logs());

    // The shared simulator's journal is the judge.
    let journal = read_journal(&sim.journal).unwrap();
    let mut per_group: HashMap<(String, String), usize> = HashMap::new();
    for d in &journal {
        *per_group
            .entry((d.account.as_str().to_owned(), d.group.as_str().to_owned()))
            .or_default() += 1;
    }
    assert_eq!(
        per_group.len(),
        total,
        "every group of every account reached"
    );
    let twice: Vec<_> = per_group.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "sent twice: {twice:?}");
    assert_eq!(journal.len(), total);
    eprintln!(
        "container cluster: {} accounts x {CLUSTER_GROUPS} groups over two containers; c1 \
         SIGKILLed at a quarter, c2 held its account {:.1} s later and finished both runs; every \
         group once",
        accounts.len(),
        takeover.as_secs_f64()
    );
    sim.stop();
    drop((c1, c2));
    db.drop_database();
}
