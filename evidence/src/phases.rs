//! The phase tree rebuilt from markers, its coverage and checks, and per-phase
//! statistics from samples (`phases.parquet`, documented in `specs/bundle.md`).
//!
//! Rules:
//! * Events are taken in time order (`t_ns`, ties in arrival order). An `open`
//!   nests under the innermost phase open at that moment; a `close` ends the
//!   innermost open phase of the same name (one with no match is counted in
//!   `unmatched_closes`). Phases still open at the end of the recording have no
//!   close and last until the end of the recording.
//! * A phase covers the half-open window `[open_ns, close_ns)`; a phase open at
//!   the end covers `[open_ns, end]` (the last instant included).
//! * Coverage: the sum of the leaves' durations over the engine's wall (first to
//!   last marker, or to the end of the recording when a phase is still open), with
//!   the unaccounted seconds beside it.
//! * Sub-scopes of a phase are its children named `<name>.<...>` (`denoise.step`
//!   in `denoise`), or all its children when none is so named; any other child
//!   only overlaps it in time.
//! * Containment: each sub-scope of a phase lies inside it, and together they
//!   cover at least [`MIN_CONTAINED_SHARE`] of it or leave at most
//!   [`MAX_UNCOVERED_NS`] of it uncovered.
//! * Exclusivity: no leaf other than the sub-scopes (and what they contain)
//!   overlaps the window the sub-scopes span.

use serde_json::Value;
use std::collections::BTreeMap;

use crate::manifest::{canonical_json, CheckGroup, CheckSummary, PhasesSummary, Verdict};
use crate::marker::{attr, Attrs, Marker};
use crate::sample::{column_index, Sample};

/// The share of a phase its sub-scopes must cover for containment to pass.
pub const MIN_CONTAINED_SHARE: f64 = 0.90;

/// Uncovered time a phase's sub-scopes may leave whatever its share, ns (50 ms,
/// half the sampler's default 100 ms cadence: a gap shorter than that is below
/// what the instrument resolves, and in a phase of a few milliseconds, such as
/// the tiny model's `denoise` at rung 0, 10% is the host scheduler's jitter,
/// not an engine that went silent).
pub const MAX_UNCOVERED_NS: u64 = 50_000_000;

/// One phase instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// Position in open order, from 0.
    pub seq: usize,
    /// The phase name.
    pub name: String,
    /// Nesting depth, 0 at top.
    pub depth: usize,
    /// The enclosing phase's seq.
    pub parent: Option<usize>,
    /// Sub-phases' seqs, in open order.
    pub children: Vec<usize>,
    /// CLOCK_MONOTONIC ns of the open marker.
    pub open_ns: u64,
    /// CLOCK_MONOTONIC ns of the close marker; `None` while open at the end.
    pub close_ns: Option<u64>,
    /// Attributes of the open marker.
    pub open_attrs: Attrs,
    /// Attributes of the close marker.
    pub close_attrs: Attrs,
}

impl Phase {
    /// End of the phase's window: its close, or `end_ns` while still open.
    pub fn end_ns(&self, end_ns: u64) -> u64 {
        self.close_ns.unwrap_or(end_ns).max(self.open_ns)
    }
}

/// A phase row of `phases.parquet` with its sample statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseRow {
    /// The phase.
    pub phase: Phase,
    /// Seconds from open to close (or to the end of the recording).
    pub duration_s: f64,
    /// No sub-phases.
    pub is_leaf: bool,
    /// `{"close":{...},"open":{...}}`, canonical JSON.
    pub attrs_json: String,
    /// Max `rss_bytes` over the phase's samples.
    pub peak_rss_bytes: Option<i64>,
    /// Max `engine_gpu_mem_bytes` over the phase's samples.
    pub peak_engine_gpu_mem_bytes: Option<i64>,
    /// `peak_device_bytes` from the close attributes.
    pub peak_device_bytes: Option<i64>,
    /// `device_ms` from the close attributes.
    pub device_ms: Option<f64>,
    /// Share of the phase's samples with `gpu_util_pct > 0` (of those with a value).
    pub gpu_busy_share: Option<f64>,
    /// Mean `gpu_util_pct` over the phase's samples.
    pub mean_gpu_util_pct: Option<f64>,
    /// Mean `cpu_cores` over the phase's samples.
    pub mean_cpu_cores: Option<f64>,
    /// Samples inside the phase's window.
    pub samples: i64,
}

/// The phase tree of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseTree {
    /// Every instance in open order (`phases[i].seq == i`).
    pub phases: Vec<Phase>,
    /// Close markers that matched no open phase.
    pub unmatched_closes: u64,
    /// End of the recording, CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// First and last marker times (any event kind).
    pub marker_span: Option<(u64, u64)>,
}

/// Build the tree from parsed markers in arrival order; `end_ns` is the end of
/// the recording (latest timestamp seen anywhere in the journal).
pub fn build_tree(markers: &[Marker], end_ns: u64) -> PhaseTree {
    let mut order: Vec<usize> = (0..markers.len()).collect();
    order.sort_by_key(|&i| (markers[i].t_ns(), i));
    let mut phases: Vec<Phase> = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    let mut unmatched = 0u64;
    for &i in &order {
        match &markers[i] {
            Marker::Open { t_ns, name, attrs } => {
                let seq = phases.len();
                let parent = stack.last().copied();
                if let Some(p) = parent {
                    phases[p].children.push(seq);
                }
                phases.push(Phase {
                    seq,
                    name: name.clone(),
                    depth: stack.len(),
                    parent,
                    children: Vec::new(),
                    open_ns: *t_ns,
                    close_ns: None,
                    open_attrs: attrs.clone(),
                    close_attrs: Attrs::new(),
                });
                stack.push(seq);
            }
            Marker::Close { t_ns, name, attrs } => {
                match stack.iter().rposition(|&s| phases[s].name == *name) {
                    Some(pos) => {
                        let s = stack.remove(pos);
                        phases[s].close_ns = Some(*t_ns);
                        phases[s].close_attrs = attrs.clone();
                    }
                    None => unmatched += 1,
                }
            }
            _ => {}
        }
    }
    let marker_span = order
        .first()
        .zip(order.last())
        .map(|(&a, &b)| (markers[a].t_ns(), markers[b].t_ns()));
    let end_ns = marker_span.map_or(end_ns, |(_, l)| end_ns.max(l));
    PhaseTree {
        phases,
        unmatched_closes: unmatched,
        end_ns,
        marker_span,
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn attr_i64(a: &Attrs, k: &str) -> Option<i64> {
    let v = a.get(k)?;
    v.as_i64()
        .or_else(|| v.as_u64().map(|u| u.min(i64::MAX as u64) as i64))
        .or_else(|| {
            v.as_f64()
                .filter(|f| f.is_finite())
                .map(|f| f.round() as i64)
        })
}

impl PhaseTree {
    /// The sub-scopes of phase `p`: its children named `<p.name>.<...>` (the
    /// dotted convention: `denoise.step` in `denoise`), or all its children when
    /// none is so named. Other children merely overlap it in time.
    pub fn sub_scopes(&self, p: usize) -> Vec<usize> {
        let prefix = format!("{}.", self.phases[p].name);
        let named: Vec<usize> = self.phases[p]
            .children
            .iter()
            .copied()
            .filter(|&c| self.phases[c].name.starts_with(&prefix))
            .collect();
        if named.is_empty() {
            self.phases[p].children.clone()
        } else {
            named
        }
    }

    /// Whether phase `d` lies inside one of `subs`, the sub-scopes of phase `p`.
    fn inside_sub_scope(&self, mut d: usize, p: usize, subs: &[usize]) -> bool {
        loop {
            match self.phases[d].parent {
                Some(up) if up == p => return subs.contains(&d),
                Some(up) => d = up,
                None => return false,
            }
        }
    }

    /// Rows of `phases.parquet`, with statistics from `samples` (sorted by `t_ns`).
    pub fn rows(&self, samples: &[Sample]) -> Vec<PhaseRow> {
        let rss = column_index("rss_bytes");
        let gmem = column_index("engine_gpu_mem_bytes");
        let util = column_index("gpu_util_pct");
        let cores = column_index("cpu_cores");
        let val = |s: &Sample, c: Option<usize>| c.and_then(|c| s.values.get(c).copied().flatten());
        self.phases
            .iter()
            .map(|p| {
                let end = p.end_ns(self.end_ns);
                let lo = samples.partition_point(|s| s.t_ns < p.open_ns);
                let hi = match p.close_ns {
                    Some(c) => samples.partition_point(|s| s.t_ns < c.max(p.open_ns)),
                    None => samples.partition_point(|s| s.t_ns <= end),
                };
                let win = &samples[lo..hi.max(lo)];
                let max_of = |c| {
                    win.iter()
                        .filter_map(|s| val(s, c))
                        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
                        .map(|v| v.round() as i64)
                };
                let mean_of = |c| {
                    let (n, sum) = win
                        .iter()
                        .filter_map(|s| val(s, c))
                        .fold((0u64, 0.0), |(n, s), v| (n + 1, s + v));
                    (n > 0).then(|| sum / n as f64)
                };
                let (n_util, busy) = win
                    .iter()
                    .filter_map(|s| val(s, util))
                    .fold((0u64, 0u64), |(n, b), v| (n + 1, b + u64::from(v > 0.0)));
                let mut attrs = serde_json::Map::new();
                attrs.insert(
                    "open".into(),
                    Value::Object(p.open_attrs.clone().into_iter().collect()),
                );
                attrs.insert(
                    "close".into(),
                    Value::Object(p.close_attrs.clone().into_iter().collect()),
                );
                PhaseRow {
                    duration_s: secs(end - p.open_ns),
                    is_leaf: p.children.is_empty(),
                    attrs_json: canonical_json(&Value::Object(attrs)),
                    peak_rss_bytes: max_of(rss),
                    peak_engine_gpu_mem_bytes: max_of(gmem),
                    peak_device_bytes: attr_i64(&p.close_attrs, attr::PEAK_DEVICE_BYTES),
                    device_ms: p
                        .close_attrs
                        .get(attr::DEVICE_MS)
                        .and_then(Value::as_f64)
                        .filter(|f| f.is_finite()),
                    gpu_busy_share: (n_util > 0).then(|| busy as f64 / n_util as f64),
                    mean_gpu_util_pct: mean_of(util),
                    mean_cpu_cores: mean_of(cores),
                    samples: win.len() as i64,
                    phase: p.clone(),
                }
            })
            .collect()
    }

    /// The innermost phase open at each sample's `t_ns` (samples sorted by `t_ns`).
    pub fn phase_of_samples(&self, samples: &[Sample]) -> Vec<Option<usize>> {
        let mut out = Vec::with_capacity(samples.len());
        let mut next = 0usize;
        let mut active: Vec<usize> = Vec::new();
        for s in samples {
            while next < self.phases.len() && self.phases[next].open_ns <= s.t_ns {
                active.push(next);
                next += 1;
            }
            active.retain(|&i| match self.phases[i].close_ns {
                Some(c) => c > s.t_ns,
                None => true,
            });
            let best = active
                .iter()
                .copied()
                .max_by_key(|&i| (self.phases[i].depth, self.phases[i].open_ns, i));
            out.push(best);
        }
        out
    }

    /// Coverage, containment and exclusivity. `run` is (start_ns, end_ns) from
    /// the `run` fragment when known.
    pub fn summary(&self, run: (Option<u64>, Option<u64>)) -> PhasesSummary {
        let end = self.end_ns;
        let any_open = self.phases.iter().any(|p| p.close_ns.is_none());
        let wall_s = self.marker_span.map(|(first, last)| {
            let stop = if any_open { end } else { last };
            secs(stop.saturating_sub(first))
        });
        let leaves: Vec<usize> = (0..self.phases.len())
            .filter(|&i| self.phases[i].children.is_empty())
            .collect();
        let leaf_sum_s: f64 = leaves
            .iter()
            .map(|&i| secs(self.phases[i].end_ns(end) - self.phases[i].open_ns))
            .sum();
        let coverage = wall_s.filter(|w| *w > 0.0).map(|w| leaf_sum_s / w);
        let run_wall_s = run.0.map(|s| secs(run.1.unwrap_or(end).saturating_sub(s)));

        // Containment and exclusivity, grouped by parent name.
        let mut cont: BTreeMap<String, CheckGroup> = BTreeMap::new();
        let mut excl: BTreeMap<String, CheckGroup> = BTreeMap::new();
        for p in self.phases.iter().filter(|p| !p.children.is_empty()) {
            let subs = self.sub_scopes(p.seq);
            let window = self.check_containment(p, &subs, &mut cont);
            self.check_exclusivity(p, &subs, window, &leaves, &mut excl);
        }
        self.check_dotted_parents(&mut cont);
        PhasesSummary {
            instances: self.phases.len() as u64,
            leaves: leaves.len() as u64,
            wall_s,
            run_wall_s,
            leaf_sum_s,
            coverage,
            unaccounted_s: wall_s.map(|w| w - leaf_sum_s),
            open_at_end: self
                .phases
                .iter()
                .filter(|p| p.close_ns.is_none())
                .map(|p| p.name.clone())
                .collect(),
            unmatched_closes: self.unmatched_closes,
            containment: check_summary(cont, Some(MIN_CONTAINED_SHARE)),
            exclusivity: check_summary(excl, None),
        }
    }

    /// Containment of parent `p`: its sub-scopes `subs` lie inside it and cover at
    /// least [`MIN_CONTAINED_SHARE`] of it or leave at most [`MAX_UNCOVERED_NS`]
    /// uncovered. Counted into `p`'s group of `cont`.
    /// Returns the sub-scopes' window (first open, last end; ns), which the
    /// exclusivity check reads.
    fn check_containment(
        &self,
        p: &Phase,
        subs: &[usize],
        cont: &mut BTreeMap<String, CheckGroup>,
    ) -> (u64, u64) {
        let end = self.end_ns;
        let (po, pe) = (p.open_ns, p.end_ns(end));
        let mut outside = Vec::new();
        let mut covered = 0u64;
        let (mut wo, mut we) = (u64::MAX, 0u64);
        for &c in subs {
            let ch = &self.phases[c];
            let (co, ce) = (ch.open_ns, ch.end_ns(end));
            if co < po || ce > pe {
                outside.push(format!("{}#{}", ch.name, ch.seq));
            }
            covered += ce - co;
            wo = wo.min(co);
            we = we.max(ce);
        }
        let dur = pe - po;
        let share = if dur > 0 {
            covered as f64 / dur as f64
        } else {
            1.0
        };
        let uncovered = dur.saturating_sub(covered);
        let ok =
            outside.is_empty() && (share >= MIN_CONTAINED_SHARE || uncovered <= MAX_UNCOVERED_NS);
        let g = cont
            .entry(p.name.clone())
            .or_insert_with(|| new_group(&p.name));
        g.instances += 1;
        g.worst_share = Some(g.worst_share.map_or(share, |w| w.min(share)));
        if !ok {
            g.failed += 1;
            g.verdict = Verdict::Fail;
            if g.detail.is_none() {
                g.detail = Some(if outside.is_empty() {
                    format!(
                        "{}#{}: sub-scopes cover {:.1}% (< {:.0}%), {:.1} ms uncovered (> {} ms)",
                        p.name,
                        p.seq,
                        share * 100.0,
                        MIN_CONTAINED_SHARE * 100.0,
                        uncovered as f64 / 1e6,
                        MAX_UNCOVERED_NS / 1_000_000
                    )
                } else {
                    format!(
                        "{}#{}: sub-scopes outside it: {}",
                        p.name,
                        p.seq,
                        outside.join(", ")
                    )
                });
            }
        }
        (wo, we)
    }

    /// Exclusivity of parent `p`: no leaf outside its sub-scopes `subs` overlaps
    /// their `window` (ns). Counted into `p`'s group of `excl`.
    fn check_exclusivity(
        &self,
        p: &Phase,
        subs: &[usize],
        (wo, we): (u64, u64),
        leaves: &[usize],
        excl: &mut BTreeMap<String, CheckGroup>,
    ) {
        let end = self.end_ns;
        let intruders: Vec<String> = leaves
            .iter()
            .copied()
            .filter(|&l| !self.inside_sub_scope(l, p.seq, subs))
            .filter(|&l| {
                let lp = &self.phases[l];
                let (lo, le) = (lp.open_ns, lp.end_ns(end));
                lo.max(wo) < le.min(we)
            })
            .map(|l| format!("{}#{}", self.phases[l].name, l))
            .collect();
        let g = excl
            .entry(p.name.clone())
            .or_insert_with(|| new_group(&p.name));
        g.instances += 1;
        if !intruders.is_empty() {
            g.failed += 1;
            g.verdict = Verdict::Fail;
            if g.detail.is_none() {
                g.detail = Some(format!(
                    "{}#{}: leaves outside it overlap its sub-scopes' window: {}",
                    p.name,
                    p.seq,
                    intruders.join(", ")
                ));
            }
        }
    }

    /// A dotted sub-scope (`denoise.step`) outside every instance of its parent
    /// name (`denoise`), where that name occurs in the run at all, is outside its
    /// parent: containment fails for that parent's group of `cont`.
    fn check_dotted_parents(&self, cont: &mut BTreeMap<String, CheckGroup>) {
        for q in &self.phases {
            let Some((parent_name, _)) = q.name.rsplit_once('.') else {
                continue;
            };
            if !self.phases.iter().any(|p| p.name == parent_name) {
                continue;
            }
            let mut up = q.parent;
            let mut inside = false;
            while let Some(u) = up {
                if self.phases[u].name == parent_name {
                    inside = true;
                    break;
                }
                up = self.phases[u].parent;
            }
            if inside {
                continue;
            }
            let g = cont
                .entry(parent_name.to_string())
                .or_insert_with(|| new_group(parent_name));
            g.failed += 1;
            g.verdict = Verdict::Fail;
            if g.detail.is_none() {
                g.detail = Some(format!(
                    "{}#{}: a sub-scope outside every {parent_name}",
                    q.name, q.seq
                ));
            }
        }
    }
}

/// An empty check group for phase `name`: no instance yet, passing.
fn new_group(name: &str) -> CheckGroup {
    CheckGroup {
        name: name.to_string(),
        instances: 0,
        failed: 0,
        worst_share: None,
        verdict: Verdict::Pass,
        detail: None,
    }
}

/// A check's summary from its groups: not applicable without groups, failed
/// when any group failed, else passed.
fn check_summary(groups: BTreeMap<String, CheckGroup>, min_share: Option<f64>) -> CheckSummary {
    let groups: Vec<CheckGroup> = groups.into_values().collect();
    let verdict = if groups.is_empty() {
        Verdict::NotApplicable
    } else if groups.iter().any(|g| g.verdict == Verdict::Fail) {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    CheckSummary {
        min_share,
        verdict,
        groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attrs;

    fn open(t: u64, n: &str) -> Marker {
        Marker::Open {
            t_ns: t,
            name: n.into(),
            attrs: Attrs::new(),
        }
    }
    fn close(t: u64, n: &str) -> Marker {
        Marker::Close {
            t_ns: t,
            name: n.into(),
            attrs: Attrs::new(),
        }
    }
    const S: u64 = 1_000_000_000;

    /// load 0-2 s, denoise 2-10 s with steps 2-6, 6-10, decode 10-12 s.
    fn render() -> Vec<Marker> {
        vec![
            open(0, "load.dit"),
            close(2 * S, "load.dit"),
            open(2 * S, "denoise"),
            open(2 * S, "denoise.step"),
            close(6 * S, "denoise.step"),
            open(6 * S, "denoise.step"),
            close(10 * S, "denoise.step"),
            Marker::Close {
                t_ns: 10 * S,
                name: "denoise".into(),
                attrs: attrs! {"peak_device_bytes" => 1234u64, "device_ms" => 7.5},
            },
            open(10 * S, "decode.video"),
            close(12 * S, "decode.video"),
        ]
    }

    #[test]
    fn nesting_coverage_and_checks_pass_on_a_clean_render() {
        let t = build_tree(&render(), 12 * S);
        let names: Vec<_> = t
            .phases
            .iter()
            .map(|p| (p.name.as_str(), p.depth, p.parent))
            .collect();
        assert_eq!(
            names,
            [
                ("load.dit", 0, None),
                ("denoise", 0, None),
                ("denoise.step", 1, Some(1)),
                ("denoise.step", 1, Some(1)),
                ("decode.video", 0, None)
            ]
        );
        let s = t.summary((Some(0), Some(13 * S)));
        assert_eq!(s.wall_s, Some(12.0));
        assert_eq!(s.run_wall_s, Some(13.0));
        assert_eq!(s.leaf_sum_s, 12.0);
        assert_eq!(s.coverage, Some(1.0));
        assert_eq!(s.unaccounted_s, Some(0.0));
        assert_eq!(s.containment.verdict, Verdict::Pass);
        assert_eq!(s.containment.groups[0].worst_share, Some(1.0));
        assert_eq!(s.exclusivity.verdict, Verdict::Pass);
        let rows = t.rows(&[]);
        assert_eq!(rows[1].peak_device_bytes, Some(1234));
        assert_eq!(rows[1].device_ms, Some(7.5));
        assert!(!rows[1].is_leaf && rows[2].is_leaf);
        assert_eq!(rows[1].peak_rss_bytes, None);
    }

    #[test]
    fn close_matches_innermost_open_of_same_name_and_unmatched_is_counted() {
        let m = vec![
            open(0, "a"),
            open(1, "a"),
            close(2, "a"),
            close(3, "b"),
            open(4, "c"),
        ];
        let t = build_tree(&m, 9);
        assert_eq!(t.phases[1].close_ns, Some(2));
        assert_eq!(t.phases[0].close_ns, None);
        assert_eq!(t.unmatched_closes, 1);
        assert_eq!(t.phases[2].parent, Some(0));
        let s = t.summary((None, None));
        assert_eq!(s.open_at_end, vec!["a", "c"]);
        // Open phases last to the end of the recording (9 ns).
        assert_eq!(t.rows(&[])[2].duration_s, 5e-9);
        assert_eq!(s.wall_s, Some(9e-9));
    }

    /// Red on: the floor gone (the short phase fails) or applied to a long
    /// one (it passes), or the uncovered time measured from the wrong end.
    #[test]
    fn a_short_phase_passes_containment_within_the_uncovered_floor() {
        const MS: u64 = 1_000_000;
        // Steps cover 16 of 20 ms (80%): 4 ms uncovered, under the floor.
        let short = vec![
            open(0, "denoise"),
            open(2 * MS, "denoise.step"),
            close(10 * MS, "denoise.step"),
            open(12 * MS, "denoise.step"),
            close(20 * MS, "denoise.step"),
            close(20 * MS, "denoise"),
        ];
        let s = build_tree(&short, 20 * MS).summary((None, None));
        assert_eq!(s.containment.verdict, Verdict::Pass, "{:?}", s.containment);
        assert_eq!(s.containment.groups[0].worst_share, Some(0.8));
        // The same shape at 100x (2 s, 400 ms uncovered) fails.
        let long: Vec<Marker> = short
            .iter()
            .map(|m| match m {
                Marker::Open { t_ns, name, .. } => open(t_ns * 100, name),
                Marker::Close { t_ns, name, .. } => close(t_ns * 100, name),
                other => other.clone(),
            })
            .collect();
        let s = build_tree(&long, 2000 * MS).summary((None, None));
        assert_eq!(s.containment.verdict, Verdict::Fail, "{:?}", s.containment);
        let d = s.containment.groups[0].detail.clone().unwrap_or_default();
        assert!(d.contains("400.0 ms uncovered"), "{d}");
    }

    #[test]
    fn a_thin_parent_fails_containment_with_its_share() {
        let mut m = render();
        // The second step ends at 7 s: steps cover 5 of 8 s.
        m[6] = close(7 * S, "denoise.step");
        let s = build_tree(&m, 12 * S).summary((None, None));
        assert_eq!(s.containment.verdict, Verdict::Fail);
        let g = &s.containment.groups[0];
        assert_eq!(g.worst_share, Some(5.0 / 8.0));
        assert!(g.detail.as_deref().unwrap().contains("62.5%"), "{g:?}");
        assert!(s.coverage.unwrap() < 0.95);
    }

    #[test]
    fn a_sub_scope_after_its_parent_closed_fails_containment() {
        let m = vec![
            open(0, "denoise"),
            open(0, "denoise.step"),
            close(100, "denoise.step"),
            close(100, "denoise"),
            open(200, "denoise.step"),
            close(300, "denoise.step"),
        ];
        let s = build_tree(&m, 300).summary((None, None));
        assert_eq!(s.containment.verdict, Verdict::Fail, "{:?}", s.containment);
        let d = s.containment.groups[0].detail.clone().unwrap_or_default();
        assert!(
            d.contains("denoise.step#2") && d.contains("outside every denoise"),
            "{d}"
        );
        // A dotted name whose parent name never occurs is not an orphan.
        let m = vec![open(0, "load.dit"), close(10, "load.dit")];
        let s = build_tree(&m, 10).summary((None, None));
        assert_eq!(s.containment.verdict, Verdict::NotApplicable);
    }

    #[test]
    fn a_leaf_overlapping_the_sub_scopes_fails_exclusivity() {
        let mut m = render();
        // First step ends at 5.9 s (steps still cover 98.75%); an `offload` leaf
        // runs in the gap, 5.91-5.99 s: inside denoise but not one of its steps.
        m[4] = close(5_900_000_000, "denoise.step");
        m.insert(5, open(5_910_000_000, "offload"));
        m.insert(6, close(5_990_000_000, "offload"));
        let s = build_tree(&m, 12 * S).summary((None, None));
        assert_eq!(s.containment.verdict, Verdict::Pass, "{:?}", s.containment);
        assert_eq!(s.exclusivity.verdict, Verdict::Fail);
        let d = s.exclusivity.groups[0].detail.as_deref().unwrap();
        assert!(d.contains("denoise#1") && d.contains("offload#3"), "{d}");
        // Touching at the boundary is not an overlap.
        let s = build_tree(&render(), 12 * S).summary((None, None));
        assert_eq!(s.exclusivity.verdict, Verdict::Pass);
    }

    #[test]
    fn a_phase_opened_inside_a_step_and_outliving_it_fails_containment() {
        let mut m = render();
        // decode.video opens at 8 s inside the second step and closes at 12 s.
        m[8] = open(8 * S, "decode.video");
        let s = build_tree(&m, 12 * S).summary((None, None));
        assert_eq!(s.containment.verdict, Verdict::Fail);
        let g = s
            .containment
            .groups
            .iter()
            .find(|g| g.name == "denoise.step")
            .unwrap();
        assert!(
            g.detail
                .as_deref()
                .unwrap()
                .contains("outside it: decode.video"),
            "{g:?}"
        );
    }

    #[test]
    fn sample_phase_and_stats_use_half_open_windows() {
        let t = build_tree(&render(), 12 * S);
        let mk = |t_ns: u64, rss: f64, util: Option<f64>| {
            let mut s = Sample::empty(t_ns);
            s.set("rss_bytes", Some(rss));
            s.set("gpu_util_pct", util);
            s.set("cpu_cores", Some(rss / 100.0));
            s
        };
        let samples = vec![
            mk(S, 100.0, Some(0.0)),
            mk(2 * S, 300.0, Some(50.0)),
            mk(5 * S, 200.0, None),
            mk(6 * S, 400.0, Some(0.0)),
            mk(13 * S, 999.0, Some(10.0)),
        ];
        let ph = t.phase_of_samples(&samples);
        assert_eq!(ph, vec![Some(0), Some(2), Some(2), Some(3), None]);
        let rows = t.rows(&samples);
        let d = &rows[1];
        assert_eq!(d.samples, 3);
        assert_eq!(d.peak_rss_bytes, Some(400));
        assert_eq!(d.gpu_busy_share, Some(0.5));
        assert_eq!(d.mean_gpu_util_pct, Some(25.0));
        assert_eq!(d.mean_cpu_cores, Some(3.0));
        assert_eq!(rows[4].samples, 0);
        assert_eq!(rows[4].mean_cpu_cores, None);
    }
}
