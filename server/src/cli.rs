//! The `oscontent-server` command line.

use crate::http::{AppState, HttpConfig};
use crate::publish::{self, PublishRequest, Source, StateDir};
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use oscontent::format::Checksum;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
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
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub source: SourceArgs,
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
    /// After SIGTERM, how long in-flight requests may take before the
    /// server exits anyway.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub shutdown_timeout: u64,
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
        Cmd::Serve(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(serve(args))
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
    let source = match (args.source.oscontainer, args.source.repo) {
        (Some(d), None) => Source::Oscontainer(d),
        (None, Some(d)) => Source::Repo(d),
        _ => unreachable!("clap enforces exactly one source"),
    };
    // Installed first: a SIGTERM that arrives while publishing must still
    // mean a graceful stop, not the default instant death.
    let signals = Signals::install()?;
    let access_log = args.access_log.as_ref().map(open_access_log).transpose()?;
    let state = AppState::new(
        HttpConfig {
            metadata_max_age: Duration::from_secs(args.metadata_max_age),
        },
        access_log,
    );
    let state_dir = StateDir::open(&args.state_dir, &[source.repo_path()])?;
    let req = PublishRequest {
        source: source.clone(),
        commit: args.commit,
        refs: args.refs,
    };
    let generation = tokio::task::spawn_blocking(move || {
        let g = publish::publish(&req, &state_dir);
        (g, state_dir)
    })
    .await
    .context("publish task")?;
    let generation = generation
        .0
        .with_context(|| format!("publishing {}", source.repo_path().display()))?;
    for (name, commit) in &generation.derived_refs {
        tracing::info!(r#ref = name, %commit, "published");
    }
    state.publish(generation);

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

/// SIGTERM and SIGINT, both meaning "drain and exit".
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    async fn recv(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
