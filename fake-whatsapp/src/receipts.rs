//! Receipts the members' devices send for a group message, relayed to the
//! sender as WhatsApp relays them: one `<receipt>` per device that got the
//! message (no `type`: delivered), some at once and some later as if the
//! device had been offline (`offline` set), and `type="read"` from the
//! phones of a share of the members after a delay. Off unless a test sets
//! a [`ReceiptPlan`].

use std::time::Duration;
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::Node;

/// Which receipts a group message gets, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptPlan {
    /// Share (0–1) of the member devices whose delivery receipt comes at
    /// once; the others' come after `late_after`, marked offline.
    pub at_once: f64,
    pub late_after: Duration,
    /// Share (0–1) of the members whose phone sends a read receipt, after
    /// `read_after`.
    pub read_share: f64,
    pub read_after: Duration,
}

/// A receipt the server relayed to the sender's connection `conn`; one
/// due while the sender is offline waits for its next login (and goes
/// out marked `offline`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptSent {
    pub group: String,
    pub message_id: String,
    /// The member device (`user[:device]@s.whatsapp.net`).
    pub participant: String,
    /// `delivery` or `read`.
    pub kind: &'static str,
    pub offline: bool,
    pub conn: Option<u64>,
}

/// Whether the `i`-th of `n` takes the first `share` of places: the same
/// ones every time, so a test can count what to expect.
pub(super) fn within(i: usize, n: usize, share: f64) -> bool {
    (i as f64) < (n as f64 * share.clamp(0.0, 1.0)).ceil()
}

/// Every receipt of one message: (when, what), in the order the plan sends
/// them. `devices` lists each member's device JIDs, the phone first.
pub(super) fn planned(
    plan: &ReceiptPlan,
    group: &str,
    message_id: &str,
    devices: &[Vec<String>],
) -> Vec<(Duration, ReceiptSent)> {
    let all: Vec<&String> = devices.iter().flatten().collect();
    let mut out = Vec::new();
    for (i, device) in all.iter().enumerate() {
        let now = within(i, all.len(), plan.at_once);
        out.push((
            if now { Duration::ZERO } else { plan.late_after },
            ReceiptSent {
                group: group.to_owned(),
                message_id: message_id.to_owned(),
                participant: (*device).clone(),
                kind: "delivery",
                offline: !now,
                conn: None,
            },
        ));
    }
    for (i, member) in devices.iter().enumerate() {
        if let Some(phone) = member
            .first()
            .filter(|_| within(i, devices.len(), plan.read_share))
        {
            out.push((
                plan.read_after,
                ReceiptSent {
                    group: group.to_owned(),
                    message_id: message_id.to_owned(),
                    participant: phone.clone(),
                    kind: "read",
                    offline: false,
                    conn: None,
                },
            ));
        }
    }
    out.sort_by_key(|(at, _)| *at);
    out
}

/// The stanza the sender gets for `r`.
pub(super) fn node(r: &ReceiptSent) -> Node {
    let mut b = NodeBuilder::new("receipt")
        .attr("from", r.group.clone())
        .attr("participant", r.participant.clone())
        .attr("id", r.message_id.clone())
        .attr("t", chrono::Utc::now().timestamp().to_string());
    if r.kind == "read" {
        b = b.attr("type", "read");
    }
    if r.offline {
        b = b.attr("offline", "0");
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_sends_each_device_one_delivery_and_the_share_of_phones_a_read() {
        let plan = ReceiptPlan {
            at_once: 0.5,
            late_after: Duration::from_secs(2),
            read_share: 0.5,
            read_after: Duration::from_secs(1),
        };
        let devices: Vec<Vec<String>> = (0..3)
            .map(|m| {
                vec![
                    format!("m{m}@s.whatsapp.net"),
                    format!("m{m}:1@s.whatsapp.net"),
                ]
            })
            .collect();
        let p = planned(&plan, "g@g.us", "3EB0A", &devices);
        let delivered: Vec<_> = p.iter().filter(|(_, r)| r.kind == "delivery").collect();
        let read: Vec<_> = p.iter().filter(|(_, r)| r.kind == "read").collect();
        assert_eq!(delivered.len(), 6);
        assert_eq!(delivered.iter().filter(|(at, _)| at.is_zero()).count(), 3);
        assert!(delivered.iter().all(|(at, r)| r.offline != at.is_zero()));
        // ceil(3 × 0.5) = 2 members read, each from their phone.
        assert_eq!(read.len(), 2);
        assert!(read.iter().all(|(_, r)| !r.participant.contains(':')));
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
    }
}
