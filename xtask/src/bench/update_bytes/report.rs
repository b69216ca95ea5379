//! What `bench update-bytes` measures and how it reads: the registry's
//! access log (bytes of blob bodies sent), the results JSON and the table.
//! Pure: text in, values out.

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
    pub arms: Vec<ArmResult>,
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
}

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
    // host - - [date] "GET /v2/NAME/blobs/sha256:HEX HTTP/1.1" STATUS BYTES "ref" "agent"
    let (_, rest) = line.split_once('"')?;
    let (request, rest) = rest.split_once('"')?;
    let mut req = request.split_whitespace();
    if req.next()? != "GET" || !req.next()?.contains("/blobs/sha256:") {
        return None;
    }
    let mut fields = rest.split_whitespace();
    let status = fields.next()?;
    let bytes = fields.next()?.parse().ok()?;
    matches!(status, "200" | "206").then_some(bytes)
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
            arms: vec![
                arm("importer", 1000),
                arm("ostree", 250),
                arm("oscontent", 240),
            ],
        };
        assert_eq!(u.ostree_over_importer(), Some(0.25));
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
        assert_eq!(t.matches("| 5% (3 pkgs").count(), 3, "{t}");
    }
}
