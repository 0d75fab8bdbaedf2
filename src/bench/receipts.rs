//! `herald bench receipts`: receipts counted a second through the real
//! counter and store, for a run to `groups` groups of `members` members
//! with `devices` devices each, as WhatsApp sends them: per group, a
//! delivery receipt from every device (each member's phone first), then a
//! read receipt from `read_share` of the members. Prints receipts a
//! second, receipts per CPU-second (a core's worth), store transactions
//! and rows written per 1,000 receipts, and RSS growth; and checks every
//! group's counts at the end.

use super::db_cost::DbCost;
use super::scale::{cpu_ticks, rss_kb, ticks_per_second};
use crate::store::SqlStore;
use chrono::Utc;
use herald_actors::delivery::outcome::message_id;
use herald_actors::delivery::receipts::{spawn, CounterConfig};
use herald_actors::domain::*;
use herald_actors::ports::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ReceiptsArgs {
    pub db: String,
    pub groups: usize,
    pub members: usize,
    pub devices: usize,
    pub read_share: f64,
}

pub async fn run(args: &ReceiptsArgs) -> anyhow::Result<String> {
    let scratch = super::ScratchDb::create(&args.db).await?;
    let out = measure(&scratch.url, args).await;
    scratch.cleanup().await?;
    out
}

/// Sets the run up, then counts its receipts on a pool of its own: on
/// PostgreSQL, what the counting alone cost the database is read around
/// it (a backend flushes its statistics when it exits).
async fn measure(url: &str, args: &ReceiptsArgs) -> anyhow::Result<String> {
    let store = SqlStore::connect(url).await?;
    let set_up = setup(&store, args).await;
    store.close().await;
    let (account, run, targets) = set_up?;
    let before = DbCost::read(url).await?;
    let store = Arc::new(SqlStore::connect(url).await?);
    let out = drive(store.clone(), args, account, run, targets).await;
    store.close().await;
    let (line, offered) = out?;
    let cost = DbCost::since(before, url, offered, "db_").await?;
    Ok(format!("{line}{cost}"))
}

/// One account, its directory, one run whose every group has its message
/// on the way.
async fn setup(
    store: &SqlStore,
    args: &ReceiptsArgs,
) -> anyhow::Result<(AccountId, RunId, Vec<RunTarget>)> {
    let now = Utc::now();
    let (account, groups) = super::bench_account(store, "bench-receipts", args.groups, now).await?;
    let listed: Vec<GroupInfo> = groups
        .iter()
        .map(|g| GroupInfo {
            jid: g.clone(),
            subject: g.to_string(),
            participants: args.members as u32 + 1,
            announce: false,
            is_admin: false,
            community: None,
        })
        .collect();
    store.sync_groups(&account, &listed, now).await?;
    let run = super::running_run(store, &account, "receipts benchmark", now).await?;
    store.create_targets(run, &groups).await?;
    let targets = store.list_targets(run, None, None, 0).await?;
    for chunk in targets.chunks(500) {
        let marks: Vec<Transition> = chunk
            .iter()
            .map(|t| Transition::Sending {
                target_id: t.id,
                part: 0,
                message_id: message_id(run, &t.group, 0),
            })
            .collect();
        store.apply_transitions(&marks).await?;
    }
    Ok((account, run, targets))
}

/// One group's receipts, in the order WhatsApp relays them.
fn group_receipts(
    account: &AccountId,
    run: RunId,
    group: &GroupJid,
    args: &ReceiptsArgs,
) -> Vec<Receipt> {
    let id = receipt_key(&message_id(run, group, 0)).to_owned();
    let at = Utc::now();
    // As the gateway makes them: the device's JID, less its device.
    let receipt = |member: usize, device: usize, kind| Receipt {
        account: account.clone(),
        chat: group.clone(),
        message_id: id.clone(),
        participant: participant_of(&format!("1555{member:07}:{device}@s.whatsapp.net")),
        kind,
        at,
    };
    let mut out = Vec::with_capacity(args.members * (args.devices + 1));
    for device in 0..args.devices {
        out.extend((0..args.members).map(|m| receipt(m, device, ReceiptKind::Delivered)));
    }
    let readers = (args.members as f64 * args.read_share).ceil() as usize;
    out.extend((0..readers).map(|m| receipt(m, 0, ReceiptKind::Read)));
    out
}

/// Counts the run's receipts; answers the line and the receipts offered.
async fn drive(
    store: Arc<SqlStore>,
    args: &ReceiptsArgs,
    account: AccountId,
    run: RunId,
    targets: Vec<RunTarget>,
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
    for t in &targets {
        for r in group_receipts(&account, run, &t.group, args) {
            // Faster than any account hears them: wait rather than drop.
            while sink.waiting() >= RECEIPT_BACKLOG / 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            anyhow::ensure!(sink.offer(r), "a receipt was dropped");
            offered += 1;
        }
        peak_rss = peak_rss.max(rss_kb()?);
    }
    let tally = counter.finish().await;
    let secs = started.elapsed().as_secs_f64();
    let cpu = (cpu_ticks()? - cpu_before) as f64 / ticks_per_second();
    peak_rss = peak_rss.max(rss_kb()?);

    // Every group: each member reached, the share of them readers.
    let readers = (args.members as f64 * args.read_share).ceil() as u32;
    let counted = store.list_targets(run, None, None, 0).await?;
    for t in &counted {
        anyhow::ensure!(
            t.receipts.delivered == args.members as u32 && t.receipts.read == readers,
            "group {} counted {:?}, expected {} reached and {readers} readers",
            t.group,
            t.receipts,
            args.members
        );
    }
    let totals = store.run_receipts(run).await?;
    let per_1000 = |n: u64| n as f64 * 1000.0 / offered.max(1) as f64;
    let line = format!(
        "receipts: backend={} groups={} members={} devices={} receipts={} seconds={:.3} \
         per_s={:.0} per_cpu_s={:.0} transactions_per_1000={:.2} rows_per_1000={:.2} \
         repeated={} participants={} readers={} rss_growth_mb={:.1}",
        store.backend(),
        args.groups,
        args.members,
        args.devices,
        offered,
        secs,
        offered as f64 / secs.max(1e-9),
        offered as f64 / cpu.max(1e-9),
        per_1000(tally.batches),
        per_1000(tally.targets_written),
        tally.repeated,
        totals.delivered,
        totals.read,
        (peak_rss.saturating_sub(rss_before)) as f64 / 1024.0,
    );
    Ok((line, offered))
}
