//! A broken invariant, and the collector every check reports into.

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub object: String,
    pub rule: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [{}]: {}", self.object, self.rule, self.detail)
    }
}

/// Violations found on one object, appended to the rendering's list.
pub(super) struct Report<'a> {
    pub(super) out: &'a mut Vec<Violation>,
    pub(super) object: String,
}

impl<'a> Report<'a> {
    pub(super) fn new(out: &'a mut Vec<Violation>, object: impl Into<String>) -> Self {
        Report {
            out,
            object: object.into(),
        }
    }

    pub(super) fn fail(&mut self, rule: &'static str, detail: impl Into<String>) {
        self.out.push(Violation {
            object: self.object.clone(),
            rule,
            detail: detail.into(),
        });
    }

    pub(super) fn ensure(&mut self, ok: bool, rule: &'static str, detail: impl Into<String>) {
        if !ok {
            self.fail(rule, detail);
        }
    }
}
