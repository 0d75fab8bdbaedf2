//! A stable hash for seeds and simulated ids: std's hasher is randomly
//! keyed per process, so a seeded simulation could not replay with it.
//! And the generator seeds drive, stable for the same reason.

/// The random generator behind every seed that is kept (the engine's
/// jitter and pacing, the simulator, the chaos simulation): ChaCha12 from
/// rand_chacha, whose output for a seed does not change across versions.
/// rand's `StdRng` is the same generator in rand 0.9, but rand may change
/// it in any release, which would silently change every kept seed's trace.
pub type SeededRng = rand_chacha::ChaCha12Rng;

/// FNV-1a, 64 bits.
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
