//! cuDNN's backend graph API as the attention modules use it: descriptors
//! destroyed on drop ([`Desc`]), status checks that name the step and carry
//! cuDNN's own message ([`check`]), calls guarded against a panicking loader
//! ([`guarded`]), and the attention problem ([`Shape`]) with its layout over
//! the DiT's row-major matrices ([`layout`]). [`super::sdpa`] (bf16) and
//! [`super::sdpa_fp8`] (FP8) build their graphs from these.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Ty,
    cudnnBackendDescriptorType_t as Kind, cudnnBackendDescriptor_t, cudnnDataType_t, cudnnStatus_t,
};

use crate::cuda::CudaError;

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
pub struct Desc(pub cudnnBackendDescriptor_t);

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

/// cuDNN's last error message (empty when it has none).
pub fn last_error() -> String {
    let mut buf = [0 as std::ffi::c_char; 512];
    // SAFETY: cuDNN writes at most `len` bytes, NUL-terminated.
    unsafe { sys::cudnnGetLastErrorString(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated within the buffer (zero-initialized, max_size given).
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    s.to_string_lossy().trim().to_string()
}

/// `Ok` on success; otherwise an error naming `what` with cuDNN's status and
/// message: [`CudaError::NotAvailable`] where cuDNN does not support the
/// problem (no engine, another architecture), [`CudaError::Invalid`] otherwise.
pub fn check(st: cudnnStatus_t, what: &str) -> Result<(), CudaError> {
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

/// Run `f`, turning a panic inside it (cudarc panics on a missing symbol)
/// into [`CudaError::NotAvailable`] naming `what`.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => Err(CudaError::NotAvailable(format!(
            "cuDNN panicked while {what} (a missing symbol or an unexpected library version)"
        ))),
    }
}

impl Desc {
    /// A new descriptor of `kind`; `what` names the step in errors.
    pub fn new(kind: Kind, what: &str) -> Result<Desc, CudaError> {
        let mut d: cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `d` receives a new descriptor of `kind`.
        check(
            unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut d) },
            what,
        )?;
        Ok(Desc(d))
    }

    /// Set attribute `a` to the `n` values of type `ty` at `vals`.
    pub fn set<T>(&self, a: Attr, ty: Ty, vals: &[T], what: &str) -> Result<(), CudaError> {
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
    pub fn get<T>(
        &self,
        a: Attr,
        ty: Ty,
        out: Option<&mut [T]>,
        what: &str,
    ) -> Result<i64, CudaError> {
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

    /// Finalize the descriptor (every required attribute set).
    pub fn finalize(&self, what: &str) -> Result<(), CudaError> {
        // SAFETY: a descriptor whose required attributes were set.
        check(unsafe { sys::cudnnBackendFinalize(self.0) }, what)
    }
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

/// Where a graph tensor's data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// In device memory, at a variant-pack pointer (16-byte aligned).
    Device,
    /// An intermediate the engine keeps to itself (no pointer).
    Virtual,
    /// A host scalar passed by value (4-byte aligned).
    ByValue,
}

/// A tensor descriptor: `dt` elements of `dims` and `strides` (elements), unique
/// id `uid`, living where `kind` says.
pub fn tensor(
    uid: i64,
    (dims, strides): DimsStrides,
    dt: cudnnDataType_t,
    kind: TensorKind,
) -> Result<Desc, CudaError> {
    let what = "describing a tensor";
    let t = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR, what)?;
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
    let align: i64 = if kind == TensorKind::ByValue { 4 } else { 16 };
    t.set(
        Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        Ty::CUDNN_TYPE_INT64,
        &[align],
        what,
    )?;
    let flag = match kind {
        TensorKind::Virtual => Some(Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL),
        TensorKind::ByValue => Some(Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE),
        TensorKind::Device => None,
    };
    if let Some(a) = flag {
        t.set(a, Ty::CUDNN_TYPE_BOOLEAN, &[true], what)?;
    }
    t.finalize(what)?;
    Ok(t)
}

impl Shape {
    /// Self-attention over `n` tokens of `heads × hd` in `[n, heads·hd]`
    /// matrices, at the softmax scale 1/√hd.
    pub fn self_attention(heads: usize, hd: usize, n: usize) -> Shape {
        Shape {
            heads,
            hd,
            nq: n,
            nk: n,
            ld: [heads * hd; 4],
            scale_bits: (1.0 / (hd as f32).sqrt()).to_bits(),
        }
    }
}

/// A variant pack: the tensors of unique ids `uids` at the addresses `data`
/// (device pointers, or a host address for a by-value tensor), in that order,
/// and the workspace `ws`.
pub fn variant_pack(
    uids: &[i64],
    data: &[*mut c_void],
    ws: cudarc::driver::sys::CUdeviceptr,
) -> Result<Desc, CudaError> {
    if uids.len() != data.len() {
        return Err(CudaError::Invalid(format!(
            "a variant pack of {} ids and {} pointers",
            uids.len(),
            data.len()
        )));
    }
    let what = "building a variant pack";
    let pack = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what)?;
    pack.set(
        Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        Ty::CUDNN_TYPE_INT64,
        uids,
        what,
    )?;
    pack.set(
        Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        Ty::CUDNN_TYPE_VOID_PTR,
        data,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Red on: the keys' count taken from another argument, the leading
    /// dimension not heads × hd, or the scale not 1/√hd.
    #[test]
    fn self_attention_is_n_by_n_over_packed_rows_at_the_usual_scale() {
        let s = Shape::self_attention(32, 128, 6144);
        assert_eq!((s.heads, s.hd, s.nq, s.nk), (32, 128, 6144, 6144));
        assert_eq!(s.ld, [4096; 4]);
        assert_eq!(f32::from_bits(s.scale_bits), 1.0 / 128f32.sqrt());
        let l = layout(&s).unwrap();
        assert_eq!(l[1], ([1, 32, 6144, 128], [6144 * 4096, 128, 4096, 1]));
    }
}
