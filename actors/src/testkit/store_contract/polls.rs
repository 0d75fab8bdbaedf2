//! Polls: a poll part round-trips; each voter's latest choice counts once
//! per group, whoever hears it and in whatever order.

use super::fixtures::*;
use crate::domain::*;

fn options() -> Vec<String> {
    vec!["Yes".into(), "No".into(), "Maybe".into()]
}

fn poll_part(multiple: bool) -> MessagePart {
    MessagePart::poll("Coming, {group_name}?", &options(), multiple).expect("valid poll")
}

fn run_poll(part: u32, multiple: bool) -> RunPoll {
    RunPoll {
        part,
        question: "Coming, {group_name}?".into(),
        options: options(),
        multiple,
    }
}

/// The key a vote for target `t`'s part `part` carries (any 22
/// characters unique to it do: the store does not derive them).
fn key(t: &RunTarget, part: u32) -> String {
    format!("3EB0{part:02X}{:016X}", t.id)
}

fn vote(
    a: &AccountId,
    chat: GroupJid,
    poll_id: &str,
    voter: &str,
    chosen: &[&str],
    second: i64,
) -> Vote {
    Vote {
        account: a.clone(),
        chat,
        poll_id: poll_id.to_owned(),
        voter: voter.to_owned(),
        options: chosen.iter().map(|o| option_hash(o)).collect(),
        at: t0() + chrono::Duration::seconds(second),
    }
}

/// A run of a reminder with a text and a poll (part 1) to `n` groups, its
/// polls opened; answers the run and its targets.
async fn poll_run(s: &S, a: &AccountId, n: usize, multiple: bool) -> (Run, Vec<RunTarget>) {
    let r = s
        .create_reminder(
            &spec(
                a,
                "Standup",
                vec![text("Standup at 10"), poll_part(multiple)],
                groups(0..n),
            ),
            t0(),
        )
        .await
        .expect("create reminder");
    let run = run(s, &r, 0, RunStatus::Queued).await;
    let ts = targets(s, run.id, n).await;
    let messages: Vec<PollMessage> = ts
        .iter()
        .map(|t| PollMessage {
            target_id: t.id,
            part: 1,
            key: key(t, 1),
        })
        .collect();
    s.open_polls(run.id, &[run_poll(1, multiple)], &messages)
        .await
        .expect("open polls");
    (run, ts)
}

fn votes_of(p: &PollResult) -> Vec<u64> {
    p.counts.options.iter().map(|o| o.votes).collect()
}

pub async fn a_poll_part_is_stored_as_written(s: S) {
    let a = account(&s, "a").await;
    let spec = spec(
        &a,
        "Ask",
        vec![poll_part(true), text("Thanks")],
        groups(0..1),
    );
    let r = s.create_reminder(&spec, t0()).await.expect("create");
    let back = s.get_reminder(r.id).await.unwrap().expect("stored");
    assert_eq!(back.spec.parts, spec.parts);
    let listed = s
        .list_reminders(&crate::ports::ReminderFilter::default())
        .await
        .unwrap();
    assert_eq!(listed[0].spec.parts, spec.parts);
}

pub async fn votes_keep_each_voters_latest_choice_once(s: S) {
    let a = account(&s, "a").await;
    let b = account(&s, "b").await;
    let (run, ts) = poll_run(&s, &a, 3, false).await;
    let (k0, k1) = (key(&ts[0], 1), key(&ts[1], 1));
    // Opening again (a resumed run) changes nothing.
    s.open_polls(run.id, &[run_poll(1, false)], &[])
        .await
        .unwrap();

    let tally = s
        .count_votes(&[
            vote(&a, group(0), &k0, "111@s.whatsapp.net", &["Yes"], 1),
            vote(&a, group(0), &k0, "222@s.whatsapp.net", &["No"], 1),
            // 111 changes their mind in the same batch: the later vote is kept.
            vote(&a, group(0), &k0, "111@s.whatsapp.net", &["Maybe"], 5),
            vote(&a, group(1), &k1, "333@s.whatsapp.net", &["Yes"], 2),
            // Another account's, another group's, nobody's poll: ignored.
            vote(&b, group(0), &k0, "444@s.whatsapp.net", &["Yes"], 2),
            vote(&a, group(2), &k0, "444@s.whatsapp.net", &["Yes"], 2),
            vote(
                &a,
                group(0),
                "3EB0FFFFFFFFFFFFFFFFFF",
                "444@s.whatsapp.net",
                &["Yes"],
                2,
            ),
            // Two options of a single-choice poll, an option it lacks.
            vote(&a, group(1), &k1, "555@s.whatsapp.net", &["Yes", "No"], 2),
            vote(&a, group(1), &k1, "555@s.whatsapp.net", &["Never"], 3),
        ])
        .await
        .expect("count");
    assert_eq!(tally.counted.get(&a), Some(&3));
    assert_eq!(tally.repeated, 1, "the earlier vote of 111 in the batch");
    assert_eq!(tally.ignored.get(&VoteIgnored::UnknownPoll), Some(&3));
    assert_eq!(tally.ignored.get(&VoteIgnored::BadChoice), Some(&2));

    let polls = s.run_polls(run.id).await.unwrap();
    assert_eq!(polls.len(), 1);
    assert_eq!(polls[0].poll, run_poll(1, false));
    assert_eq!(votes_of(&polls[0]), vec![1, 1, 1]);
    assert_eq!((polls[0].counts.voters, polls[0].groups_voted), (3, 2));

    // Heard again (a restart, the next owner): nothing changes. An older
    // vote heard late does not undo a newer one.
    let again = s
        .count_votes(&[
            vote(&a, group(0), &k0, "111@s.whatsapp.net", &["Maybe"], 5),
            vote(&a, group(0), &k0, "111@s.whatsapp.net", &["Yes"], 1),
        ])
        .await
        .unwrap();
    assert_eq!((again.counted_total(), again.repeated), (0, 2));
    assert_eq!(
        votes_of(&s.run_polls(run.id).await.unwrap()[0]),
        vec![1, 1, 1]
    );

    // A withdrawal removes the voter; a later vote brings them back.
    s.count_votes(&[vote(&a, group(1), &k1, "333@s.whatsapp.net", &[], 9)])
        .await
        .unwrap();
    let p = &s.run_polls(run.id).await.unwrap()[0];
    assert_eq!(
        (votes_of(p), p.counts.voters, p.groups_voted),
        (vec![0, 1, 1], 2, 1)
    );

    // Per group, every group of the run, paged by position.
    let page = s.group_polls(run.id, 1, None, 2).await.unwrap();
    let seen: Vec<(u32, u64)> = page.iter().map(|g| (g.position, g.counts.voters)).collect();
    assert_eq!(seen, vec![(0, 2), (1, 0)]);
    assert_eq!(page[0].group, group(0));
    let votes: Vec<u64> = page[0].counts.options.iter().map(|o| o.votes).collect();
    assert_eq!(votes, vec![0, 1, 1]);
    let rest = s.group_polls(run.id, 1, Some(1), 10).await.unwrap();
    assert_eq!(rest.iter().map(|g| g.position).collect::<Vec<_>>(), vec![2]);
    // A part that is not a poll has no groups to show.
    assert!(s.group_polls(run.id, 0, None, 10).await.unwrap().is_empty());
}

pub async fn a_multiple_choice_vote_counts_each_option(s: S) {
    let a = account(&s, "a").await;
    let (run, ts) = poll_run(&s, &a, 1, true).await;
    let k = key(&ts[0], 1);
    s.count_votes(&[
        vote(&a, group(0), &k, "1@s.whatsapp.net", &["Yes", "Maybe"], 1),
        vote(&a, group(0), &k, "2@s.whatsapp.net", &["Maybe"], 1),
    ])
    .await
    .unwrap();
    let p = &s.run_polls(run.id).await.unwrap()[0];
    assert_eq!((votes_of(p), p.counts.voters), (vec![1, 0, 2], 2));
}

pub async fn votes_counted_at_once_by_several_callers_keep_the_latest(s: S) {
    let a = account(&s, "a").await;
    let (run, ts) = poll_run(&s, &a, 2, false).await;
    let opts = ["Yes", "No", "Maybe"];
    // Each voter's votes split over several callers at once, in several
    // orders: what stays is each voter's last.
    let mut batches: Vec<Vec<Vote>> = vec![Vec::new(); 4];
    for voter in 0..40 {
        for round in 0..3i64 {
            let t = &ts[voter % 2];
            let v = vote(
                &a,
                t.group.clone(),
                &key(t, 1),
                &format!("{voter}@s.whatsapp.net"),
                &[opts[(voter + round as usize) % 3]],
                round,
            );
            batches[(voter + round as usize * 3) % 4].push(v);
        }
    }
    let calls: Vec<_> = batches
        .into_iter()
        .map(|b| {
            let s = s.clone();
            tokio::spawn(async move { s.count_votes(&b).await.expect("count") })
        })
        .collect();
    for c in calls {
        c.await.expect("caller");
    }
    let mut want = [0u64; 3];
    for voter in 0..40 {
        want[(voter + 2) % 3] += 1;
    }
    let p = &s.run_polls(run.id).await.unwrap()[0];
    assert_eq!(votes_of(p), want.to_vec());
    assert_eq!((p.counts.voters, p.groups_voted), (40, 2));
}

pub async fn votes_go_with_their_run(s: S) {
    let a = account(&s, "a").await;
    let (run, ts) = poll_run(&s, &a, 1, false).await;
    let k = key(&ts[0], 1);
    let heard = |voter: &str| vote(&a, group(0), &k, voter, &["Yes"], 1);
    s.count_votes(&[heard("1@lid")]).await.unwrap();
    super::scale::finish(&s, run.id, RunStatus::Success, at(1)).await;
    let r = s.get_reminder(run.reminder_id).await.unwrap().unwrap();
    super::fixtures::run(&s, &r, 10, RunStatus::Queued).await;
    while s.prune_runs(at(100), 100).await.unwrap() != PrunedRuns::default() {}
    assert!(s.run_polls(run.id).await.unwrap().is_empty());
    let late = s.count_votes(&[heard("2@lid")]).await.unwrap();
    assert_eq!(late.ignored.get(&VoteIgnored::UnknownPoll), Some(&1));
}
