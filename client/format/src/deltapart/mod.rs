//! Static delta parts, checked before libostree applies them: a part file
//! is one compression byte (`0` none, `x` xz), then the payload
//! `(a(uuu)aa(ayay)ayay)`: file modes, xattr sets, raw data, and the op
//! stream that writes the part's objects (ostree
//! `src/libostree/ostree-repo-static-delta-private.h` names the opcodes,
//! `-processing.c` executes them; every argument is a LEB128 varint).
//!
//! libostree bounds none of what an op declares: a WRITE appends however
//! many bytes it names to the object OPEN created, and a BSPATCH allocates
//! the size OPEN gave. [`check_part_payload`] walks the op stream as
//! libostree will and refuses, before anything is written, any op that
//! would write past its object's declared size, declare more than the
//! caller's cap for that object, read outside the payload, name a mode or
//! xattr set the part lacks, or open more objects than the superblock
//! lists for the part; what it accepts writes at most
//! [`PartWrites::bytes`].

use crate::checksum::Checksum;
use crate::commit::read_varint;
use crate::error::FormatError;
use crate::variant::parse_normal;

/// The payload of a part, once uncompressed.
pub const PART_PAYLOAD_TYPE: &str = "(a(uuu)aa(ayay)ayay)";
/// Uncompressed payloads above this are refused: libostree maps a part
/// whole, and ostree's generator cuts parts at `max-chunk-size` (32 MiB
/// by default, what oscontent-server uses) plus at most one object of up
/// to `max-bsdiff-size` (128 MiB).
pub const MAX_PART_PAYLOAD: u64 = 256 << 20;
/// BSPATCH builds its whole output in memory (`g_malloc0` of the object's
/// size) before writing it: objects above this may not be patched.
pub const MAX_BSPATCH_SIZE: u64 = 256 << 20;

/// Room in a payload besides its objects' bytes (the mode and xattr
/// tables, the op stream, bsdiff's control blocks): per object, and in all.
const PER_OBJECT_SLACK: u64 = 4 << 10;
const PART_SLACK: u64 = 64 << 10;

const WHAT: &str = "delta part";

/// The most a payload may inflate to when its part declares `declared`
/// bytes of objects (a superblock's `uncompressed_size` is what ostree's
/// generator added up for the part's objects, not the payload's length)
/// and lists `objects` of them: that, plus the tables and op stream, and
/// an eighth for patches that came out larger than their object.
pub fn payload_allowance(declared: u64, objects: usize) -> u64 {
    PART_SLACK
        .saturating_add(PER_OBJECT_SLACK.saturating_mul(objects as u64))
        .saturating_add(declared / 8)
        .saturating_add(declared)
}

fn err(why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what: WHAT,
        why: why.into(),
    }
}

/// The compression byte a part file starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartCompression {
    None,
    Xz,
}

impl PartCompression {
    pub fn from_byte(b: u8) -> Result<Self, FormatError> {
        match b {
            0 => Ok(Self::None),
            b'x' => Ok(Self::Xz),
            other => Err(err(format!("unknown compression byte {other:#04x}"))),
        }
    }

    pub fn byte(self) -> u8 {
        match self {
            Self::None => 0,
            Self::Xz => b'x',
        }
    }
}

/// libostree's op codes (`OstreeStaticDeltaOpCode`).
mod op {
    pub const OPEN_SPLICE_AND_CLOSE: u8 = b'S';
    pub const OPEN: u8 = b'o';
    pub const WRITE: u8 = b'w';
    pub const SET_READ_SOURCE: u8 = b'r';
    pub const UNSET_READ_SOURCE: u8 = b'R';
    pub const CLOSE: u8 = b'c';
    pub const BSPATCH: u8 = b'B';
}

/// libostree's object type numbers a part may write.
const OBJTYPE_FILE: u8 = 1;
const OBJTYPE_LAST_META: u8 = 4;

/// What an accepted part writes at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PartWrites {
    /// Objects it opens.
    pub objects: u64,
    /// The sum of their declared sizes: what its ops write, at most.
    pub bytes: u64,
}

/// The shape of a payload the op stream refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadShape {
    /// Entries of the mode array.
    pub modes: u64,
    /// Entries of the xattr array.
    pub xattrs: u64,
    /// Bytes of raw data.
    pub raw_len: u64,
}

/// Checks an uncompressed payload against the part's object list (from
/// the verified superblock) and `cap(objtype, checksum)`, the most bytes
/// the caller lets that object declare.
pub fn check_part_payload(
    payload: &[u8],
    objects: &[(u8, Checksum)],
    cap: impl Fn(u8, &Checksum) -> u64,
) -> Result<PartWrites, FormatError> {
    if payload.len() as u64 > MAX_PART_PAYLOAD {
        return Err(err(format!(
            "payload of {} bytes exceeds the {MAX_PART_PAYLOAD} byte limit",
            payload.len()
        )));
    }
    let v = parse_normal(payload, PART_PAYLOAD_TYPE, WHAT)?;
    let shape = PayloadShape {
        modes: v.child_value(0).n_children() as u64,
        xattrs: v.child_value(1).n_children() as u64,
        raw_len: v.child_value(2).size() as u64,
    };
    let ops = v.child_value(3);
    check_ops(ops.data(), shape, objects, cap)
}

/// The object being written between OPEN and CLOSE.
#[derive(Debug)]
struct Open {
    size: u64,
    written: u64,
}

/// Where the op stream is, for errors.
struct Ops<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Index of the op being read, and its name.
    n: usize,
    name: &'static str,
}

impl<'a> Ops<'a> {
    fn fail(&self, why: impl std::fmt::Display) -> FormatError {
        err(format!("op {} ({}): {why}", self.n, self.name))
    }

    fn varint(&mut self, what: &str) -> Result<u64, FormatError> {
        let rest = &self.bytes[self.pos..];
        let (v, after) =
            read_varint(rest).ok_or_else(|| self.fail(format!("truncated varint ({what})")))?;
        self.pos += rest.len() - after.len();
        Ok(v)
    }
}

/// `[offset, offset + len)` must lie within the raw data.
fn within(ops: &Ops, shape: PayloadShape, offset: u64, len: u64) -> Result<(), FormatError> {
    match offset.checked_add(len) {
        Some(end) if end <= shape.raw_len => Ok(()),
        _ => Err(ops.fail(format!(
            "reads {len} bytes at {offset}, outside the {} bytes of raw data",
            shape.raw_len
        ))),
    }
}

// long-fn: one walk of the op stream with its checks in line, as libostree executes it; split, one op's checks would scatter
/// The op stream, walked as libostree executes it (see the module doc).
pub fn check_ops(
    bytes: &[u8],
    shape: PayloadShape,
    objects: &[(u8, Checksum)],
    cap: impl Fn(u8, &Checksum) -> u64,
) -> Result<PartWrites, FormatError> {
    let mut ops = Ops {
        bytes,
        pos: 0,
        n: 0,
        name: "",
    };
    let mut next_object = 0usize;
    let mut open: Option<Open> = None;
    let mut read_source = false;
    let mut out = PartWrites::default();
    // The next listed object, which OPEN and OPEN_SPLICE_AND_CLOSE write,
    // and the size it may declare.
    while ops.pos < bytes.len() {
        let code = bytes[ops.pos];
        ops.pos += 1;
        ops.name = match code {
            op::OPEN_SPLICE_AND_CLOSE => "open-splice-and-close",
            op::OPEN => "open",
            op::WRITE => "write",
            op::SET_READ_SOURCE => "set-read-source",
            op::UNSET_READ_SOURCE => "unset-read-source",
            op::CLOSE => "close",
            op::BSPATCH => "bspatch",
            other => return Err(err(format!("op {}: unknown opcode {other:#04x}", ops.n))),
        };
        let needs_open = matches!(code, op::WRITE | op::BSPATCH | op::CLOSE);
        if needs_open && open.is_none() {
            return Err(ops.fail("no object is open"));
        }
        if matches!(code, op::OPEN_SPLICE_AND_CLOSE | op::OPEN) && open.is_some() {
            return Err(ops.fail("an object is already open"));
        }
        match code {
            op::OPEN_SPLICE_AND_CLOSE => {
                let meta = objects
                    .get(next_object)
                    .is_some_and(|(t, _)| *t != OBJTYPE_FILE);
                let (size, offset) = if meta {
                    let len = ops.varint("length")?;
                    (len, ops.varint("offset")?)
                } else {
                    mode_and_xattrs(&mut ops, shape)?;
                    let size = ops.varint("size")?;
                    (size, ops.varint("offset")?)
                };
                start_object(&ops, objects, &cap, &mut next_object, &mut out, size, false)?;
                within(&ops, shape, offset, size)?;
                read_source = false;
            }
            op::OPEN => {
                mode_and_xattrs(&mut ops, shape)?;
                let size = ops.varint("size")?;
                start_object(&ops, objects, &cap, &mut next_object, &mut out, size, true)?;
                open = Some(Open { size, written: 0 });
            }
            op::WRITE => {
                let size = ops.varint("size")?;
                let offset = ops.varint("offset")?;
                if !read_source {
                    within(&ops, shape, offset, size)?;
                }
                let o = open.as_mut().expect("checked above");
                o.written = o
                    .written
                    .checked_add(size)
                    .filter(|w| *w <= o.size)
                    .ok_or_else(|| {
                        ops.fail(format!(
                            "writes {size} bytes after {}, past the {} bytes its object declared",
                            o.written, o.size
                        ))
                    })?;
            }
            op::SET_READ_SOURCE => {
                let offset = ops.varint("offset")?;
                within(&ops, shape, offset, Checksum::LEN as u64)?;
                read_source = true;
            }
            op::UNSET_READ_SOURCE => read_source = false,
            op::CLOSE => {
                let o = open.take().expect("checked above");
                if o.written != o.size {
                    return Err(ops.fail(format!(
                        "closes an object of {} bytes after writing {}",
                        o.size, o.written
                    )));
                }
                read_source = false;
            }
            op::BSPATCH => {
                let offset = ops.varint("offset")?;
                let len = ops.varint("length")?;
                within(&ops, shape, offset, len)?;
                let o = open.as_mut().expect("checked above");
                if !read_source {
                    return Err(ops.fail("patches without a read source"));
                }
                if o.written != 0 {
                    return Err(ops.fail("patches an object already written to"));
                }
                if o.size > MAX_BSPATCH_SIZE {
                    return Err(ops.fail(format!(
                        "patches an object of {} bytes, above the {MAX_BSPATCH_SIZE} byte limit",
                        o.size
                    )));
                }
                o.written = o.size;
            }
            _ => unreachable!("named above"),
        }
        ops.n += 1;
    }
    if open.is_some() {
        return Err(err(format!(
            "the op stream ends with object {} still open",
            next_object - 1
        )));
    }
    Ok(out)
}

/// Takes the next listed object, which OPEN and OPEN_SPLICE_AND_CLOSE
/// write, checking its type and the size it declares against `cap`.
fn start_object(
    ops: &Ops,
    objects: &[(u8, Checksum)],
    cap: &impl Fn(u8, &Checksum) -> u64,
    next: &mut usize,
    out: &mut PartWrites,
    size: u64,
    want_file: bool,
) -> Result<(), FormatError> {
    let Some((objtype, checksum)) = objects.get(*next) else {
        return Err(ops.fail(format!(
            "opens object {next}, but the part lists {}",
            objects.len()
        )));
    };
    let objtype = *objtype;
    if !(OBJTYPE_FILE..=OBJTYPE_LAST_META).contains(&objtype)
        || (want_file && objtype != OBJTYPE_FILE)
    {
        return Err(ops.fail(format!("object {checksum} has type {objtype}")));
    }
    let max = cap(objtype, checksum);
    if size > max {
        return Err(ops.fail(format!(
            "object {checksum} declares {size} bytes, more than the {max} allowed"
        )));
    }
    *next += 1;
    out.objects += 1;
    out.bytes = out
        .bytes
        .checked_add(size)
        .ok_or_else(|| ops.fail("sizes overflow 64 bits"))?;
    Ok(())
}

/// The mode and xattr indexes of a content object's open, each within
/// the payload's arrays (libostree indexes them unchecked).
fn mode_and_xattrs(ops: &mut Ops, shape: PayloadShape) -> Result<(), FormatError> {
    let mode = ops.varint("mode index")?;
    let xattr = ops.varint("xattr index")?;
    if mode >= shape.modes {
        return Err(ops.fail(format!("mode {mode} of {}", shape.modes)));
    }
    if xattr >= shape.xattrs {
        return Err(ops.fail(format!("xattr set {xattr} of {}", shape.xattrs)));
    }
    Ok(())
}

/// A payload as ostree's generator lays it out: `modes` (uid, gid, mode;
/// stored big-endian), one empty xattr set, `raw` and `ops`. For tests
/// and fuzz seeds; the client only reads payloads.
pub fn build_part_payload(modes: &[(u32, u32, u32)], raw: &[u8], ops: &[u8]) -> Vec<u8> {
    use glib::prelude::ToVariant;
    use glib::{Variant, VariantTy};
    let modes: Vec<(u32, u32, u32)> = modes
        .iter()
        .map(|(u, g, m)| (u.to_be(), g.to_be(), m.to_be()))
        .collect();
    let ty = |t: &'static str| VariantTy::new(t).expect("valid type string");
    let xattrs = Variant::array_from_iter_with_type(
        ty("a(ayay)"),
        [Variant::array_from_iter_with_type(
            ty("(ayay)"),
            std::iter::empty::<Variant>(),
        )],
    );
    Variant::tuple_from_iter([
        modes.to_variant(),
        xattrs,
        Variant::array_from_fixed_array(raw),
        Variant::array_from_fixed_array(ops),
    ])
    .data()
    .to_vec()
}

/// An op stream: each op's code and varint arguments.
pub fn build_ops(list: &[(u8, &[u64])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (code, args) in list {
        out.push(*code);
        for a in *args {
            write_varint(*a, &mut out);
        }
    }
    out
}

/// LEB128, as libostree writes op arguments.
pub fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests;
