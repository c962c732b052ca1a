// FP8 (e4m3) kernels of the `precision = fp8` arm: row-scaled quantization of
// bf16 matrices (weights at staging, activations before each FP8 GEMM) and the
// tanh-GELU the GEMM cannot fuse when cuBLASLt offers no FP8 GELU epilogue.
// The host's definition is engine/src/fp8.rs; the quantizer matches it bit for
// bit (the device check compares every code and scale).
#include "common.cuh"

// The larger of m and the largest |x| of the 8 bf16 values in `v` (NaN ignored).
__device__ __forceinline__ float amax8(uint4 v, float m) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) m = amax_bf16x2(w[j], m);
    return m;
}

// The e4m3 codes of the 8 bf16 values in `v` times `inv`, element 0 in the
// lowest byte.
__device__ __forceinline__ uint2 e4m3x8(uint4 v, float inv) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
    unsigned int c[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float lo = __uint_as_float(w[j] << 16) * inv;
        const float hi = __uint_as_float(w[j] & 0xffff0000u) * inv;
        c[j] = e4m3x2(lo, hi);
    }
    return make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
}

// 16-byte chunks (8 bf16) of a row each thread of `quantize_rows_e4m3` holds in
// registers: rows up to 8 * 8 * 256 = 16384 values (the feed-forward's hidden
// width at 13B) are read from memory once.
#define QR_CHUNKS 8

// One block per row of `cols` bf16 values (cols a multiple of 8, rows 16-byte
// aligned): amax = max |x| over the row; inv = 448 / amax and scale = amax /
// 448 (both 1 when amax is 0 or not finite); q = e4m3(x * inv) row-major
// [rows, cols] and scales[row] = scale. A row of at most QR_CHUNKS chunks a
// thread is read once and kept in registers between its amax and its codes; a
// wider one is read twice. The arithmetic is the same either way.
extern "C" __global__ void quantize_rows_e4m3(const bf16* __restrict__ x, int cols,
                                              unsigned char* __restrict__ q,
                                              float* __restrict__ scales) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * cols);
    uint2* qr = reinterpret_cast<uint2*>(q + row * cols);
    const int nv = cols / 8;
    float m = 0.0f;
    if (nv <= QR_CHUNKS * (int)blockDim.x) {
        uint4 v[QR_CHUNKS];
#pragma unroll
        for (int j = 0; j < QR_CHUNKS; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            v[j] = i < nv ? xr[i] : make_uint4(0u, 0u, 0u, 0u);  // zeros raise no max
            m = amax8(v[j], m);
        }
        m = block_max(m, scratch);
        const float2 f = tensor_factors(m);
        if (threadIdx.x == 0) scales[row] = f.y;
#pragma unroll
        for (int j = 0; j < QR_CHUNKS; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < nv) qr[i] = e4m3x8(v[j], f.x);
        }
        return;
    }
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        m = amax8(xr[i], m);
    }
    m = block_max(m, scratch);
    const float2 f = tensor_factors(m);
    const float inv = f.x;
    if (threadIdx.x == 0) scales[row] = f.y;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) qr[i] = e4m3x8(xr[i], inv);
}

// y = bf16(gelu_tanh(x)) over n bf16 elements (may run in place).
extern "C" __global__ void gelu_tanh_bf16(const bf16* x, bf16* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = bf2f(x[i]);
        const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        y[i] = f2bf(0.5f * v * (1.0f + tanhf(u)));
    }
}

// The FP8 attention's operands (lever `attention-precision`; host definition:
// crate::fp8::AttentionScales). `sc` holds f32 slots 16 bytes apart (cuDNN
// reads each as a [1,1,1,1] tensor): 0 amax q, 4 amax k, 8 amax v (zeroed
// before amax3_bf16), 12 descale q, 16 descale k, 20 descale v, 24 descale s,
// 28 scale s, 32 scale o (written by quantize3_e4m3), 36 amax s, 40 amax o
// (written by cuDNN).

// blockIdx.y picks the tensor (0 a, 1 b, 2 c, each of n bf16 values, n a
// multiple of 8, 16-byte aligned); each block takes the largest |x| of its
// grid-stride share and raises the tensor's slot with an integer atomicMax
// (non-negative floats order as their bits). NaN is ignored.
extern "C" __global__ void amax3_bf16(const bf16* __restrict__ a, long long na,
                                      const bf16* __restrict__ b, long long nb,
                                      const bf16* __restrict__ c, long long nc,
                                      float* __restrict__ sc) {
    __shared__ float scratch[32];
    const int t = blockIdx.y;
    const bf16* x = t == 0 ? a : (t == 1 ? b : c);
    const long long nv = (t == 0 ? na : (t == 1 ? nb : nc)) / 8;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    float m = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nv;
         i += (long long)gridDim.x * blockDim.x) {
        m = amax8(xv[i], m);
    }
    m = block_max(m, scratch);
    if (threadIdx.x == 0 && m > 0.0f) atomicMax(reinterpret_cast<int*>(sc + 4 * t), __float_as_int(m));
}

// blockIdx.y 0..2: q_t = e4m3(x_t * 448 / amax_t) for the tensor t of amax3_bf16
// (codes 16-byte aligned). blockIdx.y 3: o_scales[0..o_rows) = 1 / scale_o (the
// row scales the out-projection's FP8 GEMM reads the output codes with), and
// block (0, 3) writes the descales and scales (slots 12-32); scale_o =
// 448 / (1.125 amax v) (crate::fp8::ATTENTION_OUTPUT_MARGIN).
extern "C" __global__ void quantize3_e4m3(const bf16* __restrict__ a, long long na,
                                          const bf16* __restrict__ b, long long nb,
                                          const bf16* __restrict__ c, long long nc,
                                          unsigned char* __restrict__ qa,
                                          unsigned char* __restrict__ qb,
                                          unsigned char* __restrict__ qc,
                                          float* __restrict__ sc,
                                          float* __restrict__ o_scales, int o_rows) {
    const int t = blockIdx.y;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t == 3) {
        const float mv = sc[8];
        const float scale_o =
            (mv > 0.0f && mv <= 3.4028234663852886e38f) ? 448.0f / (1.125f * mv) : 1.0f;
        const float descale_o = 1.0f / scale_o;
        for (long long i = first; i < o_rows; i += stride) o_scales[i] = descale_o;
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            sc[12] = tensor_factors(sc[0]).y;
            sc[16] = tensor_factors(sc[4]).y;
            sc[20] = tensor_factors(mv).y;
            sc[24] = 1.0f / 448.0f;
            sc[28] = 448.0f;
            sc[32] = scale_o;
        }
        return;
    }
    const bf16* x = t == 0 ? a : (t == 1 ? b : c);
    unsigned char* q = t == 0 ? qa : (t == 1 ? qb : qc);
    const long long nv = (t == 0 ? na : (t == 1 ? nb : nc)) / 8;
    const float inv = tensor_factors(sc[4 * t]).x;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    uint2* qv = reinterpret_cast<uint2*>(q);
    for (long long i = first; i < nv; i += stride) qv[i] = e4m3x8(xv[i], inv);
}
