use crate::error::FormatError;
use base64::alphabet::Alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::fmt;

/// A SHA-256 object checksum, as ostree names objects.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Checksum([u8; Checksum::LEN]);

impl Checksum {
    pub const LEN: usize = 32;
    pub const HEX_LEN: usize = 64;
    /// Unpadded base64 of 32 bytes.
    pub const MBASE64_LEN: usize = 43;

    pub fn from_bytes(b: &[u8]) -> Result<Self, FormatError> {
        let arr: [u8; Self::LEN] = b
            .try_into()
            .map_err(|_| FormatError::Checksum(format!("<{} bytes>", b.len())))?;
        Ok(Self(arr))
    }

    /// Parses the canonical form: exactly 64 lowercase hex digits, as
    /// `ostree_validate_checksum_string` demands.
    pub fn from_hex(s: &str) -> Result<Self, FormatError> {
        let bad = || FormatError::Checksum(truncate(s));
        if s.len() != Self::HEX_LEN {
            return Err(bad());
        }
        // Checked and decoded in one pass: every object request names one.
        let mut out = [0u8; Self::LEN];
        for (byte, pair) in out.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
            let (Some(hi), Some(lo)) = (lower_hex(pair[0]), lower_hex(pair[1])) else {
                return Err(bad());
            };
            *byte = (hi << 4) | lo;
        }
        Ok(Self(out))
    }

    /// ostree's "modified base64" (delta names): [`MBASE64`].
    pub fn to_mbase64(&self) -> String {
        let mut s = String::with_capacity(Self::MBASE64_LEN);
        self.write_mbase64(&mut s);
        s
    }

    /// [`Self::to_mbase64`], appended to `out`.
    pub fn write_mbase64(&self, out: &mut String) {
        let mut buf = [0u8; Self::MBASE64_LEN];
        let n = MBASE64
            .encode_slice(self.0, &mut buf)
            .expect("43 characters hold 32 bytes");
        out.push_str(std::str::from_utf8(&buf[..n]).expect("base64 is ASCII"));
    }

    pub fn from_mbase64(s: &str) -> Result<Self, FormatError> {
        let bad = || FormatError::Mbase64(truncate(s));
        if s.len() != Self::MBASE64_LEN {
            return Err(bad());
        }
        // A byte past the 32: the decoder wants room for its estimate.
        let mut out = [0u8; Self::LEN + 1];
        match MBASE64.decode_slice(s, &mut out) {
            Ok(Self::LEN) => Self::from_bytes(&out[..Self::LEN]).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }

    /// SHA-256 of `data`.
    pub fn digest(data: &[u8]) -> Self {
        Self(Sha256::digest(data).into())
    }

    pub fn as_bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// A lowercase hex digit's value.
fn lower_hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// ostree's "modified base64" (delta names): the standard alphabet with
/// `_` for `/`, so that it can be a path component (`+` stays), no
/// padding, and no stray low bits, so that one checksum has exactly one
/// name. Encoded and decoded on the stack: a delta's name is parsed at
/// each request for it.
const MBASE64: GeneralPurpose = GeneralPurpose::new(
    &MBASE64_ALPHABET,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(false),
);

const MBASE64_ALPHABET: Alphabet =
    match Alphabet::new("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+_") {
        Ok(a) => a,
        Err(_) => panic!("the modified base64 alphabet"),
    };

fn truncate(s: &str) -> String {
    const SHOWN: usize = 80;
    s.chars().take(SHOWN).collect()
}

impl From<[u8; Checksum::LEN]> for Checksum {
    fn from(b: [u8; Checksum::LEN]) -> Self {
        Self(b)
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Checksum({})", self.to_hex())
    }
}

impl std::str::FromStr for Checksum {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_hex(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "527043be2e20e17239bd19986592e4f0cc9bcfd00c24766fbb8fe75dee1fe8d0";
    // Produced by `ostree static-delta generate` for HEX (delta dir name).
    const MB64: &str = "UnBDvi4g4XI5vRmYZZLk8Mybz9AMJHZvu4_nXe4f6NA";

    #[test]
    fn hex_roundtrip_and_mbase64_matches_ostree() {
        let c = Checksum::from_hex(HEX).unwrap();
        assert_eq!(c.to_hex(), HEX);
        assert_eq!(c.to_mbase64(), MB64);
        assert_eq!(Checksum::from_mbase64(MB64).unwrap(), c);
        // Every byte value, as the standard engine spells it with `_`, and
        // as hex.
        for b in 0..=255u8 {
            let c = Checksum([b; Checksum::LEN]);
            assert_eq!(Checksum::from_hex(&c.to_hex()).unwrap(), c);
            let std = base64::engine::general_purpose::STANDARD_NO_PAD.encode(c.0);
            assert_eq!(c.to_mbase64(), std.replace('/', "_"));
            assert_eq!(Checksum::from_mbase64(&c.to_mbase64()).unwrap(), c);
        }
    }

    #[test]
    fn rejects_bad_hex() {
        let upper = HEX.to_uppercase();
        let cases: &[&str] = &[
            "",
            "abc",
            &HEX[1..],
            &upper,
            &format!("{HEX}0"),
            &HEX.replace('5', "g"),
        ];
        for s in cases {
            assert!(Checksum::from_hex(s).is_err(), "{s:?} accepted");
        }
    }

    #[test]
    fn rejects_bad_mbase64() {
        let noncanonical = format!("{}B", &MB64[..42]);
        let cases: &[&str] = &[
            "",
            &MB64[1..],
            &MB64.replace('_', "/"),
            &format!("{MB64}="),
            &noncanonical,
            &format!("{}=", &MB64[..42]),
            &MB64.replace('U', "-"),
            &MB64.replace('U', "\u{e9}")[..43],
        ];
        for s in cases {
            assert!(Checksum::from_mbase64(s).is_err(), "{s:?} accepted");
        }
    }
}
