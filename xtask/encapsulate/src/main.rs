//! `oscontent-encapsulate`: ostree-ext's encapsulator and importer behind a
//! small command line, for `cargo xtask fixtures` and the cross-checks.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    oscontent_encapsulate::run(oscontent_encapsulate::Cli::parse())
}
