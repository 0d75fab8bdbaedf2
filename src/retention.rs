//! Retention: deletes finished runs (with their targets), events, media
//! no reminder uses and audit log entries once they are older than the
//! settings allow, and the message ids WhatsApp accepted as long ago as
//! the runs that sent them.
//!
//! The pruner works in small batches, each its own short transaction, and
//! yields between them: on SQLite the engine's group commits queue behind
//! one batch at most, so sends keep their pace while a year of history is
//! deleted. Unfinished runs are never touched, nor a reminder's newest run
//! (the scheduler's cursor). Media rows and files go together, under the
//! lock uploads hold (see [`FileMedia::gc_lock`]).

use crate::media::FileMedia;
use crate::settings::RetentionSettings;
use crate::store::whatsapp::WaRows;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use herald_actors::ports::{Clock, Store, StoreResult};
use std::sync::Arc;
use std::time::Duration;

/// The horizons and batch size, from `[retention]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// `None` keeps that kind of history forever.
    pub runs: Option<ChronoDuration>,
    pub events: Option<ChronoDuration>,
    pub media: Option<ChronoDuration>,
    pub audit: Option<ChronoDuration>,
    pub batch: u32,
    /// Between two batches: room for the engine's writes.
    pub pause: Duration,
}

impl RetentionConfig {
    pub fn from_settings(s: &RetentionSettings) -> Self {
        let days = |d: u32| (d > 0).then(|| ChronoDuration::days(i64::from(d)));
        Self {
            runs: days(s.runs_days),
            events: days(s.events_days),
            media: (s.media_unreferenced_hours > 0)
                .then(|| ChronoDuration::hours(i64::from(s.media_unreferenced_hours))),
            audit: days(s.audit_days),
            batch: s.batch,
            pause: Duration::from_millis(20),
        }
    }
}

/// What one pass deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub runs: u64,
    pub targets: u64,
    pub events: u64,
    pub media: u64,
    pub audit: u64,
    pub accepted_ids: u64,
    pub batches: u64,
}

pub struct Pruner {
    store: Arc<dyn Store>,
    media: Arc<FileMedia>,
    config: RetentionConfig,
    /// The WhatsApp accounts' accepted message ids, when there are any.
    accepted: Option<WaRows>,
}

impl Pruner {
    pub fn new(store: Arc<dyn Store>, media: Arc<FileMedia>, config: RetentionConfig) -> Self {
        Self {
            store,
            media,
            config,
            accepted: None,
        }
    }

    /// Also forgets accepted message ids as old as the runs it deletes.
    pub fn with_accepted_ids(mut self, rows: Option<WaRows>) -> Self {
        self.accepted = rows;
        self
    }

    /// Deletes everything past its horizon at `now`, batch by batch, until
    /// nothing is left to delete. Tests call it with the instant they want.
    pub async fn prune_once(&self, now: DateTime<Utc>) -> StoreResult<PruneReport> {
        let mut report = PruneReport::default();
        let batch = self.config.batch;
        if let Some(keep) = self.config.runs {
            loop {
                let n = self.store.prune_runs(now - keep, batch).await?;
                if n.runs == 0 && n.targets == 0 {
                    break;
                }
                report.runs += n.runs;
                report.targets += n.targets;
                self.between_batches(&mut report).await;
            }
            if let Some(rows) = &self.accepted {
                loop {
                    let n = rows.prune_accepted(now - keep, batch).await?;
                    if n == 0 {
                        break;
                    }
                    report.accepted_ids += n;
                    self.between_batches(&mut report).await;
                }
            }
        }
        if let Some(keep) = self.config.events {
            loop {
                let n = self.store.prune_events(now - keep, batch).await?;
                if n == 0 {
                    break;
                }
                report.events += n;
                self.between_batches(&mut report).await;
            }
        }
        if let Some(keep) = self.config.media {
            loop {
                let removed = {
                    let _gc = self.media.gc_lock().await;
                    let ids = self.store.prune_media(now - keep, batch).await?;
                    for id in &ids {
                        if let Err(e) = self.media.remove(id).await {
                            // The row is gone, so nothing can use the file;
                            // only disk space is lost.
                            tracing::warn!(error = %e, media = %id, "could not remove a pruned media file");
                        }
                    }
                    ids.len() as u64
                };
                if removed == 0 {
                    break;
                }
                report.media += removed;
                self.between_batches(&mut report).await;
            }
        }
        if let Some(keep) = self.config.audit {
            loop {
                let n = self.store.prune_audit(now - keep, batch).await?;
                if n == 0 {
                    break;
                }
                report.audit += n;
                self.between_batches(&mut report).await;
            }
        }
        Ok(report)
    }

    async fn between_batches(&self, report: &mut PruneReport) {
        report.batches += 1;
        tokio::time::sleep(self.config.pause).await;
    }

    /// Prunes every `every` on `clock` until the handle is aborted; the
    /// first pass runs one period after start, not during start-up.
    pub fn spawn(self, clock: Arc<dyn Clock>, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match self.prune_once(clock.now()).await {
                    Ok(r) if r == PruneReport::default() => {}
                    Ok(r) => tracing::info!(
                        runs = r.runs,
                        targets = r.targets,
                        events = r.events,
                        media = r.media,
                        audit = r.audit,
                        accepted_ids = r.accepted_ids,
                        batches = r.batches,
                        "retention pruned old history"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "retention pass failed; retrying next period")
                    }
                }
            }
        })
    }
}
