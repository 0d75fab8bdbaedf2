//! Receipts: counted per participant and group, once, whoever hears them.

use super::fixtures::*;
use crate::domain::*;

fn receipt(
    account: &AccountId,
    chat: GroupJid,
    id: &str,
    participant: &str,
    kind: ReceiptKind,
    minute: i64,
) -> Receipt {
    Receipt {
        account: account.clone(),
        chat,
        message_id: id.to_owned(),
        participant: participant_of(participant),
        kind,
        at: at(minute),
    }
}

/// Marks target `t` as sending part `part` with an id shaped like the
/// engine's (24 characters, of which a receipt carries 22).
async fn sending(s: &S, t: &RunTarget, part: u32) -> String {
    let id = format!("3EB0{part:02X}{:016X}00", t.id);
    s.apply_transitions(&[Transition::Sending {
        target_id: t.id,
        part,
        message_id: id.clone(),
    }])
    .await
    .expect("mark sending");
    id
}

pub async fn receipts_count_each_participant_once_per_group(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    // Group 0: the account and 3 others; group 1 is not in the directory.
    s.sync_groups(
        &a,
        &[GroupInfo {
            jid: group(0),
            subject: "Team".into(),
            participants: 4,
            announce: false,
            is_admin: false,
            community: None,
        }],
        at(0),
    )
    .await
    .expect("sync groups");
    let r = reminder(&s, &a, 2).await;
    let run = run(&s, &r, 0, RunStatus::Queued).await;
    let ts = targets(&s, run.id, 2).await;
    let id0 = sending(&s, &ts[0], 0).await;
    let id1 = sending(&s, &ts[1], 0).await;
    // As WhatsApp carries them: cut to the wire's 22 characters.
    let wire0 = receipt_key(&id0).to_owned();
    let (d, rd) = (ReceiptKind::Delivered, ReceiptKind::Read);

    let batch = vec![
        // Another account's receipt for this message first: it alone is
        // ignored, whatever comes after it.
        receipt(&b, group(0), &wire0, "111@s.whatsapp.net", d, 1),
        receipt(&a, group(0), &wire0, "111:0@s.whatsapp.net", d, 1),
        // The same person's laptop: the same participant.
        receipt(&a, group(0), &wire0, "111:7@s.whatsapp.net", d, 1),
        // A read counts its reader as reached too.
        receipt(&a, group(0), &wire0, "222@s.whatsapp.net", rd, 2),
        receipt(&a, group(1), &id1, "333@lid", d, 3),
        // Not Herald's message; another account's again; another chat's.
        receipt(
            &a,
            group(0),
            "3EB0000000000000000000",
            "111@s.whatsapp.net",
            d,
            1,
        ),
        receipt(&b, group(0), &wire0, "111@s.whatsapp.net", d, 1),
        receipt(&a, group(1), &wire0, "111@s.whatsapp.net", d, 1),
    ];
    let tally = s.count_receipts(&batch).await.expect("count");
    assert_eq!(tally.counted(d), 3, "{tally:?}");
    assert_eq!(tally.counted(rd), 1, "{tally:?}");
    assert_eq!(tally.counted.get(&(a.clone(), d)), Some(&3));
    assert_eq!((tally.repeated, tally.ignored), (1, 4), "{tally:?}");
    assert_eq!(tally.targets_written, 2, "one row per group counted");

    let listed = all_targets(&s, run.id).await;
    assert_eq!(
        listed[0].receipts,
        TargetReceipts {
            delivered: 2,
            read: 1,
            first_receipt_at: Some(at(1)),
            last_receipt_at: Some(at(2)),
            // Kept by the store, so the run's read curve survives a restart.
            first_read_at: Some(at(2)),
        }
    );
    assert_eq!(listed[1].receipts.first_read_at, None, "nobody read it");
    assert_eq!(
        (listed[1].receipts.delivered, listed[1].receipts.read),
        (1, 0)
    );
    let total = s.run_receipts(run.id).await.expect("run receipts");
    assert_eq!(
        (
            total.groups_delivered,
            total.groups_read,
            total.delivered,
            total.read
        ),
        (2, 1, 3, 1)
    );
    assert_eq!(
        (total.first_receipt_at, total.last_receipt_at),
        (Some(at(1)), Some(at(3)))
    );

    // Heard again (a replay, a restart, the next owner): nothing changes.
    let again = s.count_receipts(&batch).await.expect("count again");
    assert!(again.counted.is_empty(), "{again:?}");
    assert_eq!((again.repeated, again.ignored), (4, 4));
    assert_eq!(again.targets_written, 0, "nothing new, nothing written");
    assert_eq!(s.run_receipts(run.id).await.unwrap(), total);

    // Group 0 has 3 others: a fourth name is not a fourth participant.
    let more = s
        .count_receipts(&[
            receipt(&a, group(0), &wire0, "444@s.whatsapp.net", d, 4),
            receipt(&a, group(0), &wire0, "555@s.whatsapp.net", d, 5),
        ])
        .await
        .unwrap();
    assert_eq!((more.counted(d), more.repeated), (1, 1));
    assert_eq!(all_targets(&s, run.id).await[0].receipts.delivered, 3);

    // Counted per group's current message: once the next part is on its
    // way, receipts name that one.
    let next = sending(&s, &ts[1], 1).await;
    let late = s
        .count_receipts(&[
            receipt(&a, group(1), &id1, "666@lid", d, 6),
            receipt(&a, group(1), &next, "333@lid", rd, 6),
        ])
        .await
        .unwrap();
    assert_eq!((late.ignored, late.counted(rd), late.counted(d)), (1, 1, 0));
    assert_eq!(
        s.run_receipts(RunId(999_999)).await.unwrap(),
        RunReceipts::default()
    );
}

pub async fn receipts_counted_at_once_by_several_callers_add_up(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 1).await;
    let run = run(&s, &r, 0, RunStatus::Queued).await;
    let ts = targets(&s, run.id, 1).await;
    let id = sending(&s, &ts[0], 0).await;
    // Eight daemons' batches for one message, overlapping by half.
    let mut calls = Vec::new();
    for caller in 0..8 {
        let (s, a, id) = (s.clone(), a.clone(), id.clone());
        calls.push(tokio::spawn(async move {
            let batch: Vec<Receipt> = (caller * 10..caller * 10 + 20)
                .map(|p| {
                    receipt(
                        &a,
                        group(0),
                        &id,
                        &format!("{p}@s.whatsapp.net"),
                        ReceiptKind::Delivered,
                        1,
                    )
                })
                .collect();
            s.count_receipts(&batch).await.expect("count")
        }));
    }
    let mut counted = 0;
    for c in calls {
        counted += c.await.expect("caller").counted(ReceiptKind::Delivered);
    }
    // Participants 0..90: each counted by exactly one caller.
    assert_eq!(counted, 90);
    assert_eq!(all_targets(&s, run.id).await[0].receipts.delivered, 90);
}

pub async fn receipts_go_with_their_run(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 1).await;
    let old = run(&s, &r, 0, RunStatus::Queued).await;
    let ts = targets(&s, old.id, 1).await;
    let id = sending(&s, &ts[0], 0).await;
    let heard = |p: &str| receipt(&a, group(0), &id, p, ReceiptKind::Delivered, 1);
    s.count_receipts(&[heard("1@lid")]).await.unwrap();
    super::scale::finish(&s, old.id, RunStatus::Success, at(1)).await;
    // A newer run keeps the old one prunable.
    run(&s, &r, 10, RunStatus::Queued).await;
    while s.prune_runs(at(100), 100).await.unwrap() != PrunedRuns::default() {}
    assert!(s.get_run(old.id).await.unwrap().is_none());
    assert_eq!(
        s.run_receipts(old.id).await.unwrap(),
        RunReceipts::default()
    );
    // Its receipts, still arriving, are nobody's now.
    let late = s.count_receipts(&[heard("2@lid")]).await.unwrap();
    assert_eq!((late.ignored, late.counted.len()), (1, 0));
}

pub async fn a_runs_receipts_are_reported_once(s: S) {
    let a = account(&s, "a").await;
    let r = reminder(&s, &a, 1).await;
    let ended = run(&s, &r, 0, RunStatus::Queued).await;
    super::scale::finish(&s, ended.id, RunStatus::Success, at(5)).await;
    let later = run(&s, &r, 10, RunStatus::Queued).await;
    super::scale::finish(&s, later.id, RunStatus::Partial, at(15)).await;
    let open = run(&s, &r, 20, RunStatus::Queued).await;

    // Ended before the horizon, oldest first; a run still open never.
    assert_eq!(s.unreported_runs(at(10), 10).await.unwrap(), vec![ended.id]);
    assert_eq!(
        s.unreported_runs(at(60), 10).await.unwrap(),
        vec![ended.id, later.id]
    );
    let event = NewEvent {
        at: at(20),
        kind: "run_receipts",
        account_id: Some(a.clone()),
        run_id: Some(ended.id),
        data: serde_json::json!({ "run_id": ended.id.0 }),
    };
    let before = s.events_after(0, 0).await.unwrap().len();
    let stored = s
        .report_receipts(ended.id, at(20), std::slice::from_ref(&event))
        .await
        .unwrap();
    assert_eq!(stored.len(), 1, "reported, with its event");
    let stored = stored.into_iter().next().unwrap();
    assert_eq!(
        (stored.kind.as_str(), stored.run_id),
        ("run_receipts", Some(ended.id.0))
    );
    // Twice (another daemon's sweep): no second event.
    assert!(s
        .report_receipts(ended.id, at(21), std::slice::from_ref(&event))
        .await
        .unwrap()
        .is_empty());
    let events = s.events_after(0, 0).await.unwrap();
    assert_eq!(events.len(), before + 1);
    assert_eq!(events.last().unwrap(), &stored);
    // A mark alone: reported, no event.
    assert!(s
        .report_receipts(later.id, at(22), &[])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(s.events_after(0, 0).await.unwrap().len(), before + 1);
    assert!(s.unreported_runs(at(60), 10).await.unwrap().is_empty());
    assert!(s
        .report_receipts(RunId(999_999), at(22), std::slice::from_ref(&event))
        .await
        .unwrap()
        .is_empty());
    let _ = open;
}
