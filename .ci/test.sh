#!/usr/bin/env bash
# Run the whole test suite (called by `make test`). Builds/locates the loopback Kubernetes
# control plane first when the harness exists, so cluster tests never silently skip.
set -euo pipefail
cd "$(dirname "$0")/.."
# The builds only the tests need (promtool, the MLflow venv, SeaweedFS) start at once in the
# background, beside the control plane's and the node's: a Go build leaves a core idle while
# modules download and while it links, and a cold machine gains minutes; with warm caches each
# returns in seconds either way. Each one's log is printed when it is collected.
LOGS=$(mktemp -d)
declare -A JOBS
start() { local name=$1; shift; "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err" & JOBS[$name]=$!; }
collect() {  # sets RESULT to the job's last line of stdout; a failed job stops the run
  local name=$1 status=0
  wait "${JOBS[$name]}" || status=$?
  cat "$LOGS/$name.err" >&2
  if ((status)); then echo "test.sh: $name failed (exit $status)" >&2; exit "$status"; fi
  RESULT=$(tail -n1 "$LOGS/$name.out")
}
start promtool bash .ci/promtool.sh
start mlflow bash .ci/mlflow.sh
start seaweedfs bash .ci/seaweedfs.sh
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
collect promtool && export EVALKUBE_PROMTOOL_BIN=$RESULT
# The MLflow tracking server the tracking tests start (a venv of its own, cached by its pin).
collect mlflow && export EVALKUBE_MLFLOW_BIN=$RESULT
# SeaweedFS's weed: the S3-compatible store the s3:// dataset tests read from (Go, cached by key).
collect seaweedfs && export EVALKUBE_WEED_BIN=$RESULT
rm -rf "$LOGS"
# the slowest tests, named in every CI log (where the time of a run goes)
exec .venv/bin/python -m pytest --durations=30 "$@"
