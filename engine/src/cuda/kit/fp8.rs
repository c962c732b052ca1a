//! FP8 (e4m3) on the device: e4m3 copies of Linear weights, quantized per output
//! channel once, and the buffers a Linear's input is quantized into per row
//! before an FP8 GEMM ([`super::gemm::Gemm::linear_fp8`]). [`crate::fp8`] is the
//! definition both follow (the quantize kernel matches it bit for bit).
//!
//! Memory: an e4m3 copy is one byte per weight element plus 4 bytes of scale
//! per output channel. [`Fp8Linears::quantize`] adds it beside the bf16 weight it
//! was quantized from (which stays where staging put it); [`Fp8Linears::alloc`]
//! and [`Fp8Linears::quantize_one`] fill it from bf16 weights that are passing
//! through (a bounce buffer), so the bf16 copies need not stay resident.

use cudarc::driver::sys::CUdeviceptr;

use super::context::Gpu;
use super::kernels::{Kernels, OperandAmax};
use super::memory::{align_up, download, Arena, DeviceBuffer};
use crate::cuda::CudaError;

/// The oldest compute capability with FP8 tensor cores and the e4m3 conversion
/// the quantize kernel uses (Ada, 8.9; Hopper is 9.0).
pub const MIN_CAPABILITY: (i32, i32) = (8, 9);

/// A bf16 Linear weight on the device: `[out, inp]` row-major at `w`.
#[derive(Debug, Clone, Copy)]
pub struct LinearRef {
    /// Device address of the bf16 weight.
    pub w: CUdeviceptr,
    /// Output channels (rows).
    pub out: usize,
    /// Input width (columns); a multiple of 16 for an FP8 GEMM.
    pub inp: usize,
}

/// An e4m3 weight: codes `[out, inp]` and one f32 scale per output channel.
#[derive(Debug, Clone, Copy)]
pub struct Q8 {
    /// Device address of the e4m3 codes (16-byte aligned).
    pub codes: CUdeviceptr,
    /// Device address of the f32 scales.
    pub scales: CUdeviceptr,
}

/// The e4m3 copies of a list of Linears, in two arenas (codes, scales).
pub struct Fp8Linears {
    _codes: Arena,
    _scales: Arena,
    /// One copy per Linear, in the order given.
    pub q: Vec<Q8>,
    /// (output channels, input width) of each Linear, in the same order.
    shapes: Vec<(usize, usize)>,
}

/// Refuse a device without FP8 tensor cores, naming it.
pub fn require_fp8(gpu: &Gpu) -> Result<(), CudaError> {
    if gpu.capability < MIN_CAPABILITY {
        return Err(CudaError::NotAvailable(format!(
            "FP8 needs compute capability {}.{} or later (FP8 tensor cores); this GPU ({}) \
             has {}.{}",
            MIN_CAPABILITY.0, MIN_CAPABILITY.1, gpu.name, gpu.capability.0, gpu.capability.1
        )));
    }
    Ok(())
}

impl Fp8Linears {
    /// Device bytes of the e4m3 copies of `linears` (codes and scales, aligned).
    pub fn bytes_for(linears: &[LinearRef]) -> usize {
        linears
            .iter()
            .map(|l| align_up(l.out * l.inp) + align_up(l.out * 4))
            .sum()
    }

    /// Quantize every Linear's bf16 weight on the device, row by row
    /// ([`Kernels::quantize_rows_e4m3`]), and wait for it. Refuses a device
    /// older than [`MIN_CAPABILITY`] and a Linear whose input width is not a
    /// multiple of 16 (cuBLASLt's FP8 rule), naming the width.
    pub fn quantize(
        gpu: &Gpu,
        kernels: &Kernels,
        linears: &[LinearRef],
    ) -> Result<Fp8Linears, CudaError> {
        let shapes: Vec<(usize, usize)> = linears.iter().map(|l| (l.out, l.inp)).collect();
        let q = Fp8Linears::alloc(gpu, &shapes)?;
        for (i, l) in linears.iter().enumerate() {
            q.quantize_one(gpu, kernels, i, l.w)?;
        }
        gpu.sync_compute()?;
        Ok(q)
    }

    /// Room for the e4m3 copies of Linears of `shapes` ((output channels, input
    /// width) each, in order), nothing written yet: [`Fp8Linears::quantize_one`]
    /// fills each. The slots are laid out as [`Fp8Linears::quantize`] lays
    /// them out, and take [`Fp8Linears::bytes_for`] bytes. Refuses what
    /// [`Fp8Linears::quantize`] refuses, before allocating anything.
    pub fn alloc(gpu: &Gpu, shapes: &[(usize, usize)]) -> Result<Fp8Linears, CudaError> {
        require_fp8(gpu)?;
        if let Some((_, inp)) = shapes.iter().find(|(_, i)| *i == 0 || i % 16 != 0) {
            return Err(CudaError::Invalid(format!(
                "FP8: a Linear of input width {inp} (needs a positive multiple of 16)"
            )));
        }
        let (code_bytes, scale_bytes) = shapes.iter().fold((0, 0), |(c, s), (out, inp)| {
            (c + align_up(out * inp), s + align_up(out * 4))
        });
        let mut codes = Arena::new(gpu, code_bytes, "FP8 weights")?;
        let mut scales = Arena::new(gpu, scale_bytes, "FP8 weight scales")?;
        let mut q = Vec::with_capacity(shapes.len());
        for (out, inp) in shapes {
            q.push(Q8 {
                codes: codes.take(out * inp)?,
                scales: scales.take(out * 4)?,
            });
        }
        Ok(Fp8Linears {
            _codes: codes,
            _scales: scales,
            q,
            shapes: shapes.to_vec(),
        })
    }

    /// Enqueue the quantization of Linear `i`'s bf16 weight at `w` (`[out,
    /// inp]` row-major, 16-byte aligned) into its slot, on `gpu`'s compute
    /// stream; the caller keeps `w` alive until that stream has run it.
    pub fn quantize_one(
        &self,
        gpu: &Gpu,
        kernels: &Kernels,
        i: usize,
        w: CUdeviceptr,
    ) -> Result<(), CudaError> {
        let (q, (out, inp)) = self.q.get(i).zip(self.shapes.get(i)).ok_or_else(|| {
            CudaError::Invalid(format!(
                "FP8: no Linear {i} among {} slots",
                self.shapes.len()
            ))
        })?;
        kernels.quantize_rows_e4m3(&gpu.compute, w, *out, *inp, q.codes, q.scales)
    }

    /// (output channels, input width) of Linear `i`.
    pub fn shape(&self, i: usize) -> Option<(usize, usize)> {
        self.shapes.get(i).copied()
    }

    /// The Linears held.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Linear `i`'s e4m3 codes (`out x inp` bytes) and f32 scales (as their
    /// `out x 4` bytes), read back after the compute stream is done (for checks).
    pub fn download(&self, gpu: &Gpu, i: usize) -> Result<(Vec<u8>, Vec<u8>), CudaError> {
        let (q, (out, inp)) = self
            .q
            .get(i)
            .zip(self.shapes.get(i))
            .ok_or_else(|| CudaError::Invalid(format!("FP8: no Linear {i}")))?;
        Ok((
            download::<u8>(gpu, q.codes, out * inp)?,
            download::<u8>(gpu, q.scales, out * 4)?,
        ))
    }
}

/// Where up to `rows` rows of up to `cols` bf16 values are quantized: their
/// e4m3 codes and one f32 scale per row.
pub struct Fp8Rows {
    /// Rows it holds.
    pub rows: usize,
    /// Widest row it holds, elements.
    pub cols: usize,
    codes: DeviceBuffer,
    scales: DeviceBuffer,
}

impl Fp8Rows {
    /// Device bytes of a buffer of `rows` rows of `cols`.
    pub fn bytes_for(rows: usize, cols: usize) -> usize {
        align_up(rows * cols) + align_up(rows * 4)
    }

    /// A buffer for `rows` rows of up to `cols`; `what` names it in errors.
    pub fn new(gpu: &Gpu, rows: usize, cols: usize, what: &str) -> Result<Fp8Rows, CudaError> {
        Ok(Fp8Rows {
            rows,
            cols,
            codes: DeviceBuffer::alloc(gpu, rows * cols, what)?,
            scales: DeviceBuffer::alloc(gpu, rows * 4, what)?,
        })
    }

    /// (codes, scales) for `rows` rows of `cols` that a kernel is about to
    /// write (e.g. [`Kernels::residual_norm`]'s e4m3 output); an error when
    /// they do not fit this buffer.
    pub fn destination(
        &self,
        rows: usize,
        cols: usize,
    ) -> Result<(CUdeviceptr, CUdeviceptr), CudaError> {
        if rows > self.rows || cols > self.cols {
            return Err(CudaError::Invalid(format!(
                "FP8 rows: {rows} rows of {cols} do not fit a buffer of {} rows of {}",
                self.rows, self.cols
            )));
        }
        Ok(self.operand())
    }

    /// Quantize `rows` bf16 rows of `cols` at `x` into this buffer on `gpu`'s
    /// compute stream; returns (codes, scales) for [`super::gemm::Gemm::linear_fp8`].
    pub fn quantize(
        &self,
        gpu: &Gpu,
        kernels: &Kernels,
        x: CUdeviceptr,
        rows: usize,
        cols: usize,
    ) -> Result<(CUdeviceptr, CUdeviceptr), CudaError> {
        self.destination(rows, cols)?;
        kernels.quantize_rows_e4m3(
            &gpu.compute,
            x,
            rows,
            cols,
            self.codes.ptr(),
            self.scales.ptr(),
        )?;
        Ok(self.operand())
    }

    /// (codes, scales) as the last [`Fp8Rows::quantize`] left them.
    pub fn operand(&self) -> (CUdeviceptr, CUdeviceptr) {
        (self.codes.ptr(), self.scales.ptr())
    }
}

/// The FP8 self-attention's device state (lever `attention-precision`): e4m3
/// copies of q, k and v with one scale each, and the f32 slots cuDNN's FP8 SDPA
/// reads its descales and scales from and writes its amax outputs to (each slot
/// 16 bytes from the next, as cuDNN reads each as a tensor of one element).
/// The output's codes and row scales live in the forward's [`Fp8Rows`], where
/// the out-projection's FP8 GEMM reads them.
pub struct Fp8Attn {
    /// Rows (tokens) each operand holds.
    pub rows: usize,
    /// Width (heads × head dim) of each operand.
    pub width: usize,
    q8: [DeviceBuffer; 3],
    slots: DeviceBuffer,
}

impl Fp8Attn {
    /// f32 index of q's amax (zeroed, then raised by `amax3_bf16`).
    pub const AMAX_Q: usize = 0;
    /// f32 index of k's amax.
    pub const AMAX_K: usize = 4;
    /// f32 index of v's amax.
    pub const AMAX_V: usize = 8;
    /// f32 index of q's descale (`amax / 448`).
    pub const DESCALE_Q: usize = 12;
    /// f32 index of k's descale.
    pub const DESCALE_K: usize = 16;
    /// f32 index of v's descale.
    pub const DESCALE_V: usize = 20;
    /// f32 index of the probabilities' descale (1 / 448).
    pub const DESCALE_S: usize = 24;
    /// f32 index of the probabilities' scale (448).
    pub const SCALE_S: usize = 28;
    /// f32 index of the output's scale ([`crate::fp8::AttentionScales::scale_o`]).
    pub const SCALE_O: usize = 32;
    /// f32 index of cuDNN's amax of the probabilities (an output).
    pub const AMAX_S: usize = 36;
    /// f32 index of cuDNN's amax of the output before its scale (an output).
    pub const AMAX_O: usize = 40;
    /// Bytes of the slot buffer.
    pub const SLOT_BYTES: usize = 256;

    /// Device bytes of the state for `rows` tokens of `width`.
    pub fn bytes_for(rows: usize, width: usize) -> usize {
        3 * align_up(rows * width) + align_up(Self::SLOT_BYTES)
    }

    /// Room for `rows` tokens of `width` (a multiple of 16).
    pub fn new(gpu: &Gpu, rows: usize, width: usize) -> Result<Fp8Attn, CudaError> {
        if width == 0 || width % 16 != 0 {
            return Err(CudaError::Invalid(format!(
                "FP8 attention: width {width} (needs a positive multiple of 16)"
            )));
        }
        let op = |what| DeviceBuffer::alloc(gpu, rows.max(1) * width, what);
        Ok(Fp8Attn {
            rows,
            width,
            q8: [
                op("the FP8 attention's q")?,
                op("the FP8 attention's k")?,
                op("the FP8 attention's v")?,
            ],
            slots: DeviceBuffer::alloc(gpu, Self::SLOT_BYTES, "the FP8 attention's scales")?,
        })
    }

    /// Device addresses of the e4m3 q, k and v.
    pub fn codes(&self) -> [CUdeviceptr; 3] {
        [self.q8[0].ptr(), self.q8[1].ptr(), self.q8[2].ptr()]
    }

    /// Device address of the slot buffer.
    pub fn slots(&self) -> CUdeviceptr {
        self.slots.ptr()
    }

    /// Zero the amax slots on `gpu`'s compute stream, before a q/k norm that
    /// raises them ([`OperandAmax::Folded`]; its `amax` is [`Fp8Attn::slots`]).
    pub fn zero_amax(&self, gpu: &Gpu, kernels: &Kernels) -> Result<(), CudaError> {
        kernels.fp8_attention_zero_amax(&gpu.compute, self.slots())
    }

    /// Enqueue the operands of `n` tokens from bf16 q, k, v (`[n, width]`
    /// each) on `gpu`'s compute stream ([`Kernels::fp8_attention_operands`]),
    /// writing the output's row scales into `out`'s scales from row `row0` on
    /// (a batched forward's sample starts there: lever `guidance-batch`). With
    /// [`OperandAmax::Folded`], q's and k's amax slots must already hold their
    /// amax (zeroed by [`Fp8Attn::zero_amax`], raised by the q/k norm).
    pub fn quantize(
        &self,
        gpu: &Gpu,
        kernels: &Kernels,
        qkv: [CUdeviceptr; 3],
        n: usize,
        (out, row0): (&Fp8Rows, usize),
        amax: OperandAmax,
    ) -> Result<(), CudaError> {
        if n > self.rows || row0 + n > out.rows || self.width > out.cols {
            return Err(CudaError::Invalid(format!(
                "FP8 attention: {n} tokens of {} from row {row0} do not fit {} operand rows or \
                 an output of {} rows of {}",
                self.width, self.rows, out.rows, out.cols
            )));
        }
        let e = n * self.width;
        kernels.fp8_attention_operands(
            &gpu.compute,
            [(qkv[0], e), (qkv[1], e), (qkv[2], e)],
            self.codes(),
            self.slots(),
            (out.operand().1 + (row0 * 4) as u64, n),
            amax,
        )
    }

    /// The slot buffer's 64 f32, read back after the compute stream is done.
    pub fn read_slots(&self, gpu: &Gpu) -> Result<Vec<f32>, CudaError> {
        download::<f32>(gpu, self.slots.ptr(), Self::SLOT_BYTES / 4)
    }

    /// The e4m3 codes of q, k and v (`n × width` bytes each), read back after
    /// the compute stream is done.
    pub fn read_codes(&self, gpu: &Gpu, n: usize) -> Result<[Vec<u8>; 3], CudaError> {
        let e = n.min(self.rows) * self.width;
        Ok([
            download::<u8>(gpu, self.q8[0].ptr(), e)?,
            download::<u8>(gpu, self.q8[1].ptr(), e)?,
            download::<u8>(gpu, self.q8[2].ptr(), e)?,
        ])
    }
}
