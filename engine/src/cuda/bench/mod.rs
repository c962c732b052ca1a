//! `engine selftest-cuda --bench` / `just bench-gpu`: the device benchmarks,
//! each beside its measured ceiling, in one run.
//!
//! - ceilings: device-to-device copy bandwidth, bf16 GEMM rate at 8192³;
//! - the FP8 GEMM rates by scale granularity and accumulation beside bf16 at
//!   the block Linears' shapes ([`fp8_gemm`]);
//! - staging GB/s of the serial and batched methods against a plain pinned copy of
//!   the same bytes (a synthetic ltxv-2b transformer file, from page cache), and
//!   the two arms' staged bytes compared;
//! - the DiT forward at 6144 tokens (768x512x121) for ltxv-2b (staged weights)
//!   and ltxv-13b (weights generated on the device), median of N after warm-up,
//!   from CUDA events, with the attention and GEMM shares measured alone;
//! - the GPU-busy share of a device-resident denoise loop: the sum of every
//!   forward's event time over the loop's wall time, with the host emitting a
//!   tick per forward one forward behind (as the render does);
//! - the denoise loop with lever `denoise-graph` off and on
//!   ([`crate::cuda::bench::graph`]).

pub mod fp8_gemm;
pub mod graph;
pub mod guidance_batch;
pub mod profile;
pub mod staging_sweep;
pub mod vae;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::result as dres;
use cudarc::driver::sys::CUdeviceptr;

use crate::cuda::fixtures::write_synth_safetensors;
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::context::Timer;
use crate::cuda::kit::gemm::{flops, Accum, Epilogue};
use crate::cuda::kit::kernels::{AttnKernel, NULL};
use crate::cuda::kit::memory::{align_up, DeviceBuffer};
use crate::cuda::kit::sdpa::{Sdpa, Shape as SdpaShape};
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::AlgoChoice;
use crate::cuda::models::dit::Precision;
use crate::cuda::models::dit::{
    AttentionArm, AttnPrecision, CrossArm, DeviceDit, DitDims, ForwardArms, Geometry, NormQuantize,
    OperandAmax, QkNormArm, ResidualStream, TextKv, TextKvArm, TextSlot, LATENT_CHANNELS,
};
use crate::cuda::staging::{
    self, pinned_copy_gbps, DeviceWeights, Staged, StagingMethod, StagingOptions,
};
use crate::cuda::{CudaError, DriverContext};
use crate::models::t5::Keys;
use crate::weights::{DType, TensorSpec};

/// The latent grid of 768x512 at 121 frames: 6144 tokens.
pub const GRID_6144: (usize, usize, usize) = (16, 16, 24);

/// The median of `v` (the upper one for an even count); NaN when `v` is empty.
/// Shared by every device benchmark.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Two configurations of one forward (`set(dit, slot, i)` switches to
/// configuration `i`, 0 or 1) timed in two interleaved rounds of `reps`
/// forwards after 2 warm-ups each: each configuration's mean forward in ms.
fn interleaved_ms(
    kit: &DeviceKit,
    dit: &mut DeviceDit,
    slot: &mut TextSlot,
    (lat_p, vel_p, geo): (CUdeviceptr, CUdeviceptr, Geometry),
    reps: usize,
    mut set: impl FnMut(&mut DeviceDit, &mut TextSlot, usize) -> Result<(), CudaError>,
) -> Result<[f64; 2], CudaError> {
    let mut t = [0.0f64; 2];
    for _round in 0..2 {
        for (i, ti) in t.iter_mut().enumerate() {
            set(dit, slot, i)?;
            let (d, sl) = (&*dit, &*slot);
            *ti += time_ms(kit, 2, reps, || {
                d.enqueue_forward(lat_p, 0.5, geo, sl, vel_p)
            })? / 2.0;
        }
    }
    Ok(t)
}

/// Median device ms of `reps` runs of `f` on the compute stream after `warm` runs.
fn time_ms(
    kit: &DeviceKit,
    warm: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    for _ in 0..warm {
        f()?;
    }
    let t = Timer::new(&kit.gpu)?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        t.start(&kit.gpu.compute)?;
        f()?;
        t.stop(&kit.gpu.compute)?;
        v.push(t.elapsed_ms()?);
    }
    Ok(median(v))
}

/// Weights of `dims` generated on the device (uniform, small): for timing only.
pub fn device_weights(
    kit: &DeviceKit,
    dims: &DitDims,
    seed: u64,
) -> Result<DeviceWeights, CudaError> {
    generate_weights(kit, &dims.tensor_specs(), seed, "synthetic", |s| {
        if s.shape.len() == 2 && !s.name.ends_with("scale_shift_table") {
            1.0 / (s.shape[1] as f32).sqrt()
        } else {
            0.1
        }
    })
}

/// Every tensor of `specs` generated on the device in one arena, uniform in
/// `[-scale(spec), scale(spec))` from `seed` (each tensor its own stream): weights
/// for timing only, never for a check. `what` names the arena in an allocation error.
pub fn generate_weights(
    kit: &DeviceKit,
    specs: &[TensorSpec],
    seed: u64,
    what: &str,
    scale: impl Fn(&TensorSpec) -> f32,
) -> Result<DeviceWeights, CudaError> {
    let total: usize = specs.iter().map(|s| align_up(s.nbytes())).sum();
    let arena = DeviceBuffer::alloc(&kit.gpu, total, &format!("device-generated {what} weights"))?;
    let mut map = HashMap::new();
    let mut off = 0usize;
    for (i, s) in specs.iter().enumerate() {
        let ptr = arena.ptr() + off as u64;
        kit.kernels.fill_uniform_bf16(
            &kit.gpu.compute,
            ptr,
            s.numel(),
            seed ^ (i as u64) << 20,
            scale(s),
        )?;
        map.insert(
            s.name.clone(),
            Staged {
                ptr,
                bytes: s.nbytes(),
                dtype: DType::BF16,
                shape: s.shape.clone(),
            },
        );
        off += align_up(s.nbytes());
    }
    kit.gpu.sync_compute()?;
    Ok(DeviceWeights::from_arena(arena, map, "<device-generated>"))
}

/// Run every benchmark; returns the table rows (printed last by the caller).
pub fn run(kit: &DeviceKit, scratch: &Path) -> Result<Vec<String>, CudaError> {
    let mut rows = vec!["== bench (targets: reports/device-notes.md) ==".to_string()];
    bench_ceilings(kit, &mut rows)?;
    fp8_gemm::fp8_gemms(kit, &mut rows)?;
    let file = scratch.join("ltxv-2b-transformer.safetensors");
    let w2b = bench_staging(kit, &file, &mut rows)?;
    let inp = ForwardInputs::new();
    bench_forward(
        kit,
        "ltxv-2b",
        DitDims::LTXV_2B,
        Arc::new(w2b),
        &inp,
        (60.0, 84.0),
        true,
        &mut rows,
    )?;
    let w13 = Arc::new(device_weights(kit, &DitDims::LTXV_13B, 13)?);
    bench_forward(
        kit,
        "ltxv-13b",
        DitDims::LTXV_13B,
        w13,
        &inp,
        (280.0, 352.0),
        false,
        &mut rows,
    )?;
    let _ = std::fs::remove_file(&file);
    // The denoise loop eager vs replayed from graphs (lever denoise-graph).
    crate::cuda::bench::graph::denoise_graph(kit, &mut rows)?;
    Ok(rows)
}

/// Print `r` as it is measured and keep it for the table.
fn push(rows: &mut Vec<String>, r: String) {
    eprintln!("{r}");
    rows.push(r);
}

/// The ceilings the other rows are read against: device-to-device copy
/// bandwidth and the bf16 GEMM rate at 8192³ on random data.
fn bench_ceilings(kit: &DeviceKit, rows: &mut Vec<String>) -> Result<(), CudaError> {
    let (gpu, g, k, s) = (&kit.gpu, &kit.gemm, &kit.kernels, &kit.gpu.compute);

    let bytes = 2usize << 30;
    let a = DeviceBuffer::alloc(gpu, bytes, "the copy ceiling")?;
    let b = DeviceBuffer::alloc(gpu, bytes, "the copy ceiling")?;
    let ms = time_ms(kit, 2, 10, || {
        // SAFETY: both ranges are `bytes` long.
        unsafe { dres::memcpy_dtod_async(b.ptr(), a.ptr(), bytes, s.cu_stream()) }
            .ctx("device copy")
    })?;
    push(
        rows,
        format!(
            "ceiling  d2d copy            {:>8.0} GB/s (read+write)",
            2.0 * bytes as f64 / ms / 1e6
        ),
    );
    let n = 8192;
    let ad = DeviceBuffer::alloc(gpu, n * n * 2, "gemm ceiling")?;
    let bd = DeviceBuffer::alloc(gpu, n * n * 2, "gemm ceiling")?;
    let cd = DeviceBuffer::alloc(gpu, n * n * 2, "gemm ceiling")?;
    k.fill_uniform_bf16(s, ad.ptr(), n * n, 1, 1.0)?;
    k.fill_uniform_bf16(s, bd.ptr(), n * n, 2, 1.0)?;
    let ms = time_ms(kit, 3, 10, || {
        g.linear(
            s,
            ad.ptr(),
            bd.ptr(),
            NULL,
            cd.ptr(),
            n,
            n,
            n,
            Epilogue::None,
        )
    })?;
    push(
        rows,
        format!(
            "ceiling  bf16 gemm 8192^3     {:>8.0} TFLOP/s (random data)",
            flops(n, n, n) / ms / 1e9
        ),
    );
    Ok(())
}

/// Staging of a synthetic ltxv-2b transformer file (written to `file`): the
/// serial and batched methods and the pinned-ring reader against a plain
/// pinned copy of the same bytes, their staged bytes compared, and
/// release-pages. Returns the batched method's weights for the forward bench.
fn bench_staging(
    kit: &DeviceKit,
    file: &Path,
    rows: &mut Vec<String>,
) -> Result<DeviceWeights, CudaError> {
    let gpu = &kit.gpu;
    let t0 = Instant::now();
    let fbytes = write_synth_safetensors(file, &DitDims::LTXV_2B.tensor_specs(), 7)?;
    eprintln!(
        "bench: wrote {} ({:.2} GB) in {:.1} s",
        file.display(),
        fbytes as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    let mut serial = Vec::new();
    for _ in 0..2 {
        let (w, r) = staging::stage_file(gpu, file, &StagingOptions::new(StagingMethod::Serial))?;
        serial.push(r.gbps());
        drop(w);
    }
    let mut batched = Vec::new();
    let mut kept = None;
    for _ in 0..3 {
        let (w, r) = staging::stage_file(gpu, file, &StagingOptions::new(StagingMethod::Batched))?;
        batched.push(r.gbps());
        kept = Some(w);
    }
    let w2b = kept.ok_or_else(|| CudaError::Invalid("no batched staging ran".into()))?;
    let (ws, _) = staging::stage_file(gpu, file, &StagingOptions::new(StagingMethod::Serial))?;
    let mut differ = 0;
    let names: Vec<String> = w2b.names().map(String::from).collect();
    for n in &names {
        if w2b.download(gpu, n)? != ws.download(gpu, n)? {
            differ += 1;
        }
    }
    drop(ws);
    // The registered reader of the batched method, bytes compared with serial.
    let mut reg = Vec::new();
    let mut reg_differ = 0;
    for _ in 0..3 {
        let mut o = StagingOptions::new(StagingMethod::Batched);
        o.reader = staging::Reader::PinnedRing;
        let (w, r) = staging::stage_file(gpu, file, &o)?;
        reg.push(r.gbps());
        if reg.len() == 1 {
            for n in &names {
                if w.download(gpu, n)? != w2b.download(gpu, n)? {
                    reg_differ += 1;
                }
            }
        }
    }
    let pinned: Vec<f64> = (0..2)
        .map(|_| pinned_copy_gbps(gpu, fbytes as usize))
        .collect::<Result<_, _>>()?;
    let (sm, bm, pm) = (median(serial), median(batched), median(pinned));
    push(
        rows,
        format!(
            "staging  serial               {sm:>8.2} GB/s  (baseline; {:.2} GB, {} tensors)",
            fbytes as f64 / 1e9,
            names.len()
        ),
    );
    push(rows, format!("staging  batched (registered) {bm:>8.2} GB/s  target >= 40 and >= 8x serial: {:.1}x {}", bm / sm, if bm >= 40.0 && bm >= 8.0 * sm { "MET" } else { "MISSED" }));
    push(
        rows,
        format!(
            "staging  pinned copy ceiling  {pm:>8.2} GB/s  batched/ceiling {:.0}%",
            100.0 * bm / pm
        ),
    );
    push(
        rows,
        format!(
            "staging  serial vs batched bytes: {differ} of {} tensors differ",
            names.len()
        ),
    );
    let rm = median(reg);
    push(rows, format!(
        "staging  batched, pinned-ring reader {rm:>6.2} GB/s  ({:.1}x serial, {:.0}% of ceiling; {reg_differ} tensors differ from the default reader) {}",
        rm / sm,
        100.0 * rm / pm,
        if rm >= 40.0 && rm >= 8.0 * sm { "MET" } else { "MISSED" }
    ));
    {
        let mut o = StagingOptions::new(StagingMethod::Batched);
        o.release_pages = true;
        let (_w, r1) = staging::stage_file(gpu, file, &o)?;
        let (_w2, r2) =
            staging::stage_file(gpu, file, &StagingOptions::new(StagingMethod::Batched))?;
        push(rows, format!("staging  batched+release-pages {:>7.2} GB/s, then re-read after release {:.2} GB/s (page cache dropped)", r1.gbps(), r2.gbps()));
    }

    Ok(w2b)
}

/// The inputs of every forward benchmark: 6144 tokens (768x512x121), 128 text
/// tokens of which 100 are real.
struct ForwardInputs {
    n: usize,
    l: usize,
    lat: Vec<f32>,
    text: Vec<f32>,
    mask: Vec<f32>,
    geo: Geometry,
}

impl ForwardInputs {
    fn new() -> ForwardInputs {
        let l = 128;
        let n = GRID_6144.0 * GRID_6144.1 * GRID_6144.2;
        let mut rng = Rng::new(99);
        let lat = rng.normal(n * LATENT_CHANNELS, 1.0);
        let text = rng.normal(l * 4096, 1.0);
        let mask: Vec<f32> = (0..l).map(|j| if j < 100 { 1.0 } else { 0.0 }).collect();
        let geo = Geometry {
            grid: GRID_6144,
            fps: 25.0,
        };
        ForwardInputs {
            n,
            l,
            lat,
            text,
            mask,
            geo,
        }
    }
}

/// One model's forward at 6144 tokens (median of N from CUDA events) against
/// `target` and PyTorch's `pytorch` ms, with its parts measured alone:
/// self-attention per block with every fused kernel side by side, the
/// block's GEMMs, cross-attention; and with `denoise_loop` the GPU-busy share
/// of a device-resident loop of 20 forwards.
#[allow(clippy::too_many_arguments)]
fn bench_forward(
    kit: &DeviceKit,
    name: &str,
    dims: DitDims,
    weights: Arc<DeviceWeights>,
    inp: &ForwardInputs,
    (target, pytorch): (f64, f64),
    denoise_loop: bool,
    rows: &mut Vec<String>,
) -> Result<(), CudaError> {
    let (gpu, g, k, s) = (&kit.gpu, &kit.gemm, &kit.kernels, &kit.gpu.compute);
    let (n, l, geo) = (inp.n, inp.l, inp.geo);
    let (lat, text, mask) = (&inp.lat, &inp.text, &inp.mask);
    let mut dit = DeviceDit::new(gpu.clone(), k.clone(), g.clone(), dims, weights)?;
    gpu.mem.reset_peak();
    let mut slot = TextSlot::upload(gpu, &dims, text, mask)?;
    dit.workspace(n, l)?;
    let io = DeviceBuffer::alloc(gpu, 2 * n * LATENT_CHANNELS * 4, "bench latents")?;
    let (lat_p, vel_p) = (io.ptr(), io.ptr() + (n * LATENT_CHANNELS * 4) as u64);
    crate::cuda::kit::memory::upload(gpu, lat_p, lat)?;
    let (lin, sa, ca) = dims.forward_flops(n, l);
    let total = lin + sa + ca;
    let best = time_ms(kit, 3, if name == "ltxv-2b" { 10 } else { 5 }, || {
        dit.enqueue_forward(lat_p, 0.5, geo, &slot, vel_p)
    })?;
    let best_kind = dit.attn;
    // The same forward with an event after each operation: time by class.
    let prof = profile::forward_profile(kit, &dit, (lat_p, vel_p), geo, &slot, 3)?;
    for r in profile::profile_rows(&format!("{name} attention=mma"), &dims, (n, l), &prof, best) {
        push(rows, r);
    }
    // Components alone: self-attention of one block and the block's GEMMs.
    let d = dims.dim();
    let q = DeviceBuffer::alloc(gpu, n * d * 2, "bench q")?;
    let kk = DeviceBuffer::alloc(gpu, n * d * 2, "bench k")?;
    let v = DeviceBuffer::alloc(gpu, n * d * 2, "bench v")?;
    let o = DeviceBuffer::alloc(gpu, n * d * 2, "bench o")?;
    for b in [&q, &kk, &v] {
        k.fill_uniform_bf16(s, b.ptr(), n * d, 5, 2.0)?;
    }
    let kbias = DeviceBuffer::alloc(gpu, l * 4, "bench kbias")?;
    crate::cuda::kit::memory::upload(gpu, kbias.ptr(), &vec![0.0f32; l])?;
    let attn_alone = |kind: AttnKernel, nk: usize, kb: u64| {
        time_ms(kit, 2, 10, || {
            k.attention(
                s,
                kind,
                dims.heads,
                dims.head_dim,
                (q.ptr(), d),
                (kk.ptr(), d),
                (v.ptr(), d),
                (o.ptr(), d),
                n,
                nk,
                kb,
                0.125,
            )
        })
    };
    let best_attn = attn_alone(best_kind, n, NULL)?;
    let cross_ms = attn_alone(best_kind, l, kbias.ptr())?;
    // Every fused kernel side by side (self and cross), then the whole
    // forward with the fastest flash_mt layout.
    let mut side = Vec::new();
    let mut fastest: Option<(AttnKernel, f64)> = None;
    for kind in AttnKernel::all() {
        if kind == AttnKernel::Reference {
            continue;
        }
        let self_ms = attn_alone(kind, n, NULL)?;
        let cross = attn_alone(kind, l, kbias.ptr())?;
        side.push(format!(
            "{}={self_ms:.3} ms ({:.0} TFLOP/s), cross {cross:.3}",
            kind.name(),
            sa / dims.layers as f64 / self_ms / 1e9
        ));
        if matches!(kind, AttnKernel::FlashMt(_)) && fastest.is_none_or(|(_, t)| self_ms < t) {
            fastest = Some((kind, self_ms));
        }
    }
    push(
        rows,
        format!(
            "forward  {name} self-attn/block old vs new: {}",
            side.join("; ")
        ),
    );
    if let Some((kind, _)) = fastest {
        dit.attn = kind;
        let with = time_ms(kit, 2, if name == "ltxv-2b" { 10 } else { 5 }, || {
            dit.enqueue_forward(lat_p, 0.5, geo, &slot, vel_p)
        })?;
        dit.attn = best_kind;
        push(
            rows,
            format!(
                "forward  {name} 6144 tok with attn={}: {with:.1} ms (attn={}: {best:.1} ms) {:.0} TFLOP/s",
                kind.name(),
                best_kind.name(),
                total / with / 1e9
            ),
        );
    }
    let (g_dd, g_up, g_dn) = block_gemms_ms(kit, n, d, (q.ptr(), o.ptr()))?;
    let block_gemm_ms = 6.0 * g_dd + g_up + g_dn;
    let layers = dims.layers as f64;
    // The `attention` lever's cudnn arm: cuDNN's fused attention alone at the
    // forward's self-attention shape, then the whole forward with it.
    let shape = SdpaShape {
        heads: dims.heads,
        hd: dims.head_dim,
        nq: n,
        nk: n,
        ld: [d; 4],
        scale_bits: 0.125f32.to_bits(),
    };
    // The bf16 forward with cuDNN's self-attention, where cuDNN loads.
    let mut cudnn_bf16: Option<f64> = None;
    let cudnn = Sdpa::open(gpu).and_then(|sdpa| {
        let ms = time_ms(kit, 2, 10, || {
            sdpa.enqueue(gpu, &shape, q.ptr(), kk.ptr(), v.ptr(), o.ptr())
        })?;
        // Every engine configuration cuDNN offers at the self-attention shape
        // and at the cross-attention's (the text's l keys), timed; the forward
        // runs the first of each: whether choosing among them would pay.
        let cross = SdpaShape { nk: l, ..shape };
        let mut engines = Vec::new();
        for (what, s) in [("self", shape), ("cross", cross)] {
            let ptrs = [q.ptr(), kk.ptr(), v.ptr(), o.ptr()];
            let cell = match sdpa.time_engines(gpu, &s, ptrs, (10, 8)) {
                Ok(t) => t
                    .iter()
                    .map(|(n, ws, ms)| format!("#{n} {ms:.3} ms (ws {} KiB)", ws / 1024))
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(e) => format!("unavailable: {e}"),
            };
            engines.push(format!("{what} {}x{}: {cell}", s.nq, s.nk));
        }
        push(
            rows,
            format!("forward  {name} cuDNN engines {}", engines.join("; ")),
        );
        Ok((ms, sdpa.version, sdpa.plans()))
    });
    match cudnn {
        Ok((sdpa_ms, version, plans)) => {
            dit.set_attention(AttentionArm::Cudnn)?;
            let with = time_ms(kit, 2, if name == "ltxv-2b" { 10 } else { 5 }, || {
                dit.enqueue_forward(lat_p, 0.5, geo, &slot, vel_p)
            })?;
            cudnn_bf16 = Some(with);
            let prof = profile::forward_profile(kit, &dit, (lat_p, vel_p), geo, &slot, 3)?;
            // The arms not yet measured in a render (`cross-attention = cudnn`,
            // `qk-norm = warp`) on top of the cudnn self-attention: the whole
            // forward and its parts, beside the cudnn arm alone.
            let arms = ForwardArms {
                attention: AttentionArm::Cudnn,
                cross: CrossArm::Cudnn,
                qk_norm: QkNormArm::Warp,
                precision: Precision::Bf16,
                fp8_accum: Accum::Exact,
                attn_precision: AttnPrecision::Bf16,
                text_kv: TextKvArm::PerForward,
                ..ForwardArms::OWN
            };
            let newer = dit.set_arms(arms).and_then(|_| {
                let ms = time_ms(kit, 2, if name == "ltxv-2b" { 10 } else { 5 }, || {
                    dit.enqueue_forward(lat_p, 0.5, geo, &slot, vel_p)
                })?;
                let p = profile::forward_profile(kit, &dit, (lat_p, vel_p), geo, &slot, 3)?;
                Ok((ms, p))
            });
            dit.set_arms(ForwardArms::OWN)?;
            let label = format!("{name} attention=cudnn cross-attention=cudnn qk-norm=warp");
            match newer {
                Ok((ms, p)) => {
                    for r in profile::profile_rows(&label, &dims, (n, l), &p, ms) {
                        push(rows, r);
                    }
                    push(
                        rows,
                        format!(
                            "forward  {label}: {ms:.1} ms vs attention=cudnn alone {with:.1} ms \
                             ({:+.1}%)",
                            (ms / with - 1.0) * 100.0
                        ),
                    );
                }
                Err(e) => push(rows, format!("forward  {label} unavailable: {e}")),
            }
            for r in profile::profile_rows(
                &format!("{name} attention=cudnn"),
                &dims,
                (n, l),
                &prof,
                with,
            ) {
                push(rows, r);
            }
            push(rows, format!(
                "forward  {name} attention=cudnn (cuDNN {version}, engine choice {:?}): self-attn/block {sdpa_ms:.3} ms ({:.0} TFLOP/s) vs mma {best_attn:.3} ms ({:.0}); forward {with:.1} ms ({:.0} TFLOP/s) vs mma {best:.1} ms; parts: attn {:.1} ms, GEMMs {:.1} ms, other {:.1} ms",
                plans.first().map(|p| p.1),
                sa / layers / sdpa_ms / 1e9,
                sa / layers / best_attn / 1e9,
                total / with / 1e9,
                sdpa_ms * layers,
                block_gemm_ms * layers,
                with - sdpa_ms * layers - block_gemm_ms * layers
            ));
        }
        Err(e) => push(
            rows,
            format!("forward  {name} attention=cudnn unavailable: {e}"),
        ),
    }
    // `precision = fp8` with each accumulation (lever `fp8-accum`), on the
    // engine's own kernels (beside the bf16 forward on the same kernels,
    // `best`) and with cuDNN's self-attention as a render runs it (beside the
    // bf16 forward with it, where cuDNN loaded): the whole forward and its parts.
    let fp8 = ForwardArms {
        precision: Precision::Fp8,
        ..ForwardArms::OWN
    };
    let fast = ForwardArms {
        fp8_accum: Accum::Fast,
        ..fp8
    };
    let on_cudnn = |a: ForwardArms| ForwardArms {
        attention: AttentionArm::Cudnn,
        ..a
    };
    let fp8_attention = dims.head_dim >= crate::cuda::kit::sdpa_fp8::MIN_HEAD_DIM;
    let mut configs = vec![
        ("precision=fp8".to_string(), fp8, Some(best)),
        ("precision=fp8 fp8-accum=fast".to_string(), fast, Some(best)),
    ];
    if let Some(bf) = cudnn_bf16 {
        configs.push((
            "attention=cudnn precision=fp8".into(),
            on_cudnn(fp8),
            Some(bf),
        ));
        configs.push((
            "attention=cudnn precision=fp8 fp8-accum=fast".into(),
            on_cudnn(fast),
            Some(bf),
        ));
        // `attention-precision = fp8` on the render's fp8 arms, beside the
        // same arms with cuDNN's bf16 attention (the row above); only where the
        // engine runs it (head dim >= `sdpa_fp8::MIN_HEAD_DIM`).
        if fp8_attention {
            configs.push((
                "attention=cudnn precision=fp8 fp8-accum=fast attention-precision=fp8".into(),
                ForwardArms {
                    attn_precision: AttnPrecision::Fp8,
                    ..on_cudnn(fast)
                },
                Some(bf),
            ));
        }
    }
    let mut exact_ms = f64::NAN;
    let mut fast_ms = f64::NAN;
    for (arms_label, arms, bf16_ms) in configs {
        let r = dit.set_arms(arms).and_then(|_| {
            let ms = time_ms(kit, 2, if name == "ltxv-2b" { 10 } else { 5 }, || {
                dit.enqueue_forward(lat_p, 0.5, geo, &slot, vel_p)
            })?;
            let p = profile::forward_profile(kit, &dit, (lat_p, vel_p), geo, &slot, 3)?;
            Ok((ms, p, dit.fp8_bytes(n, l)))
        });
        dit.set_arms(ForwardArms::OWN)?;
        let label = format!("{name} {arms_label}");
        match r {
            Ok((ms, p, bytes)) => {
                for r in profile::profile_rows(&label, &dims, (n, l), &p, ms) {
                    push(rows, r);
                }
                let vs_exact = if arms.attn_precision == AttnPrecision::Fp8 {
                    format!(
                        "; vs attention-precision=bf16 {:+.1}%",
                        (ms / fast_ms - 1.0) * 100.0
                    )
                } else if arms.fp8_accum == Accum::Fast {
                    fast_ms = ms;
                    format!(
                        "; vs fp8-accum=exact {:+.1}%",
                        (ms / exact_ms - 1.0) * 100.0
                    )
                } else {
                    exact_ms = ms;
                    String::new()
                };
                let bf = bf16_ms.unwrap_or(f64::NAN);
                push(
                    rows,
                    format!(
                        "forward  {label}: {ms:.1} ms vs bf16 on the same attention {bf:.1} ms \
                         ({:+.1}%){vs_exact}; {:.2} GiB more device memory",
                        (ms / bf - 1.0) * 100.0,
                        bytes as f64 / (1u64 << 30) as f64
                    ),
                );
            }
            Err(e) => push(rows, format!("forward  {label} unavailable: {e}")),
        }
    }
    // The fp8 arm's row steps quantizing their own output (the forward's)
    // against the separate quantize pass over bf16 h they replaced
    // (`NormQuantize`; the same codes bit for bit, checked in the selftest),
    // on the render's fp8 arms, in two interleaved rounds; then the separate
    // path's parts (the fused path's are the row above with these arms).
    let render_fp8 = if cudnn_bf16.is_some() {
        on_cudnn(fast)
    } else {
        fast
    };
    let reps = if name == "ltxv-2b" { 10 } else { 5 };
    let io = (lat_p, vel_p, geo);
    let how = [NormQuantize::Fused, NormQuantize::Separate];
    let nq = dit.set_arms(render_fp8).and_then(|_| {
        let t = interleaved_ms(kit, &mut dit, &mut slot, io, reps, |d, _, i| {
            d.set_norm_quantize(how[i]);
            Ok(())
        })?;
        let p = profile::forward_profile(kit, &dit, (lat_p, vel_p), geo, &slot, 3)?;
        Ok((t, p))
    });
    dit.set_norm_quantize(NormQuantize::Fused);
    dit.set_arms(ForwardArms::OWN)?;
    let label = format!(
        "{name} {} fp8-accum=fast norm-quantize=separate",
        if cudnn_bf16.is_some() {
            "attention=cudnn precision=fp8"
        } else {
            "precision=fp8"
        }
    );
    match nq {
        Ok(([fused, separate], p)) => {
            for r in profile::profile_rows(&label, &dims, (n, l), &p, separate) {
                push(rows, r);
            }
            push(
                rows,
                format!(
                    "forward  {label}: {separate:.1} ms vs fused {fused:.1} ms (fused {:+.1}%)",
                    (fused / separate - 1.0) * 100.0
                ),
            );
        }
        Err(e) => push(rows, format!("forward  {label} unavailable: {e}")),
    }
    // The FP8 attention's q and k amax raised by the q/k norm (the forward's,
    // `OperandAmax::Folded`) against read by the operand pass (the same slots
    // bit for bit, checked in the selftest), in two interleaved rounds.
    if cudnn_bf16.is_some() && fp8_attention {
        let a8 = ForwardArms {
            attn_precision: AttnPrecision::Fp8,
            ..on_cudnn(fast)
        };
        let how = [OperandAmax::Folded, OperandAmax::Separate];
        let timed = dit.set_arms(a8).and_then(|_| {
            interleaved_ms(kit, &mut dit, &mut slot, io, reps, |d, _, i| {
                d.set_operand_amax(how[i]);
                Ok(())
            })
        });
        dit.set_operand_amax(OperandAmax::Folded);
        dit.set_arms(ForwardArms::OWN)?;
        let label =
            format!("{name} attention=cudnn precision=fp8 fp8-accum=fast attention-precision=fp8");
        push(
            rows,
            match timed {
                Ok([folded, separate]) => format!(
                    "forward  {label}: q/k amax folded {folded:.1} ms vs separate {separate:.1} ms \
                     (folded {:+.1}%)",
                    (folded / separate - 1.0) * 100.0
                ),
                Err(e) => format!("forward  {label} q/k amax folded vs separate unavailable: {e}"),
            },
        );
    }
    // `text-kv = cached` against per-forward on the render's fastest arms
    // (the same velocity bit for bit, checked in the selftest), in two
    // interleaved rounds; the cache is built outside the timed forwards.
    let render = match (cudnn_bf16.is_some(), fp8_attention) {
        (true, true) => ForwardArms {
            attn_precision: AttnPrecision::Fp8,
            ..on_cudnn(fast)
        },
        (true, false) => on_cudnn(fast),
        (false, _) => fast,
    };
    let kv = [TextKvArm::Cached, TextKvArm::PerForward];
    let timed = interleaved_ms(kit, &mut dit, &mut slot, io, reps, |d, sl, i| {
        d.set_arms(ForwardArms {
            text_kv: kv[i],
            ..render
        })?;
        d.prepare_text(sl)
    });
    dit.set_arms(ForwardArms::OWN)?;
    dit.prepare_text(&mut slot)?;
    let label = format!(
        "{name} {}precision=fp8 fp8-accum=fast{}",
        if cudnn_bf16.is_some() {
            "attention=cudnn "
        } else {
            ""
        },
        if render.attn_precision == AttnPrecision::Fp8 {
            " attention-precision=fp8"
        } else {
            ""
        }
    );
    push(
        rows,
        match timed {
            Ok([cached, per]) => format!(
                "forward  {label}: text-kv cached {cached:.1} ms vs per-forward {per:.1} ms \
                 (cached {:+.1}%); the cache {:.1} MiB a prompt",
                (cached / per - 1.0) * 100.0,
                TextKv::bytes_for(&dims, l) as f64 / (1u64 << 20) as f64
            ),
            Err(e) => format!("forward  {label} text-kv cached vs per-forward unavailable: {e}"),
        },
    );
    // `guidance-batch = batched` against the pair (with the text cache it
    // needs): one guided step's forwards, on these fp8 arms and on the
    // default profile's bf16 ones (its campaign's).
    let bf16 = match cudnn_bf16 {
        Some(_) => on_cudnn(ForwardArms::OWN),
        None => ForwardArms::OWN,
    };
    let bf16_label = format!(
        "{name} {}precision=bf16",
        if cudnn_bf16.is_some() {
            "attention=cudnn "
        } else {
            ""
        }
    );
    for (arms, label) in [(render, &label), (bf16, &bf16_label)] {
        let inputs = ((lat_p, geo), (&text[..], &mask[..]));
        let timed =
            guidance_batch::batched_vs_pair_ms(kit, &mut dit, inputs.0, inputs.1, arms, reps);
        push(
            rows,
            match timed {
                Ok([batched, pair]) => format!(
                    "forward  {label} text-kv=cached: guidance-batch batched {batched:.1} ms vs \
                     pair {pair:.1} ms a guided step (batched {:+.1}%)",
                    (batched / pair - 1.0) * 100.0
                ),
                Err(e) => {
                    format!("forward  {label} guidance-batch batched vs pair unavailable: {e}")
                }
            },
        );
    }
    // `residual = bf16` against f32 on the same two arm sets: one forward.
    for (arms, label) in [(render, &label), (bf16, &bf16_label)] {
        let streams = [ResidualStream::Bf16, ResidualStream::F32];
        dit.set_arms(arms)?;
        dit.prepare_text(&mut slot)?;
        let timed = interleaved_ms(kit, &mut dit, &mut slot, io, reps, |d, _, i| {
            d.set_arms(ForwardArms {
                residual: streams[i],
                ..arms
            })
        });
        push(
            rows,
            match timed {
                Ok([b, f]) => format!(
                    "forward  {label}: residual bf16 {b:.1} ms vs f32 {f:.1} ms (bf16 {:+.1}%)",
                    (b / f - 1.0) * 100.0
                ),
                Err(e) => format!("forward  {label} residual bf16 vs f32 unavailable: {e}"),
            },
        );
    }
    // `gemm-algo = tuned` against the heuristic on the same two arm sets: one
    // forward (the first tuned forward, a warm-up, times the candidates; the
    // machine's cache keeps them for the renders after).
    for (arms, label) in [(render, &label), (bf16, &bf16_label)] {
        let choices = [AlgoChoice::Tuned, AlgoChoice::Heuristic];
        dit.set_arms(arms)?;
        dit.prepare_text(&mut slot)?;
        let timed = interleaved_ms(kit, &mut dit, &mut slot, io, reps, |d, _, i| {
            d.set_arms(ForwardArms {
                gemm_algo: choices[i],
                ..arms
            })
        });
        let r = g.tune_report();
        push(
            rows,
            match timed {
                Ok([t, h]) => format!(
                    "forward  {label}: gemm-algo tuned {t:.1} ms vs heuristic {h:.1} ms (tuned \
                     {:+.1}%; so far {} shapes timed, {} cached, {} not the first: {})",
                    (t / h - 1.0) * 100.0,
                    r.tuned,
                    r.from_cache,
                    r.not_first,
                    r.changed().join(", ")
                ),
                Err(e) => format!("forward  {label} gemm-algo tuned vs heuristic unavailable: {e}"),
            },
        );
    }
    dit.set_arms(ForwardArms::OWN)?;
    dit.prepare_text(&mut slot)?;
    let sa_layer = sa / layers;
    push(rows, format!(
        "forward  {name} 6144 tok       {best:>8.1} ms  target <= {target} (PyTorch {pytorch}) {}  {:.0} TFLOP/s; attn={}",
        if best <= target { "MET" } else { "MISSED" },
        total / best / 1e9,
        best_kind.name(),
    ));
    push(rows, format!(
        "forward  {name} parts: self-attn/block {}={best_attn:.3}ms -> x{} = {:.1} ms ({:.0} TFLOP/s); GEMMs/block {:.2} ms -> {:.1} ms ({:.0} TFLOP/s: DxD {:.0}, up {:.0}, down {:.0}); other {:.1} ms",
        best_kind.name(),
        dims.layers,
        best_attn * layers,
        sa_layer / best_attn / 1e9,
        block_gemm_ms,
        block_gemm_ms * layers,
        (28.0 * n as f64 * (d * d) as f64) / block_gemm_ms / 1e9,
        flops(n, d, d) / g_dd / 1e9,
        flops(n, 4 * d, d) / g_up / 1e9,
        flops(n, d, 4 * d) / g_dn / 1e9,
        best - best_attn * layers - block_gemm_ms * layers
    ));
    push(
        rows,
        format!(
            "forward  {name} cross-attn/block {cross_ms:.3} ms -> {:.1} ms",
            cross_ms * layers
        ),
    );
    push(
        rows,
        format!(
            "forward  {name} peak device bytes (weights+workspace+bench buffers): {:.2} GiB",
            gpu.mem.peak() as f64 / (1u64 << 30) as f64
        ),
    );
    drop((q, kk, v, o, kbias));

    if denoise_loop {
        bench_denoise_busy(kit, &mut dit, inp, (lat_p, vel_p), &slot, rows)?;
    }
    Ok(())
}

/// A block's GEMM shapes alone at `n` tokens of width `d`, milliseconds each:
/// D x D (q, k, v, out of both attentions: 6 per block), the feed-forward's
/// up (D -> 4D, GELU fused) and down (4D -> D). `(x, y)`: input and output,
/// n x D bf16 each.
fn block_gemms_ms(
    kit: &DeviceKit,
    n: usize,
    d: usize,
    (x, y): (CUdeviceptr, CUdeviceptr),
) -> Result<(f64, f64, f64), CudaError> {
    let (gpu, g, k, s) = (&kit.gpu, &kit.gemm, &kit.kernels, &kit.gpu.compute);
    let ff = DeviceBuffer::alloc(gpu, n * 4 * d * 2, "bench ff")?;
    let wbig = DeviceBuffer::alloc(gpu, 4 * d * d * 2, "bench w")?;
    let bias = DeviceBuffer::alloc(gpu, 4 * d * 2, "bench bias")?;
    k.fill_uniform_bf16(s, wbig.ptr(), 4 * d * d, 6, 0.02)?;
    k.fill_uniform_bf16(s, bias.ptr(), 4 * d, 8, 0.1)?;
    let g_dd = time_ms(kit, 2, 10, || {
        g.linear(s, x, wbig.ptr(), bias.ptr(), y, n, d, d, Epilogue::Bias)
    })?;
    let g_up = time_ms(kit, 2, 10, || {
        g.linear(
            s,
            x,
            wbig.ptr(),
            bias.ptr(),
            ff.ptr(),
            n,
            4 * d,
            d,
            Epilogue::BiasGelu,
        )
    })?;
    let g_dn = time_ms(kit, 2, 10, || {
        g.linear(
            s,
            ff.ptr(),
            wbig.ptr(),
            bias.ptr(),
            y,
            n,
            d,
            4 * d,
            Epilogue::Bias,
        )
    })?;
    Ok((g_dd, g_up, g_dn))
}

/// The GPU-busy share of a device-resident denoise loop of 20 forwards: the
/// sum of every forward's event time over the loop's wall time, the host
/// reading each forward's time one forward behind (as the render does).
fn bench_denoise_busy(
    kit: &DeviceKit,
    dit: &mut DeviceDit,
    inp: &ForwardInputs,
    (lat_p, vel_p): (CUdeviceptr, CUdeviceptr),
    slot: &TextSlot,
    rows: &mut Vec<String>,
) -> Result<(), CudaError> {
    let (gpu, k, s) = (&kit.gpu, &kit.kernels, &kit.gpu.compute);
    let (n, geo) = (inp.n, inp.geo);
    // Device-resident denoise loop, 20 forwards, ticks one forward behind.
    let steps = 20;
    let timers: Vec<Timer> = (0..steps)
        .map(|_| Timer::new(gpu))
        .collect::<Result<_, _>>()?;
    gpu.sync_compute()?;
    let t0 = Instant::now();
    let mut dev_ms = 0.0;
    for (i, t) in timers.iter().enumerate() {
        t.start(s)?;
        dit.enqueue_forward(lat_p, 1.0 - i as f32 / steps as f32, geo, slot, vel_p)?;
        t.stop(s)?;
        let n = n * LATENT_CHANNELS;
        k.guided_euler(s, lat_p, vel_p, NULL, 1.0, -1.0 / steps as f32, n)?;
        if i > 0 {
            dev_ms += timers[i - 1].elapsed_ms()?; // the tick of the previous forward
        }
    }
    dev_ms += timers[steps - 1].elapsed_ms()?;
    gpu.sync_compute()?;
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    push(rows, format!(
        "denoise  ltxv-2b {steps} forwards: sum forward device {dev_ms:.1} ms / wall {wall_ms:.1} ms = {:.2}% busy  target >= 97% {}",
        100.0 * dev_ms / wall_ms,
        if dev_ms / wall_ms >= 0.97 { "MET" } else { "MISSED" }
    ));
    Ok(())
}

/// The T5-XXL encoder (24 blocks, synthetic weights by the rungs' rules) on
/// 128 tokens (20 real): the weights' staging time (written just before, so
/// read from page cache), the device forward (median of 5 after 2 warm-ups,
/// CUDA events; one prompt and two batched), and the host arm's forward on
/// the same machine, with the two outputs compared (informational: over 24
/// blocks these random weights amplify the bf16 roundings to a relative
/// difference of ~0.65, as a host emulation of the roundings predicts; see
/// [`crate::cuda::fixtures::t5`]). Returns the table rows.
pub fn run_t5(kit: &DeviceKit, scratch: &Path) -> Result<Vec<String>, CudaError> {
    let file = scratch.join("t5-xxl.safetensors");
    let rows = t5_rows(kit, &file);
    let _ = std::fs::remove_file(&file);
    rows
}

fn t5_rows(kit: &DeviceKit, file: &Path) -> Result<Vec<String>, CudaError> {
    use crate::cuda::fixtures::t5::{host_encoder, prompt, write_t5_file};
    use crate::cuda::models::t5::DeviceT5;
    let mut rows = vec!["== bench: T5-XXL encoder (24 blocks, 128 tokens) ==".to_string()];
    let push = |rows: &mut Vec<String>, r: String| {
        eprintln!("{r}");
        rows.push(r);
    };
    let gpu = &kit.gpu;
    let cfg = crate::presets::t5_xxl();
    let t0 = Instant::now();
    let fbytes = write_t5_file(file, &cfg, 5)?;
    eprintln!(
        "bench: wrote {} ({:.2} GB) in {:.1} s",
        file.display(),
        fbytes as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    let stage = |arm: StagingMethod| staging::stage_file(gpu, file, &StagingOptions::new(arm));
    let (ws, rs) = stage(StagingMethod::Serial)?;
    drop(ws);
    let mut batched = Vec::new();
    let mut kept = None;
    for _ in 0..2 {
        let (w, r) = stage(StagingMethod::Batched)?;
        batched.push(r.seconds);
        kept = Some((w, r));
    }
    let (w, rb) = kept.ok_or_else(|| CudaError::Invalid("no batched staging ran".into()))?;
    push(
        &mut rows,
        format!(
            "t5 staging  batched {:>6.3} s ({:.1} GB/s, median of 2), serial {:.3} s ({:.1} GB/s); {:.2} GB, {} tensors, page cache warm",
            median(batched.clone()),
            rb.bytes as f64 / median(batched) / 1e9,
            rs.seconds,
            rs.gbps(),
            rb.bytes as f64 / 1e9,
            w.names().count()
        ),
    );
    let mut dev = DeviceT5::new(kit, &cfg, w)?;
    gpu.mem.reset_peak();
    let mut rng = Rng::new(77);
    let l = 128;
    let p0 = prompt(&mut rng, cfg.vocab_size, l, 20);
    let p1 = prompt(&mut rng, cfg.vocab_size, l, 57);
    let one = [(p0.0.as_slice(), Keys::Masked(&p0.1))];
    let two = [
        (p0.0.as_slice(), Keys::Masked(&p0.1)),
        (p1.0.as_slice(), Keys::Masked(&p1.1)),
    ];
    let mut timed = |b: &[(&[u32], Keys)]| -> Result<(f64, Vec<crate::tensor::Tensor>), CudaError> {
        let mut ms = Vec::new();
        let mut last = Vec::new();
        for i in 0..7 {
            let (y, t) = dev.encode(b, false)?;
            if i >= 2 {
                ms.push(t);
            }
            last = y;
        }
        Ok((median(ms), last))
    };
    let (ms1, y1) = timed(&one)?;
    let (ms2, _) = timed(&two)?;
    let weights_gb = rb.bytes as f64 / 1e9;
    push(
        &mut rows,
        format!(
            "t5 forward  device 1 prompt {ms1:>7.2} ms ({:.0} GB/s of weights), 2 prompts batched {ms2:.2} ms; peak device {:.2} GiB",
            weights_gb / ms1 * 1e3,
            gpu.mem.peak() as f64 / (1u64 << 30) as f64
        ),
    );
    drop(dev);
    let t0 = Instant::now();
    let host = host_encoder(file, &cfg)?;
    let load_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let yh = host
        .forward(&p0.0, Keys::Masked(&p0.1))
        .map_err(|e| CudaError::Invalid(format!("host T5 forward: {e}")))?;
    let host_s = t0.elapsed().as_secs_f64();
    drop(host);
    let (rel, max_abs) = crate::cuda::fixtures::rel_err(y1[0].data(), yh.data());
    push(
        &mut rows,
        format!(
            "t5 forward  host arm 1 prompt {host_s:>7.2} s (load+widen {load_s:.1} s, {} threads): device is {:.0}x faster; device vs host over 24 blocks rel={rel:.3e} max_abs={max_abs:.3e}",
            rayon::current_num_threads(),
            host_s * 1e3 / ms1
        ),
    );
    Ok(rows)
}
