//! `cargo xtask <command>`: a thin dispatcher; each command's logic lives in
//! the library so end-to-end tests can call it directly.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use xtask::fixtures::{self, FixtureSpec, Scale};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Fixtures, demo, benchmarks, checks and CI for oscontent"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build (or reuse) the deterministic oscontainer fixtures and print a summary.
    Fixtures(FixturesArgs),
}

#[derive(Args)]
struct FixturesArgs {
    /// Small (tens of MiB, for tests) or full (about 1 GiB, for benchmarks).
    #[arg(long, value_enum, default_value_t = Scale::Small)]
    scale: Scale,
    /// Share of v1's regular files that v2 rewrites.
    #[arg(long, default_value_t = fixtures::DEFAULT_UPDATE_SHARE)]
    share: f64,
    /// Ref bound into every commit.
    #[arg(long = "ref", default_value = fixtures::DEFAULT_REF)]
    ref_name: String,
    /// Where to build [default: target/fixtures/<scale>-<share>, or under $OSCONTENT_FIXTURES_DIR].
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Fixtures(a) => {
            let spec = FixtureSpec {
                update_share: a.share,
                ref_name: a.ref_name,
                ..FixtureSpec::new(a.scale)
            };
            let dir = a.dir.unwrap_or_else(|| fixtures::default_dir(&spec));
            let built = fixtures::ensure(&spec, &dir)?;
            print!("{}", fixtures::summary(&built));
        }
    }
    Ok(())
}
