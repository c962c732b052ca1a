#!/bin/bash
# The device tool ships this checkout's tracked files and refuses a tree over 64 MiB;
# the committed evidence bundles (reports/evidence/bundles, ~100 MB of frame PNGs)
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
du -sh --exclude=.git . | sed 's/^/working tree: /'
