//! The legacy unpacker's tar entry decoder (extension headers, paths,
//! kinds, whiteouts): nothing it lets through writes outside `srv/repo`,
//! and no link it keeps can lead out.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_fuzz::plain_component;
use oscontent_parse::source::fuzzing::tar_entries;
use oscontent_parse::source::Limits;

const DERIVED: [&[u8]; 5] = [
    b"summary",
    b"summary.sig",
    b"refs",
    b"deltas",
    b"delta-indexes",
];

/// `srv`, `srv/repo`, or below it.
fn in_repo(c: &[Vec<u8>]) -> bool {
    c.first().is_some_and(|s| s == b"srv") && c.get(1).is_none_or(|r| r == b"repo")
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_entries: 1000,
        max_extension_bytes: 64 << 10,
        ..Limits::default()
    };
    let Ok(entries) = tar_entries(data, &limits) else {
        return;
    };
    for e in entries {
        assert!(e.components.iter().all(|c| plain_component(c)), "{e:?}");
        assert!(e.components.len() <= limits.max_depth, "{e:?}");
        if let Some(victim) = &e.whiteout {
            assert!(in_repo(victim) && victim.len() >= 2, "{e:?}");
            continue;
        }
        assert!(in_repo(&e.components), "{e:?}");
        if let Some(name) = e.components.get(2) {
            let refs_dir = name == b"refs" && e.symlink.is_none() && e.hardlink.is_none();
            assert!(!DERIVED.contains(&&name[..]) || refs_dir, "{e:?}");
        }
        if let Some(t) = &e.symlink {
            assert!(
                !t.is_empty() && !t.starts_with(b"/") && !t.contains(&0),
                "{e:?}"
            );
            assert!(t.split(|&b| b == b'/').all(|c| c != b".."), "{e:?}");
        }
        if let Some(to) = &e.hardlink {
            assert!(in_repo(to) && to.len() >= 3, "{e:?}");
            assert!(to.iter().all(|c| plain_component(c)), "{e:?}");
        }
    }
});
