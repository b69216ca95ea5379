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
    /// Install the Debian packages the project needs (as root), or say which.
    Deps,
    /// Formatting and clippy lints.
    Check,
    /// Every check and test, as CI runs them: deps, check, build, fixtures, tests.
    Test,
    /// Build demo oscontainers, serve v1 then v2, update a fresh node repo
    /// with stock `ostree pull`, and print what it fetched against the image.
    Demo(DemoArgs),
}

#[derive(Args)]
struct DemoArgs {
    /// Fixture scale for the demo images.
    #[arg(long, value_enum, default_value_t = Scale::Small)]
    scale: Scale,
    /// Share of v1's regular files that v2 rewrites.
    #[arg(long, default_value_t = fixtures::DEFAULT_UPDATE_SHARE)]
    share: f64,
    /// Keep serving v2 after the update, until Ctrl-C.
    #[arg(long)]
    keep_serving: bool,
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
        Cmd::Deps => xtask::deps::ensure()?,
        Cmd::Check => xtask::testrun::check()?,
        Cmd::Test => xtask::testrun::test()?,
        Cmd::Demo(a) => xtask::demo::demo(&xtask::demo::DemoOptions {
            scale: a.scale,
            share: a.share,
            keep_serving: a.keep_serving,
        })?,
    }
    Ok(())
}
