//! Fidelity: how far a pair's treatment frames are from its baseline's, per pair
//! and per lever and rung, judged against the lever's numerics
//! (`numerics` in `specs/levers.toml`).
//!
//! What is compared (`specs/bundle.md`, "Fidelity"): the frame images both bundles
//! keep (`first.png`, `middle.png`, `last.png`: the engine's exact 8-bit RGB
//! frames) by [`crate::rank::pixels`]: PSNR in dB pooled over every RGB sample of
//! the images (infinite when identical) and the largest absolute sample
//! difference; and, where both keep `frames.parquet`, every frame's sha256 (the
//! frames the images do not show are checked for identity, not measured).
//!
//! Per lever and rung: the median per-pair PSNR with a 95% percentile bootstrap
//! interval ([`stats::BOOTSTRAP_RESAMPLES`] resamples of the pairs by
//! [`crate::rank::bootstrap`], a ChaCha8 stream
//! seeded with [`stats::seed_for`] of the lever and rung xor [`FIDELITY_SEED_SALT`]),
//! the minimum PSNR and the largest absolute error. A `preserving` lever with any
//! differing byte in a pair is flagged, naming the pair. A `changing` lever's rule
//! ([`FidelityRule`]) is checked against the interval's lower end ([`RuleCheck`]).
//!
//! The floor: reference bundles of [`REFERENCE_ENGINE`] whose `levers.precision`
//! is `bf16` or `f32` (`harness run --exec --lever precision=bf16 -- python3
//! examples/diffusers_ltx.py --dtype bf16 ...`), paired per rung, rung file, weights
//! and noise source: their PSNR is how far precision alone moves the reference.
//!
//! The distance from the reference ([`VsReference`], changing levers only): each
//! arm's runs compared with the reference's f32 run drawn from the engine's own
//! noise ([`references`]) for the same rung file and weights: how far each arm
//! is from the reference's best arithmetic, beside the floor (the reference's
//! own bf16 there).
//!
//! Promise: a pure function of the bundles and the files they name; the same set
//! gives the same figures in any order.

use serde::{Serialize, Serializer};
use std::collections::BTreeMap;

use crate::bundle::facts::Bundle;
use crate::levers_spec::{FidelityRule, Lever, Numerics};
use crate::rank::bootstrap::{self, CONFIDENCE};
use crate::rank::pixels::{read_rgb8, Rgb8, SampleDiff};
use crate::rank::stats;
use crate::rank::verdict::MIN_PAIRS;
use evidence::bundle_files::FRAME_IMAGES;
use std::cell::RefCell;
use std::rc::Rc;

/// Mixed into the savings bootstrap's seed for the PSNR bootstrap of the same lever
/// and rung, so the two streams differ while both stay fixed.
pub const FIDELITY_SEED_SALT: u64 = 0xf1de_1175_0000_0022;

/// The hello `engine` of the reference whose bf16-vs-f32 runs measure the floor.
pub const REFERENCE_ENGINE: &str = "diffusers-ltx";

/// The lever a floor bundle records its precision under (`--lever precision=bf16`).
pub const PRECISION_LEVER: &str = "precision";

/// Write a dB figure: a number, or the string `"inf"` for identical frames (JSON has
/// no infinity).
fn ser_db<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_infinite() && *x > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_f64(*x)
    }
}

fn ser_db_opt<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(v) => ser_db(v, s),
        None => s.serialize_none(),
    }
}

/// An interval of dB figures (either end may be `"inf"` in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DbInterval {
    /// Lower end, dB.
    #[serde(serialize_with = "ser_db")]
    pub lo: f64,
    /// Upper end, dB.
    #[serde(serialize_with = "ser_db")]
    pub hi: f64,
}

/// One pair's frames compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairFidelity {
    /// The baseline run's bundle id.
    pub baseline_id: String,
    /// The treatment run's bundle id.
    pub treatment_id: String,
    /// The images compared, in frame order (`first.png`, ...).
    pub images: Vec<String>,
    /// PSNR in dB over every RGB sample of the images, pooled; `inf` when identical.
    #[serde(serialize_with = "ser_db")]
    pub psnr_db: f64,
    /// The largest absolute difference of one 8-bit sample, 0-255.
    pub max_abs_error: u8,
    /// Frames whose sha256 both bundles' `frames.parquet` hold.
    pub frames_compared: usize,
    /// Of those, frames whose sha256 differ.
    pub frames_differing: usize,
    /// The first frame index whose sha256 differs, if one does.
    pub first_differing_frame: Option<i64>,
}

impl PairFidelity {
    /// Whether any byte compared differs (an image sample or a frame's hash).
    pub fn differs(&self) -> bool {
        self.max_abs_error > 0 || self.frames_differing > 0
    }
}

/// A pair whose frames could not be compared, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotCompared {
    /// The baseline run's bundle id.
    pub baseline_id: String,
    /// The treatment run's bundle id.
    pub treatment_id: String,
    /// Why.
    pub why: String,
}

/// Compare the frames of `b` (baseline) and `t` (treatment); `Err` says why they
/// cannot be compared (no image in common, an unreadable image, other geometry).
pub fn compare(b: &Bundle, t: &Bundle) -> Result<PairFidelity, String> {
    compare_by(b, t, &mut |n| read_still(b, n).map(Rc::new))
}

/// Frame image `name` of `b`, decoded.
fn read_still(b: &Bundle, name: &str) -> Result<Rgb8, String> {
    read_rgb8(&b.frames.dir.join(name)).map_err(|e| e.to_string())
}

/// [`compare`] with the baseline's images from `load_b` (a cache, where one
/// baseline is compared with many runs).
fn compare_by(
    b: &Bundle,
    t: &Bundle,
    load_b: &mut dyn FnMut(&str) -> Result<Rc<Rgb8>, String>,
) -> Result<PairFidelity, String> {
    let images: Vec<&str> = FRAME_IMAGES
        .iter()
        .copied()
        .filter(|n| b.frames.images.contains_key(*n) && t.frames.images.contains_key(*n))
        .collect();
    if images.is_empty() {
        return Err(format!(
            "no frame image kept by both ({} keeps {}, {} keeps {})",
            b.short_id(),
            listed(b),
            t.short_id(),
            listed(t)
        ));
    }
    let same_hashes = images
        .iter()
        .all(|n| b.frames.images.get(*n) == t.frames.images.get(*n));
    let mut diff = SampleDiff::default();
    if !same_hashes {
        for n in &images {
            let x = load_b(n)?;
            let y = read_still(t, n)?;
            if (x.width, x.height) != (y.width, y.height) {
                return Err(format!(
                    "{n}: {}x{} pixels in {} and {}x{} in {}",
                    x.width,
                    x.height,
                    b.short_id(),
                    y.width,
                    y.height,
                    t.short_id()
                ));
            }
            diff.add(&x.rgb, &y.rgb);
        }
    }
    let (mut compared, mut differing, mut first) = (0, 0, None);
    for (i, h) in &b.frames.frame_sha256 {
        if let Some(g) = t.frames.frame_sha256.get(i) {
            compared += 1;
            if g != h {
                differing += 1;
                first = first.or(Some(*i));
            }
        }
    }
    Ok(PairFidelity {
        baseline_id: b.id.clone(),
        treatment_id: t.id.clone(),
        images: images.iter().map(|s| s.to_string()).collect(),
        psnr_db: diff.psnr_db().unwrap_or(f64::INFINITY),
        max_abs_error: diff.max_abs,
        frames_compared: compared,
        frames_differing: differing,
        first_differing_frame: first,
    })
}

fn listed(b: &Bundle) -> String {
    if b.frames.images.is_empty() {
        "none".into()
    } else {
        b.frames
            .images
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The measured floor at one rung: the reference's bf16 frames against its f32.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Floor {
    /// Rung name.
    pub rung: String,
    /// The bf16 (baseline) / f32 (treatment) pairs compared.
    pub pairs: Vec<PairFidelity>,
    /// Pairs that could not be compared.
    pub not_compared: Vec<NotCompared>,
    /// Median PSNR over the pairs, dB.
    #[serde(serialize_with = "ser_db")]
    pub median_psnr_db: f64,
    /// Smallest PSNR over the pairs, dB.
    #[serde(serialize_with = "ser_db")]
    pub min_psnr_db: f64,
}

/// Whether `b` is a floor bundle, and its precision (`bf16`, `f32`).
fn floor_arm(b: &Bundle) -> Option<&str> {
    if b.incomplete.is_some() || b.frames.engine.as_deref() != Some(REFERENCE_ENGINE) {
        return None;
    }
    let arm = b.levers.get(PRECISION_LEVER)?.as_str();
    let dtype = b.frames.engine_attrs.get("dtype").map(String::as_str);
    (matches!(arm, "bf16" | "f32") && dtype.is_none_or(|d| d == arm)).then_some(arm)
}

/// The floors measured in `bundles`, by rung: bf16 and f32 runs of the reference
/// with the same rung file, weights and noise source, paired in id order.
pub fn floors(bundles: &[Bundle]) -> BTreeMap<String, Floor> {
    type Key = (String, Option<String>, String, Option<String>);
    let mut cells: BTreeMap<Key, (Vec<&Bundle>, Vec<&Bundle>)> = BTreeMap::new();
    for b in bundles {
        let Some(arm) = floor_arm(b) else { continue };
        let key = (
            b.rung.clone(),
            b.frames.rung_sha256.clone(),
            b.weights_digest.clone(),
            b.frames.engine_attrs.get("noise").cloned(),
        );
        let cell = cells.entry(key).or_default();
        if arm == "bf16" {
            cell.0.push(b);
        } else {
            cell.1.push(b);
        }
    }
    let mut out: BTreeMap<String, Floor> = BTreeMap::new();
    for ((rung, ..), (mut lo, mut hi)) in cells {
        lo.sort_by(|a, b| a.id.cmp(&b.id));
        hi.sort_by(|a, b| a.id.cmp(&b.id));
        let f = out.entry(rung.clone()).or_insert_with(|| Floor {
            rung,
            pairs: Vec::new(),
            not_compared: Vec::new(),
            median_psnr_db: f64::NAN,
            min_psnr_db: f64::NAN,
        });
        for (b, t) in lo.iter().zip(&hi) {
            match compare(b, t) {
                Ok(p) => f.pairs.push(p),
                Err(why) => f.not_compared.push(NotCompared {
                    baseline_id: b.id.clone(),
                    treatment_id: t.id.clone(),
                    why,
                }),
            }
        }
    }
    out.retain(|_, f| !f.pairs.is_empty());
    for f in out.values_mut() {
        let mut v: Vec<f64> = f.pairs.iter().map(|p| p.psnr_db).collect();
        f.median_psnr_db = stats::median(&mut v);
        f.min_psnr_db = v.iter().copied().fold(f64::INFINITY, f64::min);
    }
    out
}

/// One reference run and its frame images, decoded once for every run
/// compared with it.
pub struct Reference<'a> {
    /// The reference's bundle.
    pub bundle: &'a Bundle,
    stills: RefCell<BTreeMap<String, Rc<Rgb8>>>,
}

impl<'a> Reference<'a> {
    fn new(bundle: &'a Bundle) -> Reference<'a> {
        Reference {
            bundle,
            stills: RefCell::new(BTreeMap::new()),
        }
    }

    /// Compare run `t` with this reference (the reference as baseline).
    fn compare(&self, t: &Bundle) -> Result<PairFidelity, String> {
        compare_by(self.bundle, t, &mut |n| {
            if let Some(x) = self.stills.borrow().get(n) {
                return Ok(x.clone());
            }
            let x = Rc::new(read_still(self.bundle, n)?);
            self.stills.borrow_mut().insert(n.to_string(), x.clone());
            Ok(x)
        })
    }
}

/// The reference's f32 runs drawn from the engine's own noise (`noise` =
/// `engine` in their hello), by (rung, rung file sha256, weights digest): what
/// an engine run with the same key is measured against. The lowest id wins
/// where several share a key.
pub type References<'a> = BTreeMap<(String, Option<String>, String), Reference<'a>>;

/// The [`References`] in `bundles`.
pub fn references(bundles: &[Bundle]) -> References<'_> {
    let mut out: References = BTreeMap::new();
    for b in bundles {
        if floor_arm(b) != Some("f32")
            || b.frames.engine_attrs.get("noise").map(String::as_str) != Some("engine")
        {
            continue;
        }
        let key = (
            b.rung.clone(),
            b.frames.rung_sha256.clone(),
            b.weights_digest.clone(),
        );
        match out.get(&key) {
            Some(have) if have.bundle.id <= b.id => {}
            _ => {
                out.insert(key, Reference::new(b));
            }
        }
    }
    out
}

/// One arm's runs against the reference's f32 frames.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmDistance {
    /// Runs compared with their reference.
    pub runs: usize,
    /// Median PSNR against the reference, dB.
    #[serde(serialize_with = "ser_db")]
    pub median_psnr_db: f64,
    /// Smallest, dB.
    #[serde(serialize_with = "ser_db")]
    pub min_psnr_db: f64,
    /// Largest, dB.
    #[serde(serialize_with = "ser_db")]
    pub max_psnr_db: f64,
}

/// A changing lever's arms against the reference's f32 frames at one rung.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VsReference {
    /// The reference runs compared against, in id order.
    pub reference_ids: Vec<String>,
    /// The baseline arm's runs; `None` when none had a reference.
    pub baseline: Option<ArmDistance>,
    /// The treatment arm's runs; `None` when none had a reference.
    pub treatment: Option<ArmDistance>,
}

/// Each arm of `pairs` (baseline, treatment) against its reference in `refs`;
/// `None` when no run of either arm has one. A run whose frames cannot be
/// compared with its reference is left out of its arm.
pub fn vs_reference(pairs: &[(&Bundle, &Bundle)], refs: &References) -> Option<VsReference> {
    let mut used: Vec<String> = Vec::new();
    let mut arm = |runs: &mut dyn Iterator<Item = &Bundle>| -> Option<ArmDistance> {
        let mut psnr = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        for b in runs {
            if seen.contains(&b.id.as_str()) {
                continue;
            }
            seen.push(&b.id);
            let key = (
                b.rung.clone(),
                b.frames.rung_sha256.clone(),
                b.weights_digest.clone(),
            );
            let Some(r) = refs.get(&key) else { continue };
            if r.bundle.id == b.id {
                continue;
            }
            if let Ok(p) = r.compare(b) {
                psnr.push(p.psnr_db);
                if !used.contains(&r.bundle.id) {
                    used.push(r.bundle.id.clone());
                }
            }
        }
        if psnr.is_empty() {
            return None;
        }
        let (min, max) = psnr
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        Some(ArmDistance {
            runs: psnr.len(),
            median_psnr_db: stats::median(&mut psnr),
            min_psnr_db: min,
            max_psnr_db: max,
        })
    };
    let baseline = arm(&mut pairs.iter().map(|p| p.0));
    let treatment = arm(&mut pairs.iter().map(|p| p.1));
    if baseline.is_none() && treatment.is_none() {
        return None;
    }
    used.sort();
    Some(VsReference {
        reference_ids: used,
        baseline,
        treatment,
    })
}

pub use crate::rank::verdict::RuleCheck;

/// The threshold a changing lever is held to at one rung.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Threshold {
    /// The PSNR the interval's lower end must reach, dB.
    pub psnr_db: f64,
    /// Where it comes from: `min_psnr_db`, or `floor - margin` (with both figures).
    pub source: String,
}

/// The threshold of `rule` given the floor measured at the rung, if any: the floor's
/// median minus the margin when the rule gives a margin and the floor is finite,
/// else `min_psnr_db`.
pub fn threshold(rule: &FidelityRule, floor: Option<&Floor>) -> Threshold {
    match (rule.floor_margin_db, floor) {
        (Some(m), Some(f)) if f.median_psnr_db.is_finite() => Threshold {
            psnr_db: f.median_psnr_db - m,
            source: format!(
                "measured floor {} dB minus margin {} dB",
                db(f.median_psnr_db),
                db(m)
            ),
        },
        _ => Threshold {
            psnr_db: rule.min_psnr_db,
            source: format!(
                "min_psnr_db {} dB ({})",
                db(rule.min_psnr_db),
                if floor.is_some() {
                    "the rule gives no floor margin"
                } else {
                    "no floor measured"
                }
            ),
        },
    }
}

/// One lever's fidelity at one rung.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RungFidelity {
    /// The lever's declared numerics.
    pub numerics: Numerics,
    /// Pairs whose frames were compared, in the rung's pair order.
    pub pairs: Vec<PairFidelity>,
    /// Pairs whose frames could not be compared.
    pub not_compared: Vec<NotCompared>,
    /// Median per-pair PSNR, dB (`inf` when most pairs are identical).
    #[serde(serialize_with = "ser_db_opt")]
    pub median_psnr_db: Option<f64>,
    /// 95% bootstrap interval of the median PSNR.
    pub median_psnr_ci: Option<DbInterval>,
    /// Smallest per-pair PSNR, dB.
    #[serde(serialize_with = "ser_db_opt")]
    pub min_psnr_db: Option<f64>,
    /// Largest absolute sample error over the pairs, 0-255.
    pub max_abs_error: Option<u8>,
    /// For a preserving lever: one line per pair whose frames differ (a bug).
    pub flagged: Vec<String>,
    /// For a changing lever: the threshold it is held to.
    pub threshold: Option<Threshold>,
    /// For a changing lever: its rule, checked.
    pub rule: Option<RuleCheck>,
    /// For a changing lever: each arm against the reference's f32 frames,
    /// where the store holds that reference for the pairs' rung file and
    /// weights.
    pub vs_reference: Option<VsReference>,
}

impl RungFidelity {
    /// No pairs compared yet, for a lever of `numerics`.
    pub fn empty(numerics: Numerics) -> RungFidelity {
        RungFidelity {
            numerics,
            pairs: Vec::new(),
            not_compared: Vec::new(),
            median_psnr_db: None,
            median_psnr_ci: None,
            min_psnr_db: None,
            max_abs_error: None,
            flagged: Vec::new(),
            threshold: None,
            rule: None,
            vs_reference: None,
        }
    }
}

/// `x` dB with 2 decimals, `inf` for identical frames.
pub fn db(x: f64) -> String {
    if x.is_infinite() && x > 0.0 {
        "inf".into()
    } else {
        crate::rank::verdict::fixed(x, 2)
    }
}

/// The fidelity of one lever at one rung in a few words, for a table cell:
/// `identical (6 pairs)`, `FLAGGED: 1 of 3 pairs differ; min 41.20 dB, max abs 3`,
/// `median 38.10 [37.90, 38.40] dB, min 37.50, max abs 12`, `no frames` or `—`.
pub fn cell(f: &RungFidelity) -> String {
    let n = f.pairs.len();
    let (Some(med), Some(ci), Some(min), Some(max)) = (
        f.median_psnr_db,
        f.median_psnr_ci,
        f.min_psnr_db,
        f.max_abs_error,
    ) else {
        return if f.not_compared.is_empty() {
            "—".into()
        } else {
            "no frames".into()
        };
    };
    match f.numerics {
        Numerics::Preserving if f.flagged.is_empty() => format!("identical ({n} pairs)"),
        Numerics::Preserving => format!(
            "FLAGGED: {} of {n} pairs differ; min {} dB, max abs {max}",
            f.flagged.len(),
            db(min)
        ),
        Numerics::Changing => format!(
            "median {} [{}, {}] dB, min {}, max abs {max}",
            db(med),
            db(ci.lo),
            db(ci.hi),
            db(min)
        ),
    }
}

/// The median of `psnr` (dB, `+inf` allowed) and its percentile bootstrap interval
/// from `resamples` draws of a ChaCha8 stream seeded with `seed`.
pub fn median_interval(psnr: &[f64], seed: u64, resamples: usize) -> Option<(f64, DbInterval)> {
    if psnr.is_empty() {
        return None;
    }
    let mut v = psnr.to_vec();
    let median = stats::median(&mut v);
    let mut draw = vec![0.0; psnr.len()];
    let boot = bootstrap::resample(psnr.len(), seed, resamples, |idx| {
        for (d, &i) in draw.iter_mut().zip(idx) {
            *d = psnr[i];
        }
        stats::median(&mut draw)
    });
    let (lo, hi) = bootstrap::interval(boot).unwrap_or((median, median));
    Some((median, DbInterval { lo, hi }))
}

/// Lever `l`'s fidelity at `rung` over `pairs` (baseline, treatment), with the
/// floor measured at the rung, if any, and (changing levers) each arm against
/// the references in `refs`.
pub fn rung_fidelity(
    l: &Lever,
    rung: &str,
    pairs: &[(&Bundle, &Bundle)],
    floor: Option<&Floor>,
    refs: &References,
) -> RungFidelity {
    let mut out = RungFidelity::empty(l.numerics);
    for (b, t) in pairs {
        match compare(b, t) {
            Ok(p) => out.pairs.push(p),
            Err(why) => out.not_compared.push(NotCompared {
                baseline_id: b.id.clone(),
                treatment_id: t.id.clone(),
                why,
            }),
        }
    }
    let psnr: Vec<f64> = out.pairs.iter().map(|p| p.psnr_db).collect();
    let seed = stats::seed_for(&l.id, rung) ^ FIDELITY_SEED_SALT;
    if let Some((m, ci)) = median_interval(&psnr, seed, stats::BOOTSTRAP_RESAMPLES) {
        out.median_psnr_db = Some(m);
        out.median_psnr_ci = Some(ci);
        out.min_psnr_db = psnr.iter().copied().reduce(f64::min);
        out.max_abs_error = out.pairs.iter().map(|p| p.max_abs_error).max();
    }
    match (l.numerics, l.fidelity.as_ref()) {
        (Numerics::Preserving, _) => {
            out.flagged = out
                .pairs
                .iter()
                .filter(|p| p.differs())
                .map(|p| flag_line(l, rung, p))
                .collect();
        }
        (Numerics::Changing, Some(rule)) => {
            let th = threshold(rule, floor);
            out.rule = Some(check(&out, th.psnr_db));
            out.threshold = Some(th);
        }
        (Numerics::Changing, None) => {}
    }
    if l.numerics == Numerics::Changing {
        out.vs_reference = vs_reference(pairs, refs);
    }
    out
}

fn flag_line(l: &Lever, rung: &str, p: &PairFidelity) -> String {
    let mut s = format!(
        "{} is declared numerics-preserving but at rung {rung} treatment {} ({}={}) differs from baseline {} ({}={}):",
        l.id,
        crate::short_id::short(&p.treatment_id),
        l.id,
        l.treatment,
        crate::short_id::short(&p.baseline_id),
        l.id,
        l.baseline
    );
    if p.max_abs_error > 0 {
        s.push_str(&format!(
            " PSNR {} dB, max abs error {} over {}",
            db(p.psnr_db),
            p.max_abs_error,
            p.images.join(", ")
        ));
        if p.frames_compared > 0 {
            s.push(';');
        }
    }
    if p.frames_compared > 0 {
        s.push_str(&format!(
            " {} of {} frames' sha256 differ",
            p.frames_differing, p.frames_compared
        ));
        if let Some(i) = p.first_differing_frame {
            s.push_str(&format!(", first at frame {i}"));
        }
    }
    s
}

/// Check the median-PSNR interval of `f` against `threshold` dB.
fn check(f: &RungFidelity, threshold: f64) -> RuleCheck {
    let n = f.pairs.len();
    let Some(ci) = f.median_psnr_ci else {
        return RuleCheck::Undecided {
            why: format!(
                "frames to compare: none of {} pair(s) has frames both runs kept",
                f.not_compared.len()
            ),
        };
    };
    if n < MIN_PAIRS {
        return RuleCheck::Undecided {
            why: format!(
                "{} more pair(s) with comparable frames: {n} compared, a fidelity verdict needs at least {MIN_PAIRS}",
                MIN_PAIRS - n
            ),
        };
    }
    let range = format!(
        "the median PSNR's {:.0}% interval [{}, {}] dB",
        CONFIDENCE * 100.0,
        db(ci.lo),
        db(ci.hi)
    );
    if ci.lo >= threshold {
        RuleCheck::Passes
    } else if ci.hi < threshold {
        RuleCheck::Fails {
            why: format!("{range} is wholly below the threshold {} dB", db(threshold)),
        }
    } else {
        RuleCheck::Undecided {
            why: format!(
                "more pairs: {range} straddles the threshold {} dB",
                db(threshold)
            ),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;
    use crate::rank::pixels::tests::write_rgb8;
    use std::path::{Path, PathBuf};

    pub(crate) fn scratch(name: &str) -> PathBuf {
        crate::test_kit::scratch(&format!("fidelity-{name}"))
    }

    /// A bundle whose three images are 4x2 pixels of `value` with sample 0 of the
    /// first image set to `first0`.
    pub(crate) fn with_frames(root: &Path, id: &str, value: u8, first0: u8) -> Bundle {
        let mut b = sample_bundle(id);
        let dir = root.join(id);
        std::fs::create_dir_all(&dir).unwrap();
        b.frames.dir = dir.clone();
        for n in FRAME_IMAGES {
            let mut rgb = vec![value; 4 * 2 * 3];
            if *n == "first.png" {
                rgb[0] = first0;
            }
            write_rgb8(&dir.join(n), 4, 2, &rgb);
            b.frames
                .images
                .insert(n.to_string(), format!("{value}-{first0}-{n}"));
        }
        b
    }

    #[test]
    fn identical_frames_are_infinite_and_one_sample_off_is_measured() {
        let root = scratch("pair");
        let a = with_frames(&root, "a", 100, 100);
        let same = with_frames(&root, "s", 100, 100);
        let p = compare(&a, &same).unwrap();
        assert_eq!(p.psnr_db, f64::INFINITY);
        assert_eq!(p.max_abs_error, 0);
        assert!(!p.differs());
        assert_eq!(serde_json::to_value(&p).unwrap()["psnr_db"], "inf");
        // One sample of 72 off by 10: MSE = 100/72, PSNR = 10 log10(65025 * 0.72).
        let b = with_frames(&root, "b", 100, 110);
        let p = compare(&a, &b).unwrap();
        assert_eq!(p.max_abs_error, 10);
        assert!((p.psnr_db - 10.0 * (65025.0f64 * 0.72).log10()).abs() < 1e-9);
        assert!(p.differs());
        // No images in common: said, not guessed.
        let bare = sample_bundle("bare");
        let e = compare(&a, &bare).unwrap_err();
        assert!(e.contains("no frame image kept by both"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn frame_hashes_catch_frames_the_images_do_not_show() {
        let root = scratch("hash");
        let mut a = with_frames(&root, "a", 7, 7);
        let mut b = with_frames(&root, "b", 7, 7);
        for i in 0..5 {
            a.frames.frame_sha256.insert(i, format!("h{i}"));
            b.frames.frame_sha256.insert(i, format!("h{i}"));
        }
        b.frames.frame_sha256.insert(3, "other".into());
        let p = compare(&a, &b).unwrap();
        assert_eq!(p.psnr_db, f64::INFINITY);
        assert_eq!(
            (
                p.frames_compared,
                p.frames_differing,
                p.first_differing_frame
            ),
            (5, 1, Some(3))
        );
        assert!(p.differs());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_median_interval_is_seeded_and_handles_infinity() {
        let v = [30.0, 31.0, 32.0, 33.0, 34.0];
        let a = median_interval(&v, 5, 2000).unwrap();
        assert_eq!(a, median_interval(&v, 5, 2000).unwrap());
        assert_eq!(a.0, 32.0);
        assert!(a.1.lo >= 30.0 && a.1.hi <= 34.0 && a.1.lo <= 32.0, "{a:?}");
        let inf = [f64::INFINITY; 4];
        let b = median_interval(&inf, 5, 100).unwrap();
        assert_eq!(b.0, f64::INFINITY);
        assert_eq!((b.1.lo, b.1.hi), (f64::INFINITY, f64::INFINITY));
        assert!(median_interval(&[], 1, 10).is_none());
    }

    #[test]
    fn the_threshold_is_the_floor_minus_the_margin_only_when_both_exist() {
        let rule = FidelityRule {
            min_psnr_db: 30.0,
            floor_margin_db: Some(3.0),
        };
        let t = threshold(&rule, None);
        assert_eq!(t.psnr_db, 30.0);
        assert!(t.source.contains("no floor measured"), "{}", t.source);
        let floor = Floor {
            rung: "2".into(),
            pairs: Vec::new(),
            not_compared: Vec::new(),
            median_psnr_db: 41.0,
            min_psnr_db: 40.0,
        };
        assert_eq!(threshold(&rule, Some(&floor)).psnr_db, 38.0);
        let no_margin = FidelityRule {
            floor_margin_db: None,
            ..rule
        };
        assert_eq!(threshold(&no_margin, Some(&floor)).psnr_db, 30.0);
    }

    #[test]
    fn floor_bundles_are_the_references_precision_runs() {
        let root = scratch("floor");
        let mut lo = with_frames(&root, "lo", 50, 50);
        let mut hi = with_frames(&root, "hi", 50, 60);
        for (b, arm) in [(&mut lo, "bf16"), (&mut hi, "f32")] {
            b.frames.engine = Some(REFERENCE_ENGINE.into());
            b.frames.engine_attrs.insert("dtype".into(), arm.into());
            b.levers.insert(PRECISION_LEVER.into(), arm.into());
        }
        let f = floors(&[lo.clone(), hi.clone()]);
        let f = f.get("2").expect("a floor at rung 2");
        assert_eq!(f.pairs.len(), 1);
        assert_eq!(f.pairs[0].max_abs_error, 10);
        // The engine's own runs, or a dtype that contradicts the lever, are not floors.
        let mut engine = hi.clone();
        engine.frames.engine = Some("engine".into());
        assert!(floors(&[lo.clone(), engine]).is_empty());
        let mut liar = hi.clone();
        liar.frames
            .engine_attrs
            .insert("dtype".into(), "bf16".into());
        assert!(floors(&[lo, liar]).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Each arm's runs against the reference's f32 run of their rung file and
    /// weights from the engine's noise. Red when the key drops the weights (the
    /// other-weights run is then measured), when torch-noise references count,
    /// or when the arms are swapped.
    #[test]
    fn each_arm_is_measured_against_the_f32_reference_of_its_weights() {
        let root = scratch("vs-ref");
        let reference = |id: &str, value: u8, noise: &str| {
            let mut b = with_frames(&root, id, value, value);
            b.frames.engine = Some(REFERENCE_ENGINE.into());
            b.frames.engine_attrs.insert("dtype".into(), "f32".into());
            b.frames.engine_attrs.insert("noise".into(), noise.into());
            b.levers.insert(PRECISION_LEVER.into(), "f32".into());
            b
        };
        let r = reference("r1", 100, "engine");
        // A later reference of the same key, and one from torch's noise: neither
        // is the one measured against.
        let r_later = reference("r9", 90, "engine");
        let torch = reference("r0", 80, "torch");
        let mut other_weights = reference("r5", 70, "engine");
        other_weights.weights_digest = "sha256:other".into();
        let all = vec![r.clone(), r_later, torch, other_weights];
        let refs = references(&all);
        assert_eq!(refs.len(), 2, "one per weights");
        // Baseline identical to r1, treatment one sample of 72 off by 10.
        let b = with_frames(&root, "b", 100, 100);
        let t = with_frames(&root, "t", 100, 110);
        let v = vs_reference(&[(&b, &t)], &refs).expect("both arms have a reference");
        assert_eq!(v.reference_ids, vec![r.id.clone()]);
        let (bd, td) = (v.baseline.unwrap(), v.treatment.unwrap());
        assert_eq!((bd.runs, bd.median_psnr_db), (1, f64::INFINITY));
        let want = 10.0 * (65025.0f64 * 0.72).log10();
        assert!((td.median_psnr_db - want).abs() < 1e-9, "{td:?}");
        // A second treatment run off by 20: compared with r1's images as
        // decoded for the first (the cache), each run its own figure.
        let t2 = with_frames(&root, "t2", 100, 120);
        let v = vs_reference(&[(&b, &t), (&b, &t2)], &refs).unwrap();
        let td = v.treatment.unwrap();
        let want2 = 10.0 * (65025.0f64 * 72.0 / 400.0).log10();
        assert_eq!(
            (td.runs, v.baseline.unwrap().runs),
            (2, 1),
            "the baseline run once"
        );
        assert!((td.min_psnr_db - want2).abs() < 1e-9, "{td:?}");
        assert!((td.max_psnr_db - want).abs() < 1e-9, "{td:?}");
        assert!(
            (td.median_psnr_db - (want + want2) / 2.0).abs() < 1e-9,
            "{td:?}"
        );
        // A run of other weights has no reference of its own weights here but
        // r5's: measured against r5 (value 70 vs 100), never against r1.
        let mut ow = with_frames(&root, "ow", 100, 100);
        ow.weights_digest = "sha256:other".into();
        let v = vs_reference(&[(&ow, &ow)], &refs).unwrap();
        assert_eq!(v.reference_ids.len(), 1);
        assert_ne!(v.reference_ids[0], r.id);
        // Runs of weights no reference has: nothing to say.
        let mut none = with_frames(&root, "none", 100, 100);
        none.weights_digest = "sha256:nobody".into();
        assert!(vs_reference(&[(&none, &none)], &refs).is_none());
        let _ = std::fs::remove_dir_all(&root);
    }
}
