//! A run's pictures, drawn on the server as SVG in the page's colours:
//! messages sent per minute against the account's per-minute limit (and
//! the window's end), and groups sent and reached since the first send.
//! Each is a figure whose caption says in words what it draws, from the
//! same numbers the API answers (`GET /v1/runs/{id}/timeline`).

use crate::service::history::AccountHistory;
use crate::service::timeline::{AmendPoint, AmendTimeline, ReachPoint, RunTimeline};
use crate::service::upcoming::Upcoming;
use chrono::{DateTime, Utc};
use herald_actors::domain::{duration_words, TimeZone};
use maud::{html, Markup, PreEscaped};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

const SIZE: (u32, u32) = (720, 240);
/// The console's colours (console.css): accent, danger, muted, focus, line.
const SENT: RGBColor = RGBColor(0x0b, 0x6e, 0x4f);
pub(crate) const LIMIT: RGBColor = RGBColor(0xb4, 0x23, 0x18);
const WINDOW: RGBColor = RGBColor(0x9a, 0x67, 0x00);
const REACHED: RGBColor = RGBColor(0x1f, 0x6f, 0xeb);
const READ: RGBColor = RGBColor(0x6e, 0x40, 0xc9);
const MUTED: RGBColor = RGBColor(0x5b, 0x64, 0x70);
const GRID: RGBColor = RGBColor(0xd9, 0xdd, 0xe3);

/// The chart's SVG, or why it could not be drawn.
type Drawn = Result<String, String>;

/// "09:41" in the run's timezone.
fn clock(at: DateTime<Utc>, tz: &TimeZone) -> String {
    at.with_timezone(&tz.tz()).format("%H:%M").to_string()
}

/// The per-minute chart and the reach chart, each with its caption; a
/// note instead while nothing was sent.
pub fn run_charts(t: &RunTimeline, tz: &TimeZone) -> Markup {
    if t.minutes.is_empty() {
        return html! { p.hint #charts { "The charts appear once the first group is sent." } };
    }
    let first = t.minutes[0].minute;
    let last = t.minutes[t.minutes.len() - 1].minute;
    let total: u32 = t.minutes.iter().map(|m| m.messages).sum();
    let pace_caption = format!(
        "Messages sent per minute, {} to {}: {total} in {}, at most {} in any minute, \
         against the account's limit of {} a minute{}.",
        clock(first, tz),
        clock(last + chrono::Duration::minutes(1), tz),
        plural(t.minutes.len(), "minute"),
        t.peak(),
        t.max_per_minute,
        t.window_end_at
            .filter(|w| *w <= last + chrono::Duration::minutes(1))
            .map_or(String::new(), |w| format!(
                "; the window closed at {}",
                clock(w, tz)
            )),
    );
    let reach_caption = t.reach.last().map_or(String::new(), |p| {
        format!(
            "Groups sent, reached and read since {}: by {}, {} of {} groups sent, {} reached \
             (a first receipt) and {} read{}.",
            clock(first, tz),
            clock(p.at, tz),
            p.sent,
            t.groups,
            p.reached,
            p.read,
            // Reads counted before Herald kept their time are not drawn.
            if t.groups_read > p.read {
                format!(" ({} read in all)", t.groups_read)
            } else {
                String::new()
            },
        )
    });
    html! {
        div.charts #charts {
            (figure("chart-pace", pace_svg(t, tz), &pace_caption))
            (figure("chart-reach", reach_svg(t, tz), &reach_caption))
            @if let Some(a) = &t.amendment {
                (figure("chart-amend", amend_svg(a, tz), &amend_caption(a, tz)))
            }
        }
    }
}

/// "Recall requested at 10:12: by 10:14, 38 of 40 groups recalled, 2 settled otherwise."
fn amend_caption(a: &AmendTimeline, tz: &TimeZone) -> String {
    let word = if a.kind == "edit" {
        "edited"
    } else {
        "recalled"
    };
    let mut caption = format!(
        "{} requested at {}",
        if a.kind == "edit" { "Edit" } else { "Recall" },
        clock(a.requested_at, tz)
    );
    if let Some(p) = a.points.last() {
        caption.push_str(&format!(
            ": by {}, {} of {} {word}",
            clock(p.at, tz),
            p.done,
            plural(a.total as usize, "group"),
        ));
        let other = p.settled - p.done;
        if other > 0 {
            caption.push_str(&format!(", {other} too old or refused"));
        }
    }
    caption.push('.');
    caption
}

fn amend_svg(a: &AmendTimeline, tz: &TimeZone) -> Drawn {
    let start = a.requested_at;
    let end = a.points.last().map_or(start, |p| p.at);
    let span = ((end - start).num_seconds() as f64).max(1.0);
    let at = |x: &f64| start + chrono::Duration::seconds(*x as i64);
    let minutes = (span / 60.0).ceil() as usize;
    let x = XAxis {
        range: 0f64..span,
        labels: minutes.clamp(1, 8) + 1,
        label: &|x| clock(at(x), tz),
    };
    let curve = |pick: fn(&AmendPoint) -> u32| {
        std::iter::once((0.0, 0.0))
            .chain(
                a.points
                    .iter()
                    .map(move |p| ((p.at - start).num_seconds() as f64, f64::from(pick(p)))),
            )
            .collect::<Vec<_>>()
    };
    let done = if a.kind == "edit" {
        "edited"
    } else {
        "recalled"
    };
    let legend = Some(SeriesLabelPosition::LowerRight);
    chart_svg(x, f64::from(a.total.max(1)), 40, legend, |chart| {
        line(chart, curve(|p| p.done), SENT, done)?;
        line(chart, curve(|p| p.settled), WINDOW, "settled")
    })
}

/// A chart on the console's SVG canvas, as drawing code sees it.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
/// Why drawing stopped (plotters' errors, shown under the figure).
type Failed = Box<dyn std::error::Error>;

/// A chart's horizontal axis: its range, how many labels, and their text.
struct XAxis<'f> {
    range: std::ops::Range<f64>,
    labels: usize,
    label: &'f dyn Fn(&f64) -> String,
}

/// Every chart's frame: a white ground, grey axes and labels, level grid
/// lines, whole numbers up the side from 0 to `y_top` (in a label area
/// `y_area` wide); `draw` puts the series on it, and a `legend` of the
/// labelled ones goes where it says.
fn chart_svg(
    x: XAxis,
    y_top: f64,
    y_area: u32,
    legend: Option<SeriesLabelPosition>,
    draw: impl FnOnce(&mut Chart<'_, '_>) -> Result<(), Failed>,
) -> Drawn {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let drawn = (|| -> Result<(), Failed> {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .margin(10)
                // Room for the last time label, centred on the right edge.
                .margin_right(28)
                .x_label_area_size(28)
                .y_label_area_size(y_area)
                .build_cartesian_2d(x.range, 0f64..y_top)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .light_line_style(WHITE)
                .bold_line_style(GRID)
                .axis_style(MUTED)
                .label_style(("sans-serif", 15).into_font().color(&MUTED))
                .x_labels(x.labels)
                .x_label_formatter(x.label)
                .y_labels(6)
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()?;
            draw(&mut chart)?;
            if let Some(position) = legend {
                chart
                    .configure_series_labels()
                    .position(position)
                    .background_style(WHITE.mix(0.9))
                    .border_style(GRID)
                    .label_font(("sans-serif", 15).into_font().color(&MUTED))
                    .draw()?;
            }
            root.present()?;
            Ok(())
        })();
        drawn.map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// A curve in `colour`, named `label` in the legend.
fn line(
    chart: &mut Chart<'_, '_>,
    points: Vec<(f64, f64)>,
    colour: RGBColor,
    label: &str,
) -> Result<(), Failed> {
    chart
        .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2)));
    Ok(())
}

/// A figure: the drawing is an image named by its caption.
fn figure(id: &str, svg: Drawn, caption: &str) -> Markup {
    let caption_id = format!("{id}-caption");
    html! {
        figure #(id) {
            @match svg {
                Ok(svg) => (PreEscaped(svg.replacen(
                    "<svg ",
                    &format!(r#"<svg role="img" aria-labelledby="{caption_id}" "#),
                    1,
                ))),
                Err(e) => p.hint { "The chart could not be drawn: " (e) },
            }
            figcaption #(caption_id) { (caption) }
        }
    }
}

fn pace_svg(t: &RunTimeline, tz: &TimeZone) -> Drawn {
    let n = t.minutes.len();
    let top = t.peak().max(t.max_per_minute) + t.max_per_minute.max(4) / 4;
    let first = t.minutes[0].minute;
    let at = |x: &f64| first + chrono::Duration::minutes(*x as i64);
    let x = XAxis {
        range: 0f64..n as f64,
        labels: n.min(8) + 1,
        label: &|x| clock(at(x), tz),
    };
    chart_svg(x, f64::from(top), 40, None, |chart| {
        chart.draw_series(t.minutes.iter().enumerate().map(|(i, m)| {
            let x = i as f64;
            Rectangle::new(
                [(x + 0.1, 0.0), (x + 0.9, f64::from(m.messages))],
                SENT.filled(),
            )
        }))?;
        let limit = f64::from(t.max_per_minute);
        chart.draw_series(LineSeries::new(
            [(0.0, limit), (n as f64, limit)],
            LIMIT.stroke_width(2),
        ))?;
        if let Some(end) = t.window_end_at {
            let x = (end - first).num_seconds() as f64 / 60.0;
            if (0.0..=n as f64).contains(&x) {
                chart.draw_series(LineSeries::new(
                    [(x, 0.0), (x, f64::from(top))],
                    WINDOW.stroke_width(2),
                ))?;
            }
        }
        Ok(())
    })
}

fn reach_svg(t: &RunTimeline, tz: &TimeZone) -> Drawn {
    let first = t.minutes[0].minute;
    let end = t.reach.last().map_or(first, |p| p.at);
    let span = ((end - first).num_seconds() as f64 / 60.0).max(1.0);
    let at = |x: &f64| first + chrono::Duration::seconds((*x * 60.0) as i64);
    let x = XAxis {
        range: 0f64..span,
        // Whole minutes: a run of one minute gets two labels, not eight
        // that all read the same.
        labels: (span.ceil() as usize).clamp(1, 8) + 1,
        label: &|x| clock(at(x), tz),
    };
    let curve = |pick: fn(&ReachPoint) -> u32| {
        std::iter::once((0.0, 0.0))
            .chain(t.reach.iter().map(move |p| {
                (
                    (p.at - first).num_seconds() as f64 / 60.0,
                    f64::from(pick(p)),
                )
            }))
            .collect::<Vec<_>>()
    };
    // Cumulative curves rise to the right: the upper left stays clear.
    let legend = Some(SeriesLabelPosition::UpperLeft);
    chart_svg(x, f64::from(t.groups.max(1)), 40, legend, |chart| {
        line(chart, curve(|p| p.sent), SENT, "sent")?;
        line(chart, curve(|p| p.reached), REACHED, "reached")?;
        line(chart, curve(|p| p.read), READ, "read")
    })
}

/// The account's 30 days: messages each day as bars, the day's ceiling
/// (daily cap or warm-up step) as a line over them, and its last incident.
pub fn account_chart(h: &AccountHistory) -> Markup {
    let total: u32 = h.days.iter().map(|d| d.messages).sum();
    let busiest = h.days.iter().max_by_key(|d| d.messages);
    let today = h.days.last();
    let mut caption = format!(
        "Messages sent per day over the last {} days ({}): {total} in all",
        h.days.len(),
        h.timezone.name()
    );
    if let Some(b) = busiest.filter(|b| b.messages > 0) {
        caption.push_str(&format!(
            ", at most {} on {}",
            b.messages,
            b.day.format("%b %-d")
        ));
    }
    match today.and_then(|t| t.ceiling.map(|c| (c, t.ceiling_by.as_deref()))) {
        Some((c, Some("warmup"))) => caption.push_str(&format!(
            "; today's ceiling is {c}, set by the warm-up ramp"
        )),
        Some((c, _)) => caption.push_str(&format!("; today's ceiling is its daily cap of {c}")),
        None => caption.push_str("; no daily cap or warm-up ramp holds it"),
    }
    if let Some(at) = h.incident_at.filter(|at| {
        h.days
            .first()
            .is_some_and(|d| at.with_timezone(&h.timezone.tz()).date_naive() >= d.day)
    }) {
        caption.push_str(&format!(
            "; its last incident was on {} (the ramp starts again from it)",
            at.with_timezone(&h.timezone.tz()).format("%b %-d")
        ));
    }
    let bands = bands(h);
    if !bands.is_empty() {
        let secs: f64 = bands.iter().map(|(x0, x1, _)| (x1 - x0) * 86_400.0).sum();
        let mut states: Vec<&str> = bands.iter().map(|(_, _, s)| s.as_str()).collect();
        states.sort_unstable();
        states.dedup();
        caption.push_str(&format!(
            "; not connected for {} in {} (shaded: {})",
            duration_words(secs.round() as i64),
            plural(bands.len(), "stretch"),
            states.join(", ").replace('_', " ")
        ));
    }
    caption.push('.');
    html! {
        div.charts #charts {
            (figure("chart-days", days_svg(h), &caption))
        }
    }
}

/// Each span outside `connected` as (from, to, state) on the days axis:
/// day `i`'s bar is centred on `i`, its local midnight at `i - 0.5`.
fn bands(h: &AccountHistory) -> Vec<(f64, f64, String)> {
    let Some(first) = h.days.first().map(|d| d.day) else {
        return Vec::new();
    };
    let tz = h.timezone.tz();
    let midnight = first
        .and_time(chrono::NaiveTime::MIN)
        .and_local_timezone(tz)
        .earliest()
        .map(|t| t.with_timezone(&Utc));
    let Some(midnight) = midnight else {
        return Vec::new();
    };
    let end = h.days.len() as f64 - 0.5;
    let x = |t: DateTime<Utc>| ((t - midnight).num_seconds() as f64 / 86_400.0 - 0.5).min(end);
    h.states
        .iter()
        // A state that lasts ends, for now, when the history was read.
        .map(|s| {
            let until = s.until.unwrap_or(h.as_of);
            (x(s.from).max(-0.5), x(until), s.state.clone())
        })
        .filter(|(x0, x1, _)| x1 >= x0)
        .collect()
}

fn days_svg(h: &AccountHistory) -> Drawn {
    let n = h.days.len();
    let peak = h.days.iter().map(|d| d.messages).max().unwrap_or(0);
    let ceiling = h.days.iter().filter_map(|d| d.ceiling).max().unwrap_or(0);
    let top = peak.max(ceiling).max(4);
    let top = top + top / 8;
    let Some(first) = h.days.first().map(|d| d.day) else {
        return Err("no days".into());
    };
    let x = XAxis {
        range: -0.5f64..n as f64 - 0.5,
        labels: 7,
        // Days are categories: a label sits under its day's bar.
        label: &|x| {
            (first + chrono::Duration::days(x.round() as i64))
                .format("%b %-d")
                .to_string()
        },
    };
    chart_svg(x, f64::from(top), 48, None, |chart| {
        // Time outside `connected`, shaded behind the bars.
        chart.draw_series(bands(h).into_iter().map(|(x0, x1, _)| {
            // At least an hour wide, so a brief stretch still shows.
            let x1 = x1.max(x0 + 1.0 / 24.0);
            Rectangle::new([(x0, 0.0), (x1, f64::from(top))], WINDOW.mix(0.15).filled())
        }))?;
        chart.draw_series(h.days.iter().enumerate().map(|(i, d)| {
            let x = i as f64;
            Rectangle::new(
                [(x - 0.35, 0.0), (x + 0.35, f64::from(d.messages))],
                SENT.filled(),
            )
        }))?;
        // The ceiling, day by day: a level step over each day that has one.
        for (i, d) in h.days.iter().enumerate() {
            if let Some(c) = d.ceiling {
                let (x, y) = (i as f64, f64::from(c));
                chart.draw_series(LineSeries::new(
                    [(x - 0.5, y), (x + 0.5, y)],
                    LIMIT.stroke_width(2),
                ))?;
            }
        }
        if let Some(at) = h.incident_at {
            let day = at.with_timezone(&h.timezone.tz()).date_naive();
            let x = (day - first).num_days() as f64;
            if (0.0..n as f64).contains(&x) {
                chart.draw_series(LineSeries::new(
                    [(x, 0.0), (x, f64::from(top))],
                    WINDOW.stroke_width(2),
                ))?;
            }
        }
        Ok(())
    })
}

/// Colours for accounts, one each (the console's accent, focus, warn,
/// then neutral tones); accounts past these share the last.
const ACCOUNTS: [RGBColor; 6] = [
    SENT,
    REACHED,
    WINDOW,
    RGBColor(0x6e, 0x40, 0xc9),
    RGBColor(0x0a, 0x7e, 0xa4),
    MUTED,
];

/// What will send in the next 24 hours: for each hour, the groups its
/// fires name, stacked by account.
pub fn upcoming_chart(u: &Upcoming, tz: &TimeZone) -> Markup {
    if u.fires.is_empty() {
        return html! { p.hint #upcoming-chart { "Nothing fires in the next 24 hours." } };
    }
    let hours = hourly(u);
    let accounts = accounts_by_groups(u);
    let groups: u32 = u.fires.iter().map(|f| f.groups).sum();
    let (busiest, most) = hours
        .iter()
        .enumerate()
        .map(|(h, by)| (h, by.values().sum::<u32>()))
        .max_by_key(|(h, n)| (*n, std::cmp::Reverse(*h)))
        .unwrap_or((0, 0));
    let mut caption = format!(
        "The next 24 hours ({}): {} naming {} on {}",
        tz.name(),
        plural(u.fires.len(), "fire"),
        plural(groups as usize, "group"),
        plural(accounts.len(), "account"),
    );
    if most > 0 {
        caption.push_str(&format!(
            "; the busiest hour starts {} with {most} groups",
            clock(hour_start(u, busiest), tz)
        ));
    }
    if u.fires.iter().any(|f| f.selects) {
        caption.push_str("; groups a selector picks when the run starts are not counted");
    }
    caption.push('.');
    html! {
        div.charts #upcoming-chart {
            (figure("chart-upcoming", upcoming_svg(u, &hours, &accounts, tz), &caption))
        }
    }
}

/// "1 account", "3 accounts", "2 stretches".
fn plural(n: usize, word: &str) -> String {
    match n {
        1 => format!("1 {word}"),
        _ if word.ends_with("ch") => format!("{n} {word}es"),
        _ => format!("{n} {word}s"),
    }
}

/// The hour (from `u.from`'s hour) each index stands for.
fn hour_start(u: &Upcoming, h: usize) -> DateTime<Utc> {
    use chrono::DurationRound;
    u.from
        .duration_trunc(chrono::Duration::hours(1))
        .expect("an hour divides any time")
        + chrono::Duration::hours(h as i64)
}

/// Groups per hour (25 buckets: the current hour and the next 24), by account.
fn hourly(u: &Upcoming) -> Vec<std::collections::BTreeMap<&str, u32>> {
    let mut hours = vec![std::collections::BTreeMap::new(); 25];
    let start = hour_start(u, 0);
    for f in &u.fires {
        let h = ((f.at - start).num_minutes() / 60).clamp(0, 24) as usize;
        *hours[h].entry(f.account_id.as_str()).or_insert(0) += f.groups;
    }
    hours
}

/// Accounts, most groups first (they get the first colours).
fn accounts_by_groups(u: &Upcoming) -> Vec<&str> {
    let mut totals: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
    for f in &u.fires {
        *totals.entry(f.account_id.as_str()).or_insert(0) += f.groups;
    }
    let mut accounts: Vec<(&str, u32)> = totals.into_iter().collect();
    accounts.sort_by_key(|(a, n)| (std::cmp::Reverse(*n), *a));
    accounts.into_iter().map(|(a, _)| a).collect()
}

fn upcoming_svg(
    u: &Upcoming,
    hours: &[std::collections::BTreeMap<&str, u32>],
    accounts: &[&str],
    tz: &TimeZone,
) -> Drawn {
    let top = hours
        .iter()
        .map(|by| by.values().sum::<u32>())
        .max()
        .unwrap_or(0)
        .max(4);
    let top = top + top / 8;
    let colour = |a: &str| {
        let i = accounts.iter().position(|x| *x == a).unwrap_or(0);
        ACCOUNTS[i.min(ACCOUNTS.len() - 1)]
    };
    let x = XAxis {
        range: 0f64..hours.len() as f64,
        labels: 9,
        label: &|x| clock(hour_start(u, *x as usize), tz),
    };
    let legend = Some(SeriesLabelPosition::UpperRight);
    chart_svg(x, f64::from(top), 48, legend, |chart| {
        for a in accounts.iter().take(ACCOUNTS.len()) {
            // Each account's share of an hour sits on the accounts before it.
            let bars: Vec<Rectangle<(f64, f64)>> = hours
                .iter()
                .enumerate()
                .filter_map(|(h, by)| {
                    let own = *by.get(a)?;
                    let below: u32 = accounts
                        .iter()
                        .take_while(|x| *x != a)
                        .filter_map(|x| by.get(x))
                        .sum();
                    let x = h as f64;
                    Some(Rectangle::new(
                        [
                            (x + 0.15, f64::from(below)),
                            (x + 0.85, f64::from(below + own)),
                        ],
                        colour(a).filled(),
                    ))
                })
                .collect();
            let c = colour(a);
            chart
                .draw_series(bars)?
                .label(a.to_string())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::timeline::{MinuteSends, ReachPoint};
    use chrono::TimeZone as _;

    /// The SVG's bars (filled in the sent colour) and the limit line's
    /// height, in the drawing's pixels (y grows downwards).
    pub(crate) fn bars_and_limit(svg: &str) -> (Vec<f64>, f64) {
        let attr = |el: &str, name: &str| -> Option<String> {
            let key = format!(" {name}=\"");
            let at = el.find(&key)? + key.len();
            Some(el[at..at + el[at..].find('"')?].to_owned())
        };
        let hex = |c: RGBColor| format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
        let mut bars = Vec::new();
        let mut limit = None;
        for el in svg.split('<') {
            if el.starts_with("rect ") && attr(el, "fill").as_deref() == Some(hex(SENT).as_str()) {
                bars.push(attr(el, "y").unwrap().parse().unwrap());
            }
            if el.starts_with("polyline ")
                && attr(el, "stroke").as_deref() == Some(hex(LIMIT).as_str())
            {
                let points = attr(el, "points").unwrap();
                let ys: Vec<f64> = points
                    .split_whitespace()
                    .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
                    .collect();
                assert!(ys.windows(2).all(|w| w[0] == w[1]), "a level line");
                limit = Some(ys[0]);
            }
        }
        (bars, limit.expect("a limit line"))
    }

    fn timeline(per_minute: &[u32], limit: u32) -> RunTimeline {
        let first = Utc.with_ymd_and_hms(2026, 11, 23, 1, 0, 0).unwrap();
        let minutes: Vec<MinuteSends> = per_minute
            .iter()
            .enumerate()
            .map(|(i, &m)| MinuteSends {
                minute: first + chrono::Duration::minutes(i as i64),
                messages: m,
                groups: m,
            })
            .collect();
        let sent: u32 = per_minute.iter().sum();
        RunTimeline {
            run_id: herald_actors::domain::RunId(1),
            max_per_minute: limit,
            window_end_at: Some(first + chrono::Duration::minutes(per_minute.len() as i64)),
            reach: vec![ReachPoint {
                at: first + chrono::Duration::minutes(per_minute.len() as i64),
                sent,
                reached: sent / 2,
                read: 1,
            }],
            minutes,
            groups: sent,
            groups_read: 1,
            amendment: None,
        }
    }

    #[test]
    fn a_bar_at_the_limit_meets_the_line_and_none_crosses_it() {
        let tz = TimeZone::parse("Asia/Kuala_Lumpur").unwrap();
        let t = timeline(&[20, 20, 7, 0, 20, 13], 20);
        let svg = pace_svg(&t, &tz).unwrap();
        let (bars, limit) = bars_and_limit(&svg);
        assert_eq!(bars.len(), 6, "one bar a minute, empty ones too");
        assert!(
            bars.iter().all(|y| *y >= limit - 0.5),
            "{bars:?} above {limit}"
        );
        // Full minutes reach the line: the drawing is to scale.
        assert!((bars[0] - limit).abs() <= 1.0, "{} vs {limit}", bars[0]);
        // A minute over the limit would be drawn over the line: the check
        // above can fail.
        let over = pace_svg(&timeline(&[20, 26], 20), &tz).unwrap();
        let (bars, limit) = bars_and_limit(&over);
        assert!(bars[1] < limit - 1.0, "{bars:?} vs {limit}");
        // Times in the run's zone: 01:00 UTC is 09:00 in Kuala Lumpur.
        assert!(svg.contains(">\n09:00\n<"), "{svg}");
    }

    #[test]
    fn an_accounts_days_stay_under_their_ceiling_steps() {
        use crate::service::history::DaySends;
        let first = chrono::NaiveDate::from_ymd_opt(2026, 11, 1).unwrap();
        let days: Vec<DaySends> = (0..30)
            .map(|i| DaySends {
                day: first + chrono::Duration::days(i),
                messages: if i < 5 { 20 } else { 40 + i as u32 },
                ceiling: Some(if i < 5 { 20 } else { 100 }),
                ceiling_by: Some(if i < 5 { "warmup" } else { "daily_cap" }.into()),
            })
            .collect();
        let h = AccountHistory {
            account_id: herald_actors::domain::AccountId::parse("a").unwrap(),
            timezone: TimeZone::parse("UTC").unwrap(),
            days,
            incident_at: None,
            states: vec![crate::service::history::StateSpan {
                state: "cooling_down".into(),
                reason: Some("rate limited".into()),
                from: Utc.with_ymd_and_hms(2026, 11, 10, 12, 0, 0).unwrap(),
                until: Some(Utc.with_ymd_and_hms(2026, 11, 11, 0, 0, 0).unwrap()),
            }],
            as_of: Utc.with_ymd_and_hms(2026, 11, 30, 10, 45, 0).unwrap(),
        };
        let svg = days_svg(&h).unwrap();
        assert_eq!(bands(&h).len(), 1);
        let (x0, x1, _) = &bands(&h)[0];
        // Noon of day 9 to the midnight after it: the right half of its slot.
        assert!(
            (x0 - 9.0).abs() < 1e-9 && (x1 - 9.5).abs() < 1e-9,
            "{x0} {x1}"
        );
        let bars = svg.matches(r##"fill="#0B6E4F""##).count();
        assert_eq!(bars, 30, "a bar a day");
        let html = account_chart(&h).into_string();
        assert!(
            html.contains("today's ceiling is its daily cap of 100"),
            "{html}"
        );
        assert!(html.contains("at most 69 on Nov 30"), "{html}");
        assert!(
            html.contains("not connected for 12 hours in 1 stretch (shaded: cooling down)"),
            "{html}"
        );
        // A state that lasts is drawn up to when the history was read, not
        // to the end of today.
        let mut lasting = h.clone();
        lasting.states.push(crate::service::history::StateSpan {
            state: "cooling_down".into(),
            reason: None,
            from: Utc.with_ymd_and_hms(2026, 11, 30, 10, 0, 0).unwrap(),
            until: None,
        });
        let (x0, x1, _) = bands(&lasting)[1].clone();
        assert!((x1 - x0 - 45.0 / 1440.0).abs() < 1e-9, "{x0} {x1}");
        let html = account_chart(&lasting).into_string();
        assert!(
            html.contains("not connected for 12 hours 45 minutes in 2 stretches"),
            "{html}"
        );
        assert_eq!(plural(2, "stretch"), "2 stretches");
        assert_eq!(plural(2, "account"), "2 accounts");
    }

    #[test]
    fn the_next_day_stacks_each_hours_groups_by_account() {
        use crate::service::upcoming::Fire;
        let from = Utc.with_ymd_and_hms(2026, 11, 23, 0, 20, 0).unwrap();
        let fire = |h: i64, account: &str, groups: u32| Fire {
            at: from + chrono::Duration::hours(h),
            reminder_id: 1,
            title: "t".into(),
            account_id: herald_actors::domain::AccountId::parse(account).unwrap(),
            groups,
            selects: false,
        };
        let u = Upcoming {
            from,
            until: from + chrono::Duration::hours(24),
            fires: vec![
                fire(0, "b", 10),
                fire(0, "a", 30),
                fire(3, "a", 30),
                fire(23, "b", 5),
            ],
        };
        let hours = hourly(&u);
        assert_eq!(hours.len(), 25);
        assert_eq!(hours[0].values().sum::<u32>(), 40);
        assert_eq!(hours[23]["b"], 5);
        assert_eq!(accounts_by_groups(&u), ["a", "b"], "most groups first");
        let tz = TimeZone::parse("UTC").unwrap();
        let html = upcoming_chart(&u, &tz).into_string();
        assert!(
            html.contains("4 fires naming 75 groups on 2 accounts"),
            "{html}"
        );
        assert!(
            html.contains("the busiest hour starts 00:00 with 40 groups"),
            "{html}"
        );
        // Account a's bars in the first colour, b's in the second, stacked.
        assert_eq!(
            html.matches(r##"fill="#0B6E4F""##).count(),
            2 + 1,
            "a's two bars and its legend"
        );
        assert_eq!(html.matches(r##"fill="#1F6FEB""##).count(), 2 + 1);
        let empty = Upcoming { fires: vec![], ..u };
        assert!(upcoming_chart(&empty, &tz)
            .into_string()
            .contains("Nothing fires"));
    }

    #[test]
    fn a_recall_is_drawn_with_what_it_settled_in_words() {
        let tz = TimeZone::parse("UTC").unwrap();
        let start = Utc.with_ymd_and_hms(2026, 11, 23, 10, 12, 0).unwrap();
        let a = AmendTimeline {
            kind: "recall".into(),
            requested_at: start,
            total: 40,
            points: vec![AmendPoint {
                at: start + chrono::Duration::minutes(2),
                done: 38,
                settled: 40,
            }],
        };
        assert_eq!(
            amend_caption(&a, &tz),
            "Recall requested at 10:12: by 10:14, 38 of 40 groups recalled, 2 too old or refused."
        );
        let mut t = timeline(&[3, 5], 20);
        t.amendment = Some(a);
        let html = run_charts(&t, &tz).into_string();
        assert!(html.contains(r#"<svg role="img" aria-labelledby="chart-amend-caption""#));
    }

    #[test]
    fn each_figure_is_an_image_named_by_its_caption() {
        let tz = TimeZone::parse("UTC").unwrap();
        let html = run_charts(&timeline(&[3, 5], 20), &tz).into_string();
        assert!(html.contains(r#"<svg role="img" aria-labelledby="chart-pace-caption""#));
        assert!(html.contains(r#"<svg role="img" aria-labelledby="chart-reach-caption""#));
        assert!(
            html.contains("8 in 2 minutes, at most 5 in any minute"),
            "{html}"
        );
        assert!(html.contains("against the account's limit of 20 a minute"));
        assert!(html.contains("4 of 8 groups sent") || html.contains("8 of 8 groups sent"));
        let none = run_charts(&timeline(&[], 20), &tz).into_string();
        assert!(none.contains("once the first group is sent"));
    }
}
