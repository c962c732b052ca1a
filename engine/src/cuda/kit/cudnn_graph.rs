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
    cudnnBackendDescriptorType_t as Kind, cudnnBackendDescriptor_t, cudnnStatus_t,
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
