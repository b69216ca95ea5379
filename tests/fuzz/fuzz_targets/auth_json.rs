//! auth.json / docker config.json: credentials are `user:password` split
//! at the first colon, keyed by a host or namespace without a scheme.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_parse::source::fuzzing::auth_json;

fuzz_target!(|data: &[u8]| {
    let Ok(creds) = auth_json(data) else { return };
    for (key, user, _password) in creds {
        assert!(!user.contains(':'), "{user:?}");
        assert!(
            !key.starts_with("https://") && !key.starts_with("http://"),
            "{key:?}"
        );
        assert!(!key.ends_with('/'), "{key:?}");
    }
});
