//! How fast a gateway logs accounts in: WhatsApp sees at most
//! `whatsapp.logins_per_sec` connections a second from one daemon.

/// The pace of many logins: one every `1 / logins_per_sec` on a fixed
/// schedule (so a storm runs at the rate, not below it), and never more
/// than `logins_per_sec` in any second however late a login was let go (a
/// stall is not caught up in a burst). The schedule starts at a random
/// phase within the first gap, so several daemons' logins do not line up.
/// Each gateway has one, which every connection it opens waits on (see
/// `super::wire::BotConnector`); the start-up and takeover loops pace their
/// session opens with one of their own as well.
pub(crate) struct LoginPace {
    gap: tokio::time::Duration,
    next: tokio::time::Instant,
    per_sec: usize,
    /// When the last `per_sec` logins were let go, oldest first.
    recent: std::collections::VecDeque<tokio::time::Instant>,
}

impl LoginPace {
    pub(crate) fn new(logins_per_sec: u32, rng: &mut impl rand::RngExt) -> Self {
        let per_sec = logins_per_sec.max(1);
        // Rounded up: `per_sec` gaps never fit in less than a second.
        let gap = std::time::Duration::from_nanos(1_000_000_000u64.div_ceil(u64::from(per_sec)));
        let phase = gap.mul_f64(rng.random_range(0.0..1.0));
        Self {
            gap,
            next: tokio::time::Instant::now() + phase,
            per_sec: per_sec as usize,
            recent: std::collections::VecDeque::with_capacity(per_sec as usize),
        }
    }

    /// Waits for the next login's turn.
    pub(crate) async fn wait(&mut self) {
        let mut at = self.next;
        if self.recent.len() == self.per_sec {
            at = at.max(self.recent[0] + std::time::Duration::from_secs(1));
        }
        tokio::time::sleep_until(at).await;
        if self.recent.len() == self.per_sec {
            self.recent.pop_front();
        }
        let now = tokio::time::Instant::now();
        self.recent.push_back(now);
        // On schedule, the next is a gap after this one's turn; after a
        // lull or a stall, a gap after now: nothing is made up in a burst.
        self.next = (self.next + self.gap).max(now);
    }
}
