#!/usr/bin/env python3
"""Registers, stack and spills of every kernel of one engine module, as ptxas
reports them through NVRTC (no GPU needed):

    python3 scripts/kernel-registers.py LIBNVRTC [MODULE] [ARCH]

LIBNVRTC: path to libnvrtc.so (e.g. the nvidia-cuda-nvrtc-cu12 wheel unpacked
into target/tools/nvrtc: target/tools/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.12);
MODULE: elementwise (default), attention, t5 or vae; ARCH: sm_90 (default).
The options are the engine's (engine/src/cuda/kit/nvrtc.rs) plus ptxas -v."""
import ctypes
import os
import sys

lib, module, arch = (sys.argv[1:] + ["", "elementwise", "sm_90"][len(sys.argv) - 1:])[:3]
if not lib:
    sys.exit(__doc__)
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine/src/cuda/kit/kernels")
common = open(os.path.join(root, "common.cuh")).read()
src = open(os.path.join(root, f"{module}.cu")).read().replace('#include "common.cuh"', common)
L = ctypes.CDLL(lib)
prog = ctypes.c_void_p()
if L.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{module}.cu".encode(), 0, None, None):
    sys.exit("nvrtcCreateProgram failed")
opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--fmad=true", b"--ptxas-options=-v"]
rc = L.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
n = ctypes.c_size_t()
L.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
buf = ctypes.create_string_buffer(n.value)
L.nvrtcGetProgramLog(prog, buf)
print(buf.value.decode())
sys.exit(1 if rc else 0)
