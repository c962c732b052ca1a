//! End-to-end tests of the real `harness` binary on render-shaped bundles sealed
//! through the evidence crate: `plot` (PNG and SVG), `export --perfetto` read back
//! by Perfetto's own trace processor, `pack`/`unpack` (round trip and hostile
//! packs), `--json` on ls/show/verify/diff/rank, and cross-reads with polars and
//! DuckDB. The third-party readers come from scripts/pyenv.sh (`just test`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::support::bins::{harness, python, run};
use crate::support::dirs::{fresh_dir, fresh_store};
use crate::support::render::{self, seal_render, POWER_REASON};
use serde_json::Value;

fn ext_script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/external")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn store_arg(store: &evidence::store::Store) -> String {
    store.root().to_string_lossy().into_owned()
}

// ---------------------------------------------------------------- plot

#[test]
fn plot_writes_a_png_with_the_phase_bands_and_an_svg_with_the_labels() {
    let store = fresh_store("surfaces-plot");
    let p = seal_render(&store, 11, 6, false);
    let out = fresh_dir("surfaces-scratch-plot");
    let png_path = out.join("t.png");
    let (code, stdout, err) = run(harness().args([
        "plot",
        &p.id[..10],
        "--store",
        &store_arg(&store),
        "--out",
        png_path.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains(&p.id), "{stdout}");
    let bytes = std::fs::read(&png_path).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    let dec = png::Decoder::new(std::io::Cursor::new(&bytes));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.width, harness::formats::plot::DEFAULT_WIDTH);
    let t = harness::timeline::Timeline::load(&p.dir).unwrap();
    assert_eq!(info.height, harness::formats::plot::height_for(&t));
    // The planted samples carry GPM windows: the plot has its GPM panel, one
    // panel more than the same timeline without them.
    assert!(t.has_gpm());
    let mut bare = t.clone();
    for s in bare
        .series
        .iter_mut()
        .filter(|s| s.name.starts_with("gpm_"))
    {
        s.values.iter_mut().for_each(|v| *v = None);
    }
    assert!(!bare.has_gpm());
    assert!(harness::formats::plot::height_for(&t) > harness::formats::plot::height_for(&bare));
    // The band of the 5th phase name to appear (`denoise`, palette index 4) is drawn
    // at 85% over white: find that colour (to 1 level per channel: the blend
    // truncates) in the phases panel.
    let px = |x: u32, y: u32| {
        let i = ((y * info.width + x) * 3) as usize;
        (buf[i], buf[i + 1], buf[i + 2])
    };
    let (r, g, b) = (118.0, 183.0, 178.0);
    let mix = |c: f64| (c * 0.85 + 255.0 * 0.15).round() as u8;
    let want = (mix(r), mix(g), mix(b));
    let top = (0..260).flat_map(|y| (0..info.width).map(move |x| (x, y)));
    let near = |a: (u8, u8, u8), b: (u8, u8, u8)| {
        a.0.abs_diff(b.0) <= 1 && a.1.abs_diff(b.1) <= 1 && a.2.abs_diff(b.2) <= 1
    };
    let hits = top.filter(|&(x, y)| near(px(x, y), want)).count();
    assert!(
        hits > 500,
        "denoise band colour {want:?} found at {hits} pixels"
    );
    let distinct: std::collections::HashSet<_> = (0..info.height)
        .step_by(7)
        .flat_map(|y| (0..info.width).step_by(5).map(move |x| (x, y)))
        .map(|(x, y)| px(x, y))
        .collect();
    assert!(
        distinct.len() > 20,
        "only {} colours: a blank picture?",
        distinct.len()
    );

    let svg_path = out.join("t.svg");
    let (code, _, err) = run(harness().args([
        "plot",
        p.dir.to_str().unwrap(),
        "--out",
        svg_path.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{err}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
    for needle in [
        "rung 0 (tiny 64x64x9, 6 steps, cpu)",
        "levers: staging=batched",
        "exit completed (code 0)",
        "completion pass",
        "load.text_encoder",
        "denoise.step 3",
        "12 x dit.forward",
        POWER_REASON,
        "host RSS (engine tree)",
    ] {
        assert!(svg.contains(needle), "the SVG lacks {needle:?}");
    }
    // Bad extension: a usage error, nothing written.
    let (code, _, err) = run(harness().args([
        "plot",
        p.dir.to_str().unwrap(),
        "--out",
        out.join("t.jpg").to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(".png or .svg"), "{err}");
    assert!(!out.join("t.jpg").exists());
}

// ---------------------------------------------------------------- perfetto

#[test]
fn perfetto_export_is_read_back_by_perfettos_trace_processor() {
    let py = python();
    let store = fresh_store("surfaces-perfetto");
    let p = seal_render(&store, 23, 5, true);
    let out = fresh_dir("surfaces-scratch-perfetto").join("trace.json");
    let (code, _, err) = run(harness().args([
        "export",
        "--perfetto",
        &p.id,
        "--store",
        &store_arg(&store),
        "--out",
        out.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{err}");
    let o = std::process::Command::new(&py)
        .arg(ext_script("check_perfetto.py"))
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the trace processor failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let tp: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        tp["errors"],
        Value::Array(vec![]),
        "import errors: {}",
        tp["errors"]
    );

    // Every phase is one slice, at its time (ns from the origin = run start), with its
    // duration and its nesting depth as the trace processor derived it.
    let slices = tp["slices"].as_array().unwrap();
    assert_eq!(slices.len(), p.phases.len());
    let origin = render::T0 as i64;
    let mut theirs: Vec<(i64, i64, String, i64)> = slices
        .iter()
        .map(|s| {
            (
                s["ts"].as_i64().unwrap(),
                s["depth"].as_i64().unwrap(),
                s["name"].as_str().unwrap().to_string(),
                s["dur"].as_i64().unwrap(),
            )
        })
        .collect();
    let mut ours: Vec<(i64, i64, String, i64)> = p
        .phases
        .iter()
        .map(|ph| {
            let end = ph.close_ns.unwrap_or(p.end_ns) as i64;
            (
                ph.open_ns as i64 - origin,
                ph.depth,
                ph.name.clone(),
                end - ph.open_ns as i64,
            )
        })
        .collect();
    theirs.sort();
    ours.sort();
    assert_eq!(theirs, ours);
    assert!(slices.iter().all(|s| s["thread"] == "phases"), "{slices:?}");
    // Step attributes arrive as args.
    let steps: Vec<i64> = tp["step_args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["int_value"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, (1..=5).collect::<Vec<i64>>());
    // Ticks as instants, plus the exit instant.
    let instants = tp["instants"].as_array().unwrap();
    let tick_ts: Vec<i64> = instants
        .iter()
        .filter(|i| i["name"] == "dit.forward")
        .map(|i| i["ts"].as_i64().unwrap())
        .collect();
    let want: Vec<i64> = p.ticks.iter().map(|&t| t as i64 - origin).collect();
    assert_eq!(tick_ts, want);
    assert!(instants.iter().any(|i| i["name"] == "exit: interrupted"));
    // Counter tracks: one per column with values, null samples skipped.
    let counters: BTreeMap<String, &Value> = tp["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["track"].as_str().unwrap().to_string(), c))
        .collect();
    let rss = counters["rss_bytes bytes"];
    assert_eq!(rss["n"].as_u64().unwrap() as usize, p.rss.len());
    let max = p.rss.iter().cloned().fold(f64::MIN, f64::max);
    assert_eq!(rss["max"].as_f64().unwrap(), max);
    let util = counters["gpu_util_pct percent"];
    let n_util = p.util.iter().flatten().count();
    assert!(n_util < p.util.len(), "the fixture must have null readings");
    assert_eq!(util["n"].as_u64().unwrap() as usize, n_util);
    assert!(
        !counters.keys().any(|k| k.starts_with("gpu_power_mw")),
        "an unavailable sensor must not become a track of zeros: {:?}",
        counters.keys()
    );
    // GPM: one counter value per window (a window every fourth row, placed at its
    // start, not at the row), never the windows' bounds as counters.
    let t = harness::timeline::Timeline::load(&p.dir).unwrap();
    let windows = t.windowed("gpm_tensor_active_pct");
    assert!(windows.len() >= 3, "{}", windows.len());
    let tensor = counters["gpm_tensor_active_pct percent"];
    assert_eq!(tensor["n"].as_u64().unwrap() as usize, windows.len());
    assert_eq!(tensor["max"].as_f64().unwrap(), 70.0);
    assert!(
        !counters.keys().any(|k| k.starts_with("gpm_window_")),
        "{:?}",
        counters.keys()
    );
    assert!(tp["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p2| p2["name"].as_str().unwrap().contains(&p.id[..12])));
}

// ---------------------------------------------------------------- pack / unpack

fn entries_of(store: &evidence::store::Store) -> (Vec<String>, Vec<String>) {
    let list = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    (list(&store.bundles_dir()), list(&store.staging_root()))
}

#[test]
fn pack_then_unpack_into_another_store_gives_the_same_verified_bundle() {
    let a = fresh_store("surfaces-pack-a");
    let b = fresh_store("surfaces-pack-b");
    let p = seal_render(&a, 31, 3, false);
    let out = fresh_dir("surfaces-scratch-pack").join("b.tar.zst");
    let (code, _, err) = run(harness().args([
        "pack",
        &p.id[..8],
        "--store",
        &store_arg(&a),
        "--out",
        out.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{err}");
    // Deterministic: packing again gives the same bytes.
    let first = std::fs::read(&out).unwrap();
    let again = harness::pack::pack_bytes(&p.dir, &p.id).unwrap();
    assert_eq!(first, again);
    let (code, stdout, err) =
        run(harness().args(["unpack", out.to_str().unwrap(), "--store", &store_arg(&b)]));
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("verified"), "{stdout}");
    let landed = b.bundles_dir().join(&p.id);
    for e in std::fs::read_dir(&p.dir).unwrap() {
        let e = e.unwrap();
        assert_eq!(
            std::fs::read(e.path()).unwrap(),
            std::fs::read(landed.join(e.file_name())).unwrap()
        );
    }
    assert!(evidence::verify::verify_dir(&landed).ok());
    assert_eq!(
        entries_of(&b).1,
        Vec::<String>::new(),
        "staging left behind"
    );
    // A second unpack changes nothing.
    let (code, stdout, _) =
        run(harness().args(["unpack", out.to_str().unwrap(), "--store", &store_arg(&b)]));
    assert_eq!(code, 0);
    assert!(stdout.contains("already in the store"), "{stdout}");
}

/// One tar entry as written raw: header name, type, declared size, data, link target.
type RawEntry<'a> = (Vec<u8>, tar::EntryType, u64, Vec<u8>, Option<&'a str>);

/// A tar of `entries` (raw header names, types and declared sizes), zstd-compressed.
fn hostile_pack(entries: &[RawEntry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, ty, size, data, link) in entries {
        let mut h = tar::Header::new_gnu();
        let raw = &mut h.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name);
        h.set_entry_type(*ty);
        h.set_size(*size);
        h.set_mode(0o644);
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_cksum();
        b.append(&h, data.as_slice()).unwrap();
    }
    zstd::stream::encode_all(b.into_inner().unwrap().as_slice(), 3).unwrap()
}

#[test]
fn hostile_packs_are_refused_with_a_clear_message_and_leave_nothing() {
    let src = fresh_store("surfaces-hostile-src");
    let p = seal_render(&src, 47, 2, false);
    let files: BTreeMap<String, Vec<u8>> = std::fs::read_dir(&p.dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    let reg = tar::EntryType::Regular;
    let genuine = |flip: Option<&str>| -> Vec<RawEntry> {
        files
            .iter()
            .map(|(n, d)| {
                let mut d = d.clone();
                if flip == Some(n.as_str()) {
                    let k = d.len() / 2;
                    d[k] ^= 0x01;
                }
                (
                    format!("{}/{n}", p.id).into_bytes(),
                    reg,
                    d.len() as u64,
                    d,
                    None,
                )
            })
            .collect()
    };
    let dir = fresh_dir("surfaces-scratch-hostile");
    let mut cases: Vec<(&str, Vec<u8>, &[&str], i32)> = Vec::new();
    let mut dotdot = genuine(None);
    dotdot.push((
        format!("{}/../../escape.txt", p.id).into_bytes(),
        reg,
        3,
        b"bad".to_vec(),
        None,
    ));
    cases.push((
        "dotdot",
        hostile_pack(&dotdot),
        &["escape.txt", "leaves the bundle directory"],
        2,
    ));
    let mut absolute = genuine(None);
    absolute.insert(0, (b"/etc/evil".to_vec(), reg, 3, b"bad".to_vec(), None));
    cases.push((
        "absolute",
        hostile_pack(&absolute),
        &["/etc/evil", "leaves the bundle directory"],
        2,
    ));
    let mut link = genuine(None);
    link.retain(|e| !e.0.ends_with(b"/log.zst"));
    link.push((
        format!("{}/log.zst", p.id).into_bytes(),
        tar::EntryType::Symlink,
        0,
        vec![],
        Some("/etc/passwd"),
    ));
    cases.push((
        "symlink",
        hostile_pack(&link),
        &["symlink", "/etc/passwd", "regular files only"],
        2,
    ));
    let mut huge = genuine(None);
    huge.retain(|e| !e.0.ends_with(b"/samples.parquet"));
    huge.push((
        format!("{}/samples.parquet", p.id).into_bytes(),
        reg,
        10_000_000_000,
        vec![],
        None,
    ));
    cases.push((
        "huge",
        hostile_pack(&huge),
        &["samples.parquet", "declares 10000000000 bytes", "limit"],
        2,
    ));
    let mut dup = genuine(None);
    let first = dup[0].clone();
    dup.push(first);
    cases.push(("duplicate", hostile_pack(&dup), &["more than once"], 2));
    cases.push((
        "flipped",
        hostile_pack(&genuine(Some("samples.parquet"))),
        &["samples.parquet", "sha256", "verification failure"],
        1,
    ));
    cases.push((
        "garbage",
        b"this is not a pack at all".to_vec(),
        &["not a readable bundle pack"],
        2,
    ));

    for (name, bytes, needles, want_code) in cases {
        let dst = fresh_store(&format!("surfaces-hostile-{name}"));
        let f = dir.join(format!("{name}.tar.zst"));
        std::fs::write(&f, &bytes).unwrap();
        let (code, _, err) =
            run(harness().args(["unpack", f.to_str().unwrap(), "--store", &store_arg(&dst)]));
        assert_eq!(code, want_code, "{name}: {err}");
        for n in needles {
            assert!(err.contains(n), "{name}: message lacks {n:?}: {err}");
        }
        let (bundles, staging) = entries_of(&dst);
        assert!(
            bundles.is_empty() && staging.is_empty(),
            "{name}: left {bundles:?} {staging:?}"
        );
        assert!(!dst.root().parent().unwrap().join("escape.txt").exists());
        assert!(!dir.join("escape.txt").exists());
    }
    // The same entries, genuine, are accepted: the refusals above are about the hostility.
    let ok = dir.join("genuine.tar.zst");
    std::fs::write(&ok, hostile_pack(&genuine(None))).unwrap();
    let dst = fresh_store("surfaces-hostile-genuine");
    let (code, _, err) =
        run(harness().args(["unpack", ok.to_str().unwrap(), "--store", &store_arg(&dst)]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(entries_of(&dst).0, vec![p.id.clone()]);
}

// ---------------------------------------------------------------- --json

#[test]
fn json_outputs_of_ls_show_verify_diff_and_rank_parse_and_carry_the_values() {
    let store = fresh_store("surfaces-json");
    let a = seal_render(&store, 51, 2, false);
    let b = seal_render(&store, 52, 3, true);
    let s = store_arg(&store);

    let (code, out, err) = run(harness().args(["ls", "--json", "--store", &s]));
    assert_eq!(code, 0, "{err}");
    let ls: Value = serde_json::from_str(&out).unwrap();
    let rows = ls.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    let row_b = rows.iter().find(|r| r["id"] == b.id.as_str()).unwrap();
    assert_eq!(row_b["exit"], "interrupted");
    assert_eq!(row_b["complete"], false);
    assert_eq!(row_b["rung"], "0");
    assert_eq!(row_b["levers"]["staging"], "batched");
    assert_eq!(row_b["host"], "testhost");
    let wall = (b.end_ns - render::T0) as f64 / 1e9;
    assert!((row_b["run_wall_s"].as_f64().unwrap() - wall).abs() < 1e-9);

    let (code, out, err) = run(harness().args(["show", &a.id[..12], "--json", "--store", &s]));
    assert_eq!(code, 0, "{err}");
    let show: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(show["id"], a.id.as_str());
    assert_eq!(show["manifest"]["exit"]["reason"], "completed");
    let phases = show["phases"].as_array().unwrap();
    assert_eq!(phases.len(), a.phases.len());
    let den = phases.iter().find(|r| r["name"] == "denoise").unwrap();
    let pd = a.phases.iter().find(|ph| ph.name == "denoise").unwrap();
    assert_eq!(den["open_ns"].as_u64().unwrap(), pd.open_ns);
    assert_eq!(den["close_ns"].as_u64().unwrap(), pd.close_ns.unwrap());
    assert_eq!(den["is_leaf"], false);
    assert_eq!(phases[5]["attrs_json"]["open"]["step"], 1, "{}", phases[5]);

    let (code, out, _) = run(harness().args(["verify", &a.id, "--json", "--store", &s]));
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["ok"].clone(), v["errors"].clone()),
        (Value::Bool(true), serde_json::json!([]))
    );
    // Corrupt b's samples: verify --json says so, with exit 1.
    let sp = b.dir.join("samples.parquet");
    let mut bytes = std::fs::read(&sp).unwrap();
    let k = bytes.len() / 3;
    bytes[k] ^= 0x40;
    std::fs::write(&sp, &bytes).unwrap();
    let (code, out, _) = run(harness().args(["verify", &b.id, "--json", "--store", &s]));
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    assert!(
        v["errors"][0].as_str().unwrap().contains("samples.parquet"),
        "{v}"
    );

    let c = seal_render(&store, 53, 4, false);
    let (code, out, err) = run(harness().args(["diff", &a.id, &c.id, "--json", "--store", &s]));
    assert_eq!(code, 0, "{err}");
    let d: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (d["a"].as_str(), d["b"].as_str()),
        (Some(&*a.id), Some(&*c.id))
    );
    let steps = d["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["phase"] == "denoise.step")
        .unwrap();
    assert_eq!(
        (steps["a_count"].clone(), steps["b_count"].clone()),
        (2.into(), 4.into())
    );
    let sum_s = |p: &render::Planted| -> f64 {
        p.phases
            .iter()
            .filter(|ph| ph.name == "denoise.step")
            .map(|ph| (ph.close_ns.unwrap() - ph.open_ns) as f64 / 1e9)
            .sum()
    };
    // GPM: the planted windows give denoise 70% tensor-pipe and 95% SM activity
    // (its wholly-inside windows) in both; a phase no window fits has no row.
    let gpm = |name: &str| {
        d["summaries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} row: {}", d["summaries"]))
    };
    let t = gpm("GPM tensor-pipe activity in denoise (median share)");
    assert_eq!(
        (t["a"].as_f64(), t["b"].as_f64()),
        (Some(0.7), Some(0.7)),
        "{t}"
    );
    assert_eq!(t["ratio"].as_f64(), Some(1.0), "{t}");
    assert_eq!(
        gpm("GPM SM activity in denoise (median share)")["a"].as_f64(),
        Some(0.95)
    );
    let (sa, sc) = (sum_s(&a), sum_s(&c));
    assert!(
        (steps["a_s"].as_f64().unwrap() - sa).abs() < 1e-9,
        "{steps}"
    );
    assert!(
        (steps["b_s"].as_f64().unwrap() - sc).abs() < 1e-9,
        "{steps}"
    );
    assert!(
        (steps["delta_s"].as_f64().unwrap() - (sc - sa)).abs() < 1e-9,
        "{steps}"
    );
    // The planted renders keep no stills: the frames say why they were not
    // compared rather than a figure.
    assert!(
        d["frames"]["not_compared"]
            .as_str()
            .is_some_and(|w| w.contains("no frame image kept by both")),
        "{}",
        d["frames"]
    );
    // An unknown id in diff: usage error (2), nothing on stdout.
    let (code, out, _) =
        run(harness().args(["diff", &a.id, "0000000000", "--json", "--store", &s]));
    assert_eq!((code, out.as_str()), (2, ""));

    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/levers.toml");
    let (code, out, err) = run(harness().args([
        "rank",
        "--json",
        "--store",
        &s,
        "--spec",
        spec.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["bundles_seen"], 3, "{r}");
    let mut seen: Vec<String> = r["used"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .chain(
            r["excluded"]
                .as_array()
                .unwrap()
                .iter()
                // An unreadable bundle is named by its path: keep the directory name.
                .map(|e| {
                    e["id"]
                        .as_str()
                        .unwrap()
                        .rsplit('/')
                        .next()
                        .unwrap()
                        .to_string()
                }),
        )
        .collect();
    seen.sort();
    let mut want = vec![a.id.clone(), b.id.clone(), c.id.clone()];
    want.sort();
    assert_eq!(seen, want, "every bundle used or excluded: {r}");

    // The codes are in the binary's help, as harness::exit defines them.
    let (code, help, _) = run(harness().arg("--help"));
    assert_eq!(code, 0);
    assert!(help.contains(harness::exit::HELP), "{help}");

    // An unknown id is a usage error (2) with --json too.
    let (code, _, err) = run(harness().args(["show", "ffffffff", "--json", "--store", &s]));
    assert_eq!(code, 2, "{err}");
}

// ---------------------------------------------------------------- cross-reads

#[test]
fn polars_and_duckdb_read_a_bundle_as_a_user_would() {
    let py = python();
    let store = fresh_store("surfaces-crossread");
    let p = seal_render(&store, 61, 4, false);
    let o = std::process::Command::new(&py)
        .arg(ext_script("cross_read.py"))
        .arg(&p.dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "cross_read.py: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let den = p.phases.iter().find(|ph| ph.name == "denoise").unwrap();
    let den_s = (den.close_ns.unwrap() - den.open_ns) as f64 / 1e9;
    for reader in ["polars", "duckdb"] {
        let r = &v[reader];
        assert_eq!(
            r["samples"].as_u64().unwrap() as usize,
            p.sample_t.len(),
            "{reader}"
        );
        assert_eq!(
            r["phases"].as_u64().unwrap() as usize,
            p.phases.len(),
            "{reader}"
        );
        assert_eq!(r["steps"].as_u64().unwrap(), 4, "{reader}");
        assert!(
            (r["denoise_s"].as_f64().unwrap() - den_s).abs() < 1e-9,
            "{reader}: {r}"
        );
        assert_eq!(
            r["max_rss"].as_f64().unwrap(),
            p.rss.iter().cloned().fold(f64::MIN, f64::max),
            "{reader}"
        );
        let n_util = p.util.iter().flatten().count() as u64;
        assert_eq!(r["util_non_null"].as_u64().unwrap(), n_util, "{reader}");
        assert_eq!(r["power_non_null"].as_u64().unwrap(), 0, "{reader}");
    }
    assert_eq!(v["polars"]["rss_unit"], "bytes");
    assert_eq!(v["polars"]["power_unit"], "milliwatts");
    assert_eq!(v["duckdb"]["table_kv"], "samples");
}
