//! This daemon's lease table: which account leases it holds and until when
//! it may act on them by its *local monotonic* clock. That deadline is
//! counted from the moment the renewal was asked for, minus a margin, so it
//! always passes before the database's expiry does: a daemon that cannot
//! renew stops acting first (fail closed), even if it was paused and wakes
//! up late. The cluster's keeper fills it; every mark and send of the
//! delivery engine asks it first, and the WhatsApp gateway asks it again
//! right before each frame goes on the wire.
//!
//! The monotonic clock does not count time the machine spent suspended (a
//! VM paused, a laptop lid closed): a daemon's deadline would move with it.
//! A daemon therefore also keeps each deadline on a clock that does count
//! it ([`LeaseTable::with_suspend_clock`], `CLOCK_BOOTTIME` on Linux), and
//! a lease is valid only while both say so.

use crate::domain::{AccountId, Fence};
use dashmap::DashMap;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone)]
struct Held {
    epoch: i64,
    /// Local deadline: after it, this daemon does nothing for the account.
    valid_until: Instant,
    /// The same deadline on the suspend-counting clock, when there is one.
    suspend_until: Option<Duration>,
}

/// A clock that counts time the machine was suspended: the time since
/// some fixed origin.
pub type SuspendClock = fn() -> Duration;

/// Until when a lease asked for at `asked_at` may be acted on: its `ttl`
/// counted from the request, less `margin`.
fn deadline(asked_at: Instant, ttl: Duration, margin: Duration) -> Instant {
    asked_at + ttl.saturating_sub(margin)
}

/// The leases this daemon holds, shared by its account actors (a send or
/// a mark asks [`LeaseTable::fence`] first) and its lease keeper.
#[derive(Debug)]
pub struct LeaseTable {
    node: String,
    held: DashMap<AccountId, Held>,
    suspend_clock: Option<SuspendClock>,
}

impl LeaseTable {
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            held: DashMap::new(),
            suspend_clock: None,
        }
    }

    /// Also keeps every deadline on `clock`, which counts suspended time;
    /// a lease is valid only while both clocks say so.
    pub fn with_suspend_clock(mut self, clock: SuspendClock) -> Self {
        self.suspend_clock = Some(clock);
        self
    }

    /// `deadline` on the suspend-counting clock: as far from its now as
    /// `deadline` is from the monotonic now.
    fn suspend_deadline(&self, deadline: Instant) -> Option<Duration> {
        let clock = self.suspend_clock?;
        let now = Instant::now();
        let base = clock();
        Some(if deadline >= now {
            base + (deadline - now)
        } else {
            base.saturating_sub(now - deadline)
        })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The fence to act with for `account`, or `None` if this daemon does
    /// not hold its lease or its local deadline has passed.
    pub fn fence(&self, account: &AccountId) -> Option<Fence> {
        let held = self.held.get(account)?;
        let suspended_past = match (self.suspend_clock, held.suspend_until) {
            (Some(clock), Some(until)) => clock() >= until,
            _ => false,
        };
        (Instant::now() < held.valid_until && !suspended_past).then(|| Fence {
            account: account.clone(),
            node: self.node.clone(),
            epoch: held.epoch,
        })
    }

    /// Records a lease taken or renewed at `epoch`, for `ttl` counted from
    /// `asked_at` (when the request left, not when it was answered), less
    /// `margin`.
    pub fn hold(
        &self,
        account: &AccountId,
        epoch: i64,
        asked_at: Instant,
        ttl: Duration,
        margin: Duration,
    ) {
        let valid_until = deadline(asked_at, ttl, margin);
        let suspend_until = self.suspend_deadline(valid_until);
        self.held.insert(
            account.clone(),
            Held {
                epoch,
                valid_until,
                suspend_until,
            },
        );
    }

    /// Moves the local deadline of a lease renewed at `epoch`, if it is
    /// still held at that epoch: a lease dropped or taken again while its
    /// renewal was in flight is not brought back.
    pub fn extend(
        &self,
        account: &AccountId,
        epoch: i64,
        asked_at: Instant,
        ttl: Duration,
        margin: Duration,
    ) -> bool {
        match self.held.get_mut(account) {
            Some(mut h) if h.epoch == epoch => {
                h.valid_until = deadline(asked_at, ttl, margin);
                h.suspend_until = self.suspend_deadline(h.valid_until);
                true
            }
            _ => false,
        }
    }

    /// Forgets a lease (released, or lost to another daemon).
    pub fn drop_lease(&self, account: &AccountId) -> Option<i64> {
        self.held.remove(account).map(|(_, h)| h.epoch)
    }

    /// Forgets a lease only if it is still held at `epoch`.
    pub fn drop_epoch(&self, account: &AccountId, epoch: i64) -> bool {
        self.held
            .remove_if(account, |_, h| h.epoch == epoch)
            .is_some()
    }

    /// Every lease held, valid or not, with its epoch, by account (a
    /// stable order: the seeded simulation replays what follows from it).
    pub fn held(&self) -> Vec<Fence> {
        let mut held: Vec<Fence> = self
            .held
            .iter()
            .map(|e| Fence {
                account: e.key().clone(),
                node: self.node.clone(),
                epoch: e.value().epoch,
            })
            .collect();
        held.sort_by(|a, b| a.account.cmp(&b.account));
        held
    }

    pub fn holds(&self, account: &AccountId) -> bool {
        self.held.contains_key(account)
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A suspend-counting clock the test moves by hand (ms).
    static SUSPENDED_CLOCK_MS: AtomicU64 = AtomicU64::new(1_000_000);
    fn test_suspend_clock() -> Duration {
        Duration::from_millis(SUSPENDED_CLOCK_MS.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn time_the_machine_spent_suspended_ends_a_lease_too() {
        let t = LeaseTable::new("n1").with_suspend_clock(test_suspend_clock);
        let a = AccountId::parse("acct").unwrap();
        t.hold(
            &a,
            2,
            Instant::now(),
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        // 5 s pass on both clocks: still valid.
        tokio::time::advance(Duration::from_secs(5)).await;
        SUSPENDED_CLOCK_MS.fetch_add(5_000, Ordering::SeqCst);
        assert!(t.fence(&a).is_some());
        // The VM is suspended for 4 s: the monotonic clock does not move,
        // the suspend-counting one does. 9 s have passed for the database.
        SUSPENDED_CLOCK_MS.fetch_add(4_000, Ordering::SeqCst);
        assert_eq!(
            t.fence(&a),
            None,
            "8 s of 10 were used up, suspended or not"
        );
        // A renewal asked for now moves both deadlines.
        assert!(t.extend(
            &a,
            2,
            Instant::now(),
            Duration::from_secs(10),
            Duration::from_secs(2)
        ));
        assert!(t.fence(&a).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_stops_counting_before_the_database_would_expire_it() {
        let t = LeaseTable::new("n1");
        let a = AccountId::parse("acct").unwrap();
        let asked = Instant::now();
        // The answer came 2 s after the request: the deadline still counts
        // from the request.
        tokio::time::advance(Duration::from_secs(2)).await;
        t.hold(
            &a,
            7,
            asked,
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
        assert_eq!(t.fence(&a).map(|f| f.epoch), Some(7));
        tokio::time::advance(Duration::from_millis(6_999)).await;
        assert!(t.fence(&a).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            t.fence(&a),
            None,
            "9 s after the request, 1 s before expiry"
        );
        assert!(t.holds(&a), "still held until the keeper drops it");
        assert_eq!(t.drop_lease(&a), Some(7));
        assert!(t.fence(&a).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_renewal_never_brings_back_a_lease_dropped_or_taken_again() {
        let t = LeaseTable::new("n1");
        let a = AccountId::parse("acct").unwrap();
        let ttl = Duration::from_secs(10);
        let margin = Duration::from_secs(2);
        t.hold(&a, 3, Instant::now(), ttl, margin);
        // The renewal of epoch 3 was asked for here...
        let asked = Instant::now();
        // ...meanwhile a handover dropped the lease.
        assert!(t.drop_epoch(&a, 3));
        assert!(!t.extend(&a, 3, asked, ttl, margin));
        assert!(!t.holds(&a));
        // Taken again at epoch 4: neither a late renewal nor a late loss
        // of epoch 3 touches it.
        t.hold(&a, 4, Instant::now(), ttl, margin);
        tokio::time::advance(Duration::from_secs(7)).await;
        assert!(!t.extend(&a, 3, Instant::now(), ttl, margin));
        assert!(!t.drop_epoch(&a, 3));
        assert_eq!(t.fence(&a).map(|f| f.epoch), Some(4));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(t.fence(&a), None, "epoch 4's deadline was not moved");
        // Its own renewal moves it.
        assert!(t.extend(&a, 4, Instant::now(), ttl, margin));
        assert_eq!(t.fence(&a).map(|f| f.epoch), Some(4));
    }
}
