//! One `h2load` replay of the request mix and what it measured: its
//! summary lines parsed (pure, table-tested), latencies from its
//! per-request log.

use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The protocol of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
pub enum Proto {
    /// HTTP/1.1, one request at a time per connection.
    H1,
    /// HTTP/2 over cleartext, prior knowledge.
    H2c,
}

/// Connections and streams per connection for a concurrency: HTTP/1.1
/// opens one connection per request in flight; HTTP/2 multiplexes up to
/// 16 streams per connection (the server's default `--h2-max-streams`,
/// so no arm queues streams the others would run).
pub fn shape(proto: Proto, concurrency: u32) -> (u32, u32) {
    match proto {
        Proto::H1 => (concurrency, 1),
        Proto::H2c => {
            let streams = concurrency.min(16);
            (concurrency.div_ceil(streams), streams)
        }
    }
}

/// How the mix is spread over the connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
pub enum Replay {
    /// One pull: each connection an h2load of its own with a contiguous
    /// share of the mix, every path asked for once. Most objects are not in
    /// any cache yet, as on the first node of an update.
    Split,
    /// `h2load -i` as its manual runs it: one h2load whose every connection
    /// starts at the mix's first path, so N connections ask N times for its
    /// first Nth. Like a fleet asking for the same objects: all but the
    /// first ask of each path can be answered from memory.
    Shared,
}

/// What one replay measured, as h2load counted it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Counts {
    pub seconds: f64,
    pub done: u64,
    pub succeeded: u64,
    /// failed + errored + timeout, and answers other than 2xx.
    pub errors: u64,
    /// Bytes on the wire (headers and bodies).
    pub bytes: u64,
}

/// Parses h2load's summary: `finished in 1.23s, ...`, `requests: N total,
/// N started, N done, N succeeded, N failed, N errored, N timeout`,
/// `status codes: N 2xx, N 3xx, N 4xx, N 5xx`, `traffic: 1.2MB (N) total`.
pub fn parse(out: &str) -> Result<Counts> {
    let mut c = Counts::default();
    let mut seen = (false, false, false);
    for line in out.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("finished in ") {
            let t = rest.split(',').next().unwrap_or("");
            c.seconds = parse_duration(t).with_context(|| format!("in {line:?}"))?;
            seen.0 = true;
        } else if let Some(rest) = line.strip_prefix("requests: ") {
            for part in rest.split(',') {
                let mut it = part.split_whitespace();
                let n: u64 = it.next().unwrap_or("").parse().unwrap_or(0);
                match it.next() {
                    Some("done") => c.done = n,
                    Some("succeeded") => c.succeeded = n,
                    Some("failed" | "errored" | "timeout") => c.errors += n,
                    _ => {}
                }
            }
            seen.1 = true;
        } else if let Some(rest) = line.strip_prefix("status codes: ") {
            for part in rest.split(',') {
                let mut it = part.split_whitespace();
                let n: u64 = it.next().unwrap_or("").parse().unwrap_or(0);
                if matches!(it.next(), Some("3xx" | "4xx" | "5xx")) {
                    c.errors += n;
                }
            }
        } else if let Some(rest) = line.strip_prefix("traffic: ") {
            let inner = rest.split_once('(').and_then(|(_, r)| r.split_once(')'));
            c.bytes = inner
                .and_then(|(n, _)| n.trim().parse().ok())
                .with_context(|| format!("no byte count in {line:?}"))?;
            seen.2 = true;
        }
    }
    ensure!(
        seen == (true, true, true),
        "h2load printed no summary (finished/requests/traffic lines: {seen:?})"
    );
    Ok(c)
}

/// `1.23s`, `456.7ms`, `89us`.
fn parse_duration(t: &str) -> Result<f64> {
    let t = t.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        anyhow::bail!("not a duration: {t:?}")
    };
    Ok(num.parse::<f64>().context("duration")? * scale)
}

/// p50 and p99 in ms of the durations in h2load's `--log-file` (start
/// µs, status, duration µs, tab-separated).
pub fn percentiles(log: &str) -> (f64, f64) {
    let mut d: Vec<f64> = log
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.trim().parse::<f64>().ok())
        .collect();
    if d.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    d.sort_by(f64::total_cmp);
    let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize] / 1e3;
    (at(0.50), at(0.99))
}

/// When the requests in h2load's per-request log ran: from the first
/// start to the last end, in seconds (0 if none).
pub fn span(log: &str) -> f64 {
    let (mut first, mut last) = (u64::MAX, 0u64);
    for l in log.lines() {
        let mut f = l.split('\t');
        let (Some(start), Some(_), Some(took)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (Ok(start), Ok(took)) = (start.trim().parse::<u64>(), took.trim().parse::<u64>())
        else {
            continue;
        };
        first = first.min(start);
        last = last.max(start + took);
    }
    if first > last {
        0.0
    } else {
        (last - first) as f64 / 1e6
    }
}

/// `n` requests cut into `k` contiguous shares as even as possible; no
/// share is empty.
pub fn shares(n: usize, k: usize) -> Vec<std::ops::Range<usize>> {
    let k = k.clamp(1, n.max(1));
    (0..k)
        .map(|i| (i * n / k)..((i + 1) * n / k))
        .filter(|r| !r.is_empty())
        .collect()
}

/// One replay of `uris` (full URIs, in the order one pull asked for
/// them, all naming the same server) at `concurrency`, spread `how`.
/// h2load's `-i` starts every client at the first URI, so one h2load with
/// `-c 64` asks 64 times for the first 64th of the mix ([`Replay::Shared`]);
/// for every URI once ([`Replay::Split`]) each connection is an h2load of
/// its own with its own contiguous share, all started together. Pinned to
/// `cpu` if given; counts are summed, the time is the span of all the
/// requests, and the percentiles are over all of them.
pub fn replay(
    uris: &[String],
    how: Replay,
    proto: Proto,
    concurrency: u32,
    cpu: Option<usize>,
    log: &Path,
    timeout: Duration,
) -> Result<(Counts, (f64, f64))> {
    let (clients, streams) = shape(proto, concurrency);
    // Shared: one h2load with every connection, over the whole list.
    let (processes, per_process) = match how {
        Replay::Split => (clients as usize, 1),
        Replay::Shared => (1, clients),
    };
    let dir = log.with_extension("d");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut running = Vec::new();
    for (i, share) in shares(uris.len(), processes).into_iter().enumerate() {
        let list = dir.join(format!("{i}.uris"));
        let n = share.len();
        let text: String = uris[share].iter().map(|u| format!("{u}\n")).collect();
        std::fs::write(&list, text).with_context(|| format!("writing {}", list.display()))?;
        let mut cmd = match cpu {
            Some(c) => {
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", &c.to_string(), "h2load"]);
                cmd
            }
            None => Command::new("h2load"),
        };
        cmd.arg("-i")
            .arg(&list)
            .args(["-n", &n.to_string(), "-c", &per_process.to_string()])
            .args(["-m", &streams.min(n as u32).to_string()])
            .arg("--log-file")
            .arg(dir.join(format!("{i}.tsv")));
        if proto == Proto::H1 {
            cmd.arg("--h1");
        }
        let out = dir.join(format!("{i}.out"));
        running.push(std::thread::spawn(move || {
            super::super::run_bounded(&mut cmd, &out, timeout).map(|_| out)
        }));
    }
    let outs: Vec<Result<PathBuf>> = running
        .into_iter()
        .map(|t| {
            t.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("an h2load thread panicked")))
        })
        .collect();
    let (mut counts, mut text, mut lat) = (Counts::default(), String::new(), String::new());
    for out in outs {
        let out = out?;
        let o =
            std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
        let c = parse(&o).with_context(|| format!("h2load output in {}", out.display()))?;
        counts.done += c.done;
        counts.succeeded += c.succeeded;
        counts.errors += c.errors;
        counts.bytes += c.bytes;
        counts.seconds = counts.seconds.max(c.seconds);
        text.push_str(&o);
        lat.push_str(&std::fs::read_to_string(out.with_extension("tsv")).unwrap_or_default());
    }
    let took = span(&lat);
    if took > 0.0 {
        counts.seconds = took;
    }
    std::fs::write(log, text).with_context(|| format!("writing {}", log.display()))?;
    // The per-request logs are large at full scale and read once.
    let _ = std::fs::remove_dir_all(&dir);
    Ok((counts, percentiles(&lat)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "\
starting benchmark...
finished in 2.50s, 13144.40 req/s, 71.99MB/s
requests: 32861 total, 32861 started, 32860 done, 32850 succeeded, 1 failed, 2 errored, 3 timeout
status codes: 32850 2xx, 4 3xx, 5 4xx, 1 5xx
traffic: 179.97MB (188714925) total, 1.03MB (1079231) headers (space savings 0.00%), 178.64MB (187320514) data
";

    #[test]
    fn parses_the_summary() {
        let c = parse(OUT).unwrap();
        assert_eq!(
            c,
            Counts {
                seconds: 2.5,
                done: 32860,
                succeeded: 32850,
                errors: 1 + 2 + 3 + 4 + 5 + 1,
                bytes: 188_714_925,
            }
        );
        assert!(parse("starting benchmark...\n").is_err());
    }

    #[test]
    fn durations() {
        let cases = [("2.50s", 2.5), ("450.5ms", 0.4505), ("89us", 89e-6)];
        for (t, want) in cases {
            assert!((parse_duration(t).unwrap() - want).abs() < 1e-12, "{t}");
        }
        assert!(parse_duration("3m").is_err());
    }

    #[test]
    fn shapes_and_percentiles() {
        let cases = [
            (Proto::H1, 64, (64, 1)),
            (Proto::H2c, 8, (1, 8)),
            (Proto::H2c, 64, (4, 16)),
            (Proto::H2c, 256, (16, 16)),
        ];
        for (p, c, want) in cases {
            assert_eq!(shape(p, c), want, "{p:?} {c}");
        }
        let log: String = (1..=100)
            .map(|i| format!("0\t200\t{}\n", i * 1000))
            .collect();
        assert_eq!(percentiles(&log), (51.0, 99.0));
        assert!(percentiles("").0.is_nan());
    }

    #[test]
    fn every_request_once_in_contiguous_shares() {
        // (requests, connections, shares as (start, end))
        type Case = (usize, usize, &'static [(usize, usize)]);
        let cases: &[Case] = &[
            (10, 3, &[(0, 3), (3, 6), (6, 10)]),
            (4, 4, &[(0, 1), (1, 2), (2, 3), (3, 4)]),
            (2, 5, &[(0, 1), (1, 2)]),
            (7, 1, &[(0, 7)]),
            (0, 3, &[]),
        ];
        for (n, k, want) in cases {
            let got: Vec<_> = shares(*n, *k).iter().map(|r| (r.start, r.end)).collect();
            assert_eq!(got, *want, "{n} in {k}");
        }
    }

    #[test]
    fn span_runs_from_the_first_start_to_the_last_end() {
        let log = "1000000\t200\t500\n1000100\t200\t2000000\nnot a line\n1500000\t200\t10\n";
        assert!((span(log) - 2.0001).abs() < 1e-9, "{}", span(log));
        assert_eq!(span(""), 0.0);
    }
}
