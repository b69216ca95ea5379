//! One `h2load` replay of the request mix and what it measured: its
//! summary lines parsed (pure, table-tested), latencies from its
//! per-request log.

use anyhow::{ensure, Context, Result};
use std::path::Path;
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

/// One replay of `mix` (a file of URIs, the first naming the server):
/// `requests` requests at `concurrency`, h2load pinned to `cpu` if given.
pub fn replay(
    mix: &Path,
    proto: Proto,
    concurrency: u32,
    requests: usize,
    cpu: Option<usize>,
    log: &Path,
    timeout: Duration,
) -> Result<(Counts, (f64, f64))> {
    let (clients, streams) = shape(proto, concurrency);
    let per_request = log.with_extension("requests.tsv");
    let mut cmd = match cpu {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", &c.to_string(), "h2load"]);
            cmd
        }
        None => Command::new("h2load"),
    };
    cmd.arg("-i")
        .arg(mix)
        .args(["-n", &requests.to_string()])
        .args(["-c", &clients.to_string()])
        .args(["-m", &streams.to_string()])
        .arg("--log-file")
        .arg(&per_request);
    if proto == Proto::H1 {
        cmd.arg("--h1");
    }
    let _ = std::fs::remove_file(log);
    super::super::run_bounded(&mut cmd, log, timeout)?;
    let out = std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let counts = parse(&out).with_context(|| format!("h2load output in {}", log.display()))?;
    let lat = std::fs::read_to_string(&per_request).unwrap_or_default();
    let p = percentiles(&lat);
    // The per-request log is large at full scale and read once.
    let _ = std::fs::remove_file(&per_request);
    Ok((counts, p))
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
}
