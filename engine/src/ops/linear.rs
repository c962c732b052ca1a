//! Matrix products: a strided SGEMM ([`gemm`]) tiled over rayon, and the
//! [`Linear`] layer `y = x W^T + b` built on it.

use rayon::prelude::*;

use crate::tensor::Tensor;
use crate::weights::{VarBuilder, WeightError};

/// A read-only strided view of a `rows x cols` matrix inside a slice:
/// element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> MatRef<'a> {
    /// A view with explicit strides.
    ///
    /// # Panics
    /// If the view reaches past the slice (a bug in the calling op, never data).
    pub fn new(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * rs + (cols - 1) * cs;
            assert!(
                last < data.len(),
                "matrix view {rows}x{cols} (rs {rs}, cs {cs}) exceeds {} elements",
                data.len()
            );
        }
        MatRef {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// A dense row-major `rows x cols` view.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols, 1)
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            data: self.data,
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Element `(i, j)`.
    pub fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.rs + j * self.cs]
    }
}

/// A pointer to an output matrix whose disjoint tiles are written by
/// different rayon tasks.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a distinct tile of the output (see `gemm`), and the
// output slice outlives the parallel scope that uses the pointer.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Checks `gemm`'s arguments; returns `(m, k, n)`, or `None` when there is
/// nothing to multiply (after zeroing `C` if `k == 0` and not accumulating).
fn check(
    a: &MatRef,
    b: &MatRef,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) -> Option<(usize, usize, usize)> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(
        b.rows, k,
        "gemm: inner dimensions {k} and {} differ",
        b.rows
    );
    assert!(ldc >= n, "gemm: ldc {ldc} < n {n}");
    if m == 0 || n == 0 {
        return None;
    }
    assert!(
        c.len() >= (m - 1) * ldc + n,
        "gemm: output of {} elements is too short",
        c.len()
    );
    if k == 0 {
        if !accumulate {
            c.chunks_mut(ldc)
                .take(m)
                .for_each(|r| r[..n].iter_mut().for_each(|x| *x = 0.0));
        }
        return None;
    }
    Some((m, k, n))
}

/// Rows `r0..r1`, columns `c0..c1` of `C (+)= A B` through one single-threaded
/// matrixmultiply call.
///
/// # Safety
/// `a`, `b` must be valid views with `a.cols == b.rows`; `out` must point to a
/// row-major matrix with stride `ldc` holding at least `r1` rows and `c1`
/// columns, and no other thread may touch that tile meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    a: &MatRef,
    b: &MatRef,
    out: OutPtr,
    ldc: usize,
    accumulate: bool,
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
) {
    matrixmultiply::sgemm(
        r1 - r0,
        a.cols,
        c1 - c0,
        1.0,
        a.data.as_ptr().add(r0 * a.rs),
        a.rs as isize,
        a.cs as isize,
        b.data.as_ptr().add(c0 * b.cs),
        b.rs as isize,
        b.cs as isize,
        if accumulate { 1.0 } else { 0.0 },
        out.0.add(r0 * ldc + c0),
        ldc as isize,
        1,
    );
}

/// `C = A B` (or `C += A B` with `accumulate`) on the calling thread, with `C`
/// row-major `m x n` at row stride `ldc`. For kernels that already run inside a
/// parallel task.
///
/// # Panics
/// If the shapes disagree or `c` is too short (bugs in the calling op).
pub fn gemm_serial(a: MatRef, b: MatRef, c: &mut [f32], ldc: usize, accumulate: bool) {
    if let Some((m, _, n)) = check(&a, &b, c, ldc, accumulate) {
        // SAFETY: `check` verified the views and the extent of `c`; `c` is borrowed
        // mutably for the whole call, so no other thread can touch it.
        unsafe { tile(&a, &b, OutPtr(c.as_mut_ptr()), ldc, accumulate, 0, m, 0, n) }
    }
}

/// `C = A B` (or `C += A B` with `accumulate`), with `C` row-major `m x n`
/// at row stride `ldc` (`m = a.rows()`, `n = b.cols()`). Large products are
/// split into output tiles computed in parallel on rayon's current pool.
///
/// # Panics
/// If the shapes disagree or `c` is too short (bugs in the calling op).
pub fn gemm(a: MatRef, b: MatRef, c: &mut [f32], ldc: usize, accumulate: bool) {
    let Some((m, k, n)) = check(&a, &b, c, ldc, accumulate) else {
        return;
    };
    let threads = rayon::current_num_threads();
    let out = OutPtr(c.as_mut_ptr());
    if threads <= 1 || (m as f64 * n as f64 * k as f64) < (1u64 << 21) as f64 {
        // SAFETY: as in `gemm_serial`.
        unsafe { tile(&a, &b, out, ldc, accumulate, 0, m, 0, n) };
        return;
    }
    let rb = m.div_ceil(2 * threads).max(16).min(m);
    let row_tiles = m.div_ceil(rb);
    let col_tiles = if row_tiles >= 2 * threads {
        1
    } else {
        (2 * threads).div_ceil(row_tiles)
    };
    let cb = n.div_ceil(col_tiles).max(64).min(n);
    let col_tiles = n.div_ceil(cb);
    (0..row_tiles * col_tiles).into_par_iter().for_each(|t| {
        let (r0, c0) = ((t / col_tiles) * rb, (t % col_tiles) * cb);
        // SAFETY: `check` verified the extent of `c`, which stays mutably borrowed
        // by this function until the parallel loop ends; tiles are disjoint.
        unsafe {
            tile(
                &a,
                &b,
                out,
                ldc,
                accumulate,
                r0,
                (r0 + rb).min(m),
                c0,
                (c0 + cb).min(n),
            )
        };
    });
}

/// `A B` for row-major `a [m, k]` and `b [k, n]`, as a new row-major `[m, n]`.
pub fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    gemm(
        MatRef::row_major(a, m, k),
        MatRef::row_major(b, k, n),
        &mut c,
        n,
        false,
    );
    c
}

/// A dense layer `y = x W^T + b` with `W [out, in]` as checkpoints store it.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// A layer from a weight `[out, in]` and an optional bias `[out]`.
    ///
    /// # Panics
    /// If the weight is not 2-D or the bias length is not `out` (bugs in the caller).
    pub fn new(weight: Tensor, bias: Option<Vec<f32>>) -> Self {
        assert_eq!(weight.shape().len(), 2, "Linear weight must be 2-D");
        if let Some(b) = &bias {
            assert_eq!(b.len(), weight.shape()[0], "Linear bias length");
        }
        Linear { weight, bias }
    }

    /// Loads `{name}.weight [out, inp]` (and `{name}.bias [out]` when `bias`).
    pub fn load(
        vb: &VarBuilder,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Self, WeightError> {
        let vb = vb.pp(name);
        let weight = vb.get("weight", &[out, inp])?;
        let bias = if bias {
            Some(vb.get("bias", &[out])?.into_data())
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// `x [rows, in]` (row-major) to `[rows, out]`.
    ///
    /// # Panics
    /// If `x.len()` is not `rows * in` (a bug in the calling model).
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let (o, i) = (self.out_features(), self.in_features());
        assert_eq!(
            x.len(),
            rows * i,
            "Linear input: {} elements for {rows} rows of {i}",
            x.len()
        );
        let mut y = vec![0.0; rows * o];
        if let Some(b) = &self.bias {
            y.chunks_mut(o).for_each(|r| r.copy_from_slice(b));
        }
        gemm(
            MatRef::row_major(x, rows, i),
            MatRef::row_major(self.weight.data(), o, i).t(),
            &mut y,
            o,
            self.bias.is_some(),
        );
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Gaussian;

    fn naive(a: MatRef, b: MatRef) -> Vec<f32> {
        let (m, k, n) = (a.rows(), a.cols(), b.cols());
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += a.at(i, p) as f64 * b.at(p, j) as f64;
                }
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    #[test]
    fn hand_computed_product_and_linear() {
        // [1 2 3; 4 5 6] [1 0; 0 1; 1 1] = [4 5; 10 11]
        let c = matmul(
            &[1., 2., 3., 4., 5., 6.],
            &[1., 0., 0., 1., 1., 1.],
            2,
            3,
            2,
        );
        assert_eq!(c, vec![4., 5., 10., 11.]);
        // W = [[1, -1], [2, 0.5], [0, 3]], b = [0.5, 0, -1]; x = [2, 4] -> [-1.5, 6, 11]
        let l = Linear::new(
            Tensor::new(&[3, 2], vec![1., -1., 2., 0.5, 0., 3.]).unwrap(),
            Some(vec![0.5, 0., -1.]),
        );
        assert_eq!(l.forward(&[2., 4.], 1), vec![-1.5, 6., 11.]);
        let l = Linear::new(
            Tensor::new(&[3, 2], vec![1., -1., 2., 0.5, 0., 3.]).unwrap(),
            None,
        );
        assert_eq!(
            l.forward(&[2., 4., 0., 1.], 2),
            vec![-2., 6., 12., -1., 0.5, 3.]
        );
    }

    #[test]
    fn gemm_matches_a_naive_loop_on_random_shapes_and_strides() {
        let shapes = [
            (1, 1, 1),
            (3, 5, 7),
            (17, 33, 9),
            (1, 256, 600),
            (130, 70, 300),
            (300, 64, 8),
            (64, 129, 65),
        ];
        for (s, &(m, k, n)) in shapes.iter().enumerate() {
            let a = Gaussian::new(s as u64, "a").vec(m * k);
            let b = Gaussian::new(s as u64, "b").vec(k * n);
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let av = if ta {
                    MatRef::row_major(&a, k, m).t()
                } else {
                    MatRef::row_major(&a, m, k)
                };
                let bv = if tb {
                    MatRef::row_major(&b, n, k).t()
                } else {
                    MatRef::row_major(&b, k, n)
                };
                let want = naive(av, bv);
                let mut got = vec![0.0; m * n];
                gemm(av, bv, &mut got, n, false);
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 1e-5 * (1.0 + w.abs()) * (k as f32).sqrt(),
                        "{m}x{k}x{n}: {g} vs {w}"
                    );
                }
                // Accumulate adds onto what is there, with a wider output stride.
                let ldc = n + 3;
                let mut acc = vec![1.0; (m - 1) * ldc + n];
                gemm(av, bv, &mut acc, ldc, true);
                for i in 0..m {
                    for j in 0..n {
                        let (g, w) = (acc[i * ldc + j], want[i * n + j] + 1.0);
                        assert!(
                            (g - w).abs() <= 1e-4 * (1.0 + w.abs()) * (k as f32).sqrt(),
                            "acc {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "exceeds")]
    fn views_past_the_slice_are_refused() {
        MatRef::new(&[0.0; 5], 2, 3, 3, 1);
    }
}
