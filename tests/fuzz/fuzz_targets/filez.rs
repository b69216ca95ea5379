//! An archive content object (`.filez`) as served: the 8-byte prefix, the
//! header, then deflate. The header converts to the framing libostree
//! writes, whose own prefix must parse back to the same length.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::content::{header_len, ArchiveHeader, HEADER_PREFIX_LEN};

fuzz_target!(|data: &[u8]| {
    let Some((prefix, rest)) = data.split_first_chunk::<HEADER_PREFIX_LEN>() else {
        return;
    };
    let Ok(len) = header_len(prefix) else { return };
    let Some(header) = rest.get(..len) else {
        return;
    };
    let Ok(h) = ArchiveHeader::parse(header) else {
        return;
    };
    let stream = h.content_stream_prefix();
    let back: &[u8; HEADER_PREFIX_LEN] = stream[..HEADER_PREFIX_LEN].try_into().expect("8 bytes");
    assert_eq!(header_len(back).ok(), Some(h.file_header.len()));
    assert_eq!(&stream[HEADER_PREFIX_LEN..], &h.file_header[..]);
    let _ = h.content_stream_len();
});
