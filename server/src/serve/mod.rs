//! `oscontent-server serve`: the wiring. A publisher for the source, kept
//! up to date by the refresher, publishes into the sink; the HTTP side
//! serves what the sink holds until SIGTERM.

pub mod args;
mod local;
mod signals;
pub mod socket;
pub mod stage_args;

use crate::http::{AppState, HttpConfig};
use crate::images::{ImagePublisher, IMAGES_DIR};
use crate::mirror::upstream::{SiteMirror, SitePublisher, SiteSource};
use crate::refresh::{Refresher, RollbackGuard, RollbackPolicy, Schedule};
use crate::request::{PublishRequest, Source};
use crate::signing::{self, Named, SignatureOptions, Signer};
use crate::sink::Sink;
use crate::source;
use crate::source::native::root::NativeRoots;
use crate::state::StateDir;
use anyhow::{Context, Result};
use args::{derive_commit, ServeArgs, SourceArgs};
use local::LocalPublisher;
use oscontent_format::Checksum;
use signals::Signals;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How long exiting waits for blocking work (an image read) to notice
/// cancellation.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Serves until SIGTERM, on its own async runtime.
pub fn run(args: ServeArgs) -> Result<()> {
    no_huge_pages();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = rt.block_on(serve(args));
    // A fetch blocked in a read on the blocking pool must not hold the exit
    // past --shutdown-timeout; what it staged is removed at the next start.
    rt.shutdown_timeout(EXIT_GRACE);
    result
}

/// Opts the process out of transparent huge pages. Serving allocates and
/// frees a buffer per object read, and the allocator returns freed pages to
/// the kernel: with huge pages each later fault zeroed 2 MiB, and sparse use
/// of them pushed peak RSS from about 275 to 390-530 MiB over a few replays
/// of one pull (a 128 MiB object cache, a 512 Mi limit in deploy/).
/// `always` is the default of RHEL CoreOS; mimalloc asks for them too.
fn no_huge_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!("PR_SET_THP_DISABLE: {e}");
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    // Installed first: a SIGTERM that arrives while publishing must still
    // mean a graceful stop, not the default instant death.
    let signals = Signals::install()?;
    let access_log = args
        .access_log
        .as_deref()
        .map(open_access_log)
        .transpose()?;
    let sink = Arc::new(Sink::default());
    let limits = listener_limits(&args)?;
    let workers = args.connections.workers();
    let state = AppState::new(
        HttpConfig {
            metadata_max_age: Duration::from_secs(args.metadata_max_age),
            cache_size: args.cache_size,
            max_streamed_files: limits.max_streamed_files,
            body_memory: args.connections.max_body_memory,
            unready_after_refusing: Duration::from_secs(args.connections.unready_after_refusing),
            stage_slots: args.stage.config(),
        },
        sink.clone(),
        access_log,
    )?;
    // Bound before anything is published, so that an address in use fails
    // at once rather than after a whole source was verified; nothing is
    // accepted (or announced) before publication is under way.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let publisher = start_publishing(&args, &sink, &signals).await?;
    // Rounds start at each publication; serving never waits for them.
    let deltas = crate::deltas::DeltaOptions {
        mode: args.deltas,
        state_dir: args.state_dir.clone(),
        timeout: Duration::from_secs(args.delta_timeout.max(1)),
        memory: args.delta_memory as u64,
        exe: std::env::current_exe().context("finding the server's executable")?,
    };
    tokio::spawn(crate::deltas::run(deltas, sink.clone()));
    let addr = listener.local_addr().context("reading the bound address")?;
    // One line on stdout, for scripts and tests that bind port 0 (with
    // `--access-log -` too: the deploy's tests read it there).
    println!("listening on http://{addr}");
    std::io::stdout().flush().ok();
    let timeout = Duration::from_secs(args.shutdown_timeout);
    tracing::info!(%addr, workers, "serving");
    serve_until_stopped(
        listener, workers, state, limits, signals, publisher, timeout,
    )
    .await
}

/// The listener's caps, within the open-file limit (raised first to the
/// hard limit: the usual soft 1,024 is what a few hundred stuck clients
/// exhausted).
fn listener_limits(args: &ServeArgs) -> Result<crate::listen::limits::Limits> {
    use crate::listen::limits;
    let nofile = limits::raise_nofile().context("raising RLIMIT_NOFILE")?;
    let l = limits::fit_to_nofile(args.connections.limits(), nofile);
    crate::served::objects::set_fanout_budget(limits::fanout_fds(nofile));
    tracing::info!(
        nofile,
        max_connections = l.max_connections,
        per_ip = l.max_per_ip,
        per_net = l.max_per_net,
        probe_reserve = l.probe_reserve,
        streamed_files = l.max_streamed_files,
        "connection limits"
    );
    Ok(l)
}

/// Starts the publisher for the source. Local sources and bundles publish
/// before the server listens: there is nothing to wait for. Images and
/// upstreams are fetched in the background while `/readyz` says not yet.
async fn start_publishing(
    args: &ServeArgs,
    sink: &Arc<Sink>,
    signals: &Signals,
) -> Result<JoinHandle<()>> {
    let mut sigs = args.signing.load()?;
    if sigs.sign_key.is_some() {
        // Refused before anything is fetched or signed: what to pin.
        sigs.sign_pins = signing_pins(args, &sigs)?;
    }
    let signatures_poll = Duration::from_secs(args.signing.signatures_poll.max(1));
    let schedule = Schedule {
        interval: (args.refresh_interval > 0).then(|| Duration::from_secs(args.refresh_interval)),
        max_backoff: Some(Duration::from_secs(args.registry.max_backoff.max(1))),
    };
    let hup = signals.hup.clone();
    let rollback = if args.allow_rollback {
        RollbackPolicy::Allow
    } else {
        RollbackPolicy::Refuse
    };
    if let Some(site) = site_source(&args.source) {
        // The site mirror checks for rollbacks itself, before it prunes.
        let publisher = site_publisher(site.clone(), args, &sigs)?;
        let guard = RollbackGuard::load(&args.state_dir, rollback, sink.metrics().clone())?
            .bounding(vouched(sigs.trusted.is_some()), args.max_future_skew);
        let publisher = publisher.checking_rollback(Arc::new(guard));
        let mut refresher = Refresher::new(publisher, sink.clone(), hup, schedule);
        // A refused bundle stops the server with the reason.
        if matches!(site, SiteSource::Bundle(_)) {
            refresher.publish_first().await?;
        }
        return Ok(tokio::spawn(refresher.run()));
    }
    if let Some(source) = args.source.local() {
        let state_dir = Arc::new(StateDir::open(&args.state_dir, &[source.repo_path()])?);
        let native = Arc::new(std::sync::Mutex::new(NativeRoots::open(&state_dir)?));
        // A --repo follows its repo, unless the server signs: then only the
        // operator (SIGHUP) publishes what its writers changed.
        let followed = match (&source, &sigs.sign_key) {
            (Source::Repo(dir), None) => {
                Some(crate::refresh::follow::Follow::new(dir, signatures_poll))
            }
            _ => None,
        };
        let publisher = LocalPublisher {
            req: Arc::new(PublishRequest {
                commit: derive_commit(&source, &args.commit, &args.refs)?,
                source,
                refs: args.refs.clone(),
            }),
            state_dir,
            sigs: sigs.clone(),
            verdicts: Default::default(),
            native,
        };
        // Republished at SIGHUP, when signatures change and when a followed
        // repo changes, never on a timer: a failure waits for the next.
        let schedule = Schedule::default();
        let mut refresher =
            Refresher::new(publisher, sink.clone(), hup, schedule).watching(&sigs, signatures_poll);
        if let Some(f) = followed {
            refresher = refresher.following(f);
        }
        // Signatures may arrive later (a ConfigMap update): then it listens,
        // stays not ready, and publishes once they verify.
        refresher.publish_first().await?;
        return Ok(tokio::spawn(refresher.run()));
    }
    let publisher = image_publisher(args, &sigs, rollback, sink)?;
    let refresher =
        Refresher::new(publisher, sink.clone(), hup, schedule).watching(&sigs, signatures_poll);
    Ok(tokio::spawn(refresher.run()))
}

/// With `--sign-key`: refuses at start whatever the operator did not pin
/// ([`signing::decide`]), and returns what each publication may sign: the
/// `--commit` checksums for a local source (besides commits a
/// `--trusted-keys` signature already covers), `None` for images, each
/// pinned by digest as a whole.
fn signing_pins(
    args: &ServeArgs,
    sigs: &SignatureOptions,
) -> Result<Option<Arc<BTreeSet<Checksum>>>> {
    let key = Signer::SignKey;
    if site_source(&args.source).is_some() {
        signing::decide(key, Named::Site)?;
    }
    if args.source.local().is_some() {
        let pins: BTreeSet<Checksum> = args.commit.iter().copied().collect();
        let trusted_keys = sigs.trusted.is_some();
        signing::decide(
            key,
            Named::Local {
                pins: &pins,
                trusted_keys,
            },
        )?;
        return Ok(Some(Arc::new(pins)));
    }
    for image in &args.source.image {
        signing::decide(key, Named::Image(image))?;
    }
    Ok(None)
}

/// The `--image` publisher, its staging directory emptied and its
/// rollback marks loaded (a corrupt marks file stops the server).
fn image_publisher(
    args: &ServeArgs,
    sigs: &SignatureOptions,
    rollback: RollbackPolicy,
    sink: &Sink,
) -> Result<ImagePublisher> {
    anyhow::ensure!(
        args.commit.is_empty() && args.refs.is_empty(),
        "--commit and --ref apply to --oscontainer and --repo; an image names its commit in its com.coreos.ostree-commit label"
    );
    let state_dir = StateDir::open(&args.state_dir, &[])?;
    let staging = state_dir.path().join(IMAGES_DIR);
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    source::clean_staging(&staging)?;
    // A digest names one manifest, and so one commit, the operator chose.
    let pinned = args.source.image.iter().all(|i| {
        matches!(
            i,
            crate::source::ImageRef::Registry {
                reference: crate::source::Reference::Digest(_),
                ..
            }
        )
    });
    let guard = RollbackGuard::load(state_dir.path(), rollback, sink.metrics().clone())?.bounding(
        vouched(sigs.trusted.is_some() || pinned),
        args.max_future_skew,
    );
    Ok(ImagePublisher::new(
        args.source.image.clone(),
        args.registry.fetch_options(),
        staging,
        Arc::new(state_dir),
        sigs.clone(),
        Arc::new(guard),
    ))
}

/// Whether the releases published are verified (or pinned).
fn vouched(verified: bool) -> oscontent_format::age::Vouched {
    match verified {
        true => oscontent_format::age::Vouched::Verified,
        false => oscontent_format::age::Vouched::Unverified,
    }
}

/// The site source, if serving one: `--upstream`, `--bundle`, or a
/// `--repo` that holds a bundle.
fn site_source(s: &SourceArgs) -> Option<SiteSource> {
    use crate::mirror::bundle;
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

/// The publisher of a site source, its options checked.
fn site_publisher(
    site: SiteSource,
    args: &ServeArgs,
    sigs: &SignatureOptions,
) -> Result<SitePublisher> {
    use crate::mirror::sync::SyncOptions;
    anyhow::ensure!(
        args.commit.is_empty() && args.refs.is_empty(),
        "--commit and --ref do not apply to --upstream and --bundle: the source's own refs and summary are served"
    );
    anyhow::ensure!(args.keep != Some(0), "--keep 0 would keep nothing");
    anyhow::ensure!(
        sigs.bundle_dir.is_none() && sigs.sign_key.is_none(),
        "--signatures and --sign-key do not apply to --upstream and --bundle: the source's own signatures are republished as they are (verify them with --trusted-keys)"
    );
    let state_dir = StateDir::open(&args.state_dir, &[])?;
    let mirror = SiteMirror::open(
        site,
        state_dir.path(),
        SyncOptions {
            trusted: sigs.trusted.clone(),
            ..SyncOptions::default()
        },
        args.keep,
        None,
    )?;
    Ok(SitePublisher::new(mirror))
}

/// Serves `state` until SIGTERM or SIGINT, then stops the publisher, fails
/// `/readyz` and lets in-flight requests finish (up to `timeout`).
async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    workers: std::num::NonZeroUsize,
    state: AppState,
    limits: crate::listen::limits::Limits,
    signals: Signals,
    publisher: JoinHandle<()>,
    timeout: Duration,
) -> Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let drain_state = state.clone();
    let mut server = tokio::spawn(socket::run(listener, workers, state, limits, async move {
        let _ = rx.await;
    }));
    tokio::select! {
        () = signals.stopped() => {}
        // Only a worker that failed ends it unasked: exit, so that the
        // pod restarts rather than stays up without serving.
        r = &mut server => {
            publisher.abort();
            r.context("server task")?.context("serving")?;
            anyhow::bail!("the HTTP listener stopped unasked");
        }
    }
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
    // The access log's last lines may still be queued (the output was
    // full), which exiting would cut off.
    let _ = tokio::task::spawn_blocking(move || drain_state.sync_access_log()).await;
    Ok(())
}

/// The access log's output, which must not block (`http::access_log`):
/// a file is appended to whole batches at a time.
fn open_access_log(p: &Path) -> Result<Box<dyn Write + Send>> {
    if p.as_os_str() == "-" {
        return crate::http::access_log::nonblocking_stdout().context("the access log on stdout");
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .with_context(|| format!("opening access log {}", p.display()))?;
    Ok(Box::new(f))
}
