//! `herald`: the daemon (`herald serve`) and its command-line client.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = herald::cli::Cli::parse();
    herald::cli::run(cli)
}
