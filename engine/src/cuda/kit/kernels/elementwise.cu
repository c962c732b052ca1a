// Elementwise and row-wise kernels of the DiT forward. Conventions: `bf16` is
// raw bits (common.cuh); rows are contiguous with `D` elements; arithmetic is
// f32; one block per row for the row-wise kernels (blockDim.x a multiple of 32,
// at most 1024). Grid-stride loops for the elementwise ones.
#include "common.cuh"

extern "C" __global__ void cast_f32_to_bf16(const float* __restrict__ x, bf16* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = f2bf(x[i]);
}

extern "C" __global__ void cast_bf16_to_f32(const bf16* __restrict__ x, float* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = bf2f(x[i]);
}

// RoPE's position of token `t` of a (gf, gh, gw) raster grid on each axis
// (f, h, w): 2 * (index * scale / base) - 1. Shared by the q/k norm kernels.
__device__ __forceinline__ void rope_position(long long t, int gh, int gw, float scale_f, float scale_h,
                                              float scale_w, float base_f, float base_h, float base_w,
                                              float* pos) {
    const long long hw = (long long)gh * gw;
    const int f = (int)(t / hw);
    const int h = (int)((t / gw) % gh);
    const int wq = (int)(t % gw);
    pos[0] = ((float)f * scale_f) / base_f * 2.0f - 1.0f;
    pos[1] = ((float)h * scale_h) / base_h * 2.0f - 1.0f;
    pos[2] = ((float)wq * scale_w) / base_w * 2.0f - 1.0f;
}

// RoPE on pair `p` (channels 2p, 2p+1) in place, when `freqs` is given and the
// pair is past the unrotated padding: frequency k = idx / 3 on axis idx % 3.
__device__ __forceinline__ void rope_pair(const float* __restrict__ freqs, int p, int pad_pairs,
                                          const float* pos, float& a, float& b) {
    if (freqs != 0 && p >= pad_pairs) {
        const int idx = p - pad_pairs;
        const int k = idx / 3, axis = idx - 3 * (idx / 3);
        const float ang = freqs[k] * pos[axis];
        float s, c;
        sincosf(ang, &s, &c);
        const float na = a * c - b * s;
        const float nb = b * c + a * s;
        a = na;
        b = nb;
    }
}

// Weighted RMS norm over the full row (all heads together), then, when `freqs`
// is not null, LTX interleaved RoPE. Row `t` is token t of a (gf, gh, gw) grid in
// raster order. The first `pad = D - 6*nfreq` channels are not rotated; pair p
// (channels 2p, 2p+1) at or after the padding uses idx = p - pad/2,
// frequency k = idx / 3, axis = idx % 3 (f, h, w) and the angle
// freqs[k] * (2 * (index[axis] * scale[axis] / base[axis]) - 1);
// (a, b) -> (a cos - b sin, b cos + a sin).
// May run in place (x == y): each thread reads and writes only its own pairs, and
// the sum of squares is complete (block_sum synchronises) before any write.
extern "C" __global__ void qk_norm_rope(const bf16* x, bf16* y, const bf16* __restrict__ w, int D, float eps,
                                        const float* __restrict__ freqs, int nfreq, int gh, int gw,
                                        float scale_f, float scale_h, float scale_w,
                                        float base_f, float base_h, float base_w) {
    __shared__ float scratch[32];
    const long long t = blockIdx.x;
    const unsigned int* xr = (const unsigned int*)(x + t * D);
    unsigned int* yr = (unsigned int*)(y + t * D);
    const int pairs = D / 2;
    float ss = 0.0f;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        unsigned int v = xr[p];
        float a = bf2f((bf16)(v & 0xffffu)), b = bf2f((bf16)(v >> 16));
        ss += a * a + b * b;
    }
    const float r = rsqrtf(block_sum(ss, scratch) / (float)D + eps);
    float pos[3];
    rope_position(t, gh, gw, scale_f, scale_h, scale_w, base_f, base_h, base_w, pos);
    const int pad_pairs = (D - 6 * nfreq) / 2;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        unsigned int v = xr[p];
        float a = bf2f((bf16)(v & 0xffffu)) * r * bf2f(w[2 * p]);
        float b = bf2f((bf16)(v >> 16)) * r * bf2f(w[2 * p + 1]);
        // The norm output is rounded to bf16 before RoPE, as a bf16 model does.
        a = bf2f(f2bf(a));
        b = bf2f(f2bf(b));
        rope_pair(freqs, p, pad_pairs, pos, a, b);
        yr[p] = pack_bf16x2(a, b);
    }
}

// The `qk-norm = warp` arm of the forward's q/k norm: what `qk_norm_rope_pair`
// computes, one warp per row instead of one block. A lane holds its chunks of
// 8 channels (16-byte loads and stores; chunk c = lane + 32 j, channels
// [8c, 8c + 8)) in registers between the sum of squares and the write, and the
// sum is a warp reduction: no shared memory and no barrier, so a block of
// QKW_WARPS warps works on QKW_WARPS rows at once and the memory system sees
// 16-byte requests, where the block kernel issues 4-byte ones and waits on two
// barriers per row (1.3-1.9 TB/s on the H200 in s23-dev2). The sum of squares
// is taken in another order than the block kernel's, so the two differ in the
// last bit of a few values (a lever arm, `numerics = "changing"`); every other
// expression is the same. blockIdx.y = 0: `xq`/`wq`, rows_q rows; 1: `xk`/`wk`,
// rows_k rows, in place. Needs D a multiple of 8 and at most 8 * 32 * QKW_CHUNKS
// = 4096, rows 16-byte aligned (the DiT's widths are multiples of 64). With
// `amax` not null, raises amax[0] (q) and amax[4] (k) to the largest |value| it
// wrote, as `qk_norm_rope_pair` does (one atomicMax per warp).
// Largest of the non-negative v over a warp (all 32 lanes active; NaN ignored).
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The `leader` thread raises q's (amax[0]) or k's (amax[4]) amax slot to m,
// when `amax` is given and m > 0 (the integer atomicMax of `amax3_bf16`:
// non-negative floats order as their bits).
__device__ __forceinline__ void raise_amax(float* amax, bool is_k, bool leader, float m) {
    if (amax != 0 && leader && m > 0.0f)
        atomicMax(reinterpret_cast<int*>(amax + (is_k ? 4 : 0)), __float_as_int(m));
}

#define QKW_WARPS 4
#define QKW_CHUNKS 16
__device__ __forceinline__ void unpack8(const uint4 v, float* f) {
    f[0] = bf2f((bf16)(v.x & 0xffffu));
    f[1] = bf2f((bf16)(v.x >> 16));
    f[2] = bf2f((bf16)(v.y & 0xffffu));
    f[3] = bf2f((bf16)(v.y >> 16));
    f[4] = bf2f((bf16)(v.z & 0xffffu));
    f[5] = bf2f((bf16)(v.z >> 16));
    f[6] = bf2f((bf16)(v.w & 0xffffu));
    f[7] = bf2f((bf16)(v.w >> 16));
}
extern "C" __global__ void __launch_bounds__(QKW_WARPS * 32) qk_norm_rope_warp(
    bf16* xq, const bf16* __restrict__ wq, int rows_q, bf16* xk, const bf16* __restrict__ wk, int rows_k,
    int D, float eps, const float* __restrict__ freqs, int nfreq, int gh, int gw,
    float scale_f, float scale_h, float scale_w, float base_f, float base_h, float base_w,
    float* __restrict__ amax) {
    const int lane = threadIdx.x & 31;
    const long long t = (long long)blockIdx.x * QKW_WARPS + (threadIdx.x >> 5);
    const bool is_k = blockIdx.y == 1;
    if (t >= (is_k ? rows_k : rows_q)) return;  // whole warp: no barrier below
    bf16* x = is_k ? xk : xq;
    const bf16* __restrict__ w = is_k ? wk : wq;
    uint4* xr = (uint4*)(x + t * D);
    const uint4* wr = (const uint4*)w;
    const int chunks = D / 8;
    uint4 v[QKW_CHUNKS];
#pragma unroll
    for (int j = 0; j < QKW_CHUNKS; ++j) {
        const int c = lane + 32 * j;
        v[j] = c < chunks ? xr[c] : make_uint4(0u, 0u, 0u, 0u);
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < QKW_CHUNKS; ++j) {
        float f[8];
        unpack8(v[j], f);  // zero past the row: adds nothing
#pragma unroll
        for (int e = 0; e < 8; e += 2) ss += f[e] * f[e] + f[e + 1] * f[e + 1];
    }
    const float r = rsqrtf(warp_sum(ss) / (float)D + eps);
    float pos[3];
    rope_position(t, gh, gw, scale_f, scale_h, scale_w, base_f, base_h, base_w, pos);
    const int pad_pairs = (D - 6 * nfreq) / 2;
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < QKW_CHUNKS; ++j) {
        const int c = lane + 32 * j;
        if (c >= chunks) continue;
        float f[8], g[8];
        unpack8(v[j], f);
        unpack8(wr[c], g);
        unsigned int o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int p = 4 * c + e;
            float a = f[2 * e] * r * g[2 * e];
            float b = f[2 * e + 1] * r * g[2 * e + 1];
            a = bf2f(f2bf(a));
            b = bf2f(f2bf(b));
            rope_pair(freqs, p, pad_pairs, pos, a, b);
            o[e] = pack_bf16x2(a, b);
            m = amax_bf16x2(o[e], m);
        }
        xr[c] = make_uint4(o[0], o[1], o[2], o[3]);
    }
    raise_amax(amax, is_k, lane == 0, warp_max(m));
}

// The forward's q/k norm: `qk_norm_rope` over two tensors in one launch
// (blockIdx.y = 0: `xq`/`wq`, rows_q rows; 1: `xk`/`wk`, rows_k rows), in place,
// with each thread's pairs held in registers between the sum of squares and the
// write (one read of the row, not two: the two-pass kernel above is latency
// bound at about a third of the memory's bandwidth). The thread-to-pair mapping,
// the order of every sum and every expression are those of `qk_norm_rope`, so
// the two kernels agree bit for bit (a device check holds them to it). Needs
// blockDim.x = 256 and D <= 8 * 2 * 256 = 4096, D even; RoPE as there when
// `freqs` is not null (both tensors then have the grid's rows). With `amax` not
// null, raises amax[0] (q) and amax[4] (k) to the largest |value| the block
// wrote (the bf16 values, NaN ignored): what `amax3_bf16` would read back from
// the written rows, bit for bit, so the FP8 attention's operand pass need not
// read q and k for it (the FP8 attention's slot layout, `kernels/fp8.cu`).
#define QKN_THREADS 256
#define QKN_PPT 8
extern "C" __global__ void __launch_bounds__(QKN_THREADS) qk_norm_rope_pair(
    bf16* xq, const bf16* __restrict__ wq, int rows_q, bf16* xk, const bf16* __restrict__ wk, int rows_k,
    int D, float eps, const float* __restrict__ freqs, int nfreq, int gh, int gw,
    float scale_f, float scale_h, float scale_w, float base_f, float base_h, float base_w,
    float* __restrict__ amax) {
    __shared__ float scratch[32];
    const long long t = blockIdx.x;
    const bool is_k = blockIdx.y == 1;
    if (t >= (is_k ? rows_k : rows_q)) return;  // whole block: no barrier is skipped by part of it
    bf16* x = is_k ? xk : xq;
    const bf16* __restrict__ w = is_k ? wk : wq;
    unsigned int* xr = (unsigned int*)(x + t * D);
    const int pairs = D / 2;
    unsigned int v[QKN_PPT];
#pragma unroll
    for (int j = 0; j < QKN_PPT; ++j) {
        const int p = threadIdx.x + j * QKN_THREADS;
        v[j] = p < pairs ? xr[p] : 0u;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < QKN_PPT; ++j) {
        const int p = threadIdx.x + j * QKN_THREADS;
        if (p < pairs) {
            float a = bf2f((bf16)(v[j] & 0xffffu)), b = bf2f((bf16)(v[j] >> 16));
            ss += a * a + b * b;
        }
    }
    const float r = rsqrtf(block_sum(ss, scratch) / (float)D + eps);
    float pos[3];
    rope_position(t, gh, gw, scale_f, scale_h, scale_w, base_f, base_h, base_w, pos);
    const int pad_pairs = (D - 6 * nfreq) / 2;
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < QKN_PPT; ++j) {
        const int p = threadIdx.x + j * QKN_THREADS;
        if (p >= pairs) continue;
        float a = bf2f((bf16)(v[j] & 0xffffu)) * r * bf2f(w[2 * p]);
        float b = bf2f((bf16)(v[j] >> 16)) * r * bf2f(w[2 * p + 1]);
        a = bf2f(f2bf(a));
        b = bf2f(f2bf(b));
        rope_pair(freqs, p, pad_pairs, pos, a, b);
        const unsigned int o = pack_bf16x2(a, b);
        xr[p] = o;
        m = amax_bf16x2(o, m);
    }
    if (amax != 0) raise_amax(amax, is_k, threadIdx.x == 0, block_max(m, scratch));
}

// y = x * sigmoid(x).
extern "C" __global__ void silu_bf16(const bf16* __restrict__ x, bf16* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float v = bf2f(x[i]);
        y[i] = f2bf(v / (1.0f + expf(-v)));
    }
}

// f32 add / subtract / multiply with explicit round-to-nearest: PTX never
// contracts an instruction with a rounding modifier into an FMA.
__device__ __forceinline__ float add_rn(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float sub_rn(float a, float b) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// One Euler step of the sampler with classifier-free guidance, f32:
// lat += dt * v with v = u + g * (c - u), or v = c when u is null. Each operation
// rounds on its own (no FMA contraction), so for the same velocities the device
// computes exactly the CPU arm's `cfg_combine` then `euler_step`.
extern "C" __global__ void guided_euler(float* __restrict__ lat, const float* __restrict__ c,
                                        const float* __restrict__ u, float g, float dt, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float v = u ? add_rn(u[i], mul_rn(g, sub_rn(c[i], u[i]))) : c[i];
        lat[i] = add_rn(lat[i], mul_rn(dt, v));
    }
}

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// y[i] = uniform in [-scale, scale), a pure function of (seed, i): synthetic
// weights and burn operands made on the device.
extern "C" __global__ void fill_uniform_bf16(bf16* __restrict__ y, long long n, unsigned long long seed, float scale) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const unsigned long long h = splitmix64(seed ^ splitmix64((unsigned long long)i));
        const float u = (float)(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        y[i] = f2bf((2.0f * u - 1.0f) * scale);
    }
}

// The 256-wide sinusoidal timestep embedding, cosines first:
// out[i] = cos(t * f_i), out[half + i] = sin(t * f_i), f_i = exp(-ln(10000) * i / half).
// One block. The body is one non-inlined function shared by both entry points,
// so the eager kernel (t by value) and the graph kernel (t read from device
// memory) run the same machine code on the same t and write the same bits.
__device__ __noinline__ void sinusoid_rows(bf16* __restrict__ out, float t, int half) {
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float e = (float)i * -9.210340371976184f / (float)half;  // -ln(10000)
        const float a = t * expf(e);
        out[i] = f2bf(cosf(a));
        out[half + i] = f2bf(sinf(a));
    }
}

// t arrives by value so no host copy is needed per forward (the eager loop).
extern "C" __global__ void timestep_sinusoid(bf16* __restrict__ out, float t, int half) {
    sinusoid_rows(out, t, half);
}

// t read from device memory when the kernel runs: a captured CUDA graph replays
// this launch every step while the host writes each step's t into `t` first.
extern "C" __global__ void timestep_sinusoid_at(bf16* __restrict__ out, const float* __restrict__ t, int half) {
    sinusoid_rows(out, *t, half);
}

// The fused row step between sub-blocks of the DiT, one block per row of D
// (D a multiple of 4, dynamic shared memory D * 4 bytes):
//   if y != null: x += y * gate, gate = gate_tab + gate_emb (gate_tab == null: 1)
//   then h = mode 0: bf16(x)
//            mode 1: bf16(rms(x) * (1 + scale) + shift)
//            mode 2: bf16(layernorm(x) * (1 + scale) + shift)
// with shift = shift_tab + shift_emb, scale = scale_tab + scale_emb (bf16 [D]).
// One pass over x and y (4-wide loads), the row kept in shared memory.
__device__ __forceinline__ void ld_bf16x4(const bf16* p, float* o) {
    const uint2 v = *(const uint2*)p;
    o[0] = bf2f((bf16)(v.x & 0xffffu));
    o[1] = bf2f((bf16)(v.x >> 16));
    o[2] = bf2f((bf16)(v.y & 0xffffu));
    o[3] = bf2f((bf16)(v.y >> 16));
}

// The residual step of one row r of `residual_norm` and `residual_norm_e4m3`:
// x[r] += y[r] * gate when y is given, and row[] (shared, D floats) = the new
// x[r]; returns (mean, 1 / rms) for `mode` ((0, 1) for mode 0, where nothing
// is reduced). Each thread owns the row entries 4i..4i+3 of its i (stride
// blockDim.x), before and after. The stream x is f32 (BX false) or bf16 (BX
// true, lever `residual`: the sum is taken in f32 and rounded once to bf16,
// and row[] holds the rounded values, as a bf16 model's hidden state is what
// its next norm reads).
template <bool BX>
__device__ __forceinline__ float2 residual_row(void* __restrict__ xv, const bf16* __restrict__ y,
                                               const bf16* __restrict__ gate_tab,
                                               const bf16* __restrict__ gate_emb, long long r, int D,
                                               float eps, int mode, float* row, float* scratch) {
    const int q4 = D / 4;
    float s1 = 0.0f;
    for (int i = threadIdx.x; i < q4; i += blockDim.x) {
        float v[4];
        if (BX) {
            ld_bf16x4((const bf16*)xv + r * D + 4 * i, v);
        } else {
            const float4 f = ((const float4*)((const float*)xv + r * D))[i];
            v[0] = f.x;
            v[1] = f.y;
            v[2] = f.z;
            v[3] = f.w;
        }
        if (y) {
            float yy[4], g0[4] = {1.0f, 1.0f, 1.0f, 1.0f}, g1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            ld_bf16x4(y + r * D + 4 * i, yy);
            if (gate_tab) {
                ld_bf16x4(gate_tab + 4 * i, g0);
                ld_bf16x4(gate_emb + 4 * i, g1);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] += yy[j] * (g0[j] + g1[j]);
            if (BX) {
                const unsigned int p01 = pack_bf16x2(v[0], v[1]), p23 = pack_bf16x2(v[2], v[3]);
                ((uint2*)((bf16*)xv + r * D))[i] = make_uint2(p01, p23);
                v[0] = __uint_as_float(p01 << 16);
                v[1] = __uint_as_float(p01 & 0xffff0000u);
                v[2] = __uint_as_float(p23 << 16);
                v[3] = __uint_as_float(p23 & 0xffff0000u);
            } else {
                ((float4*)((float*)xv + r * D))[i] = make_float4(v[0], v[1], v[2], v[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) row[4 * i + j] = v[j];
        s1 += v[0] + v[1] + v[2] + v[3];
    }
    if (mode == 0) return make_float2(0.0f, 1.0f);
    float mean = 0.0f;
    if (mode == 2) mean = block_sum(s1, scratch) / (float)D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < q4; i += blockDim.x) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float v = row[4 * i + j] - mean;
            ss += v * v;
        }
    }
    const float rs = rsqrtf(block_sum(ss, scratch) / (float)D + eps);
    return make_float2(mean, rs);
}

// The four outputs 4i..4i+3 of a row after `residual_row` (as f32, before any
// rounding): mode 0 the row itself, else (row - mean) * rs * (1 + scale) +
// shift.
__device__ __forceinline__ void modulated4(const float* row, int i, int mode, float2 mr,
                                           const bf16* __restrict__ shift_tab,
                                           const bf16* __restrict__ scale_tab,
                                           const bf16* __restrict__ shift_emb,
                                           const bf16* __restrict__ scale_emb, float* o) {
    if (mode == 0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = row[4 * i + j];
        return;
    }
    const float mean = mr.x, rs = mr.y;
    float a[4], b[4], c[4], d[4];
    ld_bf16x4(shift_tab + 4 * i, a);
    ld_bf16x4(shift_emb + 4 * i, b);
    ld_bf16x4(scale_tab + 4 * i, c);
    ld_bf16x4(scale_emb + 4 * i, d);
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = (row[4 * i + j] - mean) * rs * (1.0f + c[j] + d[j]) + (a[j] + b[j]);
}

template <bool BX>
__device__ __forceinline__ void residual_norm_body(void* __restrict__ x, const bf16* __restrict__ y,
                                                   const bf16* __restrict__ gate_tab,
                                                   const bf16* __restrict__ gate_emb, int D, float eps,
                                                   int mode, const bf16* __restrict__ shift_tab,
                                                   const bf16* __restrict__ scale_tab,
                                                   const bf16* __restrict__ shift_emb,
                                                   const bf16* __restrict__ scale_emb,
                                                   bf16* __restrict__ h) {
    extern __shared__ float row[];
    __shared__ float scratch[32];
    const long long r = blockIdx.x;
    const float2 mr = residual_row<BX>(x, y, gate_tab, gate_emb, r, D, eps, mode, row, scratch);
    uint2* hr = (uint2*)(h + r * D);
    for (int i = threadIdx.x; i < D / 4; i += blockDim.x) {
        float o[4];
        modulated4(row, i, mode, mr, shift_tab, scale_tab, shift_emb, scale_emb, o);
        hr[i] = make_uint2(pack_bf16x2(o[0], o[1]), pack_bf16x2(o[2], o[3]));
    }
}

extern "C" __global__ void residual_norm(float* __restrict__ x, const bf16* __restrict__ y,
                                         const bf16* __restrict__ gate_tab, const bf16* __restrict__ gate_emb,
                                         int D, float eps, int mode,
                                         const bf16* __restrict__ shift_tab, const bf16* __restrict__ scale_tab,
                                         const bf16* __restrict__ shift_emb, const bf16* __restrict__ scale_emb,
                                         bf16* __restrict__ h) {
    residual_norm_body<false>(x, y, gate_tab, gate_emb, D, eps, mode, shift_tab, scale_tab, shift_emb,
                              scale_emb, h);
}

// `residual_norm` over a bf16 stream x (lever `residual = bf16`).
extern "C" __global__ void residual_norm_bf16x(bf16* __restrict__ x, const bf16* __restrict__ y,
                                               const bf16* __restrict__ gate_tab,
                                               const bf16* __restrict__ gate_emb, int D, float eps, int mode,
                                               const bf16* __restrict__ shift_tab,
                                               const bf16* __restrict__ scale_tab,
                                               const bf16* __restrict__ shift_emb,
                                               const bf16* __restrict__ scale_emb, bf16* __restrict__ h) {
    residual_norm_body<true>(x, y, gate_tab, gate_emb, D, eps, mode, shift_tab, scale_tab, shift_emb,
                             scale_emb, h);
}

// `residual_norm` whose consumer is an FP8 GEMM (precision = fp8): the same
// residual step and the same bf16 h, which is not written; instead h's row is
// quantized as `quantize_rows_e4m3` (fp8.cu) would quantize it: amax = max |h|
// over the row, inv = 448 / amax, q = e4m3(h * inv) row-major [rows, D] and
// scales[r] = amax / 448 (both 1 when amax is 0 or not finite). Bit for bit the
// two-pass result, without writing h and reading it twice. q 4-byte aligned.
template <bool BX>
__device__ __forceinline__ void residual_norm_e4m3_body(void* __restrict__ x, const bf16* __restrict__ y,
                                              const bf16* __restrict__ gate_tab,
                                              const bf16* __restrict__ gate_emb, int D, float eps,
                                              int mode, const bf16* __restrict__ shift_tab,
                                              const bf16* __restrict__ scale_tab,
                                              const bf16* __restrict__ shift_emb,
                                              const bf16* __restrict__ scale_emb,
                                              unsigned char* __restrict__ q,
                                              float* __restrict__ scales) {
    extern __shared__ float row[];
    __shared__ float scratch[32];
    const long long r = blockIdx.x;
    const float2 mr = residual_row<BX>(x, y, gate_tab, gate_emb, r, D, eps, mode, row, scratch);
    float m = 0.0f;
    for (int i = threadIdx.x; i < D / 4; i += blockDim.x) {
        float o[4];
        modulated4(row, i, mode, mr, shift_tab, scale_tab, shift_emb, scale_emb, o);
        // h as bf16 would hold it (the pair rounding of pack_bf16x2), kept in
        // this thread's own row entries.
        const unsigned int p01 = pack_bf16x2(o[0], o[1]), p23 = pack_bf16x2(o[2], o[3]);
        const float hv[4] = {__uint_as_float(p01 << 16), __uint_as_float(p01 & 0xffff0000u),
                             __uint_as_float(p23 << 16), __uint_as_float(p23 & 0xffff0000u)};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            row[4 * i + j] = hv[j];
            m = fmaxf(m, fabsf(hv[j]));
        }
    }
    m = block_max(m, scratch);
    const float2 f = tensor_factors(m);
    const float inv = f.x;
    if (threadIdx.x == 0) scales[r] = f.y;
    unsigned int* qr = (unsigned int*)(q + r * D);
    for (int i = threadIdx.x; i < D / 4; i += blockDim.x) {
        const unsigned int lo = e4m3x2(row[4 * i] * inv, row[4 * i + 1] * inv);
        const unsigned int hi = e4m3x2(row[4 * i + 2] * inv, row[4 * i + 3] * inv);
        qr[i] = lo | (hi << 16);
    }
}

extern "C" __global__ void residual_norm_e4m3(float* __restrict__ x, const bf16* __restrict__ y,
                                              const bf16* __restrict__ gate_tab,
                                              const bf16* __restrict__ gate_emb, int D, float eps,
                                              int mode, const bf16* __restrict__ shift_tab,
                                              const bf16* __restrict__ scale_tab,
                                              const bf16* __restrict__ shift_emb,
                                              const bf16* __restrict__ scale_emb,
                                              unsigned char* __restrict__ q,
                                              float* __restrict__ scales) {
    residual_norm_e4m3_body<false>(x, y, gate_tab, gate_emb, D, eps, mode, shift_tab, scale_tab,
                                   shift_emb, scale_emb, q, scales);
}

// `residual_norm_e4m3` over a bf16 stream x (lever `residual = bf16`).
extern "C" __global__ void residual_norm_e4m3_bf16x(bf16* __restrict__ x, const bf16* __restrict__ y,
                                                    const bf16* __restrict__ gate_tab,
                                                    const bf16* __restrict__ gate_emb, int D, float eps,
                                                    int mode, const bf16* __restrict__ shift_tab,
                                                    const bf16* __restrict__ scale_tab,
                                                    const bf16* __restrict__ shift_emb,
                                                    const bf16* __restrict__ scale_emb,
                                                    unsigned char* __restrict__ q,
                                                    float* __restrict__ scales) {
    residual_norm_e4m3_body<true>(x, y, gate_tab, gate_emb, D, eps, mode, shift_tab, scale_tab,
                                  shift_emb, scale_emb, q, scales);
}
