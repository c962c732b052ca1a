//! cuDNN's fused scaled-dot-product attention (the `attention = cudnn` arm):
//! `O = softmax(Q Kᵀ · scale) V` per head, bf16 in and out, through cuDNN's
//! backend graph API with its dedicated SDPA-forward operation
//! (`CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR`, cuDNN 9.13 and later).
//!
//! Tensors stay where the DiT keeps them: row-major `[tokens, ld]` matrices
//! whose head `h` occupies columns `[h·hd, (h+1)·hd)`. cuDNN sees them as
//! `[batch 1, heads, tokens, hd]` with strides `[tokens·ld, hd, ld, 1]`, so
//! nothing is transposed or copied. The scale rides by value.
//!
//! One plan (operation graph, the first engine configuration of cuDNN's
//! heuristics that finalizes, and its execution plan) is built per shape and
//! kept; the variant pack (the five pointers and the workspace) is kept per
//! plan and rebuilt only when a pointer changes, so a forward's calls cost one
//! `cudnnBackendExecute` each and a forward can be captured into a CUDA graph
//! (the plan and pack are built by the warm-up forward, before any capture).
//!
//! cuDNN is loaded at run time: [`Sdpa::open`] probes for the library, checks
//! its version and runs every call under `catch_unwind` (cudarc panics on a
//! missing symbol), so an absent or too old cuDNN is
//! [`CudaError::NotAvailable`], never a panic.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Ty,
    cudnnBackendDescriptorType_t as Kind, cudnnBackendDescriptor_t, cudnnDataType_t, cudnnHandle_t,
    cudnnStatus_t,
};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;

use crate::cuda::kit::context::Gpu;
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::CudaError;

/// The oldest cuDNN (as `cudnnGetVersion()`) with the SDPA-forward operation.
pub const MIN_VERSION: usize = 91300;

/// Where cuDNN 9 lives on the project's GPU machine (inside the Python venv).
pub const CUDNN_HINT: &str =
    "python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))'`/lib";

/// Unique ids of the graph's tensors (the variant pack's order).
const UIDS: [i64; 5] = [1, 2, 3, 4, 5];

/// One attention problem: heads, head dim, query and key rows, and the four
/// matrices' leading dimensions (elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Heads.
    pub heads: usize,
    /// Channels per head.
    pub hd: usize,
    /// Query rows (tokens).
    pub nq: usize,
    /// Key and value rows.
    pub nk: usize,
    /// Leading dimensions of q, k, v and o, in elements.
    pub ld: [usize; 4],
    /// The softmax scale's bits (f32), part of the key because it is baked
    /// into the kept variant pack.
    pub scale_bits: u32,
}

/// A cuDNN backend descriptor, destroyed on drop.
struct Desc(cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once.
            unsafe {
                sys::cudnnBackendDestroyDescriptor(self.0);
            }
        }
    }
}

fn last_error() -> String {
    let mut buf = [0 as std::ffi::c_char; 512];
    // SAFETY: cuDNN writes at most `len` bytes, NUL-terminated.
    unsafe { sys::cudnnGetLastErrorString(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated within the buffer (zero-initialized, max_size given).
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    s.to_string_lossy().trim().to_string()
}

fn check(st: cudnnStatus_t, what: &str) -> Result<(), CudaError> {
    if st == cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    let detail = last_error();
    let msg = format!(
        "cuDNN failed while {what}: {st:?}{}",
        if detail.is_empty() {
            String::new()
        } else {
            format!(" ({detail})")
        }
    );
    if matches!(
        st,
        cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED
            | cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH
    ) {
        Err(CudaError::NotAvailable(msg))
    } else {
        Err(CudaError::Invalid(msg))
    }
}

fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => Err(CudaError::NotAvailable(format!(
            "cuDNN panicked while {what} (a missing symbol or an unexpected library version)"
        ))),
    }
}

impl Desc {
    fn new(kind: Kind, what: &str) -> Result<Desc, CudaError> {
        let mut d: cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `d` receives a new descriptor of `kind`.
        check(
            unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut d) },
            what,
        )?;
        Ok(Desc(d))
    }

    /// Set attribute `a` to the `n` values of type `ty` at `vals`.
    fn set<T>(&self, a: Attr, ty: Ty, vals: &[T], what: &str) -> Result<(), CudaError> {
        // SAFETY: `vals` holds `vals.len()` values of the C type `ty` names
        // (callers pass i64 for INT64, the enums for their enum types,
        // descriptors for BACKEND_DESCRIPTOR, pointers for VOID_PTR).
        check(
            unsafe {
                sys::cudnnBackendSetAttribute(
                    self.0,
                    a,
                    ty,
                    vals.len() as i64,
                    vals.as_ptr() as *const c_void,
                )
            },
            what,
        )
    }

    /// Read attribute `a` (type `ty`) into `out` (`None`: only count the
    /// elements); returns how many elements the attribute holds.
    fn get<T>(&self, a: Attr, ty: Ty, out: Option<&mut [T]>, what: &str) -> Result<i64, CudaError> {
        let mut n: i64 = 0;
        let (cap, ptr) = match out {
            Some(o) => (o.len() as i64, o.as_mut_ptr() as *mut c_void),
            None => (0, std::ptr::null_mut()),
        };
        // SAFETY: `ptr` holds `cap` values of the C type `ty` names (or is null
        // with `cap` 0: a count query).
        check(
            unsafe { sys::cudnnBackendGetAttribute(self.0, a, ty, cap, &mut n, ptr) },
            what,
        )?;
        Ok(n)
    }

    fn finalize(&self, what: &str) -> Result<(), CudaError> {
        // SAFETY: a descriptor whose required attributes were set.
        check(unsafe { sys::cudnnBackendFinalize(self.0) }, what)
    }
}

/// A tensor of 4 dims: bf16 (or f32 by value, for the scale).
fn tensor(uid: i64, dims: [i64; 4], strides: [i64; 4], by_value: bool) -> Result<Desc, CudaError> {
    let t = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR, "creating a tensor")?;
    let dt = if by_value {
        cudnnDataType_t::CUDNN_DATA_FLOAT
    } else {
        cudnnDataType_t::CUDNN_DATA_BFLOAT16
    };
    let what = "describing a tensor";
    t.set(
        Attr::CUDNN_ATTR_TENSOR_DATA_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[dt],
        what,
    )?;
    t.set(
        Attr::CUDNN_ATTR_TENSOR_DIMENSIONS,
        Ty::CUDNN_TYPE_INT64,
        &dims,
        what,
    )?;
    t.set(
        Attr::CUDNN_ATTR_TENSOR_STRIDES,
        Ty::CUDNN_TYPE_INT64,
        &strides,
        what,
    )?;
    t.set(
        Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID,
        Ty::CUDNN_TYPE_INT64,
        &[uid],
        what,
    )?;
    let align: i64 = if by_value { 4 } else { 16 };
    t.set(
        Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        Ty::CUDNN_TYPE_INT64,
        &[align],
        what,
    )?;
    if by_value {
        t.set(
            Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
            Ty::CUDNN_TYPE_BOOLEAN,
            &[true],
            what,
        )?;
    }
    t.finalize(what)?;
    Ok(t)
}

/// A tensor's 4 dims and 4 strides (elements), as cuDNN takes them.
pub type DimsStrides = ([i64; 4], [i64; 4]);

/// Dims and strides (elements) of q, k, v and o as cuDNN's `[batch 1, heads,
/// tokens, hd]` over the DiT's row-major `[tokens, ld]` matrices (head `h` at
/// columns `h·hd`): strides `[tokens·ld, hd, ld, 1]`. Refuses what cuDNN's
/// kernels cannot address: a head dim not a multiple of 8 or over 256, a
/// leading dimension below heads·hd or not a multiple of 8 (16-byte rows), an
/// empty sequence.
pub fn layout(s: &Shape) -> Result<[DimsStrides; 4], CudaError> {
    let width = s.heads * s.hd;
    if s.hd == 0 || s.hd % 8 != 0 || s.hd > 256 || s.nq == 0 || s.nk == 0 || s.heads == 0 {
        return Err(CudaError::Invalid(format!(
            "cuDNN attention needs heads >= 1, a head dim that is a multiple of 8 up to 256 \
             and non-empty sequences; got {s:?}"
        )));
    }
    if let Some(ld) = s.ld.iter().find(|ld| **ld < width || **ld % 8 != 0) {
        return Err(CudaError::Invalid(format!(
            "cuDNN attention: leading dimension {ld} is below heads x hd = {width} or not a \
             multiple of 8 ({s:?})"
        )));
    }
    let (h, hd) = (s.heads as i64, s.hd as i64);
    let one = |rows: usize, ld: usize| {
        let (rows, ld) = (rows as i64, ld as i64);
        ([1, h, rows, hd], [rows * ld, hd, ld, 1])
    };
    Ok([
        one(s.nq, s.ld[0]),
        one(s.nk, s.ld[1]),
        one(s.nk, s.ld[2]),
        one(s.nq, s.ld[3]),
    ])
}

/// A finalized execution plan and its workspace size, plus the descriptors it
/// was built from (kept alive with it).
struct Plan {
    plan: Desc,
    workspace: usize,
    /// Which engine configuration of the heuristics' list finalized (0 = first).
    choice: usize,
    _keep: Vec<Desc>,
    /// The kept variant pack and the pointers it holds.
    pack: Option<(Desc, [CUdeviceptr; 4])>,
    /// The scale by value (the pack points at it).
    scale: Box<f32>,
}

/// A cuDNN handle on the compute stream, its plans and workspace.
pub struct Sdpa {
    handle: cudnnHandle_t,
    inner: Mutex<Inner>,
    /// `cudnnGetVersion()` (e.g. 91400 for 9.14.0).
    pub version: usize,
}

struct Inner {
    plans: HashMap<Shape, Plan>,
    workspace: Option<DeviceBuffer>,
}

// SAFETY: the handle is used from one thread at a time (the mutex is held for
// every call that touches it or the plans).
unsafe impl Send for Sdpa {}
unsafe impl Sync for Sdpa {}

impl Drop for Sdpa {
    fn drop(&mut self) {
        if let Ok(mut i) = self.inner.lock() {
            i.plans.clear();
        }
        // SAFETY: created in `open`, destroyed once, after every plan.
        let _ = catch_unwind(|| unsafe { cudarc::cudnn::result::destroy_handle(self.handle) });
    }
}

impl Sdpa {
    /// Loads cuDNN (probing first), checks that it is at least
    /// [`MIN_VERSION`], and creates a handle on `gpu`'s compute stream.
    pub fn open(gpu: &Gpu) -> Result<Sdpa, CudaError> {
        // SAFETY: only tries to dlopen the library by its candidate names.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NotAvailable(format!(
                "cuDNN (libcudnn.so.9) was not found: add its lib directory to LD_LIBRARY_PATH \
                 (on the H200 machine: `{CUDNN_HINT}`)"
            )));
        }
        gpu.bind()?;
        let stream: &CudaStream = &gpu.compute;
        let cu = stream.cu_stream();
        guarded("loading", || {
            let version = cudarc::cudnn::result::get_version();
            if version < MIN_VERSION {
                return Err(CudaError::NotAvailable(format!(
                    "cuDNN {version} has no fused SDPA-forward operation (needs {MIN_VERSION} or later)"
                )));
            }
            let handle = cudarc::cudnn::result::create_handle()
                .map_err(|e| CudaError::Invalid(format!("creating a cuDNN handle: {e:?}")))?;
            // SAFETY: a live handle and the context's own stream.
            unsafe { cudarc::cudnn::result::set_stream(handle, cu as _) }
                .map_err(|e| CudaError::Invalid(format!("binding cuDNN to the stream: {e:?}")))?;
            Ok(Sdpa {
                handle,
                inner: Mutex::new(Inner {
                    plans: HashMap::new(),
                    workspace: None,
                }),
                version,
            })
        })
    }

    fn plan(&self, s: &Shape) -> Result<Plan, CudaError> {
        let [(qd, qs), (kd, ks), (vd, vs), (od, os)] = layout(s)?;
        let q = tensor(UIDS[0], qd, qs, false)?;
        let k = tensor(UIDS[1], kd, ks, false)?;
        let v = tensor(UIDS[2], vd, vs, false)?;
        let o = tensor(UIDS[3], od, os, false)?;
        let sc = tensor(UIDS[4], [1, 1, 1, 1], [1, 1, 1, 1], true)?;
        let what = "describing the SDPA operation";
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, what)?;
        let bd = Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR;
        op.set(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, bd, &[q.0], what)?;
        op.set(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, bd, &[k.0], what)?;
        op.set(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, bd, &[v.0], what)?;
        op.set(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, bd, &[o.0], what)?;
        op.set(
            Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC,
            bd,
            &[sc.0],
            what,
        )?;
        op.finalize(what)?;
        let what = "building the operation graph";
        let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what)?;
        graph.set(
            Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            Ty::CUDNN_TYPE_HANDLE,
            &[self.handle],
            what,
        )?;
        graph.set(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, bd, &[op.0], what)?;
        graph.finalize(what)?;
        let what = "asking the heuristics for engines";
        let heur = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what)?;
        heur.set(
            Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
            bd,
            &[graph.0],
            what,
        )?;
        heur.set(
            Attr::CUDNN_ATTR_ENGINEHEUR_MODE,
            Ty::CUDNN_TYPE_HEUR_MODE,
            &[sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
            what,
        )?;
        heur.finalize(what)?;
        let count = heur.get::<cudnnBackendDescriptor_t>(
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            bd,
            None,
            what,
        )?;
        if count <= 0 {
            return Err(CudaError::NotAvailable(format!(
                "cuDNN {} offers no engine for attention {s:?}",
                self.version
            )));
        }
        let cfgs = (0..count)
            .map(|_| Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raw: Vec<cudnnBackendDescriptor_t> = cfgs.iter().map(|d| d.0).collect();
        // Fills the created engine-config descriptors in `raw`.
        let got = heur.get(
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            bd,
            Some(&mut raw),
            what,
        )?;
        let mut errors = Vec::new();
        for (choice, cfg) in cfgs.iter().take(got.max(0) as usize).enumerate() {
            let what = "finalizing an execution plan";
            let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what)?;
            plan.set(
                Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                Ty::CUDNN_TYPE_HANDLE,
                &[self.handle],
                what,
            )?;
            plan.set(
                Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                bd,
                &[cfg.0],
                what,
            )?;
            if let Err(e) = plan.finalize(what) {
                errors.push(e.to_string());
                continue;
            }
            let mut ws = [0i64];
            plan.get(
                Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                Ty::CUDNN_TYPE_INT64,
                Some(&mut ws),
                "reading the plan's workspace size",
            )?;
            let ws = ws[0];
            return Ok(Plan {
                plan,
                workspace: ws.max(0) as usize,
                choice,
                _keep: vec![q, k, v, o, sc, op, graph, heur],
                pack: None,
                scale: Box::new(f32::from_bits(s.scale_bits)),
            });
        }
        Err(CudaError::NotAvailable(format!(
            "no engine of cuDNN {} finalizes attention {s:?}: {}",
            self.version,
            errors.join("; ")
        )))
    }

    /// Build (once) the plan of `shape` and its workspace: call before a
    /// capture so that [`Sdpa::enqueue`] only executes.
    pub fn prepare(&self, gpu: &Gpu, shape: &Shape) -> Result<(), CudaError> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| CudaError::Invalid("the cuDNN attention lock is poisoned".into()))?;
        if !inner.plans.contains_key(shape) {
            let p = guarded("planning attention", || self.plan(shape))?;
            inner.plans.insert(*shape, p);
        }
        let need = inner.plans.get(shape).map_or(0, |p| p.workspace);
        if need > inner.workspace.as_ref().map_or(0, |b| b.bytes()) {
            inner.workspace = None;
            inner.workspace = Some(DeviceBuffer::alloc(
                gpu,
                need,
                "the cuDNN attention workspace",
            )?);
        }
        Ok(())
    }

    /// Enqueue `o = softmax(q kᵀ · scale) v` on the compute stream (the
    /// handle's stream) for `shape`; the plan must exist
    /// ([`Sdpa::prepare`], which this calls when it does not).
    pub fn enqueue(
        &self,
        gpu: &Gpu,
        shape: &Shape,
        q: CUdeviceptr,
        k: CUdeviceptr,
        v: CUdeviceptr,
        o: CUdeviceptr,
    ) -> Result<(), CudaError> {
        let lock = || {
            self.inner
                .lock()
                .map_err(|_| CudaError::Invalid("the cuDNN attention lock is poisoned".into()))
        };
        let mut inner = lock()?;
        // The forward's path: plan and workspace built by the warm-up, one lock.
        if !inner.plans.contains_key(shape) {
            drop(inner);
            self.prepare(gpu, shape)?;
            inner = lock()?;
        }
        let ws = inner.workspace.as_ref().map_or(0, |b| b.ptr());
        let plan = inner
            .plans
            .get_mut(shape)
            .ok_or_else(|| CudaError::Invalid("a cuDNN attention plan vanished".into()))?;
        let ptrs = [q, k, v, o];
        if plan.pack.as_ref().map(|p| p.1) != Some(ptrs) {
            plan.pack = None;
            let what = "building the variant pack";
            let pack = guarded(what, || {
                let pack = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what)?;
                let data: [*mut c_void; 5] = [
                    q as *mut c_void,
                    k as *mut c_void,
                    v as *mut c_void,
                    o as *mut c_void,
                    &mut *plan.scale as *mut f32 as *mut c_void,
                ];
                pack.set(
                    Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                    Ty::CUDNN_TYPE_INT64,
                    &UIDS,
                    what,
                )?;
                pack.set(
                    Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                    Ty::CUDNN_TYPE_VOID_PTR,
                    &data,
                    what,
                )?;
                let w: [*mut c_void; 1] = [ws as *mut c_void];
                pack.set(
                    Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                    Ty::CUDNN_TYPE_VOID_PTR,
                    &w,
                    what,
                )?;
                pack.finalize(what)?;
                Ok(pack)
            })?;
            plan.pack = Some((pack, ptrs));
        }
        let pack = plan
            .pack
            .as_ref()
            .map(|p| p.0 .0)
            .ok_or_else(|| CudaError::Invalid("the variant pack vanished".into()))?;
        let exec = plan.plan.0;
        guarded("running attention", || {
            // SAFETY: a finalized plan and a pack whose pointers address the
            // matrices the plan's tensors describe (checked by the caller's
            // shape), on the handle's stream.
            check(
                unsafe { sys::cudnnBackendExecute(self.handle, exec, pack) },
                "running attention",
            )
        })
    }

    /// The plans built so far: shape, the engine configuration's rank in the
    /// heuristics' list, and its workspace bytes (for reports).
    pub fn plans(&self) -> Vec<(Shape, usize, usize)> {
        self.inner
            .lock()
            .map(|i| {
                let mut v: Vec<_> = i
                    .plans
                    .iter()
                    .map(|(s, p)| (*s, p.choice, p.workspace))
                    .collect();
                v.sort_by_key(|x| (x.0.hd, x.0.nq, x.0.nk));
                v
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(hd: usize, ld: [usize; 4]) -> Shape {
        Shape {
            heads: 32,
            hd,
            nq: 6144,
            nk: 77,
            ld,
            scale_bits: 0.125f32.to_bits(),
        }
    }

    /// Element (token t, head h, channel c) of a `[tokens, ld]` matrix sits at
    /// t·ld + h·hd + c: the strides must say exactly that, for every matrix and
    /// its own row count and leading dimension. Red on strides with heads and
    /// tokens swapped, or on q's leading dimension used for k.
    #[test]
    fn strides_address_the_dits_row_major_heads() {
        let s = shape(64, [2048, 3 * 2048, 3 * 2048, 2048 + 8]);
        let l = layout(&s).unwrap();
        for (i, (dims, strides)) in l.iter().enumerate() {
            let rows = if i == 0 || i == 3 { 6144 } else { 77 };
            assert_eq!(*dims, [1, 32, rows, 64], "tensor {i}");
            let ld = s.ld[i] as i64;
            let (t, h, c) = (5i64, 3i64, 7i64);
            let at = h * strides[1] + t * strides[2] + c * strides[3];
            assert_eq!(at, t * ld + h * 64 + c, "tensor {i}");
            assert_eq!(strides[0], rows * ld, "tensor {i}");
        }
    }

    #[test]
    fn shapes_cudnn_cannot_address_are_refused_by_name() {
        let e = layout(&shape(60, [1920; 4])).unwrap_err().to_string();
        assert!(e.contains("multiple of 8"), "{e}");
        let e = layout(&shape(64, [2048, 2000, 2048, 2048]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("leading dimension 2000"), "{e}");
        let mut z = shape(128, [4096; 4]);
        z.nk = 0;
        assert!(layout(&z).is_err());
        assert!(layout(&shape(128, [4096; 4])).is_ok());
    }
}
