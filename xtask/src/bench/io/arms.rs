//! Which arms a `bench io` run compares: the neighbour alone, stock
//! `ostree pull` (with and without `--per-object-fsync`), and `oscontent
//! pull` in each `--io-mode` its client offers; on request, any pulling
//! arm's in-RAM twin (`ostree@ram`, `oscontent:paced@ram`).
//!
//! # In-RAM twins
//!
//! A twin runs the same pull into a copy of the node repo on a tmpfs,
//! while the neighbour stays on the scratch disk. It uses the CPU, the
//! network and the server as its arm does and writes nothing to the
//! neighbour's disk, so its harm is the part of its arm's that no I/O
//! policy can remove: CPU and scheduling. On the 2-vCPU machines of issue
//! 16 that part was most of the p99 (RESULTS.md). Twins are only run when
//! named, and are not judged against the targets.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The io-modes the client is expected to offer (team brief), used when
/// its `--help` lists none.
pub const DEFAULT_IO_MODES: &[&str] = &["paced", "stock-like", "per-object-fsync"];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arm {
    /// The neighbour alone.
    Baseline,
    /// Stock `ostree pull`.
    Ostree,
    /// `ostree pull --per-object-fsync`.
    OstreePerObjectFsync,
    /// `oscontent pull --io-mode MODE`.
    Oscontent(String),
    /// A pulling arm whose node repo is on a tmpfs.
    InRam(Box<Arm>),
}

/// What an in-RAM twin's name adds to its arm's.
pub(super) const RAM_SUFFIX: &str = "@ram";

impl Arm {
    pub fn name(&self) -> String {
        match self {
            Arm::Baseline => "baseline".into(),
            Arm::Ostree => "ostree".into(),
            Arm::OstreePerObjectFsync => "ostree-per-object-fsync".into(),
            Arm::Oscontent(m) => format!("oscontent:{m}"),
            Arm::InRam(a) => format!("{}{RAM_SUFFIX}", a.name()),
        }
    }

    /// The arm itself, or a twin's arm on disk.
    pub fn on_disk(&self) -> &Arm {
        match self {
            Arm::InRam(a) => a.on_disk(),
            a => a,
        }
    }

    pub fn in_ram(&self) -> bool {
        matches!(self, Arm::InRam(_))
    }

    /// Whether `--solo-runs` gives this arm trials without the neighbour:
    /// every pulling arm but a twin, which alone measures nothing (its
    /// harm is only to a neighbour, and its bytes are not on the device).
    pub fn runs_solo(&self) -> bool {
        *self != Arm::Baseline && !self.in_ram()
    }

    pub(super) fn color(&self, i: usize) -> (u8, u8, u8) {
        match self {
            Arm::Baseline => (60, 60, 60),
            Arm::Ostree => (200, 90, 0),
            Arm::OstreePerObjectFsync => (160, 0, 120),
            Arm::Oscontent(_) => [(0, 90, 200), (0, 140, 70), (90, 60, 200), (0, 150, 160)][i % 4],
            Arm::InRam(a) => {
                let (r, g, b) = a.color(i);
                // Paler: halfway to white.
                (r / 2 + 128, g / 2 + 128, b / 2 + 128)
            }
        }
    }
}

/// The arms `filter` selects from everything available (`oscontent`
/// selects every mode; `ostree-fsync` is short for the per-object-fsync
/// arm; a pulling arm's name with `@ram` is its in-RAM twin). An unknown
/// name is an error that lists the known ones. Without a filter: every
/// arm but the twins.
pub fn select_arms(filter: Option<&[String]>, modes: &[String]) -> Result<Vec<Arm>> {
    let mut all = vec![Arm::Baseline, Arm::Ostree, Arm::OstreePerObjectFsync];
    all.extend(modes.iter().cloned().map(Arm::Oscontent));
    let Some(filter) = filter else {
        return Ok(all);
    };
    let twins: Vec<Arm> = all
        .iter()
        .filter(|a| **a != Arm::Baseline)
        .map(|a| Arm::InRam(Box::new(a.clone())))
        .collect();
    let mut out: Vec<Arm> = Vec::new();
    for f in filter {
        let f = f.trim();
        let picked: Vec<Arm> = match f {
            "oscontent" => all
                .iter()
                .filter(|a| matches!(a, Arm::Oscontent(_)))
                .cloned()
                .collect(),
            "ostree-fsync" => vec![Arm::OstreePerObjectFsync],
            _ => all
                .iter()
                .chain(&twins)
                .filter(|a| a.name() == f)
                .cloned()
                .collect(),
        };
        if picked.is_empty() {
            bail!(
                "unknown arm {f:?}; known: {}, oscontent, ostree-fsync, and any pulling arm's \
                 name with {RAM_SUFFIX} for its in-RAM twin",
                all.iter().map(Arm::name).collect::<Vec<_>>().join(", ")
            );
        }
        for a in picked {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    Ok(out)
}

/// The io-modes and the default one that `oscontent pull --help` lists
/// for `--io-mode`, from clap's short (`[possible values: a, b]`) or long
/// (`Possible values:` then `- a: …` lines) help. None if the help has no
/// `--io-mode` option.
pub fn parse_io_modes(help: &str) -> Option<(Vec<String>, Option<String>)> {
    let start = help.find("--io-mode")?;
    let rest = &help[start + "--io-mode".len()..];
    // The option's block ends where the next option begins.
    let end = rest
        .match_indices("\n")
        .map(|(i, _)| i)
        .find(|&i| {
            let line = rest[i + 1..].trim_start();
            line.starts_with("--")
                || (line.starts_with('-')
                    && line.chars().nth(1).is_some_and(|c| c.is_ascii_alphabetic())
                    && line.chars().nth(2) == Some(','))
        })
        .unwrap_or(rest.len());
    let block = &rest[..end];
    let mut modes = Vec::new();
    if let Some(i) = block.find("[possible values:") {
        let list = &block[i + "[possible values:".len()..];
        let list = &list[..list.find(']').unwrap_or(list.len())];
        modes.extend(
            list.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
        );
    } else if let Some(i) = block.find("Possible values:") {
        for line in block[i..].lines().skip(1) {
            let Some(item) = line.trim().strip_prefix("- ") else {
                if line.trim().is_empty() {
                    continue;
                }
                break;
            };
            let name = item.split(':').next().unwrap_or("").trim();
            if !name.is_empty() {
                modes.push(name.to_owned());
            }
        }
    }
    let default = block.find("[default: ").map(|i| {
        let d = &block[i + "[default: ".len()..];
        d[..d.find(']').unwrap_or(d.len())].trim().to_owned()
    });
    Some((modes, default))
}

/// The oscontent client an `io` run uses, if any of its arms need one.
#[derive(Debug, Clone, Default)]
pub struct Client {
    pub bin: Option<PathBuf>,
    /// The io-modes to benchmark.
    pub modes: Vec<String>,
    /// The client's default io-mode (whose arm the targets judge).
    pub default_mode: Option<String>,
}

impl Client {
    /// The client (`--client-bin`, else a release build) and its io-modes
    /// (`--io-modes`) when the `--arms` filter wants an oscontent arm (it
    /// wants all by default); none otherwise.
    pub fn resolve(
        arms: Option<&[String]>,
        client_bin: Option<&Path>,
        io_modes: Option<&[String]>,
    ) -> Result<Client> {
        let wants_client = arms.is_none_or(|f| {
            f.iter()
                .any(|a| a.trim() == "oscontent" || a.trim().starts_with("oscontent:"))
        });
        if !wants_client {
            return Ok(Client::default());
        }
        let bin = client_binary(client_bin)?;
        let (listed, default) = client_modes(&bin)?;
        let modes = chosen_modes(&bin, io_modes, listed)?;
        let default_mode = default.or_else(|| modes.first().cloned());
        Ok(Client {
            bin: Some(bin),
            modes,
            default_mode,
        })
    }
}

/// `--io-modes` (each must be one the client lists, when it lists any),
/// else what the client lists, else [`DEFAULT_IO_MODES`].
fn chosen_modes(bin: &Path, wanted: Option<&[String]>, listed: Vec<String>) -> Result<Vec<String>> {
    Ok(match wanted {
        Some(m) => {
            if !listed.is_empty() {
                for x in m {
                    anyhow::ensure!(
                        listed.contains(x),
                        "--io-modes: {bin} has no io-mode {x:?} (it lists: {})",
                        listed.join(", "),
                        bin = bin.display()
                    );
                }
            }
            m.to_vec()
        }
        None if !listed.is_empty() => listed,
        None => DEFAULT_IO_MODES.iter().map(|s| (*s).to_owned()).collect(),
    })
}

/// The client binary: the given one, or a release build of the workspace's.
fn client_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        let p = std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))?;
        anyhow::ensure!(p.is_file(), "no client binary at {}", p.display());
        return Ok(p);
    }
    crate::cargo::cargo(&["build", "--release", "--quiet", "-p", "oscontent"])
        .context("building the oscontent client (release)")?;
    Ok(crate::cargo::target_dir().join("release/oscontent"))
}

/// The io-modes `BIN pull --help` lists, and its default; fails clearly if
/// the binary has no `pull` or `pull` has no `--io-mode`.
fn client_modes(bin: &Path) -> Result<(Vec<String>, Option<String>)> {
    let out = Command::new(bin)
        .args(["pull", "--help"])
        .output()
        .with_context(|| format!("running {} pull --help", bin.display()))?;
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{} has no working `pull` subcommand ({}): {}\nThe oscontent arms need a client with `pull`; run only the ostree arms with --arms baseline,ostree,ostree-per-object-fsync, or point --client-bin at a build that has `pull`.",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let Some((modes, default)) = parse_io_modes(&help) else {
        bail!(
            "`{} pull --help` lists no --io-mode option; the oscontent arms compare io-modes. Use --arms to run without them.",
            bin.display()
        );
    };
    Ok((modes, default))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_modes_from_help() {
        let short = "Usage: oscontent pull [OPTIONS]\n\nOptions:\n      --io-mode <MODE>  How to write [default: paced] [possible values: paced, stock-like, per-object-fsync]\n      --json  Lines\n";
        let long = "Options:\n      --io-mode <IO_MODE>\n          How objects reach the disk\n\n          Possible values:\n          - paced:            incremental writeback\n          - stock-like:       one syncfs at the end\n          - per-object-fsync: fsync every object\n\n          [default: paced]\n\n      --io-latency-target <DUR>\n          [default: 10ms]\n";
        let no_values = "Options:\n      --io-mode <MODE>  free text\n      --json\n";
        // (help text, expected (modes, default)).
        type Case<'a> = (&'a str, Option<(Vec<&'a str>, Option<&'a str>)>);
        let cases: &[Case] = &[
            (
                short,
                Some((
                    vec!["paced", "stock-like", "per-object-fsync"],
                    Some("paced"),
                )),
            ),
            (
                long,
                Some((
                    vec!["paced", "stock-like", "per-object-fsync"],
                    Some("paced"),
                )),
            ),
            (no_values, Some((vec![], None))),
            ("Options:\n      --json\n", None),
        ];
        for (help, want) in cases {
            let got = parse_io_modes(help);
            let want = want.as_ref().map(|(m, d)| {
                (
                    m.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
                    d.map(str::to_owned),
                )
            });
            assert_eq!(got, want, "{help}");
        }
    }

    #[test]
    fn arm_filter() {
        let modes = vec!["paced".to_owned(), "stock-like".to_owned()];
        let names = |f: Option<&[String]>| {
            select_arms(f, &modes).map(|v| v.iter().map(Arm::name).collect::<Vec<_>>())
        };
        assert_eq!(names(None).unwrap().len(), 5);
        let f: Vec<String> = vec!["baseline".into(), "ostree-fsync".into(), "ostree".into()];
        assert_eq!(
            names(Some(&f)).unwrap(),
            ["baseline", "ostree-per-object-fsync", "ostree"]
        );
        let f: Vec<String> = vec!["oscontent".into(), "oscontent:paced".into()];
        assert_eq!(
            names(Some(&f)).unwrap(),
            ["oscontent:paced", "oscontent:stock-like"]
        );
        let f: Vec<String> = vec!["oscontent:turbo".into()];
        let e = names(Some(&f)).unwrap_err().to_string();
        assert!(
            e.contains("unknown arm") && e.contains("oscontent:paced"),
            "{e}"
        );
        let f: Vec<String> = vec!["ostree@ram".into(), "oscontent:paced@ram".into()];
        let twins = select_arms(Some(&f), &modes).unwrap();
        assert_eq!(
            twins.iter().map(Arm::name).collect::<Vec<_>>(),
            ["ostree@ram", "oscontent:paced@ram"]
        );
        assert!(twins.iter().all(Arm::in_ram));
        assert!(!twins.iter().any(Arm::runs_solo));
        assert!(Arm::Ostree.runs_solo() && !Arm::Baseline.runs_solo());
        assert_eq!(twins[1].on_disk(), &Arm::Oscontent("paced".into()));
        for bad in ["baseline@ram", "oscontent@ram", "oscontent:paced@ram@ram"] {
            let f: Vec<String> = vec![bad.into()];
            assert!(names(Some(&f)).is_err(), "{bad}");
        }
    }
}
