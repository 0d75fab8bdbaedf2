//! What a chaos seed is run with, and what it reports.

use super::faults::Breakage;

#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub seed: u64,
    /// Virtual hours of faults and operator actions, before the quiet
    /// period in which everything must settle.
    pub hours: u32,
    pub breakage: Option<Breakage>,
    /// Daemons sharing the store and the simulated WhatsApp. With more than
    /// one, accounts are owned through leases, and a fault may crash one
    /// daemon or cut it off from the store and WhatsApp for a while (a
    /// pause, a partition) while the others take its accounts over.
    pub nodes: usize,
}

impl ChaosOptions {
    pub fn seed(seed: u64) -> Self {
        Self {
            seed,
            hours: 10,
            breakage: None,
            nodes: 1,
        }
    }

    /// `seed` with `nodes` daemons.
    pub fn cluster(seed: u64, nodes: usize) -> Self {
        Self {
            nodes: nodes.max(1),
            ..Self::seed(seed)
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChaosReport {
    pub seed: u64,
    pub nodes: usize,
    pub violations: Vec<String>,
    pub runs: usize,
    pub sends: u64,
    pub resends: u64,
    pub restarts: u32,
    pub faults: u64,
    /// Several daemons: the leases deliveries were sent under (one per
    /// account and change of owner), so more than the accounts means
    /// accounts changed hands while sending.
    pub owners: usize,
    /// Participants counted from receipts, and receipts that counted
    /// nothing (see the `receipts` module).
    pub receipts_counted: u64,
    pub receipts_uncounted: u64,
    /// Poll votes that changed a voter's current choice.
    pub votes_counted: u64,
    /// Recalls and edits the operator asked and Herald accepted.
    pub amendments: usize,
    pub trace: u64,
}

impl ChaosReport {
    /// The line `herald bench chaos` prints for a failing seed.
    pub fn replay_hint(&self) -> String {
        let nodes = if self.nodes > 1 {
            format!(" --nodes {}", self.nodes)
        } else {
            String::new()
        };
        format!(
            "replay with: herald bench chaos --seed {}{nodes}",
            self.seed
        )
    }
}
