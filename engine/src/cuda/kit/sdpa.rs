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
use std::panic::catch_unwind;
use std::sync::Mutex;

use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Ty,
    cudnnBackendDescriptorType_t as Kind, cudnnBackendDescriptor_t, cudnnDataType_t, cudnnHandle_t,
};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;

use crate::cuda::kit::context::{Gpu, Timer};
use crate::cuda::kit::cudnn_graph::{
    check, guarded, tensor as graph_tensor, variant_pack, Desc, TensorKind,
};
pub use crate::cuda::kit::cudnn_graph::{layout, DimsStrides, Shape};
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::kit::sdpa_fp8::{self, Fp8Ptrs};
use crate::cuda::CudaError;

/// The oldest cuDNN (as `cudnnGetVersion()`) with the SDPA-forward operation.
pub const MIN_VERSION: usize = 91300;

/// Where cuDNN 9 lives on the project's GPU machine (inside the Python venv).
pub const CUDNN_HINT: &str =
    "python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))'`/lib";

/// Unique ids of the graph's tensors (the variant pack's order).
const UIDS: [i64; 5] = [1, 2, 3, 4, 5];

/// A tensor of 4 dims: bf16 (or f32 by value, for the scale).
fn tensor(uid: i64, dims: [i64; 4], strides: [i64; 4], by_value: bool) -> Result<Desc, CudaError> {
    let dt = if by_value {
        cudnnDataType_t::CUDNN_DATA_FLOAT
    } else {
        cudnnDataType_t::CUDNN_DATA_BFLOAT16
    };
    let kind = if by_value {
        TensorKind::ByValue
    } else {
        TensorKind::Device
    };
    graph_tensor(uid, (dims, strides), dt, kind)
}

/// A finalized execution plan and its workspace size, plus the descriptors it
/// was built from (kept alive with it).
struct Plan<P> {
    plan: Desc,
    workspace: usize,
    /// Which engine configuration of the heuristics' list finalized (0 = first).
    choice: usize,
    _keep: Vec<Desc>,
    /// The kept variant pack and the pointers it holds.
    pack: Option<(Desc, P)>,
    /// The scale by value (the pack points at it).
    scale: Box<f32>,
}

/// The variant pack's data pointers of a plan's pointers `P`, given the
/// by-value scale's host address.
type PackData<P> = dyn Fn(&P, *mut f32) -> Vec<*mut c_void>;

/// The bf16 attention's pack data: q, k, v, o, then the scale ([`UIDS`]' order).
fn bf16_data(p: &[CUdeviceptr; 4], scale: *mut f32) -> Vec<*mut c_void> {
    let mut d: Vec<*mut c_void> = p.iter().map(|&a| a as *mut c_void).collect();
    d.push(scale as *mut c_void);
    d
}

impl<P: Copy + PartialEq> Plan<P> {
    fn new((plan, workspace, choice): (Desc, usize, usize), keep: Vec<Desc>, s: &Shape) -> Plan<P> {
        Plan {
            plan,
            workspace,
            choice,
            _keep: keep,
            pack: None,
            scale: Box::new(f32::from_bits(s.scale_bits)),
        }
    }

    /// Execute on `handle` over `ptrs`: the kept variant pack when it holds
    /// them, else a new one of `uids` and `data(ptrs, the scale's address)`
    /// with workspace `ws`. `what` names the operation in errors.
    fn run(
        &mut self,
        handle: cudnnHandle_t,
        ptrs: P,
        ws: CUdeviceptr,
        (uids, data): (&[i64], &PackData<P>),
        what: &str,
    ) -> Result<(), CudaError> {
        if self.pack.as_ref().map(|p| p.1) != Some(ptrs) {
            self.pack = None;
            let d = data(&ptrs, &mut *self.scale);
            let pack = guarded(what, || variant_pack(uids, &d, ws))?;
            self.pack = Some((pack, ptrs));
        }
        let pack =
            self.pack.as_ref().map(|p| p.0 .0).ok_or_else(|| {
                CudaError::Invalid(format!("the variant pack of {what} vanished"))
            })?;
        let exec = self.plan.0;
        guarded(what, || {
            // SAFETY: a finalized plan and a pack whose pointers address the
            // matrices and scalars the plan's tensors describe (the caller's
            // shape), on the handle's stream.
            check(
                unsafe { sys::cudnnBackendExecute(handle, exec, pack) },
                what,
            )
        })
    }
}

/// A cuDNN handle on the compute stream, its plans and workspace.
pub struct Sdpa {
    handle: cudnnHandle_t,
    inner: Mutex<Inner>,
    /// `cudnnGetVersion()` (e.g. 91400 for 9.14.0).
    pub version: usize,
}

struct Inner {
    plans: HashMap<Shape, Plan<[CUdeviceptr; 4]>>,
    /// The FP8 attention's plans (`attention-precision = fp8`, [`sdpa_fp8`]).
    fp8_plans: HashMap<Shape, Plan<Fp8Ptrs>>,
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
            i.fp8_plans.clear();
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
                    fp8_plans: HashMap::new(),
                    workspace: None,
                }),
                version,
            })
        })
    }

    fn plan(&self, s: &Shape) -> Result<Plan<[CUdeviceptr; 4]>, CudaError> {
        self.plan_nth(s, 0)
    }

    /// The bf16 attention's plan on the `skip`-th engine configuration of the
    /// heuristics' list that finalizes (0: the forward's).
    fn plan_nth(&self, s: &Shape, skip: usize) -> Result<Plan<[CUdeviceptr; 4]>, CudaError> {
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
        let (plan, workspace, choice, graph) =
            self.finalize_graph(&[&op], &format!("attention {s:?}"), skip)?;
        let mut keep = vec![q, k, v, o, sc, op];
        keep.extend(graph);
        Ok(Plan::new((plan, workspace, choice), keep, s))
    }

    /// The operation graph of `ops` on this handle, the heuristics' engine
    /// configurations (mode A) and the first of them whose execution plan
    /// finalizes, passing over `skip` that do: (plan, workspace bytes, its rank
    /// in the list, the graph's descriptors to keep alive with it). `what`
    /// names the problem in errors.
    pub(super) fn finalize_graph(
        &self,
        ops: &[&Desc],
        what_problem: &str,
        mut skip: usize,
    ) -> Result<(Desc, usize, usize, Vec<Desc>), CudaError> {
        let bd = Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR;
        let raw_ops: Vec<cudnnBackendDescriptor_t> = ops.iter().map(|d| d.0).collect();
        let what = "building the operation graph";
        let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what)?;
        graph.set(
            Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            Ty::CUDNN_TYPE_HANDLE,
            &[self.handle],
            what,
        )?;
        graph.set(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, bd, &raw_ops, what)?;
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
                "cuDNN {} offers no engine for {what_problem}",
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
            if skip > 0 {
                skip -= 1;
                continue;
            }
            let mut ws = [0i64];
            plan.get(
                Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                Ty::CUDNN_TYPE_INT64,
                Some(&mut ws),
                "reading the plan's workspace size",
            )?;
            return Ok((plan, ws[0].max(0) as usize, choice, vec![graph, heur]));
        }
        let finalized = (got.max(0) as usize).saturating_sub(errors.len());
        Err(CudaError::NotAvailable(if finalized == 0 {
            format!(
                "no engine of cuDNN {} finalizes {what_problem}: {}",
                self.version,
                errors.join("; ")
            )
        } else {
            format!(
                "cuDNN {} finalizes {finalized} engine configuration(s) of {count} for \
                 {what_problem}, none past those",
                self.version
            )
        }))
    }

    /// Build (once) the plan of `shape` and its workspace: call before a
    /// capture so that [`Sdpa::enqueue`] only executes.
    pub fn prepare(&self, gpu: &Gpu, shape: &Shape) -> Result<(), CudaError> {
        let mut inner = self.lock()?;
        if !inner.plans.contains_key(shape) {
            let p = guarded("planning attention", || self.plan(shape))?;
            inner.plans.insert(*shape, p);
        }
        let need = inner.plans.get(shape).map_or(0, |p| p.workspace);
        Self::grow_workspace(&mut inner, gpu, need)
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
        let mut inner = self.lock()?;
        // The forward's path: plan and workspace built by the warm-up, one lock.
        if !inner.plans.contains_key(shape) {
            drop(inner);
            self.prepare(gpu, shape)?;
            inner = self.lock()?;
        }
        let ws = inner.workspace.as_ref().map_or(0, |b| b.ptr());
        let plan = inner
            .plans
            .get_mut(shape)
            .ok_or_else(|| CudaError::Invalid("a cuDNN attention plan vanished".into()))?;
        plan.run(
            self.handle,
            [q, k, v, o],
            ws,
            (&UIDS, &bf16_data),
            "running attention",
        )
    }

    fn plan_fp8(&self, s: &Shape) -> Result<Plan<Fp8Ptrs>, CudaError> {
        let (mut keep, ops) = sdpa_fp8::graph(s)?;
        let refs: Vec<&Desc> = ops.iter().map(|&i| &keep[i]).collect();
        let (plan, workspace, choice, graph) =
            self.finalize_graph(&refs, &format!("FP8 attention {s:?}"), 0)?;
        keep.extend(graph);
        Ok(Plan::new((plan, workspace, choice), keep, s))
    }

    /// Build (once) the FP8 attention plan of `shape` and grow the workspace
    /// for it: call before a capture so that [`Sdpa::enqueue_fp8`] only
    /// executes. cuDNN without an engine for it is [`CudaError::NotAvailable`]
    /// naming the shape and each engine's refusal.
    pub fn prepare_fp8(&self, gpu: &Gpu, shape: &Shape) -> Result<(), CudaError> {
        let mut inner = self.lock()?;
        if !inner.fp8_plans.contains_key(shape) {
            let p = guarded("planning FP8 attention", || self.plan_fp8(shape))?;
            inner.fp8_plans.insert(*shape, p);
        }
        let need = inner.fp8_plans.get(shape).map_or(0, |p| p.workspace);
        Self::grow_workspace(&mut inner, gpu, need)
    }

    /// Enqueue the FP8 attention of `shape` over `ptrs` on the compute stream
    /// ([`sdpa_fp8`]; the plan is built first when it does not exist). The
    /// descales and scales are read from `ptrs.slots` when it runs.
    pub fn enqueue_fp8(&self, gpu: &Gpu, shape: &Shape, ptrs: Fp8Ptrs) -> Result<(), CudaError> {
        let mut inner = self.lock()?;
        if !inner.fp8_plans.contains_key(shape) {
            drop(inner);
            self.prepare_fp8(gpu, shape)?;
            inner = self.lock()?;
        }
        let ws = inner.workspace.as_ref().map_or(0, |b| b.ptr());
        let plan = inner
            .fp8_plans
            .get_mut(shape)
            .ok_or_else(|| CudaError::Invalid("an FP8 attention plan vanished".into()))?;
        let data = |p: &Fp8Ptrs, scale: *mut f32| p.data(scale).to_vec();
        plan.run(
            self.handle,
            ptrs,
            ws,
            (&sdpa_fp8::UIDS, &data),
            "running FP8 attention",
        )
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, CudaError> {
        self.inner
            .lock()
            .map_err(|_| CudaError::Invalid("the cuDNN attention lock is poisoned".into()))
    }

    /// Replace the workspace with one of `need` bytes when it is smaller.
    fn grow_workspace(inner: &mut Inner, gpu: &Gpu, need: usize) -> Result<(), CudaError> {
        if need > inner.workspace.as_ref().map_or(0, |b| b.bytes()) {
            // A grown workspace moves: every kept pack points at the old one.
            inner.workspace = None;
            for p in inner.plans.values_mut() {
                p.pack = None;
            }
            for p in inner.fp8_plans.values_mut() {
                p.pack = None;
            }
            inner.workspace = Some(DeviceBuffer::alloc(
                gpu,
                need,
                "the cuDNN attention workspace",
            )?);
        }
        Ok(())
    }

    /// Every engine configuration the heuristics offer for the bf16 attention
    /// of `shape` that finalizes, each run `reps` times (after one warm-up)
    /// over `q`, `k`, `v`, `o` on `gpu`'s compute stream with a workspace of
    /// its own: (its rank among those that finalize, its workspace bytes, the
    /// median milliseconds), at most `limit` of them. For the bench: the
    /// forward runs the first ([`Sdpa::prepare`]); this says whether a later
    /// one would be faster. The plans it builds are dropped.
    pub fn time_engines(
        &self,
        gpu: &Gpu,
        shape: &Shape,
        [q, k, v, o]: [CUdeviceptr; 4],
        (reps, limit): (usize, usize),
    ) -> Result<Vec<(usize, usize, f64)>, CudaError> {
        let _lock = self.lock()?;
        let mut out = Vec::new();
        for n in 0..limit {
            let mut plan = match guarded("planning attention", || self.plan_nth(shape, n)) {
                Ok(p) => p,
                // Past the last configuration that finalizes; any other error is one.
                Err(CudaError::NotAvailable(_)) if n > 0 => break,
                Err(e) => return Err(e),
            };
            let ws = DeviceBuffer::alloc(gpu, plan.workspace.max(16), "a candidate's workspace")?;
            let timer = Timer::new(gpu)?;
            let mut times = Vec::with_capacity(reps.max(1));
            for i in 0..=reps.max(1) {
                timer.start(&gpu.compute)?;
                plan.run(
                    self.handle,
                    [q, k, v, o],
                    ws.ptr(),
                    (&UIDS, &bf16_data),
                    "timing an engine",
                )?;
                timer.stop(&gpu.compute)?;
                if i > 0 {
                    times.push(timer.elapsed_ms()?);
                }
            }
            times.sort_by(f64::total_cmp);
            out.push((n, plan.workspace, times[times.len() / 2]));
        }
        Ok(out)
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
