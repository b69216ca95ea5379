//! Entry paths of an ostree-native layer (ostree-ext's tar format): an
//! object name is exactly the checksum its path spells.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_parse::source::fuzzing::native_path;
use oscontent_parse::source::native_path::Place;

fuzz_target!(|data: &[u8]| {
    let Ok(place) = native_path(data) else { return };
    // As the unpacker splits it: empty and `.` components go.
    let text: Vec<String> = String::from_utf8_lossy(data)
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
        .collect();
    let text = text.join("/");
    let spelled = |c: &oscontent_format::Checksum| {
        let hex = c.to_hex();
        assert!(
            text.contains(&format!("{}/{}.", &hex[..2], &hex[2..])) || text.ends_with(&hex[2..]),
            "{text:?} named {hex}"
        );
    };
    match &place {
        Place::Object(o) => spelled(&o.checksum),
        Place::Xattrs(c) | Place::XattrsLink(c) | Place::XattrsRef(c) | Place::XattrsBlob(c) => {
            spelled(c)
        }
        Place::Ignored => {}
    }
});
