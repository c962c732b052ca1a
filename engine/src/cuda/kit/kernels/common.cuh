// Shared helpers for every engine kernel module. No CUDA headers are included:
// bf16 values travel as `unsigned short` bit patterns and are converted with
// PTX instructions, so NVRTC needs no include path (the same source compiles on
// any machine that has libnvrtc).
#pragma once

typedef unsigned short bf16;

// bf16 bits -> f32 (exact: bf16 is the upper half of an f32).
__device__ __forceinline__ float bf2f(bf16 h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// f32 -> bf16 bits, round to nearest even (PTX cvt.rn, sm_80+).
__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Two f32 -> packed bf16x2: `lo` in the lower 16 bits (the lower element index).
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The larger of m and the two |x| of a packed bf16x2 word (NaN ignored: fmaxf).
// Every amax of bf16 values in the kernels goes through here, so two kernels
// taking the amax of the same values agree bit for bit in any order.
__device__ __forceinline__ float amax_bf16x2(unsigned int w, float m) {
    m = fmaxf(m, fabsf(__uint_as_float(w << 16)));
    return fmaxf(m, fabsf(__uint_as_float(w & 0xffff0000u)));
}

// Sum over a warp (all 32 lanes active).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over a block of up to 1024 threads; `scratch` holds 32 floats. Every
// thread returns the total. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = (lane < nwarps) ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

// Largest of the non-negative v over a block of up to 1024 threads; `scratch`
// holds 32 floats.
// NaN is ignored (fmaxf), as the host's f32::max ignores it. Call from all
// threads: contains __syncthreads.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = lane < nwarps ? scratch[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, o));
    return r;
}

// Two f32 -> two e4m3 codes, round to nearest even, saturating to +-448 (PTX
// cvt.rn.satfinite.e4m3x2.f32, sm_89+): `lo` in the lower byte.
__device__ __forceinline__ unsigned int e4m3x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    __trap();  // the fp8 arm refuses a device before compute capability 8.9
    return 0;
#endif
}

// (inv, scale) of a row or tensor whose amax is m: 448 / m and m / 448, or (1, 1)
// when m is zero or not finite (crate::fp8::row_factors).
__device__ __forceinline__ float2 tensor_factors(float m) {
    if (m > 0.0f && m <= 3.4028234663852886e38f) return make_float2(448.0f / m, m / 448.0f);
    return make_float2(1.0f, 1.0f);
}
