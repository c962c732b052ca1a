// Kernels of the video VAE decoder. Activations are channels-last: a frame is
// [H, W, C] with C contiguous (C a multiple of 8, so 8 channels are one
// 16-byte vector); bf16 storage, f32 arithmetic.
//
//  * conv3d_* : the 3x3x3 convolution as an implicit GEMM on tensor cores.
//    Output voxel m = (t, y, x) of frame t reads input frames t, t+1, t+2 of
//    the window (time is padded by the caller), rows y-1..y+1 and columns
//    x-1..x+1 (zero outside). GEMM view: M = voxels, N = Co, K = 27 Ci with
//    k = tap * Ci + ci, tap = (dt * 3 + dy) * 3 + dx; the weight is stored
//    [Co][27][Ci] (K contiguous per output channel). A CTA computes a BM x BN
//    tile with bf16 mma.sync m16n8k16 and f32 accumulators; A (gathered from
//    the input, zero-filled at the borders) and B tiles of BK = 32 are
//    streamed through STAGES shared-memory buffers with cp.async. No bias:
//    the consumers add it.
//  * vae_norm: per-voxel RMS norm (+ modulation) + SiLU, or LayerNorm with
//    affine, one warp per voxel.
//  * vae_bias_add, vae_d2s, vae_pixels, vae_permute: bias (+ skip), the
//    upsampler's depth-to-space (+ residual), the final unpatchify to f32
//    pixels, the weight reordering at load.
//  * vae_rgb8: f32 pixels to the RGB8 frames the render writes, bit-exact
//    with the host's frames::to_u8.
#include "common.cuh"

__device__ __forceinline__ unsigned int vae_smem_u32(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16-byte global -> shared copy; with ok == false the destination is zero-filled.
__device__ __forceinline__ void vae_cp16(void* sdst, const void* gsrc, bool ok) {
    const unsigned int s = vae_smem_u32(sdst);
    const int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gsrc), "r"(n));
}
__device__ __forceinline__ void vae_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void vae_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void vae_mma(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void vae_ldsm4(unsigned int* r, unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

constexpr int CONV_BK = 32;
// Shared rows padded by 8 elements (80 bytes): the 8 rows an ldmatrix reads
// fall in distinct banks.
constexpr int CONV_SROW = CONV_BK + 8;

template <int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void conv3d_igemm(const bf16* __restrict__ x, const bf16* __restrict__ wt,
                                             bf16* __restrict__ y, int H, int W, int Ci, int Co, int M) {
    constexpr int WARPS_N = BN / WN;
    constexpr int MT = WM / 16;
    constexpr int NT = WN / 8;
    constexpr int THREADS = (BM / WM) * (BN / WN) * 32;
    constexpr int ROWS_PER_PASS = THREADS / 4;  // 4 chunks of 8 per BK row
    constexpr int A_PER = BM / ROWS_PER_PASS;
    constexpr int B_PER = BN / ROWS_PER_PASS;
    static_assert(BM % ROWS_PER_PASS == 0 && BN % ROWS_PER_PASS == 0, "tile / thread mismatch");
    extern __shared__ __align__(16) unsigned char conv_smem[];
    bf16* As = (bf16*)conv_smem;
    bf16* Bs = As + STAGES * BM * CONV_SROW;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const long long m0 = (long long)blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;
    const int K = 27 * Ci;
    const int KT = (K + CONV_BK - 1) / CONV_BK;
    const int HW = H * W;
    const int kc = tid & 3;  // this thread's 8-wide chunk within a BK row

    long long a_base[A_PER];
    int a_y[A_PER], a_x[A_PER];
    bool a_ok[A_PER];
#pragma unroll
    for (int i = 0; i < A_PER; ++i) {
        const long long m = m0 + (tid >> 2) + i * ROWS_PER_PASS;
        a_ok[i] = m < M;
        const long long mm = a_ok[i] ? m : 0;
        const long long t = mm / HW;
        const int r = (int)(mm - t * HW);
        a_y[i] = r / W;
        a_x[i] = r - a_y[i] * W;
        // Output voxel (t, y, x) and input voxel (t, y, x) (tap dt = dy = dx = 0
        // relative) share the flat index m.
        a_base[i] = mm * Ci;
    }
    // Tap and channel of this thread's chunk in the next k block to load.
    int tap = 0, ci = kc * 8;
    while (ci >= Ci) {
        ci -= Ci;
        ++tap;
    }

    auto load = [&](int stage) {
        bf16* as = As + stage * BM * CONV_SROW;
        bf16* bs = Bs + stage * BN * CONV_SROW;
        const bool kok = tap < 27;
        const int dt = tap / 9, dy = (tap / 3) % 3 - 1, dx = tap % 3 - 1;
        const long long koff = ((long long)(dt * H + dy) * W + dx) * Ci + ci;
#pragma unroll
        for (int i = 0; i < A_PER; ++i) {
            const int iy = a_y[i] + dy, ix = a_x[i] + dx;
            const bool ok = kok && a_ok[i] && iy >= 0 && iy < H && ix >= 0 && ix < W;
            const bf16* src = ok ? x + a_base[i] + koff : x;
            vae_cp16(as + ((tid >> 2) + i * ROWS_PER_PASS) * CONV_SROW + kc * 8, src, ok);
        }
        const int k = tap * Ci + ci;
#pragma unroll
        for (int i = 0; i < B_PER; ++i) {
            const int n = n0 + (tid >> 2) + i * ROWS_PER_PASS;
            const bool ok = kok && n < Co;
            const bf16* src = ok ? wt + (long long)n * K + k : wt;
            vae_cp16(bs + ((tid >> 2) + i * ROWS_PER_PASS) * CONV_SROW + kc * 8, src, ok);
        }
        ci += CONV_BK;
        while (ci >= Ci) {
            ci -= Ci;
            ++tap;
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load(s);
        vae_commit();
    }
    for (int kb = 0; kb < KT; ++kb) {
        vae_wait<STAGES - 2>();
        __syncthreads();
        const int pf = kb + STAGES - 1;
        if (pf < KT) load(pf % STAGES);
        vae_commit();
        const int stage = kb % STAGES;
        const bf16* as = As + stage * BM * CONV_SROW;
        const bf16* bs = Bs + stage * BN * CONV_SROW;
        unsigned int b[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const bf16* p = bs + (wn * WN + nt * 8 + (lane & 7)) * CONV_SROW + (lane >> 3) * 8;
            vae_ldsm4(b[nt], vae_smem_u32(p));
        }
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            unsigned int a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const bf16* p = as + (wm * WM + mt * 16 + (lane & 15)) * CONV_SROW + ks * 16 + (lane >> 4) * 8;
                vae_ldsm4(a[mt], vae_smem_u32(p));
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) vae_mma(acc[mt][nt], a[mt], b[nt][2 * ks], b[nt][2 * ks + 1]);
        }
    }
    vae_wait<0>();

    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const long long r0 = m0 + wm * WM + mt * 16 + g;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int col = n0 + wn * WN + nt * 8 + 2 * tq;
            if (col >= Co) continue;
            if (r0 < M) *(unsigned int*)(y + r0 * Co + col) = pack_bf16x2(acc[mt][nt][0], acc[mt][nt][1]);
            if (r0 + 8 < M) *(unsigned int*)(y + (r0 + 8) * Co + col) = pack_bf16x2(acc[mt][nt][2], acc[mt][nt][3]);
        }
    }
}

#define CONV_ARGS                                                                                     \
    const bf16 *__restrict__ x, const bf16 *__restrict__ wt, bf16 *__restrict__ y, int H, int W, int Ci, \
        int Co, int M

// 128 x 128 tiles, 8 warps of 64 x 32, 4 stages (80 KiB of shared memory).
extern "C" __global__ void __launch_bounds__(256) conv3d_128x128(CONV_ARGS) {
    conv3d_igemm<128, 128, 64, 32, 4>(x, wt, y, H, W, Ci, Co, M);
}
// 256 x 128 tiles, 8 warps of 64 x 64 (twice the MMAs per fragment load), 3
// stages (90 KiB).
extern "C" __global__ void __launch_bounds__(256) conv3d_256x128(CONV_ARGS) {
    conv3d_igemm<256, 128, 64, 64, 3>(x, wt, y, H, W, Ci, Co, M);
}
// 128 x 64 tiles, 4 warps of 64 x 32, 4 stages (60 KiB): narrow outputs.
extern "C" __global__ void __launch_bounds__(128) conv3d_128x64(CONV_ARGS) {
    conv3d_igemm<128, 64, 64, 32, 4>(x, wt, y, H, W, Ci, Co, M);
}

__device__ __forceinline__ void ld8(const bf16* p, float* o) {
    const uint4 v = *(const uint4*)p;
    const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[2 * i] = bf2f((bf16)(u[i] & 0xffffu));
        o[2 * i + 1] = bf2f((bf16)(u[i] >> 16));
    }
}
__device__ __forceinline__ void st8(bf16* p, const float* v) {
    uint4 o;
    o.x = pack_bf16x2(v[0], v[1]);
    o.y = pack_bf16x2(v[2], v[3]);
    o.z = pack_bf16x2(v[4], v[5]);
    o.w = pack_bf16x2(v[6], v[7]);
    *(uint4*)p = o;
}

// One warp per voxel row of C channels (C a multiple of 8):
//   v = x (+ bias)
//   mode 0: y = silu(v * rsqrt(mean(v^2) + eps) * (1 + scale) + shift), with
//           shift = shift_tab + shift_emb, scale = scale_tab + scale_emb
//           (no modulation when shift_tab is null)
//   mode 1: y = (v - mean) * rsqrt(var + eps) * lnw + lnb (lnw, lnb in
//           shift_tab, scale_tab)
extern "C" __global__ void vae_norm(const bf16* __restrict__ x, const bf16* __restrict__ bias, long long rows, int C,
                                    float eps, int mode, const bf16* __restrict__ shift_tab,
                                    const bf16* __restrict__ shift_emb, const bf16* __restrict__ scale_tab,
                                    const bf16* __restrict__ scale_emb, bf16* __restrict__ y) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const bf16* xr = x + row * C;
    bf16* yr = y + row * C;
    const int n8 = C >> 3;
    float s1 = 0.0f;
    for (int i = lane; i < n8; i += 32) {
        float v[8];
        ld8(xr + 8 * i, v);
        if (bias) {
            float b[8];
            ld8(bias + 8 * i, b);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] += b[j];
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) s1 += mode == 0 ? v[j] * v[j] : v[j];
    }
    s1 = warp_sum(s1);
    float mean = 0.0f, r;
    if (mode == 0) {
        r = rsqrtf(s1 / (float)C + eps);
    } else {
        mean = s1 / (float)C;
        float s2 = 0.0f;
        for (int i = lane; i < n8; i += 32) {
            float v[8];
            ld8(xr + 8 * i, v);
            if (bias) {
                float b[8];
                ld8(bias + 8 * i, b);
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] += b[j];
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) s2 += (v[j] - mean) * (v[j] - mean);
        }
        r = rsqrtf(warp_sum(s2) / (float)C + eps);
    }
    for (int i = lane; i < n8; i += 32) {
        float v[8];
        ld8(xr + 8 * i, v);
        if (bias) {
            float b[8];
            ld8(bias + 8 * i, b);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] += b[j];
        }
        if (mode == 0) {
            float sh[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (shift_tab) {
                float e[8];
                ld8(shift_tab + 8 * i, sh);
                ld8(shift_emb + 8 * i, e);
#pragma unroll
                for (int j = 0; j < 8; ++j) sh[j] += e[j];
                ld8(scale_tab + 8 * i, sc);
                ld8(scale_emb + 8 * i, e);
#pragma unroll
                for (int j = 0; j < 8; ++j) sc[j] += e[j];
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                float h = v[j] * r;
                if (shift_tab) h = h * (1.0f + sc[j]) + sh[j];
                v[j] = h / (1.0f + expf(-h));
            }
        } else {
            float lw[8], lb[8];
            ld8(shift_tab + 8 * i, lw);
            ld8(scale_tab + 8 * i, lb);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = (v[j] - mean) * r * lw[j] + lb[j];
        }
        st8(yr + 8 * i, v);
    }
}

// In place: y += bias (+ skip), over n8 vectors of 8 channels (C a multiple of 8).
extern "C" __global__ void vae_bias_add(bf16* __restrict__ y, const bf16* __restrict__ bias,
                                        const bf16* __restrict__ skip, long long n8, int C) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
        float v[8], b[8];
        ld8(y + 8 * i, v);
        ld8(bias + (int)((8 * i) % C), b);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] += b[j];
        if (skip) {
            float s[8];
            ld8(skip + 8 * i, s);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] += s[j];
        }
        st8(y + 8 * i, v);
    }
}

// Depth-to-space of `frames` conv frames [h, w, cy] (+ bias) into [2h, 2w, co]
// frames, co = cy / 8: conv channel c*8 + a*4 + b*2 + d of frame j lands in
// channel c of output frame 2j + a - drop at (2y + b, 2x + d); with drop the
// a = 0 half of frame 0 is skipped. With res (frames [h, w, cr]) the input
// channel cc*8 + a*4 + b*2 + d, cc = c mod (cr / 8), is added. One thread per
// (frame, y, x, c), c fastest.
extern "C" __global__ void vae_d2s(const bf16* __restrict__ yin, const bf16* __restrict__ bias,
                                   const bf16* __restrict__ res, int frames, int h, int w, int cy, int cr, int drop,
                                   bf16* __restrict__ out) {
    const int co = cy >> 3;
    const long long total = (long long)frames * h * w * co;
    const int h2 = 2 * h, w2 = 2 * w;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % co);
        const long long v = i / co;
        const int xx = (int)(v % w);
        const int yy = (int)((v / w) % h);
        const int j = (int)(v / ((long long)w * h));
        float val[8], b[8];
        ld8(yin + v * cy + 8 * c, val);
        ld8(bias + 8 * c, b);
#pragma unroll
        for (int q = 0; q < 8; ++q) val[q] += b[q];
        if (res) {
            float rv[8];
            const int cc = c % (cr >> 3);
            ld8(res + v * cr + 8 * cc, rv);
#pragma unroll
            for (int q = 0; q < 8; ++q) val[q] += rv[q];
        }
#pragma unroll
        for (int a = 0; a < 2; ++a) {
            if (drop && j == 0 && a == 0) continue;
            const long long fo = 2 * j + a - drop;
#pragma unroll
            for (int bb = 0; bb < 2; ++bb)
#pragma unroll
                for (int d = 0; d < 2; ++d)
                    out[((fo * h2 + 2 * yy + bb) * w2 + 2 * xx + d) * co + c] = f2bf(val[a * 4 + bb * 2 + d]);
        }
    }
}

// Pixel patches [frames][h][w][oc p^2] (+ bias) to f32 pixels [frames][oc][h p][w p]:
// channel c p^2 + ws p + hs lands at (y p + hs, x p + ws) of colour c.
extern "C" __global__ void vae_pixels(const bf16* __restrict__ yin, const bf16* __restrict__ bias, int frames, int h,
                                      int w, int oc, int p, float* __restrict__ out) {
    const int hp = h * p, wp = w * p, cy = oc * p * p;
    const long long total = (long long)frames * oc * hp * wp;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int X = (int)(i % wp);
        const int Y = (int)((i / wp) % hp);
        const long long fc = i / ((long long)wp * hp);
        const int c = (int)(fc % oc);
        const long long f = fc / oc;
        const int yy = Y / p, hs = Y - yy * p, xx = X / p, ws = X - xx * p;
        const int q = c * p * p + ws * p + hs;
        out[i] = bf2f(yin[((f * h + yy) * w + xx) * cy + q]) + bf2f(bias[q]);
    }
}

// Defects of vae_rgb8 for its check (cuda/vae/rgb8.rs, Rgb8Mutation::code).
#define RGB8_MUT_RINT 1
#define RGB8_MUT_FMA 2
#define RGB8_MUT_SWAP_RB 3
#define RGB8_MUT_SKIP_LAST 4

// One pixel value to its 8-bit code, exactly as the host's frames::to_u8:
//   x = clamp((v + 1) * 0.5, 0, 1) * 255; NaN -> 0; round half away from zero.
// Why every f32 input gives the host's byte: Rust evaluates that expression
// as three IEEE-754 binary32 operations, each rounded once to nearest-even
// (Rust never contracts a * b + c into an FMA), and clamp / is_nan / round
// are exact. Here the same three operations run in the same order through
// the explicitly rounded __fadd_rn / __fmul_rn (which the compiler may not
// fuse, whatever --fmad says), the clamp is the same two comparisons in the
// same order (a NaN passes both, as in Rust's f32::clamp, and becomes 0
// below), and roundf is CUDA's exact round-half-away-from-zero (0 ulp). The
// modules are compiled without -ftz / fast-math, so subnormals behave as on
// the host; and even flushed, none would change a result: a subnormal v gives
// v + 1 = 1 either way, v + 1 is 0 or at least 2^-24 in magnitude (v near -1
// has an ulp of 2^-24), so no later operand or result is subnormal. The
// final conversion takes an integer in [0, 255] (or -0), so it is exact.
__device__ __forceinline__ unsigned char vae_to_u8(float v, int mutate) {
    float y;
    if (mutate == RGB8_MUT_FMA) {
        // One rounding instead of three: not the host's result near the ties.
        y = fminf(fmaxf(__fmaf_rn(v, 127.5f, 127.5f), 0.0f), 255.0f);
    } else {
        float x = __fmul_rn(__fadd_rn(v, 1.0f), 0.5f);
        if (x < 0.0f) x = 0.0f;
        if (x > 1.0f) x = 1.0f;
        y = __fmul_rn(x, 255.0f);
    }
    if (y != y) return 0;
    const float r = mutate == RGB8_MUT_RINT ? rintf(y) : roundf(y);
    return (unsigned char)(unsigned int)r;
}

// f32 pixels [frames][3][hh][ww] (what vae_pixels writes) to RGB8
// [frames][hh][ww][3] (each frame one frames::Frame's bytes). One thread per
// pixel; mutate (0 in the render) injects one of the RGB8_MUT_* defects.
extern "C" __global__ void vae_rgb8(const float* __restrict__ px, int frames, int hh, int ww, int mutate,
                                    unsigned char* __restrict__ rgb) {
    const long long plane = (long long)hh * ww;
    const long long total = (long long)frames * plane;
    const long long written = mutate == RGB8_MUT_SKIP_LAST ? total - plane : total;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < written; i += (long long)gridDim.x * blockDim.x) {
        const long long f = i / plane;
        const float* s = px + 2 * f * plane + i;  // (3 f) plane + (i - f plane)
        unsigned char* d = rgb + 3 * i;
        const unsigned char r = vae_to_u8(s[0], mutate), g = vae_to_u8(s[plane], mutate),
                            b = vae_to_u8(s[2 * plane], mutate);
        const bool swap = mutate == RGB8_MUT_SWAP_RB;
        d[0] = swap ? b : r;
        d[1] = g;
        d[2] = swap ? r : b;
    }
}

// A checkpoint convolution weight [co][ci][taps] reordered to [co][taps][ci].
extern "C" __global__ void vae_permute(const bf16* __restrict__ src, bf16* __restrict__ dst, int co, int ci, int taps) {
    const long long total = (long long)co * ci * taps;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % ci);
        const long long r = i / ci;
        const int tap = (int)(r % taps);
        const long long o = r / taps;
        dst[i] = src[(o * ci + c) * taps + tap];
    }
}
