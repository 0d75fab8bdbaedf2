//! The WhatsApp wire across owners of an account: the real whatsapp-rust
//! client, Herald's WhatsApp gateway and the fake WhatsApp Web server, in
//! one process on a SQLite store.
//!
//! - Nothing goes on the wire after the lease: a first send to a group is
//!   held inside the client (the fake server answers its device-list and
//!   pre-key queries late) until this daemon's lease has less than its
//!   safety margin left; the client then builds the stanza, and the
//!   account's transport refuses to write it. The fake server never sees
//!   the message; once the lease is renewed, the same id goes out once.
//! - A new owner knows what the old one sent: the ids WhatsApp accepted are
//!   in the database, so after a takeover a resend of one is a duplicate
//!   with no second stanza; an old per-daemon journal file is imported
//!   once and deleted.

use herald::gateway::whatsapp::store::SessionStore;
use herald::gateway::whatsapp::{WhatsappConfig, WhatsappGateway};
use herald::seal::key_file::open_key;
use herald::store::SqlStore;
use herald_actors::delivery::leases::LeaseTable;
use herald_actors::domain::{AccountId, AccountState, GatewayKind, GroupJid};
use herald_actors::ports::{
    AccountStore, Gateway as _, GatewayError, LeaseStore, NewAccount, OutgoingMessage,
};
use herald_fake_whatsapp::FakeWhatsApp;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The fake server, a SQLite store with a session key, and an account
/// paired through a first gateway, ready to send.
struct Setup {
    fake: FakeWhatsApp,
    dir: tempfile::TempDir,
    sql: SqlStore,
    sessions: SessionStore,
    id: AccountId,
    gateway: WhatsappGateway,
    groups: Vec<herald_fake_whatsapp::Group>,
    /// With leases: this daemon's table and the lease's epoch.
    lease: Option<(Arc<LeaseTable>, i64)>,
}

fn config(fake: &FakeWhatsApp) -> WhatsappConfig {
    WhatsappConfig {
        transport_url: Some(fake.url()),
        version_override: Some((2, 3000, 1_027_000_000)),
        ..WhatsappConfig::default()
    }
}

/// `leased`: the daemon shares the database (node n1), and holds the
/// account's lease from before pairing, for 30 s.
async fn paired(name: &str, leased: bool) -> Setup {
    let fake = std::thread::spawn(FakeWhatsApp::start).join().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sql = SqlStore::connect(&format!("sqlite://{}", dir.path().join("h.db").display()))
        .await
        .unwrap();
    let key = open_key(&dir.path().join("session.key"), &sql.sealed())
        .await
        .unwrap();
    let groups = FakeWhatsApp::numbered_groups(2, 3, 0);
    fake.set_groups(groups.clone());
    let id = AccountId::parse(name).unwrap();
    let account = sql
        .create_account(
            &NewAccount::named_by_id(id.clone(), GatewayKind::Whatsapp, AccountState::Pairing),
            chrono::Utc::now(),
        )
        .await
        .unwrap();
    let sessions = SessionStore::new(sql.wa_rows(), key);
    let (sessions, lease) = if leased {
        let ttl = Duration::from_secs(30);
        sql.node_heartbeat("n1", "i1", None, ttl).await.unwrap();
        let lease = sql.acquire_lease(&id, "n1", ttl).await.unwrap().unwrap();
        let table = Arc::new(LeaseTable::new("n1").with_suspend_clock(herald::boottime::now));
        let margin = Duration::from_secs(1);
        table.hold(&id, lease.epoch, tokio::time::Instant::now(), ttl, margin);
        (
            sessions.with_leases(table.clone()),
            Some((table, lease.epoch)),
        )
    } else {
        (sessions, None)
    };
    let gateway = WhatsappGateway::new(config(&fake), dir.path(), sessions.clone()).unwrap();
    let view = gateway.start_pairing(&account, None).await.unwrap();
    fake.scan(&view.qr.unwrap()).unwrap();
    let t0 = Instant::now();
    while gateway.pairing(&account).await.state != "paired" {
        assert!(t0.elapsed() < Duration::from_secs(60), "not paired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gateway.ready(&id).await.unwrap();
    Setup {
        fake,
        dir,
        sql,
        sessions,
        id,
        gateway,
        groups,
        lease,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_held_inside_the_client_past_the_lease_never_reaches_the_server() {
    let Setup {
        fake,
        dir: _dir,
        id,
        gateway,
        groups,
        lease,
        ..
    } = paired("held", true).await;

    // This daemon holds the account's lease, from now on valid for 2 s
    // more by its own clocks (a 3 s lease less a 1 s margin), and renews
    // nothing.
    let (table, epoch) = lease.unwrap();
    let hold = |table: &LeaseTable| {
        table.hold(
            &id,
            epoch,
            tokio::time::Instant::now(),
            Duration::from_secs(3),
            Duration::from_secs(1),
        )
    };
    hold(&table);

    // The first send to a group waits 4 s inside the client for the
    // members' devices and keys: past the lease's safety margin.
    fake.hold_key_queries(Some(Duration::from_secs(4)));
    let group = GroupJid::parse(&groups[0].jid).unwrap();
    let text = OutgoingMessage::Text("Stand-up at 10:00".into());
    let started = Instant::now();
    let held = gateway.send(&id, &group, &text, "fenced-1").await;
    assert!(
        matches!(held, Err(GatewayError::LeaseEnded(_))),
        "{held:?} after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= Duration::from_secs(4), "it was held");
    // (Herald turns its message id into a WhatsApp id: count by group.)
    let delivered = || {
        fake.deliveries()
            .iter()
            .filter(|d| d.group == groups[0].jid)
            .map(|d| d.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        delivered(),
        Vec::<String>::new(),
        "nothing reached the server"
    );

    // The lease renewed, the same id goes out, once.
    fake.hold_key_queries(None);
    hold(&table);
    let t0 = Instant::now();
    loop {
        match gateway.send(&id, &group, &text, "fenced-1").await {
            Ok(_) => break,
            // The refused frame closed the socket: it comes back first.
            Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                eprintln!("retrying after: {e}");
                hold(&table);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("not sent after the renewal: {e}"),
        }
    }
    assert_eq!(delivered().len(), 1, "once: {:?}", delivered());
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_the_old_owner_had_accepted_is_a_duplicate_for_the_new_owner() {
    let Setup {
        fake,
        dir: _dir,
        sql,
        sessions,
        id,
        gateway,
        groups,
        ..
    } = paired("moved", false).await;
    let group = GroupJid::parse(&groups[0].jid).unwrap();
    let text = OutgoingMessage::Text("Stand-up at 10:00".into());
    let first = gateway
        .send(&id, &group, &text, "run-7-group-1-part-0")
        .await;
    assert!(!first.unwrap().duplicate);
    // The old owner stops (the lease moves); its acks reached the database.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gateway.shutdown().await;
    // An earlier Herald kept accepted ids in a file per daemon: one more
    // id, accepted by a daemon of that version, is in such a file.
    // (Another daemon: its own data directory, the same database.)
    let other_dir = tempfile::tempdir().unwrap();
    let next = WhatsappGateway::new(config(&fake), other_dir.path(), sessions.clone()).unwrap();
    let old_id = herald::gateway::whatsapp::ids::wire_id("run-7-group-2-part-0").unwrap();
    let journal = next.account_dir(&id).join("acked-ids");
    std::fs::create_dir_all(journal.parent().unwrap()).unwrap();
    std::fs::write(&journal, format!("{old_id}\n")).unwrap();

    // The new owner: another gateway on the same database logs the
    // account in from its stored session and resends the part.
    let account = sql.get_account(&id).await.unwrap().unwrap();
    next.resume(&[account]);
    let t0 = Instant::now();
    while next.ready(&id).await.is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the new owner did not log in"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = next.send(&id, &group, &text, "run-7-group-1-part-0").await;
    assert!(again.unwrap().duplicate, "known from the database");
    let group2 = GroupJid::parse(&groups[1].jid).unwrap();
    let imported = next.send(&id, &group2, &text, "run-7-group-2-part-0").await;
    assert!(imported.unwrap().duplicate, "known from the imported file");
    assert!(!journal.exists(), "the file is deleted once imported");
    let stanzas: Vec<(String, usize)> = fake
        .deliveries()
        .iter()
        .map(|d| (d.group.clone(), d.seen_before))
        .collect();
    assert_eq!(
        stanzas,
        [(groups[0].jid.clone(), 0)],
        "one stanza in all: none for the resends"
    );
    next.shutdown().await;
}
