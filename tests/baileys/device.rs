//! A group member's device run by Baileys (`member.mjs`), for the tests
//! that put an independent WhatsApp Web client on the receiving end of
//! the fake server: start it, link it as a member's device, read what it
//! decrypted.
//!
//! Needs Node.js and `npm ci` in `tests/baileys`; [`baileys`] says why a
//! test skips without them, and fails instead where
//! `HERALD_REQUIRE_BAILEYS` is set (CI).

// Each test binary that includes this file uses a part of it.
#![allow(dead_code)]

use herald_fake_whatsapp::{FakeWhatsApp, Group};
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Two members whose devices Baileys runs in the tests.
pub const ALICE: &str = "15557770001";
pub const BOB: &str = "15557770002";

/// Three groups, each with Alice, Bob and one simulated member.
pub fn groups() -> Vec<Group> {
    (1..=3)
        .map(|i| Group {
            jid: format!("120363{i:012}@g.us"),
            subject: format!("Team {i}"),
            members: vec![ALICE.into(), BOB.into(), format!("1555{i:04}000")],
            announce: false,
        })
        .collect()
}

/// `tests/baileys` when Node and Baileys are there; `None` (with the
/// reason printed) where a test may skip.
pub fn baileys() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/baileys");
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let why = if !node {
        "node is not installed"
    } else if !dir.join("node_modules/baileys/package.json").exists() {
        "Baileys is not installed: run `npm ci --omit=dev --omit=peer` in tests/baileys"
    } else {
        return Some(dir);
    };
    assert!(
        std::env::var_os("HERALD_REQUIRE_BAILEYS").is_none(),
        "{why}, and HERALD_REQUIRE_BAILEYS is set"
    );
    eprintln!("SKIPPED: the Baileys member test: {why}");
    None
}

/// One member's device: `node member.mjs` and the events it printed.
pub struct Device {
    child: Child,
    events: mpsc::Receiver<Value>,
    seen: Vec<Value>,
    pub jid: String,
    stderr: PathBuf,
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Device {
    /// Starts Baileys with its auth state in `auth`, has `member`'s phone
    /// scan its QR, and waits until it is logged in with its pre-keys on
    /// the server.
    pub fn link(dir: &Path, fake: &FakeWhatsApp, auth: &Path, member: &str) -> Device {
        let mut d = Device::spawn(dir, fake, auth);
        let qr = d.wait(Duration::from_secs(30), "a QR code", |seen| {
            seen.iter().rev().find(|e| e["event"] == "qr").cloned()
        });
        d.jid = fake
            .scan_as_member(qr["qr"].as_str().unwrap(), member)
            .unwrap();
        d.logged_in();
        let deadline = Instant::now() + Duration::from_secs(30);
        while fake.prekeys_of(&d.jid) == 0 {
            assert!(Instant::now() < deadline, "{}: no pre-keys uploaded", d.jid);
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// Starts Baileys again on the auth state a linked device left in
    /// `auth`: it logs in as that device, without a QR code.
    pub fn resume(dir: &Path, fake: &FakeWhatsApp, auth: &Path, jid: &str) -> Device {
        let mut d = Device::spawn(dir, fake, auth);
        d.jid = jid.to_owned();
        d.logged_in();
        d
    }

    fn logged_in(&mut self) {
        self.wait(Duration::from_secs(30), "the login", |seen| {
            seen.iter().any(|e| e["event"] == "open").then_some(())
        });
    }

    fn spawn(dir: &Path, fake: &FakeWhatsApp, auth: &Path) -> Device {
        let stderr = auth.with_extension("stderr");
        let mut child = Command::new("node")
            .arg(dir.join("member.mjs"))
            .arg(fake.url())
            .arg(auth)
            // The fake's media host has a self-signed certificate, and
            // Baileys downloads with Node's own fetch.
            .env("NODE_TLS_REJECT_UNAUTHORIZED", "0")
            .env("NODE_NO_WARNINGS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("starting node");
        let (tx, events) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|_| json!({"event": "line", "line": line}));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        Device {
            child,
            events,
            seen: Vec::new(),
            jid: String::new(),
            stderr,
        }
    }

    /// Takes events until `found` finds something in all of them.
    fn wait<T>(
        &mut self,
        within: Duration,
        what: &str,
        found: impl Fn(&[Value]) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(t) = found(&self.seen) {
                return t;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .events
                .recv_timeout(left.min(Duration::from_millis(200)))
            {
                Ok(e) => self.seen.push(e),
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {}
                Err(e) => panic!(
                    "{}: no {what} within {within:?} ({e}); it printed {:#?}\n{}",
                    self.jid,
                    self.seen,
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                ),
            }
        }
    }

    /// Has Baileys send `text` to `group`; answers the message id.
    pub fn send(&mut self, group: &str, text: &str) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{}", json!({"send": {"group": group, "text": text}})).unwrap();
        stdin.flush().unwrap();
        let sent = self.wait(Duration::from_secs(30), "send", |seen| {
            seen.iter()
                .find(|e| e["event"] == "sent" && e["group"] == group)
                .cloned()
        });
        sent["id"].as_str().unwrap().to_owned()
    }

    /// What Baileys' own calls read of the account's standing from the
    /// server: `{"timelock":{"active","until","kind"},"quota":{…}}`.
    pub fn standing(&mut self) -> Value {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{}", json!({"standing": true})).unwrap();
        stdin.flush().unwrap();
        self.seen.retain(|e| e["event"] != "standing");
        self.wait(Duration::from_secs(30), "standing", |seen| {
            seen.iter().find(|e| e["event"] == "standing").cloned()
        })
    }

    /// Has Baileys vote `options` (by name; none withdraws) on the poll
    /// `poll_id` it read in `group`; answers the vote's message id.
    pub fn vote(&mut self, group: &str, poll_id: &str, options: &[&str]) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        let vote = json!({"vote": {"group": group, "poll_id": poll_id, "options": options}});
        writeln!(stdin, "{vote}").unwrap();
        stdin.flush().unwrap();
        let voted = self.wait(Duration::from_secs(30), "a vote sent", |seen| {
            seen.iter()
                .find(|e| {
                    (e["event"] == "voted" && e["poll_id"] == poll_id) || e["event"] == "error"
                })
                .cloned()
        });
        assert_eq!(voted["event"], "voted", "{}: {voted}", self.jid);
        voted["id"].as_str().unwrap().to_owned()
    }

    /// Waits until Baileys' own count of each poll in `want` (by poll
    /// message id: the voters per option, in the poll's order) is that;
    /// fails on a vote it could not open.
    pub fn wait_tallies(&mut self, want: &std::collections::BTreeMap<String, Vec<u64>>) {
        let counts = |tally: &Value, options: &[String]| -> Vec<u64> {
            let tally = tally.as_array().unwrap();
            options
                .iter()
                .map(|o| {
                    tally
                        .iter()
                        .find(|t| t["name"] == o.as_str())
                        .map_or(0, |t| t["voters"].as_array().unwrap().len() as u64)
                })
                .collect()
        };
        let options: std::collections::HashMap<String, Vec<String>> = self
            .seen
            .iter()
            .filter(|e| e["event"] == "message" && e["poll"].is_object())
            .map(|e| {
                let o = e["poll"]["options"].as_array().unwrap();
                let o = o.iter().map(|o| o.as_str().unwrap().to_owned()).collect();
                (e["id"].as_str().unwrap().to_owned(), o)
            })
            .collect();
        let jid = self.jid.clone();
        self.wait(Duration::from_secs(60), "the count", |seen| {
            let bad: Vec<&Value> = seen
                .iter()
                .filter(|e| e["event"] == "vote_undecryptable" || e["event"] == "error")
                .collect();
            assert!(bad.is_empty(), "{jid}: {bad:#?}");
            let latest = |id: &str| {
                seen.iter()
                    .rev()
                    .find(|e| e["event"] == "poll" && e["poll_id"] == id)
            };
            want.iter()
                .all(|(id, want)| {
                    latest(id).is_some_and(|e| counts(&e["tally"], &options[id]) == *want)
                })
                .then_some(())
        });
    }

    /// The messages it decrypted, once it has `n`; fails at once on a
    /// message it could not decrypt.
    pub fn messages(&mut self, n: usize) -> Vec<Value> {
        let bad = |e: &&Value| e["event"] == "undecryptable" || e["event"] == "error";
        self.wait(Duration::from_secs(60), &format!("{n} messages"), |seen| {
            let got = seen.iter().filter(|e| e["event"] == "message").count();
            (got >= n || seen.iter().any(|e| bad(&e))).then_some(())
        });
        let failed: Vec<&Value> = self.seen.iter().filter(bad).collect();
        assert!(failed.is_empty(), "{}: {failed:#?}", self.jid);
        self.seen
            .iter()
            .filter(|e| e["event"] == "message")
            .cloned()
            .collect()
    }
}
