# Recipes for people and CI. `just rung 0` and `just test` are the README's two commands.
set shell := ["bash", "-euo", "pipefail", "-c"]

# The dev profile is optimised (see Cargo.toml): one build serves runs and tests.
bin := "target/debug"

# List the recipes.
default:
    @just --list

# Render rung N (rungs/N.toml) under `harness run`, seal its bundle, print its phase table.
rung N *ARGS:
    cargo build --bins
    {{bin}}/harness run --rung rungs/{{N}}.toml {{ARGS}}

# Run every test in the workspace (sets up target/pyenv for the cross-read tests).
test:
    ./scripts/pyenv.sh
    HARNESS_TEST_PYTHON="$PWD/target/pyenv/bin/python" cargo test --workspace

# Regenerate the lever table from the committed evidence.
rank *ARGS:
    cargo build --bins
    {{bin}}/harness rank --store reports/evidence --out reports/levers.md {{ARGS}}

# Benchmarks (release profile): sealing, sampler cost, ranking.
bench:
    cargo bench --workspace
