//! The `oscontent-server` command line: argument types and dispatch.

mod mirror;
mod sign;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use std::io::IsTerminal;

pub use crate::serve::args::{RegistryArgs, ServeArgs, SignatureArgs, SourceArgs};
pub use mirror::MirrorArgs;
pub use sign::{Cipher, KeygenArgs, SecretKeyArgs, SignArgs};

/// Publishes an oscontainer's ostree repo as an ostree remote over HTTP.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "OSCONTENT_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Serve a repo over HTTP until SIGTERM.
    Serve(Box<ServeArgs>),
    /// Make an OpenPGP signing key (v4, which GnuPG 2.2 and stock ostree
    /// accept).
    Keygen(KeygenArgs),
    /// Sign what `serve` would publish for the same sources: each commit
    /// object and the exact summary bytes. Writes a signature bundle for
    /// `serve --signatures`.
    Sign(SignArgs),
    /// Copy a release, verified, into an OCI layout or a bundle (a
    /// self-contained served remote to carry to a disconnected site).
    Mirror(MirrorArgs),
    /// The server's own delta compiler process (internal).
    #[command(hide = true)]
    DeltaCompile(crate::deltas::compile::CompileArgs),
}

/// Sets up logging once, on stderr, filtered by `RUST_LOG` (default info).
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in log files.
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

/// The error that ends the process, said once: a log line for a log
/// collector (`--log-format json`), else `error: ...` for a person.
pub fn report_fatal(format: LogFormat, e: &anyhow::Error) {
    match format {
        LogFormat::Json => tracing::error!("{e:#}"),
        LogFormat::Text => eprintln!("error: {e:#}"),
    }
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Keygen(args) => sign::keygen(args),
        Cmd::Sign(args) => sign::sign(args),
        Cmd::Mirror(args) => mirror::mirror(args),
        Cmd::Serve(args) => crate::serve::run(*args),
        Cmd::DeltaCompile(args) => crate::deltas::compile::run(&args),
    }
}
