//! What a libFuzzer run printed, read back (pure): its last status line
//! (`#N DONE cov: C ft: F corp: K/Bb ...`), the final stats
//! (`-print_final_stats=1`), and whether and how it failed.

use std::path::PathBuf;

/// One target's run, as libFuzzer reported it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Inputs executed.
    pub execs: u64,
    /// Code edges covered (`cov:`).
    pub coverage: u64,
    /// Coverage features (`ft:`: edges, counters, comparisons).
    pub features: u64,
    /// Inputs in the corpus at the end (`corp:`).
    pub corpus: u64,
    /// The error libFuzzer reported: a crash (panic, signal), a timeout,
    /// an out-of-memory; `None` if the run ended cleanly.
    pub finding: Option<String>,
    /// Where libFuzzer wrote the input that failed.
    pub artifact: Option<PathBuf>,
}

/// The number after `key` in a status line (`cov: 123`, `corp: 45/6b`).
fn field(line: &str, key: &str) -> Option<u64> {
    let rest = line.split(key).nth(1)?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Reads a libFuzzer log.
pub fn parse(log: &str) -> Stats {
    let mut s = Stats::default();
    for line in log.lines() {
        if let Some(n) = line.strip_prefix("stat::number_of_executed_units:") {
            s.execs = n.trim().parse().unwrap_or(s.execs);
        } else if line.starts_with('#') && line.contains("cov:") {
            s.execs = s.execs.max(field(line, "#").unwrap_or(0));
            s.coverage = field(line, "cov:").unwrap_or(s.coverage);
            s.features = field(line, "ft:").unwrap_or(s.features);
            s.corpus = field(line, "corp:").unwrap_or(s.corpus);
        } else if let Some(e) = line.split("ERROR: libFuzzer: ").nth(1) {
            s.finding.get_or_insert_with(|| e.trim().to_owned());
        } else if let Some(p) = line.split("Test unit written to ").nth(1) {
            s.artifact = Some(PathBuf::from(p.trim()));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_clean_and_failed_runs() {
        let clean = "INFO: Seed: 1\n\
            #2\tINITED cov: 10 ft: 11 corp: 3/120b exec/s: 0 rss: 30Mb\n\
            #4096\tpulse  cov: 40 ft: 90 corp: 9/1Kb lim: 4096 exec/s: 2048 rss: 31Mb\n\
            #50000\tDONE   cov: 52 ft: 130 corp: 14/2Kb lim: 4096 exec/s: 5000 rss: 32Mb\n\
            stat::number_of_executed_units: 50012\n\
            stat::peak_rss_mb: 32\n";
        let crash = "#8\tNEW    cov: 5 ft: 5 corp: 2/9b exec/s: 0 rss: 30Mb\n\
            thread '<unnamed>' panicked at fuzz_targets/x.rs:3:5:\n\
            ==77== ERROR: libFuzzer: deadly signal\n\
            artifact_prefix='/t/fuzz/artifacts/x/'; Test unit written to /t/fuzz/artifacts/x/crash-ab12\n";
        let oom = "==9== ERROR: libFuzzer: out-of-memory (used: 2100Mb; exceeds: 2048Mb)\n\
            Test unit written to /a/oom-cd34\n";
        let table = [
            (
                clean,
                Stats {
                    execs: 50012,
                    coverage: 52,
                    features: 130,
                    corpus: 14,
                    ..Stats::default()
                },
            ),
            (
                crash,
                Stats {
                    execs: 8,
                    coverage: 5,
                    features: 5,
                    corpus: 2,
                    finding: Some("deadly signal".into()),
                    artifact: Some("/t/fuzz/artifacts/x/crash-ab12".into()),
                },
            ),
            (
                oom,
                Stats {
                    finding: Some("out-of-memory (used: 2100Mb; exceeds: 2048Mb)".into()),
                    artifact: Some("/a/oom-cd34".into()),
                    ..Stats::default()
                },
            ),
            ("", Stats::default()),
        ];
        for (log, want) in table {
            assert_eq!(parse(log), want, "{log}");
        }
    }
}
