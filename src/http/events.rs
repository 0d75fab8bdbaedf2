//! `/v1/events`: server-sent events. Replays stored events after the
//! client's last id (`?after=` or `Last-Event-ID`), then follows the live
//! bus, with a keep-alive comment so proxies and clients see the stream is
//! alive.
//!
//! The stream is a plain `unfold` polled by the response body: when the
//! client goes away actix drops it, so no task outlives the connection.
//!
//! What opened the stream is checked again every [`RECHECK`] while it is
//! open: a user's token revoked or expired, or a console session signed
//! out (or opened under a rotated-out token), ends the stream, so a
//! credential's end is the end of what it reads.

use super::authority::Caller;
use super::console::session::{cookie_value, Sessions};
use super::errors::{ApiError, Kind};
use super::limits::{Limits, StreamSlot};
use super::principal::Guard;
use super::spec::{Op, Param, Params, Rule, Str, Success};
use crate::service::events::{self, Events, Replay};
use crate::service::Allowed;

/// What `EventSource` sends back on reconnect: the last id it saw.
const LAST_EVENT_ID: Param = Param::new(
    "Last-Event-ID",
    Rule::Str(Str::pattern("^[0-9]{1,18}$", "must be an event id")),
    "Sent by EventSource on reconnect; same as `after`",
);
use crate::service::Service;
use actix_web::web::Bytes;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use herald_actors::domain::Event;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::broadcast::{self, error::RecvError};

/// The stream's schema: each server-sent event, its `data` an [`Event`].
struct EventStream;

impl schemars::JsonSchema for EventStream {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventStream".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "description": "One server-sent event: `id`, `event` (the kind) and `data`, an Event as JSON",
            "required": ["id", "event", "data"],
            "properties": {
                "id": { "type": "string", "pattern": "^[0-9]+$" },
                "event": { "type": "string" },
                "data": { "type": "string", "contentMediaType": "application/json", "contentSchema": g.subschema_for::<Event>() },
            },
        })
    }
}

pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How often an open stream checks that what opened it still holds.
pub const RECHECK: Duration = KEEP_ALIVE;
/// Events read from the store per replay query.
const REPLAY_PAGE: u32 = 500;

pub static STREAM: Op = Op::new(
    "streamEvents",
    "Server-sent events",
    Success::json::<EventStream>(200, "The stream").media("text/event-stream"),
)
.describe(
    "`text/event-stream`. Each event is `id: <id>`, `event: <kind>`, `data: <Event as JSON>`. \
     Stored events after `after` (or the `Last-Event-ID` header, a whole number) are replayed \
     first, then live ones follow; without either only live events are sent. A comment line is \
     sent every 15 s to keep the connection alive. Kinds include run_queued, run_scheduled, \
     run_started, run_progress, run_finished (data.delivered = \"X of Y delivered\"), run_missed, \
     run_parked, run_receipts (a run's receipt counts once they settle), run_poll (a poll run's answer, with its receipts), account_state, account_standing, \
     window_closed, reminder_failed_to_fire, webhook_ping. At most \
     `control.max_event_streams` streams are \
     open at once (503 with Retry-After beyond). If retention (`retention.events_days`) has \
     deleted events after the requested position, the replay starts with an `events_pruned` \
     event without an id whose data names the position asked for (`after`), the last deleted \
     id (`pruned_through`) and a `message`; the replay then goes on from the oldest event kept. \
     Besides the bearer token, the web console's session cookie opens this stream (and no \
     other `/v1` route), so its pages can follow it with EventSource.",
)
.query(&[Param::new(
    "after",
    Rule::Int {
        min: 0,
        max: i64::MAX,
    },
    "Replay stored events with a larger id first",
)])
.headers(&[LAST_EVENT_ID])
.errors(&[503])
.performs(&events::STREAM)
.session_cookie();

pub async fn stream(
    service: web::Data<Service>,
    req: HttpRequest,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let p = Params::of(&req, &STREAM)?;
    let after = p.int("after");
    let last_event_id = match req.headers().get("Last-Event-ID") {
        None => None,
        Some(v) => {
            let text = v.to_str().unwrap_or("\u{0}");
            LAST_EVENT_ID
                .check_text(text)
                .map_err(|rule| ApiError::bad_param("Last-Event-ID", rule))?;
            Some(text.parse::<i64>().expect("18 digits fit"))
        }
    };
    let caller = req.extensions().get::<Caller>().cloned().ok_or_else(|| {
        ApiError::new(
            Kind::Internal,
            "the event stream was reached without its caller",
        )
    })?;
    let credential = Credential::of(&req, &caller)?;
    let slot = match req.app_data::<web::Data<Limits>>() {
        Some(limits) => Some(limits.open_stream(&super::forward::for_value(&caller.principal))?),
        None => None,
    };
    let following = Events::of(&service).follow(allowed)?;
    let mut sse = Sse::new(
        following.replay,
        following.live,
        after.or(last_event_id),
        KEEP_ALIVE,
    );
    sse.slot = slot;
    sse.credential = Some(credential);
    let body = futures_util::stream::unfold(sse, |mut s| async move {
        let frame = s.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), s))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        // Tells nginx not to buffer the stream.
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}

/// What opened a stream, to check again while it is open.
enum Credential {
    /// The daemon's own token (or the open port): it changes only with a
    /// restart, which ends the stream.
    Daemon,
    /// A user's bearer token: the user must stay live.
    User { id: i64, guard: Guard },
    /// A console session: it must stay signed in.
    Session {
        id: String,
        sessions: web::Data<Sessions>,
    },
}

impl Credential {
    fn of(req: &HttpRequest, caller: &Caller) -> Result<Self, ApiError> {
        let missing = || ApiError::new(Kind::Internal, "the event stream cannot check its caller");
        if caller.by_session {
            let id = cookie_value(
                req.headers()
                    .get(actix_web::http::header::COOKIE)
                    .and_then(|v| v.to_str().ok()),
            )
            .ok_or_else(missing)?
            .to_owned();
            let sessions = req.app_data::<web::Data<Sessions>>().ok_or_else(missing)?;
            return Ok(Self::Session {
                id,
                sessions: sessions.clone(),
            });
        }
        match caller.principal.user_id {
            Some(id) => {
                let guard = req.app_data::<web::Data<Guard>>().ok_or_else(missing)?;
                Ok(Self::User {
                    id,
                    guard: guard.get_ref().clone(),
                })
            }
            None => Ok(Self::Daemon),
        }
    }

    /// Whether it still opens the stream. A store that cannot answer
    /// keeps it open: the next check asks again.
    async fn holds(&self) -> bool {
        match self {
            Self::Daemon => true,
            Self::User { id, guard } => !matches!(guard.user(*id).await, Ok(None)),
            Self::Session { id, sessions } => sessions.get(id, chrono::Utc::now()).await.is_some(),
        }
    }
}

struct Sse {
    replay: Replay,
    live: broadcast::Receiver<Event>,
    backlog: VecDeque<Event>,
    /// The highest id sent (or the client's starting point).
    sent_up_to: i64,
    replaying: bool,
    /// Whether the replay's start was checked against retention.
    gap_checked: bool,
    /// Asked for no history (no `after`, no `Last-Event-ID`).
    live_only: bool,
    /// Live events at or below this id already came from the store.
    skip_up_to: Option<i64>,
    keep_alive: tokio::time::Interval,
    opened: bool,
    /// Counts this stream against `control.max_event_streams` until the
    /// client goes away and the body is dropped.
    slot: Option<StreamSlot>,
    /// What opened it, checked again every [`RECHECK`].
    credential: Option<Credential>,
    checked_at: tokio::time::Instant,
}

impl Sse {
    fn new(
        replay: Replay,
        live: broadcast::Receiver<Event>,
        replay_from: Option<i64>,
        keep_alive: Duration,
    ) -> Self {
        let first_tick = tokio::time::Instant::now() + keep_alive;
        Self {
            replay,
            live,
            backlog: VecDeque::new(),
            sent_up_to: replay_from.unwrap_or(0),
            replaying: replay_from.is_some(),
            gap_checked: false,
            live_only: replay_from.is_none(),
            skip_up_to: None,
            keep_alive: tokio::time::interval_at(first_tick, keep_alive),
            opened: false,
            slot: None,
            credential: None,
            checked_at: tokio::time::Instant::now(),
        }
    }

    /// Whether what opened the stream still holds, asked at most every
    /// [`RECHECK`].
    async fn still_allowed(&mut self) -> bool {
        let Some(credential) = &self.credential else {
            return true;
        };
        if self.checked_at.elapsed() < RECHECK {
            return true;
        }
        self.checked_at = tokio::time::Instant::now();
        credential.holds().await
    }

    async fn next_frame(&mut self) -> Option<Bytes> {
        if !self.opened {
            // An immediate first chunk: the client knows it is connected.
            self.opened = true;
            return Some(Bytes::from_static(b": connected\n\n"));
        }
        loop {
            if !self.still_allowed().await {
                tracing::info!("an event stream's token or session ended: closing the stream");
                return None;
            }
            if let Some(ev) = self.backlog.pop_front() {
                self.sent_up_to = self.sent_up_to.max(ev.id);
                return Some(frame(&ev));
            }
            if self.replaying && !self.gap_checked {
                self.gap_checked = true;
                match self.replay.pruned_through().await {
                    Ok(through) if through > self.sent_up_to => {
                        let asked = self.sent_up_to;
                        self.sent_up_to = through;
                        return Some(pruned_frame(asked, through));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "event replay failed; ending the stream");
                        return None;
                    }
                }
            }
            if self.replaying {
                match self.replay.after(self.sent_up_to, REPLAY_PAGE).await {
                    Ok(page) if page.is_empty() => {
                        self.replaying = false;
                        self.skip_up_to = Some(self.sent_up_to);
                    }
                    Ok(page) => self.backlog.extend(page),
                    Err(e) => {
                        tracing::warn!(error = %e, "event replay failed; ending the stream");
                        // The client reconnects with Last-Event-ID and resumes.
                        return None;
                    }
                }
                continue;
            }
            tokio::select! {
                _ = self.keep_alive.tick() => {
                    return Some(Bytes::from_static(b": keep-alive\n\n"));
                }
                got = self.live.recv() => match got {
                    Ok(ev) if self.skip_up_to.is_some_and(|n| ev.id <= n) => continue,
                    Ok(ev) => {
                        self.sent_up_to = self.sent_up_to.max(ev.id);
                        return Some(frame(&ev));
                    }
                    // Fell behind the bus: catch up from the store, from
                    // the last event sent. With none sent yet on a live-only
                    // stream there is no such point (replaying all history
                    // would be worse), so say so and go on.
                    Err(RecvError::Lagged(n)) if self.live_only && self.sent_up_to == 0 => {
                        return Some(Bytes::from(format!(": lagged, {n} events missed\n\n")));
                    }
                    Err(RecvError::Lagged(_)) => self.replaying = true,
                    Err(RecvError::Closed) => return None,
                },
            }
        }
    }
}

/// Says that events after `asked` up to `through` were deleted by
/// retention. No `id`: the client's position stays where it is until the
/// first replayed event.
fn pruned_frame(asked: i64, through: i64) -> Bytes {
    let data = serde_json::json!({
        "after": asked,
        "pruned_through": through,
        "message": format!(
            "events {}..={through} were deleted by retention (retention.events_days); \
             the replay continues from the oldest event kept",
            asked + 1
        ),
    });
    Bytes::from(format!("event: events_pruned\ndata: {data}\n\n"))
}

/// `id`, `event` and one `data` line: the event as stored, as JSON (which
/// has no raw newlines, so one line is enough).
fn frame(ev: &Event) -> Bytes {
    let data = serde_json::to_string(ev).expect("event serialises");
    Bytes::from(format!(
        "id: {}\nevent: {}\ndata: {}\n\n",
        ev.id, ev.kind, data
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use herald_actors::events::EventBus;
    use herald_actors::memstore::MemoryStore;
    use herald_actors::ports::{Store, SystemClock};
    use std::sync::Arc;

    fn bus() -> (Arc<dyn Store>, EventBus) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let bus = EventBus::new(store.clone(), Arc::new(SystemClock));
        (store, bus)
    }

    async fn emit(bus: &EventBus, n: usize) {
        for _ in 0..n {
            bus.emit("run_progress", None, None, serde_json::json!({}))
                .await;
        }
        // Stored and broadcast by the bus's writer task.
        bus.flush().await;
    }

    fn id_of(frame: &Bytes) -> Option<i64> {
        let text = std::str::from_utf8(frame).unwrap();
        text.strip_prefix("id: ")?.split('\n').next()?.parse().ok()
    }

    /// Frames until `n` events have come, skipping comments.
    async fn ids(sse: &mut Sse, n: usize) -> Vec<i64> {
        let mut out = Vec::new();
        while out.len() < n {
            let f = sse.next_frame().await.unwrap();
            out.extend(id_of(&f));
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn replays_then_follows_live_without_repeats_and_keeps_alive() {
        let (store, bus) = bus();
        emit(&bus, 3).await;
        let mut sse = Sse::new(Replay::new(store), bus.subscribe(), Some(1), KEEP_ALIVE);
        assert_eq!(&sse.next_frame().await.unwrap()[..], b": connected\n\n");
        assert_eq!(ids(&mut sse, 2).await, vec![2, 3]);
        emit(&bus, 1).await;
        assert_eq!(ids(&mut sse, 1).await, vec![4]);
        // Quiet: a keep-alive comment after 15 s (paused time jumps there).
        let start = tokio::time::Instant::now();
        assert_eq!(&sse.next_frame().await.unwrap()[..], b": keep-alive\n\n");
        assert_eq!(start.elapsed(), KEEP_ALIVE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_client_catches_up_from_the_store_with_no_gap() {
        let (store, bus) = bus();
        let mut sse = Sse::new(Replay::new(store), bus.subscribe(), Some(0), KEEP_ALIVE);
        sse.next_frame().await.unwrap();
        emit(&bus, 1).await;
        assert_eq!(ids(&mut sse, 1).await, vec![1]);
        // Replay done, now following the bus. More than the bus holds
        // arrive at once: the receiver lags and the store fills the gap.
        emit(&bus, 5000).await;
        let got = ids(&mut sse, 5000).await;
        assert_eq!(got, (2..=5001).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_only_stream_that_lags_says_so_instead_of_replaying_history() {
        let (store, bus) = bus();
        let mut sse = Sse::new(Replay::new(store), bus.subscribe(), None, KEEP_ALIVE);
        sse.next_frame().await.unwrap();
        emit(&bus, 5000).await;
        let f = sse.next_frame().await.unwrap();
        assert!(f.starts_with(b": lagged, "), "{f:?}");
        // Then the events the bus still holds, in order.
        let next = ids(&mut sse, 1).await[0];
        assert!(next > 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_replay_from_a_pruned_position_says_so_then_goes_on() {
        let (store, bus) = bus();
        emit(&bus, 5).await;
        // Events 1–3 are older than the horizon.
        let horizon = Utc::now() + chrono::Duration::days(1);
        assert_eq!(store.prune_events(horizon, 3).await.unwrap(), 3);
        let mut sse = Sse::new(
            Replay::new(store.clone()),
            bus.subscribe(),
            Some(1),
            KEEP_ALIVE,
        );
        sse.next_frame().await.unwrap();
        let gap = String::from_utf8(sse.next_frame().await.unwrap().to_vec()).unwrap();
        assert!(gap.starts_with("event: events_pruned\ndata: {"), "{gap}");
        assert!(!gap.contains("id: "), "{gap}");
        let data: serde_json::Value = serde_json::from_str(
            gap.trim_end()
                .strip_prefix("event: events_pruned\ndata: ")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(data["after"], 1);
        assert_eq!(data["pruned_through"], 3);
        assert!(data["message"]
            .as_str()
            .unwrap()
            .contains("events 2..=3 were deleted"));
        assert_eq!(ids(&mut sse, 2).await, vec![4, 5]);

        // A position after the pruned ones replays with no notice.
        let mut sse = Sse::new(Replay::new(store), bus.subscribe(), Some(3), KEEP_ALIVE);
        sse.next_frame().await.unwrap();
        let f = sse.next_frame().await.unwrap();
        assert_eq!(id_of(&f), Some(4));
    }

    #[test]
    fn a_frame_is_id_event_data() {
        let ev = Event {
            id: 7,
            at: "2026-05-11T01:00:00Z".parse().unwrap(),
            kind: "run_finished".into(),
            account_id: Some("sales-1".into()),
            run_id: Some(3),
            data: serde_json::json!({"delivered": "5 of 5 delivered", "text": "a\nb"}),
        };
        let text = String::from_utf8(frame(&ev).to_vec()).unwrap();
        let lines: Vec<_> = text.split('\n').collect();
        assert_eq!(lines[0], "id: 7");
        assert_eq!(lines[1], "event: run_finished");
        assert!(lines[2].starts_with("data: {"));
        assert_eq!(&lines[3..], ["", ""]);
        let data: Event = serde_json::from_str(&lines[2]["data: ".len()..]).unwrap();
        assert_eq!(data, ev);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_once_its_user_is_revoked() {
        use herald_actors::domain::{NewApiUser, Role};
        use herald_actors::ports::UserStore;
        let (store, bus) = bus();
        let users = Arc::new(MemoryStore::new());
        let ana = users
            .create_user(&NewApiUser {
                name: "ana".into(),
                role: Role::Viewer,
                token_hash: "h".into(),
                created_at: Utc::now(),
                expires_at: None,
                created_by: "control.token".into(),
            })
            .await
            .unwrap();
        let mut sse = Sse::new(Replay::new(store), bus.subscribe(), None, KEEP_ALIVE);
        sse.credential = Some(Credential::User {
            id: ana.id,
            guard: Guard::new(None, Some(users.clone())),
        });
        sse.next_frame().await.unwrap();
        // Live events flow while the user is live, and across a check.
        emit(&bus, 1).await;
        assert_eq!(ids(&mut sse, 1).await, vec![1]);
        assert_eq!(&sse.next_frame().await.unwrap()[..], b": keep-alive\n\n");
        emit(&bus, 1).await;
        assert_eq!(ids(&mut sse, 1).await, vec![2]);
        users.delete_user(ana.id).await.unwrap();
        // Within one check's span of the revocation, the stream is over,
        // though events keep coming.
        let start = tokio::time::Instant::now();
        emit(&bus, 3).await;
        let mut frames = 0;
        while sse.next_frame().await.is_some() {
            frames += 1;
        }
        assert!(start.elapsed() <= RECHECK, "{:?}", start.elapsed());
        assert!(frames <= 4, "{frames} frames after the revocation");
    }
}
