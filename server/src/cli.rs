//! The `oscontent-server` command line.

use crate::http::{AppState, HttpConfig};
use crate::images::{self, announce, ImagePublisher};
use crate::publish::{self, PublishRequest, Source, StateDir};
use crate::signing::{self, SignatureOptions, SignatureWatch};
use crate::source::{self, FetchOptions, ImageRef, Platform};
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use oscontent_format::Checksum;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    Serve(ServeArgs),
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
}

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
    /// As for `serve`: the commit to publish.
    #[arg(long, value_name = "CHECKSUM")]
    pub commit: Option<Checksum>,
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

/// Signature handling of `serve`.
#[derive(Debug, Args)]
pub struct SignatureArgs {
    /// A signature bundle made by `oscontent-server sign` (read-only; e.g. a
    /// ConfigMap mount, whose `..data` layout is understood). Its commit
    /// signatures are merged with the source's; its summary.sig is served
    /// only if it signs exactly the summary this server publishes.
    #[arg(long, value_name = "DIR")]
    pub signatures: Option<PathBuf>,
    /// Public keys (armored or binary). Every published commit and the
    /// summary must carry a valid, unexpired, unrevoked signature by one of
    /// them, or the content is not published (the server stays not ready,
    /// or keeps serving what it verified before).
    #[arg(long, value_name = "FILE")]
    pub trusted_keys: Option<PathBuf>,
    /// Trusted control-plane mode only: sign commits and the summary at
    /// publish time with this secret key (armored TSK). The signatures go
    /// into the state dir, never into the source.
    #[arg(long, value_name = "FILE", conflicts_with = "sign_key_env")]
    pub sign_key: Option<PathBuf>,
    /// As --sign-key, from an environment variable holding the armored key.
    #[arg(long, value_name = "VAR")]
    pub sign_key_env: Option<String>,
    /// How often to look for a changed bundle in --signatures (and a changed
    /// summary in --repo mode) and re-publish.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub signatures_poll: u64,
}

impl SignatureArgs {
    /// Reads the keys now: a bad key file is a startup error, not a
    /// publication that never succeeds.
    pub fn load(&self) -> Result<SignatureOptions> {
        let trusted = self
            .trusted_keys
            .as_deref()
            .map(signing::load_trusted_keys)
            .transpose()?
            .map(std::sync::Arc::new);
        let sign_key = match (&self.sign_key, &self.sign_key_env) {
            (Some(p), _) => Some(signing::load_secret_key_file(p)?),
            (None, Some(v)) => Some(signing::load_secret_key_env(v)?),
            (None, None) => None,
        };
        if let Some(k) = &sign_key {
            tracing::warn!(key = %k.fingerprint(), "signing at publish time with a private key: run this only on trusted (control-plane) nodes");
        }
        if let Some(dir) = &self.signatures {
            signing::bundle_root(dir)?;
        }
        Ok(SignatureOptions {
            bundle_dir: self.signatures.clone(),
            trusted,
            sign_key: sign_key.map(std::sync::Arc::new),
        })
    }
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

#[derive(Debug, Args)]
#[group(id = "source", required = true, multiple = false)]
pub struct SourceArgs {
    /// Root of an unpacked oscontainer image (as an image volume or
    /// `oc image extract` leaves it); its repo is `srv/repo`.
    #[arg(long, value_name = "DIR", group = "source")]
    pub oscontainer: Option<PathBuf>,
    /// A plain archive repo, served as it stands on disk at each request.
    #[arg(long, value_name = "DIR", group = "source")]
    pub repo: Option<PathBuf>,
    /// An oscontainer image to stream, verify and serve:
    /// `docker://HOST[:PORT]/REPO[:TAG|@sha256:DIGEST]`, `oci:DIR[:TAG]` or
    /// `oci-archive:FILE[:TAG]`. Repeat to serve several releases at once.
    #[arg(long, value_name = "REF", group = "source")]
    pub image: Vec<ImageRef>,
    /// An upstream oscontent server to mirror and republish (chained
    /// servers): only new objects are fetched, everything is verified, and
    /// the same summary and signatures are served.
    #[arg(long, value_name = "URL", group = "source")]
    pub upstream: Option<String>,
    /// A bundle (`oscontent-server mirror ... bundle:DIR`) to verify file by
    /// file and serve; a `--repo` holding a bundle is treated the same.
    #[arg(long, value_name = "DIR", group = "source")]
    pub bundle: Option<PathBuf>,
}

/// How `--image` sources are fetched.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Platform to pick from an image index (os/arch[/variant]).
    #[arg(long, default_value = "linux/amd64")]
    pub platform: Platform,
    /// Registry credentials: a containers auth.json or docker config.json
    /// (a pull secret).
    #[arg(long, value_name = "FILE", env = "REGISTRY_AUTH_FILE")]
    pub authfile: Option<PathBuf>,
    /// Extra CA certificates (PEM) to trust for registries, besides the
    /// system ones. Repeatable.
    #[arg(long = "ca", value_name = "FILE")]
    pub ca_files: Vec<PathBuf>,
    /// Talk plain HTTP to this registry (HOST[:PORT]). Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// Mirrors, in containers registries.conf format (`[[registry]]` with
    /// `location` and `[[registry.mirror]]`).
    #[arg(long, value_name = "FILE")]
    pub registries_conf: Option<PathBuf>,
    /// Longest wait between attempts after a failed fetch (backoff doubles
    /// from one second up to this).
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub max_backoff: u64,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// The server's own directory: everything it derives lives here, never
    /// in the served repo. Wiped of stale generations at start.
    #[arg(
        long,
        value_name = "DIR",
        env = "OSCONTENT_STATE_DIR",
        default_value = "/var/lib/oscontent"
    )]
    pub state_dir: PathBuf,
    /// Address to listen on (HTTP/1.1 and HTTP/2 prior knowledge).
    #[arg(long, default_value = "0.0.0.0:8080", env = "OSCONTENT_LISTEN")]
    pub listen: SocketAddr,
    /// Commit to publish; default: the only commit in the repo.
    #[arg(long, value_name = "CHECKSUM")]
    pub commit: Option<Checksum>,
    /// Ref name to publish the commit under (repeatable); default: the
    /// commit's ostree.ref-binding, else `version/<version>`.
    #[arg(long = "ref", value_name = "NAME")]
    pub refs: Vec<String>,
    /// Append one JSON line per request to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub access_log: Option<PathBuf>,
    /// Cache max-age in seconds for summary, summary.sig, refs, config,
    /// detached metadata and deltas. Objects are cached forever.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub metadata_max_age: u64,
    /// Check the --image references for a new digest this often (reading
    /// only their manifests), and publish what moved as a new generation.
    /// 0: only at SIGHUP. SIGHUP also re-publishes --oscontainer and --repo.
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    pub refresh_interval: u64,
    /// With --upstream or --bundle: keep the last N releases (and what the
    /// source publishes now), removing objects nothing kept reaches.
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// After SIGTERM, how long in-flight requests may take before the
    /// server exits anyway.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub shutdown_timeout: u64,
    #[command(flatten)]
    pub signing: SignatureArgs,
}

/// Sets up logging once, on stderr, filtered by `RUST_LOG` (default info).
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Keygen(args) => keygen(args),
        Cmd::Sign(args) => sign(args),
        Cmd::Mirror(args) => mirror(args),
        Cmd::Serve(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let result = rt.block_on(serve(args));
            // A fetch blocked in a read on the blocking pool must not hold
            // the exit past --shutdown-timeout; what it staged is removed
            // at the next start.
            rt.shutdown_timeout(EXIT_GRACE);
            result
        }
    }
}

fn open_access_log(p: &PathBuf) -> Result<Box<dyn Write + Send>> {
    if p.as_os_str() == "-" {
        return Ok(Box::new(std::io::stdout()));
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .with_context(|| format!("opening access log {}", p.display()))?;
    Ok(Box::new(std::io::LineWriter::new(f)))
}

async fn serve(args: ServeArgs) -> Result<()> {
    // Installed first: a SIGTERM that arrives while publishing must still
    // mean a graceful stop, not the default instant death.
    let signals = Signals::install()?;
    let access_log = args.access_log.as_ref().map(open_access_log).transpose()?;
    let sigs = args.signing.load()?;
    let signatures_poll = Duration::from_secs(args.signing.signatures_poll.max(1));
    let state = AppState::new(
        HttpConfig {
            metadata_max_age: Duration::from_secs(args.metadata_max_age),
        },
        access_log,
    );
    // Local sources publish before listening: there is nothing to wait for.
    // Images are fetched in the background while /readyz says not yet.
    let publisher = if let Some(site) = site_source(&args.source) {
        start_site(site, &args, &sigs, &state, &signals).await?
    } else if args.source.image.is_empty() {
        let source = match (args.source.oscontainer, args.source.repo) {
            (Some(d), None) => Source::Oscontainer(d),
            (None, Some(d)) => Source::Repo(d),
            _ => unreachable!("clap enforces exactly one source"),
        };
        let state_dir = Arc::new(StateDir::open(&args.state_dir, &[source.repo_path()])?);
        let req = Arc::new(PublishRequest {
            source,
            commit: args.commit,
            refs: args.refs,
        });
        let mut watch = SignatureWatch::default();
        match publish_local(&req, &state_dir, &sigs).await {
            Ok(generation) => {
                announce(&generation);
                state.publish(generation);
            }
            // Signatures may arrive later (a ConfigMap update): listen, stay
            // not ready, and publish once they verify.
            Err(e) if signing::is_signature_error(&e) => {
                tracing::error!(
                    "{e:#} (not ready until the signatures verify; watching for new signatures)"
                );
                watch.refused(sigs.bundle_dir.as_deref());
            }
            Err(e) => return Err(e),
        }
        tokio::spawn(keep_local_published(
            LocalPublisher {
                req,
                state_dir,
                sigs,
                signatures_poll,
                app: state.clone(),
                hup: signals.hup.clone(),
            },
            watch,
        ))
    } else {
        anyhow::ensure!(
            args.commit.is_none() && args.refs.is_empty(),
            "--commit and --ref apply to --oscontainer and --repo; an image names its commit in its com.coreos.ostree-commit label"
        );
        let state_dir = StateDir::open(&args.state_dir, &[])?;
        let staging = state_dir.path().join(IMAGES_DIR);
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("creating {}", staging.display()))?;
        source::clean_staging(&staging)?;
        let opts = fetch_options(&args.registry);
        let publisher = ImagePublisher {
            images: args.source.image.clone(),
            opts,
            staging,
            state_dir: Arc::new(state_dir),
            app: state.clone(),
            max_backoff: Duration::from_secs(args.registry.max_backoff.max(1)),
            refresh_interval: (args.refresh_interval > 0)
                .then(|| Duration::from_secs(args.refresh_interval)),
            refresh_now: signals.hup.clone(),
            sigs,
            signatures_poll,
        };
        tokio::spawn(publisher.run())
    };

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    // One line on stdout, for scripts and tests that bind port 0.
    println!("listening on http://{addr}");
    std::io::stdout().flush().ok();
    tracing::info!(%addr, "serving");

    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let drain_state = state.clone();
    let timeout = Duration::from_secs(args.shutdown_timeout);
    let server = tokio::spawn(crate::run(listener, state, async move {
        let _ = rx.await;
    }));
    signals.recv().await;
    tracing::info!("shutting down: finishing in-flight requests");
    // A fetch in progress stops at its next read and removes its staging.
    publisher.abort();
    drain_state.start_draining();
    let _ = tx.send(());
    match tokio::time::timeout(timeout, server).await {
        Ok(res) => res.context("server task")?.context("serving")?,
        Err(_) => {
            tracing::warn!("in-flight requests still running after {timeout:?}; exiting anyway")
        }
    }
    Ok(())
}

/// How long exiting waits for blocking work (an image read) to notice
/// cancellation.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// Under the state dir: where images are staged and kept while served.
const IMAGES_DIR: &str = "images";
fn fetch_options(r: &RegistryArgs) -> FetchOptions {
    FetchOptions {
        platform: r.platform.clone(),
        authfile: r.authfile.clone(),
        ca_files: r.ca_files.clone(),
        insecure_registries: r.insecure_registries.clone(),
        registries_conf: r.registries_conf.clone(),
        ..FetchOptions::default()
    }
}

/// Publishes a local source on the blocking pool.
async fn publish_local(
    req: &Arc<PublishRequest>,
    state_dir: &Arc<StateDir>,
    sigs: &SignatureOptions,
) -> Result<crate::served::Generation> {
    let (r, sd, s) = (req.clone(), state_dir.clone(), sigs.clone());
    tokio::task::spawn_blocking(move || publish::publish_signed(&r, &sd, &s))
        .await
        .context("publish task")?
        .with_context(|| format!("publishing {}", req.source.repo_path().display()))
}

/// What republishing a local source needs.
struct LocalPublisher {
    req: Arc<PublishRequest>,
    state_dir: Arc<StateDir>,
    sigs: SignatureOptions,
    signatures_poll: Duration,
    app: AppState,
    hup: Arc<tokio::sync::Notify>,
}

/// Publishes a local source again at each SIGHUP (a remounted image
/// volume, refs added to a repo) and, with signatures, when new ones arrive
/// or the served summary moved. A failure keeps the current generation.
/// Runs until aborted at shutdown.
async fn keep_local_published(p: LocalPublisher, mut watch: SignatureWatch) {
    loop {
        if p.sigs.is_active() {
            tokio::select! {
                _ = tokio::time::sleep(p.signatures_poll) => {
                    let dir = p.sigs.bundle_dir.clone();
                    let current = p.app.current.load_full();
                    let w = watch.clone();
                    let again = tokio::task::spawn_blocking(move || w.should_republish(dir.as_deref(), current.as_deref()))
                        .await
                        .unwrap_or(false);
                    if !again {
                        continue;
                    }
                    tracing::info!("new signatures (or a changed summary); publishing again");
                }
                _ = p.hup.notified() => tracing::info!("SIGHUP: publishing the source again"),
            }
        } else {
            p.hup.notified().await;
            tracing::info!("SIGHUP: publishing the source again");
        }
        match publish_local(&p.req, &p.state_dir, &p.sigs).await {
            Ok(generation) => {
                p.app
                    .metrics
                    .source_checks
                    .with_label_values(&["published"])
                    .inc();
                watch.published();
                announce(&generation);
                p.app.publish(generation);
            }
            Err(e) => {
                p.app
                    .metrics
                    .source_checks
                    .with_label_values(&["failed"])
                    .inc();
                if signing::is_signature_error(&e) {
                    let dir = p.sigs.bundle_dir.clone();
                    let w = watch.clone();
                    watch = tokio::task::spawn_blocking(move || {
                        let mut w = w;
                        w.refused(dir.as_deref());
                        w
                    })
                    .await
                    .unwrap_or_default();
                }
                let serving = if p.app.is_ready() {
                    "still serving the previous generation"
                } else {
                    "not ready"
                };
                tracing::error!("{e:#} ({serving})");
            }
        }
    }
}

fn keygen(args: KeygenArgs) -> Result<()> {
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
fn sign(args: SignArgs) -> Result<()> {
    anyhow::ensure!(
        args.source.upstream.is_none() && args.source.bundle.is_none(),
        "sign --upstream/--bundle: sign where the release is made; a mirror republishes those signatures as they are"
    );
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
    let generation = if args.source.image.is_empty() {
        let source = match (args.source.oscontainer, args.source.repo) {
            (Some(d), None) => Source::Oscontainer(d),
            (None, Some(d)) => Source::Repo(d),
            _ => unreachable!("clap enforces exactly one source"),
        };
        let state_dir = StateDir::open(&state_root, &[source.repo_path()])?;
        let req = PublishRequest {
            source: source.clone(),
            commit: args.commit,
            refs: args.refs,
        };
        publish::publish(&req, &state_dir)
            .with_context(|| format!("publishing {}", source.repo_path().display()))?
    } else {
        anyhow::ensure!(
            args.commit.is_none() && args.refs.is_empty(),
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
            &fetch_options(&args.registry),
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

/// SIGTERM and SIGINT, both meaning "drain and exit"; SIGHUP, meaning
/// "check the source now", is forwarded to `hup` for as long as the
/// process runs.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: Arc<tokio::sync::Notify>,
}

impl Signals {
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        let hup = Arc::new(tokio::sync::Notify::new());
        let notify = hup.clone();
        tokio::spawn(async move {
            while sighup.recv().await.is_some() {
                // notify_one stores a permit: a SIGHUP during a fetch is not lost.
                notify.notify_one();
            }
        });
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            hup,
        })
    }

    async fn recv(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// The site source, if serving one: `--upstream`, `--bundle`, or a
/// `--repo` that holds a bundle.
fn site_source(s: &SourceArgs) -> Option<crate::mirror::upstream::SiteSource> {
    use crate::mirror::{bundle, upstream::SiteSource};
    match (&s.upstream, &s.bundle, &s.repo) {
        (Some(u), _, _) => Some(SiteSource::Upstream(u.clone())),
        (_, Some(b), _) => Some(SiteSource::Bundle(b.clone())),
        (_, _, Some(r)) if bundle::is_bundle(r) => {
            tracing::info!(repo = %r.display(), "the repo is a bundle: verifying it as --bundle would");
            Some(SiteSource::Bundle(r.clone()))
        }
        _ => None,
    }
}

/// Starts serving a site source: a bundle is verified and published before
/// the server listens (a refused bundle stops it with the reason); an
/// upstream is fetched in the background while `/readyz` says not yet.
async fn start_site(
    site: crate::mirror::upstream::SiteSource,
    args: &ServeArgs,
    sigs: &SignatureOptions,
    state: &AppState,
    signals: &Signals,
) -> Result<tokio::task::JoinHandle<()>> {
    use crate::mirror::{sync::SyncOptions, upstream};
    anyhow::ensure!(
        args.commit.is_none() && args.refs.is_empty(),
        "--commit and --ref do not apply to --upstream and --bundle: the source's own refs and summary are served"
    );
    anyhow::ensure!(args.keep != Some(0), "--keep 0 would keep nothing");
    anyhow::ensure!(
        sigs.bundle_dir.is_none() && sigs.sign_key.is_none(),
        "--signatures and --sign-key do not apply to --upstream and --bundle: the source's own signatures are republished as they are (verify them with --trusted-keys)"
    );
    let state_dir = StateDir::open(&args.state_dir, &[])?;
    let is_bundle = matches!(site, upstream::SiteSource::Bundle(_));
    let mirror = upstream::SiteMirror::open(
        site,
        state_dir.path(),
        SyncOptions {
            trusted: sigs.trusted.clone(),
            ..SyncOptions::default()
        },
        args.keep,
        None,
    )?;
    let publisher = upstream::SitePublisher {
        mirror: Arc::new(mirror),
        app: state.clone(),
        max_backoff: Duration::from_secs(args.registry.max_backoff.max(1)),
        refresh_interval: (args.refresh_interval > 0)
            .then(|| Duration::from_secs(args.refresh_interval)),
        refresh_now: signals.hup.clone(),
    };
    let mut current = None;
    if is_bundle {
        publisher.refresh_once(&mut current).await?;
    }
    Ok(tokio::spawn(publisher.run(current)))
}

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

fn mirror(args: MirrorArgs) -> Result<()> {
    let opts = crate::mirror::MirrorOptions {
        fetch: FetchOptions {
            platform: args.registry.platform.clone(),
            authfile: args.registry.authfile.clone(),
            ca_files: args.registry.ca_files.clone(),
            insecure_registries: args.registry.insecure_registries.clone(),
            registries_conf: args.registry.registries_conf.clone(),
            ..FetchOptions::default()
        },
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
