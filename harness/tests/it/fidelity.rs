//! End-to-end fidelity: bundles whose frame images carry planted numerics changes,
//! sealed through the evidence crate and ranked (issue 22).

use crate::support::dirs::fresh_store;
use crate::support::ranked::{render, seal, Render};
use harness::bundle::files::store_bundle_dirs;
use harness::bundle::scan::load_dirs;
use harness::formats::markdown::markdown;
use harness::levers_spec::LeverSpec;
use harness::rank::verdict::Verdict;
use harness::rank::{rank, Ranking};
use harness::test_kit::levers::{LeverToml, SpecToml};
use std::path::Path;
use std::sync::OnceLock;

/// `tidy` is declared preserving but one treatment differs by one sample; `lossy`
/// and `faithful` change numerics and save 50% of load.dit: `lossy`'s frames are
/// far from its baseline's (about 20 dB), `faithful`'s one sample in 384 off by 2
/// (about 68 dB); `steady` is preserving and identical.
fn spec_toml() -> String {
    SpecToml::new()
        .lever(
            LeverToml::phase_wall("tidy", "off", "on", "load.dit")
                .title("preserving, with one planted differing sample"),
        )
        .lever(
            LeverToml::phase_wall("lossy", "f32", "bf16", "load.dit")
                .seed_issue("#2")
                .title("changing, large saving, poor fidelity")
                .changing("min_psnr_db = 40.0"),
        )
        .lever(
            LeverToml::phase_wall("faithful", "host", "device", "load.dit")
                .seed_issue("#3")
                .title("changing, large saving, good fidelity")
                .changing("min_psnr_db = 40.0, floor_margin_db = 3.0"),
        )
        .lever(
            LeverToml::phase_wall("steady", "a", "b", "load.dit")
                .seed_issue("#4")
                .title("preserving and identical"),
        )
        .toml()
}

const W: u32 = 16;
const H: u32 = 8;

/// The baseline's frame `name`: a fixed gradient.
fn frame(name: &str) -> Vec<u8> {
    let k = name.len() as u32;
    (0..W * H * 3)
        .map(|i| ((i * 7 + k * 31) % 200) as u8 + 20)
        .collect()
}

fn images(change: impl Fn(&str, &mut Vec<u8>)) -> Vec<(String, u32, u32, Vec<u8>)> {
    ["first.png", "middle.png", "last.png"]
        .iter()
        .map(|n| {
            let mut f = frame(n);
            change(n, &mut f);
            (n.to_string(), W, H, f)
        })
        .collect()
}

struct World {
    ranking: Ranking,
    /// The treatment id of `tidy`'s differing pair.
    tidy_differs: String,
}

fn world() -> &'static World {
    static W0: OnceLock<World> = OnceLock::new();
    W0.get_or_init(|| {
        let store = fresh_store("fidelity-e2e");
        let mut position = 0;
        let mut tidy_differs = String::new();
        for round in 1..=3u32 {
            for (lever, base, treat) in [
                ("tidy", "off", "on"),
                ("lossy", "f32", "bf16"),
                ("faithful", "host", "device"),
                ("steady", "a", "b"),
            ] {
                for arm in [base, treat] {
                    let on = arm == treat;
                    let load = if on && lever != "tidy" && lever != "steady" {
                        10.0
                    } else {
                        20.0 + round as f64 * 0.25
                    };
                    let mut r: Render =
                        render("2", (W as u64, H as u64, 9), load, 8.0, 4.0, 2.0, 1.0);
                    r.schedule = Some(("f1de".into(), round, position, lever.into(), arm.into()));
                    position += 1;
                    r.images = images(|n, f| match (lever, on) {
                        // One sample of the middle frame, one step off, in round 2.
                        ("tidy", true) if round == 2 && n == "middle.png" => f[5] += 1,
                        // Every sample scrambled by up to +-25: about 20 dB.
                        ("lossy", true) => {
                            for (i, x) in f.iter_mut().enumerate() {
                                *x = x
                                    .wrapping_add(((i * 37 + round as usize) % 51) as u8)
                                    .wrapping_sub(25);
                            }
                        }
                        // One sample of 1,152 off by 2: 10 log10(65025 * 1152 / 4) = 72.7 dB.
                        ("faithful", true) if n == "last.png" => f[0] += 2,
                        _ => {}
                    });
                    let id = seal(&store, &r);
                    if lever == "tidy" && on && round == 2 {
                        tidy_differs = id;
                    }
                }
            }
        }
        let dirs = store_bundle_dirs(store.root()).unwrap();
        let loaded = load_dirs(&dirs);
        assert!(loaded.unreadable.is_empty(), "{:?}", loaded.unreadable);
        let spec = LeverSpec::parse(&spec_toml(), Path::new("fidelity-spec.toml")).unwrap();
        World {
            ranking: rank(
                &spec,
                &loaded.bundles,
                &loaded.unreadable,
                &[],
                "harness rank --store S",
            ),
            tidy_differs,
        }
    })
}

fn lever<'a>(r: &'a Ranking, id: &str) -> &'a harness::rank::LeverResult {
    r.levers.iter().find(|l| l.id == id).unwrap()
}

#[test]
fn a_preserving_lever_whose_frames_differ_is_flagged_naming_the_pair() {
    let w = world();
    let tidy = lever(&w.ranking, "tidy");
    let f = &tidy.reference.fidelity;
    assert_eq!(f.pairs.len(), 3);
    assert_eq!(f.flagged.len(), 1, "{:?}", f.flagged);
    let short = &w.tidy_differs[..12];
    assert!(f.flagged[0].contains(short), "{}", f.flagged[0]);
    assert!(f.flagged[0].contains("max abs error 1"), "{}", f.flagged[0]);
    assert_eq!(f.max_abs_error, Some(1));
    assert_eq!(w.ranking.fidelity_flags, f.flagged);
    // The verdict is the saving's (none planted), not changed by the flag.
    assert_ne!(tidy.reference.verdict.name(), "refuted-fidelity");
    let md = markdown(&w.ranking);
    assert!(md.contains("## Fidelity flags (1)"), "{md}");
    assert!(
        md.contains("- **FLAGGED** tidy is declared numerics-preserving"),
        "{md}"
    );
    // The identical preserving lever is not flagged and reads infinite.
    let steady = &lever(&w.ranking, "steady").reference.fidelity;
    assert!(steady.flagged.is_empty());
    assert_eq!(steady.min_psnr_db, Some(f64::INFINITY));
    assert_eq!(steady.max_abs_error, Some(0));
}

#[test]
fn a_changing_lever_with_a_large_saving_and_poor_fidelity_is_not_confirmed() {
    let w = world();
    let lossy = lever(&w.ranking, "lossy");
    let (s, _) = lossy.reference.saving_fraction.unwrap();
    assert!(s > 0.4, "{s}");
    match &lossy.reference.verdict {
        Verdict::RefutedFidelity { why } => {
            assert!(why.contains("wholly below the threshold 40.00 dB"), "{why}")
        }
        v => panic!("{v:?}"),
    }
    let f = &lossy.reference.fidelity;
    let m = f.median_psnr_db.unwrap();
    assert!((15.0..30.0).contains(&m), "{m}");
    assert!(f.max_abs_error.unwrap() >= 20);
    assert!(f
        .threshold
        .as_ref()
        .unwrap()
        .source
        .contains("no floor measured"));
}

#[test]
fn a_changing_lever_with_a_large_saving_and_good_fidelity_is_confirmed() {
    let w = world();
    let ok = lever(&w.ranking, "faithful");
    assert_eq!(ok.reference.verdict, Verdict::Confirmed);
    let f = &ok.reference.fidelity;
    assert_eq!(f.max_abs_error, Some(2));
    let want = 10.0 * (65025.0f64 * (3 * W * H * 3) as f64 / 4.0).log10();
    let m = f.median_psnr_db.unwrap();
    assert!((m - want).abs() < 1e-9, "{m} vs {want}");
    assert!(f.flagged.is_empty());
    let md = markdown(&w.ranking);
    assert!(md.contains("no floor measured"), "{md}");
}
