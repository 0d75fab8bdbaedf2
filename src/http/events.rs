//! `/v1/events`: server-sent events. Replays stored events after the
//! client's last id (`?after=` or `Last-Event-ID`), then follows the live
//! bus, with a keep-alive comment so proxies and clients see the stream is
//! alive.
//!
//! The stream is a plain `unfold` polled by the response body: when the
//! client goes away actix drops it, so no task outlives the connection.

use super::errors::ApiError;
use super::extract::Params;
use crate::startup::AppState;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use herald_actors::domain::Event;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::broadcast::{self, error::RecvError};

pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events read from the store per replay query.
const REPLAY_PAGE: u32 = 500;

pub async fn stream(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut p = Params::from_request(&req)?;
    let after = p.take_num("after", 0i64, i64::MAX)?;
    p.finish(&["after"])?;
    let last_event_id = match req.headers().get("Last-Event-ID") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| ApiError::bad_param("Last-Event-ID", "must be an event id"))?,
        ),
    };
    // Subscribe before reading the store, so nothing falls between the two.
    let live = state.engine.events.subscribe();
    let replay_from = after.or(last_event_id);
    let sse = Sse {
        state: state.into_inner(),
        live,
        backlog: VecDeque::new(),
        sent_up_to: replay_from.unwrap_or(0),
        replaying: replay_from.is_some(),
        skip_up_to: None,
        keep_alive: tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE),
        opened: false,
    };
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

struct Sse {
    state: std::sync::Arc<AppState>,
    live: broadcast::Receiver<Event>,
    backlog: VecDeque<Event>,
    /// The highest id sent (or the client's starting point).
    sent_up_to: i64,
    replaying: bool,
    /// Live events at or below this id already came from the store.
    skip_up_to: Option<i64>,
    keep_alive: tokio::time::Interval,
    opened: bool,
}

impl Sse {
    async fn next_frame(&mut self) -> Option<Bytes> {
        if !self.opened {
            // An immediate first chunk: the client knows it is connected.
            self.opened = true;
            return Some(Bytes::from_static(b": connected\n\n"));
        }
        loop {
            if let Some(ev) = self.backlog.pop_front() {
                self.sent_up_to = self.sent_up_to.max(ev.id);
                return Some(frame(&ev));
            }
            if self.replaying {
                match self
                    .state
                    .store
                    .events_after(self.sent_up_to, REPLAY_PAGE)
                    .await
                {
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
                    // Fell behind the bus: catch up from the store.
                    Err(RecvError::Lagged(_)) => self.replaying = true,
                    Err(RecvError::Closed) => return None,
                },
            }
        }
    }
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
}
