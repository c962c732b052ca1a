//! A render-shaped bundle for the surfaces tests (plot, export, pack, --json,
//! cross-reads), journaled through [`super::journal`] and sealed into a store:
//! nested phases with step attributes, `dit.forward` ticks, a sampler with random
//! values, one column unavailable with a recorded reason. The planted values are
//! returned so tests can assert on them.

use std::path::PathBuf;

use evidence::journal::Stream;
use evidence::marker::{Attrs, Marker};
use evidence::sample::Sample;
use evidence::store::Store;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::journal::SynthJournal;

/// The first timestamp of the synthetic run, CLOCK_MONOTONIC ns.
pub const T0: u64 = 5_000_000_000_000;
/// The reason recorded for the unavailable power column.
pub const POWER_REASON: &str = "no NVML on this host (test)";

/// One planted phase: name, depth, open and close (ns), open attrs.
#[derive(Debug, Clone)]
pub struct PlantedPhase {
    /// Marker name.
    pub name: String,
    /// Nesting depth.
    pub depth: i64,
    /// Open, ns.
    pub open_ns: u64,
    /// Close, ns (None: left open).
    pub close_ns: Option<u64>,
    /// `step` attribute of the open marker (1-based, as the engine writes it), if any.
    pub step: Option<u64>,
}

/// What was planted in a bundle.
#[derive(Debug, Clone)]
pub struct Planted {
    /// Bundle id.
    pub id: String,
    /// Bundle directory.
    pub dir: PathBuf,
    /// Phases in open order.
    pub phases: Vec<PlantedPhase>,
    /// Tick times, ns.
    pub ticks: Vec<u64>,
    /// Sample times, ns.
    pub sample_t: Vec<u64>,
    /// rss_bytes per sample.
    pub rss: Vec<f64>,
    /// gpu_util_pct per sample (None on some ticks).
    pub util: Vec<Option<f64>>,
    /// End of the run, ns.
    pub end_ns: u64,
}

/// Journal and seal one render-shaped run with `steps` denoise steps, from `seed`.
/// With `leave_open`, the last phase never closes (an interrupted run).
pub fn seal_render(store: &Store, seed: u64, steps: u64, leave_open: bool) -> Planted {
    let Layout {
        phases,
        ticks,
        den_idx,
        end_ns,
    } = lay_out(seed, steps, leave_open);
    let j = SynthJournal::in_store(store);
    write_fragments(&j, seed, steps, end_ns);
    write_markers(&j, &phases, &ticks, steps);
    let den = &phases[den_idx];
    let den = (den.open_ns, den.close_ns.unwrap());
    let (sample_t, rss, util) = write_samples(&j, seed, den, end_ns);
    let frag = |key: &str, value: serde_json::Value| j.fragment(key, value);
    frag(
        "exit",
        json!({"reason": if leave_open { "interrupted" } else { "completed" },
               "code": if leave_open { json!(null) } else { json!(0) }, "signal": null, "detail": ""}),
    );
    frag(
        "completion",
        json!({"verdict": if leave_open { "fail" } else { "pass" }, "reasons": [], "frames": 9}),
    );
    let sealed = j.seal(store);
    Planted {
        id: sealed.id,
        dir: sealed.path,
        phases,
        ticks,
        sample_t,
        rss,
        util,
        end_ns,
    }
}

/// The run laid out in time.
struct Layout {
    /// Phases in open order.
    phases: Vec<PlantedPhase>,
    /// `dit.forward` tick times, ns.
    ticks: Vec<u64>,
    /// Index of `denoise` in `phases`.
    den_idx: usize,
    /// End of the run, ns.
    end_ns: u64,
}

/// Lay the phases out in time from `seed`: loads and conditioning, `denoise` with
/// `steps` steps (two ticks each), `decode.video` with two chunks, the frames.
fn lay_out(seed: u64, steps: u64, leave_open: bool) -> Layout {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ms = 1_000_000u64;
    let mut jitter =
        |base_ms: u64| base_ms * ms + rng.random_range(0..40) * ms + rng.random_range(0..ms);
    let mut phases: Vec<PlantedPhase> = Vec::new();
    let mut t = T0 + 30 * ms;
    let push = |phases: &mut Vec<PlantedPhase>,
                name: &str,
                depth: i64,
                open: u64,
                close: u64,
                step: Option<u64>| {
        phases.push(PlantedPhase {
            name: name.into(),
            depth,
            open_ns: open,
            close_ns: Some(close),
            step,
        });
    };
    for name in ["load.text_encoder", "load.dit", "load.vae", "conditioning"] {
        let d = jitter(150);
        push(&mut phases, name, 0, t, t + d, None);
        t += d;
    }
    let den_open = t;
    let den_idx = phases.len();
    push(&mut phases, "denoise", 0, t, t, None);
    let mut ticks = Vec::new();
    for k in 0..steps {
        let d = jitter(200);
        push(&mut phases, "denoise.step", 1, t, t + d, Some(k + 1));
        ticks.push(t + d / 3);
        ticks.push(t + 2 * d / 3);
        t += d;
    }
    phases[den_idx].close_ns = Some(t);
    let _ = den_open;
    let dec_open = t;
    let dec_idx = phases.len();
    push(&mut phases, "decode.video", 0, t, t, None);
    for _ in 0..2 {
        let d = jitter(100);
        push(&mut phases, "decode.video.chunk", 1, t, t + d, None);
        t += d;
    }
    phases[dec_idx].close_ns = Some(t);
    let _ = dec_open;
    let d = jitter(80);
    push(&mut phases, "artifacts.frames", 0, t, t + d, None);
    t += d;
    if leave_open {
        phases.last_mut().unwrap().close_ns = None;
    }
    let end_ns = t + 40 * ms;
    Layout {
        phases,
        ticks,
        den_idx,
        end_ns,
    }
}

/// The fragments written before the engine's output, as `harness run` records
/// them (rank and diff read the weights digest and host).
fn write_fragments(j: &SynthJournal, seed: u64, steps: u64, end_ns: u64) {
    let frag = |key: &str, value: serde_json::Value| j.fragment(key, value);
    frag(
        "run",
        json!({"start_ns": T0, "end_ns": end_ns, "argv": ["harness", "run"], "boot_id": "b",
               "hostname": "testhost", "harness_version": "0", "cwd": "/"}),
    );
    frag(
        "rung",
        json!({"name": "0", "path": "rungs/0.toml", "sha256": "r",
               "config": {"preset": "tiny", "width": 64, "height": 64, "frames": 9, "steps": steps,
                          "guidance": 3.0, "seed": 42, "device": "cpu"}}),
    );
    frag("profile", json!("default"));
    frag("levers", json!({"staging": "batched"}));
    frag(
        "engine",
        json!({"store_path": "/s/bin/e", "sha256": format!("{:064x}", seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
               "version": "0.1.0", "args": [], "exec": true}),
    );
    // As `harness run` records them (rank and diff read the weights digest and host).
    frag(
        "weights",
        json!({"digest": format!("sha256:{:064x}", seed), "digest_source": "computed",
               "dir": "/w", "files": [], "synthesized": true}),
    );
    frag(
        "host",
        json!({"cpu_model": "Test CPU", "cores": 8, "mem_total_bytes": 1u64 << 34}),
    );
    frag("sensors_unavailable", json!({"gpu_power_mw": POWER_REASON}));
    frag(
        "sampler",
        json!({"cadence_ms": 50, "slow_every": 10, "pagecache_every": 10, "observer": "on"}),
    );
}

/// The markers in time order (closes before opens at equal times, inner closes
/// first), each with its stderr line.
fn write_markers(j: &SynthJournal, phases: &[PlantedPhase], ticks: &[u64], steps: u64) {
    let mut events: Vec<(u64, u8, i64, Marker)> = Vec::new();
    for (i, p) in phases.iter().enumerate() {
        let mut oa = Attrs::new();
        if let Some(k) = p.step {
            oa.insert("step".into(), json!(k));
            oa.insert("steps".into(), json!(steps));
        }
        if p.name == "denoise" {
            // As engine/src/pipeline.rs opens it (guidance on: two forwards per step).
            oa.insert("steps".into(), json!(steps));
            oa.insert("forwards_per_step".into(), json!(2));
        }
        events.push((
            p.open_ns,
            1,
            i as i64,
            Marker::Open {
                t_ns: p.open_ns,
                name: p.name.clone(),
                attrs: oa,
            },
        ));
        if let Some(c) = p.close_ns {
            let mut ca = Attrs::new();
            ca.insert("peak_host_bytes".into(), json!(1u64 << 30));
            events.push((
                c,
                0,
                -(i as i64),
                Marker::Close {
                    t_ns: c,
                    name: p.name.clone(),
                    attrs: ca,
                },
            ));
        }
    }
    for (n, &tk) in ticks.iter().enumerate() {
        let mut a = Attrs::new();
        // As the engine ticks: 1-based step, forward counted over the whole loop,
        // `last_s` from the second forward on.
        a.insert("step".into(), json!(n as u64 / 2 + 1));
        a.insert("steps".into(), json!(steps));
        a.insert("forward".into(), json!(n as u64 + 1));
        if n > 0 {
            a.insert("last_s".into(), json!((tk - ticks[n - 1]) as f64 / 1e9));
        }
        events.push((
            tk,
            2,
            n as i64,
            Marker::Tick {
                t_ns: tk,
                name: "dit.forward".into(),
                attrs: a,
            },
        ));
    }
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    for (_, _, _, m) in &events {
        j.marker(m.t_ns() + 1000, m);
        j.output(
            m.t_ns() + 2000,
            Stream::Stderr,
            format!("engine: {}", m.name().unwrap_or("-")),
        );
    }
}

/// Samples every 50 ms from T0 to `end_ns`: random values, util null on some ticks,
/// busy inside `den` (denoise's open and close, ns). Returns the planted times,
/// rss and util.
fn write_samples(
    j: &SynthJournal,
    seed: u64,
    den: (u64, u64),
    end_ns: u64,
) -> (Vec<u64>, Vec<f64>, Vec<Option<f64>>) {
    let ms = 1_000_000u64;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xabcd);
    let (mut sample_t, mut rss, mut util) = (Vec::new(), Vec::new(), Vec::new());
    let mut r: f64 = 1.5e9;
    let mut ts = T0;
    // GPM windows of four ticks, contiguous, each on the row after it closes:
    // tensor-pipe activity 70% inside denoise, 0 outside.
    let mut window_start = T0;
    let mut tick = 0u64;
    while ts < end_ns {
        let mut s = Sample::empty(ts);
        tick += 1;
        if tick % 4 == 0 {
            let end = ts - 1;
            let busy = window_start >= den.0 && end < den.1;
            s.set("gpm_window_start_ns", Some(window_start as f64));
            s.set("gpm_window_end_ns", Some(end as f64));
            s.set("gpm_tensor_active_pct", Some(if busy { 70.0 } else { 0.0 }));
            s.set("gpm_sm_active_pct", Some(if busy { 95.0 } else { 1.0 }));
            window_start = end;
        }
        r += rng.random_range(-2e7..6e7);
        let in_den = ts >= den.0 && ts < den.1;
        let u = if rng.random_range(0..10) == 0 {
            None
        } else if in_den {
            Some(rng.random_range(60.0..100.0f64))
        } else {
            Some(rng.random_range(0.0..5.0f64))
        };
        s.set("rss_bytes", Some(r.round()));
        s.set("gpu_util_pct", u);
        s.set("cpu_cores", Some(rng.random_range(0.5..2.0f64)));
        s.set(
            "weights_cached_bytes",
            Some((3u64 << 30) as f64 + rng.random_range(0.0..1e8f64).round()),
        );
        s.set(
            "engine_gpu_mem_bytes",
            Some(if in_den {
                (5u64 << 30) as f64
            } else {
                (1u64 << 30) as f64
            }),
        );
        s.set("load1", Some(rng.random_range(0.0..1.0f64)));
        j.sample(s);
        sample_t.push(ts);
        rss.push(r.round());
        util.push(u);
        ts += 50 * ms;
    }
    (sample_t, rss, util)
}
