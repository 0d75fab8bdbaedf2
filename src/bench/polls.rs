//! `herald bench polls`: poll votes opened and counted a second, for a run
//! whose poll went to `groups` groups of `members` members. Every member
//! votes; every fourth changes their choice and every tenth withdraws it
//! afterwards, each vote encrypted as a member's device encrypts it (the
//! poll's secret, WhatsApp's HKDF and AES-GCM, `wacore::poll`). The timed
//! part opens each vote with the same code a gateway uses and hands it to
//! the real counter and store. Prints votes a second, votes per CPU-second
//! (a core's worth), store transactions and voter rows written per 1,000
//! votes, and RSS growth; and checks every group's answer at the end.

use super::db_cost::DbCost;
use super::scale::{cpu_ticks, rss_kb, ticks_per_second};
use crate::store::SqlStore;
use chrono::{DateTime, Utc};
use herald_actors::delivery::outcome::message_id;
use herald_actors::delivery::receipts::{spawn, CounterConfig};
use herald_actors::domain::*;
use herald_actors::ports::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use whatsapp_rust::wacore::poll;

#[derive(Debug, Clone)]
pub struct PollsArgs {
    pub db: String,
    pub groups: usize,
    pub members: usize,
}

const OPTIONS: [&str; 3] = ["Yes", "No", "Maybe"];
const CREATOR: &str = "60123456789@s.whatsapp.net";

pub async fn run(args: &PollsArgs) -> anyhow::Result<String> {
    let scratch = super::ScratchDb::create(&args.db).await?;
    let out = measure(&scratch.url, args).await;
    scratch.cleanup().await?;
    out
}

async fn measure(url: &str, args: &PollsArgs) -> anyhow::Result<String> {
    let store = SqlStore::connect(url).await?;
    let set_up = setup(&store, args).await;
    store.close().await;
    let (account, run, targets) = set_up?;
    let votes = sealed_votes(&account, run, &targets, args)?;
    let before = DbCost::read(url).await?;
    let store = Arc::new(SqlStore::connect(url).await?);
    let out = drive(store.clone(), args, run, votes).await;
    store.close().await;
    let (line, offered) = out?;
    let cost = DbCost::since(before, url, offered, "db_").await?;
    Ok(format!("{line}{cost}"))
}

/// One account, one run whose poll (part 0) went to every group.
async fn setup(
    store: &SqlStore,
    args: &PollsArgs,
) -> anyhow::Result<(AccountId, RunId, Vec<RunTarget>)> {
    let now = Utc::now();
    let (account, groups) = super::bench_account(store, "bench-polls", args.groups, now).await?;
    let run = super::running_run(store, &account, "polls benchmark", now).await?;
    store.create_targets(run, &groups).await?;
    let targets = store.list_targets(run, None, None, 0).await?;
    let messages: Vec<PollMessage> = targets
        .iter()
        .map(|t| PollMessage {
            target_id: t.id,
            part: 0,
            key: receipt_key(&message_id(run, &t.group, 0)).to_owned(),
        })
        .collect();
    store.open_polls(run, &[the_poll()], &messages).await?;
    Ok((account, run, targets))
}

fn the_poll() -> RunPoll {
    RunPoll {
        part: 0,
        question: "Coming?".into(),
        options: OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
        multiple: false,
    }
}

/// A vote as it comes off the wire: its group, voter, time and ciphertext.
struct SealedVote {
    chat: GroupJid,
    poll_id: String,
    voter: String,
    at: DateTime<Utc>,
    payload: Vec<u8>,
    iv: Vec<u8>,
}

/// The poll's secret for `group` (any 32 bytes unique to it do here).
fn secret(group: &GroupJid) -> Vec<u8> {
    let h = option_hash(group.as_str());
    h.to_vec()
}

/// Each member's first vote, then the changes and withdrawals, encrypted.
fn sealed_votes(
    account: &AccountId,
    run: RunId,
    targets: &[RunTarget],
    args: &PollsArgs,
) -> anyhow::Result<(AccountId, Vec<SealedVote>)> {
    let t0 = Utc::now();
    let mut out = Vec::new();
    let mut seal = |t: &RunTarget, m: usize, chosen: Option<usize>, second: i64| {
        let poll_id = message_id(run, &t.group, 0);
        let voter = format!("1555{m:07}@s.whatsapp.net");
        let hashes: Vec<Vec<u8>> = chosen
            .map(|i| option_hash(OPTIONS[i]).to_vec())
            .into_iter()
            .collect();
        let (payload, iv) = poll::encrypt_poll_vote_with_secret(
            &hashes,
            &secret(&t.group),
            &poll_id,
            CREATOR,
            &voter,
        )?;
        out.push(SealedVote {
            chat: t.group.clone(),
            poll_id,
            voter,
            at: t0 + chrono::Duration::seconds(second),
            payload,
            iv: iv.to_vec(),
        });
        anyhow::Ok(())
    };
    for t in targets {
        for m in 0..args.members {
            seal(t, m, Some(m % OPTIONS.len()), 0)?;
        }
        for m in (0..args.members).step_by(4) {
            seal(t, m, Some((m + 1) % OPTIONS.len()), 1)?;
        }
        for m in (1..args.members).step_by(10) {
            seal(t, m, None, 2)?;
        }
    }
    Ok((account.clone(), out))
}

/// What each group's answer must be: the latest vote of each member.
fn expected(members: usize) -> (u64, [u64; 3]) {
    let mut per = [0u64; 3];
    let mut voters = 0;
    for m in 0..members {
        if m % 10 == 1 {
            continue;
        }
        let choice = if m % 4 == 0 { (m + 1) % 3 } else { m % 3 };
        per[choice] += 1;
        voters += 1;
    }
    (voters, per)
}

/// Opens and counts the run's votes; answers the line and the votes.
async fn drive(
    store: Arc<SqlStore>,
    args: &PollsArgs,
    run: RunId,
    (account, votes): (AccountId, Vec<SealedVote>),
) -> anyhow::Result<(String, u64)> {
    let (sink, inbox) = ReceiptSink::channel(RECEIPT_BACKLOG);
    let rss_before = rss_kb()?;
    let cpu_before = cpu_ticks()?;
    let started = Instant::now();
    let counter = spawn(
        inbox,
        store.clone(),
        Arc::new(NoMetrics),
        CounterConfig::default(),
    );
    let mut offered = 0u64;
    let mut peak_rss = rss_before;
    for (i, v) in votes.iter().enumerate() {
        let hashes = poll::decrypt_poll_vote_with_secret(
            poll::PollVoteCiphertext {
                enc_payload: &v.payload,
                enc_iv: &v.iv,
            },
            &secret(&v.chat),
            &v.poll_id,
            CREATOR,
            &v.voter,
        )?;
        let options = hashes
            .iter()
            .map(|h| <[u8; 32]>::try_from(h.as_slice()))
            .collect::<Result<Vec<_>, _>>()?;
        while sink.waiting() >= RECEIPT_BACKLOG / 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let vote = Vote {
            account: account.clone(),
            chat: v.chat.clone(),
            poll_id: v.poll_id.clone(),
            voter: v.voter.clone(),
            options,
            at: v.at,
        };
        anyhow::ensure!(sink.offer_vote(vote), "a vote was dropped");
        offered += 1;
        if i % 10_000 == 0 {
            peak_rss = peak_rss.max(rss_kb()?);
        }
    }
    let tally = counter.finish().await;
    let secs = started.elapsed().as_secs_f64();
    let cpu = (cpu_ticks()? - cpu_before) as f64 / ticks_per_second();
    peak_rss = peak_rss.max(rss_kb()?);

    let (voters, per) = expected(args.members);
    let groups = store
        .group_polls(run, 0, None, args.groups as u32 + 1)
        .await?;
    anyhow::ensure!(
        groups.len() == args.groups,
        "groups missing from the answer"
    );
    for g in &groups {
        let got: Vec<u64> = g.counts.options.iter().map(|o| o.votes).collect();
        anyhow::ensure!(
            g.counts.voters == voters && got == per,
            "group {} counted {got:?} from {} voters, expected {per:?} from {voters}",
            g.group,
            g.counts.voters
        );
    }
    let total = store.run_polls(run).await?;
    let per_1000 = |n: u64| n as f64 * 1000.0 / offered.max(1) as f64;
    let v = &tally.votes;
    let line = format!(
        "polls: backend={} groups={} members={} votes={} seconds={:.3} per_s={:.0} \
         per_cpu_s={:.0} transactions_per_1000={:.2} voter_rows_per_1000={:.2} repeated={} \
         voters={} rss_growth_mb={:.1}",
        store.backend(),
        args.groups,
        args.members,
        offered,
        secs,
        offered as f64 / secs.max(1e-9),
        offered as f64 / cpu.max(1e-9),
        per_1000(tally.batches),
        per_1000(v.counted_total()),
        v.repeated,
        total.first().map_or(0, |p| p.counts.voters),
        (peak_rss.saturating_sub(rss_before)) as f64 / 1024.0,
    );
    Ok((line, offered))
}
