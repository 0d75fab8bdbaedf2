//! The reminders the chaos operator writes: a zone, a window and a
//! schedule drawn from the seed, a text, sometimes a picture and a poll,
//! to a run of the account's groups (now and then one it is not in).

use super::{Chaos, ZONES};
use crate::domain::*;
use rand::RngExt;

impl Chaos {
    pub(super) fn random_spec(
        &mut self,
        account: &AccountId,
        groups: &[GroupJid],
        image: &MediaId,
    ) -> NewReminder {
        let tz = ZONES[self.rng.random_range(0..ZONES.len())];
        let window = match self.rng.random_range(0..4) {
            0 => WindowHours::parse(0, 24),
            1 => WindowHours::parse(22, 6),
            2 => WindowHours::parse(6, 18),
            _ => WindowHours::parse(self.rng.random_range(0..20), 23),
        }
        .expect("window");
        let cron = match self.rng.random_range(0..3) {
            0 => format!("{} * * * *", self.rng.random_range(0..60)),
            1 => format!("{} */3 * * *", self.rng.random_range(0..60)),
            _ => format!("30 {} * * *", self.rng.random_range(0..24)),
        };
        let mut parts = vec![
            MessagePart::text(&format!("reminder {}", self.rng.random::<u16>())).expect("text"),
        ];
        if self.rng.random_bool(0.4) {
            parts.push(MessagePart::media(image.clone(), Some("see this")).expect("media part"));
        }
        parts.extend(self.polls.maybe_part());
        let n = self.rng.random_range(3..=40).min(groups.len());
        let start = self.rng.random_range(0..groups.len() - n + 1);
        let mut targets = groups[start..start + n].to_vec();
        if self.rng.random_bool(0.2) {
            // A group the account is not in: fails up front, never sent.
            targets.push(GroupJid::parse("120363999999999999@g.us").expect("jid"));
        }
        NewReminder::new(
            account.clone(),
            "chaos reminder",
            TimeZone::parse(tz).expect("zone"),
            Schedule::cron(&cron).expect("cron"),
            window,
            self.rng.random_bool(0.4),
            parts,
            targets,
        )
        .expect("valid reminder")
    }
}
