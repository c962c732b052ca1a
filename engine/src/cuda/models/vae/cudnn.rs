//! The cuDNN path of the 3x3x3 convolution: `cudnnConvolutionForward` through
//! cudarc's `ConvForward` (descriptors from `create_nd_tensor`,
//! `create_nd_filter` and `create_convnd`), NDHWC bf16 tensors, f32 compute,
//! tensor-op math, the algorithm from cuDNN's heuristics, one plan per shape.
//!
//! cuDNN is loaded at run time. cudarc panics on a missing library or symbol,
//! so [`CudnnConv::open`] probes for the library first and runs the first
//! calls under `catch_unwind`: an absent or unusable cuDNN is
//! [`CudaError::NotAvailable`], never a panic, and the decoder falls back to
//! the engine's own kernel.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cudnn::sys::{cudnnConvolutionFwdAlgo_t, cudnnConvolutionMode_t, cudnnMathType_t};
use cudarc::cudnn::{
    ConvDescriptor, ConvForward, Cudnn, CudnnError, FilterDescriptor, TensorDescriptor,
};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use half::bf16;

use crate::cuda::kit::context::Gpu;
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::CudaError;

/// Where cuDNN 9 lives on the project's GPU machine (inside the Python venv).
pub const CUDNN_HINT: &str =
    "python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))'`/lib";

/// A raw device range as cudarc's pointer traits want it (the engine orders
/// its work by streams itself, so no events are recorded).
struct Raw<'a, T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<'a, T> Raw<'a, T> {
    fn new(ptr: CUdeviceptr, len: usize, stream: &'a Arc<CudaStream>) -> Self {
        Raw {
            ptr,
            len,
            stream,
            _t: PhantomData,
        }
    }
}

impl<T> DeviceSlice<T> for Raw<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DevicePtr<T> for Raw<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for Raw<'_, T> {
    fn device_ptr_mut<'b>(&'b mut self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

/// Descriptors and algorithm of one convolution shape.
struct Plan {
    x: TensorDescriptor<bf16>,
    w: FilterDescriptor<bf16>,
    conv: ConvDescriptor<f32>,
    y: TensorDescriptor<bf16>,
    algo: cudnnConvolutionFwdAlgo_t,
    workspace: usize,
}

/// (ci, co, frames in, height, width).
pub type Shape = (usize, usize, usize, usize, usize);

/// A cuDNN handle on the compute stream, its plans and workspace.
pub struct CudnnConv {
    handle: Arc<Cudnn>,
    plans: HashMap<Shape, Plan>,
    /// The algorithm the heuristic chose for a convolution `(ci, co, h, w)`, reused
    /// for the same convolution at another frame count: the streamed decode pushes
    /// each convolution a few different frame counts, and the heuristic (about
    /// 2.5 ms of host time a call on an H100, s29) is most of a plan's cost.
    algos: HashMap<(usize, usize, usize, usize), cudnnConvolutionFwdAlgo_t>,
    /// Heuristic calls made (plans that could not reuse a sibling's algorithm).
    searched: usize,
    workspace: Option<DeviceBuffer>,
    /// `cudnnGetVersion()` (e.g. 91300 for 9.13.0).
    pub version: usize,
    /// Plans built since the handle opened, and the host seconds spent building
    /// them (descriptors, the heuristic's algorithm and its workspace size): a
    /// decode's first-use cost, read per chunk by the render's markers.
    built: (usize, f64),
}

fn dnn(what: &str, e: CudnnError) -> CudaError {
    CudaError::Invalid(format!("cuDNN failed while {what}: {e:?}"))
}

fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => Err(CudaError::NotAvailable(format!(
            "cuDNN panicked while {what} (a missing symbol or an unexpected library version)"
        ))),
    }
}

/// NDHWC strides of `[1, c, d, h, w]` as cuDNN's `[n, c, d, h, w]` dims.
fn ndhwc(c: usize, d: usize, h: usize, w: usize) -> Result<([i32; 5], [i32; 5]), CudaError> {
    let n = c * d * h * w;
    if n > i32::MAX as usize {
        return Err(CudaError::Invalid(format!(
            "a cuDNN tensor of {n} elements does not fit 32-bit strides"
        )));
    }
    let i = |v: usize| v as i32;
    Ok((
        [1, i(c), i(d), i(h), i(w)],
        [i(n), 1, i(h * w * c), i(w * c), i(c)],
    ))
}

impl CudnnConv {
    /// Loads cuDNN (probing first) and creates a handle on `gpu`'s compute stream.
    pub fn open(gpu: &Gpu) -> Result<CudnnConv, CudaError> {
        // SAFETY: only tries to dlopen the library by its candidate names.
        if !unsafe { cudarc::cudnn::sys::is_culib_present() } {
            return Err(CudaError::NotAvailable(format!(
                "cuDNN (libcudnn.so.9) was not found: add its lib directory to LD_LIBRARY_PATH \
                 (on the H200 machine: `{CUDNN_HINT}`)"
            )));
        }
        gpu.bind()?;
        let stream = gpu.compute.clone();
        guarded("loading", || {
            let version = cudarc::cudnn::result::get_version();
            let handle = Cudnn::new(stream).map_err(|e| dnn("creating a handle", e))?;
            Ok(CudnnConv {
                handle,
                plans: HashMap::new(),
                algos: HashMap::new(),
                searched: 0,
                workspace: None,
                version,
                built: (0, 0.0),
            })
        })
    }

    /// Descriptors for shape `s`, with `known`'s algorithm when it is given and
    /// cuDNN sizes a workspace for it at this shape, else the heuristic's choice.
    /// Returns the plan and whether the heuristic ran.
    fn plan(
        &self,
        s: Shape,
        known: Option<cudnnConvolutionFwdAlgo_t>,
    ) -> Result<(Plan, bool), CudaError> {
        let (ci, co, d, h, w) = s;
        let (xd, xs) = ndhwc(ci, d, h, w)?;
        let (yd, ys) = ndhwc(co, d - 2, h, w)?;
        let hd = &self.handle;
        guarded("planning a convolution", || {
            let x = hd
                .create_nd_tensor::<bf16>(&xd, &xs)
                .map_err(|e| dnn("describing the input", e))?;
            let y = hd
                .create_nd_tensor::<bf16>(&yd, &ys)
                .map_err(|e| dnn("describing the output", e))?;
            let wdesc = hd
                .create_nd_filter::<bf16>(
                    cudarc::cudnn::sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
                    &[co as i32, ci as i32, 3, 3, 3],
                )
                .map_err(|e| dnn("describing the filter", e))?;
            let mut conv = hd
                .create_convnd::<f32>(
                    &[0, 1, 1],
                    &[1, 1, 1],
                    &[1, 1, 1],
                    cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                )
                .map_err(|e| dnn("describing the convolution", e))?;
            conv.set_math_type(cudnnMathType_t::CUDNN_TENSOR_OP_MATH)
                .map_err(|e| dnn("asking for tensor-op math", e))?;
            let fwd = ConvForward {
                conv: &conv,
                x: &x,
                w: &wdesc,
                y: &y,
            };
            // A sibling's algorithm is kept only where cuDNN sizes a workspace
            // for it at this shape (an unsupported one answers NOT_SUPPORTED).
            let reused = known.and_then(|a| fwd.get_workspace_size(a).ok().map(|ws| (a, ws)));
            let searched = reused.is_none();
            let (algo, workspace) = match reused {
                Some(r) => r,
                None => {
                    let algo = fwd
                        .pick_algorithm()
                        .map_err(|e| dnn("choosing an algorithm", e))?;
                    let workspace = fwd
                        .get_workspace_size(algo)
                        .map_err(|e| dnn("sizing the workspace", e))?;
                    (algo, workspace)
                }
            };
            Ok((
                Plan {
                    x,
                    w: wdesc,
                    conv,
                    y,
                    algo,
                    workspace,
                },
                searched,
            ))
        })
    }

    /// Plans built since the handle opened and the host seconds they took.
    pub fn plans_built(&self) -> (usize, f64) {
        self.built
    }

    /// Heuristic calls since the handle opened: plans built minus those that
    /// reused the algorithm of the same convolution at another frame count.
    pub fn plans_searched(&self) -> usize {
        self.searched
    }

    /// The algorithms chosen so far, by shape (for reports).
    pub fn algorithms(&self) -> Vec<(Shape, String, usize)> {
        let mut v: Vec<_> = self
            .plans
            .iter()
            .map(|(s, p)| (*s, format!("{:?}", p.algo), p.workspace))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// The plan of `shape`, built now if this is its first use (counted in
    /// [`CudnnConv::plans_built`]), and a workspace at least as large as it asks for.
    fn ensure(&mut self, gpu: &Gpu, shape: Shape) -> Result<(), CudaError> {
        if !self.plans.contains_key(&shape) {
            let t0 = std::time::Instant::now();
            let key = (shape.0, shape.1, shape.3, shape.4);
            let (p, searched) = self.plan(shape, self.algos.get(&key).copied())?;
            if searched {
                self.searched += 1;
                self.algos.insert(key, p.algo);
            }
            self.plans.insert(shape, p);
            self.built.0 += 1;
            self.built.1 += t0.elapsed().as_secs_f64();
        }
        let need = self.plans.get(&shape).map_or(0, |p| p.workspace);
        if need > self.workspace.as_ref().map_or(0, |b| b.bytes()) {
            self.workspace = None;
            self.workspace = Some(DeviceBuffer::alloc(gpu, need, "the cuDNN workspace")?);
        }
        Ok(())
    }

    /// Builds the plans of `shapes` (`(ci, co, frames_in, h, w)`, in the order a
    /// decode first uses them, as [`crate::cuda::models::vae::shapes::conv3_shapes`]
    /// lists them; repeats cost nothing) and sizes the workspace for all of them,
    /// so that a decode asking for the same shapes builds none. The same order
    /// makes the same heuristic calls, so the algorithms are those the decode
    /// would have chosen itself. Returns the plans this call built.
    pub fn prepare(
        &mut self,
        gpu: &Gpu,
        shapes: impl IntoIterator<Item = Shape>,
    ) -> Result<usize, CudaError> {
        let before = self.built.0;
        for s in shapes {
            self.ensure(gpu, s)?;
        }
        Ok(self.built.0 - before)
    }

    /// Enqueues `y = conv(x, w)` on the compute stream: `frames_in` frames
    /// `[h, w, ci]` to `frames_in - 2` frames `[h, w, co]`, weight `[co][27][ci]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        x: CUdeviceptr,
        w: CUdeviceptr,
        y: CUdeviceptr,
        frames_in: usize,
        h: usize,
        wd: usize,
        ci: usize,
        co: usize,
    ) -> Result<(), CudaError> {
        let shape = (ci, co, frames_in, h, wd);
        self.ensure(gpu, shape)?;
        let plan = self
            .plans
            .get(&shape)
            .ok_or_else(|| CudaError::Invalid("a cuDNN plan vanished".into()))?;
        let s = &gpu.compute;
        let xr = Raw::<bf16>::new(x, frames_in * h * wd * ci, s);
        let wr = Raw::<bf16>::new(w, co * 27 * ci, s);
        let mut yr = Raw::<bf16>::new(y, (frames_in - 2) * h * wd * co, s);
        let mut ws = self
            .workspace
            .as_ref()
            .map(|b| Raw::<u8>::new(b.ptr(), b.bytes(), s));
        let fwd = ConvForward {
            conv: &plan.conv,
            x: &plan.x,
            w: &plan.w,
            y: &plan.y,
        };
        guarded("running a convolution", || {
            // SAFETY: the descriptors describe exactly these ranges (NDHWC bf16
            // input and output, KTRSC bf16 filter) and the workspace is at
            // least the size cuDNN asked for.
            unsafe {
                fwd.launch(
                    plan.algo,
                    ws.as_mut().filter(|_| plan.workspace > 0),
                    (bf16::ONE, bf16::ZERO),
                    &xr,
                    &wr,
                    &mut yr,
                )
            }
            .map_err(|e| dnn("running a convolution", e))
        })
    }
}
