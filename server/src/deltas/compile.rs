//! The delta compiler's own process (`oscontent-server delta-compile`,
//! hidden): libostree's static delta generation of one pair in a scratch
//! repo, under an address-space ceiling it sets on itself before anything
//! else. libostree's bsdiff never looks at its cancellable and holds
//! several times the changed file in memory, so only a process of its own
//! can be bounded and stopped (`child.rs` starts it, watches its resident
//! memory and kills it).

use anyhow::{Context, Result};
use clap::Args;
use ostree::gio;
use ostree::glib::{self, prelude::ToVariant};
use std::path::PathBuf;

/// The compiler's settings, and why:
/// objects up to 64 MB go into parts rather than being fetched loose
/// (`min-fallback-size`, in MB; libostree's default 4), parts of up to
/// 32 MB (`max-chunk-size`), parts as files beside the superblock (a
/// superblock stays small enough for clients' caps) and bsdiff on.
const MIN_FALLBACK_MB: u32 = 64;
const MAX_CHUNK_MB: u32 = 32;

/// What the server passes its compiler process; not for people.
#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The scratch archive repo holding both commits' closures.
    #[arg(long, value_name = "DIR")]
    pub repo: PathBuf,
    /// The delta's source commit (none: a delta from scratch).
    #[arg(long, value_name = "CHECKSUM")]
    pub from: Option<String>,
    /// The delta's target commit.
    #[arg(long, value_name = "CHECKSUM")]
    pub to: String,
    /// Address space this process may map (RLIMIT_AS), set on itself
    /// first.
    #[arg(long, value_name = "BYTES")]
    pub address_space: u64,
}

/// Runs in the compiler process: limits itself, then compiles.
pub fn run(args: &CompileArgs) -> Result<()> {
    let limit = rustix::process::Rlimit {
        current: Some(args.address_space),
        maximum: Some(args.address_space),
    };
    rustix::process::setrlimit(rustix::process::Resource::As, limit)
        .context("limiting the compiler's address space")?;
    // Ended with the server's thread that waits for it, whatever becomes
    // of the server.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .context("asking to end with the server")?;
    let repo = ostree::Repo::new_for_path(&args.repo);
    repo.open(gio::Cancellable::NONE)
        .with_context(|| format!("opening {}", args.repo.display()))?;
    repo.static_delta_generate(
        ostree::StaticDeltaGenerateOpt::Major,
        args.from.as_deref(),
        &args.to,
        None,
        Some(&params()),
        gio::Cancellable::NONE,
    )
    .context("libostree's delta compiler")
}

/// The options dict of `ostree_repo_static_delta_generate` (`a{sv}`).
fn params() -> glib::Variant {
    let d = glib::VariantDict::new(None);
    d.insert_value("min-fallback-size", &MIN_FALLBACK_MB.to_variant());
    d.insert_value("max-chunk-size", &MAX_CHUNK_MB.to_variant());
    d.insert_value("inline-parts", &false.to_variant());
    d.insert_value("bsdiff-enabled", &true.to_variant());
    d.end()
}
