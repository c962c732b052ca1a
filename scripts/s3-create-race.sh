#!/bin/bash
# Whether the test server's conditional create is atomic: N concurrent PUTs of one
# new key with `If-None-Match: *` (curl's SigV4 signing), repeated T times; prints
# how many of the N succeeded (HTTP 200) in each trial. An atomic server says 1
# every time. The harness does not rely on it (bundle keys are content-addressed:
# racing publishers of one bundle write the same bytes); this measures the limit
# that scripts/s3-server.sh states.
#   scripts/s3-create-race.sh [N] [T]        (default 8 and 20)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-8} trials=${2:-20}
work=target/s3-create-race
rm -rf "$work" && mkdir -p "$work/data/race"
bin=$(scripts/s3-server.sh path)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" --host 127.0.0.1 --port "$port" --access-key race --secret-key race-secret "$work/data" \
  > "$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
echo payload > "$work/body"
sha=$(sha256sum "$work/body" | cut -d' ' -f1)
counts=()
for t in $(seq "$trials"); do
  for i in $(seq "$n"); do
    curl -s -o /dev/null -w '%{http_code}\n' --aws-sigv4 "aws:amz:us-east-1:s3" --user race:race-secret \
      -H 'If-None-Match: *' -H "x-amz-content-sha256: $sha" -X PUT --data-binary @"$work/body" \
      "http://127.0.0.1:$port/race/key-$t" > "$work/code-$t-$i" &
  done
  wait $(jobs -p | grep -v "^$server$") 2>/dev/null || true
  counts+=("$(cat "$work"/code-"$t"-* | grep -c '^200$' || true)")
done
echo "creators of one new key that got 200, of $n, in $trials trials: ${counts[*]}"
