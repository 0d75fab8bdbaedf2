//! The exposition is checked with a small strict OpenMetrics parser
//! rather than a crate: `prometheus-parse` predates OpenMetrics (it does
//! not know `# EOF`, `# UNIT` or `_created`) and would accept output
//! Prometheus rejects, while these rules are few and exactly the ones
//! Prometheus applies to what we emit.

use super::*;
use herald_actors::ports::Metrics;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug)]
struct MetricFamily {
    name: String,
    kind: String,
    help: Option<String>,
    samples: Vec<Sample>,
}

fn valid_name(s: &str) -> bool {
    let mut b = s.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_' || c == b':')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("bad value {s:?}")),
    }
}

/// `{a="x",b="y"}` → labels, and the rest of the line after `}`.
fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').ok_or("expected {")?;
    if let Some(r) = rest.strip_prefix('}') {
        return Ok((labels, r));
    }
    loop {
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !valid_name(name) || name.contains(':') {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    c => return Err(format!("bad escape \\{c}")),
                },
                (_, '\n') => return Err("raw newline in label value".into()),
                (_, c) => value.push(c),
            }
        };
        if labels.insert(name.to_owned(), value).is_some() {
            return Err(format!("label {name} repeated"));
        }
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        rest = rest.strip_prefix(',').ok_or("expected , or }")?;
    }
}

fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "gauge" | "unknown" => &[""],
        "histogram" => &["_bucket", "_count", "_sum", "_created"],
        "info" => &["_info"],
        _ => &[],
    }
}

/// Parses the OpenMetrics text format strictly: every family declared
/// once with a known type before its samples, sample names matching
/// their family's type, well-formed labels and values, counters not
/// negative, histogram buckets cumulative up to `+Inf` = `_count`, and
/// `# EOF` as the last line.
fn parse(text: &str) -> Result<Vec<MetricFamily>, String> {
    let body = text.strip_suffix("# EOF\n").ok_or("missing final # EOF")?;
    let mut families: Vec<MetricFamily> = Vec::new();
    for (n, line) in body.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if let Some(meta) = line.strip_prefix("# ") {
            let mut it = meta.splitn(3, ' ');
            let (what, name) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            let arg = it
                .next()
                .ok_or_else(|| at("metadata without value".into()))?;
            if !valid_name(name) {
                return Err(at(format!("bad family name {name:?}")));
            }
            // Metadata opens a family or adds to the one just opened,
            // and only before its first sample.
            let open = families
                .last()
                .is_some_and(|f| f.name == name && f.samples.is_empty());
            if !open {
                if families.iter().any(|f| f.name == name) {
                    return Err(at("family declared twice or metadata after samples".into()));
                }
                families.push(MetricFamily {
                    name: name.into(),
                    kind: "unknown".into(),
                    help: None,
                    samples: vec![],
                });
            }
            let f = families.last_mut().expect("pushed above");
            match what {
                "TYPE" if f.kind == "unknown" && !suffixes(arg).is_empty() => f.kind = arg.into(),
                "HELP" if f.help.is_none() => f.help = Some(arg.into()),
                "UNIT" if name.ends_with(&format!("_{arg}")) => {}
                _ => return Err(at(format!("bad or repeated # {what}"))),
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| at("sample without value".into()))?;
        let name = &line[..name_end];
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(at)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let mut fields = rest
            .strip_prefix(' ')
            .ok_or_else(|| at("expected a space before the value".into()))?
            .split(' ');
        let value = parse_value(fields.next().unwrap_or("")).map_err(at)?;
        if let Some(ts) = fields.next() {
            parse_value(ts).map_err(at)?;
        }
        if fields.next().is_some() {
            return Err(at("trailing fields".into()));
        }
        let f = families
            .last_mut()
            .ok_or_else(|| at("sample before any metadata".into()))?;
        if f.kind == "unknown" {
            return Err(at("sample of a family without # TYPE".into()));
        }
        let ok = suffixes(&f.kind)
            .iter()
            .any(|s| name.strip_suffix(s) == Some(f.name.as_str()));
        if !ok {
            return Err(at(format!(
                "sample does not belong to {} {}",
                f.kind, f.name
            )));
        }
        if f.kind == "counter" && (value.is_nan() || value < 0.0) {
            return Err(at("negative counter".into()));
        }
        f.samples.push(Sample {
            name: name.into(),
            labels,
            value,
        });
    }
    for f in families.iter().filter(|f| f.kind == "histogram") {
        check_histogram(f)?;
    }
    Ok(families)
}

fn check_histogram(f: &MetricFamily) -> Result<(), String> {
    // Labels other than `le` → (buckets as (le, count), _count).
    type Series = (Vec<(f64, f64)>, Option<f64>);
    let mut series: BTreeMap<Vec<(String, String)>, Series> = BTreeMap::new();
    for s in &f.samples {
        let mut key: Vec<_> = s.labels.clone().into_iter().collect();
        key.retain(|(k, _)| k != "le");
        let e = series.entry(key).or_default();
        if s.name.ends_with("_bucket") {
            let le = s.labels.get("le").ok_or("bucket without le")?;
            e.0.push((parse_value(le)?, s.value));
        } else if s.name.ends_with("_count") {
            e.1 = Some(s.value);
        }
    }
    for (key, (buckets, count)) in series {
        let bad = |why: &str| Err(format!("{} {key:?}: {why}", f.name));
        if buckets
            .windows(2)
            .any(|w| w[0].0 >= w[1].0 || w[0].1 > w[1].1)
        {
            return bad("buckets not increasing and cumulative");
        }
        match buckets.last() {
            Some((le, n)) if le.is_infinite() && Some(*n) == count => {}
            _ => return bad("+Inf bucket missing or not equal to _count"),
        }
    }
    Ok(())
}

fn family<'a>(fs: &'a [MetricFamily], name: &str) -> &'a MetricFamily {
    fs.iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no family {name}"))
}

fn value(fs: &[MetricFamily], sample: &str, labels: &[(&str, &str)]) -> Option<f64> {
    fs.iter()
        .flat_map(|f| &f.samples)
        .find(|s| {
            s.name == sample
                && s.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
        })
        .map(|s| s.value)
}

fn id(s: &str) -> AccountId {
    AccountId::parse(s).unwrap()
}

/// What an account's run reports, roughly in the engine's order.
fn exercise(m: &PromMetrics, a: &AccountId, sends: u32) {
    m.queue_depth(a, 2);
    m.media_uploaded(a, 150_000);
    m.media_cache_hit(a);
    m.targets_remaining(a, 10);
    for i in 0..sends {
        m.tokens_available(a, 3.5, 40);
        m.message_sent(a, Duration::from_millis(100 + 50 * u64::from(i)));
    }
    m.rate_limited(a);
    m.account_signal(a, "rate_limit");
    m.send_failed(a, "group_not_found");
    m.send_failed(a, "transient");
    m.receipts_counted(a, "delivered", 40);
    m.receipts_counted(a, "read", 12);
    m.receipts_uncounted("repeated", 3);
    m.votes_counted(a, 7);
    m.votes_uncounted("bad_choice", 1);
}

const PER_ACCOUNT: &[&str] = &[
    "herald_messages_sent_total",
    "herald_send_failures_total",
    "herald_rate_limited_total",
    "herald_account_signals_total",
    "herald_tokens_available",
    "herald_send_rate_per_minute",
    "herald_run_queue_depth",
    "herald_run_targets_remaining",
    "herald_send_latency_seconds_bucket",
    "herald_send_latency_seconds_count",
    "herald_send_latency_seconds_sum",
    "herald_media_uploads_total",
    "herald_media_uploaded_bytes_total",
    "herald_media_upload_cache_hits_total",
    "herald_receipts_counted_total",
    "herald_poll_votes_counted_total",
];

#[test]
fn render_parses_strictly_with_series_for_every_account() {
    let m = PromMetrics::new();
    let accounts = [id("acme"), id("globex-2")];
    exercise(&m, &accounts[0], 3);
    exercise(&m, &accounts[1], 1);
    m.actor_restarted("account");
    m.fire_lag(Duration::from_millis(3));
    m.fire_lag(Duration::from_secs(90));
    m.run_missed();
    m.window_closed();
    m.set_daemon_state(2, true);

    let text = m.render();
    let fs = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

    for f in &fs {
        assert!(f.name.starts_with("herald_"), "{}", f.name);
        assert!(f.help.is_some(), "{} has no HELP", f.name);
        for s in &f.samples {
            for k in s.labels.keys() {
                assert!(
                    [
                        "account", "reason", "signal", "kind", "le", "version", "status", "state",
                        "node", "outcome"
                    ]
                    .contains(&k.as_str()),
                    "{}: unbounded label {k}",
                    s.name
                );
            }
        }
    }
    for a in &accounts {
        for sample in PER_ACCOUNT {
            let found = fs.iter().flat_map(|f| &f.samples).any(|s| {
                s.name == *sample && s.labels.get("account").map(String::as_str) == Some(a.as_str())
            });
            assert!(found, "no {sample} series for account {a:?}\n{text}");
        }
    }

    let acme = [("account", "acme")];
    assert_eq!(value(&fs, "herald_messages_sent_total", &acme), Some(3.0));
    assert_eq!(
        value(&fs, "herald_send_latency_seconds_count", &acme),
        Some(3.0)
    );
    let sum = value(&fs, "herald_send_latency_seconds_sum", &acme).unwrap();
    assert!((sum - 0.45).abs() < 1e-9, "{sum}");
    assert_eq!(
        value(
            &fs,
            "herald_send_latency_seconds_bucket",
            &[("account", "acme"), ("le", "0.1")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &fs,
            "herald_send_failures_total",
            &[("account", "acme"), ("reason", "group_not_found")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&fs, "herald_tokens_available", &acme), Some(3.5));
    assert_eq!(
        value(
            &fs,
            "herald_receipts_counted_total",
            &[("account", "acme"), ("kind", "read")]
        ),
        Some(12.0)
    );
    assert_eq!(
        value(
            &fs,
            "herald_receipts_uncounted_total",
            &[("outcome", "repeated")]
        ),
        Some(6.0),
        "both accounts' repeats, one series"
    );
    assert_eq!(value(&fs, "herald_send_rate_per_minute", &acme), Some(40.0));
    assert_eq!(
        value(&fs, "herald_media_uploaded_bytes_total", &acme),
        Some(150_000.0)
    );
    assert_eq!(
        value(
            &fs,
            "herald_messages_sent_total",
            &[("account", "globex-2")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&fs, "herald_actor_restarts_total", &[("kind", "account")]),
        Some(1.0)
    );
    assert_eq!(
        value(&fs, "herald_scheduler_fire_lag_seconds_count", &[]),
        Some(2.0)
    );
    assert_eq!(
        value(&fs, "herald_scheduler_missed_runs_total", &[]),
        Some(1.0)
    );
    assert_eq!(value(&fs, "herald_window_closures_total", &[]), Some(1.0));
    assert_eq!(value(&fs, "herald_accounts", &[]), Some(2.0));
    assert_eq!(value(&fs, "herald_ready", &[]), Some(1.0));
    assert_eq!(family(&fs, "herald_send_latency_seconds").kind, "histogram");
    assert_eq!(family(&fs, "herald_build").kind, "info");
}

#[test]
fn run_outcomes_states_leases_and_webhooks_are_exposed_for_the_rules() {
    let m = PromMetrics::new();
    let view = |accounts: &[(&str, &'static str)], node: Option<&str>, held: &[&str]| StoreView {
        accounts: accounts.iter().map(|(a, s)| (a.to_string(), *s)).collect(),
        node: node.map(str::to_owned),
        leases_held: held.iter().map(|a| a.to_string()).collect(),
        webhook_pending: 7,
        webhook_oldest_due_secs: 42.5,
        standings: Vec::new(),
    };
    m.set_store_view(&view(
        &[("acme", "connected"), ("globex", "banned")],
        Some("herald-a"),
        &["acme"],
    ));
    m.run_finished("acme", "partial");
    m.run_finished("acme", "success");
    m.run_finished("acme", "success");
    m.webhook_attempt("delivered");
    m.webhook_attempt("retry");
    let text = m.render();
    let fs = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let run = |a: &str, st: &str| {
        value(
            &fs,
            "herald_runs_finished_total",
            &[("account", a), ("status", st)],
        )
    };
    assert_eq!(run("acme", "success"), Some(2.0));
    assert_eq!(run("acme", "partial"), Some(1.0));
    // Started at 0 for every account and final status, so increase()
    // sees an account's first partial run.
    assert_eq!(run("globex", "partial"), Some(0.0));
    assert_eq!(run("globex", "missed"), Some(0.0));
    let state = |a: &str, st: &str| {
        value(
            &fs,
            "herald_account_state",
            &[("account", a), ("state", st)],
        )
    };
    assert_eq!(state("acme", "connected"), Some(1.0));
    assert_eq!(state("globex", "banned"), Some(1.0));
    assert_eq!(state("acme", "banned"), None, "only the current state");
    assert_eq!(
        value(
            &fs,
            "herald_account_lease_held",
            &[("account", "acme"), ("node", "herald-a")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&fs, "herald_cluster_enabled", &[]), Some(1.0));
    assert_eq!(
        value(
            &fs,
            "herald_webhook_attempts_total",
            &[("outcome", "retry")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&fs, "herald_webhook_deliveries_pending", &[]),
        Some(7.0)
    );
    assert_eq!(
        value(&fs, "herald_webhook_oldest_due_age_seconds", &[]),
        Some(42.5)
    );

    // The next scrape: globex logged out and then deleted, acme's lease
    // gone, no cluster. The old series go with them.
    m.set_store_view(&view(&[("acme", "logged_out")], None, &[]));
    let text = m.render();
    let fs = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        value(
            &fs,
            "herald_account_state",
            &[("account", "acme"), ("state", "logged_out")]
        ),
        Some(1.0)
    );
    assert!(!text.contains("state=\"connected\""), "{text}");
    assert!(!text.contains("globex"), "{text}");
    assert!(!text.contains("herald_account_lease_held{"), "{text}");
    assert_eq!(value(&fs, "herald_cluster_enabled", &[]), Some(0.0));
    assert_eq!(
        value(
            &fs,
            "herald_runs_finished_total",
            &[("account", "acme"), ("status", "success")]
        ),
        Some(2.0),
        "counters survive a scrape"
    );
}

#[test]
fn run_outcomes_are_read_from_the_events_that_end_runs() {
    let event = |kind: &str, data: serde_json::Value| herald_actors::domain::Event {
        id: 1,
        at: chrono::Utc::now(),
        kind: kind.into(),
        account_id: Some("acme".into()),
        run_id: Some(1),
        data,
    };
    let finished = |status: &str| event("run_finished", serde_json::json!({"status": status}));
    assert_eq!(run_outcome(&finished("partial")), Some("partial"));
    assert_eq!(run_outcome(&finished("cancelled")), Some("cancelled"));
    assert_eq!(
        run_outcome(&event("run_missed", serde_json::json!({}))),
        Some("missed")
    );
    assert_eq!(run_outcome(&finished("running")), None, "not final");
    assert_eq!(
        run_outcome(&event("run_started", serde_json::json!({}))),
        None
    );
    assert_eq!(
        run_outcome(&event("run_finished", serde_json::json!({}))),
        None
    );
}

#[test]
fn a_deleted_accounts_series_go_away() {
    let m = PromMetrics::new();
    exercise(&m, &id("acme"), 2);
    exercise(&m, &id("gone"), 2);
    m.retain_accounts(|a| a == "acme");
    let text = m.render();
    let fs = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let accounts: HashSet<&str> = fs
        .iter()
        .flat_map(|f| &f.samples)
        .filter_map(|s| s.labels.get("account").map(String::as_str))
        .collect();
    assert_eq!(accounts, HashSet::from(["acme"]), "{text}");
    // The account reporting again brings its series back.
    m.message_sent(&id("gone"), Duration::from_millis(5));
    assert!(m.render().contains("account=\"gone\""));
}

#[test]
fn the_parser_rejects_malformed_expositions() {
    for bad in [
        "herald_x 1\n# EOF\n",
        "# TYPE herald_x counter\nherald_x 1\n# EOF\n",
        "# TYPE herald_x gauge\nherald_x{a=\"1\",a=\"2\"} 1\n# EOF\n",
        "# TYPE herald_x gauge\nherald_x{a=1} 1\n# EOF\n",
        "# TYPE herald_x gauge\nherald_x one\n# EOF\n",
        "# TYPE herald_x gauge\nherald_x 1\n",
        "# TYPE herald_x counter\nherald_x_total -1\n# EOF\n",
        "# TYPE herald_h histogram\nherald_h_bucket{le=\"1\"} 2\nherald_h_bucket{le=\"+Inf\"} 1\nherald_h_count 1\n# EOF\n",
        "# TYPE herald_h histogram\nherald_h_bucket{le=\"+Inf\"} 2\nherald_h_count 3\n# EOF\n",
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
    assert!(
        parse("# TYPE herald_x gauge\n# HELP herald_x x\nherald_x{a=\"q\\\"\"} 1\n# EOF\n").is_ok()
    );
}

#[test]
fn an_accounts_standing_is_exposed_for_the_rules() {
    use herald_actors::domain::*;
    let m = PromMetrics::new();
    let now = chrono::Utc::now();
    let until = now + chrono::Duration::hours(2);
    let locked = Standing {
        timelock: Reading::Known {
            value: TimeLock {
                active: true,
                until: Some(until),
                kind: None,
            },
            read_at: now,
        },
        quota: Reading::Known {
            value: NewChatQuota {
                status: QuotaStatus::SecondWarning,
                used: Some(45),
                total: Some(50),
                cycle_start: None,
                cycle_end: None,
            },
            read_at: now,
        },
    };
    let unknown = Standing {
        timelock: Reading::Never,
        quota: Reading::Unknown {
            why: "document not found".into(),
            read_at: now,
        },
    };
    m.set_store_view(&StoreView {
        accounts: vec![
            ("acme".into(), "cooling_down"),
            ("globex".into(), "connected"),
        ],
        standings: vec![("acme".into(), locked), ("globex".into(), unknown)],
        ..Default::default()
    });
    let text = m.render();
    for line in [
        "herald_account_timelock_active{account=\"acme\"} 1".to_owned(),
        format!(
            "herald_account_timelock_until_seconds{{account=\"acme\"}} {}",
            until.timestamp()
        ),
        "herald_account_new_chat_quota_used{account=\"acme\"} 45".to_owned(),
        "herald_account_new_chat_quota_total{account=\"acme\"} 50".to_owned(),
        "herald_account_new_chat_quota_status{account=\"acme\",status=\"second_warning\"} 1"
            .to_owned(),
        "herald_account_new_chat_quota_status{account=\"globex\",status=\"unknown\"} 1".to_owned(),
    ] {
        assert!(text.contains(&line), "{line} missing:\n{text}");
    }
    assert!(!text.contains("herald_account_timelock_active{account=\"globex\"}"));
}

/// The slow database waits the log layer counts reach `/metrics` as a
/// counter that follows the process's count, and the longest wait.
#[test]
fn slow_database_waits_are_a_counter_and_the_longest_a_gauge() {
    let m = PromMetrics::new();
    m.set_slow_acquires(3, 2.5);
    let text = m.render();
    assert!(text.contains("herald_db_slow_acquires_total 3\n"), "{text}");
    assert!(
        text.contains("herald_db_slow_acquire_max_seconds 2.5\n"),
        "{text}"
    );
    m.set_slow_acquires(5, 4.25);
    m.set_slow_acquires(5, 4.25);
    let text = m.render();
    assert!(text.contains("herald_db_slow_acquires_total 5\n"), "{text}");
    assert!(
        text.contains("herald_db_slow_acquire_max_seconds 4.25\n"),
        "{text}"
    );
    parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
}
