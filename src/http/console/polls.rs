//! A poll run's answer on its page: per poll a bar per option (an SVG drawn
//! here, readable without script, each bar labelled with its votes) and the
//! first groups' counts, from the same service as `GET /v1/runs/{id}/poll`.

use crate::service::polls::RunPollAnswer;
use maud::{html, Markup};

const WIDTH: u32 = 640;
const LABEL: u32 = 220;
const ROW: u32 = 30;

/// The section, or nothing for a run without polls.
pub(super) fn section(answer: &RunPollAnswer) -> Markup {
    if answer.polls.is_empty() {
        return html! {};
    }
    html! {
        section #polls aria-labelledby="polls-title" {
            h2 #polls-title { "Answers" }
            @for p in &answer.polls {
                @let id = format!("poll-{}", p.poll.part);
                @let caption = format!(
                    "{}: {} voters in {} groups ({}). A voter's latest vote counts; a withdrawn one is none.",
                    p.poll.question,
                    p.counts.voters,
                    p.groups_voted,
                    if p.poll.multiple { "several choices each" } else { "one choice each" },
                );
                figure #(id) {
                    (bars(&id, &p.counts.options.iter().map(|o| (o.option.as_str(), o.votes)).collect::<Vec<_>>()))
                    figcaption #{ (id) "-caption" } { (caption) }
                }
            }
            @if let Some(poll) = answer.polls.iter().find(|p| Some(p.poll.part) == answer.part) {
                div.scroll { table #poll-groups {
                    thead { tr {
                        th scope="col" { "#" } th scope="col" { "Group" } th scope="col" { "Voters" }
                        @for o in &poll.poll.options { th scope="col" { (o) } }
                    } }
                    tbody { @for g in &answer.groups { tr {
                        td.num { (g.group.position) }
                        td { (g.group_name.as_deref().unwrap_or(g.group.group.as_str())) }
                        td.num { (g.group.counts.voters) }
                        @for o in &g.group.counts.options { td.num { (o.votes) } }
                    } } }
                } }
                @if answer.next_after.is_some() {
                    p.hint { "The first " (answer.groups.len()) " groups; every group: "
                        code { "herald runs poll " (answer.run_id) " --csv" } }
                }
            }
        }
    }
}

/// One horizontal bar per option, the longest the full width.
fn bars(id: &str, options: &[(&str, u64)]) -> Markup {
    let most = options.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let height = ROW * options.len() as u32;
    let span = WIDTH - LABEL - 60;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" role="img" aria-labelledby={ (id) "-caption" }
            viewBox={ "0 0 " (WIDTH) " " (height) } width=(WIDTH) height=(height) {
            @for (i, (option, votes)) in options.iter().enumerate() {
                @let y = ROW * i as u32;
                @let w = (u64::from(span) * votes / most) as u32;
                text x="0" y=(y + 19) font-size="14" { (option) }
                rect x=(LABEL) y=(y + 5) width=(w.max(1)) height=(ROW - 10) fill="#2b7a78" {}
                text x=(LABEL + w + 6) y=(y + 19) font-size="14" { (votes) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_most_votes_and_label_each_option() {
        let svg = bars("p", &[("Yes", 30), ("No", 15), ("<b>Maybe</b>", 0)]).into_string();
        assert!(
            svg.contains(r#"width="360""#),
            "the most: full width: {svg}"
        );
        assert!(svg.contains(r#"width="180""#), "half of it: {svg}");
        assert!(
            svg.contains(">Yes</text>") && svg.contains(">30</text>"),
            "{svg}"
        );
        assert!(
            svg.contains("&lt;b&gt;Maybe"),
            "an option's text is escaped: {svg}"
        );
    }
}
