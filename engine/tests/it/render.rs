//! End-to-end tests of the real `engine` binary on rung 0 (`rungs/0.toml`):
//! markers (every name `specs/markers.md` lists, well nested, leaves covering the
//! wall), frames (pixel sanity), determinism by seed, and exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::common::{spans, Span};
use engine::frames::png::read_png;
use engine::frames::y4m::{read_y4m, rgb_to_ycbcr};
use evidence::marker::Marker;
use sha2::{Digest, Sha256};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_engine")
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("render")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Tiny synthetic weights, written once per test process by the binary itself.
fn tiny_weights() -> &'static Path {
    static W: OnceLock<PathBuf> = OnceLock::new();
    W.get_or_init(|| {
        let d = scratch("weights-tiny");
        let stdout = crate::common::synth_weights(Path::new(bin()), "tiny", &d);
        let last = stdout.lines().last().unwrap().to_string();
        assert!(last.starts_with("sha256:") && last.len() == 71, "{last}");
        assert_eq!(
            std::fs::read_to_string(d.join("DIGEST")).unwrap().trim(),
            last
        );
        d
    })
}

/// One render: the process, its markers and its frames directory.
struct Run {
    out: Output,
    markers: Vec<Marker>,
    wall_ns: u64,
    dir: PathBuf,
}

/// Run `engine render` on `rung` with extra args (markers on descriptor 3).
fn render(name: &str, rung: &Path, extra: &[&str]) -> Run {
    // One render at a time: the coverage check must not measure the other
    // tests' renders competing for this 2-core machine.
    let _one = crate::common::exclusive();
    let dir = scratch(name);
    let frames = dir.join("frames");
    let args = crate::common::render_args(rung, tiny_weights(), &frames, extra);
    let r = crate::common::run_with_markers(Path::new(bin()), &args, &dir);
    Run {
        out: r.out,
        markers: r.markers,
        wall_ns: r.wall_ns,
        dir: frames,
    }
}

fn rung0() -> PathBuf {
    repo().join("rungs/0.toml")
}

fn ok(r: &Run) {
    assert!(
        r.out.status.success(),
        "engine failed ({:?}): {}",
        r.out.status.code(),
        String::from_utf8_lossy(&r.out.stderr)
    );
}

fn sha(path: &Path) -> String {
    let mut h = Sha256::new();
    h.update(std::fs::read(path).unwrap());
    format!("{:x}", h.finalize())
}

/// Leaf coverage of the marker span and of the process wall, and the gap
/// before each leaf (for the failure message).
fn coverage(r: &Run) -> (f64, f64, String) {
    let ms = &r.markers;
    let sp = spans(ms);
    let mut leaves: Vec<&Span> = sp.iter().filter(|s| s.leaf).collect();
    leaves.sort_by_key(|s| s.open);
    let covered: u64 = leaves.iter().map(|s| s.close - s.open).sum();
    let first = ms.first().map(Marker::t_ns).unwrap_or(0);
    let last = ms.last().map(Marker::t_ns).unwrap_or(0);
    let mut gaps = Vec::new();
    let mut prev = first;
    for s in &leaves {
        gaps.push(format!("{}:{:.3}ms", s.name, (s.open - prev) as f64 / 1e6));
        prev = s.close;
    }
    (
        covered as f64 / (last - first).max(1) as f64,
        covered as f64 / r.wall_ns.max(1) as f64,
        format!(
            "gaps before each leaf {gaps:?}, after the last {:.3}ms",
            (last - prev) as f64 / 1e6
        ),
    )
}

#[test]
fn rung0_renders_with_every_marker_nested_and_frames_that_look_like_video() {
    let r = render("rung0", &rung0(), &[]);
    ok(&r);
    let ms = &r.markers;
    assert!(matches!(
        ms.first(),
        Some(Marker::Hello { protocol: 1, .. })
    ));
    assert!(
        ms.windows(2).all(|w| w[0].t_ns() <= w[1].t_ns()),
        "timestamps go back"
    );
    let sp = spans(ms);
    let names: Vec<&str> = sp.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "load.text_encoder",
        "load.dit",
        "load.vae",
        "conditioning",
        "denoise",
        "denoise.step",
        "decode.video",
        "decode.video.chunk",
        "artifacts.frames",
    ] {
        assert!(names.contains(&want), "missing phase {want}: {names:?}");
    }
    let idx = |n: &str| names.iter().position(|x| *x == n).unwrap();
    // Containment: steps inside denoise, chunks inside decode.video.
    let steps: Vec<&Span> = sp.iter().filter(|s| s.name == "denoise.step").collect();
    assert_eq!(steps.len(), 4, "rung 0 has 4 steps");
    assert!(steps.iter().all(|s| s.parent == Some(idx("denoise"))));
    let chunks: Vec<&Span> = sp
        .iter()
        .filter(|s| s.name == "decode.video.chunk")
        .collect();
    assert!(!chunks.is_empty());
    assert!(chunks.iter().all(|s| s.parent == Some(idx("decode.video"))));
    // The latents' preparation is timed inside chunk 0: a finite, non-negative
    // millisecond figure no longer than the decode's own wall.
    let dv = &sp[idx("decode.video")];
    let latents_ms = dv.close_attrs.get("latents_ms").and_then(|v| v.as_f64());
    let wall_ms = (dv.close - dv.open) as f64 / 1e6;
    assert!(
        latents_ms.is_some_and(|ms| ms.is_finite() && ms >= 0.0 && ms <= wall_ms),
        "decode.video close: latents_ms {latents_ms:?} against a wall of {wall_ms} ms"
    );
    for (i, c) in chunks.iter().enumerate() {
        assert!(
            c.close_attrs
                .get("peak_host_bytes")
                .and_then(|v| v.as_u64())
                .unwrap()
                > 0
        );
        let open_attrs = ms
            .iter()
            .filter_map(|m| match m {
                Marker::Open { name, attrs, .. } if name == "decode.video.chunk" => Some(attrs),
                _ => None,
            })
            .nth(i)
            .unwrap();
        assert_eq!(open_attrs["chunk"], serde_json::json!(i));
    }
    // Every close carries the phase's peak host bytes.
    for s in &sp {
        let p = s
            .close_attrs
            .get("peak_host_bytes")
            .and_then(|v| v.as_u64());
        assert!(p.is_some_and(|p| p > 1 << 20), "{} peak {p:?}", s.name);
        assert!(!s.close_attrs.contains_key("aborted"), "{} aborted", s.name);
    }
    // Enclosing phases carry at least their children's peaks.
    for s in &sp {
        if let Some(p) = s.parent {
            let mine = s.close_attrs["peak_host_bytes"].as_u64().unwrap();
            let parent = sp[p].close_attrs["peak_host_bytes"].as_u64().unwrap();
            assert!(
                parent >= mine,
                "{} {mine} > parent {} {parent}",
                s.name,
                sp[p].name
            );
        }
    }
    // Ticks: two forwards per step (guidance 3), inside their step, numbered.
    let mut forwards = Vec::new();
    let mut stack: Vec<&str> = Vec::new();
    for m in ms {
        match m {
            Marker::Open { name, .. } => stack.push(name),
            Marker::Close { .. } => {
                stack.pop();
            }
            Marker::Tick { name, attrs, .. } => {
                assert_eq!(name, "dit.forward");
                assert_eq!(stack.last().copied(), Some("denoise.step"));
                forwards.push(attrs.clone());
            }
            _ => {}
        }
    }
    assert_eq!(forwards.len(), 8);
    for (i, a) in forwards.iter().enumerate() {
        assert_eq!(a["forward"], serde_json::json!(i + 1));
        assert_eq!(a["step"], serde_json::json!(i / 2 + 1));
        assert_eq!(a["steps"], serde_json::json!(4));
        assert_eq!(
            a.contains_key("last_s"),
            i > 0,
            "last_s on forward {}",
            i + 1
        );
    }
    // Info marker after the frames.
    let info = ms
        .iter()
        .rev()
        .find_map(|m| match m {
            Marker::Info { attrs, .. } => Some(attrs),
            _ => None,
        })
        .unwrap();
    assert_eq!(info["frames_written"], serde_json::json!(9));
    assert_eq!(info["video"], serde_json::json!("video.y4m"));
    assert_eq!(
        (info["width"].as_u64(), info["height"].as_u64()),
        (Some(64), Some(64))
    );

    // Coverage, judged on the best of up to five renders: a real unmarked gap
    // shows in every run, while a preemption on a loaded 2-core box (each
    // phase boundary writes two lines, and a 2-4 ms preemption is 2-4% of this
    // 0.1-0.2 s render) lands in a gap only by chance.
    let mut best = coverage(&r);
    for k in 1..5 {
        if best.0 >= 0.99 {
            break;
        }
        let again = render(&format!("rung0-cov{k}"), &rung0(), &[]);
        ok(&again);
        let c = coverage(&again);
        if c.0 > best.0 {
            best = c;
        }
    }
    let (span_cov, wall_cov, gaps) = best;
    eprintln!(
        "rung 0: leaves cover {span_cov:.4} of the marker span, {wall_cov:.4} of the process wall"
    );
    // The brief's rule: no unmarked gaps between the engine's announcement and
    // its last marker (argument parsing before it and exit after it aside). The
    // process-wall share is printed: on this 2-core box under load, exec and
    // start-up alone take 8-40 ms of a ~0.2 s render.
    assert!(
        span_cov >= 0.99,
        "leaves cover {span_cov:.4} of the marker span; {gaps}"
    );
    assert!(
        wall_cov > 0.5,
        "leaves cover {wall_cov:.4} of the process wall"
    );

    // Frames: 9 of 64x64, none near-black or near-uniform, adjacent ones differ,
    // all distinct; the PNGs are frames 0, 4 and 8 of the video.
    let v = read_y4m(&r.dir.join("video.y4m")).unwrap();
    assert_eq!(
        (v.width, v.height, v.frames.len(), v.fps),
        (64, 64, 9, (25, 1))
    );
    crate::common::pixel_check(&v).unwrap_or_else(|e| panic!("rung 0 frames: {e}"));
    for (name, i) in [("first.png", 0), ("middle.png", 4), ("last.png", 8)] {
        let f = read_png(&r.dir.join(name)).unwrap();
        assert_eq!((f.width, f.height), (64, 64));
        let y: Vec<u8> = f
            .rgb
            .chunks(3)
            .map(|p| rgb_to_ycbcr(p[0], p[1], p[2]).0)
            .collect();
        assert_eq!(y.as_slice(), v.luma(i), "{name} is not frame {i}");
    }
}

fn hashes(dir: &Path) -> Vec<String> {
    ["video.y4m", "first.png", "middle.png", "last.png"]
        .iter()
        .map(|n| sha(&dir.join(n)))
        .collect()
}

#[test]
fn same_seed_same_frames_different_seed_different_frames() {
    let a = render("seed-a", &rung0(), &["--all-frames"]);
    let b = render("seed-b", &rung0(), &["--threads", "1"]);
    ok(&a);
    ok(&b);
    assert_eq!(
        hashes(&a.dir),
        hashes(&b.dir),
        "same seed, other thread count"
    );
    assert!(a.dir.join("frame_00008.png").is_file());
    assert!(!b.dir.join("frame_00000.png").exists());
    let d = scratch("seed-43");
    let text = std::fs::read_to_string(rung0())
        .unwrap()
        .replace("seed = 42", "seed = 43");
    assert!(text.contains("seed = 43"));
    let r43 = d.join("43.toml");
    std::fs::write(&r43, text).unwrap();
    let c = render("seed-c", &r43, &[]);
    ok(&c);
    let (ha, hc) = (hashes(&a.dir), hashes(&c.dir));
    for (x, y) in ha.iter().zip(&hc) {
        assert_ne!(x, y, "a different seed must change every artifact");
    }
}

fn peak_max(r: &Run) -> u64 {
    r.markers
        .iter()
        .filter_map(|m| match m {
            Marker::Close { attrs, .. } => attrs.get("peak_host_bytes").and_then(|v| v.as_u64()),
            _ => None,
        })
        .max()
        .unwrap()
}

#[test]
fn baseline_profile_renders_the_same_frames_and_reports_its_levers() {
    let base = render("baseline", &rung0(), &["--profile", "baseline"]);
    let def = render("default", &rung0(), &[]);
    ok(&base);
    ok(&def);
    assert_eq!(
        hashes(&base.dir),
        hashes(&def.dir),
        "levers must not change pixels"
    );
    let hello = |r: &Run| match &r.markers[0] {
        Marker::Hello { attrs, .. } => attrs["levers"].clone(),
        _ => panic!("no hello"),
    };
    assert_eq!(hello(&base)["widen-f32"], "double");
    assert_eq!(hello(&base)["release-pages"], "off");
    assert_eq!(hello(&def)["widen-f32"], "single");
    let (pb, pd) = (peak_max(&base), peak_max(&def));
    eprintln!("peak host: baseline {pb} default {pd}");
    // Baseline keeps the stored bytes beside the f32 copies and the file pages
    // mapped: its peak must be higher (widen_rss.rs pins the size of the step).
    assert!(pb > pd, "baseline peak {pb} not above default {pd}");
    // `engine plan` projects the measured peak to within a factor of two.
    for (r, profile) in [(&base, "baseline"), (&def, "default")] {
        let out = Command::new(bin())
            .args([
                "plan",
                "--rung",
                rung0().to_str().unwrap(),
                "--json",
                "--profile",
                profile,
            ])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let projected = v["host_peak_bytes"].as_u64().unwrap() as f64;
        let measured = peak_max(r) as f64;
        eprintln!("{profile}: projected {projected} measured {measured}");
        assert!(
            projected / measured > 0.5 && projected / measured < 2.0,
            "{profile}: projected {projected} vs measured {measured}"
        );
    }
}

fn fails_with(args: &[&str], code: i32, needles: &[&str]) {
    let out = Command::new(bin()).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
    }
}

#[test]
fn bad_input_exits_2_with_a_message_naming_the_problem() {
    let w = tiny_weights().to_str().unwrap().to_string();
    let rung = rung0();
    let rung = rung.to_str().unwrap();
    let d = scratch("bad");
    let out = d.join("o");
    let out = out.to_str().unwrap();
    fails_with(
        &[
            "render",
            "--rung",
            rung,
            "--weights",
            &w,
            "--out",
            out,
            "--lever",
            "widen-f32=triple",
        ],
        2,
        &["'triple'", "double|single"],
    );
    fails_with(
        &[
            "render",
            "--rung",
            rung,
            "--weights",
            &w,
            "--out",
            out,
            "--lever",
            "warp=on",
        ],
        2,
        &["unknown lever 'warp'", "widen-f32"],
    );
    // Arms that cannot run together are refused before any load, CUDA or not,
    // naming the levers to add (red on the check moved after the T5 load: with
    // no CUDA here that would say "no CUDA" instead).
    let fp8_attention = |extra: &[&str], needles: &[&str]| {
        let mut args = vec![
            "render",
            "--rung",
            rung,
            "--weights",
            &w,
            "--out",
            out,
            "--device",
            "cuda",
            "--lever",
            "attention-precision=fp8",
        ];
        args.extend_from_slice(extra);
        fails_with(&args, 2, needles);
        assert!(!std::path::Path::new(out).join("video.y4m").exists());
    };
    fp8_attention(
        &[],
        &["attention-precision = fp8 needs", "--lever precision=fp8"],
    );
    fp8_attention(
        &["--profile", "baseline", "--lever", "precision=fp8"],
        &["attention = cudnn", "--lever attention=cudnn"],
    );
    fails_with(
        &[
            "render",
            "--rung",
            "no/such.toml",
            "--weights",
            &w,
            "--out",
            out,
        ],
        2,
        &["no/such.toml"],
    );
    fails_with(
        &[
            "render",
            "--rung",
            rung,
            "--weights",
            "no/such/dir",
            "--out",
            out,
        ],
        2,
        &["no/such/dir"],
    );
    // Without CUDA the device arm is a clean "no CUDA here" (exit 2), not a
    // panic; where CUDA exists this render succeeds (tests/cuda_render.rs).
    if engine::cuda::kit::context::probe_libraries().is_err() {
        fails_with(
            &[
                "render",
                "--rung",
                rung,
                "--weights",
                &w,
                "--out",
                out,
                "--device",
                "cuda",
            ],
            2,
            &["no CUDA here"],
        );
    }
    fails_with(
        &["synth-weights", "--preset", "huge", "--out", out],
        2,
        &["unknown preset 'huge'"],
    );
    fails_with(&["render", "--rung"], 2, &[]);
    // A truncated weights file: the error names the tensor and the file.
    let broken = d.join("weights");
    let status = Command::new("cp")
        .arg("-r")
        .arg(&w)
        .arg(&broken)
        .status()
        .unwrap();
    assert!(status.success());
    let f = broken.join("transformer/diffusion_pytorch_model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    fails_with(
        &[
            "render",
            "--rung",
            rung,
            "--weights",
            broken.to_str().unwrap(),
            "--out",
            out,
        ],
        2,
        &[
            "diffusion_pytorch_model.safetensors",
            "tensor '",
            "truncated",
        ],
    );
}

#[test]
fn levers_and_plan_print_their_json() {
    let out = Command::new(bin())
        .args(["levers", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["levers"]["widen-f32"]["baseline"], "double");
    assert_eq!(v["levers"]["host-threads"]["default"], "n");
    let rung = rung0();
    let plan = |extra: &[&str]| -> serde_json::Value {
        let out = Command::new(bin())
            .args(["plan", "--rung", rung.to_str().unwrap(), "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let a = plan(&[]);
    let b = plan(&["--lever", "widen-f32=double"]);
    assert!(a["host_peak_bytes"].as_u64().unwrap() > 0);
    assert_eq!(a["device_peak_bytes"], 0);
    assert_eq!(a["levers"]["widen-f32"], "single");
    assert_eq!(b["levers"]["widen-f32"], "double");
    assert!(b["host_peak_bytes"].as_u64() > a["host_peak_bytes"].as_u64());
    assert_eq!(a["weights_bytes"], b["weights_bytes"]);
}

/// Write a safetensors file of f32 tensors (name, shape, values).
fn write_f32_safetensors(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (n, s, v) in tensors {
        header.insert(
            n.to_string(),
            serde_json::json!({"dtype": "F32", "shape": s, "data_offsets": [off, off + 4 * v.len()]}),
        );
        off += 4 * v.len();
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(h);
    for (_, _, v) in tensors {
        bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn prompt_embeddings_replace_the_text_encoder() {
    let d = scratch("embeds-input");
    let (l, c) = (12usize, 64usize); // tiny caption channels
    let g = engine::rng::Gaussian::new(7, "test-embeds");
    let states = g.vec(l * c);
    let neg = engine::rng::Gaussian::new(8, "test-embeds").vec(l * c);
    let mask: Vec<f32> = (0..l).map(|i| if i < 7 { 1.0 } else { 0.0 }).collect();
    let with_neg = d.join("embeds.safetensors");
    write_f32_safetensors(
        &with_neg,
        &[
            ("embeds", vec![l, c], states.clone()),
            ("mask", vec![l], mask.clone()),
            ("negative_embeds", vec![l, c], neg),
            ("negative_mask", vec![l], mask.clone()),
        ],
    );
    let e = render(
        "embeds",
        &rung0(),
        &["--prompt-embeds", with_neg.to_str().unwrap()],
    );
    ok(&e);
    let t5 = render("embeds-t5", &rung0(), &[]);
    ok(&t5);
    assert_ne!(hashes(&e.dir), hashes(&t5.dir));
    let v = read_y4m(&e.dir.join("video.y4m")).unwrap();
    assert_eq!(v.frames.len(), 9);
    let open_attrs = e
        .markers
        .iter()
        .find_map(|m| match m {
            Marker::Close { name, attrs, .. } if name == "load.text_encoder" => Some(attrs.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(open_attrs["source"], "prompt-embeds");
    // Guidance 3 needs the negative pair; without it the input is refused.
    let only_pos = d.join("positive.safetensors");
    write_f32_safetensors(
        &only_pos,
        &[("embeds", vec![l, c], states), ("mask", vec![l], mask)],
    );
    let r = render(
        "embeds-noneg",
        &rung0(),
        &["--prompt-embeds", only_pos.to_str().unwrap()],
    );
    assert_eq!(r.out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.out.stderr).contains("negative_embeds"));
}
