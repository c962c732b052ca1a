# Recipes for people and CI. `just rung 0` and `just test` are the README's two commands.
set shell := ["bash", "-euo", "pipefail", "-c"]

# The dev profile is optimised (see Cargo.toml): one build serves runs and tests.
bin := "target/debug"

# List the recipes.
default:
    @just --list

# Render rung N (rungs/N.toml) under `harness run`, seal its bundle, print its phase table.
# On a GPU machine the CUDA and cuDNN libraries are found by scripts/gpu-libs.sh.
rung N *ARGS:
    cargo build --bins
    LD_LIBRARY_PATH="$(scripts/gpu-libs.sh)" {{bin}}/harness run --rung rungs/{{N}}.toml {{ARGS}}

# Headless Chromium for the report's page test comes from scripts/chromium.sh; where it
# cannot install it, HARNESS_NO_CHROMIUM=1 makes that test say NOT RUN instead of failing.
# Run every test in the workspace (sets up target/pyenv and Chromium for the tests).
# target/pyenv also holds NVRTC 13.0 (a pip wheel): with it on LD_LIBRARY_PATH the
# engine compiles every CUDA module for sm_90 here, GPU or not (ENGINE_REQUIRE_NVRTC).
# The S3 store's tests start s3s-fs (scripts/s3-server.sh installs it from crates.io);
# where it cannot be installed, HARNESS_NO_S3_SERVER=1 makes those tests say NOT RUN.
# The fleet tests (slurm::) submit to a two-node Slurm on loopback that
# scripts/slurm-cluster.sh installs (Debian's slurm-wlm and munge), starts before the
# tests and stops after them; where it cannot, HARNESS_NO_SLURM=1 makes them say NOT RUN.
test:
    ./scripts/pyenv.sh
    ./scripts/s3-server.sh install || echo "just test: s3s-fs not installed: the S3 tests will say NOT RUN" >&2
    ./scripts/slurm-cluster.sh install || echo "just test: Slurm not installed: the Slurm tests will say NOT RUN" >&2
    ./scripts/chromium.sh || export HARNESS_NO_CHROMIUM=1; [ -x target/tools/s3s-fs/bin/s3s-fs ] || export HARNESS_NO_S3_SERVER=1; if slurm_env=$(./scripts/slurm-cluster.sh start); then eval "$slurm_env"; trap './scripts/slurm-cluster.sh stop' EXIT; else export HARNESS_NO_SLURM=1; fi; nvrtc=$(./scripts/nvrtc-lib.sh); export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ENGINE_REQUIRE_NVRTC=1; HARNESS_TEST_PYTHON="$PWD/target/pyenv/bin/python" cargo test --workspace

# Regenerate the lever table and its forest plot from the committed evidence.
rank *ARGS:
    cargo build --bins
    {{bin}}/harness rank --store reports/evidence --out reports/levers.md {{ARGS}}

# The page holds the ranking, its forest plot, the fit, every bundle, each pair's
# timelines and diff; DIR must be new, empty or an earlier report.
# Write the reviewers' page of a store (default: the committed evidence) into DIR.
report DIR="target/report" STORE="reports/evidence":
    cargo build --bins
    {{bin}}/harness report --store {{STORE}} --out {{DIR}}

# Benchmarks (release profile): sealing, sampler cost, ranking.
bench:
    cargo bench --workspace

# Observer overhead (on/off interleaved, 100 ms and 10 ms) with the dev profile, so
# no release rebuild: `just bench-observer --pairs 20`. `just bench` runs it too.
bench-observer *ARGS:
    cargo test --workspace --bench observer -- {{ARGS}}

# The fault suite at length: 40 engine kills, 40 harness kills, the full disk (the
# `faults` module of harness's `it` test binary).
faults-long RUNS="40" SEED="9":
    FAULTS_RUNS={{RUNS}} FAULTS_SEED={{SEED}} cargo test -p harness --test it -- faults:: --nocapture --test-threads 1

# The fuzzers at length (CI runs 2048 cases per property, 1024 for safetensors):
# evidence's parsers (the `fuzz` module of its `it` test binary), then the engine's.
fuzz CASES="20000":
    PROPTEST_CASES={{CASES}} cargo test -p evidence --test it fuzz:: -- --nocapture
    PROPTEST_CASES={{CASES}} cargo test -p engine --test it fuzz_safetensors:: -- --nocapture

# CUDA arm on a GPU machine, every figure side by side in one run: every kernel, the
# device T5, VAE and DiT forward against the f32 host reference and the graph-replayed
# loop against the eager one, then the staging / forward / denoise graph on-off / T5 /
# VAE benchmarks; the fidelity checks against the reference (specs/fidelity.md:
# scripts/t5_check.py, the text encoder at full scale against transformers, and
# scripts/render_oracle.py, whole renders against diffusers' LTXPipeline); rung 2 rendered under `harness run` (default profile, weights warm in the
# page cache as the reference's are); the PyTorch +
# diffusers reference (scripts/reference_ltx.py: VAE decode and the LTXPipeline at rung
# 2's geometry, steps and guidance); a table of both with the ratios last. Weights and
# the store go under $WORK (default ~/ltx-bench).
bench-gpu:
    cargo build --bins
    scripts/bench-gpu.sh {{bin}} selftest synth:ltxv-2b t5check:ltxv-2b oracle:ltxv-2b run:2:default::warm exec:2 ref:2 table

# The whole device re-derivation on a GPU machine (a few hours on an H200: fifteen levers, two rungs): every lever
# that applies at rungs 2 and 3, 3 interleaved rounds each, weights warm in the page cache
# (one campaign per rung: they use different weights), sealed into $WORK/store (default
# ~/ltx-bench) and packed under $WORK/out. Then copy the new bundles into
# reports/evidence/bundles, `harness verify` them, and `just rank`.
# attention-precision runs at rung 3 only: the engine refuses its fp8 arm at the 2B
# model's head dim 64 (cuDNN's FP8 attention was wrong there; its committed rung-2
# pairs ran before the refusal).
#
# Re-derive the device lever ranking (rungs 2 and 3) on a GPU machine.
rederive:
    cargo build --bins
    scripts/bench-gpu.sh {{bin}} synth:ltxv-2b synth:ltxv-13b campaign:2:conditioning,vae,vae-prepare,staging,release-pages,host-threads,denoise-graph,attention,cross-attention,qk-norm,precision,fp8-accum,text-kv,guidance-batch,residual,gemm-algo,observer:3:warm campaign:3:conditioning,vae,vae-prepare,staging,release-pages,host-threads,denoise-graph,attention,cross-attention,qk-norm,precision,fp8-accum,attention-precision,text-kv,guidance-batch,residual,gemm-algo,observer:3:warm

# The denoise-graph lever alone on a GPU machine: graph vs eager loops (bit-exact,
# with the mutant) and the loop benchmark, off vs on, at rung 2's and rung 1's grids.
bench-graph:
    cargo build --release -p engine
    LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-} target/release/engine selftest-cuda --only graph --bench --scratch target/selftest-cuda

# The CUDA arm's render tests (engine/tests/it/cuda_render.rs; ignored by a plain `cargo test`):
# rung 0 on the device against the CPU arm, rung 1 end to end. Fail where no GPU is.
test-gpu:
    LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-} cargo test -p engine --test it cuda_render:: -- --ignored --nocapture --test-threads 1

# The GPU-utilization control: a known bf16 GEMM load for S seconds.
burn S="10":
    cargo build --release -p engine
    LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-} target/release/engine burn --seconds {{S}}
