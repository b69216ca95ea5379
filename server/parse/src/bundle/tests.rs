//! The streaming parser's caps: each bound refused with an error naming
//! it, a manifest just inside every bound accepted.

use super::*;

/// A manifest whose `releases` and `files` are the given JSON text.
fn doc(source: &str, releases: &str, files: &str) -> String {
    format!(
        r#"{{"kind":"{KIND}","format":{FORMAT},"source":"{source}","summary_sha256":"","summary_signed":false,"releases":[{releases}],"files":{{{files}}}}}"#
    )
}

fn release(refs: &[&str]) -> String {
    let refs: Vec<String> = refs.iter().map(|r| format!("{r:?}")).collect();
    format!(
        r#"{{"commit":"{}","refs":[{}],"version":null,"timestamp":1}}"#,
        "a".repeat(64),
        refs.join(",")
    )
}

fn releases(n: usize, refs_each: usize) -> String {
    let names: Vec<String> = (0..refs_each).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    vec![release(&names); n].join(",")
}

// long-fn: a table of manifests, one row a bound
#[test]
fn every_bound_is_refused_and_named() {
    let many = |n: usize| vec!["\"a\""; n].join(",");
    let file = r#""summary":{"sha256":"00","size":1}"#;
    // (case, manifest, the error says; None: accepted)
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("minimal", doc("s", "", file), None),
        (
            "at the refs cap",
            doc("s", &releases(1, MAX_REFS), ""),
            None,
        ),
        (
            "at the releases cap",
            doc("s", &releases(MAX_RELEASES, 0), ""),
            None,
        ),
        (
            "refs over the cap in one release",
            doc(
                "s",
                &format!(
                    r#"{{"commit":"","refs":[{}],"timestamp":0}}"#,
                    many(MAX_REFS + 1)
                ),
                "",
            ),
            Some("more than 100000 refs in one release"),
        ),
        (
            "refs over the cap across releases",
            doc("s", &releases(2, MAX_REFS / 2 + 1), ""),
            Some("more than 100000 refs across the releases"),
        ),
        (
            "releases over the cap",
            doc("s", &releases(MAX_RELEASES + 1, 0), ""),
            Some("more than 4096 releases"),
        ),
        (
            "an empty ref name",
            doc("s", &release(&[""]), ""),
            Some("ref"),
        ),
        (
            "a ref name past ostree's limit",
            doc("s", &release(&[&"a".repeat(1025)]), ""),
            Some("over the 1024 byte limit"),
        ),
        (
            "a source past its limit",
            doc(&"s".repeat(MAX_TEXT + 1), "", ""),
            Some("a text field of 4097 bytes, over the 4096 byte limit"),
        ),
        (
            "a checksum past its limit",
            doc(
                "s",
                "",
                &format!(r#""summary":{{"sha256":"{}","size":1}}"#, "0".repeat(65)),
            ),
            Some("a checksum of 65 bytes"),
        ),
        (
            "a path climbing out",
            doc("s", "", r#""../etc/passwd":{"sha256":"","size":0}"#),
            Some("not an archive repo path"),
        ),
        (
            "a path past its limit",
            doc(
                "s",
                "",
                &format!(
                    r#""refs/heads/{}":{{"sha256":"","size":0}}"#,
                    "a".repeat(MAX_PATH)
                ),
            ),
            Some("file path"),
        ),
        (
            "trailing bytes",
            format!("{} {{}}", doc("s", "", "")),
            Some("trailing characters"),
        ),
        (
            "an unknown field",
            r#"{"kind":"x","extra":1}"#.to_owned(),
            Some("unknown field"),
        ),
        (
            "another kind",
            doc("s", "", "").replace(KIND, "other"),
            Some("kind \"other\""),
        ),
    ];
    for (case, text, says) in cases {
        let got = BundleManifest::parse(text.as_bytes(), "m");
        match (says, got) {
            (None, Ok(_)) => {}
            (None, Err(e)) => panic!("{case}: refused: {e:#}"),
            (Some(s), Ok(_)) => panic!("{case}: accepted, expected {s:?}"),
            (Some(s), Err(e)) => {
                let e = format!("{e:#}");
                assert!(e.contains(s), "{case}: {e}");
                assert!(
                    e.starts_with("m: "),
                    "{case}: the error names the file: {e}"
                );
            }
        }
    }
}

#[test]
fn an_endless_manifest_stops_at_the_size_limit() {
    // Whitespace forever: valid JSON so far at every byte.
    let endless = std::io::Read::chain(&b"{\"kind\":"[..], std::io::repeat(b' '));
    let e = format!("{:#}", BundleManifest::read_from(endless, "m").unwrap_err());
    assert!(
        e.contains(&format!("over the {MAX_MANIFEST_SIZE} byte limit")),
        "{e}"
    );
}

#[test]
fn what_is_written_reads_back_and_oversized_lists_are_not_written() {
    let mut m = BundleManifest::parse(doc("s", &release(&["os/x"]), "").as_bytes(), "m").unwrap();
    assert_eq!(
        BundleManifest::parse(&m.to_bytes().unwrap(), "again").unwrap(),
        m
    );
    m.releases = vec![m.releases[0].clone(); MAX_RELEASES + 1];
    let e = format!("{:#}", m.to_bytes().unwrap_err());
    assert!(e.contains("4097 releases, over the limit of 4096"), "{e}");
}
