//! The WhatsApp session store (whatsapp-rust's storage traits on Herald's
//! database, `src/gateway/whatsapp/backend.rs`): every trait method's put,
//! load, overwrite, delete, batch and missing-key behaviour, on SQLite and
//! on PostgreSQL (`HERALD_TEST_POSTGRES_URL`; `HERALD_REQUIRE_POSTGRES=1`
//! makes its absence fail), plus sealing, accounts kept apart and fencing.

use herald::gateway::whatsapp::backend::SessionBackend;
use herald::gateway::whatsapp::store::SessionStore;
use herald::seal::key_file::open_key;
use herald::seal::SessionKey;
use herald::store::scratch::ScratchPostgres;
use herald::store::SqlStore;
use herald_actors::delivery::leases::LeaseTable;
use herald_actors::domain::*;
use herald_actors::ports::*;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;
use whatsapp_rust::bytes::Bytes;
use whatsapp_rust::wacore::appstate::hash::HashState;
use whatsapp_rust::wacore::appstate::processor::AppStateMutationMAC;
use whatsapp_rust::wacore::store::traits::*;
use whatsapp_rust::wacore::store::Device;

fn id(s: &str) -> AccountId {
    AccountId::parse(s).unwrap()
}

async fn with_accounts(sql: &SqlStore, ids: &[&str]) {
    for a in ids {
        let new = NewAccount::named_by_id(id(a), GatewayKind::Whatsapp, AccountState::Connected);
        sql.create_account(&new, chrono::Utc::now()).await.unwrap();
    }
}

fn key() -> SessionKey {
    SessionKey::from_bytes([42; 32], "/etc/herald/session.key")
}

async fn signal(b: &SessionBackend) {
    // Identities: missing, put, overwrite, batch, delete.
    let a1 = "15550001111:3@s.whatsapp.net";
    assert_eq!(b.load_identity(a1).await.unwrap(), None);
    assert!(!b.has_signal_state_for_user("15550001111").await.unwrap());
    b.put_identity(a1, [1; 32]).await.unwrap();
    b.put_identity(a1, [2; 32]).await.unwrap();
    assert_eq!(b.load_identity(a1).await.unwrap(), Some([2; 32]));
    assert!(b.has_signal_state_for_user("15550001111").await.unwrap());
    assert!(
        !b.has_signal_state_for_user("1555000111").await.unwrap(),
        "a prefix is another user"
    );
    let batch: Vec<(Arc<str>, [u8; 32])> = (0..50)
        .map(|i| {
            (
                Arc::from(format!("1666{i:04}@s.whatsapp.net")),
                [i as u8; 32],
            )
        })
        .collect();
    b.put_identities_batch(&batch).await.unwrap();
    assert_eq!(
        b.load_identity("16660049@s.whatsapp.net").await.unwrap(),
        Some([49; 32])
    );
    b.delete_identity(a1).await.unwrap();
    assert_eq!(b.load_identity(a1).await.unwrap(), None);
    b.delete_identity(a1).await.unwrap();

    // Sessions.
    let s1 = "100000000000001:2@lid";
    assert_eq!(b.get_session(s1).await.unwrap(), None);
    assert!(!b.has_session(s1).await.unwrap());
    b.put_session(s1, b"ratchet-1").await.unwrap();
    b.put_session(s1, b"ratchet-2").await.unwrap();
    assert_eq!(
        b.get_session(s1).await.unwrap().as_deref(),
        Some(&b"ratchet-2"[..])
    );
    assert!(b.has_session(s1).await.unwrap());
    assert!(b
        .has_signal_state_for_user("100000000000001")
        .await
        .unwrap());
    let many: Vec<(Arc<str>, Bytes)> = (0..700)
        .map(|i| {
            (
                Arc::from(format!("1777{i:05}:1@s.whatsapp.net")),
                Bytes::from(vec![i as u8; 300]),
            )
        })
        .collect();
    b.put_sessions_batch(&many).await.unwrap();
    assert_eq!(
        b.get_session("177700699:1@s.whatsapp.net")
            .await
            .unwrap()
            .unwrap()
            .len(),
        300
    );
    b.delete_session(s1).await.unwrap();
    assert!(!b.has_session(s1).await.unwrap());

    // Pre-keys: the uploaded flag is only ever set on keys that exist.
    assert_eq!(b.get_max_prekey_id().await.unwrap(), 0);
    assert_eq!(b.load_prekey(7).await.unwrap(), None);
    b.store_prekey(7, b"pk7", false).await.unwrap();
    let keys: Vec<(u32, Bytes)> = (8..=120)
        .map(|i| (i, Bytes::from(format!("pk{i}"))))
        .collect();
    b.store_prekeys_batch(&keys, true).await.unwrap();
    assert_eq!(b.get_max_prekey_id().await.unwrap(), 120);
    assert_eq!(
        b.load_prekey(7).await.unwrap().as_deref(),
        Some(&b"pk7"[..])
    );
    let mut got = b.load_prekeys_batch(&[7, 9, 500, 120]).await.unwrap();
    got.sort_by_key(|(i, _)| *i);
    assert_eq!(
        got.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![7, 9, 120],
        "only those that exist"
    );
    assert_eq!(got[1].1.as_ref(), b"pk9");
    b.remove_prekey(9).await.unwrap();
    b.mark_prekeys_uploaded(&[7, 9]).await.unwrap();
    assert_eq!(
        b.load_prekey(9).await.unwrap(),
        None,
        "marking uploaded does not bring a key back"
    );
    assert_eq!(b.get_max_prekey_id().await.unwrap(), 120);

    // Signed pre-keys.
    assert_eq!(b.load_signed_prekey(1).await.unwrap(), None);
    b.store_signed_prekey(2, b"spk2").await.unwrap();
    b.store_signed_prekey(1, b"spk1").await.unwrap();
    b.store_signed_prekey(1, b"spk1b").await.unwrap();
    assert_eq!(
        b.load_signed_prekey(1).await.unwrap().as_deref(),
        Some(&b"spk1b"[..])
    );
    assert_eq!(
        b.load_all_signed_prekeys().await.unwrap(),
        vec![(1, b"spk1b".to_vec()), (2, b"spk2".to_vec())]
    );
    b.remove_signed_prekey(1).await.unwrap();
    assert_eq!(b.load_all_signed_prekeys().await.unwrap().len(), 1);

    // Sender keys.
    let sk = "120363000000000001@g.us::15550001111:3";
    assert_eq!(b.get_sender_key(sk).await.unwrap(), None);
    b.put_sender_key(sk, b"sk-a").await.unwrap();
    b.put_sender_keys_batch(&[(Arc::from(sk), Bytes::from_static(b"sk-b"))])
        .await
        .unwrap();
    assert_eq!(
        b.get_sender_key(sk).await.unwrap().as_deref(),
        Some(&b"sk-b"[..])
    );
    b.delete_sender_key(sk).await.unwrap();
    assert_eq!(b.get_sender_key(sk).await.unwrap(), None);

    // Sent messages: taken once.
    b.store_sent_message("g@g.us", "M1", b"payload")
        .await
        .unwrap();
    assert_eq!(
        b.take_sent_message("g@g.us", "M1")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"payload"[..])
    );
    assert_eq!(
        b.take_sent_message("g@g.us", "M1").await.unwrap(),
        None,
        "a take consumes"
    );
    b.store_sent_message("g@g.us", "M2", b"x").await.unwrap();
    let now = chrono::Utc::now().timestamp();
    assert_eq!(b.delete_expired_sent_messages(now - 3600).await.unwrap(), 0);
    assert_eq!(b.delete_expired_sent_messages(now + 3600).await.unwrap(), 1);
    // A sweep whose cutoff moved less than an hour past the last one's is
    // held back (whatsapp-rust asks every 4.5 minutes per account); the
    // row stays until the next sweep that runs.
    b.store_sent_message("g@g.us", "M3", b"y").await.unwrap();
    assert_eq!(b.delete_expired_sent_messages(now + 3700).await.unwrap(), 0);
    assert_eq!(
        b.take_sent_message("g@g.us", "M3")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"y"[..])
    );
    b.store_sent_message("g@g.us", "M3", b"y").await.unwrap();
    assert_eq!(b.delete_expired_sent_messages(now + 7300).await.unwrap(), 1);

    // The pending-inbound buffer.
    assert_eq!(b.get_pending_inbound("c", "s", "i").await.unwrap(), None);
    b.store_pending_inbound("c", "s", "i", b"m").await.unwrap();
    b.store_pending_inbound_batch(&[
        PendingInboundRow {
            chat: "c",
            sender: "s",
            id: "j",
            message: b"n",
        },
        PendingInboundRow {
            chat: "c",
            sender: "t",
            id: "i",
            message: b"o",
        },
    ])
    .await
    .unwrap();
    assert_eq!(
        b.get_pending_inbound("c", "t", "i")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"o"[..])
    );
    b.delete_pending_inbound("c", "s", "i").await.unwrap();
    b.delete_pending_inbound_batch(&[PendingInboundKey {
        chat: "c",
        sender: "s",
        id: "j",
    }])
    .await
    .unwrap();
    assert_eq!(b.get_pending_inbound("c", "s", "j").await.unwrap(), None);
    assert_eq!(
        b.delete_expired_pending_inbound(now + 3600).await.unwrap(),
        1
    );
}

async fn app_sync(b: &SessionBackend) {
    assert!(b.get_sync_key(b"\x00\x01").await.unwrap().is_none());
    assert_eq!(b.get_latest_sync_key_id().await.unwrap(), None);
    for (kid, ts) in [
        (&b"\x00\x01"[..], 10),
        (&b"\x00\x03"[..], 30),
        (&b"\x00\x02"[..], 20),
    ] {
        let k = AppStateSyncKey {
            key_data: kid.to_vec(),
            fingerprint: vec![9],
            timestamp: ts,
        };
        b.set_sync_key(kid, k).await.unwrap();
    }
    assert_eq!(
        b.get_sync_key(b"\x00\x02")
            .await
            .unwrap()
            .unwrap()
            .timestamp,
        20
    );
    assert_eq!(
        b.get_latest_sync_key_id().await.unwrap(),
        Some(b"\x00\x03".to_vec()),
        "the highest id"
    );

    let fresh = b.get_version("regular").await.unwrap();
    assert_eq!(fresh.version, 0, "a collection never synced starts at 0");
    let mut st = HashState {
        version: 7,
        hash: [5; 128],
        ..Default::default()
    };
    st.index_value_map.insert("idx".into(), vec![1, 2]);
    b.set_version("regular", st).await.unwrap();
    let got = b.get_version("regular").await.unwrap();
    assert_eq!(
        (got.version, got.hash[0], got.index_value_map["idx"].clone()),
        (7, 5, vec![1, 2])
    );

    let m = |i: u8| AppStateMutationMAC {
        index_mac: vec![i; 32],
        value_mac: vec![i + 100; 32],
    };
    b.put_mutation_macs("regular", 7, &[m(1), m(2), m(3)])
        .await
        .unwrap();
    b.put_mutation_macs("critical", 1, &[m(1)]).await.unwrap();
    assert_eq!(
        b.get_mutation_mac("regular", &[2; 32]).await.unwrap(),
        Some(vec![102; 32])
    );
    assert_eq!(b.get_mutation_mac("regular", &[9; 32]).await.unwrap(), None);
    let got = b
        .get_mutation_macs("regular", &[[1; 32], [3; 32], [8; 32]])
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[&[3; 32]], vec![103; 32]);
    b.delete_mutation_macs("regular", &[vec![1; 32]])
        .await
        .unwrap();
    assert_eq!(b.get_mutation_mac("regular", &[1; 32]).await.unwrap(), None);
    b.clear_mutation_macs("regular").await.unwrap();
    assert_eq!(b.get_mutation_mac("regular", &[2; 32]).await.unwrap(), None);
    assert_eq!(
        b.get_mutation_mac("critical", &[1; 32]).await.unwrap(),
        Some(vec![101; 32]),
        "another collection stays"
    );
}

async fn protocol(b: &SessionBackend) {
    let g = "120363000000000001@g.us";
    assert!(b.get_sender_key_devices(g).await.unwrap().is_empty());
    b.set_sender_key_status(
        g,
        &[("1:1@s.whatsapp.net", true), ("2:1@s.whatsapp.net", false)],
    )
    .await
    .unwrap();
    b.set_sender_key_status(g, &[("2:1@s.whatsapp.net", true)])
        .await
        .unwrap();
    b.set_sender_key_status(
        "other@g.us",
        &[("1:1@s.whatsapp.net", true), ("3:1@s.whatsapp.net", true)],
    )
    .await
    .unwrap();
    assert_eq!(
        b.get_sender_key_devices(g).await.unwrap(),
        vec![
            ("1:1@s.whatsapp.net".into(), true),
            ("2:1@s.whatsapp.net".into(), true)
        ]
    );
    b.delete_sender_key_device_rows(&["1:1@s.whatsapp.net"])
        .await
        .unwrap();
    assert_eq!(
        b.get_sender_key_devices(g).await.unwrap().len(),
        1,
        "gone from every group"
    );
    assert_eq!(
        b.get_sender_key_devices("other@g.us").await.unwrap().len(),
        1
    );
    b.clear_sender_key_devices(g).await.unwrap();
    assert!(b.get_sender_key_devices(g).await.unwrap().is_empty());
    assert_eq!(
        b.get_sender_key_devices("other@g.us").await.unwrap().len(),
        1
    );
    b.clear_all_sender_key_devices().await.unwrap();
    assert!(b
        .get_sender_key_devices("other@g.us")
        .await
        .unwrap()
        .is_empty());

    // A first send to a large group marks all its devices at once: more
    // than one statement's worth, one device named twice (its last mark
    // stands), then all dropped at once.
    let many: Vec<String> = (0..450).map(|i| format!("{i}:1@s.whatsapp.net")).collect();
    let mut marks: Vec<(&str, bool)> = many.iter().map(|d| (d.as_str(), false)).collect();
    marks.push((&many[3], true));
    b.set_sender_key_status("big@g.us", &marks).await.unwrap();
    let got = b.get_sender_key_devices("big@g.us").await.unwrap();
    assert_eq!(got.len(), 450);
    let with_key: Vec<&str> = got.iter().filter(|m| m.1).map(|m| m.0.as_str()).collect();
    assert_eq!(with_key, [many[3].as_str()]);
    let all: Vec<&str> = many.iter().map(String::as_str).collect();
    b.delete_sender_key_device_rows(&all).await.unwrap();
    assert!(b
        .get_sender_key_devices("big@g.us")
        .await
        .unwrap()
        .is_empty());

    let e = |lid: &str, pn: &str, t: i64| LidPnMappingEntry {
        lid: lid.into(),
        phone_number: pn.into(),
        created_at: t,
        updated_at: t,
        learning_source: "usync".into(),
    };
    assert!(b.get_lid_mapping("1").await.unwrap().is_none());
    assert!(b.get_pn_mapping("555").await.unwrap().is_none());
    b.put_lid_mapping(&e("1", "555", 10)).await.unwrap();
    b.put_lid_mappings(&[e("2", "555", 20), e("3", "666", 5)])
        .await
        .unwrap();
    assert_eq!(
        b.get_lid_mapping("3").await.unwrap().unwrap().phone_number,
        "666"
    );
    assert_eq!(
        b.get_pn_mapping("555").await.unwrap().unwrap().lid,
        "2",
        "the most recent LID"
    );
    b.put_lid_mapping(&e("1", "555", 30)).await.unwrap();
    assert_eq!(b.get_pn_mapping("555").await.unwrap().unwrap().lid, "1");
    assert_eq!(b.get_all_lid_mappings().await.unwrap().len(), 3);

    b.save_base_key("a@s", "M", b"base").await.unwrap();
    assert!(b.has_same_base_key("a@s", "M", b"base").await.unwrap());
    assert!(!b.has_same_base_key("a@s", "M", b"other").await.unwrap());
    assert!(!b.has_same_base_key("a@s", "N", b"base").await.unwrap());
    b.delete_base_key("a@s", "M").await.unwrap();
    assert!(!b.has_same_base_key("a@s", "M", b"base").await.unwrap());

    let rec = |user: &str, n: u32, ts: i64| DeviceListRecord {
        user: user.into(),
        devices: (0..n).map(|d| DeviceInfo::new(d, Some(d))).collect(),
        timestamp: ts,
        phash: Some("2:abc".into()),
        raw_id: Some(4),
    };
    assert!(b.get_devices("555").await.unwrap().is_none());
    b.update_device_list(rec("555", 2, 1)).await.unwrap();
    b.update_device_lists(vec![rec("555", 3, 2), rec("666", 1, 2)])
        .await
        .unwrap();
    let got = b.get_devices("555").await.unwrap().unwrap();
    assert_eq!(
        (got.devices.len(), got.timestamp, got.raw_id),
        (3, 2, Some(4))
    );
    b.delete_devices("555").await.unwrap();
    assert!(b.get_devices("555").await.unwrap().is_none());

    assert_eq!(b.get_group_metadata("g@g.us").await.unwrap(), None);
    b.put_group_metadata("g@g.us", b"meta1").await.unwrap();
    b.put_group_metadata("g@g.us", b"meta2").await.unwrap();
    assert_eq!(
        b.get_group_metadata("g@g.us").await.unwrap(),
        Some(b"meta2".to_vec())
    );
    b.delete_group_metadata("g@g.us").await.unwrap();
    assert_eq!(b.get_group_metadata("g@g.us").await.unwrap(), None);

    // Privacy tokens: each writer owns its field; newer wins.
    assert!(b.get_tc_token("x@lid").await.unwrap().is_none());
    b.touch_tc_token_sender_timestamp("x@lid", 100)
        .await
        .unwrap();
    let t = b.get_tc_token("x@lid").await.unwrap().unwrap();
    assert_eq!(
        (t.token.len(), t.sender_timestamp),
        (0, Some(100)),
        "a placeholder"
    );
    b.store_received_tc_token("x@lid", b"tok", 50)
        .await
        .unwrap();
    let t = b.get_tc_token("x@lid").await.unwrap().unwrap();
    assert_eq!(
        (t.token.as_slice(), t.token_timestamp, t.sender_timestamp),
        (&b"tok"[..], 50, Some(100))
    );
    b.store_received_tc_token("x@lid", b"old", 40)
        .await
        .unwrap();
    assert_eq!(
        b.get_tc_token("x@lid").await.unwrap().unwrap().token,
        b"tok",
        "a stale token loses"
    );
    b.touch_tc_token_sender_timestamp("x@lid", 90)
        .await
        .unwrap();
    assert_eq!(
        b.get_tc_token("x@lid")
            .await
            .unwrap()
            .unwrap()
            .sender_timestamp,
        Some(100),
        "never backwards"
    );
    b.put_tc_token(
        "y@lid",
        &TcTokenEntry {
            token: b"t".to_vec(),
            token_timestamp: 10,
            sender_timestamp: None,
        },
    )
    .await
    .unwrap();
    let mut jids = b.get_all_tc_token_jids().await.unwrap();
    jids.sort();
    assert_eq!(jids, vec!["x@lid".to_string(), "y@lid".to_string()]);
    // y: token expired, no sender bucket -> gone; x: sender bucket live -> kept.
    assert_eq!(b.delete_expired_tc_tokens(60, 95).await.unwrap(), 1);
    assert!(b.get_tc_token("y@lid").await.unwrap().is_none());
    assert!(b.get_tc_token("x@lid").await.unwrap().is_some());
    b.delete_tc_token("x@lid").await.unwrap();
    assert!(b.get_tc_token("x@lid").await.unwrap().is_none());
}

async fn secrets_and_device(b: &SessionBackend) {
    assert_eq!(b.get_msg_secret("c", "s", "m").await.unwrap(), None);
    b.put_msg_secret("c", "s", "m", &[7; 32]).await.unwrap();
    assert_eq!(
        b.get_msg_secret("c", "s", "m").await.unwrap(),
        Some(vec![7; 32])
    );
    let entry = |id: &str, exp: i64, ts: i64| MsgSecretEntry {
        chat: Arc::from("c"),
        sender: Arc::from("s"),
        msg_id: Arc::from(id),
        secret: [8; 32],
        expires_at: exp,
        message_ts: ts,
    };
    assert_eq!(
        b.put_msg_secrets(vec![entry("n", 100, 5), entry("o", 200, 0)])
            .await
            .unwrap(),
        2
    );
    // Merged: a later deadline wins, a zero time never clobbers a known one.
    b.put_msg_secrets(vec![entry("n", 50, 0)]).await.unwrap();
    assert_eq!(
        b.get_msg_secret_with_ts("c", "s", "n").await.unwrap(),
        Some((vec![8; 32], 5))
    );
    assert_eq!(
        b.delete_expired_msg_secrets(150).await.unwrap(),
        1,
        "n (100) goes; o (200) and m (never) stay"
    );
    assert!(b.get_msg_secret("c", "s", "n").await.unwrap().is_none());
    assert!(b.get_msg_secret("c", "s", "m").await.unwrap().is_some());
    assert_eq!(
        b.delete_expired_msg_secrets(i64::MAX).await.unwrap(),
        1,
        "never-expiring m stays"
    );
    assert!(b.get_msg_secret("c", "s", "m").await.unwrap().is_some());

    assert!(!b.exists().await.unwrap());
    assert!(b.load().await.unwrap().is_none());
    b.create().await.unwrap();
    assert!(b.exists().await.unwrap());
    let mut d = b.load().await.unwrap().unwrap();
    d.pn = Some("15550001111:3@s.whatsapp.net".parse().unwrap());
    d.push_name = "Front desk".into();
    d.login_counter = 4;
    b.save(&d).await.unwrap();
    let back: Device = b.load().await.unwrap().unwrap();
    assert_eq!(back.pn, d.pn);
    assert_eq!(
        (back.push_name.as_str(), back.login_counter),
        ("Front desk", 4)
    );
    assert_eq!(back.identity_key.public_key, d.identity_key.public_key);
    assert_eq!(back.registration_id, d.registration_id);
    assert!(
        back.device_props.os.is_some(),
        "device props are set on load"
    );
}

/// The whole suite on one database.
async fn suite(sql: &SqlStore) {
    with_accounts(sql, &["a", "b"]).await;
    let sessions = SessionStore::new(sql.wa_rows(), key());
    let a = sessions.backend(&id("a"));
    signal(&a).await;
    app_sync(&a).await;
    protocol(&a).await;
    secrets_and_device(&a).await;
    // A pairing's pre-keys stored, then marked uploaded in one call (more
    // than one statement's worth): every one carries the flag.
    let keys: Vec<(u32, Bytes)> = (2000..2450)
        .map(|i| (i, Bytes::from_static(b"k")))
        .collect();
    a.store_prekeys_batch(&keys, false).await.unwrap();
    a.mark_prekeys_uploaded(&(2000..2450).collect::<Vec<_>>())
        .await
        .unwrap();
    for k in [2000, 2399, 2400, 2449] {
        let row = sql
            .wa_rows()
            .get(&id("a"), 4, &format!("{k:010}"))
            .await
            .unwrap();
        assert_eq!(row.map(|r| r.g).as_deref(), Some("1"), "pre-key {k}");
    }

    // Another account sees none of it.
    let b = sessions.backend(&id("b"));
    assert!(!b.exists().await.unwrap());
    assert_eq!(b.load_signed_prekey(2).await.unwrap(), None);
    assert_eq!(b.get_max_prekey_id().await.unwrap(), 0);
    assert!(sessions.stored(&id("a")).await.unwrap());
    assert!(!sessions.stored(&id("b")).await.unwrap());

    // Sealed at rest: no value is in the database in the clear.
    a.put_session("secret@s.whatsapp.net", b"PLAINTEXT-RATCHET")
        .await
        .unwrap();
    let rows = sql.sealed().all().await.unwrap().sessions;
    assert!(rows.len() > 100);
    assert!(rows
        .iter()
        .all(|(_, _, _, v)| !v.windows(9).any(|w| w == b"PLAINTEXT")));
    assert!(rows
        .iter()
        .all(|(_, _, _, v)| SessionKey::key_id_of(v) == Some(key().id())));

    // Forgetting an account's session leaves the other's.
    sessions.wipe(&id("a")).await.unwrap();
    assert!(!sessions.stored(&id("a")).await.unwrap());
    assert_eq!(a.get_session("secret@s.whatsapp.net").await.unwrap(), None);
    fencing(sql).await;
    accepted_ids(sql).await;
    group_commit(sql).await;
    known_keys(sql).await;
}

/// A first send's burst of reads of sessions and device lists that do not
/// exist has the account's keys read once, after which such a read asks no
/// database; a row written through any backend of the account, or by
/// another daemon before the account came back, is still found.
async fn known_keys(sql: &SqlStore) {
    use herald::gateway::whatsapp::known::BURST;
    use herald::store::whatsapp::Op;
    with_accounts(sql, &["known"]).await;
    let acct = id("known");
    let ttl = Duration::from_secs(30);
    let lease = take_lease(sql, &acct, "known-n1", "i1", ttl).await;
    let table = Arc::new(LeaseTable::new("known-n1"));
    let hold = |epoch| {
        table.hold(
            &acct,
            epoch,
            tokio::time::Instant::now(),
            ttl,
            Duration::from_secs(1),
        )
    };
    hold(lease.epoch);
    let sessions = SessionStore::new(sql.wa_rows(), key()).with_leases(table.clone());
    let (b, other) = (sessions.backend(&acct), sessions.backend(&acct));
    b.put_session("old@s.whatsapp.net", b"old").await.unwrap();
    for i in 0..BURST + 8 {
        let address = format!("new-{i}@s.whatsapp.net");
        assert!(b.get_session(&address).await.unwrap().is_none());
        assert!(!b.has_session(&address).await.unwrap());
        assert!(b.get_devices(&format!("user-{i}")).await.unwrap().is_none());
    }
    // A row written behind the backends' back (as no daemon does) is not
    // seen: the proof that "none" now comes without a statement.
    let outside = |k: &str| Op::Put {
        kind: 3,
        k: k.into(),
        g: String::new(),
        n: 0,
        v: b"unsealed".to_vec(),
    };
    sql.wa_rows()
        .write(
            &acct,
            Some(&lease.fence()),
            vec![outside("behind@s.whatsapp.net")],
        )
        .await
        .unwrap();
    assert!(!b.has_session("behind@s.whatsapp.net").await.unwrap());
    // What was there before, and what any backend of the account writes
    // since, is found.
    assert_eq!(
        b.get_session("old@s.whatsapp.net")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"old"[..])
    );
    other
        .put_session("new-3@s.whatsapp.net", b"fresh")
        .await
        .unwrap();
    assert_eq!(
        b.get_session("new-3@s.whatsapp.net")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"fresh"[..])
    );
    // Announced (as the import and a wipe do): asked of the database again.
    sessions.changed_outside(&acct);
    assert!(b.has_session("behind@s.whatsapp.net").await.unwrap());

    // Another burst reads the keys again. Then the account moves to
    // another daemon, which writes a session, and comes back: under the new
    // fence the database is asked, and the session is found.
    for i in 0..BURST {
        let address = format!("again-{i}@s.whatsapp.net");
        assert!(!b.has_session(&address).await.unwrap());
    }
    sql.release_lease(&lease.fence()).await.unwrap();
    let theirs = take_lease(sql, &acct, "known-n2", "i2", ttl).await;
    sql.wa_rows()
        .write(
            &acct,
            Some(&theirs.fence()),
            vec![outside("moved@s.whatsapp.net")],
        )
        .await
        .unwrap();
    sql.release_lease(&theirs.fence()).await.unwrap();
    let back = sql
        .acquire_lease(&acct, "known-n1", ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(back.epoch > theirs.epoch);
    hold(back.epoch);
    assert!(b.has_session("moved@s.whatsapp.net").await.unwrap());
}

/// Writes made at the same time are committed together, and each keeps
/// its own answer: a write refused by its fence or failing in the database
/// fails alone, the others of its batch land.
async fn group_commit(sql: &SqlStore) {
    use herald::store::whatsapp::Op;
    let names: Vec<String> = (0..40).map(|i| format!("storm-{i:02}")).collect();
    with_accounts(sql, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    with_accounts(sql, &["storm-fenced"]).await;
    let ttl = Duration::from_secs(30);
    let stale = take_lease(sql, &id("storm-fenced"), "storm-n1", "i1", ttl)
        .await
        .fence();
    sql.release_lease(&stale).await.unwrap();

    let rows = sql.wa_rows();
    let put = |k: &str, v: &[u8]| Op::Put {
        kind: 3,
        k: k.to_owned(),
        g: String::new(),
        n: 0,
        v: v.to_vec(),
    };
    let mut writes = Vec::new();
    let mut refused = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if i == names.len() / 2 {
            // In the middle of the storm, so they share its batches: a
            // stale lease, and no such account (its foreign key refuses it).
            for (account, fence) in [
                ("storm-fenced", Some(stale.clone())),
                ("storm-nobody", None),
            ] {
                let rows = rows.clone();
                let ops = vec![put("s0", b"no")];
                refused.push(tokio::spawn(async move {
                    rows.write(&id(account), fence.as_ref(), ops).await
                }));
            }
        }
        for j in 0..5 {
            let (rows, account) = (rows.clone(), id(name));
            let ops = vec![put(&format!("s{j}"), &[i as u8, j])];
            writes.push(tokio::spawn(async move {
                rows.write(&account, None, ops).await
            }));
        }
    }
    let missing = refused.pop().unwrap().await.unwrap();
    let fenced = refused.pop().unwrap().await.unwrap();
    for w in writes {
        assert_eq!(w.await.unwrap(), Ok(1), "every write of the storm lands");
    }
    assert!(
        matches!(fenced, Err(StoreError::Fenced(_))),
        "a stale lease is refused: {fenced:?}"
    );
    assert!(missing.is_err(), "a write the database refuses fails");
    for (i, name) in names.iter().enumerate() {
        for j in 0..5u8 {
            let row = rows.get(&id(name), 3, &format!("s{j}")).await.unwrap();
            assert_eq!(row.map(|r| r.v), Some(vec![i as u8, j]), "{name} s{j}");
        }
    }
    assert_eq!(rows.get(&id("storm-fenced"), 3, "s0").await.unwrap(), None);
    let (batches, carried) = rows.commits();
    assert_eq!(carried, 202, "every write went through the queue once");
    assert!(
        batches * 4 < carried,
        "202 writes at once took {batches} commits: they were not grouped"
    );
}

/// Ids WhatsApp accepted: kept per account for every owner, newest first,
/// pruned by age.
async fn accepted_ids(sql: &SqlStore) {
    with_accounts(sql, &["acc-1", "acc-2"]).await;
    let rows = sql.wa_rows();
    let t = |s: i64| chrono::DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    rows.accept_ids(&id("acc-1"), &ids(&["3EB0A", "3EB0B"]), t(0))
        .await
        .unwrap();
    rows.accept_ids(&id("acc-1"), &ids(&["3EB0C", "3EB0A"]), t(10))
        .await
        .unwrap();
    rows.accept_ids(&id("acc-2"), &ids(&["3EB0Z"]), t(5))
        .await
        .unwrap();
    assert!(rows.was_accepted(&id("acc-1"), "3EB0A").await.unwrap());
    assert!(
        !rows.was_accepted(&id("acc-2"), "3EB0A").await.unwrap(),
        "per account"
    );
    assert_eq!(
        rows.recent_accepted(&id("acc-1"), 2).await.unwrap(),
        ["3EB0C", "3EB0B"],
        "newest first; accepting again keeps the first time"
    );
    assert_eq!(rows.prune_accepted(t(6), 1).await.unwrap(), 1);
    assert_eq!(rows.prune_accepted(t(6), 10).await.unwrap(), 2);
    assert_eq!(rows.prune_accepted(t(6), 10).await.unwrap(), 0);
    assert_eq!(
        rows.recent_accepted(&id("acc-1"), 10).await.unwrap(),
        ["3EB0C"]
    );
    assert!(rows
        .recent_accepted(&id("acc-2"), 10)
        .await
        .unwrap()
        .is_empty());
}

/// `node` (its instance `instance`) beats and takes `acct`'s lease.
async fn take_lease(
    sql: &SqlStore,
    acct: &AccountId,
    node: &str,
    instance: &str,
    ttl: Duration,
) -> Lease {
    sql.node_heartbeat(node, instance, None, ttl).await.unwrap();
    sql.acquire_lease(acct, node, ttl).await.unwrap().unwrap()
}

/// With leases on, a write runs only under the account's current lease.
async fn fencing(sql: &SqlStore) {
    with_accounts(sql, &["fenced"]).await;
    let acct = id("fenced");
    let ttl = Duration::from_secs(30);
    let lease = take_lease(sql, &acct, "n1", "i1", ttl).await;
    let table = Arc::new(LeaseTable::new("n1"));
    table.hold(
        &acct,
        lease.epoch,
        tokio::time::Instant::now(),
        ttl,
        Duration::from_secs(1),
    );
    let sessions = SessionStore::new(sql.wa_rows(), key()).with_leases(table.clone());
    let b = sessions.backend(&acct);
    b.put_session("x@s.whatsapp.net", b"v1").await.unwrap();
    // Another daemon takes the account over (the lease is released, then
    // taken at a higher epoch); this one's table still says it holds it.
    sql.release_lease(&lease.fence()).await.unwrap();
    let theirs = take_lease(sql, &acct, "n2", "i2", ttl).await;
    assert!(theirs.epoch > lease.epoch);
    let e = b
        .put_session("x@s.whatsapp.net", b"v2")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("database"), "{e}");
    assert_eq!(
        b.get_session("x@s.whatsapp.net").await.unwrap().as_deref(),
        Some(&b"v1"[..]),
        "nothing written"
    );
    assert!(b
        .store_prekeys_batch(&[(1, Bytes::from_static(b"k"))], false)
        .await
        .is_err());
    assert!(b.take_sent_message("c", "m").await.is_err());
    assert!(sessions.wipe(&acct).await.is_err(), "a wipe is fenced too");
    // Not held in this daemon's table at all: refused before the database.
    table.drop_lease(&acct);
    assert!(b.put_identity("x@s.whatsapp.net", [1; 32]).await.is_err());
    assert!(sessions.wipe(&acct).await.is_err());
    assert_eq!(
        b.get_session("x@s.whatsapp.net").await.unwrap().as_deref(),
        Some(&b"v1"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_store_meets_its_contract_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let sql = SqlStore::connect(&format!("sqlite://{}", dir.path().join("h.db").display()))
        .await
        .unwrap();
    suite(&sql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_store_meets_its_contract_on_postgres() {
    let Some(base) = std::env::var("HERALD_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        assert!(
            std::env::var("HERALD_REQUIRE_POSTGRES").map_or(true, |v| v != "1"),
            "HERALD_REQUIRE_POSTGRES=1 but HERALD_TEST_POSTGRES_URL is not set"
        );
        writeln!(
            std::io::stderr(),
            "SKIPPED: the_session_store_meets_its_contract_on_postgres: set HERALD_TEST_POSTGRES_URL to run it"
        )
        .ok();
        return;
    };
    let db = ScratchPostgres::create(&base).await.unwrap();
    let sql = SqlStore::connect(&db.url).await.unwrap();
    let outcome = tokio::spawn(async move {
        suite(&sql).await;
        sql.close().await;
    })
    .await;
    db.drop_database().await.unwrap();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A row copied to another account (same key, same kind and key) does not
/// open there; the error names the account and the row.
#[tokio::test]
async fn a_row_copied_to_another_account_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("h.db").display());
    let sql = SqlStore::connect(&url).await.unwrap();
    with_accounts(&sql, &["one", "two"]).await;
    let sessions = SessionStore::new(sql.wa_rows(), key());
    sessions
        .backend(&id("one"))
        .put_session("p@s.whatsapp.net", b"state")
        .await
        .unwrap();
    sql.close().await;
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO wa_session_rows (account_id, kind, k, g, n, v) \
         SELECT 'two', kind, k, g, n, v FROM wa_session_rows WHERE account_id = 'one'",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let sql = SqlStore::connect(&url).await.unwrap();
    let sessions = SessionStore::new(sql.wa_rows(), key());
    let e = sessions
        .backend(&id("two"))
        .get_session("p@s.whatsapp.net")
        .await
        .unwrap_err();
    let shown = format!("{e}");
    assert!(shown.contains("account two"), "{shown}");
    assert!(shown.contains("does not open"), "{shown}");
    assert_eq!(
        sessions
            .backend(&id("one"))
            .get_session("p@s.whatsapp.net")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"state"[..])
    );
}

/// The key file: made and recorded on the first start, required from then
/// on (sealed or not), and a different key stops start-up naming the file
/// and both key ids.
#[tokio::test]
async fn the_session_key_must_be_the_one_the_sessions_were_sealed_with() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("h.db").display());
    let sql = SqlStore::connect(&url).await.unwrap();
    let path = dir.path().join("session.key");
    let made = open_key(&path, &sql.sealed()).await.unwrap();
    assert!(path.exists());
    assert_eq!(
        open_key(&path, &sql.sealed()).await.unwrap().id(),
        made.id(),
        "reused"
    );
    with_accounts(&sql, &["a"]).await;
    SessionStore::new(sql.wa_rows(), made.clone())
        .backend(&id("a"))
        .put_session("p@s.whatsapp.net", b"state")
        .await
        .unwrap();
    std::fs::rename(&path, dir.path().join("elsewhere.key")).unwrap();
    let e = open_key(&path, &sql.sealed())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("does not exist") && e.contains(&made.id()) && e.contains("session.key"),
        "{e}"
    );
    assert!(!path.exists(), "no new key made over sealed sessions");
    let other = SessionKey::create(&path).unwrap();
    let e = open_key(&path, &sql.sealed())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&other.id()) && e.contains(&made.id()) && e.contains("rekey"),
        "{e}"
    );
}

/// Two daemons of one database (a cluster) with different key files: the
/// second stops at start-up naming both key ids, although nothing is
/// sealed yet; the first start recorded its key.
async fn different_key_files_are_refused_before_anything_is_sealed(sql: &SqlStore) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        dir.path().join("a/session.key"),
        dir.path().join("b/session.key"),
    );
    let first = open_key(&a, &sql.sealed()).await.unwrap();
    assert_eq!(sql.sealed().key_id().await.unwrap(), Some(first.id()));
    assert!(
        !sql.sealed().any_sealed().await.unwrap(),
        "nothing sealed yet"
    );
    // The second daemon has no key file: none is made, and it stops.
    let e = open_key(&b, &sql.sealed()).await.unwrap_err().to_string();
    assert!(
        e.contains(&first.id()) && e.contains("does not exist") && e.contains("b/session.key"),
        "{e}"
    );
    assert!(!b.exists(), "no key of its own is made");
    // With a key file of its own: stops naming both ids.
    let second = SessionKey::create(&b).unwrap();
    let e = open_key(&b, &sql.sealed()).await.unwrap_err().to_string();
    assert!(
        e.contains(&first.id()) && e.contains(&second.id()) && e.contains("b/session.key"),
        "{e}"
    );
    assert!(e.contains("nothing is sealed"), "{e}");
    assert_eq!(
        sql.sealed().key_id().await.unwrap(),
        Some(first.id()),
        "the recorded key is kept"
    );
    // A key recorded by a daemon that started at the same moment wins.
    assert_eq!(
        sql.sealed().record_key_id(&second.id()).await.unwrap(),
        first.id()
    );
    // With the first daemon's file copied, the second starts.
    std::fs::copy(&a, &b).unwrap();
    assert_eq!(open_key(&b, &sql.sealed()).await.unwrap().id(), first.id());
    assert_eq!(open_key(&a, &sql.sealed()).await.unwrap().id(), first.id());
}

#[tokio::test]
async fn different_key_files_are_refused_before_anything_is_sealed_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let sql = SqlStore::connect(&format!("sqlite://{}", dir.path().join("h.db").display()))
        .await
        .unwrap();
    different_key_files_are_refused_before_anything_is_sealed(&sql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_key_files_are_refused_before_anything_is_sealed_on_postgres() {
    let Some(base) = postgres_url("different_key_files_are_refused_on_postgres") else {
        return;
    };
    let db = ScratchPostgres::create(&base).await.unwrap();
    let sql = SqlStore::connect(&db.url).await.unwrap();
    let outcome = tokio::spawn(async move {
        different_key_files_are_refused_before_anything_is_sealed(&sql).await;
        sql.close().await;
    })
    .await;
    db.drop_database().await.unwrap();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

fn postgres_url(test: &str) -> Option<String> {
    let url = std::env::var("HERALD_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty());
    if url.is_none() {
        assert!(
            std::env::var("HERALD_REQUIRE_POSTGRES").map_or(true, |v| v != "1"),
            "HERALD_REQUIRE_POSTGRES=1 but HERALD_TEST_POSTGRES_URL is not set"
        );
        writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: set HERALD_TEST_POSTGRES_URL to run it"
        )
        .ok();
    }
    url
}

/// The settings `herald whatsapp rekey` reads, for a data dir and database.
fn rekey_settings(dir: &std::path::Path) -> herald::settings::Settings {
    let env = [
        ("HERALD_STORAGE__DATA_DIR", dir.display().to_string()),
        (
            "HERALD_STORAGE__DATABASE_URL",
            format!("sqlite://{}", dir.join("herald.db").display()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    herald::settings::Settings::load_from(None, &env).unwrap()
}

/// A rekey moves the session rows and the webhook secrets to the new key
/// in one transaction, syncs, and leaves the old key as `….old`.
#[tokio::test]
async fn a_rekey_moves_sessions_and_webhook_secrets_to_the_new_key() {
    let dir = tempfile::tempdir().unwrap();
    let settings = rekey_settings(dir.path());
    let path = settings.session_key_path();
    let sql = SqlStore::connect(&settings.database_url()).await.unwrap();
    let old = open_key(&path, &sql.sealed()).await.unwrap();
    let sql = sql.with_secret_key(&old);
    with_accounts(&sql, &["a"]).await;
    SessionStore::new(sql.wa_rows(), old.clone())
        .backend(&id("a"))
        .put_session("p@s.whatsapp.net", b"state")
        .await
        .unwrap();
    let hook = sql.create_webhook(&new_hook()).await.unwrap();
    sql.close().await;

    let r = herald::seal::rekey::rekey(&settings).await.unwrap();
    assert_eq!((r.rows, r.accounts, r.webhook_secrets), (1, 1, 1));
    assert_eq!(r.old_id.as_deref(), Some(old.id().as_str()));
    let old_file = r.old_file.unwrap();
    assert_eq!(SessionKey::load(&old_file).unwrap().unwrap().id(), old.id());
    let sql = SqlStore::connect(&settings.database_url()).await.unwrap();
    let new = open_key(&path, &sql.sealed()).await.unwrap();
    assert_eq!(new.id(), r.new_id);
    let sql = sql.with_secret_key(&new);
    assert_eq!(sql.get_webhook(hook.id).await.unwrap().secret, hook.secret);
    let sessions = SessionStore::new(sql.wa_rows(), new);
    assert_eq!(
        sessions
            .backend(&id("a"))
            .get_session("p@s.whatsapp.net")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"state"[..])
    );
}

fn new_hook() -> NewWebhook {
    NewWebhook {
        url: "https://hooks.example.com/h".into(),
        types: vec!["run.finished".into()],
        description: String::new(),
        enabled: true,
        secret: "whsec_cmVrZXktcmVrZXktcmVrZXk=".into(),
        created_at: chrono::Utc::now(),
    }
}

/// The state a rekey leaves when it stops after its commit and before its
/// renames: the database expects the key in `….new`. Start-up names that
/// file and the exact command that finishes the rekey; running it works.
#[tokio::test]
async fn a_start_after_a_rekey_stopped_before_its_renames_says_how_to_finish() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("h.db").display());
    let sql = SqlStore::connect(&url).await.unwrap();
    let path = dir.path().join("keys/session.key");
    let old = open_key(&path, &sql.sealed()).await.unwrap();
    with_accounts(&sql, &["a"]).await;
    SessionStore::new(sql.wa_rows(), old.clone())
        .backend(&id("a"))
        .put_session("p@s.whatsapp.net", b"state")
        .await
        .unwrap();
    // What `rekey` did up to its commit: the new key in `….new`, every
    // row re-sealed under it and its id recorded.
    let new_path = dir.path().join("keys/session.key.new");
    let new = SessionKey::create(&new_path).unwrap();
    let mut all = sql.sealed().all().await.unwrap();
    for (a, kind, k, v) in &mut all.sessions {
        let plain = old.for_account(a.as_str()).open(*kind, k, v).unwrap();
        *v = new.for_account(a.as_str()).seal(*kind, k, &plain);
    }
    sql.sealed().reseal(&all, &new.id()).await.unwrap();

    // Crashed before either rename.
    let e = open_key(&path, &sql.sealed())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&new.id()) && e.contains(&old.id()) && e.contains("session.key.new"),
        "{e}"
    );
    let cmd = e.split("(daemons stopped): ").nth(1).unwrap();
    assert_eq!(
        cmd,
        format!("mv {p} {p}.old && mv {p}.new {p}", p = path.display())
    );
    // Crashed between the two renames: the first one done.
    std::fs::rename(&path, dir.path().join("keys/session.key.old")).unwrap();
    let e = open_key(&path, &sql.sealed())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not exist") && e.contains(&new.id()), "{e}");
    let cmd = e.split("(daemons stopped): ").nth(1).unwrap();
    assert_eq!(cmd, format!("mv {p}.new {p}", p = path.display()));
    // The operator runs it: the next start opens the sessions.
    let ran = std::process::Command::new("sh")
        .args(["-c", cmd])
        .status()
        .unwrap();
    assert!(ran.success());
    let key = open_key(&path, &sql.sealed()).await.unwrap();
    assert_eq!(key.id(), new.id());
    assert_eq!(
        SessionStore::new(sql.wa_rows(), key)
            .backend(&id("a"))
            .get_session("p@s.whatsapp.net")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"state"[..])
    );
}

/// Secret bytes of the device in `tests/fixtures/session-0.7.db`: the
/// private halves of its identity and Noise keys, and its ADV secret.
async fn fixture_secrets(fixture: &std::path::Path) -> Vec<Vec<u8>> {
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(fixture)
        .read_only(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    let row: (Vec<u8>, Vec<u8>, Vec<u8>) =
        sqlx::query_as("SELECT identity_key, noise_key, adv_secret_key FROM device LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    vec![row.0[..32].to_vec(), row.1[..32].to_vec(), row.2.clone()]
}

/// Every file under `dir` that holds any of `secrets`.
fn files_holding(dir: &std::path::Path, secrets: &[Vec<u8>]) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                // A file can go between the listing and the read (SQLite's
                // journal as a pool closes): gone, it holds nothing.
                let bytes = match std::fs::read(&p) {
                    Ok(b) => b,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => panic!("{}: {e}", p.display()),
                };
                if secrets
                    .iter()
                    .any(|s| bytes.windows(s.len()).any(|w| w == &s[..]))
                {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// A legacy `session.db` imported at start-up: once the sealed copy has
/// committed no file under the data dir holds the device's keys in plain
/// text (the file and its `-wal`/`-shm` are gone), unless
/// `whatsapp.keep_imported_session_files` keeps them.
#[tokio::test]
async fn an_imported_session_file_leaves_no_plaintext_keys_on_disk() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/session-0.7.db");
    let secrets = fixture_secrets(&fixture).await;
    for keep in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let url = format!("sqlite://{}", data.join("herald.db").display());
        let sql = SqlStore::connect(&url).await.unwrap();
        with_accounts(&sql, &["wa"]).await;
        let account_dir = data.join("whatsapp/wa");
        std::fs::create_dir_all(&account_dir).unwrap();
        std::fs::copy(&fixture, account_dir.join("session.db")).unwrap();
        // A WAL and shared-memory file beside it, as a daemon killed with
        // the file open leaves them.
        std::fs::copy(&fixture, account_dir.join("session.db-wal")).unwrap();
        std::fs::write(account_dir.join("session.db-shm"), &secrets[0]).unwrap();
        assert_eq!(files_holding(&data, &secrets).len(), 3);
        let key = open_key(&data.join("session.key"), &sql.sealed())
            .await
            .unwrap();
        let sessions = SessionStore::new(sql.wa_rows(), key);
        let done = herald::gateway::whatsapp::import::import_all(
            &data.join("whatsapp"),
            &sessions,
            &[id("wa")],
            keep,
        )
        .await
        .unwrap();
        assert_eq!(done, [id("wa")]);
        assert!(sessions.stored(&id("wa")).await.unwrap());
        sql.close().await;
        let left: Vec<String> = std::fs::read_dir(&account_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if keep {
            // SQLite itself may have folded the log into the file and
            // removed it when the import closed it.
            assert!(left.iter().any(|f| f == "session.db.imported"), "{left:?}");
            assert!(
                left.iter().all(|f| f.starts_with("session.db.imported")),
                "{left:?}"
            );
        } else {
            assert!(left.is_empty(), "{left:?}");
            assert_eq!(
                files_holding(&data, &secrets),
                Vec::<std::path::PathBuf>::new(),
                "no plain-text key under the data dir, the database included"
            );
        }
    }
}
