//! The staging sweep (`selftest-cuda --only staging --bench`): every host-side
//! way the batched method has of reaching the copy engine, timed on the same
//! files from the page cache beside the pinned-copy ceiling, so a change of
//! the default reader is read off one table (issue 37's >= 45 GB/s).
//!
//! Files: a synthetic ltxv-2b transformer (about 3.9 GB) and a synthetic
//! T5-XXL (about 9.5 GB), written to the scratch directory first (so their
//! pages are cached). Each variant runs [`REPS`] times with `release_pages`
//! off; the registered reader and the best ring also run with it on (the
//! render's default profile), the file read back into the page cache, untimed,
//! before each of those. Each row gives the median GB/s (bytes over
//! [`StagingReport::seconds`]: until the weights are usable), the median
//! seconds pinning and tearing down, and for a background teardown its own
//! wall as [`settle_teardowns`] returns it. Every variant's first staging of
//! the transformer is compared byte for byte with the default reader's.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use crate::cuda::bench::median;
use crate::cuda::fixtures::write_synth_safetensors;
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::DitDims;
use crate::cuda::staging::{
    self, pinned_copy_gbps, settle_teardowns, DeviceWeights, Reader, RingMemory, StagingMethod,
    StagingOptions, StagingReport, Teardown,
};
use crate::cuda::CudaError;

/// Timed stagings per variant and file with `release_pages` off.
pub const REPS: usize = 3;
/// Timed stagings per variant with `release_pages` on (each after a re-read).
const RELEASE_REPS: usize = 2;

/// The batched method with the pinned ring of `memory`: `buffers` of
/// `chunk_mib` MiB, `threads` readers (0: the pool's).
fn ring(memory: RingMemory, chunk_mib: usize, buffers: usize, threads: usize) -> StagingOptions {
    let mut o = StagingOptions::new(StagingMethod::Batched);
    o.reader = Reader::PinnedRing;
    o.ring_memory = memory;
    (o.chunk_bytes, o.buffers, o.threads) = (chunk_mib << 20, buffers, threads);
    o
}

/// The variants by name, the render's default first (the byte comparison's
/// reference); `release_pages` is set by the caller.
fn variants() -> Vec<(&'static str, StagingOptions)> {
    let base = StagingOptions::new(StagingMethod::Batched);
    let with = |f: &dyn Fn(&mut StagingOptions)| {
        let mut o = base.clone();
        f(&mut o);
        o
    };
    vec![
        ("registered 8 thr, teardown inline (default)", base.clone()),
        (
            "registered 8 thr, teardown background",
            with(&|o| o.teardown = Teardown::Background),
        ),
        (
            "registered 16 thr, teardown inline",
            with(&|o| o.threads = 16),
        ),
        (
            "registered 8 thr, 16 MiB chunks",
            with(&|o| o.register_chunk_bytes = 16 << 20),
        ),
        (
            "registered 8 thr, 256 MiB chunks",
            with(&|o| o.register_chunk_bytes = 256 << 20),
        ),
        (
            "ring hostalloc 16 MiB x4, pool threads",
            ring(RingMemory::HostAlloc, 16, 4, 0),
        ),
        (
            "ring hostalloc 64 MiB x4, 16 thr",
            ring(RingMemory::HostAlloc, 64, 4, 16),
        ),
        (
            "ring huge 64 MiB x4, 16 thr",
            ring(RingMemory::HugeRegistered, 64, 4, 16),
        ),
        (
            "ring huge 64 MiB x8, 16 thr",
            ring(RingMemory::HugeRegistered, 64, 8, 16),
        ),
        (
            "ring huge 32 MiB x8, 8 thr",
            ring(RingMemory::HugeRegistered, 32, 8, 8),
        ),
    ]
}

/// The variants also timed with `release_pages` on, by name.
const WITH_RELEASE: [&str; 3] = [
    "registered 8 thr, teardown inline (default)",
    "registered 8 thr, teardown background",
    "ring huge 64 MiB x4, 16 thr",
];

/// Read `path` whole into the page cache (untimed): 16 threads, 64 MiB each.
fn read_back(path: &Path) -> Result<(), CudaError> {
    let io = |source| CudaError::Io {
        path: path.to_path_buf(),
        source,
    };
    let f = File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let piece = 64u64 << 20;
    let n = len.div_ceil(piece);
    (0..n)
        .into_par_iter()
        .try_for_each(|i| {
            let mut buf = vec![0u8; piece as usize];
            let off = i * piece;
            let want = (len - off).min(piece) as usize;
            f.read_exact_at(&mut buf[..want], off)
        })
        .map_err(io)
}

/// One timed staging; with a background teardown, its own wall (after
/// waiting for it) as the third value.
fn once(
    kit: &DeviceKit,
    file: &Path,
    o: &StagingOptions,
) -> Result<(DeviceWeights, StagingReport, f64), CudaError> {
    let (w, r) = staging::stage_file(&kit.gpu, file, o)?;
    let (own, _) = settle_teardowns();
    Ok((w, r, own))
}

/// The sweep's rows for one file; with `compare`, every variant's first
/// staging with `release_pages` off is compared byte for byte with the
/// default reader's (the first variant's).
fn sweep_file(
    kit: &DeviceKit,
    label: &str,
    file: &Path,
    compare: bool,
    rows: &mut Vec<String>,
) -> Result<(), CudaError> {
    let mut reference: Option<DeviceWeights> = None;
    let names: Vec<String> = staging::file_extents(file)?
        .into_iter()
        .map(|e| e.name)
        .collect();
    let mut runs = vec![(false, REPS)];
    runs.push((true, RELEASE_REPS));
    for (release, reps) in runs {
        for (name, mut o) in variants() {
            if release && !WITH_RELEASE.contains(&name) {
                continue;
            }
            o.release_pages = release;
            let (mut gbps, mut pin, mut down, mut own) = (vec![], vec![], vec![], vec![]);
            let mut differ = None;
            for rep in 0..reps {
                if release {
                    read_back(file)?;
                }
                let (w, r, bg) = once(kit, file, &o)?;
                gbps.push(r.gbps());
                pin.push(r.pin_s);
                down.push(r.teardown_s);
                own.push(bg);
                if compare && rep == 0 && !release {
                    match &reference {
                        None => {
                            differ = Some(0);
                            reference = Some(w);
                        }
                        Some(base) => {
                            let mut d = 0;
                            for n in &names {
                                if w.download(&kit.gpu, n)? != base.download(&kit.gpu, n)? {
                                    d += 1;
                                }
                            }
                            differ = Some(d);
                        }
                    }
                }
            }
            let row = format!(
                "staging sweep {label:<10} {:<46} release {:<3} {:>6.2} GB/s  pin {:.3} s  teardown {:.3} s  background teardown {:.3} s  (min {:.2}, max {:.2} GB/s){}",
                name,
                if release { "on" } else { "off" },
                median(gbps.clone()),
                median(pin),
                median(down),
                median(own),
                gbps.iter().copied().fold(f64::INFINITY, f64::min),
                gbps.iter().copied().fold(0.0, f64::max),
                match differ {
                    Some(d) => format!("; {d} of {} tensors differ from the default's", names.len()),
                    None => String::new(),
                }
            );
            eprintln!("{row}");
            rows.push(row);
        }
    }
    Ok(())
}

/// Run the sweep over both files; returns the rows (printed last).
pub fn sweep(kit: &DeviceKit, scratch: &Path) -> Result<Vec<String>, CudaError> {
    let mut rows = vec!["== staging sweep (issue 37: >= 45 GB/s warm) ==".to_string()];
    let t0 = Instant::now();
    let dit = scratch.join("staging-ltxv-2b-transformer.safetensors");
    let dit_bytes = write_synth_safetensors(&dit, &DitDims::LTXV_2B.tensor_specs(), 7)?;
    let t5 = scratch.join("staging-t5-xxl.safetensors");
    let t5_bytes = crate::cuda::fixtures::t5::write_t5_file(&t5, &crate::presets::t5_xxl(), 5)?;
    eprintln!(
        "staging sweep: wrote {:.2} GB and {:.2} GB in {:.1} s",
        dit_bytes as f64 / 1e9,
        t5_bytes as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    let r = sweep_file(kit, "ltxv-2b", &dit, true, &mut rows)
        .and_then(|_| sweep_file(kit, "t5-xxl", &t5, false, &mut rows));
    let ceiling = pinned_copy_gbps(&kit.gpu, dit_bytes as usize);
    let _ = std::fs::remove_file(&dit);
    let _ = std::fs::remove_file(&t5);
    r?;
    rows.push(format!(
        "staging sweep pinned copy ceiling ({:.2} GB) {:>6.2} GB/s",
        dit_bytes as f64 / 1e9,
        ceiling?
    ));
    Ok(rows)
}
