//! Baileys on the receiving side: two members' devices run by Baileys
//! (`member.mjs`), a WhatsApp Web client with its own Signal
//! implementation that nobody here wrote, linked through the fake server
//! and put in the groups Herald sends to. What Herald's real-protocol
//! account sends must decrypt there, not only on the fake's own simulated
//! members, which share whatsapp-rust's libsignal.
//!
//! Needs Node.js and `npm ci` in `tests/baileys`; skipped with a message
//! without them, a failure where `HERALD_REQUIRE_BAILEYS` is set (CI).

use super::baileys_device::{baileys, groups, Device, ALICE, BOB};
use super::*;
use sha2::{Digest, Sha256};

/// Fires a text to `groups` and waits for the run to succeed.
fn send_text(h: &Herald, groups: &[String], text: &str) -> i64 {
    let run = fire(h, "wa", groups, json!([{"kind": "text", "text": text}]));
    let done = wait_run_end(h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());
    run
}

/// Per group, the message id Herald stored for `run` (its last part's).
fn message_ids(h: &Herald, run: i64) -> BTreeMap<String, String> {
    targets(h, run)
        .iter()
        .map(|t| {
            (
                t["group"].as_str().unwrap().to_owned(),
                t["message_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A run of a text and a picture to three groups: each Baileys device
/// decrypts both parts in every group, in order, once, under the ids
/// Herald stored; the text is the variant Herald chose for that group (the
/// fake's simulated member, on whatsapp-rust's libsignal, read the same);
/// the picture, downloaded from the fake's media host and decrypted with
/// the message's key, is the file Herald was given, and its hashes and MAC
/// match what the message says. Both devices' delivery and read receipts
/// are what Herald counts. After a SIGKILL and a restart, the next run
/// still decrypts (sessions and sender keys came back from the database),
/// and its edit and recall arrive as Baileys' edit and revoke of the
/// right message ids. No device ever asks for a message again.
#[test]
fn baileys_members_decrypt_every_message_and_their_receipts_are_counted() {
    let Some(node_dir) = baileys() else { return };
    let fake = FakeWhatsApp::start();
    let groups = groups();
    fake.set_groups(groups.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut alice = Device::link(&node_dir, &fake, &dir.path().join("alice"), ALICE);
    let mut bob = Device::link(&node_dir, &fake, &dir.path().join("bob"), BOB);
    assert_eq!(fake.external_devices().len(), 2);

    let mut h = paired(&fake, dir.path(), &FAST);
    let png = tiny_png();
    let (status, text) = http_raw(
        h.port,
        "POST",
        "/v1/media?filename=agenda.png",
        "image/png",
        &png,
    )
    .unwrap();
    assert_eq!(status, 201, "{text}");
    let media: Value = serde_json::from_str(&text).unwrap();
    let jids: Vec<String> = groups.iter().map(|g| g.jid.clone()).collect();
    let run = fire(
        &h,
        "wa",
        &jids,
        json!([
            {"kind": "text", "text": "{Hi|Hello|Good morning} {group_name}: standup at 10"},
            {"kind": "media", "media": media["id"], "caption": "Agenda for {group_name}"},
        ]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());

    // What the server got, per group: (id, what its simulated member read).
    let sent: BTreeMap<String, Vec<(String, Option<String>)>> =
        fake.deliveries().iter().fold(BTreeMap::new(), |mut m, d| {
            if d.seen_before == 0 {
                m.entry(d.group.clone())
                    .or_default()
                    .push((d.id.clone(), d.read.text.clone()));
            }
            m
        });
    let stored = message_ids(&h, run);
    let png_sha = format!("{:x}", Sha256::digest(&png));
    for device in [&mut alice, &mut bob] {
        let got = device.messages(2 * groups.len());
        assert_eq!(
            got.len(),
            2 * groups.len(),
            "{}: once each: {got:#?}",
            device.jid
        );
        for g in &groups {
            let mine: Vec<&Value> = got
                .iter()
                .filter(|m| m["group"] == g.jid.as_str())
                .collect();
            let sent = &sent[&g.jid];
            let ids: Vec<&str> = mine.iter().map(|m| m["id"].as_str().unwrap()).collect();
            let want: Vec<&str> = sent.iter().map(|(id, _)| id.as_str()).collect();
            assert_eq!(ids, want, "{}: {} in order", device.jid, g.jid);
            assert!(
                stored[&g.jid].starts_with(want[1]),
                "the last part's id is stored"
            );
            let (text, picture) = (mine[0], mine[1]);
            assert_eq!(
                text["participant"]
                    .as_str()
                    .map(|p| p.split('@').next().unwrap()),
                Some(fake.phone().user.as_str())
            );
            let said = text["text"].as_str().unwrap();
            assert_eq!(
                Some(said),
                sent[0].1.as_deref(),
                "the simulated member read the same"
            );
            assert!(
                ["Hi", "Hello", "Good morning"]
                    .iter()
                    .any(|w| said == format!("{w} {}: standup at 10", g.subject)),
                "{said}"
            );
            assert_eq!(picture["caption"], format!("Agenda for {}", g.subject));
            let image = &picture["image"];
            assert_eq!(image["sha256"], png_sha.as_str(), "{image}");
            assert_eq!(image["bytes"], png.len(), "{image}");
            for check in [
                "sha256_matches",
                "enc_sha256_matches",
                "mac_matches",
                "length_matches",
            ] {
                assert_eq!(image[check], true, "{check}: {image}");
            }
            assert_eq!(image["mimetype"], "image/png");
        }
    }

    // Each device delivered ("inactive": Baileys has not set itself
    // online) and read each message; Herald counts both members per group.
    let expect: BTreeMap<String, (u64, u64)> = jids.iter().map(|j| (j.clone(), (2, 2))).collect();
    wait_counts(&h, run, &expect);
    let relayed = fake.receipts();
    for r in &relayed {
        assert!(
            r.participant == alice.jid || r.participant == bob.jid,
            "{r:?}"
        );
    }
    assert_eq!(
        relayed.iter().filter(|r| r.kind == "read").count(),
        2 * 2 * groups.len()
    );

    // SIGKILL and restart: the account's Signal state comes back from the
    // database, and the next run decrypts on Baileys with the same sessions
    // and the next steps of the same sender-key chains.
    h.kill9();
    let h = Herald::start_with(dir.path(), &fake, &FAST);
    h.wait_until("/v1/accounts/wa", Duration::from_secs(60), |v| {
        v["state"] == "connected"
    });
    let again = send_text(&h, &jids, "Standup moved to 11");
    let second = message_ids(&h, again);
    for device in [&mut alice, &mut bob] {
        let got = device.messages(3 * groups.len());
        for m in &got[2 * groups.len()..] {
            assert_eq!(m["text"], "Standup moved to 11", "{m}");
            assert!(second[m["group"].as_str().unwrap()].starts_with(m["id"].as_str().unwrap()));
        }
    }

    // The edit, then the recall, of that run.
    let amend = |ask: &str, body: Option<Value>| {
        let (status, r) = h.call("POST", &format!("/v1/runs/{again}/{ask}"), body);
        assert_eq!(status, 202, "{r}");
        h.wait_until(&format!("/v1/runs/{again}"), Duration::from_secs(60), |r| {
            !r["amendment"]["finished_at"].is_null()
        });
    };
    amend("edit", Some(json!({"text": "Standup moved to 11:30"})));
    amend("recall", None);
    for device in [&mut alice, &mut bob] {
        let got = device.messages(5 * groups.len());
        let amendments = &got[3 * groups.len()..];
        for (kind, text) in [("edit", Some("Standup moved to 11:30")), ("revoke", None)] {
            let of_kind: Vec<&Value> = amendments
                .iter()
                .filter(|m| m["protocol"] == kind)
                .collect();
            assert_eq!(
                of_kind.len(),
                groups.len(),
                "{}: one {kind} per group: {amendments:#?}",
                device.jid
            );
            for m in of_kind {
                let group = m["group"].as_str().unwrap();
                assert!(
                    second[group].starts_with(m["refers_to"].as_str().unwrap()),
                    "the {kind} names the run's message in {group}: {m}"
                );
                assert_eq!(m["text"].as_str(), text, "{m}");
            }
        }
    }

    // Bob's device is off while a run goes out: the fake keeps its
    // messages, as WhatsApp's offline queue does, and it decrypts them when
    // it logs in again.
    let bob_jid = bob.jid.clone();
    drop(bob);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.online(&bob_jid) {
        assert!(
            Instant::now() < deadline,
            "the fake still has Bob's connection"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    send_text(&h, &jids, "Retro at 4");
    let mut bob = Device::resume(&node_dir, &fake, &dir.path().join("bob"), &bob_jid);
    let got = bob.messages(groups.len());
    let texts: Vec<&str> = got.iter().map(|m| m["text"].as_str().unwrap()).collect();
    assert_eq!(texts, vec!["Retro at 4"; groups.len()], "{got:#?}");
    alice.messages(6 * groups.len());
    assert_eq!(
        fake.retries(),
        vec![],
        "no device asked for a message again"
    );
}

/// Baileys on the sending side, once: Alice's Baileys device sends a text
/// to a group. The fake's server side (group info, device lists with
/// signed key indexes, pre-key bundles, the relay) serves a client it was
/// not written for: the group's simulated member devices, on
/// whatsapp-rust's libsignal, decrypt it, and so does Bob's Baileys device.
#[test]
fn a_baileys_member_sends_to_a_group_and_every_other_device_decrypts_it() {
    let Some(node_dir) = baileys() else { return };
    let fake = FakeWhatsApp::start();
    let groups = groups();
    fake.set_groups(groups.clone());
    // Each member has a phone and a companion, simulated, besides the
    // Baileys devices.
    fake.set_member_devices(2);
    let dir = tempfile::tempdir().unwrap();
    let mut alice = Device::link(&node_dir, &fake, &dir.path().join("alice"), ALICE);
    let mut bob = Device::link(&node_dir, &fake, &dir.path().join("bob"), BOB);

    let group = &groups[1].jid;
    let id = alice.send(group, "Who brings the cake on Friday?");
    let deadline = Instant::now() + Duration::from_secs(30);
    let d = loop {
        if let Some(d) = fake.deliveries().into_iter().find(|d| d.id == id) {
            break d;
        }
        assert!(Instant::now() < deadline, "the fake got no {id}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(d.verdict, Verdict::Ack);
    assert!(d.read.failures.is_empty(), "{:?}", d.read.failures);
    assert_eq!(d.read.kind, "text");
    assert_eq!(
        d.read.text.as_deref(),
        Some("Who brings the cake on Friday?")
    );
    // Three members (Alice, Bob, the simulated one) × phone and companion.
    assert_eq!(d.read.devices, 6, "{d:?}");
    let got = bob.messages(1);
    assert_eq!(got[0]["id"], id.as_str());
    assert_eq!(got[0]["text"], "Who brings the cake on Friday?");
    assert_eq!(got[0]["participant"], format!("{ALICE}@s.whatsapp.net"));
    assert_eq!(fake.retries(), vec![]);
}

/// WhatsApp's word on the account, read by a second client: Baileys' own
/// time-lock and quota calls decode the fake server's answers, and read
/// the same values Herald stored for its account.
#[test]
fn baileys_reads_the_time_lock_and_the_quota_herald_stored() {
    let Some(node_dir) = baileys() else { return };
    let fake = FakeWhatsApp::start();
    let groups = groups();
    fake.set_groups(groups.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut alice = Device::link(&node_dir, &fake, &dir.path().join("alice"), ALICE);
    let h = paired(&fake, dir.path(), &FAST);
    let until = chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp() + 3600, 0).unwrap();
    fake.standing(|s| {
        s.locked_until = Some(until);
        s.quota = fake_whatsapp::Quota {
            status: "SECOND_WARNING".into(),
            used: 46,
            total: 50,
            ..Default::default()
        };
    });
    // Herald reads it at its next login.
    fake.drop_connections();
    let herald = h.wait_until("/v1/accounts/wa", Duration::from_secs(30), |a| {
        a["standing"]["quota"]["status"] == "second_warning"
            && a["standing"]["timelock"]["active"] == true
    })["standing"]
        .clone();
    let baileys = alice.standing();
    let lock = &baileys["timelock"];
    assert_eq!(lock["active"], true, "{baileys:#}");
    let read: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(lock["until"].clone()).unwrap();
    let stored: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(herald["timelock"]["until"].clone()).unwrap();
    assert_eq!((read, stored), (until, until));
    assert_eq!(lock["kind"], herald["timelock"]["kind"]);
    let quota = &baileys["quota"];
    assert_eq!(quota["capping_status"], "SECOND_WARNING", "{baileys:#}");
    assert_eq!(quota["used_quota"], herald["quota"]["used"].to_string());
    assert_eq!(quota["total_quota"], herald["quota"]["total"].to_string());
    let cycle_end: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(herald["quota"]["cycle_end"].clone()).unwrap();
    assert_eq!(quota["cycle_end_timestamp"], cycle_end.timestamp());
}

/// A poll counted by a second client. Herald sends a single-choice poll
/// to three groups where two simulated members vote from their phones
/// (one changes the vote, the other withdraws it, a first vote is relayed
/// twice) and Alice and Bob are members through Baileys devices only.
/// Each Baileys device reads the poll as a member would (the question
/// with the group's name, the options, one choice, the 32-byte secret),
/// and opens and counts the votes it hears with Baileys' own code. Then
/// Alice votes from her Baileys device in every group. Herald counts that
/// vote, and its tally per group, the fake's record of the phones' latest
/// votes plus Alice's, is the count each Baileys device comes to.
#[test]
fn baileys_members_count_a_polls_votes_as_herald_does_and_herald_counts_theirs() {
    let Some(node_dir) = baileys() else { return };
    let fake = FakeWhatsApp::start();
    let groups: Vec<fake_whatsapp::Group> = (1..=3)
        .map(|i| fake_whatsapp::Group {
            jid: format!("120363{i:012}@g.us"),
            subject: format!("Team {i}"),
            members: vec![
                format!("1555{i:04}001"),
                format!("1555{i:04}002"),
                ALICE.into(),
                BOB.into(),
            ],
            announce: false,
        })
        .collect();
    fake.set_groups(groups.clone());
    // The first half of the members vote: the two simulated ones.
    fake.set_votes(Some(fake_whatsapp::VotePlan {
        share: 0.5,
        after: Duration::from_secs(1),
        change_share: 0.5,
        withdraw_share: 0.5,
        again_after: Duration::from_secs(4),
        repeat_share: 0.5,
    }));
    let dir = tempfile::tempdir().unwrap();
    let mut alice = Device::link(&node_dir, &fake, &dir.path().join("alice"), ALICE);
    let mut bob = Device::link(&node_dir, &fake, &dir.path().join("bob"), BOB);
    let h = paired(&fake, dir.path(), &FAST);
    let options = ["Margherita", "Funghi", "Diavola"];
    let jids: Vec<String> = groups.iter().map(|g| g.jid.clone()).collect();
    let run = fire(
        &h,
        "wa",
        &jids,
        json!([{"kind": "poll", "question": "Pizza for {group_name}?",
                "options": options, "multiple": false}]),
    );
    let done = wait_run_end(&h, run, Duration::from_secs(60));
    assert_eq!(done["status"], "success", "{done:#}\n{}", h.logs());

    // The poll as each Baileys device read it, by group.
    let mut poll_ids = BTreeMap::new();
    for device in [&mut alice, &mut bob] {
        let got = device.messages(groups.len());
        assert_eq!(got.len(), groups.len(), "{}: {got:#?}", device.jid);
        for g in &groups {
            let m = got.iter().find(|m| m["group"] == g.jid.as_str()).unwrap();
            let poll = &m["poll"];
            assert_eq!(poll["question"], format!("Pizza for {}?", g.subject), "{m}");
            assert_eq!(poll["options"], json!(options), "{m}");
            assert_eq!(poll["selectable"], 1, "{m}");
            assert_eq!(poll["secret"], true, "{m}");
            let id = m["id"].as_str().unwrap().to_owned();
            assert_eq!(*poll_ids.entry(g.jid.clone()).or_insert(id.clone()), id);
        }
    }
    // The phones' votes, changes and withdrawals all cast.
    let deadline = Instant::now() + Duration::from_secs(30);
    while fake.votes().len() < 2 * groups.len() || fake.votes().iter().any(|v| v.votes < 2) {
        assert!(Instant::now() < deadline, "{:#?}", fake.votes());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Alice votes from Baileys: the last option, everywhere.
    for (group, id) in &poll_ids {
        alice.vote(group, id, &["Diavola"]);
    }
    let mut want = polls::of_record(&fake, &options);
    for g in &jids {
        want.entry(g.clone())
            .or_insert_with(|| vec![0; options.len()])[2] += 1;
    }
    // The phones' latest votes and Alice's.
    wait_tally(&h, &fake, run, Duration::from_secs(60), || want.clone());
    let by_poll: BTreeMap<String, Vec<u64>> = want
        .iter()
        .map(|(g, counts)| (poll_ids[g].clone(), counts.clone()))
        .collect();
    alice.wait_tallies(&by_poll);
    bob.wait_tallies(&by_poll);
    let (_, a) = h.call("GET", &format!("/v1/runs/{run}/poll"), None);
    assert_eq!(a["polls"][0]["voters"], 2 * groups.len() as u64, "{a}");
    assert!(
        fake.vote_failures().is_empty(),
        "{:?}",
        fake.vote_failures()
    );
    assert_eq!(
        fake.retries(),
        vec![],
        "no device asked for a message again"
    );
}
