//! `cargo xtask <command>`: a thin dispatcher; each command's logic lives in
//! the library.

use std::path::PathBuf;
use std::time::Duration;

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
    /// Formatting, clippy lints, cargo-deny and the structure check
    /// (`layers`).
    Check,
    /// The structure check alone: no module import circle in any crate,
    /// server/src's layers (xtask/src/layers/table.rs), file and function
    /// lengths. Prints every finding; fails on any.
    Layers,
    /// Render deploy/ (base, overlays, ServiceMonitor component) with
    /// `kubectl kustomize`, decode every object strictly, check the security
    /// and rollout invariants, and run checkov over all of it.
    CheckDeploy,
    /// Every check and test, as CI runs them: deps, check, build, fixtures,
    /// tests, and a short run of every fuzz target (OSCONTENT_TEST_FUZZ=0
    /// leaves that out).
    Test,
    /// Build demo oscontainers, serve v1 then v2, update a fresh node repo
    /// with stock `ostree pull`, and print what it fetched against the image.
    Demo(DemoArgs),
    /// Benchmarks (as root; each says what it lacks if it cannot run).
    Bench(BenchArgs),
    /// Build every fuzz target (tests/fuzz: cargo-fuzz, libFuzzer, nightly)
    /// and run each for a bounded time; fails on any crash, hang or
    /// out-of-memory, printing the path of the input that caused it.
    Fuzz(FuzzArgs),
}

#[derive(Args)]
struct FuzzArgs {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Targets to run [default: all, the files of tests/fuzz/fuzz_targets].
    targets: Vec<String>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Server time to ready and bytes written when streaming an image from
    /// a registry, against `skopeo copy` + `umoci unpack`, each on a fresh
    /// XFS loop device. Writes target/bench/startup-<time>.json.
    Startup(StartupArgs),
    /// How much an update hurts an etcd-like neighbour (2300-byte writes +
    /// fdatasync) on the same XFS filesystem: stock `ostree pull`, `ostree
    /// pull --per-object-fsync` and `oscontent pull` in each --io-mode,
    /// against the neighbour alone. Writes target/bench/io-<time>.json and
    /// SVG charts.
    Io(IoArgs),
    /// Bytes a node downloads and writes for v1 -> v2 of an ostree-native
    /// image (5% and 30% package-shaped updates): ostree-ext's importer from
    /// a registry, stock `ostree pull` and `oscontent pull` from the server,
    /// and `oscontent stage` from the server followed by the importer.
    /// Writes target/bench/update-bytes-<time>.json.
    UpdateBytes(UpdateBytesArgs),
    /// N node hosts in network namespaces behind shaped links, all updating
    /// v1 -> v2 at once from one server in its own namespace: oscontent-server
    /// and nginx (the anchor) serving the same repo, without and with a
    /// static delta, to stock `ostree pull` and `oscontent pull`. With
    /// --stage, every node runs the staging agent under the server's slots.
    /// Writes target/bench/fleet-<time>.json (fleet-stage-<time>.json).
    Fleet(FleetArgs),
    /// What one request costs the server: one stock `ostree pull`'s request
    /// mix replayed with h2load (HTTP/1.1 and h2c) against nginx, `ostree
    /// trivial-httpd` and oscontent-server serving the same repo. Writes
    /// target/bench/serve-<time>.json.
    Serve(xtask::bench::serve::Options),
}

#[derive(Args)]
struct FleetArgs {
    /// Fleet sizes, comma-separated (each a wave of its own).
    #[arg(long, value_delimiter = ',', default_values_t = [8, 32])]
    nodes: Vec<usize>,
    /// Fixture scale: small (quick) or full (about 1 GiB).
    #[arg(long, value_enum, default_value_t = Scale::Small)]
    scale: Scale,
    /// Update share.
    #[arg(long, default_value_t = 0.05)]
    share: f64,
    /// Each node's download rate (tc syntax).
    #[arg(long, default_value = "1gbit")]
    rate: String,
    /// One-way delay on each node's link, in milliseconds (needs the
    /// kernel's sch_netem; 0 shapes the rate alone, with a token bucket).
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Servers, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [xtask::bench::fleet::wave::ServerKind::Oscontent, xtask::bench::fleet::wave::ServerKind::Nginx])]
    servers: Vec<xtask::bench::fleet::wave::ServerKind>,
    /// Clients, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [xtask::bench::fleet::wave::Client::Stock, xtask::bench::fleet::wave::Client::Oscontent])]
    clients: Vec<xtask::bench::fleet::wave::Client>,
    /// Serve without (no), with (yes) or both (no,yes) the v1 -> v2 delta.
    #[arg(long, value_delimiter = ',', default_values_t = [false, true], action = clap::ArgAction::Set)]
    deltas: Vec<bool>,
    /// Runs of each wave (servers interleaved); the table gives the median
    /// server CPU per node and its min-max.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    repeat: u16,
    /// This oscontent-server binary instead of building the release one.
    #[arg(long, value_name = "PATH")]
    server_bin: Option<PathBuf>,
    /// This oscontent binary instead of building the release one.
    #[arg(long, value_name = "PATH")]
    client_bin: Option<PathBuf>,
    /// Stage instead of pulling: every node runs the node agent (`oscontent
    /// stage --follow`) against the server streaming v2 of the native image
    /// from a registry and handing out staging slots. --servers, --clients
    /// and --deltas are not used.
    #[arg(long)]
    stage: bool,
    /// The server's --stage-slots in --stage waves.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    stage_slots: u32,
    /// The server's --stage-retry-after (seconds) in --stage waves.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    stage_retry_after: u64,
}

#[derive(Args)]
struct UpdateBytesArgs {
    /// Fixture scale: full (about 1 GiB; the real benchmark) or small.
    #[arg(long, value_enum, default_value_t = Scale::Full)]
    scale: Scale,
    /// Update shares, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [0.05, 0.3])]
    share: Vec<f64>,
    /// What the server serves: the native images (`image`) or the archive
    /// repo they were encapsulated from (`repo`, same commits).
    #[arg(long, value_enum, default_value_t = xtask::bench::update_bytes::ServerSource::Image)]
    server_source: xtask::bench::update_bytes::ServerSource,
    /// This oscontent-server binary instead of building the release one.
    #[arg(long, value_name = "PATH")]
    server_bin: Option<PathBuf>,
    /// This oscontent client binary instead of building the release one.
    #[arg(long, value_name = "PATH")]
    client_bin: Option<PathBuf>,
}

#[derive(Args)]
struct IoArgs {
    /// Fixture scale: full (about 1 GiB, 31k files; the real benchmark) or
    /// small (a quick development run).
    #[arg(long, value_enum, default_value_t = Scale::Full)]
    scale: Scale,
    /// Which updates, comma-separated: small (60 MiB of small files in
    /// 1,600 new directories), 5 or 30 (v2 rewrites that share of v1's
    /// files), both (30,5).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [xtask::bench::io::Updates::Small, xtask::bench::io::Updates::Five, xtask::bench::io::Updates::Thirty])]
    update: Vec<xtask::bench::io::Updates>,
    /// Repetitions of every arm (the arms alternate order between them);
    /// the bootstrap intervals need at least 5.
    #[arg(long, visible_alias = "trials", default_value_t = 6)]
    runs: usize,
    /// Time budget of the whole run, in seconds: no repetition starts
    /// once an update has used its share (after at least 3 runs). A
    /// repetition takes about arms x (warm-up + update + 2 s).
    #[arg(long, value_name = "SECONDS")]
    seconds: Option<u64>,
    /// Extra trials of every pulling arm without the neighbour, for clean
    /// device byte counts.
    #[arg(long, default_value_t = 1)]
    solo_runs: usize,
    /// Arms to run, comma-separated: baseline, ostree,
    /// ostree-per-object-fsync (or ostree-fsync), oscontent (every mode) or
    /// oscontent:MODE, and a pulling arm's name with @ram (e.g.
    /// oscontent:paced@ram) for the same pull into a repo on a tmpfs: the
    /// harm its CPU does alone, not judged [default: all but the @ram
    /// twins].
    #[arg(long, value_delimiter = ',')]
    arms: Option<Vec<String>>,
    /// The client's --io-mode values to compare, comma-separated [default:
    /// what `oscontent pull --help` lists].
    #[arg(long, value_delimiter = ',')]
    io_modes: Option<Vec<String>>,
    /// Target repo mode.
    #[arg(long, value_enum, default_value_t = xtask::bench::io::repo::RepoMode::BareUser)]
    mode: xtask::bench::io::repo::RepoMode,
    /// Benchmark this oscontent-server binary instead of building the
    /// release one.
    #[arg(long, value_name = "PATH")]
    server_bin: Option<PathBuf>,
    /// Benchmark this oscontent client binary instead of building the
    /// release one.
    #[arg(long, value_name = "PATH")]
    client_bin: Option<PathBuf>,
    /// Longest one pull may take, in seconds (then it is killed and the
    /// benchmark fails).
    #[arg(long, default_value_t = 1200, value_name = "SECONDS")]
    arm_timeout: u64,
    /// Seconds the neighbour runs alone before each window opens.
    #[arg(long, default_value_t = 3.0, value_name = "SECONDS")]
    warmup: f64,
    /// Baseline window length in seconds [default: 1.2 x the longest
    /// update so far, at least 20 s (full) or 5 s (small)].
    #[arg(long, value_name = "SECONDS")]
    baseline_secs: Option<f64>,
    /// Seconds of fio alone and of the built-in neighbour alone, compared
    /// once at the start (0 skips).
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    calibrate_secs: u64,
    /// Also run a real etcd (data dir on the same filesystem, loopback
    /// only, one client putting 2300-byte values) as a second neighbour.
    #[arg(long)]
    etcd: bool,
    /// Drop the page cache before every trial (by default: before each
    /// update's first trial; every trial's filesystem is freshly mounted,
    /// hence cold, anyway).
    #[arg(long)]
    drop_caches_each_trial: bool,
    /// Exit non-zero if a target is missed or could not be evaluated.
    #[arg(long)]
    strict: bool,
}

#[derive(Args)]
struct StartupArgs {
    /// Fixture scale: full (about 1 GiB, 31k files) or small (a quick run).
    #[arg(long, value_enum, default_value_t = Scale::Full)]
    scale: Scale,
    /// Trials per arm (the arms alternate which goes first).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Longest an arm may take to become ready, in seconds.
    #[arg(long, default_value_t = 1200, value_name = "SECONDS")]
    ready_timeout: u64,
    /// Benchmark this oscontent-server binary instead of building the
    /// release one.
    #[arg(long, value_name = "PATH")]
    server_bin: Option<PathBuf>,
    /// Keep the page cache between arms (by default it is dropped, so
    /// every arm reads the registry's blobs cold).
    #[arg(long)]
    warm: bool,
    /// Exit non-zero if a target is missed.
    #[arg(long)]
    strict: bool,
    /// Serve v2 of the ostree-native fixture (from the registry and from
    /// an OCI layout) against ostree-ext's import into bare-user then
    /// `ostree pull-local` into an archive repo, instead of the legacy
    /// oscontainer against skopeo + umoci.
    #[arg(long)]
    native: bool,
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
    /// Oscontainer format: ostree-native images (what current nodes run)
    /// or the legacy `/srv/repo` oscontainer.
    #[arg(long, value_enum, default_value_t = xtask::demo::Format::Native)]
    format: xtask::demo::Format,
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
    /// Build the ostree-native images instead (ostree-ext's encapsulator,
    /// chunked by package, v2 a package-shaped update packed like v1)
    /// [default dir: native-<scale>-<share>].
    #[arg(long)]
    native: bool,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Fixtures(a) => {
            let spec = FixtureSpec {
                update_share: a.share,
                ref_name: a.ref_name,
                ..FixtureSpec::new(a.scale)
            };
            if a.native {
                let dir = a.dir.unwrap_or_else(|| fixtures::native_default_dir(&spec));
                print!(
                    "{}",
                    fixtures::native_summary(&fixtures::ensure_native(&spec, &dir)?)
                );
            } else {
                let dir = a.dir.unwrap_or_else(|| fixtures::default_dir(&spec));
                print!("{}", fixtures::summary(&fixtures::ensure(&spec, &dir)?));
            }
        }
        Cmd::Deps => xtask::deps::ensure()?,
        Cmd::Check => xtask::testrun::check()?,
        Cmd::Layers => xtask::layers::check()?,
        Cmd::CheckDeploy => xtask::deploy::check_deploy()?,
        Cmd::Test => xtask::testrun::test()?,
        Cmd::Fuzz(a) => {
            xtask::fuzz::fuzz(&xtask::fuzz::Options {
                seconds: a.seconds,
                targets: a.targets,
                progress: true,
            })?;
        }
        Cmd::Demo(a) => xtask::demo::demo(&xtask::demo::DemoOptions {
            scale: a.scale,
            share: a.share,
            format: a.format,
            keep_serving: a.keep_serving,
        })?,
        Cmd::Bench(b) => match b.cmd {
            BenchCmd::Startup(a) => {
                xtask::bench::startup::startup(&xtask::bench::startup::StartupOptions {
                    scale: a.scale,
                    runs: a.runs,
                    ready_timeout: Duration::from_secs(a.ready_timeout),
                    server_bin: a.server_bin,
                    drop_caches: !a.warm,
                    strict: a.strict,
                    native: a.native,
                })?
            }
            BenchCmd::UpdateBytes(a) => {
                xtask::bench::update_bytes::run(&xtask::bench::update_bytes::Options {
                    scale: a.scale,
                    shares: a.share,
                    server_source: a.server_source,
                    server_bin: a.server_bin,
                    client_bin: a.client_bin,
                })?
            }
            BenchCmd::Fleet(a) => xtask::bench::fleet::run(&xtask::bench::fleet::Options {
                nodes: a.nodes,
                scale: a.scale,
                share: a.share,
                shaping: xtask::bench::fleet::topology::Shaping {
                    rate: a.rate,
                    delay: Duration::from_secs_f64(a.delay_ms / 1e3),
                },
                servers: a.servers,
                clients: a.clients,
                deltas: a.deltas,
                repeat: a.repeat.into(),
                server_bin: a.server_bin,
                client_bin: a.client_bin,
                stage: a.stage,
                stage_slots: a.stage_slots,
                stage_retry_after: a.stage_retry_after,
            })?,
            BenchCmd::Serve(a) => xtask::bench::serve::run(&a)?,
            BenchCmd::Io(a) => xtask::bench::io::io(&xtask::bench::io::IoOptions {
                scale: a.scale,
                updates: a.update,
                runs: a.runs,
                budget: a.seconds.map(Duration::from_secs),
                solo_runs: a.solo_runs,
                arms: a.arms,
                io_modes: a.io_modes,
                mode: a.mode,
                server_bin: a.server_bin,
                client_bin: a.client_bin,
                arm_timeout: Duration::from_secs(a.arm_timeout),
                warmup: Duration::from_secs_f64(a.warmup),
                baseline_secs: a.baseline_secs,
                calibrate_secs: a.calibrate_secs,
                etcd: a.etcd,
                drop_caches_each_trial: a.drop_caches_each_trial,
                strict: a.strict,
            })?,
        },
    }
    Ok(())
}
