//! The signature errors callers branch on.

use std::path::PathBuf;

/// Refusal reasons listed in one error before "and N more".
const MAX_REASONS_LISTED: usize = 20;

/// Why a generation was not published for signature reasons. These wait
/// for new signatures (the bundle directory changing) rather than for a
/// retry of the same inputs.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// `--trusted-keys` is set and something published does not verify.
    #[error("refusing to publish unverified content ({} problem{}):\n  {}", reasons.len(), if reasons.len() == 1 { "" } else { "s" }, list_reasons(reasons))]
    Unverified { reasons: Vec<String> },
    /// `--sign-key` would sign a commit the operator did not pin.
    #[error("refusing to sign and publish unpinned content ({} problem{}):\n  {}", reasons.len(), if reasons.len() == 1 { "" } else { "s" }, list_reasons(reasons))]
    Unpinned { reasons: Vec<String> },
    /// The `--signatures` directory holds something that is not a bundle.
    #[error("signature bundle {}: {reason}", dir.display())]
    BadBundle { dir: PathBuf, reason: String },
}

fn list_reasons(reasons: &[String]) -> String {
    let mut shown: Vec<&str> = reasons
        .iter()
        .take(MAX_REASONS_LISTED)
        .map(String::as_str)
        .collect();
    let more;
    if reasons.len() > MAX_REASONS_LISTED {
        more = format!("... and {} more", reasons.len() - MAX_REASONS_LISTED);
        shown.push(&more);
    }
    shown.join("\n  ")
}

/// Whether `e` is a signature refusal (wait for new signatures) rather than
/// a broken source.
pub fn is_signature_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<SignatureError>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_lists_are_bounded() {
        let reasons: Vec<String> = (0..50).map(|i| format!("ref r{i}: bad")).collect();
        let msg = SignatureError::Unverified { reasons }.to_string();
        assert!(msg.contains("50 problems"), "{msg}");
        assert!(msg.contains("ref r19: bad") && !msg.contains("ref r20: bad"));
        assert!(msg.contains("and 30 more"), "{msg}");
    }
}
