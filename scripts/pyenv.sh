#!/usr/bin/env bash
# Create target/pyenv with the third-party readers the cross-read tests use
# (pyarrow; readers nobody on this project wrote). Idempotent: does nothing when the
# pinned versions are already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=target/pyenv
want=(pyarrow==26.0.1)
stamp="$env_dir/.installed-$(printf '%s\n' "${want[@]}" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi
python3 -m venv "$env_dir"
"$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "${want[@]}"
touch "$stamp"
