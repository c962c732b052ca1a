#!/bin/bash
# The S3-protocol server the tests start on the loopback interface: s3s-fs, a real
# S3 server (the s3s project's file-system backend: SigV4 auth, conditional
# If-None-Match/If-Match writes, multipart, ListObjectsV2, ranges), from crates.io,
# built into target/tools (no Docker, no download outside the registries).
#
#   scripts/s3-server.sh install   build it unless already there (once; later calls return)
#   scripts/s3-server.sh path      print the binary's path (exit 1 when not installed)
#   scripts/s3-server.sh start DIR PORT KEY SECRET
#                                  serve DIR (one subdirectory per bucket) on
#                                  127.0.0.1:PORT in the foreground
#
# 0.14.1 is pinned: later releases need a newer rustc than this toolchain's 1.95.
# Known limit of this server (scripts/s3-create-race.sh measures it: 8 concurrent
# creates of one new key, 1 to 8 of them succeed): its If-None-Match check and the
# write are not one atomic step, so a test of racing creators of the same key cannot
# rely on it; the harness's keys are content-addressed, so racing publishers of one
# bundle write identical bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=target/tools/s3s-fs
bin=$root/bin/s3s-fs
version=0.14.1
case "${1:-}" in
  install)
    if [ -x "$bin" ] && [ "$(cat "$root/VERSION" 2>/dev/null)" = "$version" ]; then
      exit 0
    fi
    cargo install --quiet --locked --root "$root" s3s-fs --version "$version" --features binary
    echo "$version" > "$root/VERSION"
    ;;
  path)
    [ -x "$bin" ] || { echo "s3s-fs is not installed: run scripts/s3-server.sh install" >&2; exit 1; }
    echo "$PWD/$bin"
    ;;
  start)
    dir=${2:?DIR} port=${3:?PORT} key=${4:?KEY} secret=${5:?SECRET}
    exec "$bin" --host 127.0.0.1 --port "$port" --access-key "$key" --secret-key "$secret" "$dir"
    ;;
  *) echo "usage: scripts/s3-server.sh install|path|start DIR PORT KEY SECRET" >&2; exit 2 ;;
esac
