#!/usr/bin/env bash
# Run the whole test suite (called by `make test`). Builds/locates the loopback Kubernetes
# control plane first when the harness exists, so cluster tests never silently skip.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -f .ci/cluster.sh ]]; then
  EVALKUBE_CTRLPLANE_BIN=$(bash .ci/cluster.sh | tail -1)
  export EVALKUBE_CTRLPLANE_BIN
fi
# The real-node tier (tests/realnode): node binaries and images, built or found in their caches.
if [[ -f .ci/realnode.sh ]]; then
  realnode=$(bash .ci/realnode.sh)
  while IFS= read -r line; do
    case $line in EVALKUBE_NODE_BIN=*|EVALKUBE_IMAGES_DIR=*) export "${line?}" ;; esac
  done <<<"$realnode"
fi
# The native model bridge proxy (Go): its unit tests run here, and the proxy tests run every
# case against it as well as against the Python proxy.
EVALKUBE_PROXY_BIN=$(bash .ci/proxy.sh | tail -1)
export EVALKUBE_PROXY_BIN
# promtool checks and unit-tests the chart's alert rules and the dashboard's queries.
EVALKUBE_PROMTOOL_BIN=$(bash .ci/promtool.sh | tail -1)
export EVALKUBE_PROMTOOL_BIN
# The MLflow tracking server the tracking tests start (a venv of its own, cached by its pin).
EVALKUBE_MLFLOW_BIN=$(bash .ci/mlflow.sh | tail -1)
export EVALKUBE_MLFLOW_BIN
# SeaweedFS's weed: the S3-compatible store the s3:// dataset tests read from (Go, cached by key).
EVALKUBE_WEED_BIN=$(bash .ci/seaweedfs.sh | tail -1)
export EVALKUBE_WEED_BIN
# the slowest tests, named in every CI log (where the time of a run goes)
exec .venv/bin/python -m pytest --durations=30 "$@"
