//! `keygen` and `sign`.

use crate::images::{self, IMAGES_DIR};
use crate::publish;
use crate::request::PublishRequest;
use crate::serve::args::{derive_commit, RegistryArgs, SourceArgs};
use crate::signing::{self, Named, Signer};
use crate::source::native::root::NativeRoots;
use crate::state::StateDir;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use oscontent_format::Checksum;
use std::collections::BTreeSet;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// User ID of the key, e.g. "OS updates <os@example.com>".
    #[arg(long, value_name = "NAME <EMAIL>")]
    pub uid: String,
    /// Public-key algorithm.
    #[arg(long, value_enum, default_value_t = Cipher::Ed25519)]
    pub cipher: Cipher,
    /// Key lifetime, e.g. 2y, 365d, 12w, or never. An OS-update key that
    /// expires strands nodes that were offline, hence never by default.
    #[arg(long, value_name = "DURATION", default_value = "never")]
    pub expires: String,
    /// Where to write the secret key (armored, mode 0600). Never
    /// overwritten.
    #[arg(long, value_name = "FILE")]
    pub out_secret: PathBuf,
    /// Where to write the public key (armored): for `--trusted-keys` and
    /// `ostree remote add --gpg-import`. Never overwritten.
    #[arg(long, value_name = "FILE")]
    pub out_public: PathBuf,
    /// Also write a revocation certificate here (keep it offline).
    #[arg(long, value_name = "FILE")]
    pub out_revocation: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Cipher {
    Ed25519,
    Rsa3072,
    Rsa4096,
}

impl From<Cipher> for oscontent_format::openpgp::KeyAlgo {
    fn from(c: Cipher) -> Self {
        match c {
            Cipher::Ed25519 => Self::Ed25519,
            Cipher::Rsa3072 => Self::Rsa3072,
            Cipher::Rsa4096 => Self::Rsa4096,
        }
    }
}

/// The secret key, from a file or from the environment.
#[derive(Debug, Args)]
#[group(id = "secret-key", required = true, multiple = false)]
pub struct SecretKeyArgs {
    /// The secret key (armored TSK, no passphrase), as `keygen` writes it.
    #[arg(long, value_name = "FILE", group = "secret-key")]
    pub key: Option<PathBuf>,
    /// Name of an environment variable holding the armored secret key
    /// (e.g. from a Kubernetes Secret).
    #[arg(long, value_name = "VAR", group = "secret-key")]
    pub key_env: Option<String>,
}

#[derive(Debug, Args)]
pub struct SignArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// As for `serve`: the commit to publish, and the commits `sign` may
    /// sign (repeatable, full checksums). Required with --oscontainer and
    /// --repo: only what the operator pinned is signed.
    #[arg(long, value_name = "CHECKSUM")]
    pub commit: Vec<Checksum>,
    /// As for `serve`: ref names to publish (repeatable).
    #[arg(long = "ref", value_name = "NAME")]
    pub refs: Vec<String>,
    #[command(flatten)]
    pub key: SecretKeyArgs,
    /// The bundle directory to create (must not exist, or be empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Scratch space for the publication (and for `--image`, the staged
    /// repos); removed afterwards.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
}

impl SecretKeyArgs {
    fn load(&self) -> Result<oscontent_format::openpgp::Cert> {
        match (&self.key, &self.key_env) {
            (Some(p), _) => signing::load_secret_key_file(p),
            (None, Some(v)) => signing::load_secret_key_env(v),
            (None, None) => unreachable!("clap requires one of --key, --key-env"),
        }
    }
}

pub(super) fn keygen(args: KeygenArgs) -> Result<()> {
    let validity = signing::parse_validity(&args.expires).context("--expires")?;
    let fpr = signing::keygen(&signing::KeygenRequest {
        user_id: args.uid.clone(),
        algo: args.cipher.into(),
        validity,
        out_secret: args.out_secret.clone(),
        out_public: args.out_public.clone(),
        out_revocation: args.out_revocation.clone(),
    })?;
    println!("{}", fpr.to_hex());
    tracing::info!(
        fingerprint = %fpr.to_hex(),
        uid = args.uid,
        secret = %args.out_secret.display(),
        public = %args.out_public.display(),
        "key generated"
    );
    Ok(())
}

/// Publishes the sources into a scratch state dir with the server's own
/// code, signs exactly that, and writes the bundle.
pub(super) fn sign(args: SignArgs) -> Result<()> {
    if args.source.upstream.is_some() || args.source.bundle.is_some() {
        // Sign where the release is made; a mirror republishes that.
        signing::decide(Signer::SignCommand, Named::Site)?;
    }
    let pins: BTreeSet<Checksum> = args.commit.iter().copied().collect();
    if args.source.local().is_some() {
        let named = Named::Local {
            pins: &pins,
            trusted_keys: false,
        };
        signing::decide(Signer::SignCommand, named)?;
    }
    for image in &args.source.image {
        signing::decide(Signer::SignCommand, Named::Image(image))?;
    }
    let tsk = args.key.load()?;
    if let Ok(mut rd) = std::fs::read_dir(&args.out) {
        anyhow::ensure!(
            rd.next().is_none(),
            "--out {} exists and is not empty; refusing to overwrite it",
            args.out.display()
        );
    }
    let work = match &args.work_dir {
        Some(d) => tempfile::Builder::new()
            .prefix("oscontent-sign-")
            .tempdir_in(d),
        None => tempfile::Builder::new().prefix("oscontent-sign-").tempdir(),
    }
    .context("creating a scratch directory")?;
    let state_root = work.path().join("state");
    let generation = if let Some(source) = args.source.local() {
        let state_dir = StateDir::open(&state_root, &[source.repo_path()])?;
        let req = PublishRequest {
            commit: derive_commit(&source, &args.commit, &args.refs)?,
            source: source.clone(),
            refs: args.refs,
        };
        let native = std::sync::Mutex::new(NativeRoots::open(&state_dir)?);
        let sigs = crate::signing::SignatureOptions::default();
        let g = publish::local::publish_local(&req, &state_dir, &sigs, &native, None)
            .with_context(|| format!("publishing {}", source.repo_path().display()))?;
        // A `--repo` whose refs another tool moved names other commits.
        let now = std::time::SystemTime::now();
        signing::refuse_unpinned(&g, Signer::SignCommand, &pins, None, now)?;
        g
    } else {
        anyhow::ensure!(
            args.commit.is_empty() && args.refs.is_empty(),
            "--commit and --ref apply to --oscontainer and --repo; an image names its commit in its com.coreos.ostree-commit label"
        );
        let state_dir = StateDir::open(&state_root, &[])?;
        let staging = work.path().join(IMAGES_DIR);
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("creating {}", staging.display()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let (releases, guards) = rt.block_on(images::stage_once(
            &args.source.image,
            &args.registry.fetch_options(),
            &staging,
        ))?;
        let mut g = publish::publish_releases(&releases, &state_dir)?;
        g.keepalive.extend(guards);
        g
    };
    let bundle = signing::sign_generation(&generation, &tsk)?;
    signing::write_bundle(&bundle, &args.out)?;
    let m = &bundle.manifest;
    for (name, commit) in &m.refs {
        tracing::info!(r#ref = name, commit, "signed");
    }
    tracing::info!(
        signer = m.signer,
        summary_sha256 = m.summary_sha256,
        commits = m.commits.len(),
        out = %args.out.display(),
        "signature bundle written"
    );
    println!("{}", args.out.display());
    Ok(())
}
