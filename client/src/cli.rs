//! The `oscontent` command line. Grows a `pull` in the client issue; for
//! now it can inspect a remote.

use crate::format::{parse_summary, Summary};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// Node-side client for oscontent servers.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// List the refs a remote publishes, from its summary.
    LsRemote {
        /// Base URL of the remote (an oscontent server or any archive repo).
        #[arg(long)]
        url: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Sets up logging once: `RUST_LOG` filters, stderr output.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::LsRemote { url, json } => ls_remote(&url, json),
    }
}

fn fetch_summary(url: &str) -> Result<Summary> {
    let u = format!("{}/summary", url.trim_end_matches('/'));
    let resp = reqwest::blocking::get(&u).with_context(|| format!("fetching {u}"))?;
    let status = resp.status();
    anyhow::ensure!(status.is_success(), "fetching {u}: HTTP {status}");
    let bytes = resp.bytes().with_context(|| format!("reading {u}"))?;
    parse_summary(&bytes).with_context(|| format!("parsing {u}"))
}

fn ls_remote(url: &str, json: bool) -> Result<()> {
    let s = fetch_summary(url)?;
    if json {
        let refs: Vec<_> = s
            .refs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "ref": r.name, "commit": r.commit.to_hex(), "commit_size": r.commit_size,
                    "timestamp": r.timestamp, "version": r.version,
                })
            })
            .collect();
        let deltas: Vec<_> = s.deltas.iter().map(|d| d.name.summary_name()).collect();
        let out =
            serde_json::json!({ "refs": refs, "deltas": deltas, "last_modified": s.last_modified });
        println!("{out}");
    } else {
        for r in &s.refs {
            println!(
                "{}\t{}\t{}",
                r.name,
                r.commit,
                r.version.as_deref().unwrap_or("-")
            );
        }
    }
    Ok(())
}
