//! `herald fake-whatsapp serve`: the fake WhatsApp Web server
//! (`herald-fake-whatsapp`) as a process of its own, with a small HTTP/JSON
//! control beside its WebSocket, so that daemons started apart from a test
//! (or a client in another language) can be run against it and checked.
//! Bench builds only: it is test machinery.
//!
//! No authentication: bind the control to loopback.
//!
//! | request | body | answer |
//! | --- | --- | --- |
//! | `GET /health` | | 200 `{"status":"ok","websocket_url","linked","deliveries","log"}` |
//! | `GET /stats` | | 200 `{"phone","logins","handshakes","busy","key_shares"}`: the account's phone number, connections that logged in (left passive mode), Noise handshakes, stanzas other than keep-alive pings, and the most member devices one group message handed its sender key to |
//! | `PUT /groups` | `{"count","members","announce_every"?,"devices"?,"everywhere"?,"prepare_keys"?}` | 200 `{"groups":[jid…]}`: the account's groups from now on, numbered as in the tests; `devices` per member (default 1); the phone numbers in `everywhere` are members of every group too (for devices linked with `POST /phone/scan`); with `prepare_keys` every member device's keys are made before the answer, so a benchmark's first sends measure the client, not the server |
//! | `POST /phone/scan` | `{"qr","member"?}` (the QR a client shows) | 204 once the account's phone has sent the link; with `member` (a phone number of `PUT /groups`), that member's phone links the client as one of its devices instead: 200 `{"jid"}`; 422 `{"error"}` |
//! | `POST /phone/pair-code` | `{"code"}` | 204; 422 `{"error"}` |
//! | `GET /linked` | | 200 `[{"user","device"}]` |
//! | `GET /members/devices` | | 200 `[{"jid","prekeys"}]`: members' devices run by other clients, with the one-time pre-keys each has on the server |
//! | `GET /retries` | | 200 `[{"device","group","message_id"}]`: messages such a device could not decrypt and asked for again |
//! | `PUT /receipts` | `{"at_once","late_after_ms","read_share","read_after_ms"}` or `null` | 204: the receipts each group message gets from now on (delivery from every member device, the share `at_once` at once and the rest after `late_after_ms` marked offline; read from the phones of the share `read_share` of members after `read_after_ms`); `null` turns them off |
//! | `GET /receipts` | | 200 `[{"group","message_id","participant","kind","offline","conn"}]`, the receipts relayed so far |
//! | `GET /deliveries` | | 200 `[{"group","id","kind","media_type","size","key_shares","seen_before","conn","verdict"}]`, every group message received, resends included |
//! | `GET /log?after=N` | | 200 `{"items":[{"index","kind","conn","tag","attrs"}],"next":M}`: what crossed the wire from position N on |
//! | `PUT /standing/timelock` | `{"until"}` (RFC 3339) or `{"until":null}` | 204: the account's reach-out is time-locked until then (group messages nacked with 463, the time-lock query answers active until then), or free |
//! | `PUT /standing/quota` | `{"status","used","total"}` | 204: the new-chat quota the quota query answers from now on (`status`: NONE, FIRST_WARNING, SECOND_WARNING, CAPPED) |
//! | `PUT /standing/quota-document` | `{"known"}` | 204: with `false` the quota query is answered as WhatsApp answers a document id it does not know |
//! | `GET /standing/queries` | | 200 `[doc_id…]`: the standing queries answered so far |

use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::Context;
use herald_fake_whatsapp::{FakeWhatsApp, ReceiptPlan, Verdict};
use serde::Deserialize;
use serde_json::json;
use std::net::TcpListener;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address of the HTTP control (the WebSocket takes a free loopback
    /// port; `GET /health` and the first line on stdout name it).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Keep each stanza's tag and attributes only (`herald bench sessions
    /// --fake-process`: thousands of logins' pre-key uploads would
    /// otherwise fill the log).
    #[arg(long)]
    pub shallow_log: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupsBody {
    count: usize,
    members: usize,
    #[serde(default)]
    announce_every: usize,
    #[serde(default)]
    devices: Option<u32>,
    #[serde(default)]
    everywhere: Vec<String>,
    #[serde(default)]
    prepare_keys: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScanBody {
    qr: String,
    #[serde(default)]
    member: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeBody {
    code: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiptsBody {
    at_once: f64,
    late_after_ms: u64,
    read_share: f64,
    read_after_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LockBody {
    until: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaBody {
    status: String,
    used: u64,
    total: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DocumentBody {
    known: bool,
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    after: usize,
}

type Fake = web::Data<Arc<FakeWhatsApp>>;

fn refused(e: String) -> HttpResponse {
    HttpResponse::UnprocessableEntity().json(json!({ "error": e }))
}

async fn health(fake: Fake) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "status": "ok",
        "websocket_url": fake.url(),
        "linked": fake.linked().len(),
        "deliveries": fake.deliveries().len(),
        "log": fake.log(|l| l.seen.len()),
    }))
}

async fn groups(fake: Fake, body: web::Json<GroupsBody>) -> HttpResponse {
    let b = body.into_inner();
    if let Some(d) = b.devices {
        fake.set_member_devices(d);
    }
    let mut groups = FakeWhatsApp::numbered_groups(b.count, b.members, b.announce_every);
    for g in &mut groups {
        g.members.extend(b.everywhere.iter().cloned());
    }
    let jids: Vec<String> = groups.iter().map(|g| g.jid.clone()).collect();
    fake.set_groups(groups);
    if b.prepare_keys {
        let f = fake.clone();
        if let Err(e) = web::block(move || f.prepare_keys()).await {
            return HttpResponse::InternalServerError().json(json!({ "error": e.to_string() }));
        }
    }
    HttpResponse::Ok().json(json!({ "groups": jids }))
}

/// Connections that logged in: the client leaves passive mode after
/// `<success>`.
pub fn logins(fake: &FakeWhatsApp) -> usize {
    fake.log(|l| {
        l.stanzas()
            .filter(|(_, n)| n.tag == "iq" && n.attrs.get("xmlns").is_some_and(|x| *x == "passive"))
            .map(|(c, _)| c)
            .collect::<std::collections::HashSet<_>>()
            .len()
    })
}

/// Stanzas received other than keep-alive pings: still at a count, the
/// clients are idle.
pub fn busy(fake: &FakeWhatsApp) -> usize {
    fake.log(|l| {
        l.stanzas()
            .filter(|(_, n)| n.attrs.get("xmlns").is_none_or(|x| *x != "w:p"))
            .count()
    })
}

/// The most member devices one group message handed its sender key to.
pub fn key_shares(fake: &FakeWhatsApp) -> usize {
    fake.deliveries()
        .iter()
        .map(|d| d.key_shares)
        .max()
        .unwrap_or(0)
}

async fn stats(fake: Fake) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "phone": fake.phone().user,
        "logins": logins(&fake),
        "handshakes": fake.log(|l| l.handshakes().len()),
        "busy": busy(&fake),
        "key_shares": key_shares(&fake),
    }))
}

async fn scan(fake: Fake, body: web::Json<ScanBody>) -> HttpResponse {
    match &body.member {
        Some(m) => match fake.scan_as_member(&body.qr, m) {
            Ok(jid) => HttpResponse::Ok().json(json!({ "jid": jid })),
            Err(e) => refused(e),
        },
        None => match fake.scan(&body.qr) {
            Ok(()) => HttpResponse::NoContent().finish(),
            Err(e) => refused(e),
        },
    }
}

async fn member_devices(fake: Fake) -> HttpResponse {
    let items: Vec<_> = fake
        .external_devices()
        .iter()
        .map(|d| json!({ "jid": d.jid(), "prekeys": fake.prekeys_of(&d.jid()) }))
        .collect();
    HttpResponse::Ok().json(items)
}

async fn retries(fake: Fake) -> HttpResponse {
    let items: Vec<_> = fake
        .retries()
        .iter()
        .map(|r| json!({ "device": r.device, "group": r.group, "message_id": r.message_id }))
        .collect();
    HttpResponse::Ok().json(items)
}

async fn pair_code(fake: Fake, body: web::Json<CodeBody>) -> HttpResponse {
    match fake.enter_pair_code(&body.code) {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => refused(e),
    }
}

async fn set_receipts(fake: Fake, body: web::Json<Option<ReceiptsBody>>) -> HttpResponse {
    let plan = body.into_inner().map(|b| ReceiptPlan {
        at_once: b.at_once,
        late_after: std::time::Duration::from_millis(b.late_after_ms),
        read_share: b.read_share,
        read_after: std::time::Duration::from_millis(b.read_after_ms),
    });
    if let Some(p) = &plan {
        for (field, share) in [("at_once", p.at_once), ("read_share", p.read_share)] {
            if !(0.0..=1.0).contains(&share) {
                return refused(format!("{field}: must be a share from 0 to 1"));
            }
        }
    }
    fake.set_receipts(plan);
    HttpResponse::NoContent().finish()
}

async fn receipts(fake: Fake) -> HttpResponse {
    let items: Vec<_> = fake
        .receipts()
        .iter()
        .map(|r| {
            json!({
                "group": r.group, "message_id": r.message_id, "participant": r.participant,
                "kind": r.kind, "offline": r.offline, "conn": r.conn,
            })
        })
        .collect();
    HttpResponse::Ok().json(items)
}

async fn linked(fake: Fake) -> HttpResponse {
    let items: Vec<_> = fake
        .linked()
        .iter()
        .map(|l| json!({ "user": l.user, "device": l.device }))
        .collect();
    HttpResponse::Ok().json(items)
}

async fn deliveries(fake: Fake) -> HttpResponse {
    let items: Vec<_> = fake
        .deliveries()
        .iter()
        .map(|d| {
            let verdict = match d.verdict {
                Verdict::Ack => "ack".to_owned(),
                Verdict::Nack(code) => format!("nack {code}"),
                Verdict::Drop => "drop".to_owned(),
                Verdict::Disconnect => "disconnect".to_owned(),
            };
            json!({
                "group": d.group, "id": d.id, "kind": d.kind, "media_type": d.media_type,
                "size": d.size, "key_shares": d.key_shares, "seen_before": d.seen_before,
                "conn": d.conn, "verdict": verdict,
                "read": {
                    "kind": d.read.kind, "text": d.read.text, "refers_to": d.read.refers_to,
                    "devices": d.read.devices, "failures": d.read.failures,
                },
            })
        })
        .collect();
    HttpResponse::Ok().json(items)
}

async fn time_lock(fake: Fake, body: web::Json<LockBody>) -> HttpResponse {
    fake.standing(|s| s.locked_until = body.until);
    HttpResponse::NoContent().finish()
}

async fn quota(fake: Fake, body: web::Json<QuotaBody>) -> HttpResponse {
    let b = body.into_inner();
    const KNOWN: [&str; 4] = ["NONE", "FIRST_WARNING", "SECOND_WARNING", "CAPPED"];
    if !KNOWN.contains(&b.status.as_str()) {
        return refused(format!("status: must be one of {}", KNOWN.join(", ")));
    }
    fake.standing(|s| {
        s.quota = herald_fake_whatsapp::Quota {
            status: b.status,
            used: b.used,
            total: b.total,
            ..Default::default()
        }
    });
    HttpResponse::NoContent().finish()
}

async fn quota_document(fake: Fake, body: web::Json<DocumentBody>) -> HttpResponse {
    fake.standing(|s| s.forget_quota_document = !body.known);
    HttpResponse::NoContent().finish()
}

async fn standing_queries(fake: Fake) -> HttpResponse {
    HttpResponse::Ok().json(fake.standing(|s| s.asked.clone()))
}

async fn log(fake: Fake, q: web::Query<LogQuery>) -> HttpResponse {
    let after = q.after;
    let lines = fake.log(|l| l.summary(after));
    let next = after + lines.len();
    let items: Vec<_> = lines
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let attrs: serde_json::Map<String, serde_json::Value> =
                l.attrs.into_iter().map(|(k, v)| (k, v.into())).collect();
            json!({ "index": after + i, "kind": l.kind, "conn": l.conn, "tag": l.tag, "attrs": attrs })
        })
        .collect();
    HttpResponse::Ok().json(json!({ "items": items, "next": next }))
}

/// Serves until SIGTERM or SIGINT. The first line on stdout is
/// `fake-whatsapp: control on http://ADDR, websocket on URL`.
pub async fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    // The server runs on a runtime of its own (threads it starts itself).
    let fake = Arc::new(
        tokio::task::spawn_blocking(FakeWhatsApp::start)
            .await
            .context("starting the fake WhatsApp server")?,
    );
    if args.shallow_log {
        fake.shallow_log();
    }
    let listener = TcpListener::bind(&args.listen)
        .with_context(|| format!("binding --listen {}", args.listen))?;
    let addr = listener.local_addr()?;
    let data = web::Data::new(fake.clone());
    let http = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/health", web::get().to(health))
            .route("/stats", web::get().to(stats))
            .route("/groups", web::put().to(groups))
            .route("/phone/scan", web::post().to(scan))
            .route("/phone/pair-code", web::post().to(pair_code))
            .route("/linked", web::get().to(linked))
            .route("/members/devices", web::get().to(member_devices))
            .route("/retries", web::get().to(retries))
            .route("/receipts", web::put().to(set_receipts))
            .route("/receipts", web::get().to(receipts))
            .route("/deliveries", web::get().to(deliveries))
            .route("/log", web::get().to(log))
            .route("/standing/timelock", web::put().to(time_lock))
            .route("/standing/quota", web::put().to(quota))
            .route("/standing/quota-document", web::put().to(quota_document))
            .route("/standing/queries", web::get().to(standing_queries))
    })
    .workers(1)
    .shutdown_timeout(2)
    .listen(listener)?
    .run();
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "fake-whatsapp: control on http://{addr}, websocket on {}",
            fake.url()
        )?;
        out.flush()?;
    }
    http.await?;
    // Its runtime may not be dropped inside this one.
    tokio::task::spawn_blocking(move || drop(fake)).await?;
    Ok(())
}
