//! `harness diff A B`: two bundles side by side.
//!
//! Phase tables with deltas and ratios; every manifest field that changes what a
//! number means (binary, weights, levers, host, driver, cadence, contention, gates,
//! controls, exit, completion); the two renders' frames compared as rank compares a
//! pair's ([`crate::rank::fidelity::compare`]: PSNR over the stills both keep, the
//! largest sample difference, every frame's sha256); the engine's own facts
//! that differ (a phase's close attributes that are not readings: an arm, a
//! digest, a count; [`PhaseRow::close_facts`]); sample summaries (peaks,
//! GPU-busy share, page cache).
//! Output as markdown ([`markdown`]) or, with `--json`, as [`Diff`];
//! [`crate::cmd::diff`] holds the command's arguments and entry point.
//!
//! Promise: a pure function of the two bundles; phases keep A's open order, then the
//! phases only B has in B's order.

pub mod markdown;

use evidence::fragments::{
    Completion, Contention, Controls, Engine, Exit, Fragment, Gates, Gpu, Host, Lease, Levers,
    Profile, Run, Rung, Sampler, Schedule, Verdicted, Watchdog, Weights, WeightsCache,
};
use serde::Serialize;
use serde_json::Value;

use crate::bundle::facts::{Bundle, PhaseRow};
use crate::levers_spec::{GpmCounter, Unit};
use crate::rank::fidelity::{compare, PairFidelity};

/// The manifest fields compared, with a label: `(path, label)`; a path starts at a
/// fragment's key ([`Fragment::KEY`]) or a computed section's.
pub const FIELDS: &[(&[&str], &str)] = &[
    (&[Engine::KEY, "sha256"], "engine binary sha256"),
    (&[Engine::KEY, "version"], "engine version"),
    (&[Weights::KEY, "digest"], "weights digest"),
    (&[Weights::KEY, "synthesized"], "weights synthesized"),
    (&[Rung::KEY, "name"], "rung"),
    (&[Rung::KEY, "sha256"], "rung file sha256"),
    (&[Profile::KEY], "profile"),
    (&[Levers::KEY], "levers"),
    (&[Schedule::KEY], "schedule"),
    (&[Run::KEY, "hostname"], "hostname"),
    (&[Host::KEY, "cpu_model"], "cpu model"),
    (&[Host::KEY, "cores"], "cores"),
    (&[Host::KEY, "mem_total_bytes"], "memory bytes"),
    (&[Host::KEY, "kernel"], "kernel"),
    (&[Host::KEY, "os"], "os"),
    (&[Gpu::KEY, "name"], "gpu"),
    (&[Gpu::KEY, "driver"], "gpu driver"),
    (&[Gpu::KEY, "cuda"], "cuda"),
    (&[Gpu::KEY, "unified_memory"], "unified memory"),
    (&[Lease::KEY, "id"], "lease id"),
    (&[Sampler::KEY, "cadence_ms"], "sampler cadence ms"),
    (&[Sampler::KEY, "observer"], "observer"),
    (&["cadence"], "achieved cadence"),
    (
        &[Contention::KEY, "flagged"],
        "contended (at start or during)",
    ),
    (&[Contention::KEY, "detail"], "contention"),
    (&[WeightsCache::KEY], "weights in page cache at start"),
    (&[Gates::KEY], "gates"),
    (&[Controls::KEY], "controls"),
    (&[Watchdog::KEY, "tripped"], "watchdog tripped"),
    (&[Exit::KEY, "reason"], "exit reason"),
    (&[Exit::KEY, "code"], "exit code"),
    (&[Exit::KEY, "signal"], "exit signal"),
    (&[Completion::KEY, "verdict"], "completion"),
    (&[Completion::KEY, "frames"], "frames"),
    (&["complete"], "complete"),
];

/// One manifest field in both bundles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldDiff {
    /// Field path.
    pub field: String,
    /// Human label.
    pub label: String,
    /// Compact JSON of A's value (`null` when absent).
    pub a: String,
    /// Compact JSON of B's value.
    pub b: String,
    /// What a reviewer compares of A's value: `name=verdict` for gates and
    /// controls (their details carry readings that differ on every run), a one-line
    /// summary for the achieved cadence, the compact JSON otherwise.
    pub a_view: String,
    /// The same of B's value.
    pub b_view: String,
    /// Whether the views differ.
    pub differs: bool,
}

/// One phase name in both bundles (durations summed over instances).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseDiff {
    /// Phase name.
    pub phase: String,
    /// Instances in A.
    pub a_count: usize,
    /// Seconds in A.
    pub a_s: Option<f64>,
    /// Instances in B.
    pub b_count: usize,
    /// Seconds in B.
    pub b_s: Option<f64>,
    /// `b_s - a_s`.
    pub delta_s: Option<f64>,
    /// `b_s / a_s`.
    pub ratio: Option<f64>,
    /// Peak RSS inside the phase in A (sampled or the engine's reported mark,
    /// whichever is larger), bytes.
    pub a_peak_rss_bytes: Option<i64>,
    /// Peak RSS inside the phase in B (as for A), bytes.
    pub b_peak_rss_bytes: Option<i64>,
}

/// One whole-run summary in both bundles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryDiff {
    /// What is summarised.
    pub name: String,
    /// Its unit.
    pub unit: Unit,
    /// A's value.
    pub a: Option<f64>,
    /// B's value.
    pub b: Option<f64>,
    /// `b / a`.
    pub ratio: Option<f64>,
}

/// One engine fact (a close attribute that is not a reading) of a phase that
/// runs once in each bundle, where the two differ or one lacks it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FactDiff {
    /// Phase name.
    pub phase: String,
    /// Attribute name.
    pub attr: String,
    /// Compact JSON of A's value (`None` when A's phase does not carry it).
    pub a: Option<String>,
    /// Compact JSON of B's value.
    pub b: Option<String>,
}

/// The two renders' frames: B's against A's, as rank compares a pair's
/// baseline and treatment (A in the baseline's place).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FramesDiff {
    /// Compared: PSNR in dB over every RGB sample of the stills both keep
    /// (`inf` when identical), the largest sample difference, and the frames
    /// whose sha256 both `frames.parquet` hold and how many differ.
    Compared(PairFidelity),
    /// Not compared, and why (no still in common, an unreadable image, other
    /// geometry).
    NotCompared(String),
}

/// The comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    /// A's id.
    pub a: String,
    /// B's id.
    pub b: String,
    /// Every compared manifest field.
    pub fields: Vec<FieldDiff>,
    /// Phases.
    pub phases: Vec<PhaseDiff>,
    /// The engine facts that differ, phase by phase in [`Diff::phases`]' order
    /// (phases that run once in each bundle).
    pub facts: Vec<FactDiff>,
    /// How many engine facts were compared in all.
    pub facts_compared: usize,
    /// The frames.
    pub frames: FramesDiff,
    /// Whole-run summaries.
    pub summaries: Vec<SummaryDiff>,
}

fn at<'a>(m: &'a Value, path: &[&str]) -> &'a Value {
    path.iter()
        .try_fold(m, |v, k| v.get(k))
        .unwrap_or(&Value::Null)
}

/// The reviewer's view of manifest field `path` (see [`FieldDiff::a_view`]).
fn view(path: &[&str], v: &Value) -> String {
    match (path, v) {
        ([k], Value::Array(_)) if *k == Gates::KEY || *k == Controls::KEY => {
            let list = serde_json::from_value::<Vec<Verdicted>>(v.clone()).ok();
            crate::summary::verdicts(list.as_deref())
        }
        (["cadence"], Value::Object(c)) => {
            let f = |k: &str| c.get(k).and_then(Value::as_f64);
            let ms = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1} ms"));
            // Recomputed from the span (as `show` does), so that bundles sealed
            // with the older missed-ticks count compare like new ones.
            let counted = serde_json::from_value::<evidence::manifest::Cadence>(v.clone())
                .ok()
                .and_then(|c| c.deadlines_without_sample());
            let missed = match counted {
                Some((missed, n)) if n > 0 => format!("{:.1}%", 100.0 * missed as f64 / n as f64),
                _ => "-".into(),
            };
            format!(
                "every {} wanted; median {}, p99 {}, max {}; {missed} of deadlines without a sample",
                ms(f("expected_ms")),
                ms(f("median_interval_ms")),
                ms(f("p99_interval_ms")),
                ms(f("max_interval_ms"))
            )
        }
        _ => v.to_string(),
    }
}

/// The weights' page-cache state at engine start as a reviewer compares it: the
/// policy and the resident share in whole percent (`bundle::manifest::cache_at_start`:
/// the `weights_cache` fragment, or the `weights-cache` gate of bundles sealed
/// before it; both gates read `pass` whether 100% or 4% was resident, so the gate
/// verdicts alone hide the difference).
fn cache_view(manifest: &Value) -> String {
    match crate::bundle::manifest::cache_at_start_of(manifest) {
        Some(c) => format!(
            "{}: {:.0}% resident",
            c.policy.as_deref().unwrap_or("?"),
            100.0 * c.share
        ),
        None => "not recorded".into(),
    }
}

/// Compare two bundles given their facts and their raw manifests.
pub fn diff(a: &Bundle, ma: &Value, b: &Bundle, mb: &Value) -> Diff {
    let fields = FIELDS
        .iter()
        .map(|(path, label)| {
            let (va, vb) = (at(ma, path), at(mb, path));
            let (a_view, b_view) = if *path == [WeightsCache::KEY] {
                (cache_view(ma), cache_view(mb))
            } else {
                (view(path, va), view(path, vb))
            };
            FieldDiff {
                field: path.join("."),
                label: label.to_string(),
                a: va.to_string(),
                b: vb.to_string(),
                differs: a_view != b_view,
                a_view,
                b_view,
            }
        })
        .collect();
    let mut names: Vec<&str> = Vec::new();
    for p in a.phases.iter().chain(&b.phases) {
        if !names.contains(&p.name.as_str()) {
            names.push(&p.name);
        }
    }
    let peak = |x: &Bundle, n: &str| {
        x.phases
            .iter()
            .filter(|p| p.name == n)
            .filter_map(PhaseRow::peak_host_rss_bytes)
            .max()
    };
    let phases: Vec<PhaseDiff> = names
        .into_iter()
        .map(|n| {
            let (sa, sb) = (a.phase_total_s(n), b.phase_total_s(n));
            let (a_s, b_s) = (sa.map(|x| x.0), sb.map(|x| x.0));
            PhaseDiff {
                phase: n.to_string(),
                a_count: a.phases.iter().filter(|p| p.name == n).count(),
                a_s,
                b_count: b.phases.iter().filter(|p| p.name == n).count(),
                b_s,
                delta_s: a_s.zip(b_s).map(|(x, y)| y - x),
                ratio: ratio(a_s, b_s),
                a_peak_rss_bytes: peak(a, n),
                b_peak_rss_bytes: peak(b, n),
            }
        })
        .collect();
    let (facts, facts_compared) = fact_diffs(a, b, &phases);
    let (pa, pb) = (a.peaks(None), b.peaks(None));
    let busy = |p: &crate::bundle::facts::SamplePeaks| {
        (p.gpu_util_samples > 0).then(|| p.gpu_busy_samples as f64 / p.gpu_util_samples as f64)
    };
    let s = |name: &str, unit, x: Option<f64>, y: Option<f64>| SummaryDiff {
        name: name.to_string(),
        unit,
        a: x,
        b: y,
        ratio: ratio(x, y),
    };
    let summaries = vec![
        s(
            "render wall",
            Unit::Seconds,
            a.render_wall_s(),
            b.render_wall_s(),
        ),
        s(
            "samples",
            Unit::Share,
            Some(pa.samples as f64),
            Some(pb.samples as f64),
        ),
        s("peak rss", Unit::Bytes, pa.rss_bytes, pb.rss_bytes),
        s(
            "peak unified footprint",
            Unit::Bytes,
            pa.unified_bytes,
            pb.unified_bytes,
        ),
        s(
            "peak weights page cache",
            Unit::Bytes,
            pa.weights_cached_bytes,
            pb.weights_cached_bytes,
        ),
        s(
            "peak engine gpu memory",
            Unit::Bytes,
            pa.engine_gpu_mem_bytes,
            pb.engine_gpu_mem_bytes,
        ),
        s("gpu-busy share", Unit::Share, busy(&pa), busy(&pb)),
    ];
    let mut summaries = summaries;
    summaries.extend(gpm_rows(a, b));
    let frames = match compare(a, b) {
        Ok(p) => FramesDiff::Compared(p),
        Err(why) => FramesDiff::NotCompared(why),
    };
    Diff {
        a: a.id.clone(),
        b: b.id.clone(),
        fields,
        phases,
        facts,
        facts_compared,
        frames,
        summaries,
    }
}

/// The engine facts of every phase that runs once in each bundle
/// ([`PhaseRow::close_facts`]) that differ, with how many were compared
/// (the union of both phases' fact names, phase by phase).
fn fact_diffs(a: &Bundle, b: &Bundle, phases: &[PhaseDiff]) -> (Vec<FactDiff>, usize) {
    fn once<'x>(x: &'x Bundle, n: &str) -> Option<&'x PhaseRow> {
        let mut it = x.phases.iter().filter(|p| p.name == n);
        match (it.next(), it.next()) {
            (Some(p), None) => Some(p),
            _ => None,
        }
    }
    let mut out = Vec::new();
    let mut compared = 0;
    for ph in phases {
        let (Some(pa), Some(pb)) = (once(a, &ph.phase), once(b, &ph.phase)) else {
            continue;
        };
        let mut names: Vec<&String> = pa.close_facts.keys().chain(pb.close_facts.keys()).collect();
        names.sort();
        names.dedup();
        for n in names {
            compared += 1;
            let (va, vb) = (pa.close_facts.get(n), pb.close_facts.get(n));
            if va != vb {
                out.push(FactDiff {
                    phase: ph.phase.clone(),
                    attr: n.clone(),
                    a: va.map(Value::to_string),
                    b: vb.map(Value::to_string),
                });
            }
        }
    }
    (out, compared)
}

/// Each top-level phase's median GPM tensor-pipe and SM activity in one
/// bundle, shares 0..1 over the windows wholly inside the phase's instances
/// (`specs/bundle.md`, "GPM windows"; [`crate::rank::metric::gpm_share`], the
/// same figure rank reads for a `gpm-activity` metric): `(phase, tensor, sm)`.
/// Empty for a bundle without GPM windows.
fn gpm_by_phase(b: &Bundle) -> Vec<(String, Option<f64>, Option<f64>)> {
    if b.gpm.is_empty() {
        return Vec::new();
    }
    let mut names: Vec<&str> = Vec::new();
    for p in b.phases.iter().filter(|p| p.depth == 0) {
        if !names.contains(&p.name.as_str()) {
            names.push(&p.name);
        }
    }
    names
        .into_iter()
        .map(|n| {
            let share = |c| crate::rank::metric::gpm_share(b, n, c);
            (
                n.to_string(),
                share(GpmCounter::Tensor),
                share(GpmCounter::Sm),
            )
        })
        .collect()
}

/// GPM rows of the diff: per top-level phase with a figure in either bundle,
/// its tensor-pipe and SM activity shares.
fn gpm_rows(a: &Bundle, b: &Bundle) -> Vec<SummaryDiff> {
    let (ga, gb) = (gpm_by_phase(a), gpm_by_phase(b));
    let mut names: Vec<&str> = Vec::new();
    for (n, _, _) in ga.iter().chain(&gb) {
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    let find = |g: &[(String, Option<f64>, Option<f64>)], n: &str| {
        g.iter()
            .find(|(m, _, _)| m == n)
            .map_or((None, None), |(_, t, s)| (*t, *s))
    };
    let mut out = Vec::new();
    for n in names {
        let ((ta, sa), (tb, sb)) = (find(&ga, n), find(&gb, n));
        for (what, x, y) in [("tensor-pipe", ta, tb), ("SM", sa, sb)] {
            if x.is_some() || y.is_some() {
                out.push(SummaryDiff {
                    name: format!("GPM {what} activity in {n} (median share)"),
                    unit: Unit::Share,
                    a: x,
                    b: y,
                    ratio: share_ratio(x, y),
                });
            }
        }
    }
    out
}

/// The smallest GPM share a ratio is taken against: below it A's share prints
/// as 0.000 or 0.001 (a phase of one or two GPM windows that barely touched
/// the pipe) and B / A would be a large number about nothing (s38-dev2's
/// `decode.video`, 0.000 against 0.472, printed 55802).
pub const GPM_RATIO_FLOOR: f64 = 0.001;

/// `b / a` of two GPM shares, `None` where `a` is below [`GPM_RATIO_FLOOR`].
fn share_ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    ratio(a.filter(|v| *v >= GPM_RATIO_FLOOR), b)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) if x != 0.0 => Some(y / x),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::markdown::markdown;
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;
    use serde_json::json;

    /// Red on: a fact that differs left out, one that agrees listed, a fact of
    /// one side only dropped, a phase that runs more than once compared
    /// instance against instance, or the count of compared facts wrong.
    #[test]
    fn engine_facts_that_differ_are_listed_phase_by_phase() {
        let mut a = sample_bundle("aaa");
        let mut b = sample_bundle("bbb");
        let facts = |pairs: &[(&str, Value)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<std::collections::BTreeMap<String, Value>>()
        };
        a.phases[0].close_facts =
            facts(&[("gemm_algo", json!("heuristic")), ("copies", json!(360))]);
        b.phases[0].close_facts = facts(&[
            ("gemm_algo", json!("tuned")),
            ("copies", json!(360)),
            ("gemm_algos_sha256", json!("b227")),
        ]);
        // denoise.step runs twice in each: never compared.
        let steps: Vec<usize> = (0..b.phases.len())
            .filter(|&i| b.phases[i].name == "denoise.step")
            .collect();
        assert_eq!(steps.len(), 2);
        b.phases[steps[0]].close_facts = facts(&[("sigma_index", json!(1))]);
        let m = json!({});
        let d = diff(&a, &m, &b, &m);
        let got: Vec<(&str, &str, Option<&str>, Option<&str>)> = d
            .facts
            .iter()
            .map(|f| {
                (
                    f.phase.as_str(),
                    f.attr.as_str(),
                    f.a.as_deref(),
                    f.b.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "load.dit",
                    "gemm_algo",
                    Some("\"heuristic\""),
                    Some("\"tuned\"")
                ),
                ("load.dit", "gemm_algos_sha256", None, Some("\"b227\"")),
            ]
        );
        assert_eq!(d.facts_compared, 3);
        let md = markdown(&d);
        assert!(
            md.contains("## Engine facts that differ (2 of 3 compared)"),
            "{md}"
        );
        assert!(
            md.contains("| load.dit | gemm_algo | `\"heuristic\"` | `\"tuned\"` |"),
            "{md}"
        );
        assert!(
            md.contains("| load.dit | gemm_algos_sha256 | — | `\"b227\"` |"),
            "{md}"
        );
    }

    /// Red on: a ratio taken against a GPM share too small to print (the
    /// floor dropped, or the diff's GPM rows not using it), or none against
    /// one above it.
    #[test]
    fn a_gpm_ratio_needs_a_share_that_prints() {
        let window = |start_s: f64, tensor_pct: f64| evidence::phase_table::GpmFigure {
            start_ns: (start_s * 1e9) as i64,
            end_ns: ((start_s + 0.2) * 1e9) as i64,
            tensor_pct: Some(tensor_pct),
            sm_pct: Some(50.0),
            occupancy_pct: None,
            dram_pct: None,
        };
        // load.dit runs 1-3 s, denoise 3-13 s (sample_bundle).
        let mut a = sample_bundle("aaa");
        a.gpm = vec![window(1.5, GPM_RATIO_FLOOR * 10.0), window(5.0, 50.0)];
        let mut b = sample_bundle("bbb");
        b.gpm = vec![window(1.5, 47.0), window(5.0, 25.0)];
        let d = diff(&a, &json!({}), &b, &json!({}));
        let row = |name: &str| {
            d.summaries
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("no row {name}: {:?}", d.summaries))
        };
        let load = row("GPM tensor-pipe activity in load.dit (median share)");
        assert_eq!(
            (load.a, load.b, load.ratio),
            (Some(GPM_RATIO_FLOOR / 10.0), Some(0.47), None)
        );
        let den = row("GPM tensor-pipe activity in denoise (median share)");
        assert_eq!(den.ratio, Some(0.5));
        assert_eq!(share_ratio(Some(GPM_RATIO_FLOOR), Some(0.002)), Some(2.0));
    }

    #[test]
    fn phases_deltas_ratios_and_manifest_differences() {
        let a = sample_bundle("aaa");
        let mut b = sample_bundle("bbb");
        b.phases[0].duration_s = Some(1.0); // load.dit 2 s -> 1 s
        b.phases.push(crate::bundle::facts::PhaseRow {
            name: "decode.video".into(),
            ..b.phases[0].clone()
        });
        let ma = json!({"engine": {"sha256": "x"}, "levers": {"vae": "host"}, "gpu": {"driver": "580"}, "exit": {"reason": "completed"}});
        let mb = json!({"engine": {"sha256": "y"}, "levers": {"vae": "host"}, "gpu": {"driver": "575"}, "exit": {"reason": "completed"}});
        let d = diff(&a, &ma, &b, &mb);
        let differ: Vec<&str> = d
            .fields
            .iter()
            .filter(|f| f.differs)
            .map(|f| f.field.as_str())
            .collect();
        assert_eq!(differ, ["engine.sha256", "gpu.driver"]);
        let load = &d.phases[0];
        assert_eq!(
            (load.phase.as_str(), load.a_s, load.b_s),
            ("load.dit", Some(2.0), Some(1.0))
        );
        assert_eq!((load.delta_s, load.ratio), (Some(-1.0), Some(0.5)));
        let names: Vec<&str> = d.phases.iter().map(|p| p.phase.as_str()).collect();
        assert_eq!(
            names,
            ["load.dit", "denoise", "denoise.step", "decode.video"]
        );
        let dec = d.phases.last().unwrap();
        assert_eq!(
            (dec.a_count, dec.a_s, dec.b_count, dec.ratio),
            (0, None, 1, None)
        );
        let step = &d.phases[2];
        assert_eq!((step.a_count, step.a_s), (2, Some(10.0)));
        let busy = d
            .summaries
            .iter()
            .find(|s| s.name == "gpu-busy share")
            .unwrap();
        assert_eq!(busy.a, Some(8.0 / 14.0));
        let md = markdown(&d);
        assert!(
            md.contains("| engine binary sha256 | `\"x\"` | `\"y\"` |"),
            "{md}"
        );
        assert!(
            md.contains("| load.dit | 1 | 2.000 s | 1 | 1.000 s | -1.000 s | 0.500 |"),
            "{md}"
        );
        assert!(md.contains("Manifest differences (2 of"), "{md}");
    }

    /// The frames as rank compares a pair's: B's stills against A's. Red when
    /// the comparison is dropped (every case reads "Not compared") or its
    /// result misplaced (identical stills reported with a PSNR).
    #[test]
    fn frames_are_compared_as_rank_compares_a_pairs() {
        use crate::rank::fidelity::tests::{scratch, with_frames};
        let root = scratch("diff-frames");
        let m = json!({});
        let a = with_frames(&root, "a", 100, 100);
        // One sample of 72 off by 10: MSE = 100/72.
        let b = with_frames(&root, "b", 100, 110);
        let d = diff(&a, &m, &b, &m);
        let FramesDiff::Compared(p) = &d.frames else {
            panic!("not compared: {:?}", d.frames)
        };
        assert_eq!(p.max_abs_error, 10);
        assert!((p.psnr_db - 10.0 * (65025.0f64 * 0.72).log10()).abs() < 1e-9);
        let md = markdown(&d);
        assert!(
            md.contains("PSNR of B against A over the stills (first.png, middle.png, last.png): 46.70 dB; the largest sample difference is 10 of 255."),
            "{md}"
        );
        let j = serde_json::to_value(&d).unwrap();
        assert_eq!(j["frames"]["compared"]["max_abs_error"], 10, "{j}");
        // Identical stills: said so, no PSNR.
        let same = with_frames(&root, "s", 100, 100);
        let md = markdown(&diff(&a, &m, &same, &m));
        assert!(md.contains("are identical sample for sample"), "{md}");
        assert!(!md.contains("PSNR of B"), "{md}");
        // A bundle without stills: why, in both outputs.
        let bare = sample_bundle("bare");
        let d = diff(&a, &m, &bare, &m);
        let md = markdown(&d);
        assert!(
            md.contains("Not compared: no frame image kept by both"),
            "{md}"
        );
        let j = serde_json::to_value(&d).unwrap();
        assert!(
            j["frames"]["not_compared"]
                .as_str()
                .is_some_and(|w| w.contains("no frame image")),
            "{j}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn gates_compare_by_verdict_and_cadence_by_its_summary() {
        let a = sample_bundle("aaa");
        let b = sample_bundle("bbb");
        let gates = |detail: &str, verdict: &str| {
            json!([{"name": "store-durable", "verdict": "pass", "detail": "/s is durable"},
                   {"name": "headroom", "verdict": verdict, "detail": detail}])
        };
        // 396 samples over `slots` deadlines of 100 ms from `first`; the stored
        // missed_ticks (an older bundle's count) is ignored.
        let cad = |first: u64, slots: u64| {
            json!({"expected_ms": 100.0, "first_t_ns": first,
                   "last_t_ns": first + (slots - 1) * 100_000_000, "median_interval_ms": 100.0,
                   "p99_interval_ms": 210.44, "max_interval_ms": 234.8, "missed_ticks": 157,
                   "samples": 396})
        };
        let m = |g: Value, c: Value| json!({"gates": g, "cadence": c});
        // Readings in the details and clock origins differ on every run: no difference.
        let d = diff(
            &a,
            &m(gates("MemAvailable 133 GB", "pass"), cad(1, 400)),
            &b,
            &m(gates("MemAvailable 131 GB", "pass"), cad(9, 400)),
        );
        assert!(d.fields.iter().all(|f| !f.differs), "{:?}", d.fields);
        // A verdict that changed, and a cadence that degraded, do show.
        let d = diff(
            &a,
            &m(gates("x", "pass"), cad(1, 400)),
            &b,
            &m(gates("x", "refuse"), cad(1, 500)),
        );
        let g = d.fields.iter().find(|f| f.field == "gates").unwrap();
        assert!(g.differs);
        assert_eq!(g.b_view, "store-durable=pass headroom=refuse");
        let c = d.fields.iter().find(|f| f.field == "cadence").unwrap();
        assert!(c.differs);
        assert_eq!(
            c.a_view,
            "every 100.0 ms wanted; median 100.0 ms, p99 210.4 ms, max 234.8 ms; 1.0% of deadlines without a sample"
        );
        assert!(
            c.b_view.ends_with("20.8% of deadlines without a sample"),
            "{}",
            c.b_view
        );
        let md = markdown(&d);
        assert!(md.contains("| gates | `store-durable=pass headroom=pass` | `store-durable=pass headroom=refuse` |"), "{md}");
    }

    /// Two as-is runs whose gates both pass, one warm and one cold: the diff shows
    /// the page-cache state (the host-threads campaign 7f0605dedf9a's round 1).
    #[test]
    fn the_cache_state_at_start_shows_where_the_gates_agree() {
        let (a, b) = (sample_bundle("aaa"), sample_bundle("bbb"));
        let gate = |after: &str, pct: &str| {
            json!({"gates": [{"name": "weights-cache", "verdict": "pass", "detail": format!(
                "as-is: {after} of 35.487 GiB resident before, {after} GiB after ({pct}%), 0.00 s"
            )}]})
        };
        let d = diff(&a, &gate("35.487", "100.0"), &b, &gate("1.313", "3.7"));
        let field =
            |d: &Diff, name: &str| d.fields.iter().find(|f| f.field == name).cloned().unwrap();
        let c = field(&d, "weights_cache");
        assert!(c.differs);
        assert_eq!(
            (c.a_view.as_str(), c.b_view.as_str()),
            ("as-is: 100% resident", "as-is: 4% resident")
        );
        assert!(!field(&d, "gates").differs);
        // With the fragment its policy and bytes are read; an unrecorded state says so.
        let f = json!({"weights_cache": {"policy": "warm", "total_bytes": 1000u64,
            "resident_before_bytes": 0u64, "resident_after_bytes": 990u64, "seconds": 1.0}});
        let d = diff(&a, &f, &b, &json!({}));
        let c = field(&d, "weights_cache");
        assert_eq!(
            (c.a_view.as_str(), c.b_view.as_str()),
            ("warm: 99% resident", "not recorded")
        );
    }
}
