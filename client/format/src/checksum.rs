use crate::error::FormatError;
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
        let ok = s.len() == Self::HEX_LEN
            && s.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
        if !ok {
            return Err(FormatError::Checksum(truncate(s)));
        }
        let mut out = [0u8; Self::LEN];
        hex::decode_to_slice(s, &mut out).map_err(|_| FormatError::Checksum(truncate(s)))?;
        Ok(Self(out))
    }

    /// ostree's "modified base64" (delta names): standard alphabet, no
    /// padding, `/` replaced by `_` so it can be a path component. `+` stays.
    pub fn to_mbase64(&self) -> String {
        base64::engine::general_purpose::STANDARD_NO_PAD
            .encode(self.0)
            .replace('/', "_")
    }

    pub fn from_mbase64(s: &str) -> Result<Self, FormatError> {
        if s.len() != Self::MBASE64_LEN || s.contains('/') {
            return Err(FormatError::Mbase64(truncate(s)));
        }
        let std = s.replace('_', "/");
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(std)
            .map_err(|_| FormatError::Mbase64(truncate(s)))?;
        let c = Self::from_bytes(&bytes).map_err(|_| FormatError::Mbase64(truncate(s)))?;
        // Reject non-canonical encodings (stray low bits) so one checksum has
        // exactly one URL.
        if c.to_mbase64() != s {
            return Err(FormatError::Mbase64(truncate(s)));
        }
        Ok(c)
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
        ];
        for s in cases {
            assert!(Checksum::from_mbase64(s).is_err(), "{s:?} accepted");
        }
    }
}
