//! The per-account send limiter. Owned by the AccountActor (not shared
//! across threads), so it needs no lock.
//!
//! Two rules together guarantee "never more than `per_minute` messages in
//! any 60-second window": a token bucket of capacity one paces sends evenly
//! (one every 60/per_minute seconds, no burst), and a log of the last
//! `per_minute` grants refuses a grant that would make a 60 s window hold
//! one too many even when the rate changes mid-run. The bucket starts empty:
//! after a restart Herald under-sends rather than bursts.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct TokenBucket {
    per_minute: u32,
    tokens: f64,
    last_refill: Instant,
    /// Adaptive back-off after a rate-limit answer: (factor, until).
    slowed: Option<(f64, Instant)>,
    grants: VecDeque<Instant>,
    /// Lower limits that were in force within the last 60 s: a raised
    /// limit only counts once no window can still hold the lower one.
    holds: VecDeque<(Instant, u32)>,
    /// Whether the grant log was rebuilt from the store's recent sends.
    rebuilt: bool,
}

impl TokenBucket {
    pub fn new(per_minute: u32, now: Instant) -> Self {
        assert!(per_minute > 0, "per_minute must be positive");
        Self {
            per_minute,
            tokens: 0.0,
            last_refill: now,
            slowed: None,
            // Grows to at most per_minute entries; a huge benchmark rate must not preallocate.
            grants: VecDeque::with_capacity((per_minute as usize).min(1024)),
            holds: VecDeque::new(),
            rebuilt: false,
        }
    }

    /// Whether [`TokenBucket::rebuild`] has run for this bucket.
    pub fn is_rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// Starts over from what the store knows: empty, at `per_minute`, with
    /// the account's sends of the last 60 s in the grant log. A new actor
    /// (after a crash or a restart) then cannot exceed the limit in a
    /// window that began before it existed.
    pub fn rebuild(
        &mut self,
        per_minute: u32,
        now: Instant,
        sent: impl IntoIterator<Item = Instant>,
    ) {
        assert!(per_minute > 0, "per_minute must be positive");
        let mut grants: Vec<Instant> = sent
            .into_iter()
            .filter(|t| now.saturating_duration_since(*t) < WINDOW)
            .collect();
        grants.sort();
        self.per_minute = per_minute;
        self.tokens = 0.0;
        self.last_refill = now;
        self.grants = grants.into();
        self.holds.clear();
        self.rebuilt = true;
    }

    /// The most grants any 60 s window ending now may hold.
    fn cap(&self) -> u32 {
        self.holds
            .iter()
            .map(|(_, l)| *l)
            .fold(self.per_minute, u32::min)
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Changes the rate (a per-account override); the grant log keeps the
    /// 60 s guarantee across the change.
    pub fn set_per_minute(&mut self, per_minute: u32, now: Instant) {
        assert!(per_minute > 0, "per_minute must be positive");
        self.refill(now);
        if per_minute > self.per_minute {
            self.holds.push_back((now + WINDOW, self.per_minute));
        }
        self.per_minute = per_minute;
        self.tokens = self.tokens.min(1.0);
    }

    /// Messages per second right now, after any back-off.
    pub fn rate_per_sec(&self, now: Instant) -> f64 {
        let base = f64::from(self.per_minute) / 60.0;
        match self.slowed {
            Some((factor, until)) if now < until => base * factor,
            _ => base,
        }
    }

    /// Sends at `factor` of the rate until `now + cooldown`.
    pub fn back_off(&mut self, now: Instant, factor: f64, cooldown: Duration) {
        self.refill(now);
        self.tokens = 0.0;
        self.slowed = Some((factor.clamp(0.01, 1.0), now + cooldown));
    }

    pub fn is_slowed(&self, now: Instant) -> bool {
        matches!(self.slowed, Some((_, until)) if now < until)
    }

    pub fn available(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.last_refill)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate_per_sec(now)).min(1.0);
        self.last_refill = now;
        while self
            .grants
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
        {
            self.grants.pop_front();
        }
        while self.holds.front().is_some_and(|(until, _)| now >= *until) {
            self.holds.pop_front();
        }
    }

    /// Takes one token, or says how long until one can be taken.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        let mut wait = Duration::ZERO;
        if self.tokens < 1.0 {
            let rate = self.rate_per_sec(now);
            wait = Duration::from_secs_f64((1.0 - self.tokens) / rate);
        }
        let cap = self.cap() as usize;
        if self.grants.len() >= cap {
            // The oldest grant of a full window must leave it first.
            let idx = self.grants.len() - cap;
            let free_at = self.grants[idx] + WINDOW;
            wait = wait.max(free_at.saturating_duration_since(now));
        }
        if !wait.is_zero() {
            // Round up so the caller never wakes a hair early and spins.
            return Err(wait + Duration::from_micros(1));
        }
        self.tokens -= 1.0;
        self.grants.push_back(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Drives the bucket greedily for `span`, returning grant times.
    fn drive(bucket: &mut TokenBucket, start: Instant, span: Duration) -> Vec<Instant> {
        let mut now = start;
        let mut out = vec![];
        while now < start + span {
            match bucket.try_take(now) {
                Ok(()) => out.push(now),
                Err(wait) => now += wait,
            }
        }
        out
    }

    fn max_in_any_window(grants: &[Instant]) -> usize {
        let mut best = 0;
        let mut lo = 0;
        for hi in 0..grants.len() {
            while grants[hi].duration_since(grants[lo]) >= WINDOW {
                lo += 1;
            }
            best = best.max(hi - lo + 1);
        }
        best
    }

    #[test]
    fn starts_empty_and_paces_evenly() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(40, t0);
        assert!(
            b.try_take(t0).is_err(),
            "a fresh bucket must not grant at once"
        );
        let grants = drive(&mut b, t0, Duration::from_secs(600));
        // 40/min for 10 minutes, the first after 1.5 s.
        assert_eq!(grants.len(), 399);
        assert!(grants[0].duration_since(t0) >= Duration::from_millis(1500));
        for pair in grants.windows(2) {
            assert!(pair[1].duration_since(pair[0]) >= Duration::from_millis(1499));
        }
        assert_eq!(max_in_any_window(&grants), 40);
    }

    #[test]
    fn refills_after_idle_but_never_bursts() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(40, t0);
        // Idle ten minutes: still only one token.
        let later = t0 + Duration::from_secs(600);
        assert!(b.try_take(later).is_ok());
        assert!(b.try_take(later).is_err());
        assert!((b.available(later + Duration::from_millis(750)) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn back_off_slows_then_recovers() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(60, t0);
        b.back_off(t0, 0.5, Duration::from_secs(120));
        assert!(b.is_slowed(t0));
        let slow = drive(&mut b, t0, Duration::from_secs(60));
        assert!(
            (29..=30).contains(&slow.len()),
            "half rate for the cooldown: {}",
            slow.len()
        );
        let t1 = t0 + Duration::from_secs(120);
        assert!(!b.is_slowed(t1));
        let fast = drive(&mut b, t1, Duration::from_secs(60));
        assert!((59..=60).contains(&fast.len()), "{}", fast.len());
    }

    #[test]
    fn raising_the_rate_mid_window_keeps_the_old_window_honest() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, t0);
        let mut grants = drive(&mut b, t0, Duration::from_secs(30));
        let t1 = t0 + Duration::from_secs(30);
        b.set_per_minute(120, t1);
        grants.extend(drive(&mut b, t1, Duration::from_secs(120)));
        assert!(max_in_any_window(&grants) <= 120);
    }

    proptest! {
        #[test]
        fn never_more_than_the_limit_in_any_60s_window(
            per_minute in 1u32..200,
            gaps_ms in proptest::collection::vec(0u64..5_000, 1..400),
        ) {
            let t0 = Instant::now();
            let mut b = TokenBucket::new(per_minute, t0);
            let mut now = t0;
            let mut grants = vec![];
            for gap in gaps_ms {
                now += Duration::from_millis(gap);
                loop {
                    match b.try_take(now) {
                        Ok(()) => { grants.push(now); break; }
                        Err(w) => now += w,
                    }
                }
            }
            prop_assert!(max_in_any_window(&grants) <= per_minute as usize);
        }
    }
}
