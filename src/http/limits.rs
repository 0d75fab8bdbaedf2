//! Limits on the port itself, so one client cannot starve the daemon: a
//! request rate per client address (a token bucket each; an IPv6 client by
//! its /64), and a ceiling on open event streams, in all and per caller,
//! so one viewer cannot hold every slot. Over either, the answer is
//! problem+json with `Retry-After`: 429 for the rate, 503 for the streams.
//!
//! Requests over the Unix socket share one bucket (they have no address).

use super::errors::{ApiError, Kind};
use crate::settings::ControlSettings;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Buckets kept before full (idle) ones are forgotten.
const MAX_CLIENTS: usize = 4096;

pub struct Limits {
    /// Tokens per second; 0 turns the rate limit off.
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<Option<IpAddr>, Bucket>>,
    max_streams: usize,
    max_streams_per_caller: usize,
    streams: Arc<Mutex<Streams>>,
}

/// Open event streams: in all, and per caller.
#[derive(Default)]
struct Streams {
    total: usize,
    by_caller: HashMap<String, usize>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Limits {
    pub fn from_settings(c: &ControlSettings) -> Self {
        Self {
            rate: f64::from(c.rate_limit_per_second),
            burst: f64::from(c.rate_limit_burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
            max_streams: c.max_event_streams as usize,
            max_streams_per_caller: c.max_event_streams_per_caller as usize,
            streams: Arc::default(),
        }
    }

    /// Takes one token from the client's bucket, or says how many whole
    /// seconds until one is there.
    fn take(&self, client: Option<IpAddr>, now: Instant) -> Result<(), u64> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_CLIENTS && !buckets.contains_key(&client) {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| b.tokens + rate * now.duration_since(b.at).as_secs_f64() < burst);
        }
        let b = buckets.entry(client).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let refill = self.rate * now.duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + refill).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - b.tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }

    /// A slot for one event stream of `caller` (a principal's identity),
    /// held as long as the stream is open.
    pub fn open_stream(&self, caller: &str) -> Result<StreamSlot, ApiError> {
        let mut s = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let mine = s.by_caller.get(caller).copied().unwrap_or(0);
        let refusal = if s.total >= self.max_streams {
            Some(format!(
                "{} event streams are open, the most control.max_event_streams allows; close \
                 one or retry later",
                self.max_streams
            ))
        } else if mine >= self.max_streams_per_caller {
            Some(format!(
                "{caller} has {mine} event streams open, the most \
                 control.max_event_streams_per_caller allows; close one or retry later"
            ))
        } else {
            None
        };
        if let Some(detail) = refusal {
            let mut e = ApiError::new(Kind::Unavailable, detail);
            e.retry_after = Some(5);
            return Err(e);
        }
        s.total += 1;
        *s.by_caller.entry(caller.to_owned()).or_default() += 1;
        Ok(StreamSlot {
            streams: self.streams.clone(),
            caller: caller.to_owned(),
        })
    }
}

/// Frees its stream slot when dropped (the client went away).
pub struct StreamSlot {
    streams: Arc<Mutex<Streams>>,
    caller: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut s = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        s.total -= 1;
        if let Some(n) = s.by_caller.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                s.by_caller.remove(&self.caller);
            }
        }
    }
}

pub async fn rate_limit(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if let Some(limits) = req.app_data::<web::Data<Limits>>() {
        // An IPv6 client by its /64: one host cannot pose as many.
        let client = super::peer::network_of(super::peer::client_of(req.request()));
        if let Err(wait) = limits.take(client, Instant::now()) {
            let mut e = ApiError::new(
                Kind::TooManyRequests,
                format!(
                    "more than control.rate_limit_per_second ({}) requests a second from this \
                     client; retry in {wait} s",
                    limits.rate
                ),
            );
            e.retry_after = Some(wait);
            return Err(e.into());
        }
    }
    next.call(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(rate: u32, burst: u32, streams: u32) -> Limits {
        let mut c = crate::settings::Settings::load_from(None, &Default::default())
            .unwrap()
            .control;
        c.rate_limit_per_second = rate;
        c.rate_limit_burst = burst;
        c.max_event_streams = streams;
        c.max_event_streams_per_caller = streams.min(2);
        Limits::from_settings(&c)
    }

    #[test]
    fn a_bucket_per_client_refills_at_the_rate() {
        let l = limits(2, 3, 1);
        let (a, b) = (
            Some(IpAddr::from([10, 0, 0, 1])),
            Some(IpAddr::from([10, 0, 0, 2])),
        );
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(l.take(a, t0).is_ok());
        }
        assert_eq!(l.take(a, t0), Err(1));
        // Another client is not held up by the first.
        assert!(l.take(b, t0).is_ok());
        // Half a second at 2/s is one token.
        assert!(l.take(a, t0 + Duration::from_millis(500)).is_ok());
        assert!(l.take(a, t0 + Duration::from_millis(500)).is_err());
    }

    #[test]
    fn zero_turns_the_rate_limit_off() {
        let l = limits(0, 1, 1);
        for _ in 0..1000 {
            assert!(l.take(None, Instant::now()).is_ok());
        }
    }

    #[test]
    fn stream_slots_are_given_back_when_dropped() {
        let l = limits(1, 1, 2);
        let s1 = l.open_stream("ana").unwrap();
        let _s2 = l.open_stream("bo").unwrap();
        let e = l.open_stream("cy").err().unwrap();
        assert_eq!((e.kind, e.retry_after), (Kind::Unavailable, Some(5)));
        drop(s1);
        assert!(l.open_stream("cy").is_ok());
    }

    #[test]
    fn one_caller_cannot_hold_every_stream_slot() {
        let l = limits(1, 1, 5);
        let mine: Vec<_> = (0..2).map(|_| l.open_stream("user:3").unwrap()).collect();
        let e = l.open_stream("user:3").err().unwrap();
        assert!(
            e.detail.contains("max_event_streams_per_caller"),
            "{}",
            e.detail
        );
        // The others still get theirs.
        let _theirs = l.open_stream("control.token").unwrap();
        let _more = l.open_stream("user:4").unwrap();
        drop(mine);
        assert!(l.open_stream("user:3").is_ok());
    }

    #[test]
    fn an_ipv6_host_cannot_pose_as_many_clients() {
        let l = limits(1, 2, 1);
        let t0 = Instant::now();
        let host = |i: u16| {
            super::super::peer::network_of(Some(IpAddr::from([0x2001, 0xdb8, 0, 1, i, 0, 0, 1])))
        };
        assert!(l.take(host(1), t0).is_ok());
        assert!(l.take(host(2), t0).is_ok());
        assert!(l.take(host(3), t0).is_err(), "one /64, one bucket");
    }
}
