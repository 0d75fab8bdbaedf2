//! `herald runs …`: list, show, stop and watch runs.

use super::conn::{Client, ClientError, Exit};
use super::format::{items, key_values, s, table, url_encode};
use super::sse::{Reconnect, SseEvent, SseParser};
use crate::export::TargetsCsv;
use clap::Subcommand;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum RunsCmd {
    List {
        #[arg(long)]
        reminder: Option<i64>,
        #[arg(long)]
        account: Option<String>,
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    Show {
        id: i64,
    },
    /// A run's targets, in order.
    Targets {
        id: i64,
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Every group of the run (`--limit` aside) as CSV on standard
        /// output, with its status and receipts, for a spreadsheet.
        #[arg(long)]
        csv: bool,
    },
    /// A poll run's answer: per option the votes over all groups, then
    /// per group (`--json` for the API's answer).
    Poll {
        id: i64,
        /// The poll part to list groups of (the run's first poll if not given).
        #[arg(long)]
        part: Option<u32>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Every group's counts (`--limit` aside) as CSV on standard output,
        /// a column per option, for a spreadsheet.
        #[arg(long)]
        csv: bool,
    },
    Stop {
        id: i64,
    },
    Pause {
        id: i64,
    },
    Resume {
        id: i64,
    },
    Retry {
        id: i64,
    },
    /// Live progress bar until the run ends; exit 0 only on success. A
    /// run being recalled or edited: that progress until it ends.
    Watch {
        id: i64,
    },
    /// Delete every message the run sent, in every group, for everyone
    /// (stops the run first if it is still sending).
    Recall {
        id: i64,
        /// Follow the recall until every group is done.
        #[arg(long)]
        wait: bool,
    },
    /// Correct the text of every text part and/or the caption of every
    /// picture the run sent (within WhatsApp's 15 minutes).
    Edit {
        id: i64,
        #[arg(long)]
        text: Option<String>,
        #[arg(long)]
        caption: Option<String>,
        /// Follow the edit until every group is done.
        #[arg(long)]
        wait: bool,
    },
}

fn runs_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|r| {
            // The names people use, the ids beside them.
            let named = |name: &str, id: &str| match r.get(name).and_then(Value::as_str) {
                Some(n) => format!("{n} ({})", s(r, id)),
                None => s(r, id),
            };
            vec![
                s(r, "id"),
                named("reminder_title", "reminder_id"),
                named("account_name", "account_id"),
                s(r, "status"),
                format!("{}/{}", s(r, "/counts/sent"), total(r)),
                s(r, "scheduled_for"),
            ]
        })
        .collect();
    table(
        &[
            "id",
            "reminder",
            "account",
            "status",
            "sent",
            "scheduled for",
        ],
        rows,
    )
}

/// What the receipts say of a run, in a sentence: participants, not devices.
fn receipts_line(run: &Value) -> String {
    let n = |k: &str| {
        run.pointer(&format!("/receipts/{k}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    format!(
        "reached {} participants in {} groups; read by {} in {} groups",
        n("delivered"),
        n("groups_delivered"),
        n("read"),
        n("groups_read")
    )
}

/// "recall: 12 of 40 groups recalled, 3 too old to recall (under way)".
fn amendment_line(run: &Value) -> Option<String> {
    let a = run.get("amendment").filter(|a| !a.is_null())?;
    let n = |k: &str| {
        a.pointer(&format!("/progress/{k}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let kind = s(a, "kind");
    let word = if kind == "edit" { "edited" } else { "recalled" };
    let mut line = format!("{kind}: {} of {} groups {word}", n("done"), n("total"));
    if n("too_old") > 0 {
        line.push_str(&format!(", {} too old to {kind}", n("too_old")));
    }
    if n("failed") > 0 {
        line.push_str(&format!(", {} refused", n("failed")));
    }
    line.push_str(if a.get("finished_at").is_some_and(|f| !f.is_null()) {
        " (finished)"
    } else {
        " (under way)"
    });
    Some(line)
}

fn amendment_open(run: &Value) -> bool {
    run.get("amendment")
        .is_some_and(|a| !a.is_null() && a.get("finished_at").is_none_or(Value::is_null))
}

/// Reads the run every second until its recall or edit has finished,
/// printing its progress whenever it moves.
async fn follow_amendment(c: &Client, id: i64) -> anyhow::Result<()> {
    let mut last = String::new();
    loop {
        let run = c.get(&format!("/v1/runs/{id}")).await?;
        let line = amendment_line(&run).unwrap_or_else(|| "nothing to follow".into());
        if line != last {
            eprintln!("run {id}: {line}");
            last = line;
        }
        if !amendment_open(&run) {
            return Ok(());
        }
        actix_rt::time::sleep(Duration::from_secs(1)).await;
    }
}

fn total(run: &Value) -> u64 {
    ["pending", "sending", "sent", "failed", "skipped"]
        .iter()
        .filter_map(|k| run.pointer(&format!("/counts/{k}")).and_then(Value::as_u64))
        .sum()
}

/// `herald runs poll`: the totals, then a page of groups (or every group
/// as CSV).
async fn poll(c: &Client, id: i64, part: Option<u32>, limit: u32, csv: bool) -> anyhow::Result<()> {
    let base = format!(
        "/v1/runs/{id}/poll?{}",
        part.map_or(String::new(), |p| format!("part={p}&"))
    );
    if csv {
        let (mut groups, mut after, mut first) = (Vec::new(), None::<u64>, Value::Null);
        loop {
            let after_q = after.map_or(String::new(), |a| format!("&after={a}"));
            let page = c.get(&format!("{base}limit=1000{after_q}")).await?;
            groups.extend(page["groups"].as_array().cloned().unwrap_or_default());
            after = page["next_after"].as_u64();
            if first.is_null() {
                first = page;
            }
            if after.is_none() {
                break;
            }
        }
        let shown = first["part"].as_u64();
        let options: Vec<String> = first["polls"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["part"].as_u64() == shown)
            .map(|p| items_of(&p["options"], "option"))
            .unwrap_or_default();
        std::io::stdout().write_all(&crate::export::poll_csv(&options, &groups))?;
        return Ok(());
    }
    let v = c.get(&format!("{base}limit={limit}")).await?;
    c.print(&v, poll_table);
    Ok(())
}

/// The `key` of each item of `list`.
fn items_of(list: &Value, key: &str) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|o| s(o, key))
        .collect()
}

fn poll_table(v: &Value) -> String {
    let polls = v["polls"].as_array().cloned().unwrap_or_default();
    if polls.is_empty() {
        return format!(
            "run {} has no poll (or has not sent one yet)\n",
            s(v, "run_id")
        );
    }
    let mut out = String::new();
    for p in &polls {
        let voters = p["voters"].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "part {}: {}  ({}; {} voters in {} groups)\n",
            s(p, "part"),
            s(p, "question"),
            if p["multiple"].as_bool() == Some(true) {
                "several choices"
            } else {
                "one choice"
            },
            voters,
            s(p, "groups_voted"),
        ));
        let rows = p["options"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                let n = o["votes"].as_u64().unwrap_or(0);
                let share = if voters == 0 {
                    0.0
                } else {
                    100.0 * n as f64 / voters as f64
                };
                vec![s(o, "option"), n.to_string(), format!("{share:.0} %")]
            })
            .collect();
        out.push_str(&table(&["OPTION", "VOTES", "OF VOTERS"], rows));
        out.push('\n');
    }
    let shown = v["part"].as_u64();
    let options = polls
        .iter()
        .find(|p| p["part"].as_u64() == shown)
        .map(|p| items_of(&p["options"], "option"))
        .unwrap_or_default();
    let mut head = vec!["POS", "GROUP", "VOTERS"];
    head.extend(options.iter().map(String::as_str));
    let rows = v["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            let name = match g["group_name"].as_str() {
                Some(n) => n.to_owned(),
                None => s(g, "group"),
            };
            let mut row = vec![s(g, "position"), name, s(g, "voters")];
            row.extend(items_of(&g["options"], "votes"));
            row
        })
        .collect();
    out.push_str(&table(&head, rows));
    out
}

pub async fn runs(c: Client, cmd: RunsCmd) -> anyhow::Result<()> {
    let v = match cmd {
        RunsCmd::List {
            reminder,
            account,
            status,
            limit,
        } => {
            let mut q = vec![format!("limit={limit}")];
            if let Some(r) = reminder {
                q.push(format!("reminder_id={r}"));
            }
            if let Some(a) = account {
                q.push(format!("account_id={}", url_encode(&a)));
            }
            if let Some(st) = status {
                q.push(format!("status={}", url_encode(&st)));
            }
            let v = c.get(&format!("/v1/runs?{}", q.join("&"))).await?;
            c.print(&v, runs_table);
            return Ok(());
        }
        RunsCmd::Show { id } => {
            let v = c.get(&format!("/v1/runs/{id}")).await?;
            c.print(&v, |v| {
                let mut out = key_values(v);
                out.push_str(&format!("{:<22} {}\n", "", receipts_line(v)));
                if let Some(line) = amendment_line(v) {
                    out.push_str(&format!("{:<22} {line}\n", ""));
                }
                out
            });
            return Ok(());
        }
        RunsCmd::Poll {
            id,
            part,
            limit,
            csv,
        } => return poll(&c, id, part, limit, csv).await,
        RunsCmd::Targets {
            id,
            status,
            limit,
            csv,
        } => {
            let filter = status.map_or(String::new(), |st| format!("status={}", url_encode(&st)));
            if csv {
                let all = c
                    .get_all(&format!("/v1/runs/{id}/targets?{filter}"))
                    .await?;
                let mut out = TargetsCsv::new();
                for t in items(&all) {
                    out.push(&t);
                }
                std::io::stdout().write_all(&out.finish())?;
                return Ok(());
            }
            let mut path = format!("/v1/runs/{id}/targets?limit={limit}");
            if !filter.is_empty() {
                path.push_str(&format!("&{filter}"));
            }
            let v = c.get(&path).await?;
            c.print(&v, |v| {
                let rows = items(v)
                    .iter()
                    .map(|t| {
                        vec![
                            s(t, "position"),
                            s(t, "group_name"),
                            s(t, "group"),
                            s(t, "status"),
                            s(t, "chosen_by"),
                            s(t, "attempts"),
                            s(t, "/receipts/delivered"),
                            s(t, "/receipts/read"),
                            s(t, "error"),
                        ]
                    })
                    .collect();
                table(
                    &[
                        "#",
                        "name",
                        "group",
                        "status",
                        "chosen by",
                        "attempts",
                        "reached",
                        "read",
                        "error",
                    ],
                    rows,
                )
            });
            return Ok(());
        }
        RunsCmd::Stop { id } => c.post(&format!("/v1/runs/{id}/stop")).await?,
        RunsCmd::Pause { id } => c.post(&format!("/v1/runs/{id}/pause")).await?,
        RunsCmd::Resume { id } => c.post(&format!("/v1/runs/{id}/resume")).await?,
        RunsCmd::Retry { id } => c.post(&format!("/v1/runs/{id}/retry")).await?,
        RunsCmd::Watch { id } => return watch(c, id).await,
        RunsCmd::Recall { id, wait } => {
            let v = c.post(&format!("/v1/runs/{id}/recall")).await?;
            c.print(&v, |v| {
                format!(
                    "run {id}: recall under way\n{}",
                    key_values(&v["amendment"])
                )
            });
            if wait {
                follow_amendment(&c, id).await?;
            }
            return Ok(());
        }
        RunsCmd::Edit {
            id,
            text,
            caption,
            wait,
        } => {
            let mut body = serde_json::Map::new();
            if let Some(t) = text {
                body.insert("text".into(), t.into());
            }
            if let Some(cap) = caption {
                body.insert("caption".into(), cap.into());
            }
            let v = c
                .send_json(
                    awc::http::Method::POST,
                    &format!("/v1/runs/{id}/edit"),
                    &Value::Object(body),
                )
                .await?;
            c.print(&v, |v| {
                format!("run {id}: edit under way\n{}", key_values(&v["amendment"]))
            });
            if wait {
                follow_amendment(&c, id).await?;
            }
            return Ok(());
        }
    };
    c.print(&v, key_values);
    Ok(())
}

const FINAL: &[&str] = &["success", "partial", "failed", "cancelled", "missed"];

/// Opens `/v1/events` (from after `last_id`, when the stream gave one).
async fn open_events(
    c: &Client,
    last_id: Option<&str>,
) -> anyhow::Result<
    impl futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>> + Unpin,
> {
    let mut req = c
        .request(awc::http::Method::GET, "/v1/events")
        .timeout(Duration::from_secs(24 * 3600));
    if let Some(id) = last_id {
        req = req.insert_header(("Last-Event-ID", id));
    }
    let resp = req.send().await.map_err(|e| c.unreachable(e))?;
    if !resp.status().is_success() {
        c.finish(resp).await?;
        anyhow::bail!("the event stream refused the request");
    }
    Ok(resp)
}

/// Whether a failed reconnect is worth another try: the daemon was not
/// reached, or answered with a failure of its own (a restart, a full
/// stream limit). A refusal (a revoked token, a bad id) is final.
fn worth_retrying(e: &anyhow::Error) -> bool {
    e.downcast_ref::<ClientError>()
        .is_none_or(|c| c.exit == Exit::Failure)
}

/// Follows a run on the event stream with a progress bar; the run's own
/// record is read first so a finished run answers at once.
async fn watch(c: Client, id: i64) -> anyhow::Result<()> {
    watch_with(c, id, Reconnect::DEFAULT).await
}

async fn watch_with(c: Client, id: i64, reconnect: Reconnect) -> anyhow::Result<()> {
    // Subscribe to live events first, then read the run: a finish that
    // lands between the two is either in the record or on the stream.
    // (Replaying from event 0 would read the daemon's whole history.)
    let stream = open_events(&c, None).await?;
    let run = c.get(&format!("/v1/runs/{id}")).await?;
    if amendment_open(&run) {
        return follow_amendment(&c, id).await;
    }
    let bar = indicatif::ProgressBar::new(total(&run).max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} run {prefix} [{bar:40}] {pos}/{len} sent · {msg} · {elapsed}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(id.to_string());
    // Without a terminal (a script, a log file) the bar is hidden: print a
    // line per update instead.
    let plain = !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let show = |v: &Value| {
        let sent = v
            .pointer("/counts/sent")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        bar.set_length(total(v).max(1));
        bar.set_position(sent);
        bar.set_message(s(v, "status"));
        if plain {
            eprintln!("run {id}: {sent}/{} sent ({})", total(v), s(v, "status"));
        }
    };
    show(&run);
    let mut status = s(&run, "status");
    if !FINAL.contains(&status.as_str()) {
        let mut parser = SseParser::default();
        let mut stream = Some(stream);
        let mut failures = 0;
        'outer: loop {
            if let Some(open) = stream.as_mut() {
                match open.next().await {
                    Some(Ok(chunk)) => {
                        for ev in parser.push(&chunk) {
                            if run_event(id, &ev, &show) {
                                break 'outer;
                            }
                        }
                        continue;
                    }
                    Some(Err(e)) => tracing::debug!(error = %e, "the event stream broke"),
                    None => tracing::debug!("the event stream ended"),
                }
                stream = None;
                parser.reset();
            }
            failures += 1;
            let Some(wait) = reconnect.delay(failures) else {
                anyhow::bail!(
                    "the event stream was lost and {} reconnects failed",
                    reconnect.attempts
                );
            };
            bar.suspend(|| eprintln!("run {id}: event stream lost; reconnecting in {wait:?}"));
            actix_rt::time::sleep(wait).await;
            // From the last event seen; with none seen yet the gap is not
            // replayed, so the record is read again below.
            let opened = match open_events(&c, parser.last_id()).await {
                Ok(open) => c
                    .get(&format!("/v1/runs/{id}"))
                    .await
                    .map(|run| (open, run)),
                Err(e) => Err(e),
            };
            match opened {
                Ok((open, run)) => {
                    failures = 0;
                    stream = Some(open);
                    show(&run);
                    if FINAL.contains(&s(&run, "status").as_str()) {
                        break;
                    }
                }
                Err(e) if worth_retrying(&e) => {
                    tracing::debug!(error = %e, "reconnecting to the event stream failed")
                }
                Err(e) => return Err(e.context("reconnecting to the event stream")),
            }
        }
        let run = c.get(&format!("/v1/runs/{id}")).await?;
        show(&run);
        status = s(&run, "status");
        bar.finish();
        if let Some(summary) = run.get("error_summary").and_then(Value::as_str) {
            println!("{summary}");
        }
        println!("run {id}: {status} — {}", s(&run, "delivered"));
    } else {
        bar.finish();
        println!("run {id}: {status} — {}", s(&run, "delivered"));
    }
    if status == "success" {
        Ok(())
    } else {
        Err(ClientError {
            exit: Exit::RunNotSuccessful,
            message: format!("run {id} ended {status}"),
        }
        .into())
    }
}

/// Shows one event of run `id` on the bar; answers whether the run ended.
fn run_event(id: i64, ev: &SseEvent, show: &impl Fn(&Value)) -> bool {
    let Ok(ev) = serde_json::from_str::<Value>(&ev.data) else {
        return false;
    };
    if ev.get("run_id").and_then(Value::as_i64) != Some(id) {
        return false;
    }
    // Counts in events are authoritative enough for the bar; the final
    // record is fetched once at the end.
    if let Some(counts) = ev.pointer("/data/counts") {
        show(&json!({"counts": counts, "status": s(&ev, "kind")}));
    }
    matches!(
        ev.get("kind").and_then(Value::as_str),
        Some("run_finished" | "run_missed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ClientOpts;
    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
    use std::sync::Mutex;

    /// What the fake daemon saw: each stream's `Last-Event-ID`, and how
    /// often the run was read.
    #[derive(Default)]
    struct Seen {
        streams: Vec<Option<String>>,
        reads: usize,
    }

    /// The first stream sends a progress event (its text split inside a
    /// character) and drops; the second sends `run_finished` as two data
    /// lines; a third is refused, so a watch that misses the finish fails.
    async fn events(req: HttpRequest, seen: web::Data<Mutex<Seen>>) -> HttpResponse {
        let last = req
            .headers()
            .get("Last-Event-ID")
            .map(|v| v.to_str().unwrap().to_owned());
        let n = {
            let mut seen = seen.lock().unwrap();
            seen.streams.push(last);
            seen.streams.len()
        };
        let progress = "id: 7\nevent: run_progress\ndata: {\"run_id\":1,\"kind\":\"run_progress\",\"data\":{\"counts\":{\"sent\":1,\"pending\":1},\"note\":\"Grüße\"}}\n\n";
        let cut = progress.find('ü').unwrap() + 1;
        let chunks: Vec<&'static [u8]> = match n {
            1 => vec![
                b": connected\n\n",
                &progress.as_bytes()[..cut],
                &progress.as_bytes()[cut..],
            ],
            2 => vec![
                b": connected\n\n",
                b"id: 8\nevent: run_finished\ndata: {\"run_id\":1,\n",
                b"data: \"kind\":\"run_finished\"}\n\n",
            ],
            _ => return HttpResponse::NotFound().finish(),
        };
        let body = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::convert::Infallible>(web::Bytes::from_static(c))),
        );
        HttpResponse::Ok()
            .content_type("text/event-stream")
            .streaming(body)
    }

    /// Running on the first two reads (before the stream and after the
    /// reconnect), success after.
    async fn run(seen: web::Data<Mutex<Seen>>) -> HttpResponse {
        let mut seen = seen.lock().unwrap();
        seen.reads += 1;
        let status = if seen.reads <= 2 {
            "running"
        } else {
            "success"
        };
        HttpResponse::Ok().json(json!({
            "id": 1, "status": status, "delivered": "2 of 2 delivered",
            "counts": {"sent": if status == "success" { 2 } else { 0 }, "pending": 2},
        }))
    }

    #[actix_web::test]
    async fn a_watch_reconnects_from_the_last_event_and_reads_whole_events() {
        let seen = web::Data::new(Mutex::new(Seen::default()));
        let data = seen.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/v1/events", web::get().to(events))
                .route("/v1/runs/1", web::get().to(run))
        })
        .workers(1)
        .bind(("127.0.0.1", 0))
        .unwrap();
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        let opts = ClientOpts {
            url: Some(format!("http://127.0.0.1:{port}")),
            token: Some("t".into()),
            json: false,
        };
        let client = Client::new(&opts, None).unwrap();
        let fast = Reconnect {
            first: Duration::from_millis(10),
            max: Duration::from_millis(40),
            attempts: 3,
        };
        let outcome = watch_with(client, 1, fast).await;
        handle.stop(false).await;
        outcome.unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.streams, vec![None, Some("7".to_owned())]);
    }
}
