// Multi-head attention over row-major [tokens, ld] matrices whose head h occupies
// columns [h*HD, (h+1)*HD). softmax(q k^T * scale + kbias) v per head, fp32
// softmax and accumulation, bf16 in and out. `kbias` (nullable) is an additive
// per-key bias (the text mask as (1 - mask) * -10000). grid = (query blocks, heads).
//
// Two implementations:
//  * attn_ref_hd*: one thread per query, K/V tiles staged in shared memory as f32,
//    scalar online softmax. Slow and obviously correct: the check for the fast one.
//  * flash2_hd*_w8[_bias]: the forward's kernel. Flash-style fused attention, bf16
//    mma.sync m16n8k16 (f32 accumulate) with ldmatrix fragment loads, online softmax
//    in registers, K/V tiles double-buffered with cp.async; 8 warps of 16 query rows
//    share each K/V tile. (Device runs 1-4 measured the variants this replaced:
//    a plain-load and an ldmatrix v1 kernel, and v2 with 4 warps; reports/device-notes.md.)
//  * flash_mt<MT>_hd*_w<W>[_bias]: the same math with MT m-tiles per warp, the Q
//    tile in shared memory and one barrier per K/V tile (see its section below).
#include "common.cuh"

#define NEG_INF __int_as_float(0xff800000u)
#define LOG2E 1.4426950408889634f

// ---------------------------------------------------------------- reference ----

template <int HD>
__device__ __forceinline__ void attn_ref(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                         const bf16* __restrict__ v, bf16* __restrict__ o, int nq, int nk,
                                         int ldq, int ldk, int ldv, int ldo, const float* __restrict__ kbias,
                                         float scale) {
    constexpr int KT = 32;
    __shared__ float ks[KT][HD];
    __shared__ float vs[KT][HD];
    const int h = blockIdx.y;
    const int qi = blockIdx.x * blockDim.x + threadIdx.x;
    const bool valid = qi < nq;
    float qv[HD], acc[HD];
#pragma unroll
    for (int c = 0; c < HD; ++c) {
        qv[c] = valid ? bf2f(q[(long long)qi * ldq + h * HD + c]) * scale : 0.0f;
        acc[c] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int kt = 0; kt < nk; kt += KT) {
        __syncthreads();
        for (int e = threadIdx.x; e < KT * HD; e += blockDim.x) {
            const int r = e / HD, c = e % HD, key = kt + r;
            ks[r][c] = key < nk ? bf2f(k[(long long)key * ldk + h * HD + c]) : 0.0f;
            vs[r][c] = key < nk ? bf2f(v[(long long)key * ldv + h * HD + c]) : 0.0f;
        }
        __syncthreads();
        if (valid) {
            for (int j = 0; j < KT && kt + j < nk; ++j) {
                float s = 0.0f;
#pragma unroll
                for (int c = 0; c < HD; ++c) s += qv[c] * ks[j][c];
                if (kbias) s += kbias[kt + j];
                const float mn = fmaxf(m, s);
                const float corr = expf(m - mn);
                const float p = expf(s - mn);
                l = l * corr + p;
#pragma unroll
                for (int c = 0; c < HD; ++c) acc[c] = acc[c] * corr + p * vs[j][c];
                m = mn;
            }
        }
    }
    if (valid) {
        const float inv = 1.0f / l;
#pragma unroll
        for (int c = 0; c < HD; ++c) o[(long long)qi * ldo + h * HD + c] = f2bf(acc[c] * inv);
    }
}

#define REF_ARGS                                                                                        \
    const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v, bf16 *__restrict__ o, \
        int nq, int nk, int ldq, int ldk, int ldv, int ldo, const float *__restrict__ kbias, float scale

extern "C" __global__ void __launch_bounds__(64) attn_ref_hd16(REF_ARGS) {
    attn_ref<16>(q, k, v, o, nq, nk, ldq, ldk, ldv, ldo, kbias, scale);
}
extern "C" __global__ void __launch_bounds__(64) attn_ref_hd32(REF_ARGS) {
    attn_ref<32>(q, k, v, o, nq, nk, ldq, ldk, ldv, ldo, kbias, scale);
}
extern "C" __global__ void __launch_bounds__(64) attn_ref_hd64(REF_ARGS) {
    attn_ref<64>(q, k, v, o, nq, nk, ldq, ldk, ldv, ldo, kbias, scale);
}
extern "C" __global__ void __launch_bounds__(64) attn_ref_hd128(REF_ARGS) {
    attn_ref<128>(q, k, v, o, nq, nk, ldq, ldk, ldv, ldo, kbias, scale);
}

// -------------------------------------------------------------------- flash ----

__device__ __forceinline__ unsigned int smem_u32(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16-byte global -> shared copy; with ok == false the destination is zero-filled.
__device__ __forceinline__ void cp_async16(void* sdst, const void* gsrc, bool ok) {
    const unsigned int s = smem_u32(sdst);
    const int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gsrc), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// D += A(16x16, row) * B(16x8, col), bf16 operands, f32 accumulators.
__device__ __forceinline__ void mma16816(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(unsigned int& r0, unsigned int& r1, unsigned int& r2, unsigned int& r3,
                                        unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned int& r0, unsigned int& r1, unsigned int& r2, unsigned int& r3,
                                          unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// Keys per K/V tile. Shared memory: K and V tiles, two stages each, rows padded
// by 8 elements (16 bytes) so the 8 rows a fragment load touches fall in distinct
// banks.
constexpr int FA_BN = 64;

// ------------------------------------------------------------------ flash v2 ----
// The softmax arithmetic is trimmed: the running max is kept on raw scores (the scale is
// positive, so the max commutes with it) and each probability is one FFMA + one
// ex2 (p = 2^(s * scale*log2e - m * scale*log2e)); keys past the end are masked
// only in the last tile; the key bias (text mask) is a template case, added to
// the raw score as bias / scale. WARPS warps of 16 query rows each share every
// K/V tile (8 -> 128 query rows per block).

__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Rows row0 .. row0+nrows of head h (columns h*HD ..) into shared rows of HD + 8
// elements, by cp.async; rows at or past n are zero-filled. The caller commits.
template <int HD>
__device__ __forceinline__ void fmt_load_rows(bf16* dst, const bf16* __restrict__ src, int row0, int nrows,
                                              int n, int ld, int h) {
    constexpr int SROW = HD + 8;
    constexpr int CHUNKS = HD / 8;
    for (int i = threadIdx.x; i < nrows * CHUNKS; i += blockDim.x) {
        const int r = i / CHUNKS, c8 = (i % CHUNKS) * 8;
        const int row = row0 + r;
        const bool ok = row < n;
        const long long rr = ok ? row : 0;
        cp_async16(dst + r * SROW + c8, src + rr * ld + h * HD + c8, ok);
    }
}

template <int HD>
__device__ __forceinline__ void fa2_load_tile(bf16* ks, bf16* vs, const bf16* __restrict__ k,
                                              const bf16* __restrict__ v, int kt, int nk, int ldk, int ldv, int h) {
    fmt_load_rows<HD>(ks, k, kt, FA_BN, nk, ldk, h);
    fmt_load_rows<HD>(vs, v, kt, FA_BN, nk, ldv, h);
    cp_async_commit();
}

template <int HD, int WARPS, bool BIAS>
__device__ __forceinline__ void flash2_fwd(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                           const bf16* __restrict__ v, bf16* __restrict__ o, int nq, int nk,
                                           int ldq, int ldk, int ldv, int ldo, const float* __restrict__ kbias,
                                           float scale) {
    constexpr int SROW = HD + 8;
    constexpr int KSTEPS = HD / 16;
    constexpr int DTILES = HD / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16* ks = (bf16*)fa_smem;
    bf16* vs = ks + 2 * FA_BN * SROW;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y;
    const int r0 = blockIdx.x * (16 * WARPS) + warp * 16 + g;
    const int r1 = r0 + 8;
    const float sl2 = scale * LOG2E;
    const float inv_scale = 1.0f / scale;

    unsigned int qa[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        const int c = h * HD + kk * 16 + 2 * t;
        qa[kk][0] = r0 < nq ? *(const unsigned int*)(q + (long long)r0 * ldq + c) : 0u;
        qa[kk][1] = r1 < nq ? *(const unsigned int*)(q + (long long)r1 * ldq + c) : 0u;
        qa[kk][2] = r0 < nq ? *(const unsigned int*)(q + (long long)r0 * ldq + c + 8) : 0u;
        qa[kk][3] = r1 < nq ? *(const unsigned int*)(q + (long long)r1 * ldq + c + 8) : 0u;
    }
    float oacc[DTILES][4];
#pragma unroll
    for (int i = 0; i < DTILES; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    const int ntiles = (nk + FA_BN - 1) / FA_BN;
    fa2_load_tile<HD>(ks, vs, k, v, 0, nk, ldk, ldv, h);
    for (int it = 0; it < ntiles; ++it) {
        const int stage = it & 1;
        if (it + 1 < ntiles) {
            fa2_load_tile<HD>(ks + (stage ^ 1) * FA_BN * SROW, vs + (stage ^ 1) * FA_BN * SROW, k, v,
                              (it + 1) * FA_BN, nk, ldk, ldv, h);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* kst = ks + stage * FA_BN * SROW;
        const bf16* vst = vs + stage * FA_BN * SROW;

        float s[FA_BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < FA_BN / 8; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk += 2) {
                const int mi = lane >> 3;
                const bf16* p = kst + (nt * 8 + (lane & 7)) * SROW + kk * 16 + mi * 8;
                unsigned int b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, smem_u32(p));
                mma16816(s[nt], qa[kk], b0, b1);
                mma16816(s[nt], qa[kk + 1], b2, b3);
            }
        }
        if (BIAS) {
#pragma unroll
            for (int nt = 0; nt < FA_BN / 8; ++nt) {
                const int key = it * FA_BN + nt * 8 + 2 * t;
                const float b0 = key < nk ? kbias[key] * inv_scale : 0.0f;
                const float b1 = key + 1 < nk ? kbias[key + 1] * inv_scale : 0.0f;
                s[nt][0] += b0;
                s[nt][1] += b1;
                s[nt][2] += b0;
                s[nt][3] += b1;
            }
        }
        if ((it + 1) * FA_BN > nk) {
#pragma unroll
            for (int nt = 0; nt < FA_BN / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (it * FA_BN + nt * 8 + 2 * t + (e & 1) >= nk) s[nt][e] = NEG_INF;
                }
            }
        }
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int nt = 0; nt < FA_BN / 8; ++nt) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float base0 = mx0 == NEG_INF ? 0.0f : mx0 * sl2;
        const float base1 = mx1 == NEG_INF ? 0.0f : mx1 * sl2;
        const float c0 = ex2_approx(fmaf(m0, sl2, -base0)), c1 = ex2_approx(fmaf(m1, sl2, -base1));
        m0 = mx0;
        m1 = mx1;
        l0 *= c0;
        l1 *= c1;
#pragma unroll
        for (int i = 0; i < DTILES; ++i) {
            oacc[i][0] *= c0;
            oacc[i][1] *= c0;
            oacc[i][2] *= c1;
            oacc[i][3] *= c1;
        }
#pragma unroll
        for (int nt = 0; nt < FA_BN / 8; ++nt) {
            s[nt][0] = ex2_approx(fmaf(s[nt][0], sl2, -base0));
            s[nt][1] = ex2_approx(fmaf(s[nt][1], sl2, -base0));
            s[nt][2] = ex2_approx(fmaf(s[nt][2], sl2, -base1));
            s[nt][3] = ex2_approx(fmaf(s[nt][3], sl2, -base1));
            l0 += s[nt][0] + s[nt][1];
            l1 += s[nt][2] + s[nt][3];
        }
#pragma unroll
        for (int kc = 0; kc < FA_BN / 16; ++kc) {
            unsigned int pa[4];
            pa[0] = pack_bf16x2(s[2 * kc][0], s[2 * kc][1]);
            pa[1] = pack_bf16x2(s[2 * kc][2], s[2 * kc][3]);
            pa[2] = pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            pa[3] = pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
            for (int dt = 0; dt < DTILES; dt += 2) {
                const int mi = lane >> 3;
                const bf16* p = vst + (kc * 16 + (mi & 1) * 8 + (lane & 7)) * SROW + dt * 8 + (mi >> 1) * 8;
                unsigned int b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, smem_u32(p));
                mma16816(oacc[dt], pa, b0, b1);
                mma16816(oacc[dt + 1], pa, b2, b3);
            }
        }
        __syncthreads();
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
    for (int dt = 0; dt < DTILES; ++dt) {
        const int c = h * HD + dt * 8 + 2 * t;
        if (r0 < nq) *(unsigned int*)(o + (long long)r0 * ldo + c) = pack_bf16x2(oacc[dt][0] * inv0, oacc[dt][1] * inv0);
        if (r1 < nq) *(unsigned int*)(o + (long long)r1 * ldo + c) = pack_bf16x2(oacc[dt][2] * inv1, oacc[dt][3] * inv1);
    }
}

#define FLASH2(HD, W)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * W) flash2_hd##HD##_w##W(REF_ARGS) {              \
        flash2_fwd<HD, W, false>(q, k, v, o, nq, nk, ldq, ldk, ldv, ldo, kbias, scale);                \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * W) flash2_hd##HD##_w##W##_bias(REF_ARGS) {       \
        flash2_fwd<HD, W, true>(q, k, v, o, nq, nk, ldq, ldk, ldv, ldo, kbias, scale);                 \
    }
FLASH2(64, 8)
FLASH2(128, 8)

// ------------------------------------------------------------ flash, 2 m-tiles ----
// flash_mt*: the same math as flash2 (raw-score running max, one FFMA + ex2 per
// probability, bf16 probabilities into the P·V mma, bias as bias / scale), laid
// out so each shared-memory fragment feeds more tensor-core work:
//  * each warp owns MT m-tiles (16 query rows each), so one ldmatrix of a K or V
//    fragment feeds MT mma instead of one (flash2's 16 rows per warp make it
//    shared-memory bound: one 512-byte ldmatrix.x4 per two mma);
//  * the Q tile is staged once in shared memory (cp.async, rows past nq
//    zero-filled) and read with ldmatrix: into registers for the whole loop
//    (QREG, hd 64) or per k-step (hd 128, whose 2x64 f32 output accumulators
//    leave no room for the Q fragments);
//  * one __syncthreads per K/V tile: the copy of tile it+1 is issued after the
//    barrier that follows everyone's wait for tile it, so the stage it overwrites
//    (read during tile it-1) is free, and the copy overlaps tile it's mma work.
//  * the rescale of the running sums and outputs is skipped when no row of the
//    warp's m-tile raised its max (a warp vote);
//  * optionally (POLY) half the probabilities' 2^x on the FMA pipe (ex2_poly).

// 2^x on the FMA pipe (x <= 0; -inf and anything below -126 give ~0): x = j + f
// with j = round(x) (the 1.5 * 2^23 shifter) and f in [-0.5, 0.5]; 2^f by a
// degree-3 polynomial fitted for relative error (max 7.5e-5, 1/27 of bf16's
// 2^-9 rounding of the probability it feeds); 2^j added into the exponent.
// The special-function unit does 16 ex2 per clock per SM, the FMA pipe 128
// FFMA: moving half the probabilities here unloads the ex2 unit at hd 64.
__device__ __forceinline__ float ex2_poly(float x) {
    x = fmaxf(x, -126.0f);
    const float t = x + 12582912.0f;
    const float f = x - (t - 12582912.0f);
    const float p = fmaf(fmaf(fmaf(0.05517166682f, f, 0.24261113509f), f, 0.69326098701f), f, 0.99992807279f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

template <int HD, int WARPS, int MT, int BN, bool QREG, bool POLY, bool BIAS>
__device__ __forceinline__ void flash_mt_fwd(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                             const bf16* __restrict__ v, bf16* __restrict__ o, int nq, int nk,
                                             int ldq, int ldk, int ldv, int ldo, const float* __restrict__ kbias,
                                             float scale) {
    constexpr int SROW = HD + 8;
    constexpr int KSTEPS = HD / 16;
    constexpr int DTILES = HD / 8;
    constexpr int NT = BN / 8;
    constexpr int BM = 16 * MT * WARPS;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16* qs = (bf16*)fa_smem;
    bf16* ks = qs + BM * SROW;
    bf16* vs = ks + 2 * BN * SROW;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y;
    const int row0 = blockIdx.x * BM;
    const int wrow = warp * 16 * MT;
    const float sl2 = scale * LOG2E;
    const float inv_scale = 1.0f / scale;

    // Q tile, then K/V tile 0; Q must have landed before its fragments are read.
    fmt_load_rows<HD>(qs, q, row0, BM, nq, ldq, h);
    cp_async_commit();
    fmt_load_rows<HD>(ks, k, 0, BN, nk, ldk, h);
    fmt_load_rows<HD>(vs, v, 0, BN, nk, ldv, h);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    // A fragments of Q: matrix i of the x4 load is addressed by lanes 8i..8i+7:
    // rows (lane & 15), columns + (lane >> 4) * 8 -> a0..a3 of m16n8k16.
    unsigned int qa[MT][KSTEPS][4];
    const bf16* qw = qs + (wrow + (lane & 15)) * SROW + (lane >> 4) * 8;
    if (QREG) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk)
                ldsm_x4(qa[mt][kk][0], qa[mt][kk][1], qa[mt][kk][2], qa[mt][kk][3],
                        smem_u32(qw + mt * 16 * SROW + kk * 16));
    }

    float oacc[MT][DTILES][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < DTILES; ++i) oacc[mt][i][0] = oacc[mt][i][1] = oacc[mt][i][2] = oacc[mt][i][3] = 0.0f;
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m[mt][0] = m[mt][1] = NEG_INF;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    const int ntiles = (nk + BN - 1) / BN;
    for (int it = 0; it < ntiles; ++it) {
        const int stage = it & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < ntiles) {
            fmt_load_rows<HD>(ks + (stage ^ 1) * BN * SROW, k, (it + 1) * BN, BN, nk, ldk, h);
            fmt_load_rows<HD>(vs + (stage ^ 1) * BN * SROW, v, (it + 1) * BN, BN, nk, ldv, h);
            cp_async_commit();
        }
        const bf16* kst = ks + stage * BN * SROW;
        const bf16* vst = vs + stage * BN * SROW;

        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk += 2) {
            if (!QREG) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        ldsm_x4(qa[mt][kk + j][0], qa[mt][kk + j][1], qa[mt][kk + j][2], qa[mt][kk + j][3],
                                smem_u32(qw + mt * 16 * SROW + (kk + j) * 16));
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                // B fragments of K for k-steps kk (b0, b1) and kk+1 (b2, b3).
                const bf16* p = kst + (nt * 8 + (lane & 7)) * SROW + kk * 16 + (lane >> 3) * 8;
                unsigned int b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, smem_u32(p));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816(s[mt][nt], qa[mt][kk], b0, b1);
                    mma16816(s[mt][nt], qa[mt][kk + 1], b2, b3);
                }
            }
        }
        if (BIAS) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int key = it * BN + nt * 8 + 2 * t;
                const float b0 = key < nk ? kbias[key] * inv_scale : 0.0f;
                const float b1 = key + 1 < nk ? kbias[key + 1] * inv_scale : 0.0f;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    s[mt][nt][0] += b0;
                    s[mt][nt][1] += b1;
                    s[mt][nt][2] += b0;
                    s[mt][nt][3] += b1;
                }
            }
        }
        if ((it + 1) * BN > nk) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (it * BN + nt * 8 + 2 * t + (e & 1) >= nk) {
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) s[mt][nt][e] = NEG_INF;
                    }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float mx0 = m[mt][0], mx1 = m[mt][1];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                mx0 = fmaxf(mx0, fmaxf(s[mt][nt][0], s[mt][nt][1]));
                mx1 = fmaxf(mx1, fmaxf(s[mt][nt][2], s[mt][nt][3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float base0 = mx0 == NEG_INF ? 0.0f : mx0 * sl2;
            const float base1 = mx1 == NEG_INF ? 0.0f : mx1 * sl2;
            // Once the running max settles it rarely grows: skip the rescale of
            // the sums and output accumulators (HD/2 multiplies per thread) when
            // no row of the warp's m-tile changed its max (the factors are 1 in
            // exact arithmetic). Not in the bias variant (cross-attention: few
            // key tiles, and the vote costs hd-128 m-tiles a register spill).
            if (BIAS || !__all_sync(0xffffffffu, mx0 == m[mt][0] && mx1 == m[mt][1])) {
                const float c0 = ex2_approx(fmaf(m[mt][0], sl2, -base0));
                const float c1 = ex2_approx(fmaf(m[mt][1], sl2, -base1));
                l[mt][0] *= c0;
                l[mt][1] *= c1;
#pragma unroll
                for (int i = 0; i < DTILES; ++i) {
                    oacc[mt][i][0] *= c0;
                    oacc[mt][i][1] *= c0;
                    oacc[mt][i][2] *= c1;
                    oacc[mt][i][3] *= c1;
                }
            }
            m[mt][0] = mx0;
            m[mt][1] = mx1;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if (POLY && (nt & 1)) {
                    s[mt][nt][0] = ex2_poly(fmaf(s[mt][nt][0], sl2, -base0));
                    s[mt][nt][1] = ex2_poly(fmaf(s[mt][nt][1], sl2, -base0));
                    s[mt][nt][2] = ex2_poly(fmaf(s[mt][nt][2], sl2, -base1));
                    s[mt][nt][3] = ex2_poly(fmaf(s[mt][nt][3], sl2, -base1));
                } else {
                    s[mt][nt][0] = ex2_approx(fmaf(s[mt][nt][0], sl2, -base0));
                    s[mt][nt][1] = ex2_approx(fmaf(s[mt][nt][1], sl2, -base0));
                    s[mt][nt][2] = ex2_approx(fmaf(s[mt][nt][2], sl2, -base1));
                    s[mt][nt][3] = ex2_approx(fmaf(s[mt][nt][3], sl2, -base1));
                }
                l[mt][0] += s[mt][nt][0] + s[mt][nt][1];
                l[mt][1] += s[mt][nt][2] + s[mt][nt][3];
            }
        }
#pragma unroll
        for (int kc = 0; kc < BN / 16; ++kc) {
            unsigned int pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                pa[mt][0] = pack_bf16x2(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                pa[mt][1] = pack_bf16x2(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                pa[mt][2] = pack_bf16x2(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                pa[mt][3] = pack_bf16x2(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
            }
#pragma unroll
            for (int dt = 0; dt < DTILES; dt += 2) {
                const int mi = lane >> 3;
                const bf16* p = vst + (kc * 16 + (mi & 1) * 8 + (lane & 7)) * SROW + dt * 8 + (mi >> 1) * 8;
                unsigned int b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, smem_u32(p));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816(oacc[mt][dt], pa[mt], b0, b1);
                    mma16816(oacc[mt][dt + 1], pa[mt], b2, b3);
                }
            }
        }
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        float l0 = l[mt][0], l1 = l[mt][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
        const int r0 = row0 + wrow + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
        for (int dt = 0; dt < DTILES; ++dt) {
            const int c = h * HD + dt * 8 + 2 * t;
            if (r0 < nq)
                *(unsigned int*)(o + (long long)r0 * ldo + c) =
                    pack_bf16x2(oacc[mt][dt][0] * inv0, oacc[mt][dt][1] * inv0);
            if (r1 < nq)
                *(unsigned int*)(o + (long long)r1 * ldo + c) =
                    pack_bf16x2(oacc[mt][dt][2] * inv1, oacc[mt][dt][3] * inv1);
        }
    }
}

// Entry points flash_mt<MT>_hd<HD>_w<W>_x<POLY>[_bias]: W warps of MT m-tiles, BN
// keys per K/V tile, Q fragments in registers when QREG, half the probabilities'
// 2^x on the FMA pipe when POLY is 1. Launch with 32*W threads, 16*MT*W query
// rows per block and (16*MT*W + 4*BN) * (HD+8) * 2 bytes of dynamic shared
// memory (kernels.rs `MtLayout::smem_bytes`).
#define FLASH_MT(HD, W, MT, BN, QREG, POLY)                                                             \
    extern "C" __global__ void __launch_bounds__(32 * W) flash_mt##MT##_hd##HD##_w##W##_x##POLY(REF_ARGS) { \
        flash_mt_fwd<HD, W, MT, BN, QREG, POLY, false>(q, k, v, o, nq, nk, ldq, ldk, ldv, ldo, kbias, scale); \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * W)                                                \
        flash_mt##MT##_hd##HD##_w##W##_x##POLY##_bias(REF_ARGS) {                                       \
        flash_mt_fwd<HD, W, MT, BN, QREG, POLY, true>(q, k, v, o, nq, nk, ldq, ldk, ldv, ldo, kbias, scale); \
    }
FLASH_MT(64, 4, 2, 64, true, 0)
FLASH_MT(128, 4, 2, 32, false, 0)
FLASH_MT(64, 8, 1, 64, true, 0)
FLASH_MT(128, 8, 1, 64, true, 0)
FLASH_MT(64, 8, 2, 64, true, 0)
FLASH_MT(128, 8, 2, 32, false, 0)
FLASH_MT(64, 4, 2, 64, true, 1)
FLASH_MT(128, 4, 2, 32, false, 1)
