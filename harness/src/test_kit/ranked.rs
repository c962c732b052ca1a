//! Synthetic renders with planted lever effects, journaled through
//! [`super::journal`] and sealed into a store: rank's end-to-end tests and the rank
//! benchmark (which includes this file and `journal.rs` by path).

#![allow(dead_code)]

use evidence::marker::{Attrs, Marker};
use evidence::sample::Sample;
use evidence::store::Store;
use rand::RngCore;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::path::PathBuf;

use super::journal::SynthJournal;

/// Uniform noise in [-1, 1) from a seeded stream.
pub struct Noise(ChaCha8Rng);

impl Noise {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Noise(ChaCha8Rng::seed_from_u64(seed))
    }
    /// The next value in [-1, 1).
    #[allow(clippy::should_implement_trait)] // an endless noise source, not an iterator
    pub fn next(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// One synthetic render.
#[derive(Debug, Clone)]
pub struct Render {
    /// Rung name and geometry.
    pub rung: String,
    /// Width, height, frames.
    pub dims: (u64, u64, u64),
    /// Campaign id, round, position, lever and arm (None: not a campaign run).
    pub schedule: Option<(String, u32, u32, String, String)>,
    /// Phases in open order: (name, start offset s, duration s); nesting follows time.
    pub phases: Vec<(String, f64, f64)>,
    /// Peak weights page cache during denoise, bytes.
    pub weights_cached_bytes: f64,
    /// Whether the contention check flagged the run.
    pub contended: bool,
    /// The exit reason (`completed`, `killed`, ...).
    pub exit: String,
    /// Engine binary sha256.
    pub engine: String,
    /// Frame images the engine wrote (`first.png`, ...): name, width, height and
    /// 8-bit RGB samples; none by default.
    pub images: Vec<(String, u32, u32, Vec<u8>)>,
    /// The `device_open_s` attribute of `load.dit`'s close (a CUDA load's device
    /// open, seconds); none by default.
    pub device_open_s: Option<f64>,
    /// The `run.hostname` recorded (`testhost` by default): the first part of the
    /// host key rank pairs within.
    pub hostname: String,
}

/// A complete, uncontended render of `rung` with the given phase durations laid out
/// back to back: `load.dit`, `conditioning`, `denoise` (two `denoise.step`s inside),
/// `decode.video`, `artifacts.frames`.
pub fn render(
    rung: &str,
    dims: (u64, u64, u64),
    load: f64,
    cond: f64,
    denoise: f64,
    decode: f64,
    frames: f64,
) -> Render {
    // Durations on a 1/64 s grid: the seal's read-back check re-parses the manifest's
    // floats, and serde_json without `float_roundtrip` does not re-parse every
    // 17-digit float exactly (an evidence-crate issue, reported); binary fractions do.
    let q = |x: f64| (x * 64.0).round() / 64.0;
    let (load, cond, denoise, decode, frames) =
        (q(load), q(cond), q(denoise), q(decode), q(frames));
    let mut t = 0.5;
    let mut phases: Vec<(String, f64, f64)> = Vec::new();
    fn push(phases: &mut Vec<(String, f64, f64)>, name: &str, d: f64, t: &mut f64) {
        phases.push((name.to_string(), *t, d));
        *t += d;
    }
    push(&mut phases, "load.dit", load, &mut t);
    push(&mut phases, "conditioning", cond, &mut t);
    phases.push(("denoise".to_string(), t, denoise));
    phases.push(("denoise.step".to_string(), t, denoise / 2.0));
    phases.push(("denoise.step".to_string(), t + denoise / 2.0, denoise / 2.0));
    t += denoise;
    push(&mut phases, "decode.video", decode, &mut t);
    push(&mut phases, "artifacts.frames", frames, &mut t);
    Render {
        rung: rung.to_string(),
        dims,
        schedule: None,
        phases,
        weights_cached_bytes: 8.0 * (1u64 << 30) as f64,
        contended: false,
        exit: "completed".into(),
        engine: "e".repeat(64),
        images: Vec::new(),
        device_open_s: None,
        hostname: "testhost".into(),
    }
}

const T0: u64 = 1_000_000_000_000;

fn ns(s: f64) -> u64 {
    T0 + (s * 1e9).round() as u64
}

/// Journal `r` into a staging directory of `store` and seal it; returns the bundle id.
pub fn seal(store: &Store, r: &Render) -> String {
    let j = SynthJournal::in_store(store);
    for (name, w, h, rgb) in &r.images {
        let f = std::fs::File::create(j.frames_dir().join(name)).expect("create png");
        let mut enc = png::Encoder::new(std::io::BufWriter::new(f), *w, *h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.write_header()
            .and_then(|mut wr| wr.write_image_data(rgb))
            .expect("write png");
    }
    let end = r.phases.iter().map(|(_, o, d)| o + d).fold(0.0, f64::max) + 0.5;
    let frag = |key: &str, value: serde_json::Value| j.fragment(key, value);
    let (w, h, f) = r.dims;
    frag(
        "run",
        json!({"start_ns": T0, "end_ns": ns(end), "argv": ["harness", "run"], "boot_id": "b", "hostname": r.hostname, "harness_version": "0", "cwd": "/"}),
    );
    frag(
        "rung",
        json!({"name": r.rung, "path": format!("rungs/{}.toml", r.rung), "sha256": "r", "config": {"preset": "tiny", "width": w, "height": h, "frames": f, "steps": 2, "guidance": 3.0, "seed": 1, "device": "cpu"}}),
    );
    frag("profile", json!("default"));
    frag(
        "engine",
        json!({"store_path": "/s/bin/e", "sha256": r.engine, "version": "0.1.0", "args": [], "exec": true}),
    );
    frag(
        "weights",
        json!({"digest": "sha256:weights", "dir": "/w", "files": [], "synthesized": true}),
    );
    frag(
        "host",
        json!({"cpu_model": "Test CPU", "cores": 2, "mem_total_bytes": 1u64 << 34, "kernel": "6", "os": "linux"}),
    );
    frag("gpu", serde_json::Value::Null);
    frag(
        "sampler",
        json!({"cadence_ms": 100, "slow_every": 10, "pagecache_every": 10, "observer": "on"}),
    );
    frag(
        "contention",
        json!({"load1_at_start": if r.contended { 9.5 } else { 0.1 }, "other_gpu_procs": 0, "flagged": r.contended, "detail": if r.contended { "load1 9.5 at start on 2 cores" } else { "quiet" }}),
    );
    frag(
        "gates",
        json!([{"name": "store-durable", "verdict": "pass", "detail": "ext4"}]),
    );
    if let Some((campaign, round, position, lever, arm)) = &r.schedule {
        frag("levers", json!({lever.as_str(): arm}));
        frag(
            "schedule",
            json!({"campaign": campaign, "round": round, "position": position, "arm": arm, "lever": lever, "seed": 7}),
        );
    } else {
        frag("levers", json!({}));
    }
    // Markers in time order: at equal times closes come before opens, inner closes
    // (later-opened) before outer ones, outer opens before inner ones.
    let mut events: Vec<(f64, u8, i64, Marker)> = Vec::new();
    for (i, (name, o, d)) in r.phases.iter().enumerate() {
        let i = i as i64;
        events.push((
            *o,
            1,
            i,
            Marker::Open {
                t_ns: ns(*o),
                name: name.clone(),
                attrs: Attrs::new(),
            },
        ));
        let mut attrs = Attrs::new();
        attrs.insert("peak_host_bytes".into(), json!(1u64 << 30));
        if let (Some(s), "load.dit") = (r.device_open_s, name.as_str()) {
            attrs.insert("device_open_s".into(), json!(s));
        }
        events.push((
            o + d,
            0,
            -i,
            Marker::Close {
                t_ns: ns(o + d),
                name: name.clone(),
                attrs,
            },
        ));
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    for (_, _, _, m) in &events {
        j.marker(m.t_ns(), m);
    }
    // Samples every 0.25 s: weights cache high in load, planted value during denoise.
    let den = r
        .phases
        .iter()
        .find(|p| p.0 == "denoise")
        .map(|p| (p.1, p.1 + p.2));
    let mut t = 0.25;
    while t < end {
        let mut s = Sample::empty(ns(t));
        let in_den = den.is_some_and(|(a, b)| t > a && t < b);
        s.set("rss_bytes", Some(2.0 * (1u64 << 30) as f64 + t * 1e6));
        s.set(
            "weights_cached_bytes",
            Some(if in_den {
                r.weights_cached_bytes
            } else {
                9.0 * (1u64 << 30) as f64
            }),
        );
        s.set("unified_bytes", Some(12.0 * (1u64 << 30) as f64));
        s.set("gpu_util_pct", Some(if in_den { 90.0 } else { 0.0 }));
        s.set("load1", Some(0.1));
        j.sample(s);
        t += 0.25;
    }
    frag(
        "exit",
        json!({"reason": r.exit, "code": if r.exit == "completed" { json!(0) } else { json!(null) }, "signal": null, "detail": ""}),
    );
    frag(
        "completion",
        json!({"verdict": if r.exit == "completed" { "pass" } else { "fail" }, "reasons": [], "frames": 9}),
    );
    j.seal(store).id
}

/// The path of bundle `id` in `store`.
pub fn bundle_dir(store: &Store, id: &str) -> PathBuf {
    store.bundles_dir().join(id)
}
