//! Staging's host-side variants (`selftest-cuda --only staging`): every way
//! the batched method reaches the copy engine places the file's bytes exactly
//! (tolerance 0), and says where its host time went.
//!
//! The file is ~185 MB of 48 bf16 tensors whose sizes are not multiples of any
//! chunk, so the registered reader's 64 MiB chunks and the rings' small
//! buffers all cut tensors. Every variant's weights stay alive until all are
//! compared, so no arena can reuse an earlier one's memory and pass by
//! holding its bytes.

use std::path::Path;

use crate::cuda::fixtures::write_synth_safetensors;
use crate::cuda::kit::DeviceKit;
use crate::cuda::selftest::Check;
use crate::cuda::staging::{
    self, settle_teardowns, DeviceWeights, Reader, RingMemory, StagingMethod, StagingOptions,
    StagingReport, Teardown,
};
use crate::cuda::CudaError;
use crate::weights::{DType, TensorSpec};

/// The check file's tensors: 48 bf16 matrices of 1531 rows and 1024..1524
/// columns (3.1-4.7 MB each, ~185 MB in all).
fn specs() -> Vec<TensorSpec> {
    (0..48)
        .map(|i| {
            TensorSpec::new(
                format!("t{i:02}"),
                &[1531, 1024 + (i * 37) % 500],
                DType::BF16,
            )
        })
        .collect()
}

/// Each variant of the batched method the sweep times, by name.
fn variants() -> Vec<(&'static str, StagingOptions)> {
    let base = StagingOptions::new(StagingMethod::Batched);
    let mut out = vec![("registered, teardown inline", base.clone())];
    let mut o = base.clone();
    o.register_chunk_bytes = 3 << 20;
    out.push(("registered, 3 MiB chunks", o));
    let mut o = base.clone();
    o.teardown = Teardown::Background;
    o.release_pages = true;
    out.push(("registered, teardown background, release-pages", o));
    let mut o = base.clone();
    o.reader = Reader::PinnedRing;
    o.chunk_bytes = 4 << 20;
    out.push(("ring hostalloc 4 MiB x4", o));
    let mut o = base.clone();
    o.reader = Reader::PinnedRing;
    o.ring_memory = RingMemory::HugeRegistered;
    o.chunk_bytes = 5 << 20;
    o.threads = 3;
    out.push(("ring huge 5 MiB x4, 3 thr", o));
    let mut o = base;
    o.reader = Reader::PinnedRing;
    o.ring_memory = RingMemory::HugeRegistered;
    o.chunk_bytes = 64 << 20;
    o.buffers = 2;
    o.release_pages = true;
    out.push(("ring huge 64 MiB x2, release-pages", o));
    out
}

/// Whether a report's host split is the one its options promise: a teardown
/// on the staging's thread is timed there, a background one is not; a ring
/// pins its buffers before reading.
fn split_as_promised(o: &StagingOptions, r: &StagingReport, background_own: f64) -> bool {
    let timed_here = r.teardown_s > 0.0 && r.teardown_s <= r.seconds;
    let pinned = r.pin_s > 0.0;
    match (o.reader, o.teardown) {
        (Reader::Registered, Teardown::Background) => {
            r.teardown_s == 0.0 && background_own > 0.0 && pinned
        }
        _ => timed_here && pinned && background_own == 0.0,
    }
}

/// The checks (one row per variant), the file written under `scratch`.
pub fn check_staging_variants(
    kit: &DeviceKit,
    scratch: &Path,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let file = scratch.join("staging-variants.safetensors");
    write_synth_safetensors(&file, &specs(), 11)?;
    let raw = std::fs::read(&file).map_err(|source| CudaError::Io {
        path: file.clone(),
        source,
    })?;
    let tensors = staging::file_extents(&file)?;
    let mut kept: Vec<DeviceWeights> = Vec::new();
    for (name, o) in variants() {
        let (w, r) = staging::stage(&kit.gpu, &tensors, &o)?;
        let (own, _) = settle_teardowns();
        let mut differ = 0usize;
        for t in &tensors {
            if w.download(&kit.gpu, &t.name)? != raw[t.offset as usize..][..t.bytes] {
                differ += 1;
            }
        }
        let split = split_as_promised(&o, &r, own);
        out.push(Check {
            name: format!("staging {name} vs file ({} tensors)", tensors.len()),
            rel: differ as f64,
            max_abs: 0.0,
            tol: 0.0,
            pass: differ == 0 && !tensors.is_empty() && split,
            note: format!(
                "{differ} differ; {:.2} GB/s, pin {:.4} s, teardown {:.4} s, background {:.4} s{}",
                r.gbps(),
                r.pin_s,
                r.teardown_s,
                own,
                if split {
                    ""
                } else {
                    "; the host split is not the one the options promise"
                }
            ),
        });
        kept.push(w);
    }
    drop(kept);
    let _ = std::fs::remove_file(&file);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(seconds: f64, pin_s: f64, teardown_s: f64) -> StagingReport {
        StagingReport {
            method: StagingMethod::Batched,
            bytes: 1,
            seconds,
            device_ms: 0.0,
            files: 1,
            copies: 1,
            allocations: 1,
            windows: 1,
            bounce_bytes: 0,
            pin_s,
            teardown_s,
        }
    }

    /// Red on: a background teardown timed on the staging's thread, an inline
    /// one left untimed or outside the staging's wall, or a variant that
    /// pinned nothing passing.
    #[test]
    fn the_host_split_is_judged_by_where_the_teardown_ran() {
        let inline = StagingOptions::new(StagingMethod::Batched);
        let mut bg = inline.clone();
        bg.teardown = Teardown::Background;
        assert!(split_as_promised(&inline, &report(0.3, 0.1, 0.05), 0.0));
        assert!(!split_as_promised(&inline, &report(0.3, 0.1, 0.0), 0.0));
        assert!(!split_as_promised(&inline, &report(0.3, 0.1, 0.4), 0.0));
        assert!(!split_as_promised(&inline, &report(0.3, 0.0, 0.05), 0.0));
        assert!(!split_as_promised(&inline, &report(0.3, 0.1, 0.05), 0.02));
        assert!(split_as_promised(&bg, &report(0.3, 0.1, 0.0), 0.05));
        assert!(!split_as_promised(&bg, &report(0.3, 0.1, 0.05), 0.05));
        assert!(!split_as_promised(&bg, &report(0.3, 0.1, 0.0), 0.0));
        let mut ring = inline.clone();
        ring.reader = Reader::PinnedRing;
        ring.teardown = Teardown::Background; // the ring tears down in place
        assert!(split_as_promised(&ring, &report(0.3, 0.1, 0.05), 0.0));
        assert!(!split_as_promised(&ring, &report(0.3, 0.1, 0.0), 0.05));
    }

    /// Red on: a check file whose tensors are all one size or line up with
    /// the chunks (the straddling is what the rows check).
    #[test]
    fn the_check_file_cuts_across_every_chunk_size() {
        let s = specs();
        let bytes: Vec<usize> = s.iter().map(|t| t.nbytes()).collect();
        let total: usize = bytes.iter().sum();
        assert!(
            total > 128 << 20,
            "{total}: more than two registered chunks"
        );
        // The docs' figures: ~185 MB, 3.1-4.7 MB a tensor.
        assert!((184_000_000..186_000_000).contains(&total), "{total}");
        assert!(bytes.iter().all(|b| (3_100_000..4_700_000).contains(b)));
        for chunk in [3usize << 20, 4 << 20, 5 << 20, 64 << 20] {
            assert!(bytes.iter().all(|b| b % chunk != 0));
        }
        let mut distinct = bytes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 10);
    }
}
