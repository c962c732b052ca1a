//! The host as a block (issue 38): a lever's pairs grouped by the host they ran on
//! (the bundles' host key: hostname, CPU model and GPU name), each host's effect
//! estimated from its own pairs, and whether the hosts agree
//! ([`crate::rank::heterogeneity`]; the rule is argued in `specs/hosts.md`).
//!
//! A pair is only ever formed within one host ([`crate::rank::pairing`]'s cell
//! holds the host). With one host nothing here applies and the ranking is what it
//! was. With two or more:
//!
//! * [`Agreement::Agree`]: the F test of the host means against the pooled
//!   within-host spread finds no difference (`p >=`
//!   [`crate::rank::heterogeneity::ALPHA`]): the pairs are pooled and judged as
//!   one lever effect, and the figure (`I²`, `Q`, `p`) is shown beside the
//!   verdict;
//! * [`Agreement::Disagree`]: `p <` [`crate::rank::heterogeneity::ALPHA`]: no
//!   pooled effect or verdict is given; the verdict is `hosts-disagree`
//!   ([`crate::rank::verdict::Verdict::HostsDisagree`]), naming each host's saving;
//! * [`Agreement::Untestable`]: no host has two pairs, so the pairs' own spread
//!   cannot be told from the hosts': the verdict is `insufficient`, naming the
//!   round that is missing.
//!
//! Each host's row is its own paired effect (bootstrap seeded per lever, rung and
//! host: [`seed_for_host`]) and its saving judged alone against the hypothesis
//! (no fidelity or outlier rule: those apply to the lever's verdict).

use serde::Serialize;
use std::collections::BTreeMap;

use crate::levers_spec::Lever;
use crate::rank::heterogeneity::{heterogeneity, Heterogeneity, ALPHA};
use crate::rank::pairing::PairedRound;
use crate::rank::stats::{self, Interval, Pair, PairedEffect};
use crate::rank::verdict::{self, pct, Verdict};

/// One host's share of a lever's pairs at a rung.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostEffect {
    /// The host key (`hostname|cpu model|gpu name`, as pairing uses it).
    pub host: String,
    /// How tables name the host: its hostname, or the whole key where two hosts
    /// share a hostname.
    pub label: String,
    /// Pairs on this host.
    pub pairs: usize,
    /// The paired effect over this host's pairs, when its values are defined.
    pub effect: Option<PairedEffect>,
    /// Fractional saving in the hypothesised direction over this host's pairs,
    /// and its interval.
    pub saving_fraction: Option<(f64, Interval)>,
    /// This host's saving judged alone against the hypothesis.
    pub verdict: Verdict,
}

/// Whether the hosts measured one effect.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "agreement", rename_all = "lowercase")]
pub enum Agreement {
    /// No evidence that the hosts differ: the pairs are pooled.
    Agree,
    /// The hosts' effects differ beyond their pairs' spread: nothing is pooled.
    Disagree,
    /// The test cannot be made (no within-host degree of freedom, or a ratio
    /// undefined).
    Untestable {
        /// What is missing, in words.
        why: String,
    },
}

/// A lever's pairs at a rung, blocked by host (only where two or more hosts
/// contributed pairs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostBlocks {
    /// Each host's effect, in host-key order.
    pub hosts: Vec<HostEffect>,
    /// The spread of the host effects against their pairs' spread.
    pub heterogeneity: Heterogeneity,
    /// The decision.
    pub agreement: Agreement,
}

/// The bootstrap seed of one host's effect: [`stats::seed_for`] of the lever and
/// of the rung and host joined by a 0xFF byte (never inside UTF-8 text), so that
/// every host row has its own fixed stream and no host's row reuses the pooled one.
pub fn seed_for_host(lever: &str, rung: &str, host: &str) -> u64 {
    let mut key = Vec::with_capacity(rung.len() + host.len() + 1);
    key.extend_from_slice(rung.as_bytes());
    key.push(0xff);
    key.extend_from_slice(host.as_bytes());
    // from_utf8_lossy keeps the 0xFF byte distinct (as U+FFFD) from any text.
    stats::seed_for(lever, &String::from_utf8_lossy(&key))
}

/// The label of each host key: its hostname (the part before the first `|`),
/// or the whole key where two of `keys` share a hostname.
fn labels(keys: &[&str]) -> Vec<String> {
    let name = |k: &str| k.split('|').next().unwrap_or(k).to_string();
    keys.iter()
        .map(|k| {
            let n = name(k);
            if keys.iter().filter(|o| name(o) == n).count() > 1 {
                k.to_string()
            } else {
                n
            }
        })
        .collect()
}

/// The host blocks of `rounds` (a lever's pairs at `rung`), or `None` when they
/// come from fewer than two hosts.
pub fn blocks(l: &Lever, rung: &str, rounds: &[PairedRound]) -> Option<HostBlocks> {
    let mut by_host: BTreeMap<&str, Vec<Pair>> = BTreeMap::new();
    for r in rounds {
        by_host
            .entry(r.cell.host.as_str())
            .or_default()
            .push(r.pair);
    }
    if by_host.len() < 2 {
        return None;
    }
    let keys: Vec<&str> = by_host.keys().copied().collect();
    let hosts: Vec<HostEffect> = by_host
        .iter()
        .zip(labels(&keys))
        .map(|((host, pairs), label)| {
            let e = stats::paired_effect(
                pairs,
                seed_for_host(&l.id, rung, host),
                stats::BOOTSTRAP_RESAMPLES,
            )
            .map_err(|e| format!("a defined ratio for every pair ({e})"));
            HostEffect {
                host: host.to_string(),
                label,
                pairs: pairs.len(),
                saving_fraction: e
                    .as_ref()
                    .ok()
                    .map(|e| verdict::saving_fraction(l.hypothesis.direction, e)),
                verdict: verdict::judge(&l.hypothesis, e.as_ref().map_err(String::as_str)),
                effect: e.ok(),
            }
        })
        .collect();
    let logs: Option<Vec<Vec<f64>>> = by_host
        .values()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let ok = |v: f64| v.is_finite() && v > 0.0;
                    (ok(p.baseline) && ok(p.treatment)).then(|| (p.treatment / p.baseline).ln())
                })
                .collect()
        })
        .collect();
    let (heterogeneity, agreement) = match logs {
        None => {
            let h = heterogeneity(&[]);
            let why = "a defined ratio for every pair: a value is not a positive number, so \
                       the hosts' agreement cannot be judged"
                .to_string();
            (h, Agreement::Untestable { why })
        }
        Some(logs) => {
            let h = heterogeneity(&logs);
            let a = if h.p.is_none() {
                Agreement::Untestable {
                    why: format!(
                        "a second paired round on one of the {} hosts: each has one pair, so \
                         their agreement cannot be told from the pairs' own spread",
                        h.hosts
                    ),
                }
            } else if h.disagree() {
                Agreement::Disagree
            } else {
                Agreement::Agree
            };
            (h, a)
        }
    };
    Some(HostBlocks {
        hosts,
        heterogeneity,
        agreement,
    })
}

/// `Q`, `F`, `p` and `I²` in words: `I² 97.1%, Q 33.20 on 1 df, F(1, 4) 33.20,
/// p 0.0045`; `not testable` when the test could not be made.
pub fn figure(h: &Heterogeneity) -> String {
    match (h.q, h.f, h.p, h.i2) {
        (Some(q), Some(f), Some(p), Some(i2)) => format!(
            "I² {}, Q {} on {} df, F({}, {}) {}, p {}",
            pct(i2),
            number(q),
            h.df_between,
            h.df_between,
            h.df_within,
            number(f),
            p_value(p)
        ),
        _ => "I² not testable".to_string(),
    }
}

/// The short figure a verdict cell carries: `2 hosts, I² 0.0%`.
pub fn short_figure(b: &HostBlocks) -> String {
    match b.heterogeneity.i2 {
        Some(i2) => format!("{} hosts, I² {}", b.hosts.len(), pct(i2)),
        None => format!("{} hosts, I² not testable", b.hosts.len()),
    }
}

/// A statistic with two decimals, `inf` when infinite.
fn number(x: f64) -> String {
    if x.is_infinite() {
        "inf".to_string()
    } else {
        verdict::fixed(x, 2)
    }
}

/// A p-value to 4 decimals, `< 0.0001` below that.
pub fn p_value(p: f64) -> String {
    if p < 1e-4 {
        "< 0.0001".to_string()
    } else {
        verdict::fixed(p, 4)
    }
}

/// Each host's saving with its interval and pairs, `; ` between them:
/// `a 30.0% [29.0%, 31.0%] (3 pairs)`.
pub fn host_savings(b: &HostBlocks) -> String {
    b.hosts
        .iter()
        .map(|h| match h.saving_fraction {
            Some((s, ci)) => format!(
                "{} {} [{}, {}] ({} pair(s))",
                h.label,
                pct(s),
                pct(ci.lo),
                pct(ci.hi),
                h.pairs
            ),
            None => format!("{} no estimate ({} pair(s))", h.label, h.pairs),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The `hosts-disagree` verdict of `b`: why no pooled verdict is given.
pub fn disagreement(b: &HostBlocks) -> Verdict {
    Verdict::HostsDisagree {
        why: format!(
            "the hosts' savings differ beyond their pairs' spread ({}; p < {}): {}; no pooled verdict",
            figure(&b.heterogeneity),
            verdict::fixed(ALPHA, 2),
            host_savings(b)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::pairing::tests::spec;
    use crate::rank::pairing::Cell;

    fn round(host: &str, i: u32, b: f64, t: f64) -> PairedRound {
        PairedRound {
            cell: Cell {
                campaign: "c".into(),
                round: i,
                engine_sha256: "e".into(),
                host: host.into(),
                boot: "b".into(),
                weights_digest: "w".into(),
                profile: "p".into(),
                other_levers: String::new(),
            },
            baseline_id: format!("b{host}{i}"),
            treatment_id: format!("t{host}{i}"),
            pair: Pair {
                baseline: b,
                treatment: t,
            },
        }
    }

    #[test]
    fn one_host_is_no_block_and_two_hosts_are_judged_apart() {
        let s = spec();
        let l = &s.levers[0];
        let one: Vec<PairedRound> = (1..=3).map(|i| round("a", i, 10.0, 5.0)).collect();
        assert_eq!(blocks(l, "2", &one), None);
        // a saves 50% (the spec's minimum is 30%), b nothing: they disagree; each
        // host judged alone.
        let mut two = one.clone();
        two[0].pair.treatment = 5.1;
        two.extend([
            round("b", 1, 10.0, 10.0),
            round("b", 2, 10.0, 10.1),
            round("b", 3, 10.0, 9.9),
        ]);
        let b = blocks(l, "2", &two).unwrap();
        assert_eq!(b.agreement, Agreement::Disagree);
        let names: Vec<(&str, usize, &str)> = b
            .hosts
            .iter()
            .map(|h| (h.label.as_str(), h.pairs, h.verdict.name()))
            .collect();
        assert_eq!(names, [("a", 3, "confirmed"), ("b", 3, "refuted")]);
        match disagreement(&b) {
            Verdict::HostsDisagree { why } => {
                assert!(
                    why.contains("a 49.7% [") && why.contains("b 0.0% ["),
                    "{why}"
                );
                assert!(why.contains("F(1, 4)") && why.contains("no pooled verdict"));
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn hosts_with_one_pair_each_cannot_be_judged_and_labels_stay_unique() {
        let s = spec();
        let l = &s.levers[0];
        let rounds = vec![round("a|x", 1, 10.0, 7.0), round("a|y", 2, 10.0, 9.0)];
        let b = blocks(l, "2", &rounds).unwrap();
        match &b.agreement {
            Agreement::Untestable { why } => {
                assert!(why.starts_with("a second paired round"), "{why}")
            }
            a => panic!("{a:?}"),
        }
        // Two hosts named `a` (different CPU): each is named by its whole key.
        let l: Vec<&str> = b.hosts.iter().map(|h| h.label.as_str()).collect();
        assert_eq!(l, ["a|x", "a|y"]);
        assert_eq!(labels(&["h1|c|g", "h2|c|g"]), ["h1", "h2"]);
        assert_ne!(seed_for_host("x", "2", "a"), seed_for_host("x", "2", "b"));
        assert_ne!(seed_for_host("x", "2", "a"), stats::seed_for("x", "2"));
    }
}
