//! A stable hash for seeds and simulated ids: std's hasher is randomly
//! keyed per process, so a seeded simulation could not replay with it.
//! And the generator seeds drive, stable for the same reason.

/// The random generator behind every seed that is kept (the engine's
/// jitter and pacing, the simulator, the chaos simulation): ChaCha12 from
/// chacha20, whose output for a seed does not change across versions (it
/// is rand_chacha 0.9's stream, which the kept seeds were drawn with; the
/// tests below pin it). rand's `StdRng` is the same generator in rand 0.10,
/// but rand may change it in any release, which would silently change
/// every kept seed's trace.
pub type SeededRng = chacha20::ChaCha12Rng;

/// FNV-1a, 64 bits.
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::SeededRng;
    use rand::{Rng, RngExt, SeedableRng};

    // The stream every kept seed replays: pinned as rand_chacha 0.9 drew
    // it, so a change of crate or version that moves it fails here before
    // it moves the chaos traces.
    #[test]
    fn a_seed_draws_the_same_stream() {
        let mut rng = SeededRng::seed_from_u64(42);
        let words: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
        assert_eq!(
            words,
            [
                9713269763989775522,
                10011513049433592189,
                11740708795755607249,
                7487565853151867058
            ]
        );

        // A u64 straddling the generator's buffer (64 words) takes the
        // last word of one and the first of the next.
        let mut rng = SeededRng::seed_from_u64(7);
        for _ in 0..63 {
            rng.next_u32();
        }
        assert_eq!(rng.next_u64(), 3141109052421890129);
        assert_eq!(rng.next_u32(), 4105668555);
    }

    // The draws seeded code makes (ranges, coin flips, floats): their
    // sampling is rand's, so it is pinned too.
    #[test]
    fn a_seed_samples_the_same_draws() {
        let mut rng = SeededRng::seed_from_u64(42);
        assert_eq!(rng.next_u32(), 572990626);
        assert_eq!(rng.next_u64(), 4588413194934712163);
        assert_eq!(rng.random_range(0..1000), 542);
        assert_eq!(rng.random_range(0..17usize), 14);
        assert_eq!(rng.random_range(1..=3), 2);
        assert_eq!(rng.random_range(10u64..180), 79);
        assert!(rng.random_bool(0.4));
        assert!(!rng.random_bool(0.03));
        assert_eq!(rng.random::<u16>(), 30971);
        assert_eq!(rng.random::<u64>(), 3426877816493824232);
        assert_eq!(rng.random::<f64>(), 0.6293413263860278);
        assert_eq!(rng.random_range(0.0..=1.0), 0.47940409885050683);
        assert_eq!(rng.random_range(1.0..1.25), 1.2054888936110801);
        assert_eq!(rng.random_range(0.8..1.2), 1.0395426759433137);
        let flips: Vec<bool> = (0..16).map(|_| rng.random_bool(0.5)).collect();
        assert_eq!(
            flips,
            [
                false, false, false, false, false, true, true, false, true, true, false, true,
                true, true, true, false
            ]
        );
    }
}
