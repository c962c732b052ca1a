#!/usr/bin/env bash
# Print the directory of the NVRTC 13 that scripts/pyenv.sh installs into
# target/pyenv (the pip wheel nvidia-cuda-nvrtc), for LD_LIBRARY_PATH. Exits 1,
# printing nothing, when it is not there.
set -euo pipefail
cd "$(dirname "$0")/.."
for d in target/pyenv/lib/python3*/site-packages/nvidia/cu13/lib; do
  if [ -e "$d/libnvrtc.so.13" ]; then
    echo "$PWD/$d"
    exit 0
  fi
done
exit 1
