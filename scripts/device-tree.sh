#!/bin/bash
# The device tool ships this checkout's tracked files and refuses a tree over 64 MiB;
# the committed evidence bundles (reports/evidence/bundles, 1.1 GB on 2026-12-07)
# exceed it. Before a device call: `scripts/device-tree.sh slim` (a sparse checkout
# without the bundles: they stay committed, only absent from the working tree);
# after it: `scripts/device-tree.sh full` (`just rank` and `just test` need them).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  slim) git sparse-checkout set --no-cone '/*' '!/reports/evidence/bundles/' ;;
  full) git sparse-checkout disable ;;
  *) echo "usage: scripts/device-tree.sh slim|full" >&2; exit 2 ;;
esac
# What the device tool ships: tracked files present and untracked ones git does not
# ignore (the build and the carry are ignored; the tool takes at most 64 MiB).
git ls-files -z --cached --others --exclude-standard \
  | du -cb --files0-from=- 2>/dev/null | tail -1 \
  | awk '{printf "working tree the device tool ships: %.1f MiB\n", $1 / 1048576}'
