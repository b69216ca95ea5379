//! `mirror SRC DEST`.

use crate::serve::args::RegistryArgs;
use crate::signing;
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;

/// `oscontent-server mirror SRC DEST`.
#[derive(Debug, Args)]
pub struct MirrorArgs {
    /// What to mirror: an image (`docker://...`, `oci:DIR[:TAG]`,
    /// `oci-archive:FILE[:TAG]`) or an upstream oscontent server
    /// (`http(s)://HOST[:PORT]/`).
    #[arg(value_name = "SRC")]
    pub source: crate::mirror::MirrorSource,
    /// Where: `oci:DIR[:TAG]` (a verified OCI layout copy, images only) or
    /// `bundle:DIR` (a self-contained served remote).
    #[arg(value_name = "DEST")]
    pub dest: crate::mirror::MirrorDest,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Verify the summary signature and every published commit's
    /// signatures against these OpenPGP certificates before writing.
    #[arg(long, value_name = "FILE")]
    pub trusted_keys: Option<PathBuf>,
    /// Images into bundles: a signature bundle from `oscontent-server sign`
    /// for this image (its commit signatures and summary.sig are installed
    /// as `serve --signatures` would).
    #[arg(long, value_name = "DIR")]
    pub signatures: Option<PathBuf>,
    /// Bundles: keep the last N releases (and what is published now), and
    /// remove objects nothing kept reaches.
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Objects fetched at once.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub jobs: usize,
    /// Limit the transfer rate (bytes per second; suffixes K, M, G).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub max_rate: Option<u64>,
}

/// `5M` → 5 MiB/s.
fn parse_rate(s: &str) -> std::result::Result<u64, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?}: want a positive number of bytes per second, e.g. 5M"))
}

pub(super) fn mirror(args: MirrorArgs) -> Result<()> {
    let opts = crate::mirror::MirrorOptions {
        fetch: args.registry.fetch_options(),
        trusted: args
            .trusted_keys
            .as_deref()
            .map(signing::load_trusted_keys)
            .transpose()?
            .map(Arc::new),
        signatures: crate::mirror::Signatures {
            bundle_dir: args.signatures.clone(),
        },
        keep: args.keep,
        jobs: args.jobs,
        max_rate: args.max_rate,
    };
    if opts.signatures.bundle_dir.is_some() {
        anyhow::ensure!(
            matches!(
                (&args.source, &args.dest),
                (
                    crate::mirror::MirrorSource::Image(_),
                    crate::mirror::MirrorDest::Bundle(_)
                )
            ),
            "--signatures applies to an image mirrored into a bundle; an upstream server's signatures are copied as they are"
        );
        signing::bundle_root(args.signatures.as_deref().expect("checked"))?;
    }
    let report = crate::mirror::mirror(&args.source, &args.dest, &opts)
        .with_context(|| format!("mirroring {} into {}", args.source, args.dest))?;
    // One JSON line on stdout, for scripts and tests.
    println!(
        "{}",
        serde_json::to_string(&report).context("serializing the report")?
    );
    Ok(())
}
