#!/usr/bin/env bash
# Make sure headless Chromium is here for the report's browser test
# (harness/tests/it/report.rs opens `harness report`'s page in it). Idempotent:
# does nothing when /usr/bin/chromium exists. Where it is missing and we are root
# with apt-get, installs Debian's `chromium` package (apt-get update first when
# the package lists do not know it). Exits 0 when the browser is there, 1 when it
# is not, saying why loudly; `just test` then sets HARNESS_NO_CHROMIUM=1 and the
# test reports itself NOT RUN (without it, the test fails for want of a browser).
set -uo pipefail
cd "$(dirname "$0")/.."
browser=/usr/bin/chromium
[ -x "$browser" ] && exit 0
log=target/chromium-install.log
mkdir -p target
loud() {
  {
    echo
    echo "*** scripts/chromium.sh: no $browser: $* ***"
    echo "*** the report's browser test (report::) will report NOT RUN ***"
    echo
  } >&2
}
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  loud "not root with apt-get here; install Debian's chromium package to run it"
  exit 1
fi
echo "scripts/chromium.sh: installing Debian's chromium (log: $log)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q chromium >"$log" 2>&1; then
  apt-get update -q >>"$log" 2>&1
  apt-get install -y -q chromium >>"$log" 2>&1
fi
if [ -x "$browser" ]; then exit 0; fi
loud "apt-get install chromium failed (offline?): see $log"
tail -n 5 "$log" >&2
exit 1
