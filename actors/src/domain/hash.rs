//! A stable hash for seeds and simulated ids: std's hasher is randomly
//! keyed per process, so a seeded simulation could not replay with it.

/// FNV-1a, 64 bits.
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
