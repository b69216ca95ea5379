//! The arguments of `serve` (and the source and registry arguments `sign`
//! and `mirror` share).

use crate::deltas::DeltaMode;
use crate::listen::limits::Limits;
use crate::redact::RedactedUrl;
use crate::request::Source;
use crate::signing::{self, SignatureOptions};
use crate::source::{FetchOptions, ImageRef, Platform};
use anyhow::Result;
use clap::Args;
use oscontent_format::Checksum;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

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
    /// With signatures (--signatures, --trusted-keys or --sign-key): how often
    /// to look for a changed bundle, or a changed summary in --repo mode, and
    /// re-publish. A --repo without --sign-key also follows its refs,
    /// summary, summary.sig and detached metadata by itself (inotify, and a
    /// look this often as the fallback); with --sign-key only SIGHUP
    /// publishes what its writers changed. Otherwise a source is checked
    /// again at SIGHUP (and every --refresh-interval for images).
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
            .map(Arc::new);
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
            sign_key: sign_key.map(Arc::new),
            sign_pins: None,
        })
    }
}

#[derive(Debug, Args)]
#[group(id = "source", required = true, multiple = false)]
pub struct SourceArgs {
    /// Root of an unpacked oscontainer image (as an image volume or
    /// `oc image extract` leaves it); its repo is `srv/repo`.
    #[arg(long, value_name = "DIR", group = "source")]
    pub oscontainer: Option<PathBuf>,
    /// A plain archive repo (refs, summary and deltas its own), verified and
    /// published as it stands at start and at each SIGHUP.
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
    pub upstream: Option<RedactedUrl>,
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
    /// Talk plain HTTP to this registry (`HOST[:PORT]`). Repeatable.
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
    /// An ostree-native image with derived layers (added after
    /// `ostree.final-diffid`, e.g. by a Containerfile) is refused, because
    /// its commit is not what the image runs. With this flag, serve that
    /// base commit anyway (the derived layers are not fetched).
    #[arg(long)]
    pub serve_base_commit: bool,
    /// Most bytes an image may decompress to, all layers together (what
    /// is skipped counts too). The default stays below the deployed 5 GiB
    /// state volume, so a hostile image fails the fetch, not the disk.
    #[arg(long, default_value_t = DEFAULT_MAX_IMAGE_BYTES, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_bytes: u64,
}

/// 4 GiB: below the 5 GiB state volume of deploy/, which also holds the
/// generation being served while the next is staged.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 4 << 30;

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
    /// Address to listen on (HTTP/1.1 and HTTP/2 prior knowledge): IP:PORT,
    /// or HOST:PORT resolved once at start (its first address).
    #[arg(long, default_value = "0.0.0.0:8080", env = "OSCONTENT_LISTEN", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Commit to publish (full checksum) under refs derived from it;
    /// default: the only commit in the repo. A --repo with refs of its own
    /// publishes those (and its summary) instead, unless --ref is given.
    /// With --sign-key, the commits it may sign: repeat it to pin several;
    /// a publication whose refs or summary name any other commit is
    /// refused (the previous generation stays served), never served
    /// unsigned.
    #[arg(long, value_name = "CHECKSUM")]
    pub commit: Vec<Checksum>,
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
    /// Memory for immutable objects served from RAM, e.g. 128M, 1G; 0
    /// turns the cache off. Requests keep objects under 16 KiB (larger
    /// ones are sent from the page cache). Each publication first fills up
    /// to half of it with what the new release brings over its parent
    /// commit, when that is served too, objects up to 1 MiB and an eighth
    /// of this. The default fits the deployment's 512 MiB limit.
    #[arg(long, default_value = "128M", value_name = "BYTES", value_parser = parse_size)]
    pub cache_size: usize,
    /// Check the --image references for a new digest this often (reading
    /// only their manifests), or an --upstream or --bundle for a new
    /// summary, and publish what moved as a new generation. 0: only at
    /// SIGHUP. SIGHUP also re-publishes --oscontainer and --repo.
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    pub refresh_interval: u64,
    /// Publish a refresh (a moved --image tag, a new --upstream or --bundle
    /// summary) that moves a ref to an older commit (older timestamp or
    /// lower version). By default it is refused and the previous
    /// generation stays served, so fresh nodes never install an old
    /// release an attacker replayed.
    #[arg(long)]
    pub allow_rollback: bool,
    /// How far ahead of this server's clock a release nothing verified
    /// (no --trusted-keys, --image not pinned by digest) may be dated. A
    /// later one is refused with an error: recorded as the newest release,
    /// its timestamp would make every honest release until then look
    /// like a rollback.
    #[arg(long, default_value_t = oscontent_format::age::DEFAULT_MAX_FUTURE_SKEW, value_name = "SECONDS")]
    pub max_future_skew: u64,
    /// With --upstream or --bundle: keep the last N releases (and what the
    /// source publishes now), removing objects nothing kept reaches.
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Static deltas to generate between the releases served (several
    /// --image): `latest`, to each ref's newest release from every older
    /// one; `all`, between every pair; `none`. Made in the background
    /// after each publication and published without changing the summary
    /// (they are listed in delta indexes); kept in the state dir.
    #[arg(long, value_enum, default_value_t = DeltaMode::Latest)]
    pub deltas: DeltaMode,
    /// Longest the compilation of one static delta may take before its
    /// process is killed (nodes then fetch objects).
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub delta_timeout: u64,
    /// Address space the process compiling one static delta may map
    /// (RLIMIT_AS); past it the delta fails and nodes fetch objects. The
    /// default fits beside the server in the Deployment's 512Mi.
    #[arg(long, default_value = DEFAULT_DELTA_MEMORY, value_name = "BYTES", value_parser = parse_delta_memory)]
    pub delta_memory: usize,
    /// After SIGTERM, how long in-flight requests may take before the
    /// server exits anyway.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub shutdown_timeout: u64,
    #[command(flatten)]
    pub signing: SignatureArgs,
    #[command(flatten)]
    pub connections: ConnectionArgs,
    #[command(flatten)]
    pub stage: super::stage_args::StageArgs,
}

/// The most `--workers`: each is a thread, a runtime and an epoll
/// instance, and a machine with more cores than this is better served by
/// more replicas.
const MAX_WORKERS: usize = 1024;

/// Connection caps and timeouts of the HTTP listener. The defaults keep a
/// pod within its 512 MiB limit under abuse (`listen`'s module doc,
/// ARCHITECTURE.md invariant 7).
#[derive(Debug, Args)]
pub struct ConnectionArgs {
    /// Threads that accept and serve connections, each serving the
    /// connections it accepted, at most 1024 [default: one per CPU this
    /// process may use, within its cgroup's CPU limit].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=MAX_WORKERS as i64))]
    pub workers: Option<u16>,
    /// Connections served at once; more are refused at accept (lowered at
    /// start to what the open-file limit allows).
    #[arg(long, default_value_t = 4096, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Connections served at once from one client address.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_ip: u32,
    /// Connections served at once from one network, all its addresses
    /// together: a /24 for IPv4, a /64 for IPv6 (raise it when more nodes
    /// than this allows share a /24 and connect at once).
    #[arg(long, default_value_t = 1024, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_net: u32,
    /// /readyz says not ready once new clients have been refused for this
    /// long because every connection was in use and none was idle (so the
    /// Service stops routing to this pod until it has room); /healthz stays
    /// 200.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub unready_after_refusing: u64,
    /// Bytes of streamed response chunks (objects the cache does not keep,
    /// delta parts) held in memory at once, all clients together; a client
    /// address gets a sixteenth, its /24 or /64 a quarter. Past that a
    /// response still moves, 4 KiB at a time (never a wait on others or a
    /// refusal). Objects the cache holds and files sent by sendfile are not
    /// counted: they are not copied per request.
    #[arg(long, default_value = "64M", value_name = "BYTES", value_parser = parse_size)]
    pub max_body_memory: usize,
    /// Connections accepted past --max-connections, or past a client's
    /// --max-connections-per-ip, that answer only /healthz, /readyz and
    /// /metrics, one request each (two per client address, 1 s to send it),
    /// so probes still pass while a cap is full.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub probe_reserve: u32,
    /// Close a connection that sends nothing for this long after it opens.
    #[arg(long, default_value_t = 10, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub first_byte_timeout: u64,
    /// An HTTP/1.1 request head must arrive whole within this; it also
    /// bounds how long a keep-alive connection waits for its next request.
    #[arg(long, default_value_t = 20, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout: u64,
    /// Close a connection on which no request arrived and no response
    /// moved for this long (idle HTTP/2 connections, clients that stopped
    /// reading or opened no window; other frames a client sends do not
    /// count).
    #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: u64,
    /// HTTP/2 keepalive PING interval; a peer that does not answer within
    /// as long again is dropped.
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub h2_keepalive: u64,
    /// HTTP/2 streams one connection may have open at once.
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub h2_max_streams: u32,
    /// Response bytes buffered per HTTP/2 stream for a client that does not
    /// read.
    #[arg(long, default_value_t = 32 * 1024, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(1024..))]
    pub h2_send_buffer: u32,
    /// Files held open by streamed bodies at once, all clients together
    /// (objects bigger than the cache takes, delta parts): each holds a
    /// descriptor and a 64 KiB chunk for as long as its client takes to
    /// read it. A client address gets an eighth; past that, or the total,
    /// a body opens its file again for each 8 KiB read and holds nothing
    /// in between (never a wait or a refusal). Lowered at start to fit the
    /// open-file limit.
    #[arg(long, default_value_t = 1024, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streamed_files: u32,
}

impl ConnectionArgs {
    /// `--workers`, or one per usable CPU, at most [`MAX_WORKERS`].
    pub fn workers(&self) -> std::num::NonZeroUsize {
        use std::num::NonZeroUsize;
        let n = match self.workers {
            Some(n) => usize::from(n),
            None => std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        };
        NonZeroUsize::new(n.clamp(1, MAX_WORKERS)).unwrap_or(NonZeroUsize::MIN)
    }

    pub fn limits(&self) -> Limits {
        use std::time::Duration;
        Limits {
            max_connections: self.max_connections as usize,
            max_per_ip: self.max_connections_per_ip as usize,
            max_per_net: self.max_connections_per_net as usize,
            probe_reserve: self.probe_reserve as usize,
            probe_reserve_per_ip: 2,
            first_byte_timeout: Duration::from_secs(self.first_byte_timeout),
            header_read_timeout: Duration::from_secs(self.header_read_timeout),
            idle_timeout: Duration::from_secs(self.idle_timeout),
            h2_keepalive: Duration::from_secs(self.h2_keepalive),
            h2_max_streams: self.h2_max_streams,
            h2_send_buffer: self.h2_send_buffer as usize,
            max_streamed_files: self.max_streamed_files as usize,
        }
    }
}

/// The commit `--commit` names for publication to derive refs for: the one
/// given, if it is one. Several pin a `--repo`'s own refs instead; an
/// oscontainer holds one commit, and `--ref` names one commit's refs.
pub fn derive_commit(
    source: &Source,
    commits: &[Checksum],
    refs: &[String],
) -> Result<Option<Checksum>> {
    match commits {
        [] => Ok(None),
        [one] => Ok(Some(*one)),
        several => {
            anyhow::ensure!(
                matches!(source, Source::Repo(_)),
                "--commit is given {} times; an --oscontainer holds one commit",
                several.len()
            );
            anyhow::ensure!(
                refs.is_empty(),
                "--ref names the refs of one --commit; with several, the repo's own refs are published"
            );
            Ok(None)
        }
    }
}

impl SourceArgs {
    /// The `--oscontainer` or `--repo` source; `None` for the others.
    pub fn local(&self) -> Option<Source> {
        match (&self.oscontainer, &self.repo) {
            (Some(d), None) => Some(Source::Oscontainer(d.clone())),
            (None, Some(d)) => Some(Source::Repo(d.clone())),
            _ => None,
        }
    }
}

impl RegistryArgs {
    pub fn fetch_options(&self) -> FetchOptions {
        FetchOptions {
            platform: self.platform.clone(),
            authfile: self.authfile.clone(),
            ca_files: self.ca_files.clone(),
            insecure_registries: self.insecure_registries.clone(),
            registries_conf: self.registries_conf.clone(),
            serve_base_commit: self.serve_base_commit,
            limits: crate::source::Limits {
                max_decompressed_bytes: self.max_image_bytes,
                ..crate::source::Limits::default()
            },
            ..FetchOptions::default()
        }
    }
}

/// `--listen`: a socket address, or a host name and port.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    use std::net::ToSocketAddrs;
    let mut addrs = s
        .to_socket_addrs()
        .map_err(|e| format!("{s:?}: want IP:PORT or HOST:PORT ({e})"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

/// `N`, `NK`, `NM` or `NG` (powers of 1024) as bytes.
/// `--delta-memory`'s default.
pub const DEFAULT_DELTA_MEMORY: &str = "256M";

/// Below this the compiler cannot even start.
const MIN_DELTA_MEMORY: usize = 32 << 20;

fn parse_delta_memory(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    if n < MIN_DELTA_MEMORY {
        return Err(format!("{s:?} is below the compiler's least, 32M"));
    }
    Ok(n)
}

pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or a number with K, M or G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        #[rustfmt::skip]
        let cases: &[(&str, Option<usize>)] = &[
            ("0", Some(0)), ("4096", Some(4096)), ("128M", Some(128 << 20)),
            ("1g", Some(1 << 30)), ("64K", Some(64 << 10)),
            ("", None), ("M", None), ("-1", None), ("1T", None), ("1.5G", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_size(s).ok(), *want, "{s:?}");
        }
        assert!(parse_size("1T").unwrap_err().contains("1T"));
    }
}

#[cfg(test)]
mod delta_flag_tests {
    use crate::cli::{Cli, Cmd};
    use crate::deltas::DeltaMode;
    use clap::Parser;

    /// Extra `serve` arguments, and the mode, timeout and memory bound
    /// they parse to.
    type Case<'a> = (&'a [&'a str], Option<(DeltaMode, u64, usize)>);

    #[test]
    fn deltas_and_their_bounds() {
        const M: usize = 1 << 20;
        #[rustfmt::skip]
        let cases: &[Case] = &[
            (&[], Some((DeltaMode::Latest, 600, 256 * M))),
            (&["--deltas", "none"], Some((DeltaMode::None, 600, 256 * M))),
            (&["--deltas", "latest"], Some((DeltaMode::Latest, 600, 256 * M))),
            (&["--deltas=all", "--delta-timeout", "30"], Some((DeltaMode::All, 30, 256 * M))),
            (&["--delta-memory", "1G"], Some((DeltaMode::Latest, 600, 1024 * M))),
            (&["--delta-memory=32M"], Some((DeltaMode::Latest, 600, 32 * M))),
            (&["--delta-memory", "31M"], None),
            (&["--delta-memory", "lots"], None),
            (&["--deltas", "every"], None),
            (&["--deltas"], None),
            (&["--delta-timeout", "-1"], None),
        ];
        for (extra, want) in cases {
            let argv = ["oscontent-server", "serve", "--repo", "/srv/repo"];
            let parsed = Cli::try_parse_from(argv.iter().chain(extra.iter()));
            let got = parsed.ok().map(|c| match c.cmd {
                Cmd::Serve(a) => (a.deltas, a.delta_timeout, a.delta_memory),
                other => panic!("{other:?}"),
            });
            assert_eq!(got, *want, "{extra:?}");
        }
    }
}

#[cfg(test)]
mod workers_flag_tests {
    use crate::cli::{Cli, Cmd};
    use clap::Parser;

    #[test]
    fn workers() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get().min(1024));
        #[rustfmt::skip]
        let cases: &[(&[&str], Option<usize>)] = &[
            (&[], Some(cpus)),
            (&["--workers", "1"], Some(1)),
            (&["--workers=4"], Some(4)),
            (&["--workers", "1024"], Some(1024)),
            (&["--workers", "0"], None),
            (&["--workers", "1025"], None),
            (&["--workers", "-2"], None),
            (&["--workers", "two"], None),
        ];
        for (extra, want) in cases {
            let argv = ["oscontent-server", "serve", "--repo", "/srv/repo"];
            let parsed = Cli::try_parse_from(argv.iter().chain(extra.iter()));
            let got = parsed.ok().map(|c| match c.cmd {
                Cmd::Serve(a) => a.connections.workers().get(),
                other => panic!("{other:?}"),
            });
            assert_eq!(got, *want, "{extra:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        // (input, what it binds; None: refused). `localhost` comes from
        // /etc/hosts: no DNS.
        let cases: [(&str, Option<&str>); 6] = [
            ("0.0.0.0:8080", Some("0.0.0.0:8080")),
            ("[::1]:80", Some("[::1]:80")),
            ("127.0.0.1:0", Some("127.0.0.1:0")),
            ("localhost", None),
            ("127.0.0.1", None),
            ("127.0.0.1:99999", None),
        ];
        for (input, want) in cases {
            let got = parse_listen(input).ok().map(|a| a.to_string());
            assert_eq!(got.as_deref(), want, "{input}");
        }
        let local = parse_listen("localhost:8080").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 8080, "{local}");
    }
}
