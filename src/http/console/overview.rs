//! The overview: what is sending now, what fires next, accounts that need
//! the operator, and recent failures.

use super::charts;
use super::layout::{self, badge, local, Nav};
use super::runs::runs_table;
use super::Signed;
use crate::http::errors::ApiError;
use crate::service::accounts::Accounts;
use crate::service::reminders::Reminders;
use crate::service::runs::{NamedRun, Runs};
use crate::service::upcoming::Upcoming;
use crate::service::Allowed;
use crate::service::Service;
use actix_web::{web, HttpResponse};
use chrono::Utc;
use herald_actors::domain::{AccountState, ReminderState, RunStatus, TimeZone};
use herald_actors::ports::{ReminderFilter, RunFilter};
use herald_actors::scheduling::scheduler::next_due;
use maud::html;
use std::collections::BTreeSet;

/// How many of each list the overview shows.
const SHOWN: u32 = 10;

async fn runs_in(
    runs: &Runs<'_>,
    allowed: Allowed,
    statuses: &[RunStatus],
) -> Result<Vec<NamedRun>, ApiError> {
    let mut out = Vec::new();
    for st in statuses {
        let filter = RunFilter {
            reminder_id: None,
            account_id: None,
            status: Some(*st),
            before_id: None,
            limit: SHOWN,
        };
        out.extend(runs.list(allowed, &filter).await?.items);
    }
    out.sort_by_key(|r| std::cmp::Reverse(r.run.id));
    out.truncate(SHOWN as usize);
    Ok(out)
}

pub async fn page(
    service: web::Data<Service>,
    Signed(s): Signed,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let runs = Runs::of(&service);
    let now_sending = runs_in(
        &runs,
        allowed,
        &[
            RunStatus::Running,
            RunStatus::Queued,
            RunStatus::Paused,
            RunStatus::Parked,
        ],
    )
    .await?;
    let failures = runs_in(
        &runs,
        allowed,
        &[RunStatus::Failed, RunStatus::Partial, RunStatus::Missed],
    )
    .await?;
    let active = ReminderFilter {
        state: Some(ReminderState::Active),
        ..ReminderFilter::default()
    };
    let reminders = Reminders::of(&service).all(allowed, &active).await?;
    let now = Utc::now();
    let upcoming = Upcoming::of(&reminders, now);
    // Times in the reminders' zone when they share one, else UTC.
    let zones: BTreeSet<&str> = reminders.iter().map(|r| r.spec.timezone.name()).collect();
    let zone = match (zones.len(), reminders.first()) {
        (1, Some(r)) => r.spec.timezone,
        _ => TimeZone::parse("UTC").expect("UTC is a zone"),
    };
    let mut next: Vec<_> = reminders
        .iter()
        .filter_map(|r| {
            let s = &r.spec;
            next_due(&s.schedule, &s.timezone, &s.window, now).map(|d| (d.effective, r))
        })
        .collect();
    next.sort_by_key(|(at, _)| *at);
    next.truncate(SHOWN as usize);
    let attention: Vec<_> = Accounts::of(&service)
        .all(allowed)
        .await?
        .into_iter()
        .map(|v| v.account)
        .filter(|a| {
            matches!(
                a.state,
                AccountState::LoggedOut
                    | AccountState::Banned
                    | AccountState::Disconnected
                    | AccountState::CoolingDown
            ) || a.standing.needs_attention(now)
        })
        .collect();
    let body = html! {
        div.cards {
            section.card aria-labelledby="sending" {
                h2 #sending { "Sending now" }
                div #now-sending { (runs_table(&now_sending)) }
            }
            section.card aria-labelledby="next" {
                h2 #next { "Fires next" }
                @if next.is_empty() { p { "Nothing scheduled." } }
                ul { @for (at, r) in &next { li {
                    a href={ "/reminders/" (r.id) } { (r.spec.title) } " — " (local(*at, &r.spec.timezone))
                    " · " (r.spec.account_id)
                } } }
            }
            section.card.wide aria-labelledby="day-ahead" {
                h2 #day-ahead { "The next 24 hours" }
                (charts::upcoming_chart(&upcoming, &zone))
            }
            section.card aria-labelledby="attention" {
                h2 #attention { "Accounts needing attention" }
                @if attention.is_empty() { p { "None: every account is connected, pairing or disabled on purpose." } }
                ul { @for a in &attention { li {
                    a href={ "/accounts/" (a.id) } { (a.id) } " " (badge(a.state.as_str()))
                    @if let Some(r) = &a.state_reason { " " (r) }
                    @if let Some(w) = a.standing.attention(now) { " " span.standing { (w) } }
                } } }
            }
            section.card aria-labelledby="failures" {
                h2 #failures { "Recent failures" }
                (runs_table(&failures))
            }
        }
    };
    Ok(layout::page("Overview", Nav::Overview, &s, body))
}
