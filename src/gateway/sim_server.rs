//! `herald simulator serve`: one simulated WhatsApp ([`Simulator`] with its
//! journal) in its own process, shared by every daemon whose
//! `simulator.url` points at it. Its journal is then the one log of
//! everything delivered by all of them: the checker for exactly-once across
//! daemons. [`super::remote_sim::RemoteSimulator`] is its client.
//!
//! A plain HTTP/1.1 JSON API, no authentication: bind it to loopback or a
//! private network (it is a test and planning tool, not WhatsApp).
//!
//! | request | body | answer |
//! | --- | --- | --- |
//! | `GET /health` | | 200 `{"status":"ok","accounts","delivered","duplicate_deliveries"}` |
//! | `PUT /accounts/{account}` | `{"groups": N}` (optional; default `--groups-per-account`) | 201 `{"account","groups","created":true}` when this paired it; 200 with `"created": false` when the account was already registered with this process (left as it was) |
//! | `GET /accounts/{account}` | | 200 the account's counters (`delivered`, `dedup_hits`, `fenced`, `fence_epoch`, `max_in_any_60s`, …) |
//! | `POST /accounts/{account}/send` | `{"group","message_id","message":{"kind":"text","text"} or {"kind":"media","upload","mime","caption"},"fence":null or {"account","node","epoch"}}` | 200 `{"duplicate": bool}` |
//! | `POST /accounts/{account}/fence` | `{"account","node","epoch"}` | 204; later sends with an older epoch are refused `fenced` (a claim older than one seen is refused too) |
//! | `POST /accounts/{account}/uploads/{media}` | the bytes; `Content-Type` is the media's mime type | 200 `{"handle","expires_at"}` |
//! | `GET /accounts/{account}/groups` | | 200 `[{"jid","subject","participants","announce","is_admin","community"}]` |
//! | `POST /accounts/{account}/ready` | | 204 once the account can write |
//! | `POST /accounts/{account}/typing` | `{"group","for_ms"}` | 204 |
//! | `POST /accounts/{account}/expire-uploads` | | 204; a test control: the account's upload handles expire now |
//! | `GET /deliveries?account=&after=&limit=` | | 200 `{"items":[…],"next_after"}`: deliveries in acceptance order (`seq`), the journal's fields |
//!
//! What WhatsApp would refuse is answered `{"error":{"kind":…},"message":…}`
//! (see [`super::sim_wire::WireError`]) with status 429 for `rate_limited`
//! and 422 for every other kind; the client turns it back into the same
//! `GatewayError`. A malformed request is 400 `{"problem": …}`. The server
//! itself never answers 5xx on purpose, so a client reads a 5xx (a proxy,
//! a crash) as the simulator being unreachable.

use super::sim_wire::*;
use crate::settings::Settings;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use anyhow::Context;
use dashmap::DashMap;
use herald_actors::domain::{AccountId, MediaId};
use herald_actors::ports::{Gateway, GatewayError, SystemClock};
use herald_actors::simulator::{Delivery, Latency, SimConfig, Simulator};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Most numbered groups one registration may ask for.
pub const MAX_GROUPS: usize = 100_000;
/// Largest upload accepted (media.max_bytes may be at most 100 MiB).
pub const MAX_UPLOAD_BYTES: usize = 100 * 1024 * 1024;
/// Largest page of `GET /deliveries`.
pub const MAX_PAGE: usize = 100_000;

/// `herald simulator serve`'s flags. Unset knobs take the `[simulator]`
/// settings (config/default.toml, `--config`, `HERALD_SIMULATOR__…`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free one (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:7790")]
    pub listen: String,
    /// The journal (JSON lines) of every delivery and upload; replayed at
    /// start, so accepted message ids survive a restart.
    #[arg(long, default_value = "simulator/journal.jsonl")]
    pub journal: PathBuf,
    /// Per-request latency, uniform between min and max (ms); an unset
    /// min is lowered to a max set below it.
    #[arg(long)]
    pub latency_min_ms: Option<u64>,
    #[arg(long)]
    pub latency_max_ms: Option<u64>,
    /// Upload bandwidth (bytes per second).
    #[arg(long)]
    pub upload_bytes_per_sec: Option<u64>,
    /// Deliveries per account in any 60 s window before "rate limited";
    /// 0 turns the limit (and so bans) off.
    #[arg(long)]
    pub rate_limit_per_minute: Option<u32>,
    /// Numbered groups an account gets when its registration names none.
    #[arg(long)]
    pub groups_per_account: Option<u32>,
}

/// The knobs resolved against the settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub sim: SimConfig,
    pub groups_per_account: usize,
}

impl ServeArgs {
    pub fn resolve(&self, settings: &Settings) -> anyhow::Result<ServeConfig> {
        let s = &settings.simulator;
        let max = self.latency_max_ms.unwrap_or(s.latency_max_ms);
        // `--latency-max-ms 0` alone means no latency: an unset minimum
        // follows a maximum set below it.
        let min = self.latency_min_ms.unwrap_or(s.latency_min_ms.min(max));
        anyhow::ensure!(
            min <= max,
            "--latency-min-ms ({min}) must not exceed --latency-max-ms ({max})"
        );
        let bandwidth = self.upload_bytes_per_sec.unwrap_or(s.upload_bytes_per_sec);
        anyhow::ensure!(bandwidth > 0, "--upload-bytes-per-sec must be at least 1");
        let rate = self
            .rate_limit_per_minute
            .unwrap_or(s.rate_limit_per_minute);
        let groups = self.groups_per_account.unwrap_or(s.groups_per_account) as usize;
        anyhow::ensure!(
            groups <= MAX_GROUPS,
            "--groups-per-account must be at most {MAX_GROUPS}"
        );
        let latency = if max == 0 {
            Latency::Zero
        } else {
            Latency::Uniform {
                min: Duration::from_millis(min),
                max: Duration::from_millis(max),
            }
        };
        Ok(ServeConfig {
            sim: SimConfig {
                latency,
                upload_bytes_per_sec: Some(bandwidth),
                rate_limit_per_minute: (rate > 0).then_some(rate),
                ..SimConfig::default()
            },
            groups_per_account: groups,
        })
    }
}

/// What the handlers share.
pub struct SimServer {
    sim: Arc<Simulator>,
    /// Accounts registered with this process, and their number of groups.
    registered: DashMap<AccountId, usize>,
    default_groups: usize,
}

impl SimServer {
    pub fn new(sim: Arc<Simulator>, default_groups: usize) -> Self {
        Self {
            sim,
            registered: DashMap::new(),
            default_groups,
        }
    }

    pub fn simulator(&self) -> &Arc<Simulator> {
        &self.sim
    }

    /// Pairs `account` with `groups` numbered groups unless it is already
    /// registered; answers its groups and whether this call paired it.
    fn register(&self, account: &AccountId, groups: usize) -> (usize, bool) {
        use dashmap::mapref::entry::Entry;
        match self.registered.entry(account.clone()) {
            Entry::Occupied(known) => (*known.get(), false),
            Entry::Vacant(slot) => {
                self.sim.add_numbered_groups(account, groups);
                slot.insert(groups);
                (groups, true)
            }
        }
    }
}

/// Routes of the API on `cfg`, for `herald simulator serve` and for tests
/// that host it in their own process.
pub fn routes(server: web::Data<SimServer>) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        cfg.app_data(server)
            .app_data(
                web::JsonConfig::default()
                    .limit(1024 * 1024)
                    .error_handler(|e, _| {
                        let answer = problem(StatusCode::BAD_REQUEST, e.to_string());
                        actix_web::error::InternalError::from_response(e, answer).into()
                    }),
            )
            .app_data(web::PayloadConfig::new(MAX_UPLOAD_BYTES))
            .route("/health", web::get().to(health))
            .route("/deliveries", web::get().to(deliveries))
            .route("/accounts/{account}", web::put().to(register))
            .route("/accounts/{account}", web::get().to(account_report))
            .route("/accounts/{account}/send", web::post().to(send))
            .route("/accounts/{account}/fence", web::post().to(claim_fence))
            .route(
                "/accounts/{account}/uploads/{media}",
                web::post().to(upload),
            )
            .route("/accounts/{account}/groups", web::get().to(list_groups))
            .route("/accounts/{account}/ready", web::post().to(ready))
            .route("/accounts/{account}/typing", web::post().to(typing))
            .route(
                "/accounts/{account}/expire-uploads",
                web::post().to(expire_uploads),
            );
    }
}

fn problem(status: StatusCode, detail: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "problem": detail.into() }))
}

/// A malformed request: 400 `{"problem": …}`.
#[derive(Debug)]
struct BadRequest(String);

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl actix_web::ResponseError for BadRequest {
    fn status_code(&self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }
    fn error_response(&self) -> HttpResponse {
        problem(StatusCode::BAD_REQUEST, self.0.clone())
    }
}

type Answer = Result<HttpResponse, BadRequest>;

/// A refusal WhatsApp would make, as the client reads it back.
fn refused(e: GatewayError) -> HttpResponse {
    let status = match e {
        GatewayError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    HttpResponse::build(status).json(ErrorBody::of(e))
}

fn answer<T: serde::Serialize>(r: Result<T, GatewayError>) -> Answer {
    Ok(match r {
        Ok(body) => HttpResponse::Ok().json(body),
        Err(e) => refused(e),
    })
}

fn no_content(r: Result<(), GatewayError>) -> Answer {
    Ok(match r {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => refused(e),
    })
}

fn account_of(path: &str) -> Result<AccountId, BadRequest> {
    AccountId::parse(path).map_err(|e| BadRequest(format!("account: {}", e.rule)))
}

async fn health(server: web::Data<SimServer>) -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok".into(),
        accounts: server.registered.len(),
        delivered: server.sim.total_delivered(),
        duplicate_deliveries: server.sim.duplicate_deliveries(),
    })
}

async fn register(
    server: web::Data<SimServer>,
    path: web::Path<String>,
    body: web::Bytes,
) -> Answer {
    let account = account_of(&path)?;
    let req: RegisterRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RegisterRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| BadRequest(e.to_string()))?
    };
    let groups = req.groups.unwrap_or(server.default_groups);
    if groups > MAX_GROUPS {
        return Err(BadRequest(format!("groups: must be at most {MAX_GROUPS}")));
    }
    let (groups, created) = server.register(&account, groups);
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(HttpResponse::build(status).json(Registered {
        account,
        groups,
        created,
    }))
}

async fn account_report(server: web::Data<SimServer>, path: web::Path<String>) -> Answer {
    let account = account_of(&path)?;
    let registered = server.registered.get(&account).map(|g| *g.value());
    let sim = &server.sim;
    let mut report = AccountReport::new(account.clone(), registered, sim.stats(&account));
    report.fence_epoch = sim.fence_epoch(&account);
    report.max_in_any_60s = sim.max_in_any_60s(&account);
    Ok(HttpResponse::Ok().json(report))
}

async fn send(
    server: web::Data<SimServer>,
    path: web::Path<String>,
    body: web::Json<SendRequest>,
) -> Answer {
    let account = account_of(&path)?;
    let SendRequest {
        group,
        message_id,
        message,
        fence,
    } = body.into_inner();
    if let Some(f) = &fence {
        fence_for(f, &account)?;
    }
    let message = message.into();
    let got = server
        .sim
        .send_fenced(&account, &group, &message, &message_id, fence.as_ref())
        .await;
    answer(got.map(|r| SendAnswer {
        duplicate: r.duplicate,
    }))
}

async fn claim_fence(
    server: web::Data<SimServer>,
    path: web::Path<String>,
    body: web::Json<herald_actors::domain::Fence>,
) -> Answer {
    let account = account_of(&path)?;
    let fence = body.into_inner();
    fence_for(&fence, &account)?;
    no_content(server.sim.claim(&fence))
}

/// A fence sent for `account` must name it.
fn fence_for(fence: &herald_actors::domain::Fence, account: &AccountId) -> Result<(), BadRequest> {
    if fence.account == *account {
        return Ok(());
    }
    Err(BadRequest(format!(
        "fence: is for account {}, not {account}",
        fence.account
    )))
}

async fn upload(
    server: web::Data<SimServer>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
    body: web::Bytes,
) -> Answer {
    let (account, media) = path.into_inner();
    let account = account_of(&account)?;
    let media = MediaId::parse(&media).map_err(|e| BadRequest(format!("media: {}", e.rule)))?;
    let mime = req
        .headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    let bytes: Arc<[u8]> = Arc::from(&body[..]);
    answer(server.sim.upload(&account, &media, &mime, bytes).await)
}

async fn list_groups(server: web::Data<SimServer>, path: web::Path<String>) -> Answer {
    let account = account_of(&path)?;
    let got = server.sim.list_groups(&account).await;
    answer(got.map(|gs| gs.into_iter().map(WireGroup::from).collect::<Vec<_>>()))
}

async fn ready(server: web::Data<SimServer>, path: web::Path<String>) -> Answer {
    let account = account_of(&path)?;
    no_content(server.sim.ready(&account).await)
}

async fn typing(
    server: web::Data<SimServer>,
    path: web::Path<String>,
    body: web::Json<TypingRequest>,
) -> Answer {
    let account = account_of(&path)?;
    let shown = Duration::from_millis(body.for_ms);
    no_content(server.sim.typing(&account, &body.group, shown).await)
}

async fn expire_uploads(server: web::Data<SimServer>, path: web::Path<String>) -> Answer {
    let account = account_of(&path)?;
    server.sim.expire_uploads(&account);
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveriesQuery {
    account: Option<String>,
    /// Only deliveries with a `seq` above this.
    after: Option<u64>,
    limit: Option<usize>,
}

async fn deliveries(server: web::Data<SimServer>, req: HttpRequest) -> Answer {
    let q = web::Query::<DeliveriesQuery>::from_query(req.query_string())
        .map_err(|e| BadRequest(e.to_string()))?
        .into_inner();
    let limit = q.limit.unwrap_or(10_000).clamp(1, MAX_PAGE);
    let log = match &q.account {
        Some(a) => server.sim.deliveries(&account_of(a)?),
        None => server.sim.log(),
    };
    let mut items: Vec<Delivery> = log
        .into_iter()
        .filter(|d| q.after.is_none_or(|after| d.seq > after))
        .take(limit + 1)
        .collect();
    let more = items.len() > limit;
    items.truncate(limit);
    let next_after = more.then(|| items.last().map(|d| d.seq)).flatten();
    Ok(HttpResponse::Ok().json(DeliveryPage { items, next_after }))
}

/// Runs `herald simulator serve` until SIGTERM or SIGINT. Prints
/// `simulator: listening on ADDR` on stdout once the port is bound.
pub async fn serve(args: &ServeArgs, settings: &Settings) -> anyhow::Result<()> {
    let config = args.resolve(settings)?;
    let sim = Simulator::with_journal(config.sim, Arc::new(SystemClock), &args.journal)
        .with_context(|| format!("opening the journal {}", args.journal.display()))?;
    let server = web::Data::new(SimServer::new(Arc::new(sim), config.groups_per_account));
    let listener = TcpListener::bind(&args.listen)
        .with_context(|| format!("binding --listen {}", args.listen))?;
    let addr = listener.local_addr()?;
    let http = HttpServer::new(move || App::new().configure(routes(server.clone())))
        .workers(2)
        .shutdown_timeout(5)
        .listen(listener)?
        .run();
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "simulator: listening on {addr}")?;
        out.flush()?;
    }
    tracing::info!(%addr, journal = %args.journal.display(), "simulator serving");
    // actix-web stops on SIGTERM and SIGINT (graceful, bounded above).
    http.await?;
    tracing::info!("simulator stopped");
    Ok(())
}
