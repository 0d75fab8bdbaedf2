//! A poll run's tally two ways, to compare: per group with a vote, per
//! option, the voters choosing it, from Herald's answer
//! (`GET /v1/runs/{id}/poll`) and from the fake WhatsApp server's record
//! of each member's latest vote.

use herald_fake_whatsapp::FakeWhatsApp;
use serde_json::Value;
use std::collections::BTreeMap;

pub type Tally = BTreeMap<String, Vec<u64>>;

/// From Herald's answer to `GET /v1/runs/{id}/poll`.
pub fn of_answer(answer: &Value) -> Tally {
    answer["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["voters"].as_u64() > Some(0))
        .map(|g| {
            let votes = g["options"].as_array().unwrap();
            let votes = votes.iter().map(|o| o["votes"].as_u64().unwrap()).collect();
            (g["group"].as_str().unwrap().to_owned(), votes)
        })
        .collect()
}

/// From the fake's record of the members' latest votes.
pub fn of_record(fake: &FakeWhatsApp, options: &[&str]) -> Tally {
    let mut out = Tally::new();
    for v in fake.votes() {
        let counts = out
            .entry(v.group.clone())
            .or_insert_with(|| vec![0; options.len()]);
        for (i, o) in options.iter().enumerate() {
            counts[i] += u64::from(v.options.iter().any(|c| c == o));
        }
    }
    out.retain(|_, c| c.iter().any(|n| *n > 0));
    out
}
