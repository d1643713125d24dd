#!/usr/bin/env bash
# CI step: make sure the control-plane binaries for the cluster tests exist, and print their
# directory as the LAST line of stdout. Everything else goes to stderr. Idempotent: with a warm
# cache (same tests/cluster/tools/*/go.{mod,sum} and build script) it returns at once.
#
#   BIN=$(bash .ci/cluster.sh | tail -n1) && export EVALKUBE_CTRLPLANE_BIN=$BIN
#
# Needs: Go (preinstalled at /usr/local/go; the module proxy reachable), openssl (for the
# harness's certificates, installed from Debian if absent), flock, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

source .ci/go-env.sh "cluster.sh (building the control plane)"
missing=()
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v flock >/dev/null 2>&1 || missing+=(util-linux)
if ((${#missing[@]})); then
  echo "cluster.sh: installing ${missing[*]} from Debian" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >&2
fi

echo "cluster.sh: $(go version); cache key $(bash tests/cluster/build-tools.sh --key)" >&2
start=$SECONDS
BIN=$(bash tests/cluster/build-tools.sh)
echo "cluster.sh: control-plane binaries ready in $((SECONDS - start))s: $BIN" >&2
cat "$BIN/VERSIONS" >&2
echo "$BIN"
