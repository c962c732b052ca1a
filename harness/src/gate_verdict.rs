//! One entry of a run's `gates` fragment: a gate's name, verdict and what it
//! found. `run::gate_checks` holds the gates themselves; `weights_cache` reports its own
//! gate in this form too.

use serde::Serialize;

/// A gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The gate passed.
    Pass,
    /// The gate refused the run.
    Refuse,
    /// The gate does not apply to this run.
    NotApplicable,
}

/// One entry of the `gates` fragment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gate {
    /// The gate's name.
    pub name: String,
    /// Its verdict.
    pub verdict: Verdict,
    /// What was checked and found.
    pub detail: String,
}

impl Verdict {
    /// The verdict as the manifest writes it (`pass`, `refuse`, `not-applicable`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Refuse => "refuse",
            Verdict::NotApplicable => "not-applicable",
        }
    }
}

impl Gate {
    /// The entry as the `gates` fragment's record holds it.
    pub fn verdicted(&self) -> evidence::fragments::Verdicted {
        evidence::fragments::Verdicted {
            name: Some(self.name.clone()),
            verdict: Some(self.verdict.as_str().to_string()),
            detail: Some(self.detail.clone()),
            rest: serde_json::Map::new(),
        }
    }

    /// A gate entry.
    pub fn new(name: &str, verdict: Verdict, detail: impl Into<String>) -> Gate {
        Gate {
            name: name.into(),
            verdict,
            detail: detail.into(),
        }
    }
}
