//! The time-lock promise: once a daemon has heard from WhatsApp that an
//! account's reach-out time-lock holds, it sends nothing more for it until
//! the lock ends, beyond the parts already under way.

use super::Chaos;

impl Chaos {
    /// (k) No send while a known time-lock holds, beyond the parts
    /// already in flight: once a daemon has heard from WhatsApp that the
    /// account's lock holds, at most a group-concurrency's worth of sends
    /// (those already under way) reaches WhatsApp before the lock ends —
    /// and as many again after each crash or cut-off during the lock, whose
    /// successor may have to learn it again.
    pub(super) fn check_timelocks(&mut self) {
        let attempts = self.wire.attempts.lock().expect("attempts").clone();
        let learned = self.wire.learned.lock().expect("learned").clone();
        let per_learning = self.config.group_concurrency as usize;
        let mut broken = Vec::new();
        for (account, from, until) in &self.record.timelocks {
            let Some(first) = learned
                .iter()
                .filter(|(a, at, end)| {
                    a == account && at >= from && at < until && *end == Some(*until)
                })
                .map(|(_, at, _)| *at)
                .min()
            else {
                continue;
            };
            let sent = attempts
                .iter()
                .filter(|(a, at)| a == account && *at > first && at < until)
                .count();
            let disrupted = self
                .record
                .disruptions
                .iter()
                .filter(|t| *t >= from && *t < until)
                .count();
            let allowed = per_learning * (1 + disrupted);
            if sent > allowed {
                broken.push(format!(
                    "{account}: {sent} sends while its time-lock until {until} was known (since \
                     {first}); at most {allowed} were already under way"
                ));
            }
        }
        broken.into_iter().for_each(|b| self.violation(b));
    }
}
