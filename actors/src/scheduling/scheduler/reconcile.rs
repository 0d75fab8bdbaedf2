//! The safety-net reload: one reminder, or every reminder changed since the
//! last pass (every tenth pass, all of them).

use super::state::{DeferredRun, Reconciled};
use crate::domain::{ReminderSchedule, RunId, RunStatus, TimeZone, WindowHours};
use crate::ports::{RunFilter, ScheduleScan, Store, StoreResult};
use std::collections::{HashMap, HashSet};

/// Loads what the scheduler needs of one reminder for
/// [`SchedulerState::apply`]; `None` if it is gone.
pub async fn load_reminder(store: &dyn Store, id: i64) -> StoreResult<Option<ReminderSchedule>> {
    store.get_reminder_schedule(id).await
}

/// Reads the reminders `scan` selects (skipping those in `clean` at the
/// same version) and reloads the `dirty` ones; finds `scheduled` runs not
/// in `known_deferred`.
pub async fn load_reconcile(
    store: &dyn Store,
    scan: ScheduleScan,
    clean: &HashMap<i64, i64>,
    dirty: &[i64],
    known_deferred: &HashSet<RunId>,
) -> StoreResult<Reconciled> {
    let mut rec = Reconciled::default();
    let rows = store.reminder_schedules(scan).await?;
    if scan == ScheduleScan::Active {
        rec.active = Some(rows.iter().map(|r| r.id).collect());
    }
    let mut by_id: HashMap<i64, (TimeZone, WindowHours)> = HashMap::new();
    for r in rows {
        rec.high_version = rec.high_version.max(r.version);
        by_id.insert(r.id, (r.timezone, r.window));
        if clean.get(&r.id) != Some(&r.version) || dirty.contains(&r.id) {
            rec.changed.push(r);
        }
    }
    for id in dirty {
        if by_id.contains_key(id) {
            continue;
        }
        if let Some(r) = store.get_reminder_schedule(*id).await? {
            by_id.insert(r.id, (r.timezone, r.window));
            rec.changed.push(r);
        }
    }
    let mut before_id = None;
    loop {
        let page = store
            .list_runs(&RunFilter {
                status: Some(RunStatus::Scheduled),
                before_id,
                limit: 500,
                ..RunFilter::default()
            })
            .await?;
        let Some(last) = page.last() else { break };
        before_id = Some(last.id.0);
        for run in &page {
            if known_deferred.contains(&run.id) {
                continue;
            }
            // A paused reminder's run is still loaded: it is cancelled at
            // its opening unless the reminder is active again by then.
            let (tz, window) = match by_id.get(&run.reminder_id) {
                Some(r) => *r,
                None => match store.get_reminder_schedule(run.reminder_id).await? {
                    Some(r) => (r.timezone, r.window),
                    None => continue,
                },
            };
            rec.deferred.push(DeferredRun::new(run, tz, &window));
        }
    }
    Ok(rec)
}
