//! `import`: what a node runs today, ostree-ext's
//! `container::store::ImageImporter` into a bare-user repo. Over an earlier
//! import it fetches only the layers whose digests it has not stored, and
//! says which.

use crate::{imgref, open_repo};
use anyhow::Context;
use ostree_ext::container::store::{ImageImporter, PrepareResult};
use ostree_ext::containers_image_proxy::ImageProxyConfig;
use ostree_ext::ostree::{Repo, RepoMode};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The node's repo (bare-user; created if it does not exist).
    #[arg(long)]
    repo: PathBuf,
    /// The image: `docker://HOST/REPO:TAG`, `oci:DIR:TAG` or `oci-archive:FILE:TAG`.
    image: String,
    /// Talk plain HTTP to the registry, or skip TLS verification (a
    /// loopback test registry).
    #[arg(long)]
    insecure_registry: bool,
}

#[derive(Debug, serde::Serialize)]
struct Output {
    /// The image's ostree commit (the `ostree.commit` label's).
    commit: String,
    /// The commit the importer made over it (the same one when the image
    /// has no derived layers).
    merge_commit: String,
    manifest_digest: String,
    /// Layers in the manifest.
    layers: usize,
    /// The layers this import downloaded (compressed, as the registry serves them).
    fetched: Vec<Layer>,
    /// Their sizes added up.
    fetched_bytes: u64,
}

#[derive(Debug, serde::Serialize)]
struct Layer {
    digest: String,
    size: u64,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let repo = open_or_create(&args.repo)?;
    let image = imgref::parse(&args.image)?;
    let mut config = ImageProxyConfig::default();
    if args.insecure_registry {
        config.insecure_skip_tls_verification = Some(true);
    }
    let mut importer = ImageImporter::new(&repo, &image, config)
        .await
        .with_context(|| format!("opening {}", args.image))?;
    let prepared = match importer.prepare().await.context("preparing the import")? {
        PrepareResult::AlreadyPresent(state) => {
            let out = Output {
                commit: state.base_commit.clone(),
                merge_commit: state.merge_commit.clone(),
                manifest_digest: state.manifest_digest.to_string(),
                layers: state.manifest.layers().len(),
                fetched: Vec::new(),
                fetched_bytes: 0,
            };
            return print(&args.image, &out);
        }
        PrepareResult::Ready(p) => p,
    };
    let fetched: Vec<Layer> = prepared
        .all_layers()
        .filter(|l| l.commit.is_none())
        .map(|l| Layer {
            digest: l.layer().digest().to_string(),
            size: l.layer().size(),
        })
        .collect();
    let layers = prepared.manifest.layers().len();
    let state = importer
        .import(prepared)
        .await
        .with_context(|| format!("importing {}", args.image))?;
    let out = Output {
        commit: state.base_commit.clone(),
        merge_commit: state.merge_commit.clone(),
        manifest_digest: state.manifest_digest.to_string(),
        layers,
        fetched_bytes: fetched.iter().map(|l| l.size).sum(),
        fetched,
    };
    print(&args.image, &out)
}

fn print(image: &str, out: &Output) -> anyhow::Result<()> {
    eprintln!(
        "imported {image}: commit {}, fetched {} of {} layers ({} bytes)",
        out.commit,
        out.fetched.len(),
        out.layers,
        out.fetched_bytes
    );
    println!("{}", serde_json::to_string(out)?);
    Ok(())
}

fn open_or_create(path: &PathBuf) -> anyhow::Result<Repo> {
    if path.join("config").exists() {
        return open_repo(path);
    }
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    let repo = Repo::new_for_path(path);
    repo.create(RepoMode::BareUser, ostree_ext::gio::Cancellable::NONE)
        .with_context(|| format!("creating a bare-user repo at {}", path.display()))?;
    Ok(repo)
}
