//! Which deltas a generation gets (`--deltas`): pure, from its refs and
//! the age of each commit they name.

use crate::ages::RefAge;
use crate::ages::VERSION_REF_PREFIX;
use oscontent_format::DeltaName;
use std::collections::BTreeSet;

/// `--deltas`: which static deltas the server generates between the
/// releases it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DeltaMode {
    /// None: nodes fetch loose objects.
    None,
    /// To the newest release of each ref, from every older release.
    #[default]
    Latest,
    /// Between every pair of releases, older to newer.
    All,
}

/// The from → to deltas `mode` asks for. The targets of `latest` are what
/// the refs that follow a stream (not `version/…`, which name one release
/// each) point at, or, with none, the newest release; every release older
/// than a target is a source. Sorted, no duplicates.
pub fn pairs(mode: DeltaMode, refs: &[RefAge]) -> Vec<DeltaName> {
    let mut releases: Vec<&RefAge> = Vec::new();
    for r in refs {
        if releases.iter().all(|k| k.commit != r.commit) {
            releases.push(r);
        }
    }
    let targets: Vec<&RefAge> = match mode {
        DeltaMode::None => return Vec::new(),
        DeltaMode::All => releases.clone(),
        DeltaMode::Latest => {
            let streams: Vec<&RefAge> = refs
                .iter()
                .filter(|r| !r.name.starts_with(VERSION_REF_PREFIX))
                .collect();
            if streams.is_empty() {
                releases
                    .iter()
                    .copied()
                    .max_by(|a, b| a.age().order(&b.age()))
                    .into_iter()
                    .collect()
            } else {
                streams
            }
        }
    };
    let mut out = BTreeSet::new();
    for to in targets {
        for from in releases.iter().filter(|f| f.age().order(&to.age()).is_lt()) {
            out.insert(DeltaName {
                from: Some(from.commit),
                to: to.commit,
            });
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use oscontent_format::Checksum;

    fn c(n: u8) -> Checksum {
        Checksum::from([n; 32])
    }

    fn r(name: &str, commit: u8, timestamp: u64, version: &str) -> RefAge {
        RefAge {
            name: name.into(),
            commit: c(commit),
            timestamp,
            version: Some(version.into()),
        }
    }

    fn d(from: u8, to: u8) -> DeltaName {
        DeltaName {
            from: Some(c(from)),
            to: c(to),
        }
    }

    #[test]
    fn pairs_by_mode() {
        let three = vec![
            r("version/1", 1, 100, "1"),
            r("version/2", 2, 200, "2"),
            r("version/3", 3, 300, "3"),
            r("os/stable", 3, 300, "3"),
        ];
        let two_streams = vec![
            r("version/1", 1, 100, "1"),
            r("version/2", 2, 200, "2"),
            r("version/3", 3, 300, "3"),
            r("os/stable", 3, 300, "3"),
            r("os/testing", 2, 200, "2"),
        ];
        let versions_only = vec![r("version/2", 2, 200, "2"), r("version/1", 1, 100, "1")];
        let same_time = vec![r("version/a", 1, 100, "1.0"), r("version/b", 2, 100, "1.1")];
        // Versions compare as CoreOS versions, not as text ("10" > "9").
        let numeric = vec![
            r("version/b", 2, 100, "41.10"),
            r("version/a", 1, 100, "41.9"),
        ];
        let one = vec![r("version/1", 1, 100, "1"), r("os/stable", 1, 100, "1")];
        let table: Vec<(&str, DeltaMode, &[RefAge], Vec<DeltaName>)> = vec![
            ("none", DeltaMode::None, &three, vec![]),
            (
                "latest: to the stream's commit",
                DeltaMode::Latest,
                &three,
                vec![d(1, 3), d(2, 3)],
            ),
            (
                "all: every older pair",
                DeltaMode::All,
                &three,
                vec![d(1, 2), d(1, 3), d(2, 3)],
            ),
            (
                "latest: each stream's commit",
                DeltaMode::Latest,
                &two_streams,
                vec![d(1, 2), d(1, 3), d(2, 3)],
            ),
            (
                "latest: the newest when no stream",
                DeltaMode::Latest,
                &versions_only,
                vec![d(1, 2)],
            ),
            (
                "same timestamp: version decides",
                DeltaMode::Latest,
                &same_time,
                vec![d(1, 2)],
            ),
            (
                "same timestamp: versions by number",
                DeltaMode::Latest,
                &numeric,
                vec![d(1, 2)],
            ),
            ("one release: nothing", DeltaMode::Latest, &one, vec![]),
            ("one release, all: nothing", DeltaMode::All, &one, vec![]),
            ("no refs", DeltaMode::All, &[], vec![]),
        ];
        for (what, mode, refs, want) in table {
            assert_eq!(pairs(mode, refs), want, "{what}");
        }
    }
}
