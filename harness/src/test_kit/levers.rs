//! Lever specs for tests, built instead of written out: a [`SpecToml`] of
//! [`LeverToml`]s renders the TOML that [`crate::levers_spec::LeverSpec::parse`]
//! reads (`specs/levers.toml`'s format), with the fields every planted lever
//! shares filled in: applies to `cpu`, metric a phase's wall, numerics
//! preserving, hypothesis `decrease` by at least 10%, statement `s`, refutation
//! `r`, next hypothesis `n`.

/// A lever spec: schema 1, ranked at a reference rung (`2` unless told).
#[derive(Debug, Clone)]
pub struct SpecToml {
    reference_rung: String,
    prior_rank_source: String,
    levers: Vec<LeverToml>,
}

impl Default for SpecToml {
    fn default() -> Self {
        SpecToml {
            reference_rung: "2".into(),
            prior_rank_source: "planted for the test".into(),
            levers: Vec::new(),
        }
    }
}

impl SpecToml {
    /// A spec ranked at rung `2`, with no levers yet.
    pub fn new() -> SpecToml {
        SpecToml::default()
    }

    /// Rank at `rung` instead.
    pub fn reference_rung(mut self, rung: &str) -> SpecToml {
        self.reference_rung = rung.into();
        self
    }

    /// Add `lever` (levers keep their order).
    pub fn lever(mut self, lever: LeverToml) -> SpecToml {
        self.levers.push(lever);
        self
    }

    /// The spec as TOML text.
    pub fn toml(&self) -> String {
        let mut out = format!(
            "schema = 1\nreference_rung = {}\nprior_rank_source = {}\n",
            quoted(&self.reference_rung),
            quoted(&self.prior_rank_source)
        );
        for l in &self.levers {
            out.push('\n');
            out.push_str(&l.toml());
        }
        out
    }
}

/// One `[[lever]]` of a [`SpecToml`].
#[derive(Debug, Clone)]
pub struct LeverToml {
    id: String,
    seed_issue: String,
    title: String,
    arms: (String, String),
    prior_rank: Option<u32>,
    phase: String,
    changing: Option<String>,
    min_effect: f64,
    next_hypothesis: String,
}

impl LeverToml {
    /// Lever `id` with arms `baseline` and `treatment`, whose metric is the wall
    /// of `phase`; seed issue `#1`, titled by its id until told otherwise.
    pub fn phase_wall(id: &str, baseline: &str, treatment: &str, phase: &str) -> LeverToml {
        LeverToml {
            id: id.into(),
            seed_issue: "#1".into(),
            title: id.into(),
            arms: (baseline.into(), treatment.into()),
            prior_rank: None,
            phase: phase.into(),
            changing: None,
            min_effect: 0.10,
            next_hypothesis: "n".into(),
        }
    }

    /// Its seed issue (`#3`).
    pub fn seed_issue(mut self, issue: &str) -> LeverToml {
        self.seed_issue = issue.into();
        self
    }

    /// Its title.
    pub fn title(mut self, title: &str) -> LeverToml {
        self.title = title.into();
        self
    }

    /// Its prior rank.
    pub fn prior_rank(mut self, rank: u32) -> LeverToml {
        self.prior_rank = Some(rank);
        self
    }

    /// Numerics-changing, with `fidelity` as the inline table's body
    /// (`min_psnr_db = 40.0`).
    pub fn changing(mut self, fidelity: &str) -> LeverToml {
        self.changing = Some(fidelity.into());
        self
    }

    /// Its hypothesis's next hypothesis.
    pub fn next_hypothesis(mut self, next: &str) -> LeverToml {
        self.next_hypothesis = next.into();
        self
    }

    /// The `[[lever]]` table as TOML text.
    pub fn toml(&self) -> String {
        let mut out = format!(
            "[[lever]]\nid = {}\nseed_issue = {}\ntitle = {}\narms = [{}, {}]\n\
             baseline = {}\ntreatment = {}\napplies_to = [\"cpu\"]\n",
            quoted(&self.id),
            quoted(&self.seed_issue),
            quoted(&self.title),
            quoted(&self.arms.0),
            quoted(&self.arms.1),
            quoted(&self.arms.0),
            quoted(&self.arms.1),
        );
        if let Some(r) = self.prior_rank {
            out.push_str(&format!("prior_rank = {r}\n"));
        }
        out.push_str(&format!(
            "metric = {{ kind = \"phase-wall\", phase = {} }}\n",
            quoted(&self.phase)
        ));
        match &self.changing {
            Some(f) => out.push_str(&format!("numerics = \"changing\"\nfidelity = {{ {f} }}\n")),
            None => out.push_str("numerics = \"preserving\"\n"),
        }
        out.push_str(&format!(
            "[lever.hypothesis]\ndirection = \"decrease\"\nmin_effect = {:?}\n\
             statement = \"s\"\nrefutation = \"r\"\nnext_hypothesis = {}\n",
            self.min_effect,
            quoted(&self.next_hypothesis)
        ));
        out
    }
}

/// `s` as a TOML basic string.
fn quoted(s: &str) -> String {
    format!("{s:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_spec_parses_as_written() {
        let text = SpecToml::new()
            .lever(
                LeverToml::phase_wall("fast", "slow", "quick", "load.dit")
                    .prior_rank(2)
                    .next_hypothesis("fast: look at the reader"),
            )
            .lever(
                LeverToml::phase_wall("lossy", "f32", "bf16", "load.dit")
                    .seed_issue("#2")
                    .changing("min_psnr_db = 40.0"),
            )
            .toml();
        let spec = crate::levers_spec::LeverSpec::parse(&text, std::path::Path::new("t.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(spec.reference_rung, "2");
        assert_eq!(spec.levers.len(), 2);
        assert_eq!(spec.levers[0].id, "fast");
    }
}
