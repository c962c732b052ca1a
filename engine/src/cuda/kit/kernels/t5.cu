// Kernels of the T5 encoder forward (cuda/t5.rs). Conventions as in
// elementwise.cu: `bf16` is raw bits (common.cuh), arithmetic is f32, rows are
// contiguous with `D` elements, one block per row for the row-wise kernels,
// grid-stride loops for the elementwise one.
#include "common.cuh"

#define T5_NEG_INF __int_as_float(0xff800000u)

// Maximum over a warp (all 32 lanes active).
__device__ __forceinline__ float t5_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The token embedding: x[r, :] = f32(table[ids[r], :]), one block per row.
// The ids were checked against the vocabulary on the host.
extern "C" __global__ void t5_embed(const int* __restrict__ ids, const bf16* __restrict__ table,
                                    float* __restrict__ x, int D) {
    const long long r = blockIdx.x;
    const bf16* src = table + (long long)ids[r] * D;
    float* dst = x + r * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) dst[i] = bf2f(src[i]);
}

// The residual add, then T5's RMS norm (no mean, no bias), one block per row
// of D; dynamic shared memory D * 4 bytes holds the row:
//   if y != null: x += f32(y)        (x is the f32 residual stream, written back)
//   n = x * rsqrt(mean(x^2) + eps) * w
//   h != null: h = bf16(n)           (the next GEMM's operand)
//   out != null: out = n             (f32: the encoder's output)
extern "C" __global__ void t5_add_rms(float* __restrict__ x, const bf16* __restrict__ y,
                                      const bf16* __restrict__ w, int D, float eps,
                                      bf16* __restrict__ h, float* __restrict__ out) {
    extern __shared__ float row[];
    __shared__ float scratch[32];
    const long long r = blockIdx.x;
    float* xr = x + r * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = xr[i];
        if (y) {
            v += bf2f(y[r * D + i]);
            xr[i] = v;
        }
        row[i] = v;
        ss += v * v;
    }
    const float rs = rsqrtf(block_sum(ss, scratch) / (float)D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float n = row[i] * rs * bf2f(w[i]);
        if (h) h[r * D + i] = f2bf(n);
        if (out) out[r * D + i] = n;
    }
}

// T5 v1.1's gated activation: g = bf16(gelu_tanh(a) * b) over n elements
// (g may alias a: each element is read before it is written, by one thread).
extern "C" __global__ void t5_gated_gelu(const bf16* a, const bf16* __restrict__ b, bf16* g, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float x = bf2f(a[i]);
        const float inner = 0.7978846f * (x + 0.044715f * x * x * x);
        g[i] = f2bf(0.5f * x * (1.0f + tanhf(inner)) * bf2f(b[i]));
    }
}

// T5 self-attention over B prompts of L tokens: per prompt b and head h,
// softmax(q k^T + pos + mask) v, with no 1/sqrt(HD) scaling (T5 folds it into
// the initialisation of the q projection).
//  - q, k, v, o: bf16 [B * L, ld]; prompt b at rows b*L..; head h at columns h*HD...
//  - pos(h, i, j) = table[bucket[j - i + L - 1] * heads + h]: `table` is the
//    checkpoint's relative_attention_bias (bf16 [buckets, heads]), `bucket` the
//    bucket of each relative position (int [2L - 1], from the host). table ==
//    null: no position bias.
//  - mask f32 [B, L] (> 0.5 = a real key): a padded key gets probability 0, as
//    the reference's most-negative-f32 bias gives it; mask == null: every key.
// Scores, softmax and accumulation in f32 (scalar FMAs on bf16-exact inputs),
// online softmax over chunks of 32 keys (one per lane) staged in shared memory.
// Block: 4 warps x 4 queries = 16 queries; grid (ceil(L / 16), heads, B).
template <int HD>
__device__ __forceinline__ void t5_attn(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                        const bf16* __restrict__ v, bf16* __restrict__ o, int L, int ld,
                                        int heads, const bf16* __restrict__ table,
                                        const int* __restrict__ bucket, const float* __restrict__ mask) {
    constexpr int KC = 32, QW = 4, WARPS = 4, QB = QW * WARPS;
    constexpr int DPL = (HD + 31) / 32;  // output channels per lane
    __shared__ float qs[QB][HD];
    __shared__ float ks[KC][HD + 1];  // +1: lane j reads row j without bank conflicts
    __shared__ float vs[KC][HD];
    const int h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q0 = blockIdx.x * QB;
    const long long base = (long long)blockIdx.z * L;
    const float* mk = mask ? mask + base : nullptr;
    for (int e = threadIdx.x; e < QB * HD; e += blockDim.x) {
        const int r = e / HD, c = e - (e / HD) * HD, qi = q0 + r;
        qs[r][c] = qi < L ? bf2f(q[(base + qi) * ld + h * HD + c]) : 0.0f;
    }
    float m[QW], l[QW], acc[QW][DPL];
#pragma unroll
    for (int t = 0; t < QW; ++t) {
        m[t] = T5_NEG_INF;
        l[t] = 0.0f;
#pragma unroll
        for (int u = 0; u < DPL; ++u) acc[t][u] = 0.0f;
    }
    for (int kt = 0; kt < L; kt += KC) {
        __syncthreads();  // the previous chunk is consumed (and the query tile written)
        for (int e = threadIdx.x; e < KC * HD; e += blockDim.x) {
            const int r = e / HD, c = e - (e / HD) * HD, key = kt + r;
            const bool in = key < L;
            ks[r][c] = in ? bf2f(k[(base + key) * ld + h * HD + c]) : 0.0f;
            vs[r][c] = in ? bf2f(v[(base + key) * ld + h * HD + c]) : 0.0f;
        }
        __syncthreads();
        const int key = kt + lane;
        const bool live = key < L && (mk == nullptr || mk[key] > 0.5f);
#pragma unroll
        for (int t = 0; t < QW; ++t) {
            const int r = warp * QW + t, qi = q0 + r;
            float s = T5_NEG_INF;
            if (live && qi < L) {
                float d = 0.0f;
#pragma unroll 16
                for (int c = 0; c < HD; ++c) d += qs[r][c] * ks[lane][c];
                if (table) d += bf2f(table[bucket[key - qi + L - 1] * heads + h]);
                s = d;
            }
            const float mn = fmaxf(m[t], t5_warp_max(s));
            if (mn == T5_NEG_INF) continue;  // no live key yet (warp-uniform)
            const float corr = expf(m[t] - mn);  // m = -inf: 0
            const float p = expf(s - mn);        // a dead key: 0
            l[t] = l[t] * corr + warp_sum(p);
#pragma unroll
            for (int u = 0; u < DPL; ++u) acc[t][u] *= corr;
            for (int j = 0; j < KC; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int u = 0; u < DPL; ++u) {
                    const int c = lane + 32 * u;
                    if (c < HD) acc[t][u] += pj * vs[j][c];
                }
            }
            m[t] = mn;
        }
    }
#pragma unroll
    for (int t = 0; t < QW; ++t) {
        const int qi = q0 + warp * QW + t;
        if (qi >= L) continue;
        const float inv = l[t] > 0.0f ? 1.0f / l[t] : 0.0f;
#pragma unroll
        for (int u = 0; u < DPL; ++u) {
            const int c = lane + 32 * u;
            if (c < HD) o[(base + qi) * ld + h * HD + c] = f2bf(acc[t][u] * inv);
        }
    }
}

#define T5_ATTN_ARGS                                                                                       \
    const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v, bf16 *__restrict__ o, \
        int L, int ld, int heads, const bf16 *__restrict__ table, const int *__restrict__ bucket,             \
        const float *__restrict__ mask

// The head dims of the presets: 16 (tiny) and 64 (T5-XXL).
extern "C" __global__ void __launch_bounds__(128) t5_attn_hd16(T5_ATTN_ARGS) {
    t5_attn<16>(q, k, v, o, L, ld, heads, table, bucket, mask);
}
extern "C" __global__ void __launch_bounds__(128) t5_attn_hd64(T5_ATTN_ARGS) {
    t5_attn<64>(q, k, v, o, L, ld, heads, table, bucket, mask);
}
