//! registries.conf, then the endpoints it gives an image: every endpoint
//! is a host and a repository of plain components.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_fuzz::plain_path;
use oscontent_parse::source::fuzzing::registries_conf;

const IMAGES: [(&str, &str); 3] = [
    ("quay.io", "openshift/release"),
    ("registry.example.com:5000", "os/image"),
    ("10.0.0.1", "x"),
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for (registry, repository) in IMAGES {
        for by_digest in [false, true] {
            let Ok(eps) = registries_conf(text, registry, repository, by_digest) else {
                continue;
            };
            assert!(!eps.is_empty(), "at least the primary");
            for e in eps {
                assert!(!e.registry.is_empty() && !e.registry.contains('/'), "{e:?}");
                assert!(plain_path(&e.repository), "{e:?}");
            }
        }
    }
});
