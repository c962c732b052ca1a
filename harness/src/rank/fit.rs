//! Phase scaling: each phase's wall fitted as `fixed + per_voxel * voxels` across rungs
//! by ordinary least squares, naming the phases that do not scale.
//!
//! The shape to catch (the `host-threads` hypothesis in `specs/levers.toml`): one
//! single-threaded phase that takes about the same seconds at two rungs whose voxel
//! counts differ several times over — a constant, pure overhead. A phase "does not
//! scale" when its fitted growth across the measured voxel range is below
//! `voxel_ratio ^ `[`FLAT_EXPONENT`], i.e. its scaling exponent
//! `ln(fit(v_max) / fit(v_min)) / ln(v_max / v_min)` is below [`FLAT_EXPONENT`]
//! (0 = constant, 1 = proportional to voxels).
//!
//! Which bundles: complete, uncontended ones (campaign or not). A group is one engine
//! sha256, host, weights digest and device, profile, lever assignment and page-cache
//! state at start (warm, cold, partial or unrecorded: a load phase read from disk is
//! not the same line as one read from memory), so lever arms never mix into one fit,
//! and neither do models: rung 2 (ltxv-2b) and rung 3 (ltxv-13b) differ in voxels
//! *and* in work per voxel, and a line through them would credit the model's size to
//! the resolution. The lever assignment is the one the run ran under
//! ([`Bundle::assignment`]: the arms the engine and the sampler reported, with the
//! passed ones over them), so a campaign arm that equals the profile's default joins
//! the plain runs of that profile. One fit is made per model (weights digest and
//! device): of that model's groups with at least [`MIN_POINTS`] runs at two or more
//! distinct voxel counts, the one with the most bundles.
//!
//! Outliers: at each rung, a phase's value more than 20% (and 0.05 s) from that
//! rung's median is left out of that phase's fit and named (the rank's own rule,
//! `specs/outliers.md`; a rung with fewer than 3 points flags nothing). A machine's
//! first run reads a cold page cache or pays the first CUDA initialization, and one
//! such point at a rung of three would otherwise make a constant phase look as if
//! it grew with the resolution.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

use crate::bundle::facts::Bundle;
use crate::rank::outliers::{outlier_indices, MIN_ABS_S};
use crate::rank::pairing::CACHE_SHARE_MAX_GAP;

/// Scaling exponent below which a phase is named as not scaling.
pub const FLAT_EXPONENT: f64 = 0.1;

/// The fit of one phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseFit {
    /// Phase name.
    pub phase: String,
    /// Data points fitted (one per bundle holding the phase, outliers left out).
    pub points: usize,
    /// Bundles whose value of this phase was an outlier at its rung (the rank's rule,
    /// [`crate::rank::outliers::outlier_indices`]) and was left out of the fit, by id.
    pub left_out: Vec<String>,
    /// Fixed cost, seconds.
    pub fixed_s: f64,
    /// Cost per million output voxels, seconds.
    pub per_mvoxel_s: f64,
    /// Coefficient of determination of the fit (1 when every point lies on it; 0 when
    /// the durations do not vary).
    pub r2: f64,
    /// Mean measured wall at the largest rung over the points fitted, seconds.
    pub mean_at_max_s: f64,
    /// Share of the render wall at the largest rung (mean over its bundles).
    pub share_of_wall_at_max: f64,
    /// Scaling exponent over the voxel range; `None` when a fitted end is not positive.
    pub exponent: Option<f64>,
    /// Whether the phase is named as not scaling.
    pub does_not_scale: bool,
}

/// The scaling fit over one group of bundles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingFit {
    /// The group's engine sha256.
    pub engine_sha256: String,
    /// The group's host key.
    pub host: String,
    /// The group's weights digest and device (`sha256:… on cuda`).
    pub model: String,
    /// The group's profile and lever assignment (`profile; a=x,b=y`).
    pub config: String,
    /// Distinct voxel counts, ascending, with the rung names seen at each.
    pub rungs: Vec<(u64, String)>,
    /// Bundle ids in the group, sorted.
    pub bundle_ids: Vec<String>,
    /// One fit per phase name, slowest at the largest rung first.
    pub phases: Vec<PhaseFit>,
}

/// Why no fit was made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoFit {
    /// What is missing.
    pub missing: String,
}

type GroupKey = (String, String, String, String);

/// How the fits were formed, in one sentence pair for the reports.
pub fn method_text() -> String {
    format!(
        "One fit per model (weights and device): of its groups of one engine, host, lever assignment as run (passed or default) and cache state, the largest with {MIN_POINTS} or more runs at two or more rungs. At each rung, a phase's value more than 20% and 0.05 s from that rung's median is left out of the phase's fit and named (specs/outliers.md)."
    )
}

/// The fewest runs a phase is fitted from: a fixed + per-voxel line has two
/// parameters, so two points always fit it exactly (R² = 1 whatever the data);
/// a third is the first that can disagree with the line.
pub const MIN_POINTS: usize = 3;

fn group_key(b: &Bundle) -> GroupKey {
    let levers = b
        .assignment()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    (
        b.engine_sha256.clone(),
        b.host.clone(),
        format!(
            "{} on {}",
            b.weights_digest,
            b.device.as_deref().unwrap_or("?")
        ),
        format!(
            "{}; {}; cache {}",
            b.profile,
            if levers.is_empty() { "-" } else { &levers },
            cache_state(b.cache_share_at_start)
        ),
    )
}

/// The page-cache state a run started in, as a fit group sees it: `warm` within
/// [`CACHE_SHARE_MAX_GAP`] of every byte resident, `cold` within it of none,
/// `partial` between, `unrecorded` for bundles without the figure.
fn cache_state(share: Option<f64>) -> &'static str {
    match share {
        None => "unrecorded",
        Some(s) if s >= 1.0 - CACHE_SHARE_MAX_GAP => "warm",
        Some(s) if s <= CACHE_SHARE_MAX_GAP => "cold",
        Some(_) => "partial",
    }
}

/// Fit every phase of each model's best group of `bundles` (any order): one fit per
/// weights digest and device, ordered by the group's smallest voxel count (then its
/// key), or what is missing when no model has a group to fit.
pub fn fit(bundles: &[Bundle]) -> Result<Vec<ScalingFit>, NoFit> {
    let mut groups: BTreeMap<GroupKey, Vec<&Bundle>> = BTreeMap::new();
    for b in bundles {
        if b.incomplete.is_none() && b.contended.is_none() && b.voxels > 0 {
            groups.entry(group_key(b)).or_default().push(b);
        }
    }
    // Per model (the key's weights-and-device part), the group with most bundles;
    // ties go to the smallest key (BTreeMap order; only a strictly larger group
    // replaces the one held).
    let mut best: BTreeMap<&str, (&GroupKey, &Vec<&Bundle>)> = BTreeMap::new();
    for (k, v) in groups.iter().filter(|(_, v)| {
        v.len() >= MIN_POINTS && v.iter().map(|b| b.voxels).collect::<BTreeSet<_>>().len() >= 2
    }) {
        match best.get(k.2.as_str()) {
            Some((_, held)) if held.len() >= v.len() => {}
            _ => {
                best.insert(k.2.as_str(), (k, v));
            }
        }
    }
    if best.is_empty() {
        return Err(NoFit {
            missing: format!("{MIN_POINTS} or more complete, uncontended runs of one engine, host, weights, device and lever assignment at two or more rungs of different voxel counts (a line through two points fits exactly, so its R² says nothing)"),
        });
    }
    let mut fits: Vec<ScalingFit> = best
        .into_values()
        .map(|(key, members)| fit_group(key, members))
        .collect();
    fits.sort_by(|a, b| {
        let lo = |f: &ScalingFit| f.rungs.first().map_or(0, |r| r.0);
        lo(a).cmp(&lo(b)).then_with(|| {
            (&a.model, &a.engine_sha256, &a.host, &a.config).cmp(&(
                &b.model,
                &b.engine_sha256,
                &b.host,
                &b.config,
            ))
        })
    });
    Ok(fits)
}

/// Fit every phase of one group's bundles.
fn fit_group(key: &GroupKey, members: &[&Bundle]) -> ScalingFit {
    let mut members: Vec<&Bundle> = members.to_vec();
    members.sort_by(|a, b| a.id.cmp(&b.id));
    let mut rungs: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for b in &members {
        rungs.entry(b.voxels).or_default().insert(b.rung.clone());
    }
    let v_min = *rungs.keys().next().unwrap_or(&0) as f64;
    let v_max = *rungs.keys().next_back().unwrap_or(&0) as f64;
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for b in &members {
        names.extend(b.phases.iter().map(|p| p.name.as_str()));
    }
    let mut phases = Vec::new();
    for name in names {
        // Each rung's points of this phase, then the outliers among them by the
        // rank's own rule (specs/outliers.md: more than 20% and 0.05 s from the
        // rung's median; fewer than 3 points at a rung flag nothing) left out and
        // named, so one first run (a cold page cache, a first CUDA initialization)
        // does not bend the line.
        let mut by_rung: BTreeMap<u64, Vec<(&Bundle, f64)>> = BTreeMap::new();
        for b in &members {
            if let Some((s, _)) = b.phase_total_s(name) {
                by_rung.entry(b.voxels).or_default().push((b, s));
            }
        }
        let mut kept: Vec<(&Bundle, f64)> = Vec::new();
        let mut left_out: Vec<String> = Vec::new();
        for points in by_rung.values() {
            let values: Vec<f64> = points.iter().map(|p| p.1).collect();
            let out = outlier_indices(&values, MIN_ABS_S);
            for (i, p) in points.iter().enumerate() {
                if out.contains(&i) {
                    left_out.push(p.0.id.clone());
                } else {
                    kept.push(*p);
                }
            }
        }
        let xs: Vec<f64> = kept.iter().map(|p| p.0.voxels as f64).collect();
        let ys: Vec<f64> = kept.iter().map(|p| p.1).collect();
        let at_max: Vec<&(&Bundle, f64)> =
            kept.iter().filter(|p| p.0.voxels as f64 == v_max).collect();
        if xs.len() < MIN_POINTS || distinct(&xs) < 2 || at_max.is_empty() {
            continue;
        }
        let n_max = at_max.len() as f64;
        let mean_at_max = at_max.iter().map(|p| p.1).sum::<f64>() / n_max;
        let share_max = at_max
            .iter()
            .map(|p| p.0.render_wall_s().map_or(0.0, |w| p.1 / w))
            .sum::<f64>()
            / n_max;
        let (fixed, slope, r2) = least_squares(&xs, &ys);
        let (lo, hi) = (fixed + slope * v_min, fixed + slope * v_max);
        let exponent = (lo > 0.0 && hi > 0.0).then(|| (hi / lo).ln() / (v_max / v_min).ln());
        left_out.sort();
        phases.push(PhaseFit {
            phase: name.to_string(),
            points: xs.len(),
            left_out,
            fixed_s: fixed,
            per_mvoxel_s: slope * 1e6,
            r2,
            mean_at_max_s: mean_at_max,
            share_of_wall_at_max: share_max,
            exponent,
            does_not_scale: exponent.is_some_and(|e| e < FLAT_EXPONENT),
        });
    }
    phases.sort_by(|a, b| {
        b.mean_at_max_s
            .total_cmp(&a.mean_at_max_s)
            .then_with(|| a.phase.cmp(&b.phase))
    });
    ScalingFit {
        engine_sha256: key.0.clone(),
        host: key.1.clone(),
        model: key.2.clone(),
        config: key.3.clone(),
        rungs: rungs
            .into_iter()
            .map(|(v, names)| (v, names.into_iter().collect::<Vec<_>>().join(",")))
            .collect(),
        bundle_ids: members.iter().map(|b| b.id.clone()).collect(),
        phases,
    }
}

/// The number of distinct values in `xs` (bitwise).
fn distinct(xs: &[f64]) -> usize {
    let mut v: Vec<u64> = xs.iter().map(|x| x.to_bits()).collect();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// Ordinary least squares of `ys` on `xs`: `(intercept, slope, r2)`. Needs two
/// distinct `xs`.
pub fn least_squares(xs: &[f64], ys: &[f64]) -> (f64, f64, f64) {
    let n = xs.len() as f64;
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxx += (x - mx) * (x - mx);
        sxy += (x - mx) * (y - my);
        syy += (y - my) * (y - my);
    }
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let intercept = my - slope * mx;
    let r2 = if syy > 0.0 && sxx > 0.0 {
        (sxy * sxy / (sxx * syy)).clamp(0.0, 1.0)
    } else {
        0.0
    };
    (intercept, slope, r2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;
    use crate::bundle::facts::PhaseRow;

    /// A bundle at `voxels` with a constant phase (`host.pack`, 1731 s +- jitter) and
    /// a proportional one (`denoise`, 1e-3 s per voxel).
    fn at(id: &str, voxels: u64, jitter: f64) -> Bundle {
        let mut b = sample_bundle(id);
        b.voxels = voxels;
        b.rung = format!("r{voxels}");
        let row = |name: &str, open: i64, dur: f64| PhaseRow {
            name: name.into(),
            depth: 0,
            open_ns: open,
            close_ns: Some(open + (dur * 1e9) as i64),
            duration_s: Some(dur),
            is_leaf: true,
            peak_rss_bytes: None,
            peak_host_bytes: None,
            peak_device_bytes: None,
            device_open_s: None,
            gpu_busy_share: None,
            samples: None,
            close_facts: Default::default(),
        };
        let d = 1e-3 * voxels as f64 * (1.0 + jitter);
        b.phases = vec![
            row("host.pack", 0, 1731.0 + jitter * 10.0),
            row("denoise", 1_800_000_000_000, d),
        ];
        b
    }

    #[test]
    fn the_seeds_constant_phase_is_named_and_the_linear_one_is_not() {
        let mut bundles = Vec::new();
        for (i, j) in [-0.02, 0.01, 0.03].iter().enumerate() {
            bundles.push(at(&format!("s{i}"), 400_000, *j));
            bundles.push(at(&format!("l{i}"), 1_100_000, -*j));
        }
        // A bundle of another lever assignment at one rung only must not join.
        let mut other = at("zz", 1_100_000, 0.0);
        other.levers.insert("vae".into(), "device".into());
        bundles.push(other);
        let fits = fit(&bundles).unwrap();
        assert_eq!(fits.len(), 1);
        let f = &fits[0];
        assert_eq!(f.bundle_ids.len(), 6);
        assert_eq!(
            f.rungs,
            vec![(400_000, "r400000".into()), (1_100_000, "r1100000".into())]
        );
        let get = |n: &str| f.phases.iter().find(|p| p.phase == n).unwrap();
        let pack = get("host.pack");
        assert!(pack.does_not_scale, "{pack:?}");
        assert!((pack.fixed_s - 1731.0).abs() < 1.0, "{pack:?}");
        assert!(pack.exponent.unwrap().abs() < 0.01);
        let den = get("denoise");
        assert!(!den.does_not_scale, "{den:?}");
        assert!((den.per_mvoxel_s - 1000.0).abs() < 50.0, "{den:?}");
        assert!(den.exponent.unwrap() > 0.9 && den.r2 > 0.99, "{den:?}");
        // Slowest at the largest rung first.
        assert_eq!(f.phases[0].phase, "host.pack");
        assert!(pack.share_of_wall_at_max > 0.5 && pack.share_of_wall_at_max < 0.7);
    }

    #[test]
    fn one_rung_only_gives_no_fit_and_says_what_is_missing() {
        let bundles = vec![at("a", 400_000, 0.0), at("b", 400_000, 0.01)];
        let e = fit(&bundles).unwrap_err();
        assert!(e.missing.contains("two or more rungs"), "{}", e.missing);
    }

    /// Two models, each at its own rung, with everything else equal: no line is
    /// drawn through them.
    #[test]
    fn runs_of_different_weights_or_devices_never_share_a_fit() {
        let small = at("a", 400_000, 0.0);
        let mut big = at("b", 1_100_000, 0.0);
        big.weights_digest = "sha256:other-model".into();
        let e = fit(&[small.clone(), big]).unwrap_err();
        assert!(e.missing.contains("weights, device"), "{}", e.missing);
        let mut gpu = at("c", 1_100_000, 0.0);
        gpu.device = Some("cuda".into());
        assert!(fit(&[small.clone(), gpu]).is_err());
        // The same model at both rungs does fit, and the group names it.
        let f = fit(&[small, at("d", 1_100_000, 0.0), at("e", 1_100_000, 0.01)]).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].model, "w on cpu");
    }

    /// Cold and warm runs are two groups: the fit takes the larger and never draws
    /// one line through both (a cold rung-1 and warm rung-2 run would credit the disk
    /// to the resolution).
    #[test]
    fn runs_started_in_different_cache_states_never_share_a_fit() {
        let with = |id: &str, voxels: u64, share: Option<f64>| {
            let mut b = at(id, voxels, 0.0);
            b.cache_share_at_start = share;
            b
        };
        let f = fit(&[
            with("w1", 400_000, Some(1.0)),
            with("w2", 1_100_000, Some(0.99)),
            with("w3", 1_100_000, Some(0.8)),
            with("c1", 400_000, Some(0.0)),
            with("c2", 1_100_000, Some(0.037)),
            with("p1", 400_000, Some(0.5)),
        ])
        .unwrap();
        assert_eq!(f.len(), 1, "one model, one fit: the warm group");
        assert_eq!(f[0].bundle_ids, ["w1", "w2", "w3"]);
        assert_eq!(f[0].config, "default; -; cache warm");
        assert_eq!(cache_state(Some(0.2)), "cold");
        assert_eq!(cache_state(Some(0.5)), "partial");
        assert_eq!(cache_state(None), "unrecorded");
    }

    /// Two runs at two rungs fit any line exactly: no fit is claimed from them,
    /// and the reason says why (found on a device run whose 2-point "fit" read a
    /// perfect R² for every phase: reports/device-notes.md).
    #[test]
    fn two_points_are_not_a_fit() {
        let e = fit(&[at("a", 400_000, 0.0), at("b", 1_100_000, 0.0)]).unwrap_err();
        assert!(e.missing.contains("3 or more"), "{}", e.missing);
        assert!(e.missing.contains("R²"), "{}", e.missing);
        // A third run, at either rung, makes a fit of 3 points per phase.
        let f = fit(&[
            at("a", 400_000, 0.0),
            at("b", 1_100_000, 0.0),
            at("c", 400_000, 0.02),
        ])
        .unwrap();
        assert!(
            f[0].phases.iter().all(|p| p.points == 3),
            "{:?}",
            f[0].phases
        );
    }

    /// A campaign's arm that is the profile's default ran what a plain run of that
    /// profile ran: the engine reports the same arms, so the runs share a fit (the
    /// committed 13B evidence: a campaign's `attention=cudnn` runs at rung 3 and
    /// plain default runs at rung 4). The other arm does not join. Grouping by the
    /// passed arms alone (`b.levers`) finds no fit here.
    #[test]
    fn a_passed_arm_equal_to_the_default_joins_the_plain_runs() {
        let ran = |id: &str, voxels: u64, arm: &str, passed: bool| {
            let mut b = at(id, voxels, 0.0);
            b.arms.insert("attention".into(), arm.into());
            b.arms.insert("observer".into(), "on".into());
            if passed {
                b.levers.insert("attention".into(), arm.into());
            }
            b
        };
        let bundles = [
            ran("c1", 400_000, "cudnn", true),
            ran("c2", 400_000, "cudnn", true),
            ran("m1", 400_000, "mma", true),
            ran("m2", 400_000, "mma", true),
            ran("p1", 1_100_000, "cudnn", false),
            ran("p2", 1_100_000, "cudnn", false),
        ];
        let f = fit(&bundles).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].bundle_ids, ["c1", "c2", "p1", "p2"]);
        assert_eq!(
            f[0].config,
            "default; attention=cudnn,observer=on; cache unrecorded"
        );
    }

    /// Each model gets its own fit (the 2B at rungs 1 and 2, the 13B at rungs 3 and
    /// 4), smallest voxel count first; a third model without two rungs gets none.
    #[test]
    fn every_model_with_a_group_gets_its_own_fit() {
        let model = |id: &str, voxels: u64, w: &str, j: f64| {
            let mut b = at(id, voxels, j);
            b.weights_digest = w.into();
            b
        };
        let bundles = [
            model("b1", 2_000_000, "sha256:big", 0.0),
            model("b2", 5_000_000, "sha256:big", 0.01),
            model("b3", 5_000_000, "sha256:big", -0.01),
            model("s1", 400_000, "sha256:small", 0.0),
            model("s2", 1_100_000, "sha256:small", 0.02),
            model("s3", 400_000, "sha256:small", 0.01),
            model("s4", 1_100_000, "sha256:small", 0.0),
            model("o1", 400_000, "sha256:one-rung", 0.0),
            model("o2", 400_000, "sha256:one-rung", 0.0),
            model("o3", 400_000, "sha256:one-rung", 0.0),
        ];
        let f = fit(&bundles).unwrap();
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].model, "sha256:small on cpu");
        assert_eq!(f[0].bundle_ids.len(), 4);
        assert_eq!(f[1].model, "sha256:big on cpu");
        assert_eq!(f[1].bundle_ids, ["b1", "b2", "b3"]);
    }

    /// The committed 13B case: one of three runs at the large rung was the machine's
    /// first and paid the first CUDA initialization inside its text-encoder load
    /// (20.8 s against 1.1 s, every weight byte in the page cache). Left in, the
    /// constant phase would fit as growing with the voxels; left out and named, it
    /// is flat.
    /// Mutation: keeping every point turns this red.
    #[test]
    fn a_slow_first_run_at_one_rung_is_left_out_and_named() {
        let mut bundles = Vec::new();
        for (i, j) in [-0.02, 0.01, 0.03].iter().enumerate() {
            bundles.push(at(&format!("s{i}"), 400_000, *j));
            bundles.push(at(&format!("l{i}"), 1_100_000, -*j));
        }
        // l0's host.pack paid a first initialization: 12x its rung's others.
        if let Some(p) = bundles[1].phases.iter_mut().find(|p| p.name == "host.pack") {
            p.duration_s = Some(20_000.0);
            p.close_ns = Some(p.open_ns + 20_000_000_000_000);
        }
        let f = fit(&bundles).unwrap();
        let pack = f[0].phases.iter().find(|p| p.phase == "host.pack").unwrap();
        assert_eq!(pack.left_out, ["l0"]);
        assert_eq!(pack.points, 5);
        assert!(pack.does_not_scale, "{pack:?}");
        assert!((pack.fixed_s - 1731.0).abs() < 1.0, "{pack:?}");
        assert!((pack.mean_at_max_s - 1731.0).abs() < 1.0, "{pack:?}");
        let den = f[0].phases.iter().find(|p| p.phase == "denoise").unwrap();
        assert!(den.left_out.is_empty() && den.points == 6, "{den:?}");
    }

    #[test]
    fn least_squares_matches_a_hand_fit() {
        let (a, b, r2) = least_squares(&[1.0, 2.0, 3.0], &[3.0, 5.0, 7.0]);
        assert!((a - 1.0).abs() < 1e-12 && (b - 2.0).abs() < 1e-12 && (r2 - 1.0).abs() < 1e-12);
        let (_, b, r2) = least_squares(&[1.0, 2.0, 3.0, 4.0], &[1.0, 3.0, 2.0, 4.0]);
        assert!(
            (b - 0.8).abs() < 1e-12 && (r2 - 0.64).abs() < 1e-12,
            "{b} {r2}"
        );
    }
}
