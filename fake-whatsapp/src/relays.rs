//! What the server relays from one client's device to the others', as
//! WhatsApp does, now or (for a device offline at the time) at the
//! device's next login:
//! - a group message a device sends: to the devices of other clients in
//!   the group (Baileys, in the tests), and, when the sender is not the
//!   account itself, to the account's linked devices (Herald), which
//!   fetched no keys for it: the sender opened its sessions from their
//!   uploaded pre-keys;
//! - the members' votes on the account's polls: to the account's linked
//!   devices and to every device of another client in the poll's group.
//!
//! The server never decrypts what it relays.

use super::external::{self, ExternalDevice};
use super::{Delivery, Shared};
use std::time::Instant;
use whatsapp_rust::wacore_binary::Node;

/// A login (user, device).
type Login = (u64, u32);

impl Shared {
    /// The account's linked devices.
    fn linked_logins(&self) -> Vec<Login> {
        let linked = self.linked.lock().unwrap();
        linked
            .iter()
            .filter_map(|l| Some((l.user.parse().ok()?, l.device)))
            .collect()
    }

    /// The members of `group` (phone numbers), the account apart.
    fn members_of(&self, group: &str) -> Vec<String> {
        let groups = self.groups.lock().unwrap();
        groups
            .iter()
            .filter(|g| g.jid == group)
            .flat_map(|g| g.members.clone())
            .collect()
    }

    /// Devices of other clients' in `group`, but `except`.
    fn externals_in(&self, group: &str, except: &str) -> Vec<ExternalDevice> {
        let members = self.members_of(group);
        let externals = self.externals.lock().unwrap();
        externals
            .devices
            .iter()
            .filter(|d| members.contains(&d.user) && d.jid() != except)
            .cloned()
            .collect()
    }

    /// The pre-key bundle of the account's linked device `jid` (phone
    /// number form) as it uploaded it, named `asked`; `None` for any
    /// other device, or before its upload.
    pub(super) fn linked_bundle(&self, jid: &str, asked: &str) -> Option<Node> {
        self.linked_keys.lock().unwrap().bundle(jid, asked)
    }

    /// Relays a group message the login on `conn` sent to the group's
    /// devices of other clients' and, unless the account sent it, to the
    /// account's linked devices.
    pub(super) fn relay(&self, conn: u64, group: &str, node: &Node) {
        let Some((user, device)) = self.login_on(conn) else {
            return;
        };
        let sender = external::device_jid(&user.to_string(), device);
        let mut to: Vec<String> = self
            .externals_in(group, &sender)
            .iter()
            .map(ExternalDevice::jid)
            .collect();
        if user.to_string() != self.phone.user {
            to.extend(
                self.linked_logins()
                    .into_iter()
                    .map(|(u, d)| external::device_jid(&u.to_string(), d)),
            );
        }
        let id = node
            .attrs
            .get("id")
            .map(|v| v.to_string())
            .unwrap_or_default();
        let mut externals = self.externals.lock().unwrap();
        externals.authors.insert(id, (user, device));
        for jid in to {
            let relayed = external::relay(node, group, &sender, &jid, |j| self.pn_jid(j));
            let Some(login) = external::login_of(&jid) else {
                continue;
            };
            let conn = self.logins.lock().unwrap().get(&login).copied();
            if conn.is_none_or(|c| self.send(c, relayed.clone()).is_err()) {
                externals.waiting.push((login, relayed));
            }
        }
    }

    /// Keeps a poll the login on `conn` sent, and queues the members'
    /// votes on it as the plan says.
    pub(super) fn plan_votes(&self, conn: u64, d: &Delivery) {
        if let Some((user, _)) = self.login_on(conn).filter(|_| d.read.kind == "poll") {
            let devices = self.devices_in(&d.group);
            let mut votes = self.votes.lock().unwrap();
            votes.sent(d, &user.to_string(), &devices, Instant::now());
        }
    }

    /// Casts the votes whose time has come, to the account's linked
    /// devices and the poll's group's devices of other clients', and
    /// relays what waits for a device that is online.
    pub(super) fn send_due_votes(&self) {
        let linked = self.linked_logins();
        let to = |group: &str| {
            let mut to = linked.clone();
            to.extend(
                self.externals_in(group, "")
                    .iter()
                    .filter_map(|d| external::login_of(&d.jid())),
            );
            to
        };
        let mut votes = self.votes.lock().unwrap();
        let uploaded = |jid: &str| {
            self.linked_bundle(jid, jid)
                .or_else(|| self.externals.lock().unwrap().bundle(jid, jid))
        };
        let mut recipients = self.recipients.lock().unwrap();
        votes.cast_due(
            Instant::now(),
            to,
            &mut recipients,
            |j| self.keys_of(j),
            uploaded,
        );
        drop(recipients);
        votes.relay(|login, node| {
            let conn = self.logins.lock().unwrap().get(&login).copied();
            conn.is_some_and(|c| self.send(c, node).is_ok())
        });
    }
}
