//! A run over time, as its charts draw it: the messages sent in each minute
//! against the account's per-minute limit, and the groups sent and reached
//! since the first send. Read from the store's own sent-at and receipt
//! times of the run's groups, so a chart never shows what the API cannot.

use super::accounts::Accounts;
use super::error::ApiError;
use super::{Allowed, Operation, Service};
use chrono::{DateTime, Duration, DurationRound, Utc};
use herald_actors::domain::{AmendState, Amendment, Role, Run, RunId, RunTarget};
use herald_actors::ports::Store;
use schemars::JsonSchema;
use serde::Serialize;

pub static TIMELINE: Operation = Operation::read("getRunTimeline", Role::Viewer);

/// Groups a run's timeline reads from the store at once.
const PAGE: u32 = 1000;
/// At most this many points on the reach curve: receipts keep coming for
/// days, and a step of one minute over days would be thousands of points.
const REACH_POINTS: i64 = 120;

/// Messages sent in one minute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct MinuteSends {
    /// The minute's start (UTC).
    pub minute: DateTime<Utc>,
    /// Messages (parts) of groups whose last part went out in this minute.
    pub messages: u32,
    /// Groups whose last part went out in this minute.
    pub groups: u32,
}

/// How far the run had got by `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ReachPoint {
    pub at: DateTime<Utc>,
    /// Groups sent by then.
    pub sent: u32,
    /// Groups where at least one participant had it by then (the group's
    /// first receipt).
    pub reached: u32,
    /// Groups where at least one participant had read it by then (the
    /// group's first read).
    pub read: u32,
}

/// How far a recall or edit had got by `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct AmendPoint {
    pub at: DateTime<Utc>,
    /// Groups recalled (or edited) by then.
    pub done: u32,
    /// Groups settled by then: done, too old, or refused.
    pub settled: u32,
}

/// The run's newest recall or edit over time.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AmendTimeline {
    /// `recall` or `edit`.
    pub kind: String,
    pub requested_at: DateTime<Utc>,
    /// Groups there is something to amend in.
    pub total: u32,
    /// From the request to the newest mark, in even steps (at most 120).
    pub points: Vec<AmendPoint>,
}

impl AmendTimeline {
    /// `amendment`'s progress from its groups' marks (state, time).
    pub fn of(
        amendment: &Amendment,
        marks: &[(Option<AmendState>, Option<DateTime<Utc>>)],
    ) -> Self {
        let settled: Vec<(DateTime<Utc>, bool)> = marks
            .iter()
            .filter_map(|(state, at)| match (state, at) {
                (Some(AmendState::Sending) | None, _) | (_, None) => None,
                (Some(s), Some(at)) => Some((*at, *s == AmendState::Done)),
            })
            .collect();
        let start = amendment.requested_at;
        let end = settled
            .iter()
            .map(|(at, _)| *at)
            .max()
            .unwrap_or(start)
            .max(start);
        let span = ((end - start).num_seconds() + 1).max(1);
        let step = (span + REACH_POINTS - 1) / REACH_POINTS;
        let points = (1..=(span + step - 1) / step)
            .map(|i| {
                let at = start + Duration::seconds(i * step);
                AmendPoint {
                    at,
                    done: settled.iter().filter(|(t, done)| *done && *t < at).count() as u32,
                    settled: settled.iter().filter(|(t, _)| *t < at).count() as u32,
                }
            })
            .collect();
        Self {
            kind: amendment.kind.as_str().to_owned(),
            requested_at: start,
            total: amendment.progress.total,
            points,
        }
    }
}

/// A run over time.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunTimeline {
    pub run_id: RunId,
    /// The account's per-minute limit as it stands now (its own, or the
    /// daemon's default): the line no minute may cross.
    pub max_per_minute: u32,
    /// When the run's delivery window closes; null for a run without one.
    pub window_end_at: Option<DateTime<Utc>>,
    /// Every minute from the first send to the last, empty ones included;
    /// empty before the first send.
    pub minutes: Vec<MinuteSends>,
    /// Groups sent, reached and read, cumulative, from the first send to
    /// the newest send, first receipt or first read, in even steps (at most
    /// 120).
    pub reach: Vec<ReachPoint>,
    /// Groups in the run, and how many were read. Groups counted before
    /// Herald kept the time of their first read are in `groups_read` but
    /// not on the curve.
    pub groups: u32,
    pub groups_read: u32,
    /// Its newest recall or edit, if it has one.
    pub amendment: Option<AmendTimeline>,
}

impl RunTimeline {
    /// The timeline of `run`, whose groups are `targets`, under a limit of
    /// `max_per_minute`.
    pub fn of(run: &Run, max_per_minute: u32, targets: &[RunTarget]) -> Self {
        let minute = |t: DateTime<Utc>| {
            t.duration_trunc(Duration::minutes(1))
                .expect("a minute divides any time")
        };
        let sent: Vec<(DateTime<Utc>, u32)> = targets
            .iter()
            .filter_map(|t| t.sent_at.map(|at| (at, t.parts_sent)))
            .collect();
        let first = sent.iter().map(|(at, _)| minute(*at)).min();
        // A run its window ended runs on to the close's minute (empty
        // minutes, at most ten), so the close is drawn and said even when
        // it fell in the minute after the last send.
        let closed = run
            .window_end_at
            .filter(|w| run.finished_at.is_some_and(|f| *w <= f))
            .map(minute);
        let last = sent
            .iter()
            .map(|(at, _)| minute(*at))
            .max()
            .map(|l| match closed {
                Some(c) if c > l && c - l <= Duration::minutes(10) => c,
                _ => l,
            });
        let mut minutes = Vec::new();
        if let (Some(first), Some(last)) = (first, last) {
            let span = (last - first).num_minutes() as usize + 1;
            minutes = (0..span)
                .map(|i| MinuteSends {
                    minute: first + Duration::minutes(i as i64),
                    messages: 0,
                    groups: 0,
                })
                .collect();
            for (at, parts) in &sent {
                let m = &mut minutes[(minute(*at) - first).num_minutes() as usize];
                m.messages += parts;
                m.groups += 1;
            }
        }
        let reached: Vec<DateTime<Utc>> = targets
            .iter()
            .filter_map(|t| t.receipts.first_receipt_at)
            .collect();
        let read: Vec<DateTime<Utc>> = targets
            .iter()
            .filter_map(|t| t.receipts.first_read_at)
            .collect();
        let reach = first.map_or_else(Vec::new, |first| {
            let end = sent
                .iter()
                .map(|(at, _)| *at)
                .chain(reached.iter().copied())
                .chain(read.iter().copied())
                .max()
                .unwrap_or(first);
            let span = (minute(end) - first).num_minutes() + 1;
            let step = (span + REACH_POINTS - 1) / REACH_POINTS;
            (1..=(span + step - 1) / step)
                .map(|i| {
                    let at = first + Duration::minutes(i * step);
                    ReachPoint {
                        at,
                        sent: sent.iter().filter(|(s, _)| *s < at).count() as u32,
                        reached: reached.iter().filter(|r| **r < at).count() as u32,
                        read: read.iter().filter(|r| **r < at).count() as u32,
                    }
                })
                .collect()
        });
        Self {
            run_id: run.id,
            max_per_minute,
            window_end_at: run.window_end_at,
            minutes,
            reach,
            groups: targets.len() as u32,
            groups_read: targets.iter().filter(|t| t.receipts.read > 0).count() as u32,
            amendment: None,
        }
    }

    /// The most messages sent in any one minute.
    pub fn peak(&self) -> u32 {
        self.minutes.iter().map(|m| m.messages).max().unwrap_or(0)
    }
}

/// Reading runs' timelines.
pub struct Timelines<'a> {
    store: &'a dyn Store,
    accounts: Accounts<'a>,
}

impl<'a> Timelines<'a> {
    pub fn of(service: &'a Service) -> Self {
        Self {
            store: service.state.store.as_ref(),
            accounts: Accounts::of(service),
        }
    }

    /// Run `id` over time.
    pub async fn get(&self, allowed: Allowed, id: RunId) -> Result<RunTimeline, ApiError> {
        allowed.of(&TIMELINE)?;
        let run = self
            .store
            .get_run(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("run {id}")))?;
        let mut targets = Vec::new();
        let mut after = None;
        loop {
            let page = self.store.list_targets(run.id, None, after, PAGE).await?;
            let full = page.len() as u32 == PAGE;
            after = page.last().map(|t| t.position);
            targets.extend(page);
            if !full {
                break;
            }
        }
        // A deleted account's runs keep their history; its limit is the
        // daemon's default.
        let limit = match self.store.get_account(&run.account_id).await? {
            Some(a) => self.accounts.view(a).effective_limits.max_per_minute,
            None => self.accounts.default_max_per_minute(),
        };
        let mut timeline = RunTimeline::of(&run, limit, &targets);
        if let Some(a) = self.store.run_amendment(run.id).await? {
            let mut marks = Vec::new();
            let mut after = None;
            loop {
                let page = self.store.amend_targets(a.id, after, PAGE).await?;
                let full = page.len() as u32 == PAGE;
                after = page.last().map(|t| t.position);
                marks.extend(page.into_iter().map(|t| (t.state, t.marked_at)));
                if !full {
                    break;
                }
            }
            timeline.amendment = Some(AmendTimeline::of(&a, &marks));
        }
        Ok(timeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use herald_actors::domain::{
        AccountId, GroupJid, RunStatus, TargetCounts, TargetReceipts, TargetStatus,
    };

    fn at(min: i64, sec: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 23, 9, 0, 0).unwrap()
            + Duration::minutes(min)
            + Duration::seconds(sec)
    }

    fn run() -> Run {
        Run {
            id: RunId(7),
            reminder_id: 1,
            account_id: AccountId::parse("a").unwrap(),
            scheduled_for: at(0, 0),
            window_end_at: Some(at(60, 0)),
            status: RunStatus::Success,
            forecast: None,
            error_summary: None,
            counts: TargetCounts::default(),
            created_at: at(0, 0),
            started_at: Some(at(0, 0)),
            finished_at: None,
            stop_requested_at: None,
        }
    }

    fn target(
        i: u32,
        sent: Option<DateTime<Utc>>,
        parts: u32,
        reached: Option<DateTime<Utc>>,
    ) -> RunTarget {
        RunTarget {
            id: i64::from(i),
            run_id: RunId(7),
            position: i,
            group: GroupJid::parse(&format!("120363{i:012}@g.us")).unwrap(),
            status: if sent.is_some() {
                TargetStatus::Sent
            } else {
                TargetStatus::Failed
            },
            parts_sent: if sent.is_some() { parts } else { 0 },
            message_id: None,
            attempts: 1,
            error: None,
            sent_at: sent,
            latency_ms: None,
            chosen_by: "explicit".into(),
            receipts: TargetReceipts {
                delivered: u32::from(reached.is_some()),
                read: 0,
                first_receipt_at: reached,
                last_receipt_at: reached,
                first_read_at: None,
            },
        }
    }

    /// `t`, first read at `at` by one participant.
    fn read_at(mut t: RunTarget, at: DateTime<Utc>) -> RunTarget {
        t.receipts.read = 1;
        t.receipts.first_read_at = Some(at);
        t
    }

    #[test]
    fn a_run_its_window_ended_runs_on_to_the_close_s_minute() {
        let targets = [target(0, Some(at(0, 50)), 1, None)];
        let mut r = run();
        r.window_end_at = Some(at(1, 10));
        r.finished_at = Some(at(1, 10));
        let t = RunTimeline::of(&r, 4, &targets);
        assert_eq!(t.minutes.len(), 2, "the close's minute is on the chart");
        // Still sending when the window is far off: no empty minutes.
        r.finished_at = None;
        assert_eq!(RunTimeline::of(&r, 4, &targets).minutes.len(), 1);
    }

    #[test]
    fn each_minute_counts_its_messages_and_empty_minutes_show() {
        let targets = [
            target(0, Some(at(0, 5)), 2, Some(at(0, 30))),
            target(1, Some(at(0, 59)), 2, None),
            target(2, Some(at(3, 0)), 2, Some(at(9, 10))),
            target(3, None, 2, None),
        ];
        let t = RunTimeline::of(&run(), 20, &targets);
        let counts: Vec<(u32, u32)> = t.minutes.iter().map(|m| (m.messages, m.groups)).collect();
        assert_eq!(counts, [(4, 2), (0, 0), (0, 0), (2, 1)]);
        assert_eq!(t.minutes[0].minute, at(0, 0));
        assert_eq!(t.peak(), 4);
        assert_eq!((t.groups, t.max_per_minute), (4, 20));
        // Reach runs to the last receipt, a point a minute.
        assert_eq!(t.reach.len(), 10);
        let last = t.reach.last().unwrap();
        assert_eq!((last.at, last.sent, last.reached), (at(10, 0), 3, 2));
        assert_eq!((t.reach[0].sent, t.reach[0].reached), (2, 1));
    }

    #[test]
    fn reads_draw_their_own_curve_under_reach_and_stretch_it() {
        let targets = [
            read_at(target(0, Some(at(0, 5)), 1, Some(at(0, 30))), at(2, 0)),
            read_at(target(1, Some(at(0, 20)), 1, Some(at(1, 0))), at(14, 30)),
            target(2, Some(at(0, 40)), 1, Some(at(1, 10))),
        ];
        let t = RunTimeline::of(&run(), 20, &targets);
        // The last read, not the last receipt, ends the curve.
        let last = t.reach.last().unwrap();
        assert_eq!(last.at, at(15, 0));
        assert_eq!((last.sent, last.reached, last.read), (3, 3, 2));
        assert_eq!(t.groups_read, 2);
        let read: Vec<u32> = t.reach.iter().map(|p| p.read).collect();
        assert_eq!(&read[..3], [0, 0, 1], "the first read in the third minute");
        assert!(
            t.reach.iter().all(|p| p.read <= p.reached),
            "a group is reached before or when it is read"
        );
    }

    #[test]
    fn receipts_days_later_stretch_the_steps_not_the_points() {
        let targets = [
            target(0, Some(at(0, 0)), 1, Some(at(3 * 24 * 60, 0))),
            target(1, Some(at(0, 1)), 1, None),
        ];
        let t = RunTimeline::of(&run(), 20, &targets);
        assert_eq!(t.minutes.len(), 1);
        assert!(t.reach.len() <= REACH_POINTS as usize, "{}", t.reach.len());
        assert_eq!(t.reach.last().unwrap().reached, 1);
        assert!(t.reach.last().unwrap().at > at(3 * 24 * 60, 0));
    }

    #[test]
    fn an_amendment_counts_its_groups_as_their_marks_settle() {
        use herald_actors::domain::{AmendKind, AmendProgress};
        let a = Amendment {
            id: 1,
            run_id: RunId(7),
            kind: AmendKind::Recall,
            edits: vec![],
            requested_at: at(10, 0),
            window_secs: 172_800,
            finished_at: None,
            progress: AmendProgress {
                total: 4,
                ..Default::default()
            },
            left_as_sent: vec![],
        };
        let marks = [
            (Some(AmendState::Done), Some(at(10, 2))),
            (Some(AmendState::Done), Some(at(10, 40))),
            (Some(AmendState::TooOld), Some(at(10, 41))),
            (Some(AmendState::Sending), Some(at(10, 42))),
            (None, None),
        ];
        let t = AmendTimeline::of(&a, &marks);
        assert_eq!((t.kind.as_str(), t.total), ("recall", 4));
        let last = t.points.last().unwrap();
        assert_eq!(
            (last.done, last.settled),
            (2, 3),
            "in flight and unmarked are not settled"
        );
        assert!(last.at > at(10, 41));
        assert!(t.points.len() <= REACH_POINTS as usize);
        assert_eq!(
            (t.points[2].done, t.points[2].settled),
            (1, 1),
            "{:?}",
            t.points[2]
        );
    }

    #[test]
    fn a_run_that_sent_nothing_has_no_minutes_and_no_curve() {
        let t = RunTimeline::of(&run(), 20, &[target(0, None, 1, None)]);
        assert!(t.minutes.is_empty() && t.reach.is_empty());
        assert_eq!(t.peak(), 0);
    }
}
