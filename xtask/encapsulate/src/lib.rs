//! The real ostree-native container tooling (ostree-ext 0.15), as release
//! pipelines and nodes run it: `encapsulate` chunks a commit into layers by
//! component, reusing a previous build's packing; `import` is the node's
//! `container::store::ImageImporter` into a bare-user repo.
//!
//! stdout carries one JSON document per command, for xtask and the suites
//! to parse; what a person reads goes to stderr.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

pub mod components;
mod encapsulate;
mod imgref;
mod import;
mod pin;

/// Encapsulate ostree commits into chunked container images, and import
/// them, with ostree-ext.
#[derive(Debug, Parser)]
#[command(name = "oscontent-encapsulate")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Encapsulate REV of REPO into an ostree-native image at DEST
    /// (`oci:DIR:TAG`), one layer per group of components.
    Encapsulate(encapsulate::Args),
    /// Import an ostree-native image into a bare-user repo with ostree-ext's
    /// ImageImporter, as a node does; prints the commit and what was fetched.
    Import(import::Args),
}

/// Runs one command on a tokio runtime (ostree-ext's API is async).
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        match cli.command {
            Command::Encapsulate(args) => encapsulate::run(args).await,
            Command::Import(args) => import::run(args).await,
        }
    })
}

/// An ostree repo path given on the command line.
pub(crate) fn open_repo(path: &PathBuf) -> anyhow::Result<ostree_ext::ostree::Repo> {
    use anyhow::Context;
    let repo = ostree_ext::ostree::Repo::new_for_path(path);
    repo.open(ostree_ext::gio::Cancellable::NONE)
        .with_context(|| format!("opening ostree repo {}", path.display()))?;
    Ok(repo)
}
