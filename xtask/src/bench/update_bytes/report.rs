//! What `bench update-bytes` measures and how it reads: the registry's
//! access log (bytes of blob bodies sent), the results JSON and the table.
//! Pure: text in, values out.

use crate::bench::new_objects::NewObjects;
use serde::Serialize;

/// One arm's cost of the v1 → v2 step on the node.
#[derive(Debug, Clone, Serialize)]
pub struct ArmResult {
    /// `importer`, `ostree` or `oscontent`.
    pub arm: String,
    /// Bytes the node downloaded, counted at the source (registry blob
    /// bodies for the importer, the server's response bytes otherwise).
    pub downloaded_bytes: u64,
    /// What the tool itself reports (the importer's layer sizes; None
    /// where it does not say).
    pub reported_bytes: Option<u64>,
    /// Bytes written to the node's device during the step (syncfs included).
    pub written_bytes: u64,
    pub seconds: f64,
}

/// The staged arm's parts: `oscontent stage` of v2 from the server, then
/// the importer's import of v2 from the registry.
#[derive(Debug, Clone, Serialize)]
pub struct StagedParts {
    /// What the registry sent the node (the server's own requests left out).
    pub registry: RegistryBytes,
    /// Response bytes the server sent during the stage.
    pub oscontent_bytes: u64,
    /// Layers the importer says it fetched after the stage (none is the
    /// point of staging).
    pub importer_fetched_layers: usize,
    /// Object sets (one per ostree layer) the stage fetched and wrote, and
    /// those it found already there (v1's layers, by the importer).
    pub object_sets_written: usize,
    pub object_sets_present: usize,
    pub stage_written_bytes: u64,
    pub import_written_bytes: u64,
    pub stage_seconds: f64,
    pub import_seconds: f64,
}

/// Body bytes a registry sent, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RegistryBytes {
    /// Layer blobs (digests the caller names as layers).
    pub layers: u64,
    /// Manifests, and blobs that are not layers (the config).
    pub manifest_and_config: u64,
}

/// One update (5% or 30%).
#[derive(Debug, Clone, Serialize)]
pub struct UpdateResult {
    pub share: f64,
    pub packages_changed: usize,
    pub files_rewritten: u64,
    pub v2_image_bytes: u64,
    pub layers: usize,
    /// Layers of v2 whose digest v1 lacks.
    pub layers_changed: usize,
    /// The objects v2 adds over v1 and their compressed (archive) bytes.
    pub new_objects: NewObjects,
    pub arms: Vec<ArmResult>,
    /// The breakdown of the `staged+importer` arm, when it ran.
    pub staged: Option<StagedParts>,
}

impl UpdateResult {
    fn arm(&self, name: &str) -> Option<&ArmResult> {
        self.arms.iter().find(|a| a.arm == name)
    }

    /// Stock `ostree pull` from oscontent against the importer: the target
    /// is at most 0.3 on the 5% update.
    pub fn ostree_over_importer(&self) -> Option<f64> {
        let a = self.arm("importer")?.downloaded_bytes;
        let b = self.arm("ostree")?.downloaded_bytes;
        (a > 0).then(|| b as f64 / a as f64)
    }

    /// What the stage fetched from oscontent over the new objects'
    /// compressed size: the target is at most 1.05.
    pub fn staged_over_new(&self) -> Option<f64> {
        let s = self.staged.as_ref()?;
        let n = self.new_objects.bytes;
        (n > 0).then(|| s.oscontent_bytes as f64 / n as f64)
    }

    /// Bytes written on the node by the stage and the import together over
    /// the importer's alone.
    pub fn staged_written_over_importer(&self) -> Option<f64> {
        let a = self.arm("importer")?.written_bytes;
        let b = self.arm(STAGED_ARM)?.written_bytes;
        (a > 0).then(|| b as f64 / a as f64)
    }
}

/// The arm that stages v2 from oscontent, then imports it with the importer.
pub const STAGED_ARM: &str = "staged+importer";

/// The run as written to `target/bench/update-bytes-<time>.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub started: String,
    pub git: Option<String>,
    pub kernel: String,
    pub scale: String,
    /// What the server served: `image` (the native image, streamed) or
    /// `repo` (the archive repo the images were encapsulated from).
    pub server_source: String,
    pub server_profile: String,
    pub updates: Vec<UpdateResult>,
}

/// Bytes of blob bodies the registry sent, from its access log (Apache
/// combined format, as distribution writes it): `GET .../blobs/sha256:...`
/// answered 200 or 206.
pub fn blob_bytes_sent(log: &str) -> u64 {
    log.lines().filter_map(blob_get_bytes).sum()
}

fn blob_get_bytes(line: &str) -> Option<u64> {
    let r = get_line(line)?;
    r.path.contains("/blobs/sha256:").then_some(r.bytes)
}

/// A `GET` the registry answered 200 or 206, from its access log.
struct Get<'a> {
    path: &'a str,
    bytes: u64,
    agent: &'a str,
}

fn get_line(line: &str) -> Option<Get<'_>> {
    // host - - [date] "GET /v2/NAME/blobs/sha256:HEX HTTP/1.1" STATUS BYTES "ref" "agent"
    let (_, rest) = line.split_once('"')?;
    let (request, rest) = rest.split_once('"')?;
    let mut req = request.split_whitespace();
    if req.next()? != "GET" {
        return None;
    }
    let path = req.next()?;
    let (fields, quoted) = rest.split_once('"').unwrap_or((rest, ""));
    let mut fields = fields.split_whitespace();
    let status = fields.next()?;
    let bytes = fields.next()?.parse().ok()?;
    // `"ref" "agent"`: the agent is the second quoted field.
    let agent = quoted.split('"').nth(2).unwrap_or("");
    matches!(status, "200" | "206").then_some(Get { path, bytes, agent })
}

/// Body bytes the registry sent to clients other than oscontent-server
/// (whose User-Agent is `oscontent-server/…`), split into the blobs named
/// in `layers` (`sha256:…`) and the rest: manifests and the config.
pub fn registry_bytes(log: &str, layers: &[&str]) -> RegistryBytes {
    let mut out = RegistryBytes::default();
    for g in log.lines().filter_map(get_line) {
        if g.agent.starts_with("oscontent-server/") {
            continue;
        }
        if let Some((_, digest)) = g.path.split_once("/blobs/") {
            if layers.contains(&digest) {
                out.layers += g.bytes;
            } else {
                out.manifest_and_config += g.bytes;
            }
        } else if g.path.contains("/manifests/") {
            out.manifest_and_config += g.bytes;
        }
    }
    out
}

/// The table for the terminal and RESULTS.md.
pub fn render(r: &Report) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0));
    let mut s = format!(
        "update-bytes ({} scale; server source: {}, {} build; {}; {})\n\n",
        r.scale,
        r.server_source,
        r.server_profile,
        r.git.as_deref().unwrap_or("no git"),
        r.kernel
    );
    s += "| update | arm | downloaded | tool reports | written on node | time |\n|---|---|---|---|---|---|\n";
    for u in &r.updates {
        for a in &u.arms {
            s += &format!(
                "| {:.0}% ({} pkgs, {} files; {} of {} layers new) | {} | {} | {} | {} | {:.1} s |\n",
                u.share * 100.0,
                u.packages_changed,
                u.files_rewritten,
                u.layers_changed,
                u.layers,
                a.arm,
                mib(a.downloaded_bytes),
                a.reported_bytes.map_or("-".into(), mib),
                mib(a.written_bytes),
                a.seconds
            );
        }
    }
    s += "\n";
    for u in &r.updates {
        if let Some(ratio) = u.ostree_over_importer() {
            let target = if (u.share - 0.05).abs() < 1e-9 {
                " (target <= 0.30)"
            } else {
                ""
            };
            s += &format!(
                "{:.0}% update: ostree / importer = {ratio:.3}{target}\n",
                u.share * 100.0
            );
        }
    }
    s += &render_staged(r);
    s
}

/// The `staged+importer` arm's breakdown against its targets.
fn render_staged(r: &Report) -> String {
    let mib = |b: u64| format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0));
    let kib = |b: u64| format!("{:.1} KiB", b as f64 / 1024.0);
    let ratio = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
    let mut s = String::new();
    for u in &r.updates {
        let Some(p) = &u.staged else { continue };
        if s.is_empty() {
            s += "\nstaged, then importer: a node that imported v1 with the importer runs `oscontent stage` of v2 (by digest) from oscontent-server, then the importer imports v2 from the registry.\n\n";
            s += "| update | registry: layers (target 0) | registry: manifest + config | oscontent (object sets fetched / present) | new objects (compressed) | oscontent / new (target <= 1.05) | written: stage + import | written / importer alone | time: stage + import |\n|---|---|---|---|---|---|---|---|---|\n";
        }
        s += &format!(
            "| {:.0}% | {} ({} layers fetched) | {} | {} ({} / {}) | {} ({} objects) | {} | {} + {} | {} | {:.1} + {:.1} s |\n",
            u.share * 100.0,
            mib(p.registry.layers),
            p.importer_fetched_layers,
            kib(p.registry.manifest_and_config),
            mib(p.oscontent_bytes),
            p.object_sets_written,
            p.object_sets_present,
            mib(u.new_objects.bytes),
            u.new_objects.count,
            ratio(u.staged_over_new()),
            mib(p.stage_written_bytes),
            mib(p.import_written_bytes),
            ratio(u.staged_written_over_importer()),
            p.stage_seconds,
            p.import_seconds,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_bodies_are_counted_from_the_access_log() {
        // (line, bytes it counts)
        let cases = [
            (
                r#"127.0.0.1 - - [23/Nov/2026:23:50:00 +0000] "GET /v2/native/blobs/sha256:ab HTTP/1.1" 200 1234 "" "skopeo""#,
                1234,
            ),
            (
                r#"127.0.0.1 - - [23/Nov/2026:23:50:00 +0000] "GET /v2/native/blobs/sha256:ab HTTP/1.1" 206 10 "" "skopeo""#,
                10,
            ),
            (
                r#"127.0.0.1 - - [x] "HEAD /v2/native/blobs/sha256:ab HTTP/1.1" 200 1234 "" "skopeo""#,
                0,
            ),
            (
                r#"127.0.0.1 - - [x] "GET /v2/native/manifests/v2 HTTP/1.1" 200 5000 "" "skopeo""#,
                0,
            ),
            (
                r#"127.0.0.1 - - [x] "GET /v2/native/blobs/sha256:ab HTTP/1.1" 404 19 "" "skopeo""#,
                0,
            ),
            (
                r#"127.0.0.1 - - [x] "GET /v2/native/blobs/sha256:ab HTTP/1.1" 307 0 "" "skopeo""#,
                0,
            ),
            ("time=\"2026\" level=info msg=\"response completed\"", 0),
            ("", 0),
        ];
        for (line, want) in cases {
            assert_eq!(blob_bytes_sent(line), want, "{line}");
        }
        let all: String = cases.iter().map(|(l, _)| format!("{l}\n")).collect();
        assert_eq!(blob_bytes_sent(&all), 1244);
    }

    #[test]
    fn the_ratio_and_the_table() {
        let arm = |arm: &str, b| ArmResult {
            arm: arm.into(),
            downloaded_bytes: b,
            reported_bytes: None,
            written_bytes: 2 * b,
            seconds: 1.0,
        };
        let u = UpdateResult {
            share: 0.05,
            packages_changed: 3,
            files_rewritten: 10,
            v2_image_bytes: 100,
            layers: 65,
            layers_changed: 4,
            new_objects: NewObjects {
                count: 7,
                bytes: 200,
            },
            arms: vec![
                arm("importer", 1000),
                arm("ostree", 250),
                arm("oscontent", 240),
                arm(STAGED_ARM, 250),
            ],
            staged: Some(StagedParts {
                registry: RegistryBytes {
                    layers: 0,
                    manifest_and_config: 3072,
                },
                oscontent_bytes: 205,
                importer_fetched_layers: 0,
                object_sets_written: 4,
                object_sets_present: 61,
                stage_written_bytes: 300,
                import_written_bytes: 200,
                stage_seconds: 1.0,
                import_seconds: 2.0,
            }),
        };
        assert_eq!(u.ostree_over_importer(), Some(0.25));
        assert_eq!(u.staged_over_new(), Some(1.025));
        assert_eq!(u.staged_written_over_importer(), Some(0.25));
        let r = Report {
            started: "t".into(),
            git: None,
            kernel: "k".into(),
            scale: "small".into(),
            server_source: "repo".into(),
            server_profile: "given".into(),
            updates: vec![u],
        };
        let t = render(&r);
        assert!(
            t.contains("ostree / importer = 0.250 (target <= 0.30)"),
            "{t}"
        );
        assert_eq!(t.matches("| 5% (3 pkgs").count(), 4, "{t}");
        assert!(
            t.contains("| 5% | 0.00 MiB (0 layers fetched) | 3.0 KiB |"),
            "{t}"
        );
        assert!(t.contains("(7 objects) | 1.025 |"), "{t}");
    }

    #[test]
    fn registry_bytes_split_layers_from_manifests_and_configs() {
        let line = |path: &str, status: u16, bytes: u64, agent: &str| {
            format!(
                r#"127.0.0.1 - - [23/Nov/2026:23:50:00 +0000] "GET {path} HTTP/1.1" {status} {bytes} "" "{agent}""#
            )
        };
        let log = [
            line("/v2/native/blobs/sha256:aa", 200, 1000, "skopeo/1.13"),
            line("/v2/native/blobs/sha256:bb", 206, 10, "skopeo/1.13"),
            line("/v2/native/blobs/sha256:cc", 200, 300, "skopeo/1.13"),
            line("/v2/native/manifests/sha256:dd", 200, 40, "skopeo/1.13"),
            line("/v2/native/manifests/v2", 404, 19, "skopeo/1.13"),
            // The server streaming the image is not the node.
            line(
                "/v2/native/blobs/sha256:aa",
                200,
                5000,
                "oscontent-server/0.1.0",
            ),
            line("/v2/native/manifests/v2", 200, 50, "oscontent-server/0.1.0"),
            line("/v2/", 200, 2, "skopeo/1.13"),
            r#"127.0.0.1 - - [x] "HEAD /v2/native/blobs/sha256:aa HTTP/1.1" 200 1000 "" "skopeo""#
                .to_owned(),
        ]
        .join("\n");
        let got = registry_bytes(&log, &["sha256:aa", "sha256:bb"]);
        assert_eq!(
            got,
            RegistryBytes {
                layers: 1010,
                manifest_and_config: 340
            }
        );
        // The total of blob bodies still counts every client.
        assert_eq!(blob_bytes_sent(&log), 6310);
    }
}
