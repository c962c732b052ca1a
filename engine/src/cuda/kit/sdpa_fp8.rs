//! cuDNN's FP8 fused attention (the `attention-precision = fp8` arm):
//! `O = e4m3(scale_o · softmax(Q Kᵀ · scale · dq · dk) · V)` per head, with e4m3
//! q, k, v and output, one f32 descale per input and the probabilities
//! quantized to e4m3 (scale 448) between the two products, on Hopper (cuDNN's
//! FP8 SDPA needs compute capability 9.0; its output is e4m3 there).
//!
//! cuDNN 9.14 has no FP8 form of its dedicated SDPA-forward operation, so this is
//! the composite graph its fused-attention engine recognises (the pattern
//! cudnn-frontend's `sdpa_fp8` node lowers to, read from its public source, not
//! copied): a matmul of Q and Kᵀ, three pointwise multiplies (the softmax scale
//! by value, the two descales), the softmax as reductions and pointwise
//! operations (max, subtract, exp, sum, log + add for the statistics it keeps
//! virtual, divide), the amax of the probabilities, their scale into e4m3, the
//! second matmul, the descales of the probabilities and of v, the output's scale
//! into e4m3 and the amax of the output before it. Every intermediate is a
//! virtual f32 tensor (e4m3 for the scaled probabilities).
//!
//! The layout is [`super::cudnn_graph::layout`]'s: `[tokens, ld]` matrices, head `h` at
//! columns `h·hd`, seen as `[1, heads, tokens, hd]`; Kᵀ is the same bytes with
//! the last two dims and strides swapped. The descales and scales are device
//! f32 read at run time ([`super::fp8::Fp8Attn`]'s slots), so the plan and
//! its variant pack are built once per shape and a forward can be captured.

use std::ffi::c_void;

use cudarc::cudnn::sys::{
    cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Ty,
    cudnnBackendDescriptorType_t as Kind, cudnnDataType_t, cudnnPointwiseMode_t,
    cudnnReduceTensorOp_t,
};
use cudarc::driver::sys::CUdeviceptr;

use super::cudnn_graph::{guarded, layout, tensor, Desc, DimsStrides, Shape, TensorKind};
use super::fp8::Fp8Attn;
use crate::cuda::CudaError;

/// The variant pack's unique ids, in the order of its data pointers: Q, Kᵀ, V, O, the
/// softmax scale (by value), descale q, k, v, s, scale s, scale o, amax s, amax o.
pub const UIDS: [i64; 13] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13];

/// The oldest compute capability cuDNN runs FP8 attention on (Hopper).
pub const MIN_CAPABILITY: (i32, i32) = (9, 0);

/// The smallest head dimension the engine runs cuDNN's FP8 attention at.
/// At head dim 64 with 32 heads (the 2B model's shape), cuDNN 9.14 on an H100
/// wrote outputs 9-25x too large at 1024-6144 tokens while its own amax of the
/// output was right (s36-dev2, `reports/device-notes.md`); 2 heads at head dim
/// 64 and every head-dim-128 shape were right. It was also no faster there
/// (523 against 498 TFLOP/s for the bf16 attention, s36-dev1).
pub const MIN_HEAD_DIM: usize = 128;

/// The device addresses one FP8 attention reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Ptrs {
    /// e4m3 q, k, v (`[tokens, ld]` each, the shape's leading dimensions).
    pub qkv: [CUdeviceptr; 3],
    /// e4m3 output (`[nq, ld]`).
    pub o: CUdeviceptr,
    /// [`Fp8Attn`]'s slot buffer (descales, scales, amax outputs).
    pub slots: CUdeviceptr,
}

impl Fp8Ptrs {
    /// The pack's pointers in [`UIDS`]' order; `scale` is the by-value softmax
    /// scale's host address.
    pub(super) fn data(&self, scale: *mut f32) -> [*mut c_void; 13] {
        let s = |i: usize| (self.slots + (i * 4) as CUdeviceptr) as *mut c_void;
        [
            self.qkv[0] as *mut c_void,
            self.qkv[1] as *mut c_void,
            self.qkv[2] as *mut c_void,
            self.o as *mut c_void,
            scale as *mut c_void,
            s(Fp8Attn::DESCALE_Q),
            s(Fp8Attn::DESCALE_K),
            s(Fp8Attn::DESCALE_V),
            s(Fp8Attn::DESCALE_S),
            s(Fp8Attn::SCALE_S),
            s(Fp8Attn::SCALE_O),
            s(Fp8Attn::AMAX_S),
            s(Fp8Attn::AMAX_O),
        ]
    }
}

const F32: cudnnDataType_t = cudnnDataType_t::CUDNN_DATA_FLOAT;
const E4M3: cudnnDataType_t = cudnnDataType_t::CUDNN_DATA_FP8_E4M3;
const BD: Ty = Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR;

/// A pointwise operation `y = mode(x[, b])`, f32 math.
fn pointwise(
    mode: cudnnPointwiseMode_t,
    x: &Desc,
    b: Option<&Desc>,
    y: &Desc,
) -> Result<[Desc; 2], CudaError> {
    let what = "describing an FP8 attention pointwise operation";
    let pw = Desc::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what)?;
    pw.set(
        Attr::CUDNN_ATTR_POINTWISE_MODE,
        Ty::CUDNN_TYPE_POINTWISE_MODE,
        &[mode],
        what,
    )?;
    pw.set(
        Attr::CUDNN_ATTR_POINTWISE_MATH_PREC,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[F32],
        what,
    )?;
    pw.finalize(what)?;
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what)?;
    op.set(
        Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
        BD,
        &[pw.0],
        what,
    )?;
    op.set(Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, BD, &[x.0], what)?;
    if let Some(b) = b {
        op.set(Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, BD, &[b.0], what)?;
    }
    op.set(Attr::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, BD, &[y.0], what)?;
    op.finalize(what)?;
    Ok([pw, op])
}

/// A reduction `y = reduce(x)` over the dims where `y` has extent 1, f32.
fn reduction(op_kind: cudnnReduceTensorOp_t, x: &Desc, y: &Desc) -> Result<[Desc; 2], CudaError> {
    let what = "describing an FP8 attention reduction";
    let r = Desc::new(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what)?;
    r.set(
        Attr::CUDNN_ATTR_REDUCTION_OPERATOR,
        Ty::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
        &[op_kind],
        what,
    )?;
    r.set(
        Attr::CUDNN_ATTR_REDUCTION_COMP_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[F32],
        what,
    )?;
    r.finalize(what)?;
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what)?;
    op.set(Attr::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, BD, &[x.0], what)?;
    op.set(Attr::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, BD, &[y.0], what)?;
    op.set(Attr::CUDNN_ATTR_OPERATION_REDUCTION_DESC, BD, &[r.0], what)?;
    op.finalize(what)?;
    Ok([r, op])
}

/// A batched matmul `c = a · b` over the leading two dims, f32 accumulation.
fn matmul(a: &Desc, b: &Desc, c: &Desc) -> Result<[Desc; 2], CudaError> {
    let what = "describing an FP8 attention matmul";
    let m = Desc::new(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR, what)?;
    m.set(
        Attr::CUDNN_ATTR_MATMUL_COMP_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[F32],
        what,
    )?;
    m.finalize(what)?;
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what)?;
    op.set(Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, BD, &[a.0], what)?;
    op.set(Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, BD, &[b.0], what)?;
    op.set(Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, BD, &[c.0], what)?;
    op.set(Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, BD, &[m.0], what)?;
    op.finalize(what)?;
    Ok([m, op])
}

/// The graph's operations for shape `s`, in the order the pattern lists them:
/// (every descriptor to keep alive, the indices of the operations among them).
pub(super) fn graph(s: &Shape) -> Result<(Vec<Desc>, Vec<usize>), CudaError> {
    guarded("describing FP8 attention", || graph_inner(s))
}

/// [`layout`] for e4m3 operands: also a head dim and leading dimensions that
/// are multiples of 16 (one byte an element: 16-byte rows and head slices),
/// as cuDNN's FP8 attention on Hopper requires (cudnn-frontend's support
/// checks: head dim a multiple of 16, at most 256).
fn fp8_layout(s: &Shape) -> Result<[DimsStrides; 4], CudaError> {
    if s.hd % 16 != 0 || s.ld.iter().any(|ld| ld % 16 != 0) {
        return Err(CudaError::Invalid(format!(
            "cuDNN FP8 attention needs a head dim and leading dimensions that are multiples \
             of 16; got {s:?}"
        )));
    }
    layout(s)
}

fn graph_inner(s: &Shape) -> Result<(Vec<Desc>, Vec<usize>), CudaError> {
    use cudnnPointwiseMode_t as P;
    use cudnnReduceTensorOp_t as R;
    let [(qd, qs), (kd, ks), (vd, vs), (od, os)] = fp8_layout(s)?;
    let (h, nq, nk, hd) = (s.heads as i64, s.nq as i64, s.nk as i64, s.hd as i64);
    // Kᵀ: the same bytes, the last two dims and strides swapped.
    let (ktd, kts) = ([kd[0], kd[1], kd[3], kd[2]], [ks[0], ks[1], ks[3], ks[2]]);
    let one = ([1i64; 4], [1i64; 4]);
    let sd = ([1, h, nq, nk], [h * nq * nk, nq * nk, nk, 1]);
    let rd = ([1, h, nq, 1], [h * nq, nq, 1, 1]);
    let o1d = ([1, h, nq, hd], [h * nq * hd, nq * hd, hd, 1]);
    let ext = |uid, d, dt| tensor(uid, d, dt, TensorKind::Device);
    let virt = |uid, d, dt| tensor(uid, d, dt, TensorKind::Virtual);
    let q = ext(UIDS[0], (qd, qs), E4M3)?;
    let kt = ext(UIDS[1], (ktd, kts), E4M3)?;
    let v = ext(UIDS[2], (vd, vs), E4M3)?;
    let o = ext(UIDS[3], (od, os), E4M3)?;
    let scale = tensor(UIDS[4], one, F32, TensorKind::ByValue)?;
    let descale_q = ext(UIDS[5], one, F32)?;
    let descale_k = ext(UIDS[6], one, F32)?;
    let descale_v = ext(UIDS[7], one, F32)?;
    let descale_s = ext(UIDS[8], one, F32)?;
    let scale_s = ext(UIDS[9], one, F32)?;
    let scale_o = ext(UIDS[10], one, F32)?;
    let amax_s = ext(UIDS[11], one, F32)?;
    let amax_o = ext(UIDS[12], one, F32)?;
    let s1 = virt(101, sd, F32)?;
    let s2 = virt(102, sd, F32)?;
    let s3 = virt(103, sd, F32)?;
    let s4 = virt(104, sd, F32)?;
    let m = virt(105, rd, F32)?;
    let s5 = virt(106, sd, F32)?;
    let s6 = virt(107, sd, F32)?;
    let z = virt(108, rd, F32)?;
    let lz = virt(109, rd, F32)?;
    let stats = virt(110, rd, F32)?;
    let p = virt(111, sd, F32)?;
    let p8 = virt(112, sd, E4M3)?;
    let o1 = virt(113, o1d, F32)?;
    let o2 = virt(114, o1d, F32)?;
    let o3 = virt(115, o1d, F32)?;
    let ops: Vec<[Desc; 2]> = vec![
        matmul(&q, &kt, &s1)?,
        pointwise(P::CUDNN_POINTWISE_MUL, &s1, Some(&scale), &s2)?,
        pointwise(P::CUDNN_POINTWISE_MUL, &s2, Some(&descale_q), &s3)?,
        pointwise(P::CUDNN_POINTWISE_MUL, &s3, Some(&descale_k), &s4)?,
        reduction(R::CUDNN_REDUCE_TENSOR_MAX, &s4, &m)?,
        pointwise(P::CUDNN_POINTWISE_SUB, &s4, Some(&m), &s5)?,
        pointwise(P::CUDNN_POINTWISE_EXP, &s5, None, &s6)?,
        reduction(R::CUDNN_REDUCE_TENSOR_ADD, &s6, &z)?,
        pointwise(P::CUDNN_POINTWISE_LOG, &z, None, &lz)?,
        pointwise(P::CUDNN_POINTWISE_ADD, &m, Some(&lz), &stats)?,
        pointwise(P::CUDNN_POINTWISE_DIV, &s6, Some(&z), &p)?,
        reduction(R::CUDNN_REDUCE_TENSOR_AMAX, &p, &amax_s)?,
        pointwise(P::CUDNN_POINTWISE_MUL, &p, Some(&scale_s), &p8)?,
        matmul(&p8, &v, &o1)?,
        pointwise(P::CUDNN_POINTWISE_MUL, &o1, Some(&descale_s), &o2)?,
        pointwise(P::CUDNN_POINTWISE_MUL, &o2, Some(&descale_v), &o3)?,
        pointwise(P::CUDNN_POINTWISE_MUL, &o3, Some(&scale_o), &o)?,
        reduction(R::CUDNN_REDUCE_TENSOR_AMAX, &o3, &amax_o)?,
    ];
    let mut keep = vec![
        q, kt, v, o, scale, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, amax_s,
        amax_o, s1, s2, s3, s4, m, s5, s6, z, lz, stats, p, p8, o1, o2, o3,
    ];
    let mut idx = Vec::with_capacity(ops.len());
    for [desc, op] in ops {
        keep.push(desc);
        idx.push(keep.len());
        keep.push(op);
    }
    Ok((keep, idx))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FP8 layout refuses what bf16 accepts but e4m3 rows cannot align:
    /// red when `fp8_layout` is `layout`.
    #[test]
    fn fp8_operands_need_head_dims_and_rows_in_multiples_of_16() {
        let shape = |hd: usize, ld: usize| Shape {
            ld: [ld; 4],
            ..Shape::self_attention(4, hd, 64)
        };
        assert!(layout(&shape(72, 288)).is_ok());
        let e = fp8_layout(&shape(72, 288)).unwrap_err().to_string();
        assert!(e.contains("multiples of 16"), "{e}");
        assert!(layout(&shape(64, 264)).is_ok());
        assert!(fp8_layout(&shape(64, 264)).is_err());
        assert!(fp8_layout(&shape(64, 256)).is_ok());
        assert!(fp8_layout(&shape(128, 512)).is_ok());
    }

    /// The pack names each slot of [`Fp8Attn`] by its unique id: red on a slot
    /// constant moved without the pack, or two ids swapped.
    #[test]
    fn the_pack_points_each_uid_at_its_slot() {
        let p = Fp8Ptrs {
            qkv: [0x1000, 0x2000, 0x3000],
            o: 0x4000,
            slots: 0x10000,
        };
        let mut scale = 0.125f32;
        let d = p.data(&mut scale);
        assert_eq!(
            d[..4],
            [0x1000, 0x2000, 0x3000, 0x4000].map(|a| a as *mut c_void)
        );
        assert_eq!(d[4], &mut scale as *mut f32 as *mut c_void);
        let want = [12usize, 16, 20, 24, 28, 32, 36, 40].map(|i| (0x10000 + 4 * i) as *mut c_void);
        assert_eq!(d[5..], want);
        // Every slot 16-byte aligned (cuDNN's tensors are declared so).
        assert!(d[5..].iter().all(|a| (*a as usize) % 16 == 0));
    }
}
