#!/bin/bash
# Print LD_LIBRARY_PATH with the GPU libraries the CUDA arm loads at run time put
# first, where this machine has them: the CUDA 13 toolkit's lib directory
# (cuBLASLt, NVRTC) and cuDNN 9 from the Python environment's `nvidia.cudnn` (the
# `attention` lever's default cudnn arm and the VAE's cuDNN path). On a machine
# without them (CI, the CPU arm) it prints LD_LIBRARY_PATH unchanged. Used by the
# Justfile's `rung`, so `just rung 2` runs on the H200 as it is.
dirs=()
cuda=/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d "$cuda" ] && dirs+=("$cuda")
cudnn=$(python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null)
[ -n "$cudnn" ] && [ -d "$cudnn/lib" ] && dirs+=("$cudnn/lib")
[ -n "${LD_LIBRARY_PATH:-}" ] && dirs+=("$LD_LIBRARY_PATH")
(IFS=:; echo "${dirs[*]}")
