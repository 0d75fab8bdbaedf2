//! `herald bench x25519`: the X25519 agreement a first send to a large
//! group runs four or five times per member device, by whatsapp-rust's own
//! ladder and by graviola (what the gateway installs where the CPU runs
//! it), on the same random keys; every answer of the two is compared.

use crate::gateway::whatsapp::crypto::{Agreement, Provider};
use std::time::Instant;

type Keys = [([u8; 32], [u8; 32])];

/// Microseconds per agreement over `keys`, and the answers.
fn timed(
    keys: &Keys,
    agree: impl Fn(&[u8; 32], &[u8; 32]) -> anyhow::Result<[u8; 32]>,
) -> anyhow::Result<(f64, Vec<[u8; 32]>)> {
    let started = Instant::now();
    let out = keys
        .iter()
        .map(|(private, public)| agree(private, public))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((
        started.elapsed().as_secs_f64() * 1e6 / keys.len() as f64,
        out,
    ))
}

pub fn run(agreements: usize) -> anyhow::Result<String> {
    anyhow::ensure!(agreements >= 1, "--agreements: must be at least 1");
    let keys: Vec<([u8; 32], [u8; 32])> = (0..agreements)
        .map(|_| (rand::random(), rand::random()))
        .collect();
    let (portable_us, portable) = timed(&keys, |k, p| Ok(Provider::portable(k, p)?))?;
    let (graviola_us, speedup) = if Agreement::detect() == Agreement::Graviola {
        let (us, answers) = timed(&keys, |k, p| match Provider::graviola(k, p) {
            Some(answer) => Ok(answer?),
            None => anyhow::bail!("graviola was detected, then not"),
        })?;
        let differ = answers
            .iter()
            .zip(&portable)
            .filter(|(a, b)| a != b)
            .count();
        anyhow::ensure!(
            differ == 0,
            "graviola and whatsapp-rust's ladder disagree on {differ} of {agreements} agreements"
        );
        (format!("{us:.2}"), format!("{:.2}", portable_us / us))
    } else {
        ("n/a".to_owned(), "n/a".to_owned())
    };
    Ok(format!(
        "x25519: detected={} agreements={agreements} portable_us={portable_us:.2} graviola_us={graviola_us} speedup={speedup} differ=0",
        Agreement::detect().name(),
    ))
}
