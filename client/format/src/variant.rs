//! The step every parser of untrusted GVariant bytes starts with.

use crate::error::FormatError;
use glib::{Variant, VariantTy};

/// A GVariant type string of ours as a type; they are constants, so a bad
/// one is a bug caught by every test that parses.
pub(crate) fn ty(s: &str) -> &VariantTy {
    VariantTy::new(s).expect("valid GVariant type string")
}

/// Refuses input over `max` bytes before glib sees it (a limit an untrusted
/// remote must not make us buffer or walk past).
pub(crate) fn check_size(bytes: &[u8], max: usize, what: &'static str) -> Result<(), FormatError> {
    if bytes.len() > max {
        return Err(FormatError::Variant {
            what,
            why: format!("{} bytes exceeds the {max} byte limit", bytes.len()),
        });
    }
    Ok(())
}

/// Reads `bytes` as a GVariant of type `type_string`, refusing data that is
/// not in normal form: glib would silently read it as defaults, and what we
/// parse must be what ostree hashes. The Variant owns a copy of the bytes
/// on purpose: glib keeps pointers into the buffer in child values without
/// tying them to a borrow, so they must outlive the caller's slice.
pub fn parse_normal(
    bytes: &[u8],
    type_string: &str,
    what: &'static str,
) -> Result<Variant, FormatError> {
    #[allow(clippy::unnecessary_to_owned)]
    let v = Variant::from_data_with_type(bytes.to_vec(), ty(type_string));
    if !v.is_normal_form() {
        return Err(FormatError::Variant {
            what,
            why: "not in GVariant normal form".into(),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use glib::prelude::ToVariant;

    #[test]
    fn normal_form_and_size() {
        let good = (7u32, "x").to_variant();
        let v = parse_normal(good.data(), "(us)", "thing").unwrap();
        assert_eq!(v.child_value(1).str(), Some("x"));
        // A string without its terminating NUL is not in normal form.
        let err = parse_normal(b"abc", "s", "thing").unwrap_err();
        assert_eq!(
            err,
            FormatError::Variant {
                what: "thing",
                why: "not in GVariant normal form".into()
            }
        );
        assert!(check_size(&[0; 4], 4, "thing").is_ok());
        assert_eq!(
            check_size(&[0; 5], 4, "thing").unwrap_err().to_string(),
            "invalid thing: 5 bytes exceeds the 4 byte limit"
        );
    }
}
