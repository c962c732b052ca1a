#!/bin/bash
# What `harness rank --store s3://...` costs, counted by the server: the committed
# bundles synced to a fresh s3s-fs on loopback (scripts/s3-server.sh), then two ranks
# (cold caches, then warm); each rank's requests by kind and the bytes of any ranged
# reads. Since rank fetches every bundle into the verified local store (as report does),
# the first rank downloads every object and a second one lists the bucket and reuses the
# local copies, which it hashes again. Needs `cargo build --bins` and `scripts/s3-server.sh install`.
#   scripts/s3-rank-cost.sh [STORE_DIR]   (default reports/evidence)
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-reports/evidence}
work=target/s3-rank-cost
rm -rf "$work" && mkdir -p "$work/data/evidence"
bin=$(scripts/s3-server.sh path)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUST_LOG=s3s=debug "$bin" --host 127.0.0.1 --port "$port" --access-key cost --secret-key cost-secret \
  "$work/data" > "$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
export AWS_ACCESS_KEY_ID=cost AWS_SECRET_ACCESS_KEY=cost-secret AWS_ENDPOINT_URL=http://127.0.0.1:$port \
  AWS_REGION=us-east-1 AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent \
  HARNESS_LOCAL_STORE=$PWD/$work/local HARNESS_VERIFY_CACHE=$PWD/$work/cache
H=target/debug/harness
"$H" sync "$src" s3://evidence/cost | tail -1
count() {
  grep 's3s::service: req: Request' "$work/server.log" | tail -n "+$1" | python3 -c '
import sys, re, collections
c = collections.Counter(); ranged = 0
for l in sys.stdin:
    m = re.search(r"method: (\w+), uri: ([^,]+),", l)
    uri = m.group(2)
    r = re.search(r"\"range\": \"bytes=(\d+)-(\d+)\"", l)
    if r: ranged += int(r.group(2)) - int(r.group(1)) + 1
    kind = "LIST" if "list-type" in uri else m.group(1) + (" range" if r else "") + " ." + uri.rsplit(".", 1)[-1]
    c[kind] += 1
print("  " + ", ".join(f"{v} {k}" for k, v in sorted(c.items())) + f"; {sum(c.values())} requests, ranged reads {ranged} bytes")'
}
for pass in cold warm; do
  n=$(grep -c 's3s::service: req: Request' "$work/server.log" || true)
  echo "rank ($pass caches):"
  "$H" rank --store s3://evidence/cost --check reports/levers.md 2>&1 | sed 's/^/  /'
  count $((n + 1))
done
