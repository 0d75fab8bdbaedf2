//! The files in deploy/, checked offline with the tools operators use:
//!
//! - the alert rules with `promtool check rules` and their unit tests with
//!   `promtool test rules`, Prometheus's compose config with `promtool
//!   check config`, and every query of the Grafana dashboard parsed by
//!   promtool;
//! - the dashboard and the rules naming only metrics Herald exposes;
//! - the compose file through `podman-compose config`, and what it must
//!   hold: two daemons in cluster mode sharing the token, the session key
//!   and the media, their secrets as files and not in the file;
//! - the Kubernetes manifests against the API's schemas
//!   (`kubernetes-validate --strict`, which a broken manifest must fail);
//! - every stop grace period covering the drain time.
//!
//! A test whose tool is missing says it skipped and passes, unless its
//! `HERALD_REQUIRE_…` variable is 1 (`.ci/run` sets them and installs the
//! tools): PROMTOOL, COMPOSE, KUBERNETES_VALIDATE.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::tools;
use tools::have;

fn deploy(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(deploy(rel)).unwrap_or_else(|e| panic!("deploy/{rel}: {e}"))
}

fn run(cmd: &str, args: &[&str], cwd: &Path) -> Output {
    Command::new(cmd)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    if !have("alert rules", "PROMTOOL", "promtool", &["--version"]) {
        return;
    }
    let dir = deploy("prometheus");
    let check = run("promtool", &["check", "rules", "herald-rules.yml"], &dir);
    assert_ok("promtool check rules", &check);
    let tests = run(
        "promtool",
        &["test", "rules", "herald-rules.test.yml"],
        &dir,
    );
    assert_ok("promtool test rules", &tests);
    let config = run("promtool", &["check", "config", "prometheus.yml"], &dir);
    assert_ok("promtool check config", &config);

    // At least one unit test per alert.
    let rules = read("prometheus/herald-rules.yml");
    let tested = read("prometheus/herald-rules.test.yml");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 7, "{alerts:?}");
    for alert in alerts {
        assert!(
            tested.contains(&format!("alertname: {alert}\n")),
            "no promtool test for {alert}"
        );
    }
}

/// Every sample name Herald's /metrics can carry: each family of the
/// exposition with the suffixes of its type.
fn exposed() -> BTreeSet<String> {
    let text = herald::metrics::PromMetrics::new().render();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (family, kind) = rest.split_once(' ').unwrap();
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{family}{s}"));
        }
    }
    names
}

fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("herald_") {
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.') {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// Every `"expr"` string of the dashboard's JSON.
fn dashboard_queries() -> Vec<String> {
    let json: serde_json::Value = serde_json::from_str(&read("grafana/herald.json"))
        .expect("deploy/grafana/herald.json is JSON");
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v.as_str()) {
                        ("expr", Some(e)) => out.push(e.to_owned()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&json, &mut out);
    out
}

#[test]
fn the_dashboard_and_the_rules_name_only_metrics_herald_exposes() {
    let exposed = exposed();
    let queries = dashboard_queries();
    assert!(queries.len() >= 15, "{queries:?}");
    let mut named = metric_names(&queries.join("\n"));
    let dashboard_named = named.clone();
    named.extend(metric_names(&read("prometheus/herald-rules.yml")));
    let unknown: Vec<&String> = named.difference(&exposed).collect();
    assert!(
        unknown.is_empty(),
        "not exposed by Herald: {unknown:?}\nexposed: {exposed:?}"
    );
    // What the issue asks the dashboard for.
    for needed in [
        "herald_messages_sent_total",
        "herald_send_rate_per_minute",
        "herald_runs_finished_total",
        "herald_send_failures_total",
        "herald_account_state",
        "herald_webhook_deliveries_pending",
        "herald_account_lease_held",
    ] {
        assert!(
            dashboard_named.contains(needed),
            "the dashboard lacks {needed}"
        );
    }
}

#[test]
fn every_dashboard_query_parses() {
    if !have("dashboard queries", "PROMTOOL", "promtool", &["--version"]) {
        return;
    }
    // Grafana's variables as Prometheus would see them, each query as a
    // recording rule: promtool parses them all.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in dashboard_queries().iter().enumerate() {
        let q = q
            .replace("$__rate_interval", "5m")
            .replace("$__range", "6h")
            .replace("$__interval", "1m")
            .replace("$account", ".*");
        assert!(!q.contains('$'), "an unknown variable in {q}");
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::Value::String(q)
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard.yml"), rules).unwrap();
    let out = run("promtool", &["check", "rules", "dashboard.yml"], dir.path());
    assert_ok("promtool check rules (the dashboard's queries)", &out);
}

/// The compose file's checks, on the YAML `podman-compose config` prints.
const COMPOSE_CHECKS: &str = r#"
import sys, yaml
c = yaml.safe_load(sys.stdin)
s = c["services"]
for name in ["postgres", "herald-a", "herald-b", "prometheus"]:
    assert name in s, f"no service {name}"
nodes = set()
for name in ["herald-a", "herald-b"]:
    d = s[name]
    env = d["environment"]
    assert env["HERALD_CLUSTER__ENABLED"] in ("true", True), name
    nodes.add(env["HERALD_CLUSTER__NODE_ID"])
    for key, secret in [("HERALD_CONTROL__TOKEN_FILE", "control_token"),
                        ("HERALD_WHATSAPP__SESSION_KEY_FILE", "session_key"),
                        ("HERALD_STORAGE__DATABASE_URL_FILE", "database_url")]:
        assert env[key] == "/run/secrets/" + secret, (name, key, env[key])
        assert secret in [x if isinstance(x, str) else x["source"] for x in d["secrets"]], (name, secret)
    assert any(str(v).endswith(":/data/media") for v in d["volumes"]), (name, d["volumes"])
    assert name in env["HERALD_CONTROL__ALLOWED_HOSTS"].split(","), name
    grace = d["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) >= 25, (name, grace)
    for k, v in env.items():
        assert "@" not in str(v) and "TOKEN=" not in str(v), f"{name}: {k} looks like a secret in the file"
assert len(nodes) == 2, nodes
for name, secret in c["secrets"].items():
    assert set(secret) == {"file"}, (name, secret)
prom = s["prometheus"]
assert any("herald-rules.yml" in str(v) for v in prom["volumes"]), prom["volumes"]
print("compose: ok")
"#;

#[test]
fn the_compose_file_is_valid_and_shares_token_key_and_media() {
    let test = "compose file";
    if !have(
        test,
        "COMPOSE",
        "python3",
        &["-m", "podman_compose", "config", "--help"],
    ) {
        return;
    }
    let out = run(
        "python3",
        &["-m", "podman_compose", "-f", "compose.yaml", "config"],
        &deploy(""),
    );
    assert_ok("podman-compose config", &out);
    let mut check = Command::new("python3")
        .args(["-c", COMPOSE_CHECKS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert_ok("the compose file's checks", &checked);
}

fn manifests() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(deploy("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    files.sort();
    files
}

#[test]
fn the_kubernetes_manifests_match_the_api_schemas() {
    let test = "kubernetes manifests";
    if !have(
        test,
        "KUBERNETES_VALIDATE",
        "kubernetes-validate",
        &["--version"],
    ) {
        return;
    }
    let files = manifests();
    let mut args = vec!["--strict", "--quiet"];
    args.extend(files.iter().map(String::as_str));
    let out = run("kubernetes-validate", &args, &deploy("kubernetes"));
    assert_ok("kubernetes-validate", &out);
    // The kustomization applies every manifest.
    let kustomization = read("kubernetes/kustomization.yaml");
    for f in &files {
        assert!(
            kustomization.contains(&format!("  - {f}\n")),
            "kustomization.yaml leaves out {f}"
        );
    }
    // A validator that passes anything proves nothing: a misspelt field
    // in the Deployment must fail.
    let dir = tempfile::tempdir().unwrap();
    let broken = read("kubernetes/deployment.yaml").replace(
        "terminationGracePeriodSeconds:",
        "terminationGracePeriodSecond:",
    );
    std::fs::write(dir.path().join("broken.yaml"), broken).unwrap();
    let out = run(
        "kubernetes-validate",
        &["--strict", "--quiet", "broken.yaml"],
        dir.path(),
    );
    assert!(!out.status.success(), "a broken manifest passed");
}

/// The number after `key` on the first line holding it (`key: 30`,
/// `key="20"`, `key: 30s`).
fn number_after(text: &str, key: &str, file: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.contains(key) && !l.trim_start().starts_with('#'))
        .unwrap_or_else(|| panic!("{file}: no {key}"));
    let after = &line[line.find(key).unwrap() + key.len()..];
    let digits: String = after
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{file}: no number in {line:?}"))
}

#[test]
fn every_stop_grace_period_covers_the_drain() {
    // The drain, then the final flush and the leases handed over.
    const MARGIN: u64 = 5;
    let image = read("Containerfile");
    let drain = number_after(
        &image,
        "HERALD_DELIVERY__DRAIN_GRACE_SECS=",
        "Containerfile",
    );
    assert!(image.contains("STOPSIGNAL SIGTERM"));
    let compose = read("compose.yaml");
    let grace = number_after(&compose, "stop_grace_period:", "compose.yaml");
    assert!(
        grace >= drain + MARGIN,
        "compose: {grace} s for a {drain} s drain"
    );

    let config = read("kubernetes/configmap.yaml");
    let k8s_drain = number_after(
        &config,
        "HERALD_DELIVERY__DRAIN_GRACE_SECS:",
        "configmap.yaml",
    );
    let deployment = read("kubernetes/deployment.yaml");
    let k8s_grace = number_after(
        &deployment,
        "terminationGracePeriodSeconds:",
        "deployment.yaml",
    );
    assert!(
        k8s_grace >= k8s_drain + MARGIN,
        "kubernetes: {k8s_grace} s for a {k8s_drain} s drain"
    );

    let unit = read("herald.service");
    let stop = number_after(&unit, "TimeoutStopSec=", "herald.service");
    let toml = read("herald.toml");
    let unit_drain = number_after(&toml, "drain_grace_secs =", "herald.toml");
    assert!(
        stop >= unit_drain + MARGIN,
        "systemd: {stop} s for {unit_drain} s"
    );
}

/// A crashed daemon restarted at once waits up to one lease for its own
/// registration to expire (tests/suite/restart.rs): the probes and the unit must
/// give it that long without killing it or giving up on it. While it
/// waits, `/healthz` answers 200 and `/readyz` 503.
#[test]
fn the_probes_and_the_unit_wait_out_a_restarted_daemons_registration() {
    let config = read("kubernetes/configmap.yaml");
    let lease = number_after(&config, "HERALD_CLUSTER__LEASE_SECS:", "configmap.yaml");
    let deployment = read("kubernetes/deployment.yaml");
    let probe = |name: &str| {
        let from = deployment
            .find(&format!("{name}:"))
            .unwrap_or_else(|| panic!("deployment.yaml: no {name}"));
        let block = &deployment[from..];
        let body = block.find('\n').unwrap_or(block.len());
        let block = &block[..block[body..]
            .find("Probe:")
            .map_or(block.len(), |i| body + i)];
        let path = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("path: "))
            .unwrap_or_else(|| panic!("{name}: no path"))
            .to_owned();
        let period = number_after(block, "periodSeconds:", name);
        let failures = number_after(block, "failureThreshold:", name);
        (path, period * failures)
    };
    let (startup_path, startup_budget) = probe("startupProbe");
    assert_eq!(
        startup_path, "/healthz",
        "the startup probe must pass while the daemon waits"
    );
    assert!(
        startup_budget >= 2 * lease,
        "startupProbe gives {startup_budget} s; a restarted pod may wait {lease} s"
    );
    let (ready_path, _) = probe("readinessProbe");
    assert_eq!(ready_path, "/readyz", "no traffic until the daemon serves");
    // systemd: a start that waits must not time out, and one crash must
    // cost one start (the start limit counts refused ones too).
    let unit = read("herald.service");
    let timeout = number_after(&unit, "TimeoutStartSec=", "herald.service");
    // herald.toml leaves the lease at its default.
    assert!(!read("herald.toml").contains("lease_secs"));
    let defaults =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml"))
            .unwrap();
    let unit_lease = number_after(&defaults, "lease_secs =", "config/default.toml");
    assert!(
        timeout >= 2 * unit_lease,
        "TimeoutStartSec={timeout} for a lease of {unit_lease} s"
    );
    assert!(unit.contains("\nRestart=on-failure\n"));
}
