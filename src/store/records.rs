//! Rows to domain records and back: the column lists every query selects,
//! the mapping of each row to its record, and the runs listing's SQL.

use super::rows::RowGet;
use super::{corrupt, opt_u32, parse_enum, to_u32};
use herald_actors::domain::*;
use herald_actors::ports::*;
use std::collections::HashMap;

// ---------------------------------------------------------------- row mapping

pub(super) const ACCOUNT_COLS: &str =
    "id, name, kind, state, state_reason, state_until, max_per_minute, \
                            group_concurrency, daily_cap, hourly_cap, timezone, created_at, \
                            incident_at, new_number, standing";
pub(super) const MEDIA_COLS: &str = "sha256, mime, size, filename, created_at";
pub(super) const REMINDER_COLS: &str =
    "id, account_id, title, timezone, schedule_kind, schedule_expr, \
     window_start_hour, window_end_hour, resume_next_window, unique_texts, state, created_at, \
     updated_at, target_select";
const RUN_COLS: &str = "id, reminder_id, account_id, scheduled_for, window_end_at, status, \
                        forecast, error_summary, created_at, started_at, finished_at, \
                        stop_requested_at";
pub(super) const TARGET_COLS: &str =
    "id, run_id, position, group_jid, status, parts_sent, message_id, \
                           attempts, error, sent_at, latency_ms, chosen_by";
pub(super) const EVENT_COLS: &str = "id, at, kind, account_id, run_id, data";
/// What the scheduler reads of a reminder (`ReminderSchedule`), with its
/// newest run's occurrence from the firing lock's index.
pub(super) const SCHEDULE_COLS: &str = "r.id, r.account_id, r.state, r.timezone, r.schedule_kind, \
     r.schedule_expr, r.window_start_hour, r.window_end_hour, \
     (r.target_select IS NOT NULL) AS selects, r.created_at, r.updated_at, r.version, \
     (SELECT MAX(x.scheduled_for) FROM runs x WHERE x.reminder_id = r.id) AS last_scheduled_for";
/// A reminder in a list, its parts and targets counted when it was written
/// (counting 50 reminders' 2,000 target rows per page cost PostgreSQL a
/// quarter of a second before their first vacuum).
pub(super) const SUMMARY_COLS: &str =
    "r.id, r.state, r.account_id, r.title, r.timezone, r.schedule_kind, \
     r.schedule_expr, r.window_start_hour, r.window_end_hour, r.resume_next_window, \
     r.created_at, r.updated_at, r.part_count AS n_parts, r.target_count AS n_targets";
/// Runs retention may delete (alias `p`): finished, ended before `$1`, and
/// not their reminder's newest (the scheduler's cursor).
pub(super) const PRUNABLE_RUN: &str = "p.status IN ('success', 'partial', 'failed', 'cancelled', 'missed') \
     AND COALESCE(p.finished_at, p.created_at) < $1 \
     AND p.scheduled_for < (SELECT MAX(n.scheduled_for) FROM runs n WHERE n.reminder_id = p.reminder_id)";
pub(super) const UNFINISHED: &str = "('queued', 'running', 'paused', 'parked')";
/// Runs whose reminder may not change: they send what it said when they fired.
pub(super) const EDIT_BLOCKING: &str = "('scheduled', 'queued', 'running', 'paused', 'parked')";

pub(super) fn account_from<R: RowGet>(r: &R) -> StoreResult<Account> {
    Ok(Account {
        id: AccountId::parse(&r.text("id")?).map_err(|e| corrupt("account id", e))?,
        name: r.text("name")?,
        kind: parse_enum(r.text("kind")?, "gateway kind")?,
        state: parse_enum(r.text("state")?, "account state")?,
        state_reason: r.opt_text("state_reason")?,
        state_until: r.opt_ts("state_until")?,
        limits: AccountLimits {
            max_per_minute: opt_u32(r.opt_int("max_per_minute")?, "max_per_minute")?,
            group_concurrency: opt_u32(r.opt_int("group_concurrency")?, "group_concurrency")?,
            daily_cap: opt_u32(r.opt_int("daily_cap")?, "daily_cap")?,
            hourly_cap: opt_u32(r.opt_int("hourly_cap")?, "hourly_cap")?,
            timezone: r
                .opt_text("timezone")?
                .map(|t| TimeZone::parse(&t).map_err(|e| corrupt("account timezone", e)))
                .transpose()?,
            new_number: r.flag("new_number")?,
        },
        created_at: r.ts("created_at")?,
        incident_at: r.opt_ts("incident_at")?,
        standing: r
            .opt_text("standing")?
            .map(|t| serde_json::from_str(&t).map_err(|e| corrupt("account standing", e)))
            .transpose()?
            .unwrap_or_default(),
    })
}

pub(super) fn media_from<R: RowGet>(r: &R) -> StoreResult<MediaInfo> {
    Ok(MediaInfo {
        id: MediaId::parse(&r.text("sha256")?).map_err(|e| corrupt("media id", e))?,
        mime: r.text("mime")?,
        size: u64::try_from(r.int("size")?).map_err(|e| corrupt("media size", e))?,
        filename: r.opt_text("filename")?,
        created_at: r.ts("created_at")?,
    })
}

/// A poll part's options and choice rule, as `reminder_parts.poll` keeps them.
#[derive(serde::Serialize, serde::Deserialize)]
struct PollColumn {
    options: Vec<String>,
    multiple: bool,
}

/// A part's `text`, `media_id`, `caption` and `poll` columns.
pub(crate) fn part_columns(
    part: &MessagePart,
) -> (Option<&str>, Option<&str>, Option<&str>, Option<String>) {
    match part {
        MessagePart::Text { text } => (Some(text), None, None, None),
        MessagePart::Media { media, caption } => {
            (None, Some(media.as_str()), caption.as_deref(), None)
        }
        MessagePart::Poll {
            question,
            options,
            multiple,
        } => {
            let poll = PollColumn {
                options: options.clone(),
                multiple: *multiple,
            };
            let json = serde_json::to_string(&poll).expect("strings serialize");
            (Some(question), None, None, Some(json))
        }
    }
}

fn part_from<R: RowGet>(r: &R) -> StoreResult<MessagePart> {
    match r.text("kind")?.as_str() {
        "poll" => {
            let json = r.opt_text("poll")?.unwrap_or_default();
            let poll: PollColumn =
                serde_json::from_str(&json).map_err(|e| corrupt("part poll", e))?;
            Ok(MessagePart::Poll {
                question: r.opt_text("text")?.unwrap_or_default(),
                options: poll.options,
                multiple: poll.multiple,
            })
        }
        "text" => Ok(MessagePart::Text {
            text: r.opt_text("text")?.unwrap_or_default(),
        }),
        "media" => {
            let id = r.opt_text("media_id")?.unwrap_or_default();
            Ok(MessagePart::Media {
                media: MediaId::parse(&id).map_err(|e| corrupt("part media", e))?,
                caption: r.opt_text("caption")?,
            })
        }
        other => Err(corrupt("part kind", other)),
    }
}

fn target_jid_from<R: RowGet>(r: &R) -> StoreResult<GroupJid> {
    GroupJid::parse(&r.text("group_jid")?).map_err(|e| corrupt("group jid", e))
}

pub(super) fn reminder_from<R: RowGet>(
    r: &R,
    parts: Vec<MessagePart>,
    targets: Vec<GroupJid>,
) -> StoreResult<Reminder> {
    let timezone = TimeZone::parse(&r.text("timezone")?).map_err(|e| corrupt("timezone", e))?;
    let schedule = Schedule::from_parts(&r.text("schedule_kind")?, &r.text("schedule_expr")?)
        .map_err(|e| corrupt("schedule", e))?;
    let window = WindowHours::parse(r.int("window_start_hour")?, r.int("window_end_hour")?)
        .map_err(|e| corrupt("window", e))?;
    Ok(Reminder {
        id: r.int("id")?,
        state: parse_enum(r.text("state")?, "reminder state")?,
        spec: NewReminder {
            account_id: AccountId::parse(&r.text("account_id")?)
                .map_err(|e| corrupt("account id", e))?,
            title: r.text("title")?,
            timezone,
            schedule,
            window,
            resume_next_window: r.flag("resume_next_window")?,
            parts,
            targets,
            select: r
                .opt_text("target_select")?
                .map(|s| serde_json::from_str(&s).map_err(|e| corrupt("target selector", e)))
                .transpose()?,
            unique_texts: r.flag("unique_texts")?,
        },
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

/// Timezone, schedule and window columns, shared by the reminder readers.
fn timing_from<R: RowGet>(r: &R) -> StoreResult<(TimeZone, Schedule, WindowHours)> {
    let timezone = TimeZone::parse(&r.text("timezone")?).map_err(|e| corrupt("timezone", e))?;
    let schedule = Schedule::from_parts(&r.text("schedule_kind")?, &r.text("schedule_expr")?)
        .map_err(|e| corrupt("schedule", e))?;
    let window = WindowHours::parse(r.int("window_start_hour")?, r.int("window_end_hour")?)
        .map_err(|e| corrupt("window", e))?;
    Ok((timezone, schedule, window))
}

pub(super) fn schedule_from<R: RowGet>(r: &R) -> StoreResult<ReminderSchedule> {
    let (timezone, schedule, window) = timing_from(r)?;
    Ok(ReminderSchedule {
        id: r.int("id")?,
        account_id: AccountId::parse(&r.text("account_id")?)
            .map_err(|e| corrupt("account id", e))?,
        state: parse_enum(r.text("state")?, "reminder state")?,
        timezone,
        schedule,
        window,
        selects: r.flag("selects")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
        version: r.int("version")?,
        last_scheduled_for: r.opt_ts("last_scheduled_for")?,
    })
}

pub(super) fn summary_from<R: RowGet>(r: &R) -> StoreResult<ReminderSummary> {
    let (timezone, schedule, window) = timing_from(r)?;
    Ok(ReminderSummary {
        id: r.int("id")?,
        state: parse_enum(r.text("state")?, "reminder state")?,
        account_id: AccountId::parse(&r.text("account_id")?)
            .map_err(|e| corrupt("account id", e))?,
        title: r.text("title")?,
        timezone,
        schedule,
        window,
        resume_next_window: r.flag("resume_next_window")?,
        parts: to_u32(r.int("n_parts")?, "part count")?,
        targets: to_u32(r.int("n_targets")?, "target count")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

/// `limit` as SQL's LIMIT: 0 means no limit.
pub(super) fn sql_limit(limit: u32) -> i64 {
    if limit == 0 {
        i64::MAX
    } else {
        i64::from(limit)
    }
}

pub(super) fn run_from<R: RowGet>(r: &R) -> StoreResult<Run> {
    let count = |c: &str| to_u32(r.int(c)?, "target count");
    Ok(Run {
        id: RunId(r.int("id")?),
        reminder_id: r.int("reminder_id")?,
        account_id: AccountId::parse(&r.text("account_id")?)
            .map_err(|e| corrupt("account id", e))?,
        scheduled_for: r.ts("scheduled_for")?,
        window_end_at: r.opt_ts("window_end_at")?,
        status: parse_enum(r.text("status")?, "run status")?,
        forecast: r.opt_text("forecast")?,
        error_summary: r.opt_text("error_summary")?,
        counts: TargetCounts {
            pending: count("n_pending")?,
            sending: count("n_sending")?,
            sent: count("n_sent")?,
            failed: count("n_failed")?,
            skipped: count("n_skipped")?,
        },
        created_at: r.ts("created_at")?,
        started_at: r.opt_ts("started_at")?,
        stop_requested_at: r.opt_ts("stop_requested_at")?,
        finished_at: r.opt_ts("finished_at")?,
    })
}

pub(super) fn target_from<R: RowGet>(r: &R) -> StoreResult<RunTarget> {
    Ok(RunTarget {
        id: r.int("id")?,
        run_id: RunId(r.int("run_id")?),
        position: to_u32(r.int("position")?, "target position")?,
        group: target_jid_from(r)?,
        status: parse_enum(r.text("status")?, "target status")?,
        parts_sent: to_u32(r.int("parts_sent")?, "parts_sent")?,
        message_id: r.opt_text("message_id")?,
        attempts: to_u32(r.int("attempts")?, "attempts")?,
        error: r.opt_text("error")?,
        sent_at: r.opt_ts("sent_at")?,
        latency_ms: opt_u32(r.opt_int("latency_ms")?, "latency_ms")?,
        chosen_by: r.text("chosen_by")?,
        receipts: TargetReceipts::default(),
    })
}

pub(super) fn event_from<R: RowGet>(r: &R) -> StoreResult<Event> {
    let data = r.text("data")?;
    Ok(Event {
        id: r.int("id")?,
        at: r.ts("at")?,
        kind: r.text("kind")?,
        account_id: r.opt_text("account_id")?,
        run_id: r.opt_int("run_id")?,
        data: serde_json::from_str(&data).map_err(|e| corrupt("event data", e))?,
    })
}

/// Runs matching `filter` with their target counts, in one statement: the
/// page of runs first, then one grouped count over just those runs' targets
/// (served by the (run_id, status) index).
pub(super) fn runs_sql(filter: &str, order: &str, limit: &str) -> String {
    format!(
        "WITH page AS (SELECT {RUN_COLS} FROM runs WHERE {filter} ORDER BY id {order} {limit}) \
         SELECT page.*, \
                COALESCE(c.n_pending, 0) AS n_pending, COALESCE(c.n_sending, 0) AS n_sending, \
                COALESCE(c.n_sent, 0) AS n_sent, COALESCE(c.n_failed, 0) AS n_failed, \
                COALESCE(c.n_skipped, 0) AS n_skipped \
         FROM page LEFT JOIN ( \
             SELECT run_id, \
                    COUNT(*) FILTER (WHERE status = 'pending') AS n_pending, \
                    COUNT(*) FILTER (WHERE status = 'sending') AS n_sending, \
                    COUNT(*) FILTER (WHERE status = 'sent') AS n_sent, \
                    COUNT(*) FILTER (WHERE status = 'failed') AS n_failed, \
                    COUNT(*) FILTER (WHERE status = 'skipped') AS n_skipped \
             FROM run_targets WHERE run_id IN (SELECT id FROM page) GROUP BY run_id \
         ) c ON c.run_id = page.id \
         ORDER BY page.id {order}"
    )
}

/// Reminders' parts and targets, by reminder id.
type Children = (HashMap<i64, Vec<MessagePart>>, HashMap<i64, Vec<GroupJid>>);

/// Collects part and target rows (ordered by reminder, position) per reminder.
pub(super) fn group_children<R: RowGet>(parts: &[R], targets: &[R]) -> StoreResult<Children> {
    let mut p: HashMap<i64, Vec<MessagePart>> = HashMap::new();
    for r in parts {
        p.entry(r.int("reminder_id")?)
            .or_default()
            .push(part_from(r)?);
    }
    let mut t: HashMap<i64, Vec<GroupJid>> = HashMap::new();
    for r in targets {
        t.entry(r.int("reminder_id")?)
            .or_default()
            .push(target_jid_from(r)?);
    }
    Ok((p, t))
}
