//! The device: a CUDA context on one GPU, a compute stream and a copy stream,
//! timing events, and the probe that refuses cleanly where CUDA is absent.

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{result as dres, CudaContext, CudaEvent, CudaStream};

use crate::cuda::kit::tracker::MemTracker;
use crate::cuda::{CudaError, DriverContext};

/// Where cuBLASLt lives on the project's GPU machine (not in the linker cache).
pub const CUBLASLT_HINT: &str = "/usr/local/cuda-13.0/targets/x86_64-linux/lib";

/// Check that the CUDA driver, NVRTC and cuBLASLt libraries can be loaded.
///
/// Promise: never panics and loads no symbol; an absent library is
/// [`CudaError::NotAvailable`] naming it and what to do.
pub fn probe_libraries() -> Result<(), CudaError> {
    // SAFETY: these only try to dlopen the library by its candidate names.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver {
        return Err(CudaError::NotAvailable(
            "the CUDA driver library (libcuda.so.1) is not installed on this machine".into(),
        ));
    }
    let nvrtc = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    if !nvrtc {
        return Err(CudaError::NotAvailable(
            "NVRTC (libnvrtc.so.13) was not found: install the CUDA 13 toolkit or add its lib directory to LD_LIBRARY_PATH".into(),
        ));
    }
    let lt = unsafe { cudarc::cublaslt::sys::is_culib_present() };
    if !lt {
        return Err(CudaError::NotAvailable(format!(
            "cuBLASLt (libcublasLt.so.13) was not found: add its directory to LD_LIBRARY_PATH (on the H200 machine: {CUBLASLT_HINT})"
        )));
    }
    Ok(())
}

/// Primary contexts kept until the process exits (see [`Gpu::open`]).
static KEEP_ALIVE: std::sync::Mutex<Vec<Arc<CudaContext>>> = std::sync::Mutex::new(Vec::new());

/// One GPU with the engine's two streams.
pub struct Gpu {
    /// The (primary) context; event tracking is off (the engine orders work by
    /// streams and events itself).
    pub ctx: Arc<CudaContext>,
    /// All kernels and GEMMs run here.
    pub compute: Arc<CudaStream>,
    /// Host-to-device staging runs here, overlapping compute.
    pub copy: Arc<CudaStream>,
    /// Device name as the driver reports it.
    pub name: String,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    /// Number of multiprocessors.
    pub sms: i32,
    /// Largest dynamic shared memory a block may opt into, bytes.
    pub max_smem_optin: i32,
    /// Allocator accounting shared by every buffer of this device.
    pub mem: Arc<MemTracker>,
}

impl Gpu {
    /// Open GPU `ordinal`: probe the libraries, create the context and streams.
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        probe_libraries()?;
        let n = CudaContext::device_count().map_err(|e| {
            CudaError::NotAvailable(format!("the CUDA driver found no usable device ({e:?})"))
        })?;
        if n <= ordinal as i32 {
            return Err(CudaError::NotAvailable(format!(
                "GPU {ordinal} requested but the driver reports {n} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).ctx("creating the CUDA context")?;
        // The device's primary context lives as long as the process: dropping
        // the last model would otherwise tear it down (tens of ms, inside the
        // phase that frees the model) and the next device user would rebuild it.
        if let Ok(mut keep) = KEEP_ALIVE.lock() {
            if keep.iter().all(|c| c.ordinal() != ordinal) {
                keep.push(ctx.clone());
            }
        }
        // SAFETY: no CudaSlice exists yet; the engine uses raw allocations and
        // orders work itself.
        unsafe { ctx.disable_event_tracking() };
        let compute = ctx.new_stream().ctx("creating the compute stream")?;
        let copy = ctx.new_stream().ctx("creating the copy stream")?;
        let name = ctx.name().ctx("reading the device name")?;
        let capability = ctx
            .compute_capability()
            .ctx("reading the compute capability")?;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ctx("reading the multiprocessor count")?;
        let max_smem_optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .ctx("reading the shared-memory limit")?;
        Ok(Gpu {
            ctx,
            compute,
            copy,
            name,
            capability,
            sms,
            max_smem_optin,
            mem: Arc::new(MemTracker::default()),
        })
    }

    /// Make this context current on the calling thread (needed on threads the
    /// engine spawns before they call the driver).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().ctx("binding the CUDA context")
    }

    /// A timing event (`CU_EVENT_DEFAULT`).
    pub fn event(&self) -> Result<CudaEvent, CudaError> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .ctx("creating an event")
    }

    /// Wait until the compute stream has finished everything queued on it.
    pub fn sync_compute(&self) -> Result<(), CudaError> {
        self.compute
            .synchronize()
            .ctx("synchronizing the compute stream")
    }

    /// (free, total) device bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        self.bind()?;
        dres::mem_get_info().ctx("reading device memory info")
    }
}

/// Device time between two events recorded on one stream, from CUDA events.
pub struct Timer {
    start: CudaEvent,
    end: CudaEvent,
}

impl Timer {
    /// Two fresh timing events.
    pub fn new(gpu: &Gpu) -> Result<Timer, CudaError> {
        Ok(Timer {
            start: gpu.event()?,
            end: gpu.event()?,
        })
    }

    /// Record the start on `stream`.
    pub fn start(&self, stream: &CudaStream) -> Result<(), CudaError> {
        self.start.record(stream).ctx("recording a start event")
    }

    /// Record the end on `stream`.
    pub fn stop(&self, stream: &CudaStream) -> Result<(), CudaError> {
        self.end.record(stream).ctx("recording an end event")
    }

    /// Wait for the end event and return the elapsed device time in milliseconds.
    pub fn elapsed_ms(&self) -> Result<f64, CudaError> {
        self.end.synchronize().ctx("waiting for an end event")?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .ctx("reading elapsed event time")?;
        Ok(ms as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without the CUDA driver (CI), opening a GPU is a clean
    /// NotAvailable error, never a panic. Where a driver exists the call must
    /// not panic either; it may then succeed.
    #[test]
    fn open_without_cuda_is_a_clean_error() {
        let r = std::panic::catch_unwind(|| Gpu::open(0).map(|_| ()));
        let r = r.expect("Gpu::open must not panic");
        let driver = unsafe { cudarc::driver::sys::is_culib_present() };
        if !driver {
            let e = r.expect_err("no driver: must be an error");
            assert!(matches!(e, CudaError::NotAvailable(_)), "{e}");
            assert!(e.to_string().starts_with("no CUDA here"), "{e}");
        }
    }
}
