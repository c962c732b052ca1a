//! Weights from a safetensors file onto the device, in two switchable arms
//! (lever `staging`):
//!
//! - [`StagingMethod::Serial`] (baseline, the seed's pattern): per tensor, a
//!   pageable host copy, its own `cuMemAlloc`, a synchronous copy and a
//!   context synchronize: one round trip per tensor.
//! - [`StagingMethod::Batched`] (default): ONE device arena per model; the file is
//!   read straight into a ring of pinned host buffers by several threads
//!   (positional reads, no pageable intermediate), and each filled buffer's
//!   pieces are copied asynchronously on the copy stream while the next buffer
//!   is read. A buffer is refilled only after the event recorded behind its
//!   copies has completed.
//!
//! The batched method's default reader registers the file's read-only mapping with
//! the driver chunk by chunk on several threads and copies straight from the page
//! cache ([`Reader::Registered`]); the pinned ring is its fallback.
//!
//! A model's tensors may span several files (the shards of a sharded checkpoint,
//! or the transformer's part of a Lightricks single file): [`stage`] takes their
//! [`Extent`]s from the validated [`crate::weights::safetensors::SafetensorsSource`]
//! and the batched method places all of them in ONE arena, file after file.
//!
//! With `release_pages` the file's page cache is dropped
//! (`posix_fadvise(DONTNEED)`) range by range once its bytes are out of it.
//! Both arms place the same bytes under the same names: [`DeviceWeights::download`]
//! reads any tensor back for the byte comparison.
//!
//! [`stage_split`] stages a model some of whose tensors only pass through on
//! their way to another form (the DiT's block Linears on `precision = fp8`,
//! quantized to e4m3): those go window by window through one bounded bounce
//! buffer instead of the resident arena, with the same readers and the same
//! bytes over the wire.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use cudarc::driver::result as dres;
use cudarc::driver::sys::{self as dsys, CUdeviceptr};
use rayon::prelude::*;

use crate::cuda::kit::context::Gpu;
use crate::cuda::kit::memory::{align_up, DeviceBuffer};
use crate::cuda::{CudaError, DriverContext};
use crate::weights::safetensors::{Extent, LoadOptions, SafetensorsSource};
use crate::weights::{DType, WeightError};

/// What opening the device arm did (for the `load.dit` close).
#[derive(Debug, Clone)]
pub struct OpenReport {
    /// Seconds to open the GPU, load the kernels and create the GEMM handle.
    pub device_open_s: f64,
    /// Those seconds part by part.
    pub opened: crate::cuda::kit::OpenTimes,
    /// The staging run.
    pub staging: StagingReport,
}

/// How the tensors reach the device: the `staging` lever's arms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StagingMethod {
    /// Per-tensor alloc + pageable copy + synchronize (the baseline).
    Serial,
    /// One arena, parallel reads into pinned buffers, async copies (the default).
    Batched,
}

impl StagingMethod {
    /// The `staging` lever's arm that selects it.
    pub fn name(self) -> &'static str {
        match self {
            StagingMethod::Serial => "serial",
            StagingMethod::Batched => "batched",
        }
    }
}

/// How to stage.
#[derive(Debug, Clone)]
pub struct StagingOptions {
    /// The method.
    pub method: StagingMethod,
    /// Drop the file's page cache after its bytes are copied out.
    pub release_pages: bool,
    /// Reader threads of the batched method (0: one per core).
    pub threads: usize,
    /// Bytes per pinned buffer of the batched method.
    pub chunk_bytes: usize,
    /// Pinned buffers in the ring of the batched method (>= 2 to overlap).
    pub buffers: usize,
    /// How the batched method gets the file's bytes to the copy engine.
    pub reader: Reader,
    /// Bytes per registration of the registered reader.
    pub register_chunk_bytes: usize,
    /// Where the registered reader's host-side teardown runs.
    pub teardown: Teardown,
    /// What the pinned ring's buffers are made of.
    pub ring_memory: RingMemory,
}

/// Where the registered reader undoes its host side once the last copy has
/// completed: unregistering the mapping's chunks and, with `release_pages`,
/// dropping the file's pages and unmapping it. The device bytes are the same
/// either way; only when the host work happens differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Teardown {
    /// On the staging's own thread, before [`stage`] returns (inside its
    /// `seconds`; [`StagingReport::teardown_s`] says how long).
    Inline,
    /// On a thread of its own, started when the last copy has completed:
    /// [`stage`] returns with the weights usable while the host work goes on;
    /// [`settle_teardowns`] waits for it (a load calls it before its phase
    /// closes, so `release_pages` still holds by the end of the load).
    Background,
}

/// The pinned ring's host buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingMemory {
    /// `cuMemHostAlloc` (the driver pins 4 KiB pages).
    HostAlloc,
    /// Anonymous memory advised onto 2 MiB transparent huge pages, touched
    /// once per huge page, then registered with `cuMemHostRegister` (512
    /// times fewer pages to pin where the kernel grants huge pages).
    HugeRegistered,
}

/// The batched method's host side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// Positional reads by several threads into a ring of pinned buffers.
    PinnedRing,
    /// The file's read-only mapping registered with the driver chunk by chunk
    /// by several threads (`cuMemHostRegister`), each chunk's pieces copied
    /// straight from the page cache; falls back to [`Reader::PinnedRing`] when
    /// the driver refuses the registration.
    Registered,
}

impl StagingOptions {
    /// The defaults for `method`: the registered reader (faster than the pinned
    /// ring, bytes identical), and for the ring 4 buffers of 16 MiB (larger
    /// buffers lose to their pinned allocation), one reader per core; chosen
    /// from the staging sweeps of `reports/device-notes.md` (runs 2 and 4).
    pub fn new(method: StagingMethod) -> StagingOptions {
        StagingOptions {
            method,
            release_pages: false,
            threads: 0,
            chunk_bytes: 16 << 20,
            buffers: 4,
            reader: Reader::Registered,
            register_chunk_bytes: REGISTER_CHUNK,
            teardown: Teardown::Inline,
            ring_memory: RingMemory::HostAlloc,
        }
    }
}

/// A staged tensor.
#[derive(Debug, Clone)]
pub struct Staged {
    /// Device address.
    pub ptr: CUdeviceptr,
    /// Bytes.
    pub bytes: usize,
    /// Storage type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

enum Storage {
    Arena(#[allow(dead_code)] DeviceBuffer),
    PerTensor(#[allow(dead_code)] Vec<DeviceBuffer>),
    /// A view of memory someone else holds ([`stage_split`]'s bounce).
    Borrowed,
}

/// A model's weights on the device, by checkpoint name.
pub struct DeviceWeights {
    _storage: Storage,
    tensors: HashMap<String, Staged>,
    file: PathBuf,
    bytes: u64,
}

impl DeviceWeights {
    /// Weights held elsewhere (device-generated synthetic weights): the caller
    /// keeps `arena` alive through this value.
    pub fn from_arena(
        arena: DeviceBuffer,
        tensors: HashMap<String, Staged>,
        origin: &str,
    ) -> DeviceWeights {
        let bytes = tensors.values().map(|t| t.bytes as u64).sum();
        DeviceWeights {
            _storage: Storage::Arena(arena),
            tensors,
            file: PathBuf::from(origin),
            bytes,
        }
    }

    /// The tensor `name`, checked to have `shape` and to be bf16.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<&Staged, CudaError> {
        let t = self.tensors.get(name).ok_or_else(|| {
            CudaError::Weights(WeightError::Missing {
                name: name.to_string(),
                file: self.file.clone(),
                expected: shape.to_vec(),
            })
        })?;
        if t.shape != shape {
            return Err(CudaError::Weights(WeightError::Shape {
                name: name.to_string(),
                file: self.file.clone(),
                expected: shape.to_vec(),
                found: t.shape.clone(),
            }));
        }
        if t.dtype != DType::BF16 {
            return Err(CudaError::Weights(WeightError::DType {
                name: name.to_string(),
                file: self.file.clone(),
                expected: "BF16 (the device arm computes on bf16 weights)".into(),
                found: t.dtype.safetensors_name().into(),
            }));
        }
        Ok(t)
    }

    /// Every tensor name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Total tensor bytes staged.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The device bytes of tensor `name` (synchronous; for checks).
    pub fn download(&self, gpu: &Gpu, name: &str) -> Result<Vec<u8>, CudaError> {
        let t = self.tensors.get(name).ok_or_else(|| {
            CudaError::Weights(WeightError::Missing {
                name: name.to_string(),
                file: self.file.clone(),
                expected: vec![],
            })
        })?;
        crate::cuda::kit::memory::download::<u8>(gpu, t.ptr, t.bytes)
    }
}

/// What a staging run did.
#[derive(Debug, Clone)]
pub struct StagingReport {
    /// The method.
    pub method: StagingMethod,
    /// Tensor bytes copied to the device.
    pub bytes: u64,
    /// Wall seconds, from the first read to the last copy completed.
    pub seconds: f64,
    /// Milliseconds between CUDA events recorded on the copy stream before the
    /// first copy and after the last one completed (the span on the device's clock).
    pub device_ms: f64,
    /// Files read.
    pub files: usize,
    /// Host-to-device copies issued.
    pub copies: usize,
    /// Device allocations made (a split staging's bounce buffer included).
    pub allocations: usize,
    /// Windows the tensors went in: 1 for [`stage`], one per refill of the
    /// bounce buffer for [`stage_split`].
    pub windows: usize,
    /// Bytes of [`stage_split`]'s bounce buffer (held during the staging only;
    /// 0 for [`stage`]).
    pub bounce_bytes: u64,
    /// Seconds pinning host memory: the registered reader's registrations
    /// summed over its threads (thread-seconds, overlapping the copies), or the
    /// pinned ring's allocation (wall, before its first read). 0 for serial.
    pub pin_s: f64,
    /// Wall seconds, inside `seconds`, after the last copy completed: undoing
    /// the host side (unregistering, freeing the ring, and with `release_pages`
    /// dropping the pages and unmapping). 0 when [`Teardown::Background`] moved
    /// the registered reader's teardown off the staging's thread.
    pub teardown_s: f64,
}

/// What a batched staging's host side cost beside its reads and copies (see
/// [`StagingReport::pin_s`] and [`StagingReport::teardown_s`]), in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostCost {
    /// Seconds pinning host memory.
    pub pin_s: f64,
    /// Wall seconds of the teardown on the staging's thread.
    pub teardown_s: f64,
}

impl std::ops::AddAssign for HostCost {
    fn add_assign(&mut self, o: HostCost) {
        self.pin_s += o.pin_s;
        self.teardown_s += o.teardown_s;
    }
}

impl StagingReport {
    /// Throughput in GB/s (1e9 bytes per second).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-12) / 1e9
    }
}

/// The extents of every tensor of one safetensors file, under the names it
/// stores (headers parsed and bounds-checked by [`SafetensorsSource`]).
pub fn file_extents(path: &Path) -> Result<Vec<Extent>, CudaError> {
    let src = SafetensorsSource::open(
        "weights",
        &[path.to_path_buf()],
        &|n, _| Some(n.to_string()),
        LoadOptions::default(),
    )?;
    Ok(src.extents()?)
}

/// Stage every tensor of the safetensors file at `path` onto `gpu`.
pub fn stage_file(
    gpu: &Gpu,
    path: &Path,
    opts: &StagingOptions,
) -> Result<(DeviceWeights, StagingReport), CudaError> {
    stage(gpu, &file_extents(path)?, opts)
}

/// Where each tensor goes in a model's arena: file order, each on an
/// [`crate::cuda::kit::memory::ALIGN`] boundary. Returns (offsets, total bytes).
pub fn arena_layout(tensors: &[Extent]) -> (Vec<usize>, usize) {
    let mut offs = Vec::with_capacity(tensors.len());
    let mut total = 0usize;
    for t in tensors {
        let o = align_up(total);
        offs.push(o);
        total = o + t.bytes;
    }
    (offs, total)
}

/// Device bytes staging `tensors` allocates in `arm` (the arena, or one
/// allocation per tensor of at least one byte).
pub fn device_bytes(tensors: &[Extent], arm: StagingMethod) -> u64 {
    match arm {
        StagingMethod::Batched => arena_layout(tensors).1.max(1) as u64,
        StagingMethod::Serial => tensors.iter().map(|t| t.bytes.max(1) as u64).sum(),
    }
}

/// One file's tensors: (path, index range into the extents).
fn by_file(tensors: &[Extent]) -> Vec<(PathBuf, std::ops::Range<usize>)> {
    let mut out: Vec<(PathBuf, std::ops::Range<usize>)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        match out.last_mut() {
            Some((p, r)) if *p == t.file => r.end = i + 1,
            _ => out.push((t.file.clone(), i..i + 1)),
        }
    }
    out
}

/// A copy of part of one tensor: `len` bytes from file offset `src` to arena
/// offset `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index of the tensor.
    pub tensor: usize,
    /// Absolute file offset of the first byte.
    pub src: u64,
    /// Arena offset of the first byte.
    pub dst: usize,
    /// Bytes.
    pub len: usize,
}

/// The pieces of the tensors of one file (`tensors`, sorted by offset, arena
/// offsets `offs`) that lie in the file range `[lo, hi)`.
pub fn pieces(tensors: &[Extent], offs: &[usize], lo: u64, hi: u64) -> Vec<Piece> {
    // From the last tensor starting at or before lo.
    let mut j = tensors
        .partition_point(|t| t.offset <= lo)
        .saturating_sub(1);
    let mut out = Vec::new();
    while j < tensors.len() && tensors[j].offset < hi {
        let t = &tensors[j];
        let (s, e) = (t.offset.max(lo), (t.offset + t.bytes as u64).min(hi));
        if e > s {
            out.push(Piece {
                tensor: j,
                src: s,
                dst: offs[j] + (s - t.offset) as usize,
                len: (e - s) as usize,
            });
        }
        j += 1;
    }
    out
}

/// Queue the copies of the pieces of `[lo, lo + src.len())` on the copy
/// stream; `src` holds exactly those file bytes and must stay untouched until
/// the copies complete. Returns the copies queued.
fn queue_pieces(
    gpu: &Gpu,
    tensors: &[Extent],
    offs: &[usize],
    arena: CUdeviceptr,
    lo: u64,
    src: &[u8],
) -> Result<usize, CudaError> {
    let ps = pieces(tensors, offs, lo, lo + src.len() as u64);
    for p in &ps {
        let from = &src[(p.src - lo) as usize..][..p.len];
        // SAFETY: the destination lies inside the arena slot of tensor p.tensor;
        // the caller keeps `src` alive and unchanged until the copy completes.
        unsafe { dres::memcpy_htod_async(arena + p.dst as u64, from, gpu.copy.cu_stream()) }
            .ctx(format!("queueing the copy of '{}'", tensors[p.tensor].name))?;
    }
    Ok(ps.len())
}

fn io(path: &Path, source: std::io::Error) -> CudaError {
    CudaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Drop the page cache of `len` bytes at `offset` of `f` (advice only: errors
/// are ignored, the data is already out).
fn release(f: &File, offset: u64, len: u64) {
    // SAFETY: plain advice on an open descriptor.
    unsafe {
        libc::posix_fadvise(
            f.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

/// Where the tensors of several files came from: the one file, or the folder
/// of the first (for errors).
fn origin_of(files: &[(PathBuf, std::ops::Range<usize>)]) -> PathBuf {
    match files {
        [(one, _)] => one.clone(),
        _ => files
            .first()
            .and_then(|(p, _)| p.parent())
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    }
}

/// The batched method's copies of `tensors` (file order), file by file with
/// `opts.reader` (the pinned ring where the driver refuses a registration):
/// tensor `j` lands at `base + offs[j]` (an arena's address and offsets in it,
/// or 0 and absolute device addresses). Returns the copies queued (all of them
/// have completed on return) and what the host side cost beside them.
fn copy_batched(
    gpu: &Gpu,
    tensors: &[Extent],
    offs: &[usize],
    base: CUdeviceptr,
    opts: &StagingOptions,
) -> Result<(usize, HostCost), CudaError> {
    let mut copies = 0;
    let mut cost = HostCost::default();
    for (path, r) in &by_file(tensors) {
        let (ts, os) = (&tensors[r.clone()], &offs[r.clone()]);
        let registered = match opts.reader {
            Reader::Registered => stage_registered(gpu, path, ts, os, base, opts)?,
            Reader::PinnedRing => None,
        };
        let (n, c) = match registered {
            Some(done) => done,
            None => stage_ring(gpu, path, ts, os, base, opts)?,
        };
        copies += n;
        cost += c;
    }
    Ok((copies, cost))
}

/// Stage `tensors` (extents of one model, possibly over several files, from
/// [`SafetensorsSource::extents`]) onto `gpu` with `opts`.
pub fn stage(
    gpu: &Gpu,
    tensors: &[Extent],
    opts: &StagingOptions,
) -> Result<(DeviceWeights, StagingReport), CudaError> {
    gpu.bind()?;
    let files = by_file(tensors);
    let origin = origin_of(&files);
    let t0 = Instant::now();
    let ev0 = gpu.event()?;
    ev0.record(&gpu.copy).ctx("recording the staging start")?;
    let (storage, ptrs, copies, allocations, cost) = match opts.method {
        StagingMethod::Serial => {
            let (bufs, ptrs) = copy_serial(gpu, tensors, &|_| None, opts)?;
            let n = bufs.len();
            (Storage::PerTensor(bufs), ptrs, n, n, HostCost::default())
        }
        StagingMethod::Batched => {
            let (offs, total) = arena_layout(tensors);
            let arena = DeviceBuffer::alloc(
                gpu,
                total,
                &format!("the weights arena of {}", origin.display()),
            )?;
            let (copies, cost) = copy_batched(gpu, tensors, &offs, arena.ptr(), opts)?;
            let ptrs = offs.iter().map(|o| arena.ptr() + *o as u64).collect();
            (Storage::Arena(arena), ptrs, copies, 1, cost)
        }
    };
    let ev1 = gpu.event()?;
    ev1.record(&gpu.copy).ctx("recording the staging end")?;
    ev1.synchronize().ctx("waiting for the staging end")?;
    let device_ms = ev0.elapsed_ms(&ev1).ctx("reading the staging events")? as f64;
    let mut map = HashMap::with_capacity(tensors.len());
    let mut bytes = 0u64;
    for (t, ptr) in tensors.iter().zip(ptrs) {
        map.insert(t.name.clone(), staged(t, ptr));
        bytes += t.bytes as u64;
    }
    let report = StagingReport {
        method: opts.method,
        bytes,
        seconds: t0.elapsed().as_secs_f64(),
        device_ms,
        files: files.len(),
        copies,
        allocations,
        windows: 1,
        bounce_bytes: 0,
        pin_s: cost.pin_s,
        teardown_s: cost.teardown_s,
    };
    Ok((
        DeviceWeights {
            _storage: storage,
            tensors: map,
            file: origin,
            bytes,
        },
        report,
    ))
}

fn staged(t: &Extent, ptr: CUdeviceptr) -> Staged {
    Staged {
        ptr,
        bytes: t.bytes,
        dtype: t.dtype,
        shape: t.shape.clone(),
    }
}

/// The windows of a split staging ([`stage_split`]): consecutive ranges of
/// `tensors` (in file order) that together cover every index once, in order.
/// A window holds transient tensors (`transient[i]`) whose bounce layout
/// ([`arena_layout`] of the window's transient tensors alone) is at most
/// `bound` bytes, or exactly one transient tensor larger than `bound`; the
/// kept tensors between them ride in whichever window is open when they come.
/// Each window is one contiguous range of its files: staged window by window,
/// the files are read once.
pub fn plan_windows(
    tensors: &[Extent],
    transient: &[bool],
    bound: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut used, mut held) = (0usize, 0usize, 0usize);
    for (i, t) in tensors.iter().enumerate() {
        if !transient.get(i).copied().unwrap_or(false) {
            continue;
        }
        let next = align_up(used) + t.bytes;
        if held > 0 && next > bound {
            out.push(start..i);
            (start, used, held) = (i, t.bytes, 1);
        } else {
            (used, held) = (next, held + 1);
        }
    }
    if start < tensors.len() {
        out.push(start..tensors.len());
    }
    out
}

/// Bytes of the one bounce buffer a split staging allocates for transient
/// tensors of `bytes` each with windows planned under `bound`: the larger of
/// `bound` and the largest tensor (aligned), but never more than all of them
/// laid out together; 0 when there are none. Every window of [`plan_windows`]
/// fits it, whatever the file order.
pub fn bounce_capacity(bytes: impl IntoIterator<Item = usize>, bound: usize) -> usize {
    let (mut largest, mut all) = (0usize, 0usize);
    for b in bytes {
        largest = largest.max(align_up(b));
        all += align_up(b);
    }
    bound.max(largest).min(all)
}

/// Stage `tensors` as [`stage`] does, except the ones `transient` marks: those
/// are never resident. The tensors go window by window ([`plan_windows`] under
/// `bound`, in file order, so every file is read once): each window's kept
/// tensors land where [`stage`] would put them (one arena for the batched
/// method, one allocation each for the serial one), its transient tensors in
/// ONE bounce buffer of [`bounce_capacity`] bytes allocated for the whole run;
/// then `consume` gets them (a view of the bounce, valid during the call only:
/// it must be done reading them, on every stream, when it returns) and the
/// next window refills the bounce. The bounce is freed before this returns.
///
/// Returns the kept tensors and the report of the whole run: `bytes` and
/// `copies` count every tensor, transient ones included (what goes over the
/// wire is unchanged: only where it stays differs); `seconds` and `device_ms`
/// leave out the time inside `consume`; `allocations` counts the bounce.
pub fn stage_split(
    gpu: &Gpu,
    tensors: &[Extent],
    opts: &StagingOptions,
    transient: &[bool],
    bound: usize,
    consume: &mut dyn FnMut(&DeviceWeights) -> Result<(), CudaError>,
) -> Result<(DeviceWeights, StagingReport), CudaError> {
    if transient.len() != tensors.len() {
        return Err(CudaError::Invalid(format!(
            "split staging: {} transient flags for {} tensors",
            transient.len(),
            tensors.len()
        )));
    }
    gpu.bind()?;
    let files = by_file(tensors);
    let origin = origin_of(&files);
    let t0 = Instant::now();
    let kept: Vec<usize> = (0..tensors.len()).filter(|i| !transient[*i]).collect();
    let cap = bounce_capacity(
        tensors
            .iter()
            .zip(transient)
            .filter(|(_, t)| **t)
            .map(|(e, _)| e.bytes),
        bound,
    );
    // Where each kept tensor goes in the arena (batched), by tensor index.
    let mut home: Vec<Option<usize>> = vec![None; tensors.len()];
    let arena = match opts.method {
        StagingMethod::Batched => {
            let ext: Vec<Extent> = kept.iter().map(|i| tensors[*i].clone()).collect();
            let (offs, total) = arena_layout(&ext);
            for (i, o) in kept.iter().zip(offs) {
                home[*i] = Some(o);
            }
            Some(DeviceBuffer::alloc(
                gpu,
                total,
                &format!("the weights arena of {}", origin.display()),
            )?)
        }
        StagingMethod::Serial => None,
    };
    let bounce = match cap {
        0 => None,
        _ => Some(DeviceBuffer::alloc(
            gpu,
            cap,
            &format!("the staging bounce buffer of {}", origin.display()),
        )?),
    };
    let mut ptrs: Vec<CUdeviceptr> = vec![0; tensors.len()];
    let mut bufs = Vec::new();
    let (mut copies, mut device_ms, mut consume_s, mut windows) = (0usize, 0.0f64, 0.0f64, 0);
    let mut cost = HostCost::default();
    for w in plan_windows(tensors, transient, bound) {
        let ts = &tensors[w.clone()];
        let moving: Vec<Extent> = w
            .clone()
            .filter(|i| transient[*i])
            .map(|i| tensors[i].clone())
            .collect();
        let (boffs, _) = arena_layout(&moving);
        let bounce_at = |k: usize| bounce.as_ref().map(|b| b.ptr() + boffs[k] as u64);
        // Each tensor's device address (absolute), or None: allocate it (serial).
        let mut dst: Vec<Option<CUdeviceptr>> = Vec::with_capacity(ts.len());
        let mut k = 0;
        for i in w.clone() {
            dst.push(if transient[i] {
                k += 1;
                Some(bounce_at(k - 1).ok_or_else(|| {
                    CudaError::Invalid("split staging: a transient tensor without a bounce".into())
                })?)
            } else {
                match (&arena, home[i]) {
                    (Some(a), Some(o)) => Some(a.ptr() + o as u64),
                    _ => None,
                }
            });
        }
        let ev0 = gpu.event()?;
        ev0.record(&gpu.copy)
            .ctx("recording a staging window's start")?;
        let placed = match opts.method {
            StagingMethod::Batched => {
                // Batched: every tensor has a home (the arena or the bounce);
                // one without is a bug here, never a copy to address 0.
                let placed = dst
                    .iter()
                    .zip(w.clone())
                    .map(|(d, i)| {
                        d.ok_or_else(|| {
                            CudaError::Invalid(format!(
                                "split staging: tensor '{}' has no place in the arena",
                                tensors[i].name
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let offs: Vec<usize> = placed.iter().map(|p| *p as usize).collect();
                let (n, c) = copy_batched(gpu, ts, &offs, 0, opts)?;
                copies += n;
                cost += c;
                placed
            }
            StagingMethod::Serial => {
                let (b, p) = copy_serial(gpu, ts, &|j| dst[j], opts)?;
                copies += ts.len();
                bufs.extend(b);
                p
            }
        };
        let ev1 = gpu.event()?;
        ev1.record(&gpu.copy)
            .ctx("recording a staging window's end")?;
        ev1.synchronize().ctx("waiting for a staging window")?;
        device_ms += ev0.elapsed_ms(&ev1).ctx("reading the staging events")? as f64;
        let mut view = HashMap::with_capacity(moving.len());
        for (i, p) in w.clone().zip(&placed) {
            ptrs[i] = *p;
            if transient[i] {
                view.insert(tensors[i].name.clone(), staged(&tensors[i], *p));
            }
        }
        let view = DeviceWeights {
            _storage: Storage::Borrowed,
            tensors: view,
            file: origin.clone(),
            bytes: moving.iter().map(|t| t.bytes as u64).sum(),
        };
        let tc = Instant::now();
        consume(&view)?;
        consume_s += tc.elapsed().as_secs_f64();
        windows += 1;
    }
    drop(bounce);
    let mut map = HashMap::with_capacity(kept.len());
    let mut bytes = 0u64;
    for i in &kept {
        map.insert(tensors[*i].name.clone(), staged(&tensors[*i], ptrs[*i]));
        bytes += tensors[*i].bytes as u64;
    }
    let allocations = match &arena {
        Some(_) => 1,
        None => bufs.len(),
    } + usize::from(cap > 0);
    let report = StagingReport {
        method: opts.method,
        bytes: tensors.iter().map(|t| t.bytes as u64).sum(),
        seconds: (t0.elapsed().as_secs_f64() - consume_s).max(0.0),
        device_ms,
        files: files.len(),
        copies,
        allocations,
        windows,
        bounce_bytes: cap as u64,
        pin_s: cost.pin_s,
        teardown_s: cost.teardown_s,
    };
    let storage = match arena {
        Some(a) => Storage::Arena(a),
        None => Storage::PerTensor(bufs),
    };
    Ok((
        DeviceWeights {
            _storage: storage,
            tensors: map,
            file: origin,
            bytes,
        },
        report,
    ))
}

/// The seed's pattern, per tensor of `tensors` (file order): a pageable host
/// copy, a synchronous copy and a full synchronize, into `dst(j)` for tensor
/// `j` where it names an address, else into the tensor's own new allocation.
/// Returns the allocations made and each tensor's device address.
fn copy_serial(
    gpu: &Gpu,
    tensors: &[Extent],
    dst: &dyn Fn(usize) -> Option<CUdeviceptr>,
    opts: &StagingOptions,
) -> Result<(Vec<DeviceBuffer>, Vec<CUdeviceptr>), CudaError> {
    let mut bufs = Vec::with_capacity(tensors.len());
    let mut ptrs = Vec::with_capacity(tensors.len());
    for (path, r) in &by_file(tensors) {
        let f = File::open(path).map_err(|source| io(path, source))?;
        for j in r.clone() {
            let t = &tensors[j];
            let mut host = vec![0u8; t.bytes];
            f.read_exact_at(&mut host, t.offset)
                .map_err(|source| io(path, source))?;
            let to = match dst(j) {
                Some(p) => p,
                None => {
                    let buf = DeviceBuffer::alloc(gpu, t.bytes, &format!("tensor '{}'", t.name))?;
                    let p = buf.ptr();
                    bufs.push(buf);
                    p
                }
            };
            // SAFETY: `to` holds t.bytes bytes (its own allocation, or a slot the
            // caller sized for it); `host` is alive for the call.
            unsafe { dres::memcpy_htod_sync(to, &host) }
                .ctx(format!("copying tensor '{}'", t.name))?;
            gpu.ctx
                .synchronize()
                .ctx("synchronizing after a tensor copy")?;
            if opts.release_pages {
                release(&f, t.offset, t.bytes as u64);
            }
            ptrs.push(to);
        }
    }
    Ok((bufs, ptrs))
}

/// Default chunk size of the registered reader (the sweep of run 3 in
/// `reports/device-notes.md`).
const REGISTER_CHUNK: usize = 64 << 20;
/// Default registration threads of the registered reader (page pinning
/// contends beyond a few threads: run 4's sweep in `reports/device-notes.md`).
const REGISTER_THREADS: usize = 8;
/// Page size the registered ranges are aligned to.
const PAGE: usize = 4096;

/// The batched method's registered reader for the tensors of one file: the file's
/// read-only mapping registered with the driver chunk by chunk by several
/// threads, each chunk's pieces copied straight from the page cache into the
/// arena. `None` when the driver refused the first registration (nothing was
/// copied; the caller falls back to the pinned ring). Returns the copies queued
/// and the host cost: the registrations' thread-seconds and, with
/// [`Teardown::Inline`], the teardown's wall.
fn stage_registered(
    gpu: &Gpu,
    path: &Path,
    tensors: &[Extent],
    offs: &[usize],
    arena: CUdeviceptr,
    opts: &StagingOptions,
) -> Result<Option<(usize, HostCost)>, CudaError> {
    let (start, end) = match (tensors.first(), tensors.last()) {
        (Some(a), Some(b)) => (a.offset as usize, b.offset as usize + b.bytes),
        _ => return Ok(Some((0, HostCost::default()))),
    };
    let f = File::open(path).map_err(|source| io(path, source))?;
    // SAFETY: read-only mapping of a file nobody writes while it is staged.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|source| io(path, source))?;
    let base = map.as_ptr() as usize;
    let first = start / PAGE * PAGE;
    let step = opts.register_chunk_bytes.max(PAGE) / PAGE * PAGE;
    let n_chunks = (end - first).div_ceil(step);
    let chunk = |i: usize| {
        let lo = first + i * step;
        (lo, (lo + step).min(map.len()))
    };
    // Nanoseconds inside cuMemHostRegister, summed over the threads.
    let pin_ns = AtomicU64::new(0);
    let register = |i: usize| {
        let (lo, hi) = chunk(i);
        let t = Instant::now();
        // SAFETY: a page-aligned range of the mapping, unregistered below.
        let r = unsafe {
            dsys::cuMemHostRegister_v2(
                (base + lo) as *mut std::ffi::c_void,
                hi - lo,
                dsys::CU_MEMHOSTREGISTER_READ_ONLY,
            )
        };
        pin_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    };
    // Probe with the first chunk: a refusal here costs nothing.
    if register(0) != dsys::CUresult::CUDA_SUCCESS {
        return Ok(None);
    }
    let registered = Mutex::new(vec![base + first]);
    let copies = AtomicUsize::new(0);
    let next = AtomicUsize::new(1);
    let copy_chunk = |i: usize| -> Result<(), CudaError> {
        let (lo, hi) = chunk(i);
        let (cs, ce) = (lo.max(start), hi.min(end));
        let n = queue_pieces(gpu, tensors, offs, arena, cs as u64, &map[cs..ce])?;
        copies.fetch_add(n, Ordering::Relaxed);
        Ok(())
    };
    let threads = if opts.threads == 0 {
        REGISTER_THREADS
    } else {
        opts.threads
    };
    let results: Vec<Result<(), CudaError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|w| {
                let (copy_chunk, register, next, registered) =
                    (&copy_chunk, &register, &next, &registered);
                sc.spawn(move || -> Result<(), CudaError> {
                    gpu.bind()?;
                    if w == 0 {
                        copy_chunk(0)?;
                    }
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= n_chunks {
                            return Ok(());
                        }
                        register(i)
                            .result()
                            .ctx("registering a chunk of the mapped weights file")?;
                        if let Ok(mut r) = registered.lock() {
                            r.push(base + chunk(i).0);
                        }
                        copy_chunk(i)?;
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(CudaError::Invalid("a staging thread panicked".into())))
            })
            .collect()
    });
    let sync = gpu.copy.synchronize().ctx("waiting for the staging copies");
    let chunks = registered.into_inner().unwrap_or_default();
    let host = RegisteredHost {
        map,
        file: f,
        chunks,
        release: opts.release_pages.then_some((start, end - start)),
    };
    let failed = results.iter().any(Result::is_err) || sync.is_err();
    let mut cost = HostCost {
        pin_s: pin_ns.into_inner() as f64 / 1e9,
        teardown_s: 0.0,
    };
    // A failed staging undoes its host side here, whatever the option says.
    if opts.teardown == Teardown::Background && !failed {
        let ctx = gpu.ctx.clone();
        let h = std::thread::spawn(move || {
            let t = Instant::now();
            // Unregistering needs the context current on this thread; without
            // it the chunks stay pinned until the process exits (nothing is lost).
            let _ = ctx.bind_to_thread();
            host.undo();
            t.elapsed().as_secs_f64()
        });
        if let Ok(mut p) = PENDING_TEARDOWNS.lock() {
            p.push(h);
        }
    } else {
        let t = Instant::now();
        host.undo();
        cost.teardown_s = t.elapsed().as_secs_f64();
    }
    for r in results {
        r?;
    }
    sync?;
    Ok(Some((copies.into_inner(), cost)))
}

/// What the registered reader holds on the host until its teardown: the
/// mapping, its file, the registered chunks' addresses, and the file range
/// whose pages `release_pages` drops.
struct RegisteredHost {
    map: memmap2::Mmap,
    file: File,
    chunks: Vec<usize>,
    release: Option<(usize, usize)>,
}

impl RegisteredHost {
    /// Unregister every chunk, drop the range's pages (when asked), unmap.
    /// Call only once every copy that reads the mapping has completed, on a
    /// thread where the staging's context is current.
    fn undo(self) {
        for p in &self.chunks {
            // SAFETY: registered by the reader; its copies have completed.
            unsafe {
                let _ = dsys::cuMemHostUnregister(*p as *mut std::ffi::c_void);
            }
        }
        if let Some((start, len)) = self.release {
            // The pages are still mapped into this process by `map` (the copies
            // read through it), and the kernel does not drop mapped pages on
            // fadvise alone: unmap them from our page tables first, then drop
            // them from the cache. (With a bare fadvise here the rung-2 campaign
            // 223c8a9b01c34e09 found the weights as cached during denoise with the
            // lever on as off.)
            crate::weights::residency::release_range(&self.map, &self.file, start, len);
        }
        drop(self.map);
    }
}

/// Teardowns [`Teardown::Background`] started and nobody has waited for yet.
static PENDING_TEARDOWNS: Mutex<Vec<std::thread::JoinHandle<f64>>> = Mutex::new(Vec::new());

/// Wait for every teardown [`Teardown::Background`] started in this process.
/// Returns their own wall seconds summed (0 when there were none) and the
/// seconds this call waited for them.
pub fn settle_teardowns() -> (f64, f64) {
    let t = Instant::now();
    let pending: Vec<_> = match PENDING_TEARDOWNS.lock() {
        Ok(mut p) => p.drain(..).collect(),
        Err(_) => Vec::new(),
    };
    let own: f64 = pending.into_iter().map(|h| h.join().unwrap_or(0.0)).sum();
    (own, t.elapsed().as_secs_f64())
}

/// Read `buf.len()` bytes at `offset` of `f` with the rayon pool, in pieces of
/// at least 4 MiB (or `buf.len() / threads`).
fn parallel_read(
    f: &File,
    path: &Path,
    buf: &mut [u8],
    offset: u64,
    threads: usize,
) -> Result<(), CudaError> {
    let piece = (buf.len().div_ceil(threads.max(1))).max(4 << 20);
    buf.par_chunks_mut(piece)
        .enumerate()
        .try_for_each(|(i, part)| f.read_exact_at(part, offset + (i * piece) as u64))
        .map_err(|source| io(path, source))
}

/// The batched method's pinned-ring reader for the tensors of one file, in a pool
/// of exactly `opts.threads` readers when asked for (rayon's global pool has
/// one per core). Returns the copies queued and the host cost (the ring's
/// allocation, and its teardown after the last copy).
fn stage_ring(
    gpu: &Gpu,
    path: &Path,
    tensors: &[Extent],
    offs: &[usize],
    arena: CUdeviceptr,
    opts: &StagingOptions,
) -> Result<(usize, HostCost), CudaError> {
    if opts.threads != 0 && opts.threads != rayon::current_num_threads() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads)
            .build()
            .map_err(|e| {
                CudaError::Invalid(format!("cannot start {} reader threads: {e}", opts.threads))
            })?;
        return pool.install(|| stage_ring_in_pool(gpu, path, tensors, offs, arena, opts));
    }
    stage_ring_in_pool(gpu, path, tensors, offs, arena, opts)
}

/// The file is read straight into a ring of pinned buffers by several threads
/// (positional reads, no pageable intermediate), and each filled buffer's
/// pieces are copied asynchronously on the copy stream while the next buffer is
/// read. A buffer is refilled only after the event recorded behind its copies
/// has completed; with `release_pages` a helper thread drops each range's page
/// cache once it is in pinned memory.
fn stage_ring_in_pool(
    gpu: &Gpu,
    path: &Path,
    tensors: &[Extent],
    offs: &[usize],
    arena: CUdeviceptr,
    opts: &StagingOptions,
) -> Result<(usize, HostCost), CudaError> {
    let (start, end) = match (tensors.first(), tensors.last()) {
        (Some(a), Some(b)) => (a.offset, b.offset + b.bytes as u64),
        _ => return Ok((0, HostCost::default())),
    };
    gpu.bind()?;
    let f = File::open(path).map_err(|source| io(path, source))?;
    let threads = if opts.threads == 0 {
        rayon::current_num_threads()
    } else {
        opts.threads
    };
    let chunk = opts.chunk_bytes.max(1 << 20);
    let nbuf = opts.buffers.max(2);
    let t_pin = Instant::now();
    let mut ring: Vec<Pinned> = (0..nbuf)
        .map(|_| match opts.ring_memory {
            RingMemory::HostAlloc => Pinned::new(gpu, chunk),
            RingMemory::HugeRegistered => Pinned::huge(gpu, chunk),
        })
        .collect::<Result<_, _>>()?;
    let pin_s = t_pin.elapsed().as_secs_f64();
    let events: Vec<dsys::CUevent> = (0..nbuf)
        .map(|_| {
            dres::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .ctx("creating a staging event")
        })
        .collect::<Result<_, _>>()?;
    let mut used = vec![false; nbuf];
    let (releaser, release_thread) = if opts.release_pages {
        let (tx, rx) = std::sync::mpsc::channel::<(u64, u64)>();
        let rf = f.try_clone().map_err(|source| io(path, source))?;
        let h = std::thread::spawn(move || {
            for (o, l) in rx {
                release(&rf, o, l);
            }
        });
        (Some(tx), Some(h))
    } else {
        (None, None)
    };
    let result = (|| -> Result<usize, CudaError> {
        let mut copies = 0usize;
        let mut pos = start;
        let mut i = 0usize;
        while pos < end {
            let slot = i % nbuf;
            let len = ((end - pos) as usize).min(chunk);
            if used[slot] {
                // SAFETY: the event was recorded behind this buffer's copies.
                unsafe { dres::event::synchronize(events[slot]) }
                    .ctx("waiting for a staging buffer")?;
            }
            parallel_read(
                &f,
                path,
                &mut ring[slot].as_mut_slice()[..len],
                pos,
                threads,
            )?;
            if let Some(tx) = &releaser {
                // The bytes are in pinned memory now: the page cache may go,
                // off the read path.
                let _ = tx.send((pos, len as u64));
            }
            copies += queue_pieces(
                gpu,
                tensors,
                offs,
                arena,
                pos,
                &ring[slot].as_slice()[..len],
            )?;
            // SAFETY: records on the copy stream behind the copies just queued.
            unsafe { dres::event::record(events[slot], gpu.copy.cu_stream()) }
                .ctx("recording a staging event")?;
            used[slot] = true;
            pos += len as u64;
            i += 1;
        }
        gpu.copy
            .synchronize()
            .ctx("waiting for the staging copies")?;
        Ok(copies)
    })();
    let t_down = Instant::now();
    drop(releaser);
    if let Some(h) = release_thread {
        let _ = h.join();
    }
    for e in events {
        // SAFETY: created above; all work behind them is complete or failed.
        let _ = unsafe { dres::event::destroy(e) };
    }
    let copies = result?;
    drop(ring);
    Ok((
        copies,
        HostCost {
            pin_s,
            teardown_s: t_down.elapsed().as_secs_f64(),
        },
    ))
}

/// Page-locked host memory: from `cuMemHostAlloc(len, 0)` (plain pinned, not
/// write-combined: the CPU writes it through the page cache copy), or
/// anonymous memory on transparent huge pages registered with the driver
/// ([`Pinned::huge`]).
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
    /// The anonymous mapping behind a [`Pinned::huge`] buffer (unregistered,
    /// then unmapped on drop); `None` for `cuMemHostAlloc` memory.
    anon: Option<memmap2::MmapMut>,
}

/// A transparent huge page on x86-64, bytes.
const HUGE_PAGE: usize = 2 << 20;

// SAFETY: plain host memory; the engine hands disjoint pieces to reader threads.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    /// Allocate `len` bytes of pinned host memory.
    pub fn new(gpu: &Gpu, len: usize) -> Result<Pinned, CudaError> {
        gpu.bind()?;
        // SAFETY: plain allocation; the memory is written before it is read.
        let ptr = unsafe { dres::malloc_host(len.max(1), 0) }
            .ctx(format!("allocating {len} bytes of pinned host memory"))?;
        Ok(Pinned {
            ptr: ptr as *mut u8,
            len,
            anon: None,
        })
    }

    /// `len` bytes of anonymous memory aligned to and advised onto 2 MiB
    /// transparent huge pages (`MADV_HUGEPAGE`; the kernel may still give 4 KiB
    /// pages), touched once per huge page by the rayon pool, then registered
    /// with the driver (`cuMemHostRegister`): the same use as [`Pinned::new`]'s
    /// memory, with up to 512 times fewer pages for the driver to pin.
    pub fn huge(gpu: &Gpu, len: usize) -> Result<Pinned, CudaError> {
        gpu.bind()?;
        let len = len.max(1);
        let mut anon =
            memmap2::MmapMut::map_anon(len + HUGE_PAGE).map_err(|source| CudaError::Io {
                path: PathBuf::from("<anonymous staging buffer>"),
                source,
            })?;
        let at = anon.as_mut_ptr();
        let lead = at.align_offset(HUGE_PAGE);
        // SAFETY: `lead < HUGE_PAGE`, so [lead, lead + len) lies in the mapping.
        let ptr = unsafe { at.add(lead) };
        // SAFETY: advice on a range of our own mapping; a refusal only leaves
        // 4 KiB pages.
        unsafe {
            libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        // SAFETY: [ptr, ptr + len) is ours and nothing else references it yet.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        bytes.par_chunks_mut(HUGE_PAGE).for_each(|c| c[0] = 0);
        // SAFETY: a range of a live mapping, unregistered in Drop before it is unmapped.
        unsafe { dsys::cuMemHostRegister_v2(ptr as *mut std::ffi::c_void, len, 0) }
            .result()
            .ctx(format!(
                "registering {len} bytes of huge-page staging memory"
            ))?;
        Ok(Pinned {
            ptr,
            len,
            anon: Some(anon),
        })
    }

    /// The bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes allocated and owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The bytes, read-only.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        match self.anon.take() {
            // SAFETY: registered in `huge`; unregistered once, before the unmap.
            Some(anon) => {
                let _ = unsafe { dsys::cuMemHostUnregister(self.ptr as *mut std::ffi::c_void) };
                drop(anon);
            }
            // SAFETY: allocated by malloc_host, freed once.
            None => {
                let _ = unsafe { dres::free_host(self.ptr as *mut std::ffi::c_void) };
            }
        }
    }
}

/// The copy-engine ceiling for `bytes`: one pinned host buffer (filled first,
/// not timed) copied to one device buffer in 64 MiB pieces on the copy stream,
/// timed from the first copy to the last completed. Returns GB/s.
pub fn pinned_copy_gbps(gpu: &Gpu, bytes: usize) -> Result<f64, CudaError> {
    let mut host = Pinned::new(gpu, bytes)?;
    host.as_mut_slice()
        .par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(i, c)| c.fill((i % 251) as u8));
    let dev = DeviceBuffer::alloc(gpu, bytes, "the pinned-copy ceiling")?;
    let t0 = Instant::now();
    let piece = 64 << 20;
    let mut off = 0usize;
    while off < bytes {
        let n = piece.min(bytes - off);
        // SAFETY: ranges inside both buffers; `host` outlives the synchronize.
        unsafe {
            dres::memcpy_htod_async(
                dev.ptr() + off as u64,
                &host.as_slice()[off..off + n],
                gpu.copy.cu_stream(),
            )
        }
        .ctx("queueing a pinned copy")?;
        off += n;
    }
    gpu.copy
        .synchronize()
        .ctx("waiting for the pinned copies")?;
    Ok(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(file: &str, offset: u64, bytes: usize) -> Extent {
        Extent {
            name: format!("{file}@{offset}"),
            file: PathBuf::from(file),
            dtype: DType::BF16,
            shape: vec![bytes / 2],
            offset,
            bytes,
        }
    }

    #[test]
    fn arena_layout_aligns_every_tensor_across_files() {
        let t = [ext("a", 100, 10), ext("a", 110, 300), ext("b", 64, 2)];
        let (offs, total) = arena_layout(&t);
        assert_eq!(offs, [0, 256, 768]);
        assert_eq!(total, 770);
        assert_eq!(device_bytes(&t, StagingMethod::Batched), 770);
        assert_eq!(device_bytes(&t, StagingMethod::Serial), 312);
        let groups = by_file(&t);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0], (PathBuf::from("a"), 0..2));
        assert_eq!(groups[1], (PathBuf::from("b"), 2..3));
    }

    #[test]
    fn pieces_of_every_chunking_cover_each_tensor_byte_exactly_once() {
        // Tensors with gaps between them (headers, padding), of odd sizes.
        let t = [
            ext("f", 80, 1000),
            ext("f", 1080, 6),
            ext("f", 1200, 4096),
            ext("f", 5296, 1),
        ];
        let (offs, total) = arena_layout(&t);
        for chunk in [1u64, 7, 64, 1000, 4096, 1 << 20] {
            let mut hits = vec![0u8; total];
            let mut lo = t[0].offset;
            let end = t[3].offset + 1;
            while lo < end {
                let hi = (lo + chunk).min(end);
                for p in pieces(&t, &offs, lo, hi) {
                    assert!(p.src >= lo && p.src + p.len as u64 <= hi, "{p:?}");
                    let tt = &t[p.tensor];
                    assert!(
                        p.src >= tt.offset && p.src + p.len as u64 <= tt.offset + tt.bytes as u64
                    );
                    assert_eq!(p.dst - offs[p.tensor], (p.src - tt.offset) as usize);
                    for b in &mut hits[p.dst..p.dst + p.len] {
                        *b += 1;
                    }
                }
                lo = hi;
            }
            for (i, tt) in t.iter().enumerate() {
                let slot = &hits[offs[i]..offs[i] + tt.bytes];
                assert!(slot.iter().all(|h| *h == 1), "chunk {chunk}, tensor {i}");
            }
            // Alignment padding is never written.
            assert_eq!(
                hits.iter().map(|h| *h as usize).sum::<usize>(),
                1000 + 6 + 4096 + 1
            );
        }
    }

    /// Tensors of odd sizes in one file, every third one transient.
    fn split_case() -> (Vec<Extent>, Vec<bool>) {
        let sizes = [
            3000usize, 130, 7000, 512, 4096, 9000, 77, 2500, 2600, 1, 6000, 300, 4097,
        ];
        let mut off = 64u64;
        let t: Vec<Extent> = sizes
            .iter()
            .map(|b| {
                let e = ext("m", off, *b);
                off += *b as u64 + 8;
                e
            })
            .collect();
        let transient = (0..t.len()).map(|i| i % 3 != 1).collect();
        (t, transient)
    }

    /// Red on: a window closed one tensor late (its layout over the bound), a
    /// tensor in no window or in two, windows out of order.
    #[test]
    fn windows_cover_every_tensor_once_within_the_bound() {
        let (t, tr) = split_case();
        let moving: Vec<usize> = (0..t.len()).filter(|i| tr[*i]).collect();
        let sizes: Vec<usize> = moving.iter().map(|i| t[*i].bytes).collect();
        assert_eq!(sizes, [3000, 7000, 512, 9000, 77, 2600, 1, 300, 4097]);
        for bound in [1usize, 4096, 7300, 10_000, 16_384, 1 << 30] {
            let w = plan_windows(&t, &tr, bound);
            let cap = bounce_capacity(sizes.iter().copied(), bound);
            // Consecutive, from 0 to the end: each tensor in exactly one window.
            assert_eq!(w.first().map(|r| r.start), Some(0), "{bound}");
            assert_eq!(w.last().map(|r| r.end), Some(t.len()), "{bound}");
            for pair in w.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "{bound}: {w:?}");
            }
            for r in &w {
                let mv: Vec<Extent> = r.clone().filter(|i| tr[*i]).map(|i| t[i].clone()).collect();
                let layout = arena_layout(&mv).1;
                assert!(
                    !mv.is_empty(),
                    "{bound}: a window with nothing to move {r:?}"
                );
                assert!(
                    layout <= bound || mv.len() == 1,
                    "{bound}: window {r:?} lays out {layout} bytes"
                );
                assert!(layout <= cap, "{bound}: {layout} > bounce {cap}");
                // Greedy: the next window's first tensor did not fit this one.
                if r.end < t.len() {
                    let mut more = mv.clone();
                    more.push(t[r.end].clone());
                    assert!(tr[r.end] && arena_layout(&more).1 > bound, "{bound}: {r:?}");
                }
            }
        }
        // Values: under 7300 bytes, 3000 (then 3072 + 7000 is over), 7000
        // (7168 + 512 is over), 512 (512 + 9000), 9000 alone (over the bound
        // by itself), then 77 + 2600 + 1 + 300 (laid out: 3628), then 4097. The
        // kept tensors (1, 4, 7, 10) ride in the window open when they come.
        let w = plan_windows(&t, &tr, 7300);
        assert_eq!(w, [0..2, 2..3, 3..5, 5..6, 6..12, 12..13]);
        // The bounce: the largest tensor aligned (9216) is over the bound.
        assert_eq!(bounce_capacity(sizes.iter().copied(), 7300), 9216);
        // One window when everything fits; the bounce is then all of them
        // aligned (3072 + 7168 + 512 + 9216 + 256 + 2816 + 256 + 512 + 4352).
        let all = plan_windows(&t, &tr, 1 << 30);
        assert_eq!((all.len(), all[0].clone()), (1, 0..13));
        assert_eq!(bounce_capacity(sizes.iter().copied(), 1 << 30), 28_160);
        assert_eq!(bounce_capacity([], 1 << 30), 0);
        // Nothing transient: one window of everything, no bounce.
        let none = vec![false; t.len()];
        let kept = plan_windows(&t, &none, 100);
        assert_eq!((kept.len(), kept[0].clone()), (1, 0..13));
        assert!(plan_windows(&[], &[], 100).is_empty());
    }

    /// Red on: `settle_teardowns` not waiting for a pending teardown, not
    /// draining the list (the second call finds it again), or its own wall
    /// and its wait swapped.
    #[test]
    fn settling_waits_for_every_background_teardown_once() {
        let h = std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            0.5
        });
        PENDING_TEARDOWNS.lock().unwrap().push(h);
        let (own, waited) = settle_teardowns();
        assert_eq!(own, 0.5);
        assert!((0.0..0.5).contains(&waited), "{waited}");
        assert_eq!(settle_teardowns().0, 0.0);
    }

    #[test]
    fn methods_are_named_as_the_lever_names_its_arms() {
        let lever = crate::levers::lever(crate::levers::STAGING).unwrap();
        for m in [StagingMethod::Serial, StagingMethod::Batched] {
            assert!(lever.arms.contains(&m.name()), "{}", m.name());
        }
    }
}
