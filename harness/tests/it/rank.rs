//! End-to-end: bundles with planted effects, sealed through the evidence crate, read
//! back with polars and ranked; the `harness rank` and `harness diff` binaries run on
//! the same store.

use crate::support::dirs::fresh_store;
use crate::support::ranked::{render, seal, Noise, Render};
use harness::bundle::files::store_bundle_dirs;
use harness::bundle::scan::load_dirs;
use harness::formats::markdown::markdown;
use harness::levers_spec::LeverSpec;
use harness::rank::verdict::Verdict;
use harness::rank::{rank, FitOutcome, Ranking};
use harness::test_kit::levers::{LeverToml, SpecToml};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A spec of four planted levers: `fast` moves load.dit, `null` conditioning,
/// `opposite` decode.video, `half` artifacts.frames (its treatment never runs).
pub(crate) fn spec_toml() -> String {
    SpecToml::new()
        .lever(
            LeverToml::phase_wall("fast", "slow", "quick", "load.dit")
                .title("planted 30% saving of load.dit")
                .prior_rank(2)
                .next_hypothesis("fast: look at the reader"),
        )
        .lever(
            LeverToml::phase_wall("null", "off", "on", "conditioning")
                .seed_issue("#2")
                .title("no effect")
                .prior_rank(1)
                .next_hypothesis("null: the encoder is not the bound"),
        )
        .lever(
            LeverToml::phase_wall("opposite", "host", "device", "decode.video")
                .seed_issue("#3")
                .title("planted 25% slowdown of decode.video")
                .next_hypothesis("opposite: decode is bound by layout conversion"),
        )
        .lever(
            LeverToml::phase_wall("half", "a", "b", "artifacts.frames")
                .seed_issue("#4")
                .title("treatment arm never ran"),
        )
        .toml()
}

const ROUNDS: u32 = 6;
const RUNGS: [(&str, (u64, u64, u64)); 2] = [("0", (64, 64, 9)), ("2", (256, 128, 25))];

/// The planted store (the report test renders it too).
pub(crate) struct World {
    /// Every bundle directory, sorted.
    pub(crate) dirs: Vec<PathBuf>,
    /// The store's root.
    pub(crate) store_root: PathBuf,
    /// The contended run's bundle id.
    pub(crate) contended_id: String,
    /// [`spec_toml`], parsed.
    pub(crate) spec: LeverSpec,
}

/// The store, built once: every lever x both rungs x ROUNDS rounds, each arm's phase
/// durations with +-5% independent noise; `artifacts.frames` is a constant 5 s at
/// both rungs (the phase the fit must name), `denoise` scales with voxels.
pub(crate) fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let store = fresh_store("rank-e2e");
        let mut noise = Noise::new(2026);
        let mut position = 0;
        for round in 1..=ROUNDS {
            for (rung, dims) in RUNGS {
                let vox = (dims.0 * dims.1 * dims.2) as f64;
                for (lever, base, treat) in [
                    ("fast", "slow", "quick"),
                    ("null", "off", "on"),
                    ("opposite", "host", "device"),
                    ("half", "a", "b"),
                ] {
                    for arm in [base, treat] {
                        if lever == "half" && arm == "b" {
                            continue;
                        }
                        let on = arm == treat;
                        let mut n = |x: f64| x * (1.0 + 0.05 * noise.next());
                        let load = n(20.0) * if lever == "fast" && on { 0.7 } else { 1.0 };
                        let cond = n(8.0);
                        let den = n(vox * 2e-5);
                        let dec = n(6.0) * if lever == "opposite" && on { 1.25 } else { 1.0 };
                        let frames = 5.0 + 0.02 * noise.next();
                        let mut r: Render = render(rung, dims, load, cond, den, dec, frames);
                        r.schedule =
                            Some(("c0ffee".into(), round, position, lever.into(), arm.into()));
                        position += 1;
                        seal(&store, &r);
                    }
                }
            }
        }
        // A contended run (a planted 10x load.dit that must not count) and an
        // incomplete one.
        let mut c = render("2", RUNGS[1].1, 200.0, 8.0, 16.0, 6.0, 5.0);
        c.schedule = Some((
            "c0ffee".into(),
            ROUNDS + 1,
            position,
            "fast".into(),
            "quick".into(),
        ));
        c.contended = true;
        let contended_id = seal(&store, &c);
        let mut k = render("2", RUNGS[1].1, 20.0, 8.0, 16.0, 6.0, 5.0);
        k.schedule = Some((
            "c0ffee".into(),
            ROUNDS + 1,
            position + 1,
            "fast".into(),
            "slow".into(),
        ));
        k.exit = "killed".into();
        seal(&store, &k);
        World {
            dirs: store_bundle_dirs(store.root()).unwrap(),
            store_root: store.root().to_path_buf(),
            contended_id,
            spec: LeverSpec::parse(&spec_toml(), Path::new("test-spec.toml")).unwrap(),
        }
    })
}

/// The ranking of `dirs` against [`spec_toml`].
pub(crate) fn ranking(dirs: &[PathBuf]) -> Ranking {
    let w = world();
    let loaded = load_dirs(dirs);
    assert!(loaded.unreadable.is_empty(), "{:?}", loaded.unreadable);
    rank(
        &w.spec,
        &loaded.bundles,
        &loaded.unreadable,
        &[],
        "harness rank --store S",
    )
}

fn lever<'a>(r: &'a Ranking, id: &str) -> &'a harness::rank::LeverResult {
    r.levers.iter().find(|l| l.id == id).unwrap()
}

#[test]
fn planted_saving_is_confirmed_with_an_interval_containing_thirty_percent() {
    let r = ranking(&world().dirs);
    let fast = lever(&r, "fast");
    assert_eq!(fast.reference.verdict, Verdict::Confirmed);
    assert_eq!(fast.reference.rounds.len(), ROUNDS as usize);
    let (s, ci) = fast.reference.saving_fraction.unwrap();
    assert!(ci.contains(0.30), "saving {s} interval {ci:?}");
    assert!(ci.hi - ci.lo < 0.12, "{ci:?}");
    let e = fast.reference.effect.as_ref().unwrap();
    // Absolute saving: 30% of 20 s.
    assert!(e.saving_ci.contains(6.0), "{:?}", e.saving_ci);
    assert_eq!(fast.measured_rank, Some(1));
    // Also at the other rung.
    assert_eq!(fast.other_rungs[0].rung, "0");
    assert_eq!(fast.other_rungs[0].verdict, Verdict::Confirmed);
}

#[test]
fn null_lever_is_not_confirmed_and_opposite_is_refuted_naming_the_next_hypothesis() {
    let r = ranking(&world().dirs);
    let null = lever(&r, "null");
    assert_ne!(null.reference.verdict.name(), "confirmed");
    let (_, ci) = null.reference.saving_fraction.unwrap();
    assert!(ci.contains(0.0), "{ci:?}");
    let opp = lever(&r, "opposite");
    assert_eq!(
        opp.reference.verdict,
        Verdict::Refuted {
            next_hypothesis: "opposite: decode is bound by layout conversion".into()
        }
    );
    let (s, _) = opp.reference.saving_fraction.unwrap();
    assert!((-0.32..-0.18).contains(&s), "{s}");
    let md = markdown(&r);
    assert!(
        md.contains("Next hypothesis: opposite: decode is bound by layout conversion"),
        "{md}"
    );
}

#[test]
fn one_arm_missing_is_insufficient_and_names_the_arm() {
    let r = ranking(&world().dirs);
    let half = lever(&r, "half");
    match &half.reference.verdict {
        Verdict::Insufficient { missing } => {
            assert!(missing.contains("treatment arm half=b"), "{missing}");
            assert!(
                missing.contains(&format!("{ROUNDS} baseline run(s)")),
                "{missing}"
            );
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(half.measured_rank, None);
}

#[test]
fn contended_and_incomplete_bundles_are_excluded_and_listed() {
    let w = world();
    let r = ranking(&w.dirs);
    let c = r.excluded.iter().find(|e| e.id == w.contended_id).unwrap();
    assert!(c.reason.starts_with("contended: load1 9.5"), "{}", c.reason);
    assert!(!r.used.contains(&w.contended_id));
    assert!(r
        .excluded
        .iter()
        .any(|e| e.reason.starts_with("incomplete: exit killed")));
    let md = markdown(&r);
    assert!(
        md.contains(&format!("| `{}` | contended: load1 9.5", w.contended_id)),
        "{md}"
    );
    // Every used id is listed in full.
    for id in &r.used {
        assert!(md.contains(&format!("- `{id}`")));
    }
    // 4 levers: fast, null, opposite pair at both rungs; half's runs are unpaired.
    assert_eq!(r.used.len(), 3 * 2 * 2 * ROUNDS as usize);
    assert_eq!(r.bundles_seen, w.dirs.len());
}

#[test]
fn shuffling_bundle_order_changes_no_byte() {
    let w = world();
    let a = markdown(&ranking(&w.dirs));
    let mut dirs = w.dirs.clone();
    let mut noise = Noise::new(99);
    for i in (1..dirs.len()).rev() {
        let j = ((noise.next() + 1.0) / 2.0 * (i + 1) as f64) as usize;
        dirs.swap(i, j.min(i));
    }
    assert_ne!(dirs, w.dirs);
    let loaded = load_dirs(&dirs);
    let mut bundles = loaded.bundles.clone();
    bundles.reverse();
    let b = markdown(&rank(
        &w.spec,
        &bundles,
        &loaded.unreadable,
        &[],
        "harness rank --store S",
    ));
    assert_eq!(a, b);
}

#[test]
fn the_fit_names_the_constant_phase() {
    let r = ranking(&world().dirs);
    let FitOutcome::Fit(fits) = &r.fit else {
        panic!("{:?}", r.fit)
    };
    assert_eq!(fits.len(), 1, "one model in this store: {fits:?}");
    let f = &fits[0];
    let frames = f
        .phases
        .iter()
        .find(|p| p.phase == "artifacts.frames")
        .unwrap();
    assert!(frames.does_not_scale, "{frames:?}");
    assert!((frames.fixed_s - 5.0).abs() < 0.1, "{frames:?}");
    let den = f.phases.iter().find(|p| p.phase == "denoise").unwrap();
    assert!(!den.does_not_scale, "{den:?}");
    // 2e-5 s per voxel = 20 s per million voxels.
    assert!((den.per_mvoxel_s - 20.0).abs() < 2.0, "{den:?}");
    // In this synthetic data only denoise grows with voxels: every other phase is named.
    let md = markdown(&r);
    let line = md
        .lines()
        .find(|l| l.starts_with("Phases that do not scale:"))
        .unwrap();
    assert!(
        line.contains("`artifacts.frames` (") && !line.contains("`denoise"),
        "{line}"
    );
}

#[test]
fn the_binaries_write_the_report_and_diff_two_bundles() {
    let w = world();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("harness-rank-e2e-report/levers.md");
    let spec = Path::new(env!("CARGO_TARGET_TMPDIR")).join("harness-rank-e2e-spec.toml");
    std::fs::write(&spec, spec_toml()).unwrap();
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["rank", "--store"])
        .arg(&w.store_root)
        .arg("--spec")
        .arg(&spec)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(
        md.contains(&format!(
            "Regenerate: `harness rank --store {} --spec {} --out {}`",
            w.store_root.display(),
            spec.display(),
            out.display()
        )),
        "{md}"
    );
    assert!(
        md.contains("| 1 | 2 (+1) | fast | slow→quick | wall(load.dit) | 6 |"),
        "{md}"
    );

    let ids: Vec<String> = w
        .dirs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["diff", &ids[0][..16], &ids[1], "--store"])
        .arg(&w.store_root)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains(&format!("- A: `{}`", ids[0])) && text.contains("| load.dit | 1 |"),
        "{text}"
    );
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["diff", "nosuchbundle", &ids[1], "--store"])
        .arg(&w.store_root)
        .output()
        .unwrap();
    // diff resolves ids through the store like every other command, with its message.
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("no bundle matches \"nosuchbundle\""), "{err}");
}

/// One lever, `probe`: a planted 15% saving of load.dit, judged against a 10%
/// minimum.
fn probe_spec() -> String {
    SpecToml::new()
        .lever(
            LeverToml::phase_wall("probe", "old", "new", "load.dit")
                .seed_issue("#34")
                .title("planted 15% saving of load.dit")
                .next_hypothesis("probe: next"),
        )
        .toml()
}

/// A 4-round campaign of `probe` at rung 2 (load.dit 20 s against 17 s, +-1%
/// noise, device open 0.5 s), and with `plant` its first treatment run slow as
/// a machine's first CUDA initialization makes it (load.dit 40 s, device open
/// 20 s). Returns the ranking and the planted run's id.
fn probe_campaign(name: &str, plant: bool) -> (Ranking, Option<String>) {
    let store = fresh_store(name);
    let mut noise = Noise::new(34);
    let mut planted = None;
    for round in 1..=4u32 {
        for (i, arm) in ["old", "new"].into_iter().enumerate() {
            let first = plant && round == 1 && arm == "new";
            let base = if arm == "new" { 17.0 } else { 20.0 };
            let load = if first {
                40.0
            } else {
                base * (1.0 + 0.01 * noise.next())
            };
            let mut r = render("2", RUNGS[1].1, load, 8.0, 16.0, 6.0, 5.0);
            r.schedule = Some((
                "pl4nted".into(),
                round,
                2 * (round - 1) + i as u32,
                "probe".into(),
                arm.into(),
            ));
            r.device_open_s = Some(if first { 20.0 } else { 0.5 });
            let id = seal(&store, &r);
            if first {
                planted = Some(id);
            }
        }
    }
    let spec = LeverSpec::parse(&probe_spec(), Path::new("probe-spec.toml")).unwrap();
    let loaded = load_dirs(&store_bundle_dirs(store.root()).unwrap());
    assert!(loaded.unreadable.is_empty(), "{:?}", loaded.unreadable);
    let r = rank(
        &spec,
        &loaded.bundles,
        &loaded.unreadable,
        &[],
        "harness rank --store S",
    );
    (r, planted)
}

/// Issue 34's must-show: a slow first run planted into a synthetic campaign.
/// Without it the planted 15% saving is confirmed; with it, the verdict over
/// every pair is no longer confirmed (the one run flips it), and rank, which
/// names the run an outlier and first-init, gives `sensitive (run X)` with
/// both verdicts in levers.md instead of either one silently.
///
/// Red under any of these mutations: `verdict::with_outliers` returning its
/// `with_flagged` verdict unchanged (the old behaviour: `insufficient`, the
/// run unnamed in the verdict); `outliers::outlier_indices` and the first-init
/// check flagging nothing (no `without_flagged`, no `Flagged runs` section).
#[test]
fn a_planted_slow_first_run_is_named_and_makes_the_verdict_sensitive() {
    let (clean, _) = probe_campaign("rank-probe-clean", false);
    assert_eq!(clean.levers[0].reference.verdict, Verdict::Confirmed);
    assert!(clean.levers[0].reference.flagged.is_empty());

    let (r, planted) = probe_campaign("rank-probe-planted", true);
    let planted = planted.unwrap();
    let x = &r.levers[0].reference;
    assert_eq!(x.rounds.len(), 4);
    // The planted run is flagged both ways, and only it.
    let kinds: Vec<(&str, &str)> = x
        .flagged
        .iter()
        .map(|f| (f.id.as_str(), f.kind.name()))
        .collect();
    assert_eq!(
        kinds,
        [
            (planted.as_str(), "outlier"),
            (planted.as_str(), "first-init")
        ]
    );
    let Verdict::Sensitive {
        runs,
        with_flagged,
        without_flagged,
    } = &x.verdict
    else {
        panic!("want sensitive, got {:?}", x.verdict)
    };
    assert_eq!(runs, &vec![planted.clone()]);
    // Without outlier handling the planted run flips the verdict.
    assert_ne!(**with_flagged, Verdict::Confirmed, "{with_flagged:?}");
    assert_eq!(**without_flagged, Verdict::Confirmed);
    assert_eq!(x.without_flagged.as_ref().map(|w| w.pairs), Some(3));
    let short = &planted[..12];
    let md = markdown(&r);
    assert!(
        md.contains(&format!("**sensitive (run {short})**")),
        "the verdict line: {md}"
    );
    assert!(
        md.contains(&format!("| sensitive (run {short}) |")),
        "the ranking row: {md}"
    );
    let flagged = md
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "- probe at rung 2: {short} (probe=new) outlier: 40.000 s"
            ))
        })
        .unwrap_or_else(|| panic!("the flagged-runs line: {md}"));
    assert!(
        flagged.contains("first-init: device open 20.00 s against its arm's median 0.50 s")
            && flagged.contains("without the flagged runs' pairs confirmed over 3 pair(s)"),
        "{flagged}"
    );
    // The pair holding it is marked in the pairs table, the others are not.
    let pair_rows: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| probe | 2 |"))
        .collect();
    assert_eq!(pair_rows.len(), 4, "{md}");
    assert!(
        pair_rows[0].contains("| treatment outlier: 40.000 s against its arm's median ")
            && pair_rows[0].ends_with(
                "; treatment first-init: device open 20.00 s against its arm's median 0.50 s |"
            ),
        "{}",
        pair_rows[0]
    );
    assert!(
        pair_rows[1..].iter().all(|l| l.ends_with("| — |")),
        "{pair_rows:?}"
    );
}

/// A store of one lever, `probe` (load.dit, 10% minimum), measured on two synthetic
/// hosts, three rounds each, each arm with +-2% noise: on `alpha` the treatment's
/// load.dit is `alpha` of the baseline's, on `beta` `beta` of it. Ranked by the
/// binary into `<dir>/levers.md` (and its forest plot); returns the markdown and
/// the SVG.
fn two_host_store(name: &str, alpha: f64, beta: f64) -> (String, String) {
    let store = fresh_store(name);
    let mut noise = Noise::new(38);
    let mut position = 0;
    for (host, ratio) in [("alpha", alpha), ("beta", beta)] {
        for round in 1..=3 {
            for (arm, f) in [("old", 1.0), ("new", ratio)] {
                let mut n = |x: f64| x * (1.0 + 0.02 * noise.next());
                let mut r = render("2", RUNGS[1].1, n(20.0) * f, 8.0, 16.0, 6.0, 5.0);
                r.hostname = host.into();
                r.schedule = Some(("f1ee7".into(), round, position, "probe".into(), arm.into()));
                position += 1;
                seal(&store, &r);
            }
        }
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("harness-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join("spec.toml");
    std::fs::write(&spec, probe_spec()).unwrap();
    let out = dir.join("levers.md");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["rank", "--store"])
        .arg(store.root())
        .arg("--spec")
        .arg(&spec)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(dir.join("levers-forest.svg")).unwrap(),
    )
}

/// Issue 38's must-show, end to end through `harness rank`: two synthetic hosts
/// whose effects disagree (alpha saves 40%, beta nothing) get `hosts-disagree`
/// and no pooled saving, with each host's row and the heterogeneity figure in
/// levers.md and the forest plot; two hosts that agree (both save 40%) are pooled
/// and confirmed, the figure beside the verdict. Red when the disagreement falls
/// through to the pooled verdict (`rank::rung_result`'s `Disagree` arm): the
/// pooled six pairs then read `insufficient` with a saving of 22.0% [7.3%,
/// 34.2%], an average of two hosts that measured 39% and nothing (tried).
#[test]
fn two_hosts_that_disagree_are_reported_and_two_that_agree_are_pooled() {
    let (md, svg) = two_host_store("rank-hosts-disagree", 0.6, 1.0);
    // Markdown cells escape `<` (escape::md_cell), so `p < 0.05` reads `p &lt; 0.05`.
    let row = md
        .lines()
        .find(|l| l.contains("| probe | old→new |"))
        .unwrap_or_else(|| panic!("no ranking row: {md}"));
    assert!(
        row.contains("| 6 | — | — | — | — | 10.0% | hosts-disagree (2 hosts, I² "),
        "{row}"
    );
    assert!(md.contains("## Hosts"), "{md}");
    let host_rows: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| probe | 2 | `"))
        .collect();
    assert_eq!(host_rows.len(), 2, "{md}");
    assert!(
        host_rows[0].starts_with("| probe | 2 | `alpha` | 3 |")
            && host_rows[0].ends_with("| confirmed |"),
        "{}",
        host_rows[0]
    );
    assert!(
        host_rows[1].starts_with("| probe | 2 | `beta` | 3 |")
            && host_rows[1].ends_with("| refuted |"),
        "{}",
        host_rows[1]
    );
    assert!(
        md.contains("- probe at rung 2: 2 hosts, 6 pair(s); I² ")
            && md.contains("the hosts disagree (p &lt; 0.05): no pooled effect or verdict."),
        "{md}"
    );
    assert!(
        md.contains("**hosts-disagree** — the hosts' savings differ beyond their pairs' spread"),
        "{md}"
    );
    assert!(
        md.contains("- Hosts (specs/hosts.md): a pair is formed within one host"),
        "{md}"
    );
    assert_eq!(svg.matches(r#"<g class="host-row""#).count(), 2, "{svg}");
    assert!(
        svg.contains(r#"data-host="alpha" data-verdict="confirmed""#),
        "{svg}"
    );
    assert!(
        svg.contains(r#"data-host="beta" data-verdict="refuted""#),
        "{svg}"
    );
    assert!(
        svg.contains(r#"data-lever="probe" data-rung="2" data-verdict="hosts-disagree""#),
        "{svg}"
    );

    let (md, svg) = two_host_store("rank-hosts-agree", 0.6, 0.6);
    let row = md
        .lines()
        .find(|l| l.contains("| probe | old→new |"))
        .unwrap_or_else(|| panic!("no ranking row: {md}"));
    assert!(row.starts_with("| 1 |"), "ranked: {row}");
    // The same planted effect with independent noise: some spread, not enough.
    assert!(row.contains("| confirmed (2 hosts, I² "), "{row}");
    assert!(
        md.contains("the hosts agree (p >= 0.05): pooled over 6 pair(s), verdict confirmed."),
        "{md}"
    );
    assert_eq!(svg.matches(r#"<g class="host-row""#).count(), 2);
    assert!(
        !svg.contains("hosts-disagree"),
        "no such verdict, no such legend entry"
    );
}
