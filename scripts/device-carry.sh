#!/bin/bash
# Before a device call (scripts/device-bench-gpu.sh runs on the machine from what
# this carries): build the binaries here, strip them, compress them with zstd into
# CARRY (default .devcarry/bench, git-excluded) beside a zstd for the machine, print
# the stripped binaries' sha256 for reports/device-notes.md, and make the checkout
# slim (scripts/device-tree.sh slim) so the tool takes it. Refuses when bundles not
# yet committed sit under reports/evidence/bundles: the slim tree would ship them
# (untracked files stay) and they belong in a commit first.
#   scripts/device-carry.sh [CARRY]
# With WHEELS=1 it also downloads the reference's diffusers wheel (the version the
# device notes' reference figures used) into .whl (git-excluded), which a call with a
# `ref:` step carries beside CARRY (the machine has torch and transformers, not
# diffusers, and no network).
# After the call: scripts/device-bring.sh FILES_AT NAME.
set -euo pipefail
cd "$(dirname "$0")/.."
carry=${1:-.devcarry/bench}
grep -qx '.devcarry/' .git/info/exclude 2>/dev/null || echo '.devcarry/' >> .git/info/exclude
loose=$(git ls-files --others --exclude-standard reports/evidence/bundles | head -5)
if [ -n "$loose" ]; then
  echo "device-carry: uncommitted bundles under reports/evidence/bundles (commit them first):" >&2
  echo "$loose" >&2
  exit 2
fi
cargo build --bins
mkdir -p "$carry"
for b in engine harness; do
  strip -o "$carry/$b" "target/debug/$b"
  echo "$b (stripped) sha256 $(sha256sum "$carry/$b" | cut -d' ' -f1)"
  zstd -q -12 -f "$carry/$b" -o "$carry/$b.zst"
  rm -f "$carry/$b"
done
cp "$(command -v zstd)" "$carry/zstd"
if [ "${WHEELS:-0}" = 1 ]; then
  grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d .whl diffusers==0.42.1
  ls .whl | sed 's/^/wheel: /'
fi
scripts/device-tree.sh slim
du -sh "$carry" | sed 's/^/carry: /'
