//! `encapsulate`: a commit into an ostree-native image with ostree-ext's
//! `container::encapsulate`, chunked by component as rpm-ostree does, and
//! with a prior build's packing kept (`--prior-build`), as release
//! pipelines do so that unchanged packages keep their layers.

use crate::{components, imgref, open_repo};
use anyhow::{ensure, Context};
use ostree_ext::chunking::ObjectMetaSized;
use ostree_ext::container::{encapsulate, fetch_manifest, Config, ExportOpts};
use ostree_ext::glib::Variant;
use ostree_ext::ostree::{ObjectType, Repo};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::path::PathBuf;

/// libostree refuses deeper trees (OSTREE_MAX_RECURSION).
const MAX_DEPTH: usize = 256;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ostree repo holding the commit.
    #[arg(long)]
    repo: PathBuf,
    /// The commit (checksum or ref) to encapsulate.
    #[arg(long)]
    rev: String,
    /// Where to write the image: `oci:DIR:TAG`.
    #[arg(long)]
    dest: String,
    /// The component map (JSON: `{"components": [{"name", "version",
    /// "change_time_offset", "change_frequency", "paths"}]}`); without it
    /// the image has one layer.
    #[arg(long)]
    components: Option<PathBuf>,
    /// An image label, KEY=VALUE (repeatable), besides the ones
    /// ostree-ext sets (`ostree.commit`, `ostree.final-diffid`, version).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// The previous build (`oci:DIR:TAG` or `docker://...`), whose packing
    /// of components into layers is kept.
    #[arg(long)]
    prior_build: Option<String>,
    /// At most this many layers (ostree-ext's default: 64).
    #[arg(long)]
    max_layers: Option<NonZeroU32>,
    /// The image's `created` time (RFC 3339); by default the commit's.
    #[arg(long)]
    created: Option<String>,
}

#[derive(Debug, serde::Serialize)]
struct Output {
    /// The manifest digest written.
    digest: String,
    /// Layers in the manifest, the commit layer included.
    layers: usize,
}

fn parse_label(s: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = s
        .split_once('=')
        .with_context(|| format!("label {s:?} is not KEY=VALUE"))?;
    ensure!(!k.is_empty(), "label {s:?} has an empty key");
    Ok((k.to_owned(), v.to_owned()))
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let repo = open_repo(&args.repo)?;
    let dest = imgref::parse(&args.dest)?;
    ensure!(
        imgref::oci_dir(&dest).is_some(),
        "--dest {}: only oci:DIR:TAG is written (push with skopeo)",
        args.dest
    );
    let commit = repo
        .resolve_rev(&args.rev, false)
        .with_context(|| format!("resolving {}", args.rev))?
        .with_context(|| format!("{} is not in {}", args.rev, args.repo.display()))?
        .to_string();

    let sized = match &args.components {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let map = components::parse(&bytes)
                .with_context(|| format!("component map {}", path.display()))?;
            let files = commit_files(&repo, &commit)?;
            let meta = components::object_meta(&map, &files)?;
            Some(ObjectMetaSized::compute_sizes(&repo, meta).context("sizing components")?)
        }
        None => None,
    };
    let prior = match &args.prior_build {
        Some(r) => Some(
            fetch_manifest(&imgref::parse(r)?)
                .await
                .with_context(|| format!("reading the prior build {r}"))?
                .0,
        ),
        None => None,
    };

    let config = Config {
        labels: Some(args.labels.into_iter().collect()),
        cmd: None,
    };
    let mut opts = ExportOpts::default();
    // Both version labels, as rpm-ostree's builds carry them.
    opts.legacy_version_label = true;
    opts.contentmeta = sized.as_ref();
    opts.prior_build = prior.as_ref();
    opts.max_layers = args.max_layers;
    opts.created = args.created;
    encapsulate(&repo, &commit, &config, Some(opts), &dest.imgref)
        .await
        .with_context(|| format!("encapsulating {commit} into {}", args.dest))?;
    let (dir, tag) = args
        .dest
        .strip_prefix("oci:")
        .and_then(|d| d.rsplit_once(':'))
        .with_context(|| format!("--dest {}: expected oci:DIR:TAG", args.dest))?;
    let digest = crate::pin::pin_history(std::path::Path::new(dir), tag)
        .with_context(|| format!("pinning the history times of {}", args.dest))?;
    // Read back through skopeo: what the importer and registries will see.
    let (manifest, read_digest) = fetch_manifest(&dest)
        .await
        .with_context(|| format!("reading back {}", args.dest))?;
    ensure!(
        read_digest.to_string() == digest,
        "{} reads back as {read_digest}, not the {digest} written",
        args.dest
    );
    let out = Output {
        digest: digest.to_string(),
        layers: manifest.layers().len(),
    };
    eprintln!(
        "encapsulated {commit} into {} ({} layers)",
        args.dest, out.layers
    );
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

/// Every non-directory path of the commit's tree, with its content checksum.
fn commit_files(repo: &Repo, commit: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let v = repo
        .load_variant(ObjectType::Commit, commit)
        .with_context(|| format!("loading commit {commit}"))?;
    let root = hex(&v.child_value(6))?;
    let mut files = BTreeMap::new();
    walk(repo, &root, "", 0, &mut files)?;
    Ok(files)
}

fn walk(
    repo: &Repo,
    tree: &str,
    prefix: &str,
    depth: usize,
    out: &mut BTreeMap<String, String>,
) -> anyhow::Result<()> {
    ensure!(
        depth < MAX_DEPTH,
        "{prefix}: deeper than {MAX_DEPTH} directories"
    );
    let v = repo
        .load_variant(ObjectType::DirTree, tree)
        .with_context(|| format!("loading dirtree {tree} ({prefix}/)"))?;
    let join = |name: &Variant| -> anyhow::Result<String> {
        let name = name.str().context("dirtree entry name is not a string")?;
        Ok(if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        })
    };
    let files = v.child_value(0);
    for i in 0..files.n_children() {
        let f = files.child_value(i);
        out.insert(join(&f.child_value(0))?, hex(&f.child_value(1))?);
    }
    let dirs = v.child_value(1);
    for i in 0..dirs.n_children() {
        let d = dirs.child_value(i);
        let path = join(&d.child_value(0))?;
        walk(repo, &hex(&d.child_value(1))?, &path, depth + 1, out)?;
    }
    Ok(())
}

fn hex(v: &Variant) -> anyhow::Result<String> {
    let bytes = v
        .fixed_array::<u8>()
        .context("checksum is not a byte array")?;
    ensure!(bytes.len() == 32, "checksum of {} bytes", bytes.len());
    Ok(bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }))
}
