//! A seeded generator of realistic runs (fragments, samples, markers, output,
//! frames in time order) for the evidence crate's tests and its seal benchmark,
//! and per-test directories under the build directory.

use std::path::{Path, PathBuf};

use crate::fragments::{Exit, Fragment, Levers, Run, Rung, Sampler, SensorsUnavailable};
use crate::journal::{FrameRow, Record, SharedJournal, Stream};
use crate::marker::{Attrs, Marker};
use crate::sample::{ColumnType, Sample, SAMPLE_COLUMNS};
use serde_json::json;

/// splitmix64: small, seeded, good enough for test data.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `0..n` (`0..1` for `n` 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A fresh, empty directory for one test, under the build directory (never
/// /tmp): [`super::scratch`] under `evidence-tests/`.
pub fn test_dir(name: &str) -> PathBuf {
    super::scratch(&format!("evidence-tests/{name}"))
}

/// The shape of a synthetic run.
#[derive(Clone, Copy, Debug)]
pub struct RunShape {
    /// The seed of every random choice.
    pub seed: u64,
    /// Engine wall in nanoseconds.
    pub wall_ns: u64,
    /// Denoise steps (each: open, two ticks, close).
    pub steps: u64,
    /// Sampler cadence in nanoseconds.
    pub cadence_ns: u64,
    /// Frames written.
    pub frames: u32,
    /// Whether the run ends (exit fragment `completed`, run end).
    pub completes: bool,
    /// The boot the run claims to have run in.
    pub boot_id: &'static str,
}

impl RunShape {
    /// A run small enough to truncate at every byte.
    pub fn small(seed: u64) -> Self {
        RunShape {
            seed,
            wall_ns: 1_200_000_000,
            steps: 2,
            cadence_ns: 100_000_000,
            frames: 3,
            completes: true,
            boot_id: "00000000-0000-4000-8000-000000000000",
        }
    }
}

fn marker_line(m: &Marker) -> String {
    m.to_line()
}

/// Records with the time they are appended at, in the order they were generated.
#[derive(Default)]
struct Timed {
    /// (time ns, generation order, record).
    records: Vec<(u64, u64, Record)>,
}

impl Timed {
    fn push(&mut self, t: u64, rec: Record) {
        let order = self.records.len() as u64 + 1;
        self.records.push((t, order, rec));
    }
}

/// Generate the records of a run, in the order a harness would append them.
pub fn synth_records(shape: RunShape) -> Vec<Record> {
    let mut rng = Rng(shape.seed);
    let t0 = 5_000_000_000_000 + rng.below(1_000_000_000);
    let mut ev = Timed::default();
    let markers = engine_markers(&shape, t0, &mut rng);
    marker_records(&markers, &shape, t0, &mut rng, &mut ev);
    let start = t0 - shape.cadence_ns / 2;
    sample_records(&shape, t0, start, &mut rng, &mut ev);
    frame_records(&shape, t0, &mut rng, &mut ev);
    around_fragments(&shape, t0, start, ev)
}

/// The time at fraction `f` of a run of `w` ns from `t0`.
fn at_fraction(t0: u64, w: u64, f: f64) -> u64 {
    t0 + (w as f64 * f) as u64
}

/// The engine's markers: hello, its phases as fractions of the wall (steps with
/// ticks, decode chunks), and the closing info.
fn engine_markers(shape: &RunShape, t0: u64, rng: &mut Rng) -> Vec<Marker> {
    let w = shape.wall_ns;
    let mut markers: Vec<Marker> = vec![Marker::Hello {
        t_ns: t0,
        protocol: 1,
        engine: "engine".into(),
        version: "0.1.0".into(),
        attrs: Attrs::new(),
    }];
    let at = |f: f64| at_fraction(t0, w, f);
    let phase = |markers: &mut Vec<Marker>, name: &str, a: f64, b: f64, close: Attrs| {
        markers.push(Marker::Open {
            t_ns: at(a),
            name: name.into(),
            attrs: Attrs::new(),
        });
        markers.push(Marker::Close {
            t_ns: at(b),
            name: name.into(),
            attrs: close,
        });
    };
    let peak = |rng: &mut Rng| -> Attrs {
        let mut a = Attrs::new();
        a.insert(
            "peak_host_bytes".into(),
            json!(1_000_000_000 + rng.below(1 << 30)),
        );
        a
    };
    phase(&mut markers, "load.text_encoder", 0.001, 0.04, peak(rng));
    phase(&mut markers, "load.dit", 0.04, 0.12, peak(rng));
    phase(&mut markers, "load.vae", 0.12, 0.13, peak(rng));
    phase(&mut markers, "conditioning", 0.13, 0.18, peak(rng));
    // denoise 0.18 - 0.88 with steps.
    markers.push(Marker::Open {
        t_ns: at(0.18),
        name: "denoise".into(),
        attrs: Attrs::new(),
    });
    let span = 0.70 / shape.steps as f64;
    for k in 0..shape.steps {
        let a = 0.18 + span * k as f64;
        let mut oa = Attrs::new();
        oa.insert("step".into(), json!(k + 1));
        oa.insert("steps".into(), json!(shape.steps));
        markers.push(Marker::Open {
            t_ns: at(a),
            name: "denoise.step".into(),
            attrs: oa,
        });
        for f in 0..2u64 {
            let mut ta = Attrs::new();
            ta.insert("step".into(), json!(k + 1));
            ta.insert("steps".into(), json!(shape.steps));
            ta.insert("forward".into(), json!(2 * k + f + 1));
            ta.insert("last_s".into(), json!(span * w as f64 / 2e9));
            markers.push(Marker::Tick {
                t_ns: at(a + span * (0.45 + 0.5 * f as f64)),
                name: "dit.forward".into(),
                attrs: ta,
            });
        }
        let mut ca = peak(rng);
        ca.insert(
            "device_ms".into(),
            json!((rng.f64() * 1000.0 * 64.0).round() / 64.0),
        );
        markers.push(Marker::Close {
            t_ns: at(a + span * 0.995),
            name: "denoise.step".into(),
            attrs: ca,
        });
    }
    let mut dc = peak(rng);
    dc.insert("peak_device_bytes".into(), json!(rng.below(1 << 34)));
    markers.push(Marker::Close {
        t_ns: at(0.88),
        name: "denoise".into(),
        attrs: dc,
    });
    markers.push(Marker::Open {
        t_ns: at(0.88),
        name: "decode.video".into(),
        attrs: Attrs::new(),
    });
    for c in 0..4u64 {
        let a = 0.88 + 0.025 * c as f64;
        let mut oa = Attrs::new();
        oa.insert("chunk".into(), json!(c));
        markers.push(Marker::Open {
            t_ns: at(a),
            name: "decode.video.chunk".into(),
            attrs: oa,
        });
        markers.push(Marker::Close {
            t_ns: at(a + 0.0249),
            name: "decode.video.chunk".into(),
            attrs: Attrs::new(),
        });
    }
    markers.push(Marker::Close {
        t_ns: at(0.98),
        name: "decode.video".into(),
        attrs: peak(rng),
    });
    phase(&mut markers, "artifacts.frames", 0.98, 0.999, Attrs::new());
    let mut info = Attrs::new();
    info.insert("frames_written".into(), json!(shape.frames));
    info.insert("video".into(), json!("video.y4m"));
    markers.push(Marker::Info {
        t_ns: at(0.9995),
        attrs: info,
    });

    markers
}

/// Each marker as the pipe delivers it (in the engine's order: arrival times never
/// go backwards), with its human line on stderr, and one unparseable line.
fn marker_records(markers: &[Marker], shape: &RunShape, t0: u64, rng: &mut Rng, ev: &mut Timed) {
    let at = |f: f64| at_fraction(t0, shape.wall_ns, f);
    let mut last_recv = 0u64;
    for m in markers {
        let recv = (m.t_ns() + 1_000 + rng.below(40_000)).max(last_recv + 1);
        last_recv = recv;
        ev.push(
            recv,
            Record::Marker {
                recv_ns: recv,
                line: marker_line(m),
            },
        );
        let human = match m {
            Marker::Open { name, .. } => Some(format!("+{name}")),
            Marker::Close { name, .. } => Some(format!("-{name}")),
            Marker::Tick { name, .. } => Some(format!("~{name}")),
            _ => None,
        };
        if let Some(h) = human {
            ev.push(
                recv + 10,
                Record::Output {
                    t_ns: recv + 10,
                    stream: Stream::Stderr,
                    line: h,
                },
            );
        }
    }
    // One unparseable line: the protocol keeps it verbatim.
    ev.push(
        at(0.5) + 7,
        Record::Marker {
            recv_ns: at(0.5) + 7,
            line: "garbage from a confused engine".into(),
        },
    );
}

/// Samples: smooth signals with noise; some sensors unavailable, one tick missed.
fn sample_records(shape: &RunShape, t0: u64, start: u64, rng: &mut Rng, ev: &mut Timed) {
    let w = shape.wall_ns;
    let n = (w + shape.cadence_ns) / shape.cadence_ns;
    let mut rss = 200_000_000f64;
    let mut energy = 1_000_000_000f64;
    for i in 0..n {
        if i % 997 == 500 {
            continue; // a missed tick
        }
        let t = start + i * shape.cadence_ns + rng.below(2_000_000);
        let frac = (t.saturating_sub(t0)) as f64 / w as f64;
        let busy = (0.18..0.98).contains(&frac);
        let mut s = Sample::empty(t);
        rss = (rss + (rng.f64() - 0.45) * 4_000_000.0).max(1e8);
        energy += 250_000.0 * (1.0 + rng.f64());
        for (ci, c) in SAMPLE_COLUMNS.iter().enumerate() {
            let v: Option<f64> = match c.name {
                "gpu_mem_used_bytes" => None,
                "gpu_util_pct" => Some(if busy {
                    80.0 + rng.below(21) as f64
                } else {
                    0.0
                }),
                "gpu_mem_util_pct" => Some(if busy {
                    30.0 + rng.below(40) as f64
                } else {
                    0.0
                }),
                "rss_bytes" => Some((rss / 4096.0).round() * 4096.0),
                "cpu_cores" | "harness_cpu_cores" => Some((rng.f64() * 400.0).round() / 100.0),
                "gpu_energy_mj" => (i % 10 == 0).then_some(energy.round()),
                "gpu_pcie_tx_kibps" | "gpu_pcie_rx_kibps" => {
                    (i % 10 == 0).then(|| rng.below(1 << 20) as f64)
                }
                "tick_lag_ns" => Some(rng.below(2_000_000) as f64),
                // A GPM window of one tick interval lands on every other row
                // (null on the others), its figures high while the engine is busy.
                "gpm_window_start_ns" => (i % 2 == 1).then(|| (t - shape.cadence_ns) as f64),
                "gpm_window_end_ns" => (i % 2 == 1).then(|| (t - 1) as f64),
                "gpm_tensor_active_pct" | "gpm_sm_active_pct" if i % 2 == 1 => Some(if busy {
                    50.0 + rng.below(20) as f64
                } else {
                    0.0
                }),
                c if c.starts_with("gpm_") => (i % 2 == 1).then(|| rng.below(100) as f64),
                "gpu_temp_c" => Some(40.0 + rng.below(30) as f64),
                "load1" | "psi_mem_some_avg10_pct" | "psi_mem_full_avg10_pct" => {
                    Some((rng.f64() * 200.0).round() / 100.0)
                }
                _ => Some(match c.ty {
                    ColumnType::I64 => {
                        ((ci as u64 + 1) * 1_000_000 + rng.below(1024) * 4096) as f64
                    }
                    ColumnType::F64 => (rng.f64() * 100.0 * 16.0).round() / 16.0,
                }),
            };
            s.values[ci] = v;
        }
        ev.push(t, Record::Sample(s));
    }
}

/// The frame rows the completion check would append at the end.
fn frame_records(shape: &RunShape, t0: u64, rng: &mut Rng, ev: &mut Timed) {
    let at = |f: f64| at_fraction(t0, shape.wall_ns, f);
    for f in 0..shape.frames {
        let mut sha = String::new();
        for _ in 0..4 {
            sha.push_str(&format!("{:016x}", rng.next_u64()));
        }
        ev.push(
            at(0.999) + u64::from(f),
            Record::Frame(FrameRow {
                index: f,
                sha256: sha,
                mean_luma: 60.0 + (rng.f64() * 100.0 * 8.0).round() / 8.0,
                std_luma: (rng.f64() * 40.0 * 8.0).round() / 8.0,
                min_luma: rng.below(20) as f64,
                max_luma: 200.0 + rng.below(56) as f64,
                motion_vs_prev: (f > 0).then(|| (rng.f64() * 10.0 * 8.0).round() / 8.0),
                near_black: false,
                near_uniform: false,
                duplicate_of: None,
            }),
        );
    }
}

/// The timed records in time order, between the fragments a harness writes first
/// (run, rung, levers, sampler, unavailable sensors) and, for a run that ends,
/// last (exit, run end).
fn around_fragments(shape: &RunShape, t0: u64, start: u64, ev: Timed) -> Vec<Record> {
    let w = shape.wall_ns;
    let mut ev = ev.records;
    ev.sort_by_key(|e| (e.0, e.1));
    let mut out = Vec::with_capacity(ev.len() + 10);
    let run = |end: Option<u64>| Record::Fragment {
        key: Run::KEY.into(),
        value: json!({"start_ns": start, "end_ns": end, "argv": ["harness", "run", "--rung", "rungs/0.toml"],
                      "boot_id": shape.boot_id, "hostname": "testhost", "harness_version": "0.1.0", "cwd": "/work"}),
    };
    out.push(run(None));
    out.push(Record::Fragment {
        key: Rung::KEY.into(),
        value: json!({"name": "0", "path": "rungs/0.toml", "sha256": "ab".repeat(32), "config": {"steps": shape.steps}}),
    });
    out.push(Record::Fragment {
        key: Levers::KEY.into(),
        value: json!({"staging": "batched", "widen-f32": "single"}),
    });
    out.push(Record::Fragment {
        key: Sampler::KEY.into(),
        value: json!({"cadence_ms": shape.cadence_ns as f64 / 1e6, "slow_every": 10, "pagecache_every": 10, "observer": "on"}),
    });
    out.push(Record::Fragment {
        key: SensorsUnavailable::KEY.into(),
        value: json!({"gpu_mem_used_bytes": "nvml memory_info: NOT_SUPPORTED on unified memory"}),
    });
    out.extend(ev.into_iter().map(|e| e.2));
    if shape.completes {
        out.push(Record::Fragment {
            key: Exit::KEY.into(),
            value: json!({"reason": "completed", "code": 0, "signal": null, "detail": "engine exited 0"}),
        });
        out.push(run(Some(t0 + w + 50_000_000)));
    }
    out
}

/// Write `records` through the real journal writer.
pub fn write_journal(path: &Path, records: &[Record]) {
    let j = SharedJournal::create(path).expect("create journal");
    for r in records {
        j.append(r).expect("append");
    }
    j.finish().expect("finish journal");
}

/// Bytes that start like a PNG (verify checks the signature, the hash covers the rest).
pub fn fake_png(rng: &mut Rng) -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n".to_vec();
    for _ in 0..64 {
        b.push(rng.next_u64() as u8);
    }
    b
}
