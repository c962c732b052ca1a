//! Device memory: owned buffers that keep an allocator high-water mark, and a
//! bump arena that carves one buffer into aligned pieces (weights, workspaces).

use std::sync::Arc;

use cudarc::driver::result as dres;
use cudarc::driver::sys::CUdeviceptr;

use crate::cuda::kit::context::Gpu;
pub use crate::cuda::kit::tracker::MemTracker;
use crate::cuda::{CudaError, DriverContext};

/// Alignment of every arena piece, bytes (cuBLASLt's preferred alignment is 16;
/// 256 keeps every piece on its own cache-line group).
pub const ALIGN: usize = 256;

/// Round `n` up to a multiple of [`ALIGN`].
pub fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// An owned device allocation (`cuMemAlloc`), freed on drop.
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    bytes: usize,
    mem: Arc<MemTracker>,
}

// SAFETY: a device pointer is a plain address valid in the context on any thread.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocate `bytes` (at least 1) on `gpu`; `what` names the use in errors.
    pub fn alloc(gpu: &Gpu, bytes: usize, what: &str) -> Result<DeviceBuffer, CudaError> {
        gpu.bind()?;
        let n = bytes.max(1);
        // SAFETY: plain allocation in the bound context.
        match unsafe { dres::malloc_sync(n) } {
            Ok(ptr) => {
                gpu.mem.add(n as u64);
                Ok(DeviceBuffer {
                    ptr,
                    bytes: n,
                    mem: gpu.mem.clone(),
                })
            }
            Err(e) => {
                let (free, total) = dres::mem_get_info().unwrap_or((0, 0));
                if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    Err(CudaError::OutOfMemory {
                        what: what.to_string(),
                        requested: n,
                        free,
                        total,
                    })
                } else {
                    Err(e).ctx(format!("allocating {n} bytes for {what}"))
                }
            }
        }
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Fill every byte with `v` on `stream` (0xFF makes every f32 and bf16 a NaN:
    /// the poison of the checks).
    pub fn fill_bytes(
        &self,
        gpu: &Gpu,
        v: u8,
        stream: &cudarc::driver::CudaStream,
    ) -> Result<(), CudaError> {
        gpu.bind()?;
        // SAFETY: the range is this allocation.
        unsafe { dres::memset_d8_async(self.ptr, v, self.bytes, stream.cu_stream()) }
            .ctx("filling a device buffer")
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_sync and not freed elsewhere. A failure here
        // (context already torn down) cannot be reported from drop.
        let _ = unsafe { dres::free_sync(self.ptr) };
        self.mem.sub(self.bytes as u64);
    }
}

/// A bump allocator over one [`DeviceBuffer`]: pieces are [`ALIGN`]-aligned and
/// live as long as the arena.
pub struct Arena {
    buf: DeviceBuffer,
    used: usize,
}

impl Arena {
    /// An arena of `bytes` on `gpu`.
    pub fn new(gpu: &Gpu, bytes: usize, what: &str) -> Result<Arena, CudaError> {
        Ok(Arena {
            buf: DeviceBuffer::alloc(gpu, bytes, what)?,
            used: 0,
        })
    }

    /// The next `bytes` bytes, aligned; an error (not a panic) when full.
    pub fn take(&mut self, bytes: usize) -> Result<CUdeviceptr, CudaError> {
        let start = align_up(self.used);
        if start + bytes > self.buf.bytes() {
            return Err(CudaError::Invalid(format!(
                "arena of {} bytes cannot hold {} more bytes (used {})",
                self.buf.bytes(),
                bytes,
                self.used
            )));
        }
        self.used = start + bytes;
        Ok(self.buf.ptr() + start as u64)
    }

    /// The whole underlying buffer.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// Bytes handed out so far (with alignment padding).
    pub fn used(&self) -> usize {
        self.used
    }
}

/// Copy `n` elements of device memory at `src` to a new host vector (synchronous).
pub fn download<T: Copy + Default>(
    gpu: &Gpu,
    src: CUdeviceptr,
    n: usize,
) -> Result<Vec<T>, CudaError> {
    gpu.bind()?;
    gpu.sync_compute()?;
    let mut out = vec![T::default(); n];
    // SAFETY: `out` has room for n elements; the caller names a device range of
    // at least n elements.
    unsafe { dres::memcpy_dtoh_sync(&mut out, src) }.ctx("copying device memory to the host")?;
    Ok(out)
}

/// Copy `data` to device memory at `dst`; on return the copy is complete and the
/// compute stream's later work sees it.
///
/// The copy is queued on the compute stream and that stream is then waited on. A
/// synchronous `cuMemcpyHtoD` is not enough: from pageable memory it returns once
/// the data is staged, before the DMA lands, and it runs on the legacy stream,
/// which the non-blocking compute stream does not wait for, so a kernel queued
/// next could read the buffer half-written (selftest run bench5 caught this:
/// `t5 gated gelu` and the RGB8 probe read inputs that had not arrived).
pub fn upload<T: Copy>(gpu: &Gpu, dst: CUdeviceptr, data: &[T]) -> Result<(), CudaError> {
    gpu.bind()?;
    // SAFETY: the caller names a device range of at least data.len() elements;
    // `data` outlives the copy, which the synchronize below waits for.
    unsafe { dres::memcpy_htod_async(dst, data, gpu.compute.cu_stream()) }
        .ctx("copying host memory to the device")?;
    gpu.sync_compute()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_to_256() {
        assert_eq!(align_up(0), 0);
        assert_eq!(align_up(1), 256);
        assert_eq!(align_up(256), 256);
        assert_eq!(align_up(257), 512);
    }

    #[test]
    fn tracker_peak_follows_current_and_resets() {
        let t = MemTracker::default();
        t.add(100);
        t.add(50);
        t.sub(120);
        assert_eq!(t.current(), 30);
        assert_eq!(t.peak(), 150);
        t.reset_peak();
        assert_eq!(t.peak(), 30);
        t.add(10);
        assert_eq!(t.peak(), 40);
        t.add(60);
        t.sub(90);
        assert_eq!(t.take_peak(), 100);
        assert_eq!((t.current(), t.peak()), (10, 10));
    }
}
