#!/bin/bash
# After a device call: FILES_AT is the folder the tool copied the call's $OUT into
# (steps.txt, logs, logs.tgz, bundles.tar.partNN). Restores the full checkout
# (scripts/device-tree.sh full), unpacks the bundles into reports/evidence/bundles
# (never over an existing bundle: one already there is named and left as it is),
# verifies every new bundle with `harness verify` (exit 1 on any fault, the bundle
# and its verify report kept under reports/device-runs/NAME/rejected/, never in
# the store and never under target/, which `cargo clean` empties), keeps the logs
# under reports/device-runs/NAME (refused when that exists) and regenerates
# reports/levers.md from the store.
#   scripts/device-bring.sh FILES_AT NAME
set -euo pipefail
src=$(cd "${1:?usage: device-bring.sh FILES_AT NAME}" && pwd)
name=${2:?usage: device-bring.sh FILES_AT NAME}
cd "$(dirname "$0")/.."
logs=reports/device-runs/$name
if [ -e "$logs" ]; then
  echo "device-bring: $logs exists: name this call's logs otherwise" >&2
  exit 2
fi
scripts/device-tree.sh full
H=target/debug/harness
[ -x "$H" ] || cargo build --bins
# Unpacked on this disk next to the build, never under /tmp.
work=target/device-bring/$name
mkdir -p "$work"
if compgen -G "$src/bundles.tar.part*" > /dev/null; then
  cat "$src"/bundles.tar.part* | tar -x -C "$work"
fi
store=reports/evidence/bundles
new=() bad=0
for b in "$work"/bundles/*; do
  [ -d "$b" ] || continue
  id=$(basename "$b")
  if [ -e "$store/$id" ]; then
    echo "device-bring: $id is already in $store: left as it is"
    continue
  fi
  if "$H" verify "$b" > "$work/verify-$id.txt" 2>&1; then
    mv "$b" "$store/$id"
    new+=("$id")
  else
    mkdir -p "$logs/rejected"
    mv "$b" "$logs/rejected/$id"
    mv "$work/verify-$id.txt" "$logs/rejected/verify-$id.txt"
    echo "device-bring: $id FAILED verification (kept in $logs/rejected): $(tail -1 "$logs/rejected/verify-$id.txt")" >&2
    bad=1
  fi
done
mkdir -p "$logs"
for f in "$src"/*; do
  case "$(basename "$f")" in
    bundles.tar.part*) ;;
    logs.tgz) tar -xzf "$f" -C "$logs" ;;
    *) cp -r "$f" "$logs/" ;;
  esac
done
echo "device-bring: ${#new[@]} new bundle(s) in $store; logs in $logs"
[ -f "$src/left-behind.txt" ] && echo "device-bring: LEFT BEHIND on the machine: $(tr '\n' ' ' < "$src/left-behind.txt")"
"$H" rank --store reports/evidence --out reports/levers.md
exit "$bad"
