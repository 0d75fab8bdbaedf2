//! Which session, device-list and identity rows an account has, so that a
//! read of one it does not have costs no statement.
//!
//! A first send to a group reads each new member device's session and
//! identity and each member's device list before they exist: for 1,000
//! devices about 3,000 reads, every one answered "none", in about 1,600
//! statements (whatsapp-rust holds its cache's lock across each session
//! read, so those cannot be gathered).
//! Once an account has had [`BURST`] such misses of a kind in a row, each
//! within [`BURST_GAP`] of the last, the keys it has of that kind are read
//! once (keys only); from then on a read of a key that is neither among
//! them nor written since is answered "none" at once.
//!
//! The answer is never "none" for a row that exists:
//! - every key any backend of this process writes for the account is added
//!   before its write is sent ([`Known::writing`]), so a write that races
//!   the read of the keys is covered whichever commits first;
//! - the keys are used only under the lease fence they were read under: an
//!   account that moved to another daemon and back reads them again;
//! - rows written other than through a backend (the legacy import, a wipe)
//!   forget what was read ([`Known::forget`]).
//!
//! A key wrongly thought present (a deleted row, a hash collision) costs
//! only the statement it always cost.

use herald_actors::domain::Fence;
use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Misses in a row, each within [`BURST_GAP`] of the last, that have the
/// keys read: a large group's first send, not an idle account's odd read.
pub const BURST: u32 = 64;
pub const BURST_GAP: Duration = Duration::from_secs(5);

/// How many kinds are followed (the session store names them: sessions,
/// device lists and identities, what a first send reads before they exist).
pub const FOLLOWED: usize = 3;

/// One account's known keys, shared by every backend of it in this process.
pub struct Known {
    hasher: RandomState,
    followed: [i32; FOLLOWED],
    kinds: Mutex<[Kind; FOLLOWED]>,
}

#[derive(Default)]
struct Kind {
    /// Keys written through a backend since this process began; never
    /// cleared, so a write in flight is always covered.
    written: HashSet<u64>,
    /// The keys read from the database, and the fence they were read under.
    read: Option<(Option<Fence>, HashSet<u64>)>,
    misses: u32,
    last_miss: Option<Instant>,
    /// A read of the keys is under way (by one reader; the others go on
    /// asking the database meanwhile).
    reading: bool,
    /// Bumped by every [`Known::forget`]: a read of the keys begun before
    /// one is thrown away.
    generation: u64,
}

/// Handed to the reader of an account's keys by [`Known::missed`], and
/// back with what it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading(u64);

/// What a read of a followed kind should do.
#[derive(Debug, PartialEq, Eq)]
pub enum Ask {
    /// The account has no such row: answer "none" without a statement.
    Absent,
    /// Ask the database.
    Database,
}

impl Known {
    /// Follows the row kinds `followed`.
    pub fn new(followed: [i32; FOLLOWED]) -> Self {
        Self {
            hasher: RandomState::new(),
            followed,
            kinds: Default::default(),
        }
    }

    fn slot(&self, kind: i32) -> Option<usize> {
        self.followed.iter().position(|k| *k == kind)
    }

    fn kinds(&self) -> std::sync::MutexGuard<'_, [Kind; FOLLOWED]> {
        // Nothing panics while holding it; a poisoned set is still whole.
        self.kinds.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn hash(&self, k: &str) -> u64 {
        self.hasher.hash_one(k)
    }

    /// Before a write is sent: the keys it puts exist from now on.
    pub fn writing<'a>(&self, puts: impl IntoIterator<Item = (i32, &'a str)>) {
        let mut kinds = self.kinds();
        for (kind, k) in puts {
            if let Some(i) = self.slot(kind) {
                let h = self.hash(k);
                kinds[i].written.insert(h);
            }
        }
    }

    /// How to answer a read of `kind`/`k` under `fence` (`None` for a
    /// daemon without leases; the caller passes what the lease table says
    /// now).
    pub fn ask(&self, kind: i32, k: &str, fence: &Option<Fence>) -> Ask {
        let Some(i) = self.slot(kind) else {
            return Ask::Database;
        };
        let h = self.hash(k);
        let kinds = self.kinds();
        match &kinds[i].read {
            Some((at, keys))
                if at == fence && !keys.contains(&h) && !kinds[i].written.contains(&h) =>
            {
                Ask::Absent
            }
            _ => Ask::Database,
        }
    }

    /// The database answered "none" for a read of `kind`: `Some` when this
    /// reader should now read the account's keys (it then must call
    /// [`Known::read`] or [`Known::read_failed`] with what it was given).
    pub fn missed(&self, kind: i32, now: Instant) -> Option<Reading> {
        let i = self.slot(kind)?;
        let mut kinds = self.kinds();
        let slot = &mut kinds[i];
        let in_a_row = slot
            .last_miss
            .is_some_and(|last| now.saturating_duration_since(last) <= BURST_GAP);
        slot.misses = if in_a_row { slot.misses + 1 } else { 1 };
        slot.last_miss = Some(now);
        if slot.misses >= BURST && slot.read.is_none() && !slot.reading {
            slot.reading = true;
            return Some(Reading(slot.generation));
        }
        None
    }

    /// The keys of `kind` as read under `fence`, the read having started
    /// after [`Known::missed`] gave `reading`. Thrown away if the rows were
    /// changed outside the backends since ([`Known::forget`]).
    pub fn read(&self, kind: i32, reading: Reading, fence: Option<Fence>, keys: &[String]) {
        let Some(i) = self.slot(kind) else {
            return;
        };
        let keys = keys.iter().map(|k| self.hash(k)).collect();
        let mut kinds = self.kinds();
        let slot = &mut kinds[i];
        if slot.reading && Reading(slot.generation) == reading {
            slot.read = Some((fence, keys));
            slot.reading = false;
        }
    }

    /// The read of the keys failed: the next burst tries again.
    pub fn read_failed(&self, kind: i32, reading: Reading) {
        if let Some(i) = self.slot(kind) {
            let mut kinds = self.kinds();
            let slot = &mut kinds[i];
            if Reading(slot.generation) == reading {
                slot.reading = false;
                slot.misses = 0;
            }
        }
    }

    /// Rows changed other than through a backend: what was read, or is
    /// being read, is forgotten (what was written is kept: it may still
    /// be in flight).
    pub fn forget(&self) {
        for slot in self.kinds().iter_mut() {
            slot.read = None;
            slot.reading = false;
            slot.misses = 0;
            slot.generation += 1;
        }
    }

    /// Keys held in memory, for the tests and the note on memory.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.kinds()
            .iter()
            .map(|s| s.written.len() + s.read.as_ref().map_or(0, |(_, k)| k.len()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_actors::domain::AccountId;
    use proptest::prelude::*;

    /// The session kind's number (the tests name no backend: no circle).
    const SESSION: i32 = 3;

    impl Default for Known {
        fn default() -> Self {
            Known::new([SESSION, 12, 2])
        }
    }

    fn fence(epoch: i64) -> Option<Fence> {
        Some(Fence {
            account: AccountId::parse("acc-1").unwrap(),
            node: "n1".into(),
            epoch,
        })
    }

    /// `BURST` misses in a row: what the last hands the reader of the keys.
    fn burst(known: &Known, now: Instant) -> Option<Reading> {
        (0..BURST).fold(None, |asked, _| known.missed(SESSION, now).or(asked))
    }

    #[test]
    fn a_burst_of_misses_has_the_keys_read_once_and_then_answers_absent() {
        let known = Known::default();
        let t0 = Instant::now();
        assert_eq!(known.ask(SESSION, "a", &fence(1)), Ask::Database);
        let reading = burst(&known, t0).expect("the 64th miss asks for the keys");
        assert_eq!(
            known.missed(SESSION, t0),
            None,
            "once, while the read is under way"
        );
        known.read(SESSION, reading, fence(1), &["a".into(), "b".into()]);
        assert_eq!(known.ask(SESSION, "a", &fence(1)), Ask::Database);
        assert_eq!(known.ask(SESSION, "zz", &fence(1)), Ask::Absent);
        // Written since: present.
        known.writing([(SESSION, "zz")]);
        assert_eq!(known.ask(SESSION, "zz", &fence(1)), Ask::Database);
        // Another fence (the account moved away and back): the database.
        assert_eq!(known.ask(SESSION, "yy", &fence(2)), Ask::Database);
        assert_eq!(known.ask(SESSION, "yy", &None), Ask::Database);
        // Another kind is not followed.
        assert_eq!(known.ask(99, "yy", &fence(1)), Ask::Database);
        known.forget();
        assert_eq!(known.ask(SESSION, "yy", &fence(1)), Ask::Database);
        assert_eq!(known.held(), 1, "what was written is kept");

        // A read of the keys begun before a change outside the backends is
        // thrown away, even when another burst has begun a new read since.
        let stale = burst(&known, t0).unwrap();
        known.forget();
        let fresh = burst(&known, t0).unwrap();
        known.read(SESSION, stale, fence(1), &[]);
        assert_eq!(known.ask(SESSION, "behind", &fence(1)), Ask::Database);
        known.read(SESSION, fresh, fence(1), &["behind".into()]);
        assert_eq!(known.ask(SESSION, "behind", &fence(1)), Ask::Database);
        assert_eq!(known.ask(SESSION, "other", &fence(1)), Ask::Absent);
    }

    #[test]
    fn misses_far_apart_never_make_a_burst() {
        let known = Known::default();
        let mut now = Instant::now();
        for _ in 0..(3 * BURST) {
            assert_eq!(known.missed(SESSION, now), None);
            now += BURST_GAP + Duration::from_millis(1);
        }
        // A failed read lets the next burst try again.
        let reading = burst(&known, now).unwrap();
        known.read_failed(SESSION, reading);
        assert_eq!(known.ask(SESSION, "x", &fence(1)), Ask::Database);
        assert!(burst(&known, now).is_some());
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// A backend is about to send a write of key `k`.
        Begin(u8),
        /// The oldest write in flight (index modulo) commits.
        Commit(usize),
        /// A miss burst; the keys are read now (a snapshot of the database)
        /// and handed over at a later `Finish`.
        Burst,
        Finish,
        /// Another daemon takes the account, writes `k`, and this one gets
        /// it back under a new fence.
        Moved(u8),
        Ask(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0u8..24).prop_map(Step::Begin),
            3 => any::<usize>().prop_map(Step::Commit),
            1 => Just(Step::Burst),
            1 => Just(Step::Finish),
            1 => (0u8..24).prop_map(Step::Moved),
            6 => (0u8..24).prop_map(Step::Ask),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]
        /// Whatever the interleaving of writes, their commits, the read of
        /// the keys and moves of the account, "absent" is never answered for
        /// a row the database holds.
        #[test]
        fn absent_is_never_answered_for_a_row_that_exists(
            steps in proptest::collection::vec(step(), 1..120),
        ) {
            let known = Known::default();
            let now = Instant::now();
            let mut db: HashSet<String> = HashSet::new();
            let mut in_flight: Vec<String> = Vec::new();
            let mut epoch = 1;
            let mut reading: Option<(Reading, Option<Fence>, Vec<String>)> = None;
            for step in steps {
                match step {
                    Step::Begin(k) => {
                        let k = format!("k{k}");
                        known.writing([(SESSION, k.as_str())]);
                        in_flight.push(k);
                    }
                    Step::Commit(i) if !in_flight.is_empty() => {
                        let k = in_flight.remove(i % in_flight.len());
                        db.insert(k);
                    }
                    Step::Commit(_) => {}
                    Step::Burst => {
                        if let Some(r) = burst(&known, now) {
                            reading = Some((r, fence(epoch), db.iter().cloned().collect()));
                        }
                    }
                    Step::Finish => {
                        if let Some((r, at, keys)) = reading.take() {
                            known.read(SESSION, r, at, &keys);
                        }
                    }
                    Step::Moved(k) => {
                        db.insert(format!("k{k}"));
                        epoch += 1;
                    }
                    Step::Ask(k) => {
                        let k = format!("k{k}");
                        if known.ask(SESSION, &k, &fence(epoch)) == Ask::Absent {
                            prop_assert!(!db.contains(&k), "{k} exists, answered absent");
                        }
                    }
                }
            }
        }
    }
}
