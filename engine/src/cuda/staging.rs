//! Weights from a safetensors file onto the device, in two switchable arms
//! (lever `staging`):
//!
//! - [`StagingArm::Serial`] (baseline, the seed's pattern): per tensor, a
//!   pageable host copy, its own `cuMemAlloc`, a synchronous copy and a
//!   context synchronize: one round trip per tensor.
//! - [`StagingArm::Batched`] (default): ONE device arena per model; the file is
//!   read straight into a ring of pinned host buffers by several threads
//!   (positional reads, no pageable intermediate), and each filled buffer's
//!   pieces are copied asynchronously on the copy stream while the next buffer
//!   is read. A buffer is refilled only after the event recorded behind its
//!   copies has completed.
//!
//! With `release_pages` the file's page cache is dropped
//! (`posix_fadvise(DONTNEED)`) range by range once its bytes are out of it.
//! Both arms place the same bytes under the same names: [`DeviceWeights::download`]
//! reads any tensor back for the byte comparison.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::driver::result as dres;
use cudarc::driver::sys::{self as dsys, CUdeviceptr};
use rayon::prelude::*;

use super::context::Gpu;
use super::memory::{align_up, DeviceBuffer};
use super::{CudaError, DriverContext};
use crate::weights::{DType, WeightError};

/// Which staging arm runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StagingArm {
    /// Per-tensor alloc + pageable copy + synchronize (the baseline).
    Serial,
    /// One arena, parallel reads into pinned buffers, async copies (the default).
    Batched,
}

impl StagingArm {
    /// Parse a lever arm name (`serial` | `batched`).
    pub fn parse(s: &str) -> Option<StagingArm> {
        match s {
            "serial" => Some(StagingArm::Serial),
            "batched" => Some(StagingArm::Batched),
            _ => None,
        }
    }

    /// The lever arm name.
    pub fn name(self) -> &'static str {
        match self {
            StagingArm::Serial => "serial",
            StagingArm::Batched => "batched",
        }
    }
}

/// How to stage.
#[derive(Debug, Clone)]
pub struct StagingOptions {
    /// The arm.
    pub arm: StagingArm,
    /// Drop the file's page cache after its bytes are copied out.
    pub release_pages: bool,
    /// Reader threads of the batched arm (0: one per core).
    pub threads: usize,
    /// Bytes per pinned buffer of the batched arm.
    pub chunk_bytes: usize,
    /// Pinned buffers in the ring of the batched arm (>= 2 to overlap).
    pub buffers: usize,
    /// How the batched arm gets the file's bytes to the copy engine.
    pub reader: Reader,
}

/// The batched arm's host side.
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
    /// The defaults for `arm`: the registered reader (device run 4: 29.9 GB/s
    /// with 16 threads against 21.3 for the pinned ring, bytes identical), and
    /// for the ring 4 buffers of 16 MiB (device run 2: 18.4 GB/s
    /// against 16.8 at 64 MiB and 6.4 at 256 MiB, whose pinned allocation
    /// dominates), one reader per core.
    pub fn new(arm: StagingArm) -> StagingOptions {
        StagingOptions {
            arm,
            release_pages: false,
            threads: 0,
            chunk_bytes: 16 << 20,
            buffers: 4,
            reader: Reader::Registered,
        }
    }
}

/// One tensor as the file's header declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct FileTensor {
    /// Name in the file.
    pub name: String,
    /// Storage type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Absolute byte offset of its data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub bytes: usize,
}

/// Read a safetensors header: the tensors in file order and the file's length.
///
/// Errors name the file and the tensor: a short file, a header that is not
/// JSON, a dtype other than BF16/F16/F32, offsets outside the data or a size
/// that disagrees with the shape.
pub fn read_header(path: &Path) -> Result<(Vec<FileTensor>, u64), CudaError> {
    let corrupt = |detail: String| {
        CudaError::Weights(WeightError::Corrupt {
            file: path.to_path_buf(),
            detail,
        })
    };
    let f = File::open(path).map_err(|source| io(path, source))?;
    let len = f.metadata().map_err(|source| io(path, source))?.len();
    let mut n8 = [0u8; 8];
    f.read_exact_at(&mut n8, 0).map_err(|_| {
        corrupt(format!(
            "file of {len} bytes is too short for a safetensors header"
        ))
    })?;
    let n = u64::from_le_bytes(n8);
    if n > 100 << 20 || 8 + n > len {
        return Err(corrupt(format!(
            "header length {n} does not fit the file of {len} bytes"
        )));
    }
    let mut hdr = vec![0u8; n as usize];
    f.read_exact_at(&mut hdr, 8)
        .map_err(|source| io(path, source))?;
    let v: serde_json::Value =
        serde_json::from_slice(&hdr).map_err(|e| corrupt(format!("header is not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| corrupt("header is not a JSON object".into()))?;
    let data_start = 8 + n;
    let mut out = Vec::new();
    for (name, t) in obj {
        if name == "__metadata__" {
            continue;
        }
        let dt = t.get("dtype").and_then(|d| d.as_str()).unwrap_or("");
        let dtype = match dt {
            "BF16" => DType::BF16,
            "F16" => DType::F16,
            "F32" => DType::F32,
            other => {
                return Err(CudaError::Weights(WeightError::DType {
                    name: name.clone(),
                    file: path.to_path_buf(),
                    expected: "BF16, F16 or F32".into(),
                    found: other.to_string(),
                }))
            }
        };
        let shape: Vec<usize> = t
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| corrupt(format!("tensor '{name}' has no shape")))?
            .iter()
            .map(|d| d.as_u64().map(|x| x as usize))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| corrupt(format!("tensor '{name}' has a non-integer dimension")))?;
        let offs = t
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
            .ok_or_else(|| corrupt(format!("tensor '{name}' has no data_offsets [begin, end]")))?;
        let bytes = shape.iter().product::<usize>() * dtype.size();
        if offs.1 < offs.0 || (offs.1 - offs.0) as usize != bytes {
            return Err(corrupt(format!(
                "tensor '{name}': data_offsets {offs:?} hold {} bytes but shape {shape:?} of {dt} needs {bytes}",
                offs.1.saturating_sub(offs.0)
            )));
        }
        if data_start + offs.1 > len {
            return Err(corrupt(format!(
                "tensor '{name}' ends at byte {} but the file has {len} (truncated?)",
                data_start + offs.1
            )));
        }
        out.push(FileTensor {
            name: name.clone(),
            dtype,
            shape,
            offset: data_start + offs.0,
            bytes,
        });
    }
    out.sort_by_key(|t| t.offset);
    Ok((out, len))
}

fn io(path: &Path, source: std::io::Error) -> CudaError {
    CudaError::Io {
        path: path.to_path_buf(),
        source,
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
    Empty,
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

    /// No tensors (a model that has none staged yet).
    pub fn empty() -> DeviceWeights {
        DeviceWeights {
            _storage: Storage::Empty,
            tensors: HashMap::new(),
            file: PathBuf::from("<none>"),
            bytes: 0,
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
        super::memory::download::<u8>(gpu, t.ptr, t.bytes)
    }
}

/// What a staging run did.
#[derive(Debug, Clone)]
pub struct StagingReport {
    /// The arm.
    pub arm: StagingArm,
    /// Tensor bytes copied to the device.
    pub bytes: u64,
    /// Wall seconds, from the first read to the last copy completed.
    pub seconds: f64,
    /// Host-to-device copies issued.
    pub copies: usize,
    /// Device allocations made.
    pub allocations: usize,
}

impl StagingReport {
    /// Throughput in GB/s (1e9 bytes per second).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-12) / 1e9
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

/// Stage every tensor of the safetensors file at `path` onto `gpu`.
pub fn stage_file(
    gpu: &Gpu,
    path: &Path,
    opts: &StagingOptions,
) -> Result<(DeviceWeights, StagingReport), CudaError> {
    let (tensors, _len) = read_header(path)?;
    gpu.bind()?;
    match (opts.arm, opts.reader) {
        (StagingArm::Serial, _) => stage_serial(gpu, path, &tensors, opts),
        (StagingArm::Batched, Reader::Registered) => {
            match stage_registered(gpu, path, &tensors, opts)? {
                Some(r) => Ok(r),
                None => stage_batched(gpu, path, &tensors, opts),
            }
        }
        (StagingArm::Batched, Reader::PinnedRing) => stage_batched(gpu, path, &tensors, opts),
    }
}

fn stage_serial(
    gpu: &Gpu,
    path: &Path,
    tensors: &[FileTensor],
    opts: &StagingOptions,
) -> Result<(DeviceWeights, StagingReport), CudaError> {
    let t0 = Instant::now();
    let f = File::open(path).map_err(|source| io(path, source))?;
    let mut bufs = Vec::with_capacity(tensors.len());
    let mut map = HashMap::with_capacity(tensors.len());
    let mut bytes = 0u64;
    for t in tensors {
        // The seed's pattern: a pageable host copy of the tensor ...
        let mut host = vec![0u8; t.bytes];
        f.read_exact_at(&mut host, t.offset)
            .map_err(|source| io(path, source))?;
        // ... its own device allocation ...
        let buf = DeviceBuffer::alloc(gpu, t.bytes, &format!("tensor '{}'", t.name))?;
        // ... a synchronous copy and a full synchronize.
        // SAFETY: `buf` holds t.bytes bytes; `host` is alive for the call.
        unsafe { dres::memcpy_htod_sync(buf.ptr(), &host) }
            .ctx(format!("copying tensor '{}'", t.name))?;
        gpu.ctx
            .synchronize()
            .ctx("synchronizing after a tensor copy")?;
        if opts.release_pages {
            release(&f, t.offset, t.bytes as u64);
        }
        map.insert(
            t.name.clone(),
            Staged {
                ptr: buf.ptr(),
                bytes: t.bytes,
                dtype: t.dtype,
                shape: t.shape.clone(),
            },
        );
        bytes += t.bytes as u64;
        bufs.push(buf);
    }
    let n = bufs.len();
    let report = StagingReport {
        arm: StagingArm::Serial,
        bytes,
        seconds: t0.elapsed().as_secs_f64(),
        copies: n,
        allocations: n,
    };
    Ok((
        DeviceWeights {
            _storage: Storage::PerTensor(bufs),
            tensors: map,
            file: path.to_path_buf(),
            bytes,
        },
        report,
    ))
}

/// Page-locked host memory from `cuMemHostAlloc(len, 0)` (plain pinned, not
/// write-combined: the CPU writes it through the page cache copy).
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
}

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
        // SAFETY: allocated by malloc_host, freed once.
        let _ = unsafe { dres::free_host(self.ptr as *mut std::ffi::c_void) };
    }
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

fn stage_batched(
    gpu: &Gpu,
    path: &Path,
    tensors: &[FileTensor],
    opts: &StagingOptions,
) -> Result<(DeviceWeights, StagingReport), CudaError> {
    // A pool of exactly `threads` readers when asked for (rayon's global pool
    // has one per core).
    if opts.threads != 0 && opts.threads != rayon::current_num_threads() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads)
            .build()
            .map_err(|e| {
                CudaError::Invalid(format!("cannot start {} reader threads: {e}", opts.threads))
            })?;
        return pool.install(|| stage_batched_in_pool(gpu, path, tensors, opts));
    }
    stage_batched_in_pool(gpu, path, tensors, opts)
}

/// Chunk size of the registered reader (run 3: 64 MiB chunks on 16 threads
/// gave 32.9 GB/s).
const REGISTER_CHUNK: usize = 64 << 20;
/// Default registration threads of the registered reader.
const REGISTER_THREADS: usize = 8;

/// The batched arm with [`Reader::Registered`]. `None` when the driver refused
/// the first registration (nothing was copied; the caller falls back).
fn stage_registered(
    gpu: &Gpu,
    path: &Path,
    tensors: &[FileTensor],
    opts: &StagingOptions,
) -> Result<Option<(DeviceWeights, StagingReport)>, CudaError> {
    let t0 = Instant::now();
    let (start, end) = match (tensors.first(), tensors.last()) {
        (Some(a), Some(b)) => (a.offset as usize, b.offset as usize + b.bytes),
        _ => return Ok(None),
    };
    let mut offs = Vec::with_capacity(tensors.len());
    let mut total = 0usize;
    for t in tensors {
        let o = align_up(total);
        offs.push(o);
        total = o + t.bytes;
    }
    let f = File::open(path).map_err(|source| io(path, source))?;
    // SAFETY: read-only mapping of a file nobody writes while it is staged.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|source| io(path, source))?;
    let base = map.as_ptr() as usize;
    let page = 4096usize;
    let first = start / page * page;
    let n_chunks = (end - first).div_ceil(REGISTER_CHUNK);
    // Probe with the first chunk: a refusal here costs nothing.
    let lo0 = first;
    let hi0 = (lo0 + REGISTER_CHUNK).min(map.len());
    // SAFETY: a page-aligned range of the mapping, unregistered below.
    let probe = unsafe {
        dsys::cuMemHostRegister_v2(
            (base + lo0) as *mut std::ffi::c_void,
            hi0 - lo0,
            dsys::CU_MEMHOSTREGISTER_READ_ONLY,
        )
    };
    if probe != dsys::CUresult::CUDA_SUCCESS {
        return Ok(None);
    }
    let arena = DeviceBuffer::alloc(
        gpu,
        total,
        &format!("the weights arena of {}", path.display()),
    )?;
    let registered = std::sync::Mutex::new(vec![base + lo0]);
    let copies = std::sync::atomic::AtomicUsize::new(0);
    let next = std::sync::atomic::AtomicUsize::new(1);
    let copy_chunk = |i: usize| -> Result<(), CudaError> {
        let lo = first + i * REGISTER_CHUNK;
        let (cs, ce) = (lo.max(start), (lo + REGISTER_CHUNK).min(end));
        // Tensors overlapping [cs, ce): from the last one starting at or before cs.
        let mut j = tensors
            .partition_point(|t| (t.offset as usize) <= cs)
            .saturating_sub(1);
        while j < tensors.len() && (tensors[j].offset as usize) < ce {
            let t = &tensors[j];
            let (ts, te) = (t.offset as usize, t.offset as usize + t.bytes);
            let (s, e) = (ts.max(cs), te.min(ce));
            if e > s {
                // SAFETY: inside the registered chunk and tensor j's arena slot.
                unsafe {
                    dres::memcpy_htod_async(
                        arena.ptr() + (offs[j] + (s - ts)) as u64,
                        &map[s..e],
                        gpu.copy.cu_stream(),
                    )
                }
                .ctx(format!("queueing the copy of '{}'", t.name))?;
                copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            j += 1;
        }
        Ok(())
    };
    // Registration threads: 8 unless asked (run 4, registration spread over 4 /
    // 8 / 16 threads: 44.1 / 43.3 / 39.5 GB/s; page pinning contends beyond).
    let threads = if opts.threads == 0 {
        REGISTER_THREADS
    } else {
        opts.threads
    };
    let results: Vec<Result<(), CudaError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|w| {
                let copy_chunk = &copy_chunk;
                let (next, registered, map) = (&next, &registered, &map);
                sc.spawn(move || -> Result<(), CudaError> {
                    gpu.bind()?;
                    if w == 0 {
                        copy_chunk(0)?;
                    }
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if i >= n_chunks {
                            return Ok(());
                        }
                        let lo = first + i * REGISTER_CHUNK;
                        let hi = (lo + REGISTER_CHUNK).min(map.len());
                        // SAFETY: a page-aligned range of the mapping, unregistered below.
                        unsafe {
                            dsys::cuMemHostRegister_v2(
                                (base + lo) as *mut std::ffi::c_void,
                                hi - lo,
                                dsys::CU_MEMHOSTREGISTER_READ_ONLY,
                            )
                            .result()
                            .ctx("registering a chunk of the mapped weights file")?;
                        }
                        if let Ok(mut r) = registered.lock() {
                            r.push(base + lo);
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
    if let Ok(r) = registered.lock() {
        for p in r.iter() {
            // SAFETY: registered above; the copies that read it have completed.
            unsafe {
                let _ = dsys::cuMemHostUnregister(*p as *mut std::ffi::c_void);
            }
        }
    }
    for r in results {
        r?;
    }
    sync?;
    if opts.release_pages {
        release(&f, start as u64, (end - start) as u64);
    }
    let mut map_t = HashMap::with_capacity(tensors.len());
    let mut bytes = 0u64;
    for (t, o) in tensors.iter().zip(&offs) {
        map_t.insert(
            t.name.clone(),
            Staged {
                ptr: arena.ptr() + *o as u64,
                bytes: t.bytes,
                dtype: t.dtype,
                shape: t.shape.clone(),
            },
        );
        bytes += t.bytes as u64;
    }
    let report = StagingReport {
        arm: StagingArm::Batched,
        bytes,
        seconds: t0.elapsed().as_secs_f64(),
        copies: copies.into_inner(),
        allocations: 1,
    };
    Ok(Some((
        DeviceWeights {
            _storage: Storage::Arena(arena),
            tensors: map_t,
            file: path.to_path_buf(),
            bytes,
        },
        report,
    )))
}

fn stage_batched_in_pool(
    gpu: &Gpu,
    path: &Path,
    tensors: &[FileTensor],
    opts: &StagingOptions,
) -> Result<(DeviceWeights, StagingReport), CudaError> {
    let t0 = Instant::now();
    gpu.bind()?;
    let f = File::open(path).map_err(|source| io(path, source))?;
    // Arena layout: file order, each tensor on an ALIGN boundary.
    let mut offs = Vec::with_capacity(tensors.len());
    let mut total = 0usize;
    for t in tensors {
        let o = align_up(total);
        offs.push(o);
        total = o + t.bytes;
    }
    let arena = DeviceBuffer::alloc(
        gpu,
        total,
        &format!("the weights arena of {}", path.display()),
    )?;
    let threads = if opts.threads == 0 {
        rayon::current_num_threads()
    } else {
        opts.threads
    };
    let chunk = opts.chunk_bytes.max(1 << 20);
    let nbuf = opts.buffers.max(2);
    let mut ring: Vec<Pinned> = (0..nbuf)
        .map(|_| Pinned::new(gpu, chunk))
        .collect::<Result<_, _>>()?;
    let events: Vec<dsys::CUevent> = (0..nbuf)
        .map(|_| {
            dres::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .ctx("creating a staging event")
        })
        .collect::<Result<_, _>>()?;
    let mut used = vec![false; nbuf];
    let copy = gpu.copy.cu_stream();
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

    let result = (|| -> Result<(u64, usize), CudaError> {
        let (start, end) = match (tensors.first(), tensors.last()) {
            (Some(a), Some(b)) => (a.offset, b.offset + b.bytes as u64),
            _ => return Ok((0, 0)),
        };
        let mut copies = 0usize;
        let mut first_t = 0usize; // first tensor that may overlap the chunk
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
            let buf = &mut ring[slot].as_mut_slice()[..len];
            parallel_read(&f, path, buf, pos, threads)?;
            if let Some(tx) = &releaser {
                // The bytes are in pinned memory now: the page cache may go,
                // off the read path.
                let _ = tx.send((pos, len as u64));
            }
            let cend = pos + len as u64;
            while first_t < tensors.len()
                && tensors[first_t].offset + tensors[first_t].bytes as u64 <= pos
            {
                first_t += 1;
            }
            let mut j = first_t;
            while j < tensors.len() && tensors[j].offset < cend {
                let t = &tensors[j];
                let s = t.offset.max(pos);
                let e = (t.offset + t.bytes as u64).min(cend);
                if e > s {
                    let src = &ring[slot].as_slice()[(s - pos) as usize..(e - pos) as usize];
                    let dst = arena.ptr() + (offs[j] as u64) + (s - t.offset);
                    // SAFETY: dst lies inside the arena slot of tensor j; the
                    // pinned source stays untouched until the event below completes.
                    unsafe { dres::memcpy_htod_async(dst, src, copy) }
                        .ctx(format!("queueing the copy of '{}'", t.name))?;
                    copies += 1;
                }
                j += 1;
            }
            // SAFETY: records on the copy stream behind the copies just queued.
            unsafe { dres::event::record(events[slot], copy) }.ctx("recording a staging event")?;
            used[slot] = true;
            pos = cend;
            i += 1;
        }
        gpu.copy
            .synchronize()
            .ctx("waiting for the staging copies")?;
        Ok((end - start, copies))
    })();
    drop(releaser);
    if let Some(h) = release_thread {
        let _ = h.join();
    }
    for e in events {
        // SAFETY: created above; all work behind them is complete or failed.
        let _ = unsafe { dres::event::destroy(e) };
    }
    let (_, copies) = result?;
    drop(ring);
    let mut map = HashMap::with_capacity(tensors.len());
    let mut bytes = 0u64;
    for (t, o) in tensors.iter().zip(&offs) {
        map.insert(
            t.name.clone(),
            Staged {
                ptr: arena.ptr() + *o as u64,
                bytes: t.bytes,
                dtype: t.dtype,
                shape: t.shape.clone(),
            },
        );
        bytes += t.bytes as u64;
    }
    let report = StagingReport {
        arm: StagingArm::Batched,
        bytes,
        seconds: t0.elapsed().as_secs_f64(),
        copies,
        allocations: 1,
    };
    Ok((
        DeviceWeights {
            _storage: Storage::Arena(arena),
            tensors: map,
            file: path.to_path_buf(),
            bytes,
        },
        report,
    ))
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

/// An experiment beside the two arms (benchmark only): register the file's
/// read-only mapping with the driver (`cuMemHostRegister`, READ_ONLY) and let the
/// copy engine read the page cache directly, with no host copy at all. Returns
/// (GB/s over the whole operation, seconds spent registering) or the driver's
/// refusal.
pub fn registered_mmap_gbps(gpu: &Gpu, path: &Path) -> Result<(f64, f64), CudaError> {
    let (tensors, _) = read_header(path)?;
    let (start, end) = match (tensors.first(), tensors.last()) {
        (Some(a), Some(b)) => (a.offset as usize, b.offset as usize + b.bytes),
        _ => return Err(CudaError::Invalid("no tensors".into())),
    };
    let f = File::open(path).map_err(|source| io(path, source))?;
    // SAFETY: read-only mapping of a file nobody writes during the copy.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|source| io(path, source))?;
    let dev = DeviceBuffer::alloc(gpu, end - start, "the registered-mmap experiment")?;
    gpu.bind()?;
    let t0 = Instant::now();
    // SAFETY: the mapping outlives the registration, which is undone below.
    unsafe {
        dsys::cuMemHostRegister_v2(
            map.as_ptr() as *mut std::ffi::c_void,
            map.len(),
            dsys::CU_MEMHOSTREGISTER_READ_ONLY,
        )
        .result()
        .ctx("registering the mapped weights file (cuMemHostRegister READ_ONLY)")?;
    }
    let reg_s = t0.elapsed().as_secs_f64();
    let piece = 64 << 20;
    let mut off = start;
    let mut r = Ok(());
    while off < end && r.is_ok() {
        let n = piece.min(end - off);
        // SAFETY: inside the registered mapping and the device buffer.
        r = unsafe {
            dres::memcpy_htod_async(
                dev.ptr() + (off - start) as u64,
                &map[off..off + n],
                gpu.copy.cu_stream(),
            )
        }
        .ctx("queueing a copy from the registered mapping");
        off += n;
    }
    let sync = gpu
        .copy
        .synchronize()
        .ctx("waiting for the registered copies");
    let secs = t0.elapsed().as_secs_f64();
    // SAFETY: registered above.
    unsafe {
        let _ = dsys::cuMemHostUnregister(map.as_ptr() as *mut std::ffi::c_void);
    }
    r?;
    sync?;
    Ok(((end - start) as f64 / secs / 1e9, reg_s))
}

/// The registered-mapping experiment with the registration spread over
/// `threads` threads, `chunk` bytes (a multiple of the page size) at a time:
/// each thread registers a chunk of the read-only mapping and queues its copy,
/// so pinning overlaps the copy engine. Returns (GB/s until every copy has
/// completed, seconds spent unregistering afterwards).
pub fn registered_parallel_gbps(
    gpu: &Gpu,
    path: &Path,
    threads: usize,
    chunk: usize,
) -> Result<(f64, f64), CudaError> {
    let (tensors, _) = read_header(path)?;
    let (start, end) = match (tensors.first(), tensors.last()) {
        (Some(a), Some(b)) => (a.offset as usize, b.offset as usize + b.bytes),
        _ => return Err(CudaError::Invalid("no tensors".into())),
    };
    let page = 4096usize;
    let chunk = chunk.div_ceil(page) * page;
    let f = File::open(path).map_err(|source| io(path, source))?;
    // SAFETY: read-only mapping of a file nobody writes during the copy.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|source| io(path, source))?;
    let dev = DeviceBuffer::alloc(gpu, end - start, "the registered-mmap experiment")?;
    let base = map.as_ptr() as usize;
    let first = start / page * page;
    let n_chunks = (end - first).div_ceil(chunk);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let registered = std::sync::Mutex::new(Vec::new());
    let t0 = Instant::now();
    let results: Vec<Result<(), CudaError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|_| {
                sc.spawn(|| -> Result<(), CudaError> {
                    gpu.bind()?;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if i >= n_chunks {
                            return Ok(());
                        }
                        let lo = first + i * chunk;
                        let hi = (lo + chunk).min(map.len());
                        // SAFETY: a page-aligned range inside the mapping, unregistered below.
                        unsafe {
                            dsys::cuMemHostRegister_v2(
                                (base + lo) as *mut std::ffi::c_void,
                                hi - lo,
                                dsys::CU_MEMHOSTREGISTER_READ_ONLY,
                            )
                            .result()
                            .ctx("registering a chunk of the mapped weights file")?;
                        }
                        if let Ok(mut r) = registered.lock() {
                            r.push(base + lo);
                        }
                        let (s, e) = (lo.max(start), (lo + chunk).min(end));
                        if e > s {
                            // SAFETY: inside the registered chunk and the device buffer.
                            unsafe {
                                dres::memcpy_htod_async(
                                    dev.ptr() + (s - start) as u64,
                                    &map[s..e],
                                    gpu.copy.cu_stream(),
                                )
                            }
                            .ctx("queueing a copy from a registered chunk")?;
                        }
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CudaError::Invalid("a registering thread panicked".into()))
                })
            })
            .collect()
    });
    let sync = gpu
        .copy
        .synchronize()
        .ctx("waiting for the registered copies");
    let secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    if let Ok(r) = registered.lock() {
        for p in r.iter() {
            // SAFETY: registered above.
            unsafe {
                let _ = dsys::cuMemHostUnregister(*p as *mut std::ffi::c_void);
            }
        }
    }
    let unreg = t1.elapsed().as_secs_f64();
    for r in results {
        r?;
    }
    sync?;
    Ok(((end - start) as f64 / secs / 1e9, unreg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target_dir(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join("test-scratch")
            .join(format!("staging-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write_file(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
        let mut hdr = serde_json::Map::new();
        let mut off = 0usize;
        let mut data = Vec::new();
        for (name, dt, shape, bytes) in tensors {
            hdr.insert(
                name.to_string(),
                serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [off, off + bytes.len()]}),
            );
            off += bytes.len();
            data.extend_from_slice(bytes);
        }
        let h = serde_json::to_vec(&serde_json::Value::Object(hdr)).unwrap();
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.extend_from_slice(&data);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn header_lists_tensors_in_file_order_with_absolute_offsets() {
        let d = target_dir("hdr");
        let p = d.join("w.safetensors");
        write_file(
            &p,
            &[
                ("b", "BF16", vec![2, 3], vec![7u8; 12]),
                ("a", "F32", vec![2], vec![9u8; 8]),
            ],
        );
        let (t, len) = read_header(&p).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "b");
        assert_eq!(t[1].name, "a");
        assert_eq!(t[1].offset, t[0].offset + 12);
        assert_eq!(len, t[1].offset + 8);
        assert_eq!(t[0].dtype, DType::BF16);
        let raw = std::fs::read(&p).unwrap();
        assert_eq!(&raw[t[1].offset as usize..][..8], &[9u8; 8]);
    }

    #[test]
    fn header_errors_name_the_file_and_tensor() {
        let d = target_dir("bad");
        let p = d.join("w.safetensors");
        write_file(&p, &[("x.weight", "BF16", vec![2, 3], vec![0u8; 10])]);
        let e = read_header(&p).unwrap_err().to_string();
        assert!(e.contains("x.weight") && e.contains("w.safetensors"), "{e}");
        write_file(&p, &[("y", "I64", vec![1], vec![0u8; 8])]);
        let e = read_header(&p).unwrap_err().to_string();
        assert!(e.contains("'y'") && e.contains("I64"), "{e}");
        std::fs::write(&p, [1u8, 2, 3]).unwrap();
        let e = read_header(&p).unwrap_err().to_string();
        assert!(e.contains("too short"), "{e}");
        // Truncated data.
        write_file(&p, &[("z", "F32", vec![4], vec![0u8; 16])]);
        let raw = std::fs::read(&p).unwrap();
        std::fs::write(&p, &raw[..raw.len() - 4]).unwrap();
        let e = read_header(&p).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn arm_names_round_trip() {
        for a in [StagingArm::Serial, StagingArm::Batched] {
            assert_eq!(StagingArm::parse(a.name()), Some(a));
        }
        assert_eq!(StagingArm::parse("fast"), None);
    }
}
