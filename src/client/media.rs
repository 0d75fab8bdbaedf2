//! `herald media …`: upload a picture and show what is stored.

use super::conn::Client;
use super::format::{key_values, s, url_encode};
use anyhow::Context;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum MediaCmd {
    /// Upload a picture; prints its id (sha256) for reminders.
    Upload {
        file: PathBuf,
    },
    Show {
        id: String,
    },
}

pub async fn media(c: Client, cmd: MediaCmd) -> anyhow::Result<()> {
    let v = match cmd {
        MediaCmd::Upload { file } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let q: String = url_encode(&name);
            let v = c.upload(&format!("/v1/media?filename={q}"), bytes).await?;
            if !c.json {
                println!("{}", s(&v, "id"));
                eprintln!("{} bytes, {}", s(&v, "size"), s(&v, "mime"));
                return Ok(());
            }
            v
        }
        MediaCmd::Show { id } => c.get(&format!("/v1/media/{id}")).await?,
    };
    c.print(&v, key_values);
    Ok(())
}
