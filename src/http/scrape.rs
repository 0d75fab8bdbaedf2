//! `/metrics`, the scrape: what it may cost and who may read it.
//!
//! A scrape reads the accounts and the webhook backlog from the store; a
//! rendered page is reused for [`FRESH_FOR`], so a client hammering the
//! route (within the port's per-client rate limit, which the open routes
//! share with `/v1`) costs the store at most one read a second. With
//! `control.metrics_token` set, a scrape needs it as a bearer token
//! (Prometheus: `authorization: { credentials_file: … }`), for a port that
//! listens beyond loopback.

use super::errors::{ApiError, Kind};
use crate::settings::{ControlSettings, Secret};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq as _;

/// How long one rendered page answers every scrape.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

pub struct Scrape {
    token: Option<Secret>,
    cached: Mutex<Option<(Instant, String)>>,
    renders: AtomicU64,
}

impl Scrape {
    pub fn from_settings(c: &ControlSettings) -> Self {
        Self {
            token: (!c.metrics_token.is_empty()).then(|| c.metrics_token.clone()),
            cached: Mutex::new(None),
            renders: AtomicU64::new(0),
        }
    }

    /// Refuses a scrape without the metrics token, when one is set.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), ApiError> {
        let Some(expected) = &self.token else {
            return Ok(());
        };
        let given = authorization
            .and_then(|v| v.strip_prefix(b"Bearer "))
            .unwrap_or(b"");
        if bool::from(given.ct_eq(expected.expose().as_bytes())) {
            Ok(())
        } else {
            Err(ApiError::new(
                Kind::Unauthorized,
                "/metrics needs Authorization: Bearer <control.metrics_token>",
            ))
        }
    }

    /// The page: the one rendered within [`FRESH_FOR`], else a new one.
    pub async fn page<F: Future<Output = String>>(&self, now: Instant, render: F) -> String {
        if let Some((at, text)) = &*self.lock() {
            if now.saturating_duration_since(*at) < FRESH_FOR {
                return text.clone();
            }
        }
        let text = render.await;
        self.renders.fetch_add(1, Ordering::Relaxed);
        *self.lock() = Some((now, text.clone()));
        text
    }

    /// Pages rendered so far (each one store read).
    #[cfg(test)]
    pub fn renders(&self) -> u64 {
        self.renders.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(token: &str) -> Scrape {
        let mut c = crate::settings::Settings::load_from(None, &Default::default())
            .unwrap()
            .control;
        c.metrics_token = Secret::new(token);
        Scrape::from_settings(&c)
    }

    #[tokio::test]
    async fn a_page_answers_every_scrape_for_a_second() {
        let s = scrape("");
        let t0 = Instant::now();
        for i in 0..1000u64 {
            let at = t0 + Duration::from_micros(i * 900);
            let page = s.page(at, async { format!("page {}", s.renders()) }).await;
            assert_eq!(page, "page 0");
        }
        assert_eq!(s.renders(), 1, "1,000 scrapes in 0.9 s read the store once");
        let later = s.page(t0 + FRESH_FOR, async { "new".to_owned() }).await;
        assert_eq!((later.as_str(), s.renders()), ("new", 2));
    }

    #[test]
    fn a_metrics_token_is_asked_for_when_set() {
        assert!(scrape("").check(None).is_ok());
        let s = scrape("scrape-secret-0123456789");
        assert!(s.check(Some(b"Bearer scrape-secret-0123456789")).is_ok());
        for bad in [
            None,
            Some(&b"Bearer scrape-secret"[..]),
            Some(b"scrape-secret-0123456789"),
        ] {
            assert_eq!(s.check(bad).unwrap_err().kind, Kind::Unauthorized);
        }
    }
}
