//! The per-account send limiter. Owned by the AccountActor (not shared
//! across threads), so it needs no lock.
//!
//! Two rules together guarantee "never more than `per_minute` messages in
//! any 60-second window": a token bucket of capacity one paces sends evenly
//! (one every 60/per_minute seconds, no burst), and a log of the last
//! `per_minute` grants refuses a grant that would make a 60 s window hold
//! one too many even when the rate changes mid-run. The bucket starts empty:
//! after a restart Herald under-sends rather than bursts.
//!
//! The log counts a send from the moment its answer came back
//! ([`TokenBucket::settle`]), the latest moment it can have reached
//! WhatsApp, and a new grant is made at or before its own send leaves: so
//! two sends one window apart in the log are at least 60 s apart where
//! WhatsApp counts them too, whatever the latency of either.
//!
//! With [`Pacing`] the even spacing gives way to human pacing: after each
//! grant the next one waits a gap drawn (from a seeded stream) around the
//! mean spacing, so no two sends are a fixed period apart. The grant log
//! still refuses any grant that would put one too many in a 60 s window,
//! so the bound stays exact whatever the draws.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(60);

/// Human pacing: how the gaps between grants are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// Spread of a gap around its mean as a fraction: 0 is machine-regular,
    /// 0.5 draws gaps between half and one and a half times the mean.
    pub jitter: f64,
    /// The mean gap as a multiple of the limit's spacing (0.8–10). Below 1
    /// the drawn gaps run a little ahead and the 60 s log holds them back,
    /// which recovers what jitter's long gaps cost; above 1 is headroom.
    pub slack: f64,
    /// Seeds the account's stream of gaps: a simulation replays exactly.
    pub seed: u64,
}

impl Pacing {
    /// No jitter: the classic even spacing.
    pub const REGULAR: Pacing = Pacing {
        jitter: 0.0,
        slack: 1.0,
        seed: 0,
    };

    fn is_regular(&self) -> bool {
        self.jitter <= 0.0 && self.slack <= 1.0
    }
}

/// splitmix64: a tiny, seedable, stable generator (no process RNG, so the
/// same seed gives the same gaps on every machine).
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

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
    /// The lease epoch (0 with one daemon) under which the grant log was
    /// last rebuilt from the store's recent sends, if it was.
    rebuilt: Option<i64>,
    pacing: Pacing,
    rng: SplitMix,
    /// Human pacing: the earliest next grant (drawn after each grant).
    next_at: Option<Instant>,
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
            rebuilt: None,
            pacing: Pacing::REGULAR,
            rng: SplitMix(0),
            next_at: None,
        }
    }

    /// Switches to human pacing (or back, with [`Pacing::REGULAR`]). The
    /// first grant after this waits one drawn gap: still no burst.
    pub fn with_pacing(mut self, pacing: Pacing, now: Instant) -> Self {
        self.set_pacing(pacing, now);
        self
    }

    pub fn set_pacing(&mut self, pacing: Pacing, now: Instant) {
        let pacing = Pacing {
            jitter: pacing.jitter.clamp(0.0, 0.95),
            slack: pacing.slack.clamp(0.8, 10.0),
            seed: pacing.seed,
        };
        if pacing == self.pacing {
            return;
        }
        self.pacing = pacing;
        self.rng = SplitMix(pacing.seed);
        self.next_at = (!pacing.is_regular()).then(|| now + self.draw_gap(now));
    }

    pub fn pacing(&self) -> Pacing {
        self.pacing
    }

    /// One gap: the mean (slack × the current spacing, after any back-off)
    /// scaled by a triangular draw in [1 - jitter, 1 + jitter], which
    /// clusters near the mean as human typing does.
    fn draw_gap(&mut self, now: Instant) -> Duration {
        let mean = self.pacing.slack / self.rate_per_sec(now);
        let tri = self.rng.unit() + self.rng.unit() - 1.0;
        // Whole milliseconds: the timer's own grain, so a wait never ends
        // a hair before its grant and wakes twice.
        let secs = (mean * (1.0 + self.pacing.jitter * tri)).max(0.0);
        Duration::from_millis((secs * 1000.0).round() as u64)
    }

    /// Grants in the 60 s window ending `now`.
    pub fn in_window(&self, now: Instant) -> usize {
        self.grants
            .iter()
            .filter(|t| now.saturating_duration_since(**t) < WINDOW)
            .count()
    }

    /// The lease epoch [`TokenBucket::rebuild`] last ran under, if it ran.
    pub fn rebuilt_under(&self) -> Option<i64> {
        self.rebuilt
    }

    /// Starts over from what the store knows: empty, at `per_minute`, with
    /// the account's sends of the last 60 s in the grant log. A new actor
    /// (after a crash or a restart) then cannot exceed the limit in a
    /// window that began before it existed. `under` is the lease epoch
    /// the sends were read under (0 with one daemon).
    pub fn rebuild(
        &mut self,
        per_minute: u32,
        now: Instant,
        sent: impl IntoIterator<Item = Instant>,
        under: i64,
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
        self.rebuilt = Some(under);
        if !self.pacing.is_regular() {
            self.next_at = Some(now + self.draw_gap(now));
        }
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
        if !self.pacing.is_regular() {
            self.next_at = Some(now + self.draw_gap(now));
        }
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

    /// A send granted at `granted` was answered at `answered`: from now on
    /// it counts in the window from its answer. Without this, a send
    /// delayed on its way (a slow network, a busy machine) could land
    /// within 60 s of a send granted a full window after it.
    pub fn settle(&mut self, granted: Instant, answered: Instant) {
        let Some(mut i) = self.grants.iter().rposition(|t| *t == granted) else {
            // Already out of the window.
            return;
        };
        self.grants[i] = answered.max(granted);
        // Keep the log in time order: answers come back out of order.
        while i + 1 < self.grants.len() && self.grants[i] > self.grants[i + 1] {
            self.grants.swap(i, i + 1);
            i += 1;
        }
    }

    /// Takes one token, or says how long until one can be taken.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        let mut wait = Duration::ZERO;
        if let Some(next) = self.next_at {
            // Human pacing: the drawn gap replaces the even spacing.
            wait = next.saturating_duration_since(now);
        } else if self.tokens < 1.0 {
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
        self.tokens = (self.tokens - 1.0).max(0.0);
        self.grants.push_back(now);
        if self.next_at.is_some() {
            self.next_at = Some(now + self.draw_gap(now));
        }
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

    fn paced(per_minute: u32, jitter: f64, slack: f64, seed: u64, t0: Instant) -> TokenBucket {
        TokenBucket::new(per_minute, t0).with_pacing(
            Pacing {
                jitter,
                slack,
                seed,
            },
            t0,
        )
    }

    #[test]
    fn human_pacing_varies_every_gap_around_the_mean() {
        let t0 = Instant::now();
        let mut b = paced(40, 0.5, 1.1, 7, t0);
        assert!(b.try_take(t0).is_err(), "paced buckets start empty too");
        let grants = drive(&mut b, t0, Duration::from_secs(3600));
        let gaps: Vec<f64> = grants
            .windows(2)
            .map(|p| p[1].duration_since(p[0]).as_secs_f64())
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        // Mean 1.1 × 1.5 s; the draws span ±50 % of it.
        assert!((mean - 1.65).abs() < 0.05, "mean gap {mean}");
        let min = gaps.iter().cloned().fold(f64::MAX, f64::min);
        let max = gaps.iter().cloned().fold(0.0, f64::max);
        assert!(min < 1.2 && max > 2.1, "spread {min}..{max}");
        // No two consecutive gaps alike to the millisecond, as a human's.
        let same = gaps
            .windows(2)
            .filter(|g| (g[0] - g[1]).abs() < 0.001)
            .count();
        assert!(same < gaps.len() / 100, "{same} repeated gaps");
        assert!(max_in_any_window(&grants) <= 40);
    }

    #[test]
    fn the_same_seed_draws_the_same_gaps() {
        let t0 = Instant::now();
        let a = drive(
            &mut paced(30, 0.4, 1.0, 99, t0),
            t0,
            Duration::from_secs(600),
        );
        let b = drive(
            &mut paced(30, 0.4, 1.0, 99, t0),
            t0,
            Duration::from_secs(600),
        );
        let c = drive(
            &mut paced(30, 0.4, 1.0, 100, t0),
            t0,
            Duration::from_secs(600),
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn back_off_stretches_the_drawn_gaps() {
        let t0 = Instant::now();
        let mut b = paced(60, 0.3, 1.0, 1, t0);
        b.back_off(t0, 0.5, Duration::from_secs(120));
        let slow = drive(&mut b, t0, Duration::from_secs(60));
        assert!((24..=36).contains(&slow.len()), "{}", slow.len());
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

        /// The 60 s bound holds under human pacing for any seed, rate,
        /// spread and headroom, and whatever the callers' own gaps.
        #[test]
        fn jittered_pacing_never_exceeds_the_limit_in_any_60s_window(
            per_minute in 1u32..300,
            jitter in 0.0f64..0.95,
            slack in 0.8f64..2.0,
            seed in any::<u64>(),
            gaps_ms in proptest::collection::vec(0u64..3_000, 1..600),
            change_at in proptest::option::of((0usize..600, 1u32..300)),
        ) {
            let t0 = Instant::now();
            let mut b = paced(per_minute, jitter, slack, seed, t0);
            let mut now = t0;
            let mut grants = vec![];
            let mut bound = per_minute;
            for (i, gap) in gaps_ms.into_iter().enumerate() {
                if let Some((at, to)) = change_at {
                    if at == i {
                        b.set_per_minute(to, now);
                        bound = bound.max(to);
                    }
                }
                now += Duration::from_millis(gap);
                loop {
                    match b.try_take(now) {
                        Ok(()) => { grants.push(now); break; }
                        Err(w) => now += w,
                    }
                }
            }
            // Without a change the bound is the rate itself; with one, no
            // window may hold more than the higher of the two limits.
            prop_assert!(max_in_any_window(&grants) <= bound as usize);
        }

        /// Where WhatsApp counts: `senders` groups in flight at once, each
        /// send reaching WhatsApp at some moment between its grant and its
        /// answer, up to two seconds later. Settled at its answer, no 60 s
        /// window of arrivals ever holds more than the limit.
        #[test]
        fn arrivals_never_exceed_the_limit_whatever_the_latency(
            per_minute in 1u32..300,
            jitter in 0.0f64..0.95,
            slack in 0.8f64..1.2,
            seed in any::<u64>(),
            senders in 1usize..5,
            sends in proptest::collection::vec((0u64..2_000, 0.0f64..=1.0), 1..500),
        ) {
            let t0 = Instant::now();
            let mut b = paced(per_minute, jitter, slack, seed, t0);
            let mut free_at = vec![t0; senders];
            // (answered, granted), answered in time order.
            let mut in_flight: Vec<(Instant, Instant)> = vec![];
            let mut now = t0;
            let mut arrivals = vec![];
            for (latency_ms, at) in sends {
                let s = (0..senders).min_by_key(|i| free_at[*i]).unwrap();
                now = now.max(free_at[s]);
                let granted = loop {
                    in_flight.sort();
                    while in_flight.first().is_some_and(|(a, _)| *a <= now) {
                        let (answered, granted) = in_flight.remove(0);
                        b.settle(granted, answered);
                    }
                    match b.try_take(now) {
                        Ok(()) => break now,
                        Err(w) => now += w,
                    }
                };
                let latency = Duration::from_millis(latency_ms);
                arrivals.push(granted + latency.mul_f64(at));
                in_flight.push((granted + latency, granted));
                free_at[s] = granted + latency;
            }
            arrivals.sort();
            prop_assert!(max_in_any_window(&arrivals) <= per_minute as usize);
        }
    }

    #[test]
    fn a_settled_send_counts_from_its_answer() {
        let start = Instant::now();
        let mut b = TokenBucket::new(2, start);
        // It starts empty: the first token is there one spacing later.
        let t0 = start + Duration::from_secs(30);
        b.try_take(t0).unwrap();
        b.settle(t0, t0 + Duration::from_secs(5));
        let t1 = t0 + Duration::from_secs(30);
        b.try_take(t1).unwrap();
        // The third send waits for the first's answer to leave the window,
        // not its grant: 65 s after t0, not 60.
        let wait = b.try_take(t0 + Duration::from_secs(60)).unwrap_err();
        assert!(
            wait > Duration::from_secs(5) - Duration::from_millis(1),
            "{wait:?}"
        );
    }
}
